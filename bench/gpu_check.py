"""The GPU check, one command on one CUDA host: `python -m bench.gpu_check [--out results] [--entry ID]`.

Needs a CUDA build of PyTorch, numpy, nvcc and a C++ compiler; no internet, no onnxruntime-gpu, no
nox. Finishes in about 6 minutes on one GPU. Stages, each with a time budget:

  1 preflight  the GPU, the toolkit, the matrix entry, provenance
  2 build      the extension for this GPU's architecture only, and bench/gpu/plugin_harness.cu
  3 layer 1    extension vs PyTorch composite on CUDA: forward and backward, float32, float16 and
               bfloat16, edge values, non-contiguous and unaligned inputs, a grid-stride-sized
               tensor, the op queued on a side stream behind a busy kernel; RMSNorm forward, dx and dw
               at the weight gradient's chunk edges (rows 1, 63, 64, 65, 4097, and past the chunk cap)
  4 plugin     the ORT plugin's CUDA launch path vs Swish in float64 (plugin_reference): the harness
               always, the plugin through onnxruntime's CUDA EP where that is importable
  5 bench      PyTorch rows and the copy floor, rows for results/<entry>/bench.csv: per call (an event
               pair around each call) and device time (batches queued behind a spin kernel,
               bench.cuda_timing), at 8x512x768 (fits in L2) and 64x2048x768 (DRAM), as opspec/swish.py declares; RMSNorm's rows at
               8x512x768 and 8x512x4096
  6 targets    paired device-time ratios and the memory saved, results/<entry>/targets.csv
  7 write      the CSVs (only when every correctness check passed)

Tolerances. Layer 1 (both sides evaluate expf on the GPU in the same order): float32 atol 1e-6,
rtol 1.3e-6, as on the CPU; float16/bfloat16 against the composite computed in float32 from the
same inputs and rounded once: rtol one ulp of the type (2^-10, 2^-7), atol 1e-5 for float32-level
noise where the backward's two terms cancel. Plugin vs plugin_reference (Swish in float64 from the
float32-rounded beta*x, rounded once; the plugin's kernel rounds beta*x, then CUDA's expf is within
2 ulp, then 1 + e and x / d round once each): float32 rtol 2^-20 (8 ulp), atol 1e-36 (where
e^-(beta x) overflows float32, CUDA gives -0 and the reference a value below 2.6e-37); float16
rtol 2^-10, atol 2^-24 (the same float32 value may round to neighbouring halves). The reference is
not the extension's CPU kernel: its AVX2/AVX-512/NEON paths compute e^-(beta x) as 2^t, which differs
from expf by up to 3.6e-6 relative where e^-(beta x) is huge (x = -74 at beta 1).

Exit status: 0 when every correctness check passes (missed performance targets are reported, not
failures; what the host lacks, such as an onnxruntime-gpu for its CUDA, is a SKIP with the reason),
1 when one fails, 2 when this host cannot run the check (no CUDA device, no nvcc, bad entry).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "kernels"
HARNESS_SOURCE = Path(__file__).resolve().parent / "gpu" / "plugin_harness.cu"
BUILD_DIR = REPO / "build" / "gpu_check"
MATRIX = REPO / "matrix.yaml"
RESULTS = REPO / "results"
PROVIDER = "torch-cuda"
# Where layer 1 and the rows run; tests set "cpu" to exercise the float32 logic without a GPU.
DEVICE = "cuda"

BUDGETS_S = {"preflight": 20, "build": 150, "layer 1": 45, "plugin": 20, "bench": 80, "targets": 25, "write": 5}

DTYPES = ("float32", "float16", "bfloat16")
BETAS = (1.0, 1.702, 0.5, -0.3)
SHAPES = ((), (0,), (7,), (1023,), (3, 5, 7), (2, 33, 65), (1_000_003,))
EDGE_VALUES = (0.0, -0.0, 1e-8, -1e-8, 1e-40, -1e-40, 20.0, -20.0, 88.0, -88.0, 1e4, -1e4,
               float("inf"), float("-inf"), float("nan"))
LAYER1_TOL = {"float32": dict(atol=1e-6, rtol=1.3e-6), "float16": dict(atol=1e-5, rtol=2**-10),
              "bfloat16": dict(atol=1e-5, rtol=2**-7)}
PLUGIN_TOL = {"float32": dict(atol=1e-36, rtol=2**-20), "float16": dict(atol=2**-24, rtol=2**-10)}
PLUGIN_BETAS = (1.0, 1.702, -0.3)
# (name, shape): the CPU benchmark's activation, one far beyond the L2 cache for bandwidth
# (swish_large), and RMSNorm's two.


def declared_workloads() -> tuple[tuple[str, tuple[int, int, int]], ...]:
    """Every op-alone workload as opspec/<op>.py declares it, so that these rows and the infer image's
    (which the report joins by workload and dtype) time the same tensors."""
    from infer.workloads import WORKLOADS as DECLARED

    return tuple((name, w.shape) for name, w in DECLARED.items() if w.op_alone)


WORKLOADS = declared_workloads()
RMS_NORM_TARGET_WORKLOAD = "rms_norm_4096"
# RMSNorm's layer 1, against its reference computed in float32 and rounded once. dw sums over every
# row: its absolute tolerance grows with the square root of the row count (per-row rounding is random).
RMS_NORM_TOL = {"float32": dict(atol=1e-5, rtol=1e-5), "float16": dict(atol=1e-3, rtol=2**-10),
                "bfloat16": dict(atol=1e-2, rtol=2**-7)}
RMS_NORM_EPS = (1e-6, 1e-3)
TARGET_WORKLOAD = "swish_large"
# (name, numerator, denominator, limit): holds when the median over pairs of device time(numerator) /
# device time(denominator) <= limit, as every target of the lab (bench.targets) reads. Forward and
# copy move the same bytes: 1/0.9 is 90 % of the copy's bandwidth; 1/1.5 a 1.5x speed-up.
TARGETS = (
    ("fused forward vs copy floor (at least 90 % of copy bandwidth)", "torch_extension", "torch_copy", round(1 / 0.9, 4)),
    ("extension forward vs PyTorch composite (1.5x faster)", "torch_extension", "torch_composite", round(1 / 1.5, 4)),
    ("extension backward vs composite autograd (1.5x faster)", "torch_extension_backward", "torch_composite_backward",
     round(1 / 1.5, 4)),
)


def log(message: str) -> None:
    print(f"[gpu_check] {message}", flush=True)


class HostError(Exception):
    """This host cannot run the check at all (exit 2)."""


class Skip(Exception):
    """A check that cannot run here; says why."""


# ---------------------------------------------------------------- bookkeeping

@dataclass
class Check:
    stage: str
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str = ""


class Run:
    def __init__(self, limit_s: float):
        self.started = time.monotonic()
        self.limit_s = limit_s
        self.deadline = self.started + limit_s
        self.checks: list[Check] = []
        self.notes: list[str] = []

    @contextlib.contextmanager
    def stage(self, name: str):
        budget = BUDGETS_S[name]
        number = list(BUDGETS_S).index(name) + 1
        left = self.limit_s - (time.monotonic() - self.started)
        log(f"stage {number}/{len(BUDGETS_S)} {name} (budget {budget} s, {left:.0f} s of {self.limit_s:.0f} s left)")
        began = time.monotonic()
        self.deadline = began + max(min(budget, left), 0)
        try:
            yield
        finally:
            took = time.monotonic() - began
            log(f"stage {number} {name}: {took:.1f} s" + (f" (over its {budget} s budget)" if took > budget else ""))

    def left(self) -> float:
        """Seconds left in the current stage's budget."""
        return self.deadline - time.monotonic()

    def check(self, stage: str, name: str, body) -> bool:
        """Run one correctness check: PASS when `body` returns, SKIP on Skip, FAIL on any other exception."""
        try:
            detail = body() or ""
            status = "PASS"
        except Skip as exc:
            status, detail = "SKIP", str(exc)
        except Exception as exc:  # a failed assertion, or the op raising: both are failures
            status = "FAIL"
            detail = f"{type(exc).__name__}: {exc}" if not isinstance(exc, AssertionError) else str(exc)
        self.checks.append(Check(stage, name, status, detail))
        short = detail.strip().splitlines()[0][:160] if detail.strip() else ""
        log(f"  {status} {name}" + (f": {short}" if short else ""))
        lines = detail.splitlines()
        if status == "FAIL" and len(lines) > 1:
            # Compiler errors end with the useful part, assertion messages start with it.
            shown = lines if len(lines) <= 40 else [*lines[:10], "...", *lines[-30:]]
            print("\n".join("      " + line for line in shown), flush=True)
        return status != "FAIL"

    @property
    def failed(self) -> bool:
        return any(c.status == "FAIL" for c in self.checks)


