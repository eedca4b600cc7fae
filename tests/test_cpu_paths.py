"""Every CPU path of kernels/swish.h on this one machine: AVX-512 and AVX2 (intrinsics) and
baseline (compiled from the scalar code). MYOPS_CPU_ISA caps the path picked at load time, so each
runs in a process of its own; the machine CI runs on has AVX-512, so without the cap the other two
paths would never run here although most laptops take the AVX2 one.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.test_under_load import reference_mismatch, same_bits

REPO = Path(__file__).resolve().parent.parent
PATHS = ("baseline", "avx2", "avx512")
BETA = 1.702
# An odd length: every span ends in a tail; edge values at both ends and in the middle.
EDGES = [0.0, -0.0, 1e-40, -1e-40, 20.0, -20.0, 88.5, -88.5, 1e4, -1e4, float("inf"), float("-inf"), float("nan")]

CHILD = r"""
import json, sys
import numpy as np, torch
import ops
from ort_plugin import make_session
from tests.test_under_load import swish_model

x = np.load(sys.argv[1])
ops.load()
session = make_session(swish_model(float(sys.argv[3]), 1), library=sys.argv[2])
xt = torch.from_numpy(x).requires_grad_()
y = ops.swish(xt, float(sys.argv[3]))
(dx,) = torch.autograd.grad(y, xt, torch.ones_like(y))
np.savez(sys.argv[4], plugin=session.run(None, {"x": x})[0],
         extension=y.detach().numpy(), grad=dx.numpy())
"""


def derivative64(x: np.ndarray, beta: float) -> np.ndarray:
    b = np.float64(np.float32(beta))
    with np.errstate(over="ignore", invalid="ignore"):
        s = 1.0 / (1.0 + np.exp(-(b * x.astype(np.float64))))
        return s + b * x * s * (1.0 - s)


@pytest.fixture(scope="module")
def outputs(plugin_path, ext, tmp_path_factory):
    work = tmp_path_factory.mktemp("cpu-paths")
    x = np.random.default_rng(7).normal(scale=8.0, size=200_003).astype(np.float32)
    x[: len(EDGES)], x[-len(EDGES):], x[100_000:100_000 + len(EDGES)] = EDGES, EDGES, EDGES
    np.save(work / "x.npy", x)
    results = {}
    for path in PATHS:
        env = dict(os.environ, MYOPS_CPU_ISA=path, PYTHONPATH=str(REPO))
        out = work / f"{path}.npz"
        child = subprocess.run([sys.executable, "-c", CHILD, str(work / "x.npy"), str(plugin_path), str(BETA), str(out)],
                               capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
        assert child.returncode == 0, child.stderr[-3000:]
        results[path] = dict(np.load(out), stderr=child.stderr)
    return x, results


@pytest.mark.parametrize("path", PATHS)
def test_forward_matches_float64_and_both_layers_agree(outputs, path):
    x, results = outputs
    plugin, extension = results[path]["plugin"], results[path]["extension"]
    assert reference_mismatch(plugin, x, BETA) is None, reference_mismatch(plugin, x, BETA)
    # One header, one path per process: the two layers give the same bits.
    assert same_bits(plugin, extension)


@pytest.mark.parametrize("path", PATHS)
def test_backward_matches_float64(outputs, path):
    x, results = outputs
    grad, ref = results[path]["grad"].astype(np.float64), derivative64(x, BETA)
    finite = np.isfinite(x) & np.isfinite(ref)
    np.testing.assert_allclose(grad[finite], ref[finite], rtol=1e-5, atol=1e-6)


def test_the_cap_really_switches_paths(outputs):
    # Were the cap ignored, the three runs would take one path and the tests above would test it
    # alone. Both layers say which path they took when capped; the scalar exp's polynomial differs
    # from the vector paths' 2^t, so the baseline's last bits differ too. (The two vector paths give
    # the same bits: one polynomial, one rounding each.)
    from bench.cpu_paths import runnable

    _, results = outputs
    for path in runnable():
        said = f"[myops] MYOPS_CPU_ISA={path}: the CPU path is {path}"
        assert results[path]["stderr"].count(said) == 2, results[path]["stderr"][-2000:]  # extension and plugin
    if "avx512" in runnable():
        assert not same_bits(results["avx512"]["plugin"], results["baseline"]["plugin"])


@pytest.mark.parametrize("beta", [0.0, float("nan"), float("inf"), 3e38])
def test_odd_betas_give_what_the_scalar_path_gives(plugin_path, ext, tmp_path, beta):
    # beta = 0 with x = +-inf, NaN beta, and a beta whose -beta*log2(e) overflows: the vector paths
    # fold beta into their exponent, and must still give the baseline path's NaNs, zeros and infinities.
    x = np.array(EDGES + [1.0, -1.0, 1e-3, -1e-3, 1e30, -1e30], dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    got = {}
    for path in PATHS:
        out = tmp_path / f"{path}.npz"
        child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "x.npy"), str(plugin_path), repr(beta),
                                str(out)], capture_output=True, text=True, cwd=REPO, timeout=600,
                               env=dict(os.environ, MYOPS_CPU_ISA=path, PYTHONPATH=str(REPO)))
        assert child.returncode == 0, child.stderr[-3000:]
        got[path] = dict(np.load(out))
    for path in ("avx512", "avx2"):
        for name in ("plugin", "extension", "grad"):
            np.testing.assert_allclose(got[path][name], got["baseline"][name], rtol=1.3e-6, atol=1e-6,
                                       equal_nan=True, err_msg=f"{path} {name}, beta {beta}")


def test_the_bench_picks_the_paths_the_cpu_flags_allow():
    from bench.cpu_paths import chosen, runnable

    skylake = "processor : 0\nflags : fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl\n"
    assert runnable(skylake) == ["avx512", "avx2", "baseline"]
    assert runnable("flags : fpu sse2 avx avx2 fma avx512f\n") == ["avx2", "baseline"]  # no BW/DQ/VL: no AVX-512 path
    assert runnable("flags : fpu sse2 avx\n") == ["baseline"]
    assert runnable("Features : fp asimd\n") == ["neon", "baseline"]  # aarch64
    assert runnable("processor : 0\n") == []  # names no features: nothing to cap
    assert chosen(["all"], ["avx2", "baseline"]) == ["avx2", "baseline"]
    assert chosen(["baseline", "avx2"], ["avx2", "baseline"]) == ["avx2", "baseline"]
    with pytest.raises(ValueError, match="cannot run avx512 .*runs avx2, baseline"):
        chosen(["avx512"], ["avx2", "baseline"])
    with pytest.raises(ValueError, match="no CPU paths"):
        chosen(["all"], [])
