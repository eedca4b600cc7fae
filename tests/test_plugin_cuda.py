"""The ORT plugin's CUDA kernel against Swish in float64 (bench/gpu/plugin.py): through the harness
(the plugin's launch path compiled with nvcc) and through onnxruntime's CUDA EP where there is one, on
a GPU host (marked cuda); and, everywhere, the harness's own argument checks and why its reference
cannot fail a correct kernel."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bench.gpu import plugin
from devices import CUDA_MARKS

CUDA_PLUGIN_DTYPES = [pytest.param(d, id=d, marks=CUDA_MARKS) for d in ("float32", "float16")]


REPO = Path(__file__).resolve().parent.parent


def find_nvcc() -> str | None:
    from bench.gpu.host import find_nvcc as nvcc_of_torchs_toolkit

    return nvcc_of_torchs_toolkit()


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    """The harness for this GPU: bench.gpu_check's (MYOPS_PLUGIN_HARNESS), else compiled here."""
    import torch

    if "MYOPS_PLUGIN_HARNESS" in os.environ:
        if not os.environ["MYOPS_PLUGIN_HARNESS"]:
            pytest.skip("the harness did not build in bench.gpu_check's build stage (its failure is reported there)")
        return Path(os.environ["MYOPS_PLUGIN_HARNESS"])
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found: the plugin harness is compiled on this host (install the CUDA toolkit or set "
                    "CUDA_HOME)")
    major, minor = torch.cuda.get_device_capability(0)
    started = plugin.start_harness_build(nvcc, f"{major}{minor}", tmp_path_factory.mktemp("harness"))
    return plugin.finish_harness_build(started, timeout=600)


@pytest.fixture(scope="module")
def cuda_plugin_session():
    """make_session(dtype) for the plugin on onnxruntime's CUDA EP, built once for this GPU where
    bench.gpu_check builds it too (build/gpu_check/ort_plugin: the second build reuses the first)."""
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    entry = os.environ.get("MYOPS_MATRIX_ENTRY", f"cuda{torch.version.cuda}")
    try:
        make_session, _, _ = plugin.cuda_session_factory(f"{major}{minor}", entry,
                                                         REPO / "build" / "gpu_check" / "ort_plugin")
    except plugin.Unavailable as exc:
        pytest.skip(str(exc))
    return make_session


@pytest.mark.parametrize("dtype", CUDA_PLUGIN_DTYPES)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_harness_matches_the_float64_reference(harness, dtype, offset, tmp_path):
    x = plugin.inputs()[dtype]
    try:
        outputs = plugin.run_harness(harness, x, offset, plugin.BETAS, tmp_path)
    except plugin.Unavailable as exc:
        pytest.skip(str(exc))
    for got, beta in zip(outputs, plugin.BETAS):
        plugin.assert_close(got, plugin.reference(x, beta), plugin.TOLERANCES[dtype], f"offset {offset}, beta {beta}")


@pytest.mark.parametrize("dtype", CUDA_PLUGIN_DTYPES)
def test_plugin_through_the_cuda_execution_provider(cuda_plugin_session, dtype):
    x = plugin.inputs()[dtype]
    (y,) = cuda_plugin_session(dtype).run(None, {"x": x})
    plugin.assert_close(y, plugin.reference(x, 1.0), plugin.TOLERANCES[dtype], f"ORT CUDA EP, {dtype}")


# ---------------------------------------------------------------- everywhere

ULPS_OF_CUDA_EXPF = 2  # CUDA C++ Programming Guide, "Mathematical Functions": expf, maximum ulp error 2
# The same guide, "Intrinsic Functions": __expf is within 2 + floor(|1.16 x|) ulp; __fdividef within 2
# ulp for the divisors that matter here. |beta x| beyond 88.7 overflows either way, so 2 + 102 + 2.
ULPS_OF_FAST_EXP_AND_DIVISION = 106


def _steps(values, ulps: int):
    """Finite positive values moved `ulps` float32 steps up (or down); 0, inf and NaN stay."""
    out = values.copy()
    inexact = np.isfinite(out) & (out > 0)
    for _ in range(abs(ulps)):
        out[inexact] = np.nextafter(out[inexact], np.float32(np.inf if ulps > 0 else 0), dtype=np.float32)
    return out


