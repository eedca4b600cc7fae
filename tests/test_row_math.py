"""kernels/row_math.h: the exp a row-wise op's functions call (docs/examples/bias_softmax.patch's
softmax) against float64 on every CPU path this machine runs, and GCC's own report that a loop calling
it vectorises on each (the reason it exists: libm's expf keeps such a loop scalar)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from bench.cpu_paths import runnable

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "tests" / "row_math_harness.cc"
# The GCC flags of each path (as kernels/cpu_isa.h's target attributes); the baseline is x86-64's or aarch64's.
PATH_FLAGS = {"avx512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma"],
              "avx2": ["-mavx2", "-mfma"], "neon": [], "baseline": []}
SPECIALS = [0.0, -0.0, 1e-40, -1e-40, 1e-7, -1e-7, 0.5, -0.5, 1.0, -1.0, 88.0, 88.72, 88.73, 1e4,
            -87.3, -87.4, -88.0, -104.0, -1e4, float("inf"), float("-inf"), float("nan")]


def _built(path: str, out: Path) -> tuple[Path, str]:
    """The harness for one path, and GCC's vectorisation report of it."""
    built = subprocess.run(["g++", "-O2", "-std=c++17", *PATH_FLAGS[path], f"-I{REPO / 'kernels'}",
                            "-fopt-info-vec-optimized", str(HARNESS), "-o", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    return out, built.stderr


@pytest.mark.parametrize("path", runnable() or ["baseline"])
def test_exp_matches_float64_and_its_loop_vectorises(path, tmp_path):
    harness, report = _built(path, tmp_path / "harness")
    loop_line = next(n for n, line in enumerate(HARNESS.read_text().splitlines(), 1) if "EXP_LOOP" in line)
    assert any(f"row_math_harness.cc:{loop_line}:" in line and "loop vectorized" in line
               for line in report.splitlines()), report

    rng = np.random.default_rng(5)
    x = np.concatenate([SPECIALS, rng.uniform(-90, 90, 100_003), rng.uniform(-20, 0, 10_000)]).astype(np.float32)
    x.tofile(tmp_path / "x.f32")
    ran = subprocess.run([str(harness), str(tmp_path / "x.f32"), str(tmp_path / "y.f32")], capture_output=True,
                         timeout=60)
    assert ran.returncode == 0, ran.stderr
    y = np.fromfile(tmp_path / "y.f32", np.float32)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        want = np.exp(x64)
    # x log2(e) rounds once: a relative error up to |x| log2(e) 2^-24 beside the polynomial's 3e-7.
    normal = np.isfinite(x64) & (x64 > -87.3) & (x64 < 88.72)
    rtol = 3e-7 + np.abs(x64[normal]) * 1.4427 * 2.0 ** -24
    assert np.all(np.abs(y[normal] - want[normal]) <= rtol * want[normal]), np.max(np.abs(y[normal] / want[normal] - 1))
    # The ends: +inf above the range, 0 below it (no subnormals), NaN through.
    assert np.all(np.isposinf(y[x64 > 88.73])) and np.all(y[x64 < -87.4] == 0) and np.isnan(y[np.isnan(x64)]).all()