# ---------------------------------------------------------------- host facts

def no_gpu_message(torch) -> str:
    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"no CUDA device: run this on a GPU host; torch {torch.__version__} ({build}) sees none"
            + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""))


def matrix_entries() -> dict[str, str]:
    """{entry id: device} of matrix.yaml; validated through lab.matrix where PyYAML and jsonschema exist."""
    from lab import matrix

    try:
        return {name: e["device"] for name, e in matrix.load()["entries"].items()}
    except ImportError:
        pass
    except matrix.MatrixError as exc:
        raise HostError(str(exc)) from None
    # A GPU host may have neither: entry ids sit at indent 2 under `entries:`, `device:` at indent 4.
    entries: dict[str, str] = {}
    current, inside = None, False
    for line in MATRIX.read_text().splitlines():
        if re.match(r"^entries:\s*(#.*)?$", line):
            inside = True
        elif inside and re.match(r"^\S", line):
            inside = False
        elif inside and (m := re.match(r"^  ([A-Za-z0-9_.\-]+):\s*(#.*)?$", line)):
            current = m.group(1)
            entries[current] = ""
        elif inside and current and (m := re.match(r"^    device:\s*([A-Za-z]+)", line)):
            entries[current] = m.group(1)
    return entries


def choose_entry(requested: str | None, torch_cuda: str | None, entries: dict[str, str]) -> tuple[str, str | None]:
    """The matrix entry the rows belong to, and a note when it is not an exact match for torch's CUDA."""
    cuda_entries = {name for name, device in entries.items() if device == "cuda"}
    if requested:
        if requested not in cuda_entries:
            raise HostError(f"--entry {requested}: not a CUDA entry of {MATRIX.name} (CUDA entries: "
                            f"{', '.join(sorted(cuda_entries))})")
        return requested, None
    if not torch_cuda:
        raise HostError("torch is a CPU-only build: install a CUDA build of PyTorch")
    major, minor = (int(part) for part in torch_cuda.split(".")[:2])
    exact = f"cuda{major}.{minor}"
    if exact in cuda_entries:
        return exact, None
    # The newest entry of the same CUDA major that is not newer than torch's CUDA.
    versions = []
    for name in cuda_entries:
        m = re.fullmatch(r"cuda(\d+)\.(\d+)", name)
        if m and int(m.group(1)) == major and int(m.group(2)) <= minor:
            versions.append((int(m.group(2)), name))
    if not versions:
        raise HostError(f"no matrix entry for torch's CUDA {torch_cuda}: pass --entry (CUDA entries: "
                        f"{', '.join(sorted(cuda_entries))})")
    chosen = max(versions)[1]
    return chosen, f"no entry {exact} in {MATRIX.name}: rows go to {chosen} (their `cuda` column says {torch_cuda})"


def pin_cuda_home() -> None:
    """Set CUDA_HOME to the toolkit of the nvcc on PATH, unless set: torch guesses it from nvcc's path,
    which for a wrapper script (/usr/local/bin/nvcc) is a folder without libcudart, and the link fails."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "torch.utils.cpp_extension" in sys.modules:
        return
    nvcc = shutil.which("nvcc")
    from lab.provenance import cuda_toolkit_root

    root = cuda_toolkit_root(nvcc) if nvcc else None
    if root is not None and (root / "bin" / "nvcc").is_file():
        os.environ["CUDA_HOME"] = str(root)


def find_nvcc() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").is_file():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def cuda_driver_version() -> str | None:
    """The driver's CUDA version from libcuda itself, for hosts without nvidia-smi."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"CUDA {version.value // 1000}.{version.value % 1000 // 10} (cuDriverGetVersion)"
    except (OSError, AttributeError):
        pass
    return None


@dataclass
class Setup:
    entry: str
    arch: str          # "90": nvcc's -gencode number
    arch_list: str     # "9.0": TORCH_CUDA_ARCH_LIST
    nvcc: str
    device: str
    driver: str | None
    facts: dict
    ort_plugin: Path | None = None  # set once the plugin has passed through onnxruntime's CUDA EP


def preflight(args, torch) -> Setup:
    from lab import provenance

    entry, note = choose_entry(args.entry, torch.version.cuda, matrix_entries())
    if note:
        log(f"note: {note}")
    pin_cuda_home()
    nvcc = find_nvcc()
    if nvcc is None:
        raise HostError("nvcc not found: install the CUDA toolkit matching torch's CUDA "
                        f"{torch.version.cuda} and put it on PATH (or set CUDA_HOME)")
    nvcc_version = provenance.nvcc_version(nvcc)
    if nvcc_version and nvcc_version.split(".")[0] != str(torch.version.cuda).split(".")[0]:
        raise HostError(f"{nvcc} is CUDA {nvcc_version} but torch was built for CUDA {torch.version.cuda}: "
                        "the major versions must match (set CUDA_HOME to a matching toolkit)")
    from lab.compat import extension_cxx_standard

    try:
        extension_cxx_standard(torch.__version__, nvcc_version)
    except ValueError as exc:
        raise HostError(str(exc)) from None
    major, minor = torch.cuda.get_device_capability(0)
    os.environ["MYOPS_MATRIX_ENTRY"] = entry  # what provenance.collect() records; the plugin's build gets it as an argument
    # One architecture only: a full TORCH_CUDA_ARCH_LIST would multiply the build time.
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    if os.environ.pop("MYOPS_NO_CUDA", None) is not None:
        log("note: MYOPS_NO_CUDA ignored: this check needs the CUDA kernels")
    facts = provenance.collect()
    driver = facts.get("driver") or cuda_driver_version()
    device = torch.cuda.get_device_name(0)
    log(f"entry {entry}: {device} (sm_{major}{minor}), driver {driver}, torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}), nvcc {nvcc_version} at {nvcc}, git {str(facts['git_sha'])[:12]}"
        f"{' (dirty)' if facts['git_dirty'] else ''}")
    return Setup(entry, f"{major}{minor}", f"{major}.{minor}", nvcc, device, driver, facts)


# ---------------------------------------------------------------- builds

def harness_command(nvcc: str, arch: str, output: Path) -> list[str]:
    """The plugin's compilation of kernels/swish_cuda.cu (CMake Release: -O3 -DNDEBUG, C++17), one arch."""
    return [nvcc, "-std=c++17", "-O3", "-DNDEBUG", f"-gencode=arch=compute_{arch},code=sm_{arch}",
            f"-I{KERNELS}", str(HARNESS_SOURCE), str(KERNELS / "swish_cuda.cu"), "-o", str(output)]