def emulated_gpu_swish(x, beta: float, ulps: int) -> list:
    """Results the CUDA kernel may give, in numpy's float32: beta*x rounded, e^-(beta x) anywhere within
    `ulps` of exact (the extremes and the middle), then 1 + e and x / d rounded, then x's dtype."""
    x32 = np.asarray(x, dtype=np.float32)
    scaled = np.float32(beta) * x32
    with np.errstate(over="ignore", invalid="ignore"):
        exact = np.exp(-scaled.astype(np.float64)).astype(np.float32)
        return [(x32 / (np.float32(1) + _steps(exact, k))).astype(x.dtype) for k in (-ulps, 0, ulps)]


@pytest.mark.parametrize("dtype,ulps", [("float32", ULPS_OF_CUDA_EXPF), ("float16", ULPS_OF_FAST_EXP_AND_DIVISION)])
def test_the_reference_holds_against_every_result_cudas_math_allows(dtype, ulps):
    """At the check's own inputs and betas: the check cannot fail on a correct kernel (float32 with
    expf, float16 with the fast exp and division of kernels/swish.h forward_16bit)."""
    x = plugin.inputs()[dtype]
    for beta in plugin.BETAS:
        want = plugin.reference(x, beta)
        for k, got in zip((-ulps, 0, ulps), emulated_gpu_swish(x, beta, ulps)):
            plugin.assert_close(got, want, plugin.TOLERANCES[dtype], f"beta {beta}, exp {k:+d} ulp")


def test_the_cpu_kernels_vector_path_would_fail_the_plugin_check(ext):
    """Why the reference is not the extension's CPU kernel: on a vector path (2^t for e^-(beta x)) it
    differs from the GPU's math by more than the tolerance, where e^-(beta x) is huge."""
    import torch

    from bench.cpu_paths import runnable

    if not set(runnable()) & {"avx512", "avx2", "neon"} or os.environ.get("MYOPS_CPU_ISA") == "baseline":
        pytest.skip("this host runs the scalar path only")
    x = plugin.inputs()["float32"]
    cpu = torch.ops.myops.swish(torch.from_numpy(x), 1.0).numpy()
    exact_gpu = emulated_gpu_swish(x, 1.0, ULPS_OF_CUDA_EXPF)[1]  # expf correctly rounded
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        plugin.assert_close(exact_gpu, cpu, plugin.TOLERANCES["float32"], "vector path")


@pytest.mark.nvcc
def test_plugin_harness_compiles_and_checks_its_arguments(tmp_path, in_ci):
    nvcc = find_nvcc()
    if nvcc is None:
        if in_ci:
            pytest.fail("nvcc is expected on CI machines of this kind")
        pytest.skip("nvcc not installed")
    harness = tmp_path / "plugin_harness"
    result = subprocess.run(plugin.harness_command(nvcc, "90", harness), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]

    def call(*args):
        return subprocess.run([str(harness), *map(str, args)], capture_output=True, text=True, timeout=60)

    assert call().returncode == 2 and "usage" in call().stderr
    assert call("f64", 0, "in", "out", 1.0).returncode == 2
    assert call("f32", "x", "in", "out", 1.0).returncode == 2
    missing = call("f32", 0, tmp_path / "missing.bin", tmp_path / "out.bin", 1.0)
    assert missing.returncode == 1 and "cannot read" in missing.stderr
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0" * 6)
    assert call("f32", 0, odd, tmp_path / "out.bin", 1.0).returncode == 2
    source = tmp_path / "in.bin"
    np.linspace(-5, 5, 37, dtype=np.float32).tofile(source)
    ran = call("f32", 1, source, tmp_path / "out.bin", 1.0, 1.702)
    if ran.returncode == 0:  # a machine with a GPU: two betas' worth of output
        assert (tmp_path / "out.bin").stat().st_size == 2 * 37 * 4
    else:  # no GPU: a CUDA error, reported as such
        assert ran.returncode == 1 and ran.stderr.startswith("plugin_harness: "), ran.stderr
    # The timing mode: its arguments checked before any CUDA call; without a GPU, a CUDA error.
    assert call("time", "f32", 0, 10).returncode == 2 and "N must be" in call("time", "f32", 0, 10).stderr
    assert call("time", "f64", 8, 10).returncode == 2
    timed = call("time", "f16", 1 << 20, 5)
    if timed.returncode == 0:
        assert plugin.parse_harness_timing(timed.stdout)["forward_ms"] > 0
    else:
        assert timed.returncode == 1 and timed.stderr.startswith("plugin_harness: "), timed.stderr
