"""The ORT plugin's CUDA kernel against Swish in float64, on GPU hosts with or without an
onnxruntime-gpu: through the harness (plugin_harness.cu beside this file: the plugin's launch path,
compiled from the same generated launchers with the plugin's flags) and, where onnxruntime has a
CUDA execution provider, through the plugin itself. tests/test_plugin_cuda.py runs both; bench.gpu_check
builds the harness once for them (MYOPS_PLUGIN_HARNESS) and times it against a copy.

Tolerances against `reference` (Swish in float64 from the float32-rounded beta*x, rounded once; the
float32 kernel rounds beta*x, then CUDA's expf is within 2 ulp, then 1 + e and x / d round once each):
float32 rtol 2^-20 (8 ulp), atol 1e-36 (where e^-(beta x) overflows float32, CUDA gives -0 and the
reference a value below 2.6e-37); float16 rtol 2^-10, atol 2^-24 (the float16 forward's fast exp and
division, kernels/swish.h forward_16bit, are a few float32 ulp off, and the same float32 value may
round to neighbouring halves). The reference is not the extension's CPU kernel: its AVX2/AVX-512/NEON
paths compute e^-(beta x) as 2^t, which differs from expf by up to 3.6e-6 relative where e^-(beta x)
is huge (x = -74 at beta 1).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .kernels import KERNELS

HARNESS_SOURCE = Path(__file__).resolve().parent / "plugin_harness.cu"
EDGE_VALUES = (0.0, -0.0, 1e-8, -1e-8, 1e-40, -1e-40, 20.0, -20.0, 88.0, -88.0, 1e4, -1e4,
               float("inf"), float("-inf"), float("nan"))
BETAS = (1.0, 1.702, -0.3)
TOLERANCES = {"float32": dict(atol=1e-36, rtol=2**-20), "float16": dict(atol=2**-24, rtol=2**-10)}
CODES = {"float32": "f32", "float16": "f16"}


class Unavailable(Exception):
    """What this host lacks for a check (an onnxruntime-gpu, the GPU to itself); says why."""


def harness_command(nvcc: str, arch: str, output: Path) -> list[str]:
    """The plugin's compilation of Swish's CUDA launchers (CMake Release: -O3 -DNDEBUG, C++17), one arch.
    Writes the launchers as the plugin's build does (opspec/codegen), and their declarations for the
    harness to include, beside output."""
    from opspec import OPS, codegen

    spec = OPS["swish"]
    output.parent.mkdir(parents=True, exist_ok=True)
    launchers = output.parent / f"{codegen.PREFIX}{spec.name}_launch.cu"
    launchers.write_text(codegen.launchers(spec))
    (output.parent / "harness_launchers.h").write_text(
        "#pragma once\n#include <cstdint>\n#include <cuda_runtime_api.h>\n#include \"cuda_dtype.h\"\n"
        + codegen.launcher_declarations(spec))
    return [nvcc, "-std=c++17", "-O3", "-DNDEBUG", f"-gencode=arch=compute_{arch},code=sm_{arch}",
            f"-I{KERNELS}", f"-I{output.parent}", str(HARNESS_SOURCE), str(launchers), "-o", str(output)]


def start_harness_build(nvcc: str, arch: str, build_dir: Path):
    """nvcc started in the background (the extension builds meanwhile); finish_harness_build waits."""
    build_dir.mkdir(parents=True, exist_ok=True)
    output = build_dir / f"plugin_harness_sm{arch}"
    output.unlink(missing_ok=True)
    log_file = open(build_dir / f"plugin_harness_sm{arch}.log", "w")
    process = subprocess.Popen(harness_command(nvcc, arch, output), stdout=log_file, stderr=subprocess.STDOUT)
    return process, output, log_file


def finish_harness_build(started, timeout: float) -> Path:
    process, output, log_file = started
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise RuntimeError(f"nvcc did not finish the harness within {timeout:.0f} s")
    finally:
        log_file.close()
    if process.returncode != 0 or not output.is_file():
        text = Path(log_file.name).read_text()
        raise RuntimeError(f"nvcc failed on {HARNESS_SOURCE.name} ({process.returncode}):\n" + text[-3000:])
    return output


def inputs() -> dict:
    """float32 and float16 inputs: the edge values, a sweep through the exp overflow region, random."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = np.concatenate([np.array(EDGE_VALUES, dtype=np.float32),
                        np.linspace(-100, 100, 20_001, dtype=np.float32),
                        rng.standard_normal(100_003).astype(np.float32) * 8])
    return {"float32": x, "float16": x.astype(np.float16)}


def reference(x, beta: float):
    """Swish as the plugin's CUDA kernel evaluates it, x / (1 + e^-(beta*x)) with beta*x rounded to
    float32 first, in float64 and rounded once to x's dtype (float16 through float32, as the kernel)."""
    import numpy as np

    x32 = np.asarray(x, dtype=np.float32)
    scaled = (np.float32(beta) * x32).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x32.astype(np.float64) / (1.0 + np.exp(-scaled))
    return y.astype(np.float32).astype(x.dtype)