def start_harness_build(nvcc: str, arch: str):
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    output = BUILD_DIR / f"plugin_harness_sm{arch}"
    output.unlink(missing_ok=True)
    log_file = open(BUILD_DIR / f"plugin_harness_sm{arch}.log", "w")
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


def _torch_paths(function, device: str) -> list[str]:
    try:
        return function(device_type=device)
    except TypeError:  # torch before 2.6 took a bool
        return function(cuda=device == "cuda")


def direct_build_plan(arch: str | None, nvcc: str | None) -> tuple[dict[Path, list[str]], list[str], Path]:
    """The compile commands (object -> command), the link command and the library of direct_build.

    Same sources as ops.build and the flags cpp_extension would use. arch None: the CPU kernels only
    (what a machine without a CUDA build of torch can check of this path).
    """
    from torch.utils import cpp_extension

    from lab.compat import extension_cxx_standard
    from lab.provenance import nvcc_version
    from ops import build as ops_build

    facts = ops_build.torch_facts()
    # The standard cpp_extension itself would pass for this torch (C++20 from 2.12; nvcc 11 stops at C++17).
    standard = "-std=" + extension_cxx_standard(facts["torch"], nvcc_version(nvcc) if arch and nvcc else None)
    device = "cuda" if arch else "cpu"
    out = ops_build.BUILD_ROOT / f"{ops_build.build_tag(facts)}-direct-{'sm' + arch if arch else 'cpu'}"
    out.mkdir(parents=True, exist_ok=True)
    openmp = ops_build._openmp_flags()
    defines = [f"-D_GLIBCXX_USE_CXX11_ABI={facts['cxx11_abi']}", f"-DTORCH_EXTENSION_NAME={ops_build.LIB_NAME}",
               "-DTORCH_API_INCLUDE_EXTENSION_H"]
    includes = [f"-I{ops_build.KERNELS}"]
    for path in _torch_paths(cpp_extension.include_paths, device):
        includes += ["-isystem", path]
    cxx = os.environ.get("CXX", "c++")
    found = ops_build.source_files()
    jobs = {out / f"{source.stem}.o": [cxx, "-c", str(source), "-fPIC", standard, "-O3", *defines, *openmp, *includes]
            for source in found["cpp"]}
    if arch:
        nvcc_flags = ["-c", standard, "-O3", "--compiler-options", "-fPIC", *defines,
                      *getattr(cpp_extension, "COMMON_NVCC_FLAGS", []), f"-gencode=arch=compute_{arch},code=sm_{arch}",
                      *includes]
        for source in found["cuda_ops"]:
            jobs[out / f"{source.stem}_op.o"] = [nvcc, str(source), *nvcc_flags]
        for source in found["cuda_kernels"]:
            jobs[out / f"kernels_{source.stem}.o"] = [nvcc, str(source), *nvcc_flags]
    library = out / f"{ops_build.LIB_NAME}.so"
    torch_libs = [f"-L{cpp_extension.TORCH_LIB_PATH}", "-lc10", "-ltorch_cpu", "-ltorch"]
    if arch:
        # nvcc as the link driver finds its own toolkit's libcudart wherever that lives (CUDA_HOME may
        # be a guess) and records it as libcudart.so.N, the soname torch has already loaded.
        link = [nvcc, "-shared", "--cudart", "shared", *map(str, jobs), "-o", str(library),
                *[part for flag in openmp for part in ("-Xcompiler", flag)], *torch_libs, "-lc10_cuda", "-ltorch_cuda"]
    else:
        link = [cxx, "-shared", *map(str, jobs), "-o", str(library), *openmp, *torch_libs]
    return jobs, link, library


def direct_build(arch: str | None, nvcc: str | None, timeout: float = 600) -> Path:
    """The extension from plain compiler calls, where ninja (which torch's JIT build needs) is missing.

    Objects compiled side by side, then linked; returns the library.
    """
    jobs, link, library = direct_build_plan(arch, nvcc)
    running = []
    for obj, command in jobs.items():
        log_file = open(obj.with_suffix(".log"), "w")
        running.append((obj, subprocess.Popen([*command, "-o", str(obj)], stdout=log_file, stderr=subprocess.STDOUT),
                        log_file))
    deadline = time.monotonic() + timeout
    errors = []
    for obj, process, log_file in running:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()
        if process.returncode != 0:
            errors.append(f"{obj.name} ({process.returncode}):\n" + obj.with_suffix(".log").read_text()[-2500:])
    if errors:
        raise RuntimeError("direct build failed: " + "\n".join(errors))
    result = subprocess.run(link, capture_output=True, text=True, timeout=max(deadline - time.monotonic(), 30))
    if result.returncode != 0:
        raise RuntimeError(f"direct build: link failed ({result.returncode}):\n{(result.stdout + result.stderr)[-2500:]}")
    return library


def build_extension(setup: Setup, run: Run) -> str:
    """Build and load the extension; returns how it was built."""
    import torch
    from torch.utils import cpp_extension

    import ops

    if cpp_extension.is_ninja_available():
        library = ops.load()
        from ops.build import build_info

        return f"ops.load() (ninja), TORCH_CUDA_ARCH_LIST={build_info().get('torch_cuda_arch_list')}: {library}"
    log("ninja not found (torch's JIT build needs it): compiling the same sources with plain compiler calls")
    library = direct_build(setup.arch, setup.nvcc, timeout=max(run.left(), 60))
    torch.ops.load_library(str(library))
    for op in ops.OPS.values():
        op.register_python_parts()
    ops._loaded_from = str(library)  # so that a later ops.load() does not build again
    return f"direct build (no ninja), sm_{setup.arch}: {library}"


# ---------------------------------------------------------------- layer 1 on CUDA

def _reference(x, grad, beta: float):
    """The composite and its autograd, in float32 (float16/bfloat16 upcast exactly), rounded once to x's dtype."""
    import torch

    import ops

    xr = x.detach().to(torch.float32).requires_grad_(True)
    y = ops.reference(xr, beta)
    (dx,) = torch.autograd.grad(y, xr, grad.to(torch.float32))
    return y.detach().to(x.dtype), dx.to(x.dtype)


def _extension(x, grad, beta: float):
    """The op and its registered autograd."""
    import torch

    import ops

    xo = x.detach().clone().requires_grad_(True)
    y = ops.swish(xo, beta)
    (dx,) = torch.autograd.grad(y, xo, grad)
    return y.detach(), dx


def _close(got, want, tol: dict, what: str) -> None:
    import torch

    if got.dtype != want.dtype or got.shape != want.shape or got.device != want.device:
        raise AssertionError(f"{what}: got {got.dtype} {list(got.shape)} on {got.device}, "
                             f"expected {want.dtype} {list(want.shape)} on {want.device}")
    try:
        # Upcast (exact) so that the comparison itself does not round.
        torch.testing.assert_close(got.float(), want.float(), equal_nan=True, **tol)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


def _collect(failures: list[str], body) -> None:
    try:
        body()
    except AssertionError as exc:
        failures.append(str(exc))


def _raise_if(failures: list[str], cases: int) -> str:
    if failures:
        raise AssertionError(f"{len(failures)} of {cases} cases failed; first:\n" + "\n".join(failures[:3]))
    return f"{cases} cases"


def check_random(dtype_name: str) -> str:
    import torch

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    failures, cases = [], 0
    for shape in SHAPES:
        x = (torch.randn(shape, generator=gen) * 4).to(DEVICE, dtype)
        grad = torch.randn(shape, generator=gen).to(DEVICE, dtype)
        for beta in BETAS:
            cases += 1

            def case():
                y, dx = _extension(x, grad, beta)
                y_ref, dx_ref = _reference(x, grad, beta)
                _close(y, y_ref, LAYER1_TOL[dtype_name], f"forward {shape} beta {beta}")
                _close(dx, dx_ref, LAYER1_TOL[dtype_name], f"backward {shape} beta {beta}")

            _collect(failures, case)
    return _raise_if(failures, cases)