def assert_close(got, want, tol: dict, what: str) -> None:
    """|got - want| <= atol + rtol * |want| after an exact upcast; NaN and inf where want has them."""
    import numpy as np

    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype} {got.shape} vs {want.dtype} {want.shape}"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), equal_nan=True, err_msg=what, **tol)


def run_harness(harness: Path, x, offset: int, betas, work: Path):
    """The harness on x from `offset` elements past an aligned allocation (0: the vector path, 1: the
    scalar path): one row of outputs per beta."""
    import numpy as np

    code = CODES[str(x.dtype)]
    source, output = work / f"in-{code}.bin", work / f"out-{code}-{offset}.bin"
    x.tofile(source)
    result = subprocess.run([str(harness), code, str(offset), str(source), str(output), *map(repr, betas)],
                            capture_output=True, text=True, timeout=120)
    if "cudaErrorDevicesUnavailable" in result.stderr:
        raise Unavailable("the GPU is in exclusive-process compute mode: the harness cannot share it with this process")
    if result.returncode != 0:
        raise AssertionError(f"harness exit {result.returncode}: {result.stderr.strip()[-1500:]}")
    got = np.fromfile(output, dtype=x.dtype)
    assert got.size == x.size * len(betas), f"harness wrote {got.size} elements, expected {x.size * len(betas)}"
    return got.reshape(len(betas), x.size)


def parse_harness_timing(stdout: str) -> dict[str, float]:
    """{'forward_ms': F, 'copy_ms': C} from `plugin_harness time`'s line."""
    line = stdout.strip().splitlines()[-1]
    return {key: float(value) for key, value in (part.split("=") for part in line.split())}


def cuda_session_factory(arch: str, entry: str, build_root: Path, time_left: float = 60):
    """(make_session(dtype_name) -> session, the plugin library, a description) for the plugin on
    onnxruntime's CUDA EP, no CPU fallback allowed. What the host lacks (an onnxruntime-gpu for this CUDA major, cuDNN, headers
    offline, an onnxruntime older than the plugin's headers) raises Unavailable with the reason."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise Unavailable("onnxruntime is not importable (the harness runs the same launch path)") from None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Unavailable(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (the harness runs the same "
                          "launch path)")
    from lab.compat import release
    from lab.ort_headers import HeadersNotFound
    from ort_plugin.build import INFO_FILE, ToolMissing, build
    from ort_plugin.library_info import read_library
    from ort_plugin.loader import exact_providers, register
    from ort_plugin.onnx_file import one_node_model

    providers = exact_providers(["CUDAExecutionProvider"], ort.__version__)
    try:  # the CUDA EP alone first: what fails here is the host's, not the plugin's
        probe = ort.InferenceSession(one_node_model("", "Identity"), providers=providers)
    except Exception as exc:  # another CUDA major, no cuDNN, no device access
        raise Unavailable(f"onnxruntime {ort.__version__} could not start its CUDA EP here: "
                          f"{str(exc).strip().splitlines()[0][:300]}") from None
    if probe.get_providers()[0] != "CUDAExecutionProvider":  # onnxruntime's Python fallback to the CPU
        raise Unavailable(f"onnxruntime {ort.__version__} fell back to {probe.get_providers()}: its CUDA EP did not "
                          "load (check `python -m infer.runner doctor`)")
    try:
        # Its own folder: a one-architecture plugin must not become loader.default_library's pick.
        library = build(cuda="ON", cuda_architectures=arch, root=build_root, entry=entry,
                        fetch_timeout_s=min(max(time_left / 2, 5), 20), log=lambda message: None)
    except (ToolMissing, HeadersNotFound) as exc:  # no cmake, no pinned headers offline: not buildable here
        raise Unavailable(f"plugin not built: {str(exc).splitlines()[0]}") from None
    headers = str(json.loads((library.parent / INFO_FILE).read_text()).get("ort_headers_version", ""))
    if headers and release(ort.__version__) < release(headers):
        raise Unavailable(f"onnxruntime {ort.__version__} is older than the headers the plugin is built against "
                          f"({headers}): it cannot load the plugin; install onnxruntime-gpu {headers} or newer")

    def make_session(dtype_name: str):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # A node ORT cannot place on CUDA must fail the session, not fall back to the CPU kernel.
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        register(options, library)
        session = ort.InferenceSession(one_node_model("myops", "Swish", element_type=dtype_name), options,
                                       providers=providers)
        assert session.get_providers()[0] == "CUDAExecutionProvider", (
            f"the plugin's session runs on {session.get_providers()}, not the CUDA EP")
        return session

    return make_session, library, f"onnxruntime {ort.__version__}, plugin API {read_library(library).api_version}"