def check_edges(dtype_name: str) -> str:
    import torch

    dtype = getattr(torch, dtype_name)
    x = torch.tensor(EDGE_VALUES, dtype=torch.float32).to(DEVICE, dtype)
    grad = torch.ones_like(x)
    finite = torch.isfinite(x)
    failures = []
    for beta in BETAS:
        def case():
            y, dx = _extension(x, grad, beta)
            y_ref, dx_ref = _reference(x, grad, beta)
            # NaN and inf positions must be the reference's (assert_close requires that), finite ones close.
            _close(y, y_ref, LAYER1_TOL[dtype_name], f"forward beta {beta}")
            _close(dx, dx_ref, LAYER1_TOL[dtype_name], f"backward beta {beta}")
            if not (torch.isfinite(y[finite]).all() and torch.isfinite(dx[finite]).all()):
                raise AssertionError(f"beta {beta}: overflow on finite inputs: y {y.tolist()}, dx {dx.tolist()}")

        _collect(failures, case)
    return _raise_if(failures, len(BETAS))


VIEWS = {
    "transposed": lambda t: t.t(),
    "strided": lambda t: t[:, ::3],
    "offset-transposed": lambda t: t[1:, 2:].transpose(0, 1),
    "expanded": lambda t: t[:1].expand(6, t.shape[1]),
    "unaligned (storage offset 1)": lambda t: t.flatten()[1:],
}


def check_views(dtype_name: str) -> str:
    """Views straight into the op and its backward (no clone, which could make them contiguous again)."""
    import torch

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(3)
    base = (torch.randn(6, 257, generator=gen) * 5).to(DEVICE, dtype)
    grad_base = torch.randn(6, 257, generator=gen).to(DEVICE, dtype)
    failures = []
    for name, view in VIEWS.items():
        x, grad = view(base), view(grad_base)
        if name.startswith("unaligned"):
            assert x.is_contiguous() and x.data_ptr() % 16 != 0, "the unaligned view is not unaligned"
        else:
            assert not x.is_contiguous(), f"the {name} view is contiguous"

        def case():
            y = torch.ops.myops.swish(x, 1.702)
            dx = torch.ops.myops.swish_backward(grad, x, 1.702)
            y_ref, dx_ref = _reference(x.contiguous(), grad.contiguous(), 1.702)
            _close(y, y_ref, LAYER1_TOL[dtype_name], f"{name} forward")
            _close(dx, dx_ref, LAYER1_TOL[dtype_name], f"{name} backward")

        _collect(failures, case)
    return _raise_if(failures, len(VIEWS))


def launch_limits() -> tuple[int, int, int]:
    """(threads per block, most blocks, bytes per vector step) of the elementwise launcher Swish's
    kernels use (kernels/elementwise_cuda.cuh), read off its source."""
    text = (KERNELS / "elementwise_cuda.cuh").read_text()
    values = []
    for name in ("kThreads", "kMaxBlocks", "kVecBytes"):
        match = re.search(rf"constexpr\s+\w+\s+{name}\s*=\s*(\d+)\s*;", text)
        if match is None:
            raise RuntimeError(f"kernels/elementwise_cuda.cuh no longer defines {name}: update launch_limits()")
        values.append(int(match.group(1)))
    return tuple(values)


def stride_loop_size(itemsize: int) -> int:
    """Elements for which both of the kernel's grid-stride loops go round at least twice: the vector
    loop (packs of kVecBytes on an aligned tensor) and the scalar loop (the same tensor from offset 1)."""
    threads, blocks, vec_bytes = launch_limits()
    return 2 * threads * blocks * (vec_bytes // itemsize) + 5


def check_large(dtype_name: str) -> str:
    """Tensors beyond one grid: the vector path's stride loop, then (offset 1) the scalar path's."""
    import torch

    dtype = getattr(torch, dtype_name)
    n = stride_loop_size(torch.empty((), dtype=dtype).element_size())
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    x = (torch.randn(n, generator=gen, device=DEVICE) * 4).to(dtype)
    grad = torch.randn(n, generator=gen, device=DEVICE).to(dtype)
    for name, view in (("aligned", lambda t: t), ("unaligned (offset 1)", lambda t: t[1:])):
        xv, gv = view(x), view(grad)
        y = torch.ops.myops.swish(xv, 0.5)
        dx = torch.ops.myops.swish_backward(gv, xv, 0.5)
        y_ref, dx_ref = _reference(xv, gv, 0.5)
        _close(y, y_ref, LAYER1_TOL[dtype_name], f"{name} forward n={xv.numel()}")
        _close(dx, dx_ref, LAYER1_TOL[dtype_name], f"{name} backward n={xv.numel()}")
        del y, dx, y_ref, dx_ref
    return f"n = {n}, aligned and from offset 1"


def _keep_stream_busy() -> None:
    """About 0.1 s of GPU work on the current stream, so that anything queued behind it waits visibly."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(200_000_000)  # clock cycles: ~0.1 s at 2 GHz
        return
    a = torch.rand(4096, 4096, device="cuda")
    for _ in range(40):
        torch.mm(a, a)


def check_side_stream() -> str:
    """The op must run on PyTorch's current stream: queued on a side stream behind a busy kernel and the
    copy that fills x, it sees the filled x. Launched on the default stream instead, it would read the
    zeros (PyTorch's side streams do not synchronise with the default stream)."""
    import torch

    import ops

    n, beta = 1 << 22, 1.702
    gen = torch.Generator(device="cuda").manual_seed(2)
    source = torch.randn(n, generator=gen, device="cuda") * 4
    grad = torch.randn(n, generator=gen, device="cuda")
    y_ref, dx_ref = _reference(source, grad, beta)
    x = torch.zeros_like(source)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        _keep_stream_busy()
        x.copy_(source)
        xo = x.detach().requires_grad_(True)
        y = ops.swish(xo, beta)
        (dx,) = torch.autograd.grad(y, xo, grad)  # autograd runs the backward on the forward's stream
        busy = not side.query()
    side.synchronize()
    torch.cuda.synchronize()
    if not busy:
        raise AssertionError("inconclusive: the side stream was idle before the check could look (delay too short)")
    _close(y.detach(), y_ref, LAYER1_TOL["float32"], "forward on a side stream")
    _close(dx, dx_ref, LAYER1_TOL["float32"], "backward on a side stream")
    return f"n = {n}, side stream busy while the op was queued"


def check_rejects_float64() -> str:
    import torch

    try:
        torch.ops.myops.swish(torch.ones(4, device="cuda", dtype=torch.float64), 1.0)
    except RuntimeError as exc:
        if "float32, float16 or bfloat16" not in str(exc):
            raise AssertionError(f"the error does not name the supported dtypes: {exc}") from None
        return "clear error"
    raise AssertionError("float64 on CUDA was accepted; the CUDA kernels have no float64 path")


def rms_norm_chunking() -> tuple[int, int]:
    """(rows per chunk, most chunks) of the RMSNorm weight gradient's first pass, read off
    kernels/rms_norm_cuda.cu: the cases below sit on its edges."""
    text = (KERNELS / "rms_norm_cuda.cu").read_text()
    values = []
    for name in ("kChunkRows", "kMaxChunks"):
        match = re.search(rf"constexpr\s+\w+\s+{name}\s*=\s*(\d+)\s*;", text)
        if match is None:
            raise RuntimeError(f"kernels/rms_norm_cuda.cu no longer defines {name}: update rms_norm_chunking()")
        values.append(int(match.group(1)))
    return tuple(values)


def rms_norm_shapes() -> list[tuple[int, int]]:
    """(rows, cols): one chunk short, exact and over; many chunks; widths below, at and beyond a warp
    and a block; and more rows than the chunk cap holds (the last chunk then takes the rest)."""
    chunk, max_chunks = rms_norm_chunking()
    rows = [(1, 768), (chunk - 1, 768), (chunk, 768), (chunk + 1, 768), (64 * chunk + 1, 768)]
    widths = [(chunk + 1, 1), (chunk + 1, 33), (3, 1023), (5, 4096), (2, 8193)]
    return rows + widths + [(chunk * max_chunks + 3, 2)]


def _rms_norm_reference(x, weight, grad, eps: float):
    """RMSNorm and its autograd in float32 (float16/bfloat16 upcast exactly), rounded once to x's dtype."""
    import torch

    from ops.rms_norm import reference

    xr = x.detach().float().requires_grad_(True)
    wr = weight.detach().float().requires_grad_(True)
    y = reference(xr, wr, eps)
    dx, dw = torch.autograd.grad(y, (xr, wr), grad.float())
    return y.detach().to(x.dtype), dx.to(x.dtype), dw.to(x.dtype)


def check_rms_norm(dtype_name: str) -> str:
    """The extension's RMSNorm forward, dx and dw against the reference at the chunk edges."""
    import torch

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(4)
    tol = RMS_NORM_TOL[dtype_name]
    failures, cases = [], 0
    for rows, cols in rms_norm_shapes():
        x = (torch.randn(rows, cols, generator=gen) * 3).to(DEVICE, dtype)
        weight = (1 + 0.1 * torch.randn(cols, generator=gen)).to(DEVICE, dtype)
        grad = torch.randn(rows, cols, generator=gen).to(DEVICE, dtype)
        for eps in RMS_NORM_EPS:
            cases += 1

            def case():
                xo, wo = x.detach().clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)
                y = torch.ops.myops.rms_norm(xo, wo, eps)
                dx, dw = torch.autograd.grad(y, (xo, wo), grad)
                y_ref, dx_ref, dw_ref = _rms_norm_reference(x, weight, grad, eps)
                what = f"{rows}x{cols} eps {eps}"
                _close(y.detach(), y_ref, tol, f"forward {what}")
                _close(dx, dx_ref, tol, f"dx {what}")
                _close(dw, dw_ref, dict(tol, atol=tol["atol"] * max(1.0, rows ** 0.5)), f"dw {what}")

            _collect(failures, case)
    return _raise_if(failures, cases)


def check_rms_norm_zero_rows(dtype_name: str) -> str:
    """A row of zeros gives zeros (eps keeps the root finite), with no NaN in dx or dw."""
    import torch

    dtype = getattr(torch, dtype_name)
    x = torch.zeros(3, 768, device=DEVICE, dtype=dtype)
    x[1] = 1
    weight = torch.ones(768, device=DEVICE, dtype=dtype, requires_grad=True)
    xo = x.clone().requires_grad_(True)
    y = torch.ops.myops.rms_norm(xo, weight, 1e-6)
    dx, dw = torch.autograd.grad(y, (xo, weight), torch.ones_like(y))
    if (y[0] != 0).any() or (y[2] != 0).any() or not all(torch.isfinite(t).all() for t in (y, dx, dw)):
        raise AssertionError(f"zero rows: y {y[:, :3].tolist()}, finite dx {bool(torch.isfinite(dx).all())}, "
                             f"finite dw {bool(torch.isfinite(dw).all())}")
    return "zeros in, zeros out, gradients finite"


def layer1(run: Run) -> None:
    for dtype_name in DTYPES:
        run.check("layer 1", f"RMSNorm at the dw chunk edges, fwd+dx+dw, {dtype_name}",
                  lambda d=dtype_name: check_rms_norm(d))
        run.check("layer 1", f"RMSNorm zero rows, {dtype_name}", lambda d=dtype_name: check_rms_norm_zero_rows(d))
    for dtype_name in DTYPES:
        run.check("layer 1", f"random shapes x betas, fwd+bwd, {dtype_name}", lambda d=dtype_name: check_random(d))
        run.check("layer 1", f"edge values, {dtype_name}", lambda d=dtype_name: check_edges(d))
        run.check("layer 1", f"non-contiguous and unaligned views, {dtype_name}", lambda d=dtype_name: check_views(d))
    for dtype_name in DTYPES:
        run.check("layer 1", f"beyond one grid (both stride loops), {dtype_name}", lambda d=dtype_name: check_large(d))
    run.check("layer 1", "side stream (the op uses the current stream)", check_side_stream)
    run.check("layer 1", "float64 on CUDA rejected with a clear error", check_rejects_float64)


# ---------------------------------------------------------------- the plugin's CUDA kernel vs its float64 reference

def plugin_inputs() -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    x = np.concatenate([np.array(EDGE_VALUES, dtype=np.float32),
                        np.linspace(-100, 100, 20_001, dtype=np.float32),  # through the exp overflow region
                        rng.standard_normal(100_003).astype(np.float32) * 8])
    return {"float32": x, "float16": x.astype(np.float16)}


def plugin_reference(x, beta: float):
    """Swish as the plugin's CUDA kernel evaluates it, x / (1 + e^-(beta*x)) with beta*x rounded to
    float32 first, in float64 and rounded once to x's dtype (float16 through float32, as the kernel).
    Independent of this host's CPU path (see the module's note on tolerances)."""
    import numpy as np

    x32 = np.asarray(x, dtype=np.float32)
    scaled = (np.float32(beta) * x32).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x32.astype(np.float64) / (1.0 + np.exp(-scaled))
    return y.astype(np.float32).astype(x.dtype)


def _close_np(got, want, tol: dict, what: str) -> None:
    import torch

    _close(torch.from_numpy(got), torch.from_numpy(want), tol, what)


def check_harness(harness: Path | None, dtype_name: str, inputs: dict, work: Path) -> str:
    import numpy as np

    if harness is None:
        raise AssertionError("the harness was not built (see the build stage)")
    x = inputs[dtype_name]
    code = {"float32": "f32", "float16": "f16"}[dtype_name]
    source = work / f"in-{code}.bin"
    x.tofile(source)
    for offset in (0, 1):  # the vector path, then the unaligned scalar path
        output = work / f"out-{code}-{offset}.bin"
        result = subprocess.run([str(harness), code, str(offset), str(source), str(output), *map(repr, PLUGIN_BETAS)],
                                capture_output=True, text=True, timeout=120)
        if "cudaErrorDevicesUnavailable" in result.stderr:
            raise Skip("the GPU is in exclusive-process compute mode: the harness cannot share it with this process")
        if result.returncode != 0:
            raise AssertionError(f"harness exit {result.returncode}: {result.stderr.strip()[-1500:]}")
        got = np.fromfile(output, dtype=x.dtype)
        if got.size != x.size * len(PLUGIN_BETAS):
            raise AssertionError(f"harness wrote {got.size} elements, expected {x.size * len(PLUGIN_BETAS)}")
        for block, beta in zip(got.reshape(len(PLUGIN_BETAS), x.size), PLUGIN_BETAS):
            _close_np(block, plugin_reference(x, beta), PLUGIN_TOL[dtype_name], f"offset {offset}, beta {beta}")
    return f"{x.size} elements x {len(PLUGIN_BETAS)} betas, aligned and unaligned"


def check_ort(setup: Setup, inputs: dict, time_left: float = 60) -> str:
    """The plugin itself, through onnxruntime's CUDA execution provider (no CPU fallback allowed).

    What this host lacks (an onnxruntime-gpu for this CUDA major, cuDNN, headers offline, an
    onnxruntime older than the plugin's headers) is a SKIP with the reason; only wrong numbers fail.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        raise Skip("onnxruntime is not importable (the harness above ran the same launch path)") from None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Skip(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (the harness above ran the same launch path)")
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
        raise Skip(f"onnxruntime {ort.__version__} could not start its CUDA EP here: "
                   f"{str(exc).strip().splitlines()[0][:300]}") from None
    if probe.get_providers()[0] != "CUDAExecutionProvider":  # onnxruntime's Python fallback to the CPU
        raise Skip(f"onnxruntime {ort.__version__} fell back to {probe.get_providers()}: its CUDA EP did not load "
                   "(check `python -m infer.runner doctor`)")
    try:
        # Its own folder: a one-architecture plugin must not become loader.default_library's pick.
        library = build(cuda="ON", cuda_architectures=setup.arch, root=BUILD_DIR / "ort_plugin", entry=setup.entry,
                        fetch_timeout_s=min(max(time_left / 2, 5), 20), log=lambda message: None)
    except (ToolMissing, HeadersNotFound) as exc:  # no cmake, no pinned headers offline: not buildable here
        raise Skip(f"plugin not built: {str(exc).splitlines()[0]}") from None

    headers = str(json.loads((library.parent / INFO_FILE).read_text()).get("ort_headers_version", ""))
    if headers and release(ort.__version__) < release(headers):
        raise Skip(f"onnxruntime {ort.__version__} is older than the headers the plugin is built against ({headers}): "
                   f"it cannot load the plugin; install onnxruntime-gpu {headers} or newer")
    api = read_library(library).api_version
    for dtype_name, x in inputs.items():
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # A node ORT cannot place on CUDA must fail the session, not fall back to the CPU kernel.
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        register(options, library)
        # The CUDA EP started above: a failure now (no CUDA kernel for the node, say) is the plugin's.
        session = ort.InferenceSession(one_node_model("myops", "Swish", element_type=dtype_name), options,
                                       providers=providers)
        if session.get_providers()[0] != "CUDAExecutionProvider":
            raise AssertionError(f"the plugin's session runs on {session.get_providers()}, not the CUDA EP")
        (y,) = session.run(None, {"x": x})
        _close_np(y, plugin_reference(x, 1.0), PLUGIN_TOL[dtype_name], f"ORT CUDA EP, {dtype_name}")
    setup.ort_plugin = library
    return f"onnxruntime {ort.__version__}, plugin API {api}, float32 and float16, beta 1"


def plugin_stage(run: Run, setup: Setup, harness: Path | None) -> None:
    inputs = plugin_inputs()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for dtype_name in ("float32", "float16"):
            run.check("plugin", f"plugin launch path (harness) vs float64 reference, {dtype_name}",
                      lambda d=dtype_name: check_harness(harness, d, inputs, Path(tmp)))
    run.check("plugin", "plugin through onnxruntime CUDAExecutionProvider vs float64 reference",
              lambda: check_ort(setup, inputs, run.left()))


# ---------------------------------------------------------------- benchmark rows and targets

def _backward_of(function, x, grad, inputs=None):
    """Maker of a timed backward: the graph is built once, each call runs its backward again."""
    import torch

    def make():
        xg = x.detach().requires_grad_(True)
        leaves = [xg] + [t.detach().requires_grad_(True) for t in (inputs or ())]
        y = function(*leaves)
        return lambda: torch.autograd.grad(y, leaves, grad, retain_graph=True)
    return make


def row_plan(x, grad, beta: float, op: str = "swish") -> list[tuple[str, str, float, object]]:
    """(row, what runs, tensors of x's size moved per call, maker of the timed call) for one input,
    from the op's declaration (ops/<op>.py): the copy, the composite, the extension and PyTorch's
    own function where it applies, then their backwards. The weights are those the exported models
    hold (the op's model, seed 0); the attributes its defaults, with the run's beta for Swish."""
    from ops.registry import OPS

    declared = OPS[op]
    attributes = declared.attributes(beta=beta)
    model = declared.build_model(declared.name, hidden=x.shape[-1], attributes=attributes)
    weights = tuple(getattr(model, name).detach().to(x.device, x.dtype) for name in declared.weights)
    constants = tuple(attributes.values())
    per_weight = 1 / (x.numel() // x.shape[-1]) if x.numel() else 0  # a [hidden] weight, in tensors of x's size

    def forward(function):
        return lambda: (lambda: function(x, *weights, *constants))

    def backward(function):
        return _backward_of(lambda t, *w: function(t, *w, *constants), x, grad, weights)

    native = declared.native is not None and declared.native_applies(attributes)
    moved, moved_back = 2 + len(weights) * per_weight, 3 + 2 * len(weights) * per_weight  # dw written too
    plan = [
        ("torch_copy", "torch.clone", 2, lambda: (lambda: x.clone())),
        ("torch_composite", declared.reference_text, moved, forward(declared.reference)),
        ("torch_extension", declared.torch_name, moved, forward(declared.function)),
    ]
    if native:
        plan.append((declared.spec.native_row, declared.native_text, moved, forward(declared.native)))
    # Backward: read grad, x (and the weights), write dx (and their gradients).
    plan += [
        ("torch_composite_backward", f"autograd of {declared.reference_text}", moved_back, backward(declared.reference)),
        ("torch_extension_backward", f"{declared.torch_name}_backward", moved_back, backward(declared.function)),
    ]
    if native:
        plan.append((f"{declared.spec.native_row}_backward", f"{declared.native_text} backward", moved_back,
                     backward(declared.native)))
    return plan


def bench_inputs(shape, dtype_name: str):
    import torch

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(shape, generator=gen, device=DEVICE).to(getattr(torch, dtype_name))
    grad = torch.randn(shape, generator=gen, device=DEVICE).to(getattr(torch, dtype_name))
    return x, grad


def warm_up_gpu(seconds: float = 0.5) -> None:
    """Clocks up before the first row: copies of 512 MiB until `seconds` have passed."""
    import torch

    buffer = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        for _ in range(20):
            buffer.clone()
        torch.cuda.synchronize()


def make_row(setup: Setup, args, workload: str, shape, dtype_name: str, row: str, graph: str, bytes_moved: int,
             measured: dict) -> dict:
    """A bench.csv row in the format every bench writes (infer.rows.record): this host's facts, the
    row's own shape, dtype and bytes."""
    from infer.rows import record

    spec = dict(workload=workload, row=row, dtype=dtype_name, shape=shape, beta=args.beta, warmup=args.warmup,
                runs=args.runs, threads=None, bytes_moved=bytes_moved)
    facts = dict(setup.facts, gpu=setup.device, driver=setup.driver, extension_sha256=extension_sha256())
    return record(setup.entry, spec, dict(measured, graph=graph, execution_provider=PROVIDER, tf32=torch_tf32()), facts)


def extension_sha256() -> str | None:
    """The sha256 of the extension library this process loaded."""
    import ops

    from infer.rows import file_sha256

    library = getattr(ops, "_loaded_from", None)
    return file_sha256(library) if library and Path(library).is_file() else None


def torch_tf32() -> str:
    """The TF32 setting the torch rows ran with (float32 matmuls; the activation itself has none)."""
    import torch

    return "on" if torch.backends.cuda.matmul.allow_tf32 else "off (torch.backends.cuda.matmul.allow_tf32=False)"


def bench_stage(run: Run, setup: Setup, args) -> list[dict]:
    import torch

    from infer.rows import derive
    from infer.workloads import WORKLOADS as KNOWN_WORKLOADS

    from .torch_rows import measure_cuda

    warm_up_gpu()
    rows, skipped = [], 0
    for workload, shape in WORKLOADS:
        for dtype_name in DTYPES:
            x, grad = bench_inputs(shape, dtype_name)
            itemsize = x.element_size()
            op = KNOWN_WORKLOADS[workload].op
            for row, graph, tensors, make in row_plan(x, grad, args.beta, op):
                if run.left() <= 0:
                    skipped += 1
                    continue
                try:
                    call = make()
                    measured = measure_cuda(call, args.warmup, args.runs)
                    del call  # frees a backward row's graph before the next row's peak is measured
                except Exception as exc:  # e.g. out of memory: reported with the rows, not a correctness failure
                    run.notes.append(f"bench: {workload} {dtype_name} {row} failed: {type(exc).__name__}: {exc}")
                    log(f"  {workload:11} {dtype_name:8} {row:24} FAILED: {type(exc).__name__}: {exc}")
                    continue
                rows.append(make_row(setup, args, workload, shape, dtype_name, row, graph,
                                     round(tensors * x.numel() * itemsize), measured))
                device = "    none" if measured["device_ms"] is None else f"{measured['device_ms']:8.4f}"
                log(f"  {workload:13} {dtype_name:8} {row:24} per call p50 {measured['p50_ms']:8.4f} ms "
                    f"(p20 {measured['p20_ms']:.4f}, p80 {measured['p80_ms']:.4f}), device {device} ms, "
                    f"peak {measured['peak_mb']:8.1f} MiB")
            del x, grad
            torch.cuda.empty_cache()
    if skipped:
        run.notes.append(f"bench: {skipped} rows skipped, the stage ran out of its {BUDGETS_S['bench']} s budget")
        log(f"  {skipped} rows skipped: out of the stage's budget")
    derive(rows, device_caches())
    return rows


def device_caches() -> dict[str, int]:
    """The GPU's L2, which all its SMs share: rows that fit in it (8x512x768 on an H100/H200's 50 MB)
    run at L2 bandwidth, above DRAM's. {} where torch does not say (regime "unknown")."""
    import torch

    if DEVICE != "cuda":
        from lab.provenance import cpu_caches

        return cpu_caches()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
    return {"L2": int(l2)} if l2 else {}


def targets_stage(run: Run, setup: Setup, args) -> list[dict]:
    """Paired ratios of device time (bench.cuda_timing), each pair's two batches behind one spin:
    Swish's TARGETS on the large workload, and every other op's declared targets (ops/<op>.py) whose
    rows are PyTorch's (RMSNorm: extension vs F.rms_norm) on its target workload."""
    import torch

    from ops.registry import OPS

    from .cuda_timing import paired_device_ratio
    from .targets import target_status

    rms_norm_targets = tuple((name, numerator, denominators[0], limit)
                             for name, numerator, denominators, limit in OPS["rms_norm"].targets
                             if numerator.startswith("torch_") and denominators[0].startswith("torch_"))
    plans = (("swish", TARGET_WORKLOAD, TARGETS), ("rms_norm", RMS_NORM_TARGET_WORKLOAD, rms_norm_targets))
    results = []
    for op, workload, targets in plans:
        shape = dict(WORKLOADS)[workload]
        needed = {row for _, numerator, denominator, _ in targets for row in (numerator, denominator)}
        for dtype_name in DTYPES:
            if run.left() <= 0:
                run.notes.append(f"targets: {op} {dtype_name} skipped, the stage ran out of its "
                                 f"{BUDGETS_S['targets']} s budget")
                continue
            x, grad = bench_inputs(shape, dtype_name)
            calls = {row: make() for row, _, _, make in row_plan(x, grad, args.beta, op) if row in needed}
            for name, numerator, denominator, limit in targets:
                if numerator not in calls or denominator not in calls:
                    continue  # F.silu at a beta other than 1, F.rms_norm before torch 2.4
                try:  # paired_device_ratio(a, b) is t(b) / t(a)
                    ratio = paired_device_ratio(calls[denominator], calls[numerator], args.pairs)
                except Exception as exc:  # reported, like a missed target, not a correctness failure
                    run.notes.append(f"targets: {name}, {dtype_name} failed: {type(exc).__name__}: {exc}")
                    continue
                results.append({
                    "entry": setup.entry, "op": op, "target": f"{name}, {dtype_name} {'x'.join(map(str, shape))}",
                    "numerator": numerator, "denominator": denominator, "shape": "x".join(map(str, shape)),
                    "median_ratio": round(ratio, 4), "limit": limit, "holds": ratio <= limit, "pairs": args.pairs,
                    "threads": None, "opset": None, "git_sha": setup.facts.get("git_sha"),
                    "timestamp": setup.facts.get("timestamp"),
                })
                log(f"  {results[-1]['target']:90} {ratio:6.3f}  ({target_status(ratio, limit)})")
            del calls, x, grad
            torch.cuda.empty_cache()
    return results


def parse_harness_timing(stdout: str) -> dict[str, float]:
    """{'forward_ms': F, 'copy_ms': C} from `plugin_harness time`'s line."""
    line = stdout.strip().splitlines()[-1]
    return {key: float(value) for key, value in (part.split("=") for part in line.split())}


PLUGIN_COPY_LIMIT = round(1 / 0.9, 4)  # the kernel's time over the copy's: at least 90 % of copy bandwidth


def plugin_kernel_targets(setup: Setup, harness: Path | None, reps: int = 20) -> list[dict]:
    """The plugin's CUDA launch path (the harness) against a device-to-device copy of the same bytes,
    device time, on the large workload: the ORT custom op's floor where no onnxruntime-gpu is here."""
    if harness is None:
        return []
    from .targets import target_status

    shape = dict(WORKLOADS)[TARGET_WORKLOAD]
    n = 1
    for size in shape:
        n *= size
    results = []
    for code, dtype_name in (("f32", "float32"), ("f16", "float16")):
        ran = subprocess.run([str(harness), "time", code, str(n), str(reps)], capture_output=True, text=True, timeout=120)
        if ran.returncode != 0:
            raise RuntimeError(f"plugin_harness time {code}: {ran.stderr.strip()[-300:]}")
        timing = parse_harness_timing(ran.stdout)
        ratio = timing["forward_ms"] / timing["copy_ms"]
        target = (f"plugin CUDA kernel vs cudaMemcpy D2D (at least 90 % of copy bandwidth, harness), "
                  f"{dtype_name} {'x'.join(map(str, shape))}")
        log(f"  {target:90} {ratio:6.3f}  ({target_status(ratio, PLUGIN_COPY_LIMIT)})")
        results.append({"entry": setup.entry, "op": "swish", "target": target, "numerator": "plugin_kernel",
                        "denominator": "cuda_memcpy_d2d", "median_ratio": round(ratio, 4),
                        "limit": PLUGIN_COPY_LIMIT, "holds": ratio <= PLUGIN_COPY_LIMIT, "pairs": reps,
                        "threads": None, "opset": None, "git_sha": setup.facts.get("git_sha"),
                        "timestamp": setup.facts.get("timestamp")})
    return results


ORT_PER_CALL_LIMIT = round(1 / 1.3, 4)  # the custom op's time over the composite's: 1.3x faster
PROVIDER_OF = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


def ort_per_call_target(setup: Setup, args) -> list[dict]:
    """The ORT custom op against the torch composite, per call as each caller sees it (host clock,
    each call ending in a synchronisation), on the small workload where dispatch dominates.

    Needs onnxruntime-gpu here (setup.ort_plugin, set by the plugin stage); one process, pairs
    alternating, so both sides share the machine's state.
    """
    if setup.ort_plugin is None:
        return []
    import numpy as np
    import onnxruntime as ort
    import torch

    import ops
    from ort_plugin.loader import exact_providers, register
    from ort_plugin.onnx_file import one_node_model

    from .targets import paired_ratio, target_status

    shape = dict(WORKLOADS)["swish"]
    x, _ = bench_inputs(shape, "float32")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    on_gpu = DEVICE == "cuda"
    if on_gpu:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    register(options, setup.ort_plugin)
    session = ort.InferenceSession(one_node_model("myops", "Swish", element_type="float32"), options,
                                   providers=exact_providers([PROVIDER_OF[DEVICE]], ort.__version__))
    binding = session.io_binding()
    flat = np.ascontiguousarray(x.flatten().cpu().numpy())
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(flat, DEVICE, 0))
    binding.bind_output("y", DEVICE, 0)

    def ort_call():
        binding.synchronize_inputs()
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()

    def torch_call():  # the model's Swish has no beta attribute: 1.0
        ops.reference(x, 1.0)
        torch.cuda.synchronize()

    ratio = paired_ratio(ort_call, torch_call, args.pairs)
    target = f"ORT custom op vs PyTorch composite, per call (host clock), float32 {'x'.join(map(str, shape))}"
    log(f"  {target:90} {ratio:6.3f}  ({target_status(ratio, ORT_PER_CALL_LIMIT)})")
    return [{"entry": setup.entry, "op": "swish", "target": target, "numerator": "ort_custom", "denominator": "torch_composite",
             "median_ratio": round(ratio, 4), "limit": ORT_PER_CALL_LIMIT, "holds": ratio <= ORT_PER_CALL_LIMIT,
             "pairs": args.pairs, "threads": None, "opset": 17, "git_sha": setup.facts.get("git_sha"),
             "timestamp": setup.facts.get("timestamp")}]


MEMORY_UNSAVED_LIMIT = 0.05


def memory_targets(setup: Setup, rows: list[dict]) -> list[dict]:
    """The fused op's peak memory below the composite's by one activation tensor (TARGET_WORKLOAD).

    At its peak the composite holds sigmoid(beta*x) beside its output; the op, only its output. The
    ratio is the fused peak over (the composite's peak less one tensor), as a share of one tensor:
    0 when exactly one tensor is saved; the limit leaves 5 % of a tensor for allocator rounding.
    """
    from .targets import target_status

    results = []
    for dtype_name in DTYPES:
        peaks = {r["row"]: r for r in rows if r["workload"] == TARGET_WORKLOAD and r["dtype"] == dtype_name}
        if "torch_composite" not in peaks or "torch_extension" not in peaks:
            continue
        tensor_mb = peaks["torch_extension"]["bytes_moved"] / 2 / 2**20  # forward rows move x in and y out
        saved = float(peaks["torch_composite"]["peak_mb"]) - float(peaks["torch_extension"]["peak_mb"])
        ratio = 1 - saved / tensor_mb
        results.append({
            "entry": setup.entry, "op": "swish", "target": f"fused peak memory not saved against the composite's, in activation "
            f"tensors (0: one tensor saved), {dtype_name} {peaks['torch_extension']['shape']}",
            "numerator": "torch_extension peak - (torch_composite peak - one tensor)",
            "denominator": f"one tensor ({tensor_mb:.1f} MiB)", "median_ratio": round(ratio, 4),
            "limit": MEMORY_UNSAVED_LIMIT, "holds": ratio <= MEMORY_UNSAVED_LIMIT, "pairs": None, "threads": None,
            "opset": None, "git_sha": setup.facts.get("git_sha"), "timestamp": setup.facts.get("timestamp"),
        })
        log(f"  {results[-1]['target']:90} {ratio:6.3f}  ({target_status(ratio, MEMORY_UNSAVED_LIMIT)})")
    return results


def write_results(out: Path, entry: str, rows: list[dict], targets: list[dict]) -> None:
    from lab.files import upsert_csv, write_csv_atomic

    from infer.rows import COLUMNS, KEY, write_aggregate
    from .targets import TARGET_COLUMNS

    entry_dir = out / entry
    upsert_csv(entry_dir / "bench.csv", rows, COLUMNS, KEY)
    if targets:
        write_csv_atomic(entry_dir / "targets.csv", targets, TARGET_COLUMNS)
    write_aggregate(out)
    log(f"wrote {len(rows)} rows to {entry_dir / 'bench.csv'}, {len(targets)} targets to {entry_dir / 'targets.csv'}, "
        f"and {out / 'bench_all.csv'}")
    from .report import main as report

    report(["--results", str(out)])  # summary.md per entry; charts where matplotlib is installed


# ---------------------------------------------------------------- summary and main

def summary(run: Run, targets: list[dict]) -> None:
    from .targets import target_status

    print("\n==== correctness " + "=" * 80)
    for c in run.checks:
        short = c.detail.strip().splitlines()[0][:100] if c.detail.strip() else ""
        print(f"{c.status:4}  {c.stage:9} {c.name:68} {short}")
    if targets:
        print("\n==== targets (median of paired ratios; missed targets are reported, not failures) " + "=" * 15)
        print(f"{'target (holds when measured <= limit)':100} {'measured':>8}  {'limit':>7}  status")
        for t in targets:
            limit = float(t["limit"])
            print(f"{t['target']:100} {t['median_ratio']:8.3f}  {limit:7.4g}  {target_status(t['median_ratio'], limit)}")
    for note in run.notes:
        print(f"note: {note}")
    failed = [c for c in run.checks if c.status == "FAIL"]
    elapsed = time.monotonic() - run.started
    print(f"\n[gpu_check] {len(run.checks) - len(failed)} of {len(run.checks)} checks passed or skipped, "
          f"{len(failed)} failed; {elapsed:.0f} s in all", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: results/)")
    parser.add_argument("--entry", help="CUDA matrix entry for the rows (default: the one matching torch's CUDA)")
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=100, help="alternating A/B pairs per target ratio")
    parser.add_argument("--time-limit", type=float, default=345, help="seconds for all stages together")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("error: torch is not importable: this check needs a CUDA build of PyTorch", file=sys.stderr)
        return 2
    with warnings.catch_warnings():  # a CUDA build without a driver warns; the one line below says it all
        warnings.simplefilter("ignore")
        available = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if not available:
        print(f"error: {no_gpu_message(torch)}", file=sys.stderr)
        return 2

    run = Run(args.time_limit)
    try:
        with run.stage("preflight"):
            setup = preflight(args, torch)
    except HostError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    harness = None
    with run.stage("build"):
        started = start_harness_build(setup.nvcc, setup.arch)
        built = run.check("build", "extension built for this GPU and loaded", lambda: build_extension(setup, run))

        def harness_built():
            nonlocal harness
            harness = finish_harness_build(started, timeout=max(run.left(), 60))
            return str(harness)

        run.check("build", "plugin harness compiled with nvcc", harness_built)
        if built:
            built = run.check("build", "the op runs on this GPU",
                              lambda: str(torch.ops.myops.swish(torch.ones(4, device=DEVICE), 1.0).tolist()))
    if not built:
        summary(run, [])
        return 1

    with run.stage("layer 1"):
        layer1(run)
    with run.stage("plugin"):
        plugin_stage(run, setup, harness)
    with run.stage("bench"):
        rows = bench_stage(run, setup, args)
    with run.stage("targets"):
        targets = targets_stage(run, setup, args) + memory_targets(setup, rows)
        for name, extra in (("plugin kernel vs copy", lambda: plugin_kernel_targets(setup, harness)),
                            ("ORT custom op per call", lambda: ort_per_call_target(setup, args))):
            try:
                targets += extra()
            except Exception as exc:  # reported, like a missed target, not a correctness failure
                run.notes.append(f"targets: {name} failed: {type(exc).__name__}: {exc}")
    with run.stage("write"):
        if run.failed:
            log("not writing results: a correctness check failed (see the summary)")
        else:
            write_results(args.out, setup.entry, rows, targets)
    summary(run, targets)
    return 1 if run.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
