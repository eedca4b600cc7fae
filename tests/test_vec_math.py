"""kernels/vec_math-inl.h (the fast Exp and Sigmoid that scaffolded ops' CPU kernels build on, in
Highway's portable vectors) against float64, on every CPU path this machine runs, through
MYOPS_VEC_DISPATCH as an op calls them: MYOPS_CPU_ISA caps the path, and the cap is seen to be taken.
Also: bench.vecmath, the measurement behind the choice of library, builds and runs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.cpu_paths import runnable
from lab import highway

REPO = Path(__file__).resolve().parent.parent
# Specials and the ends of the range, then values across it: ties of the floor, tiny and huge.
SPECIALS = [0.0, -0.0, 1e-40, -1e-40, 1e-7, -1e-7, 0.5, -0.5, 1.0, -1.0, 88.0, 88.72, 88.73, 1e4,
            -87.3, -87.4, -88.0, -104.0, -1e4, float("inf"), float("-inf"), float("nan")]


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vec-math") / "vec_math_harness"
    include = highway.resolve(log=lambda m: None).include_dir
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{REPO / 'kernels'}", f"-I{REPO / 'tests'}", f"-I{include}",
                    str(REPO / "tests" / "vec_math_harness.cc"), "-o", str(out)], check=True, timeout=600)
    return out


def _run(harness: Path, x: np.ndarray, path: str, work: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(Exp, Sigmoid, ExpFast) of x on the path, and what the harness printed."""
    x.astype(np.float32).tofile(work / "x.f32")
    outputs = [work / f"{name}.f32" for name in ("exp", "sigmoid", "exp_fast")]
    child = subprocess.run([str(harness), str(work / "x.f32"), *map(str, outputs)],
                           env=dict(os.environ, MYOPS_CPU_ISA=path), capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    return (*(np.fromfile(out, np.float32) for out in outputs), child.stderr)


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(11)
    spread = rng.uniform(-90.0, 90.0, 100_003)  # an odd count: a tail of single lanes
    return np.concatenate([np.array(SPECIALS), spread, rng.normal(0, 2, 10_000)]).astype(np.float32)


# Highway's target for each path (hwy::TargetName): the baseline is EMU128, or SCALAR where Highway deems
# EMU128 broken (kernels/vec_targets.h).
HIGHWAY_TARGET = {"avx512": {"AVX3"}, "avx2": {"AVX2"}, "neon": {"NEON"}, "baseline": {"EMU128", "SCALAR"}}


@pytest.mark.parametrize("path", runnable(highway=True) or ["baseline"])
def test_exp_and_sigmoid_match_float64_on_every_path(harness, path, tmp_path):
    x = _inputs()
    exp, sigmoid, exp_fast, stderr = _run(harness, x, path, tmp_path)
    assert f"MYOPS_CPU_ISA={path}: the CPU path is {path}" in stderr, stderr
    taken = next((line.split("=", 1)[1] for line in stderr.splitlines() if line.startswith("highway=")), None)
    assert taken in HIGHWAY_TARGET[path], stderr  # the dispatch took Highway's copy for this path
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        exp64, sigmoid64 = np.exp(x64), 1.0 / (1.0 + np.exp(-x64))
    # Where e^x is a normal float32: within 3e-7 relative (a few ulp; the polynomial's own error).
    normal = np.isfinite(x64) & (x64 > -87.3) & (x64 < 88.72)
    np.testing.assert_allclose(exp[normal], exp64[normal], rtol=3e-7, atol=0)
    # ExpFast: the product x log2 e rounds once, an error |x| log2 e ulp(1) wide: under 6e-6 up to |x| = 88.
    np.testing.assert_allclose(exp_fast[normal], exp64[normal], rtol=6e-6, atol=0)
    assert np.all(np.isposinf(exp_fast[x64 > 88.73])) and np.isnan(exp_fast[np.isnan(x64)]).all()
    # below about -87.34 (2^t subnormal) 0 on every path, in a full vector or at an array's end alike
    assert np.all(exp_fast[x64 < -87.4] == 0), exp_fast[x64 < -87.4]
    np.testing.assert_allclose(sigmoid[np.isfinite(x64)], sigmoid64[np.isfinite(x64)], rtol=5e-7, atol=1e-30)
    # The ends: +inf above the float range, 0 (not a subnormal) below it; inf, -inf and NaN as expf.
    assert np.all(np.isposinf(exp[x64 > 88.73])) and np.all(exp[(x64 < -87.4) & (x64 > -np.inf)] == 0)
    assert np.isposinf(exp[x64 == np.inf]).all() and (exp[x64 == -np.inf] == 0).all() and np.isnan(exp[np.isnan(x64)]).all()
    assert (sigmoid[x64 == np.inf] == 1).all() and (sigmoid[x64 == -np.inf] == 0).all() and np.isnan(sigmoid[np.isnan(x64)]).all()


def test_every_path_gives_the_same_vector_results(harness, tmp_path):
    """The vector paths share one polynomial and one FMA per step: the same bits (the baseline, without
    FMA, may differ in the last bit)."""
    vector_paths = [p for p in runnable(highway=True) if p != "baseline"]
    if len(vector_paths) < 2:
        pytest.skip(f"one vector path on this CPU ({vector_paths or 'none'}): nothing to compare")
    x = _inputs()
    first, *others = [_run(harness, x, path, tmp_path) for path in vector_paths]
    finite = np.isfinite(first[2]) & (first[2] != 0)
    for other in others:
        np.testing.assert_array_equal(first[0], other[0])  # Exp
        # ExpFast: AVX-512's 2^t (vreduceps) may round the fraction 1 ulp apart; the ends exactly alike
        np.testing.assert_array_max_ulp(first[2][finite], other[2][finite], maxulp=1)
        np.testing.assert_array_equal(first[2][~finite], other[2][~finite])


@pytest.mark.parametrize("path", runnable(highway=True) or ["baseline"])
def test_an_element_gives_the_same_bits_in_a_full_vector_or_the_tail(harness, path, tmp_path):
    """The plugin and the extension split work differently, so an element may fall in a whole vector in
    one and in the one-lane tail in the other: both must give the same bits on every path."""
    values = np.float32(-1e-7) * np.arange(1, 17, dtype=np.float32) - np.float32(0.3)  # small negative t
    x = np.concatenate([values, values[:15]])  # 16 in whole vectors (AVX-512: one), the rest in the tail
    outputs = _run(harness, x, path, tmp_path)
    for out in (outputs[0], outputs[1], outputs[2]):
        np.testing.assert_array_equal(out[16:], out[:15])


def test_bench_vecmath_builds_and_measures_each_library():
    out = subprocess.run([sys.executable, "-m", "bench.vecmath"], cwd=REPO, capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "x |" in line]
    libraries = {row.split("|")[3].strip() for row in rows}
    assert {"hand", "highway-contrib", "highway-lab"} <= libraries, out.stdout


def test_highway_headers_resolve_from_the_cache_or_an_explicit_folder_and_refuse_a_wrong_one(tmp_path, monkeypatch):
    found = highway.resolve(log=lambda m: None)  # fetched (checked against its sha256) or cached
    assert (found.include_dir / "hwy" / "highway.h").is_file() and "HWY_NAMESPACE" in (
        found.include_dir / "hwy" / "highway.h").read_text()
    monkeypatch.setenv("MYOPS_HWY_INCLUDE_DIR", str(found.include_dir))
    assert highway.resolve().include_dir == found.include_dir
    monkeypatch.setenv("MYOPS_HWY_INCLUDE_DIR", str(tmp_path))
    with pytest.raises(highway.HighwayNotFound, match="holds no hwy/highway.h"):
        highway.resolve()


def test_only_an_op_with_vector_kernels_needs_highway(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "vec_math-inl.h").write_text("")  # the shared helpers alone need nothing fetched
    assert not highway.needed(tmp_path) and not highway.needed(REPO)
    (tmp_path / "kernels" / "mish_vec-inl.h").write_text("")
    assert highway.needed(tmp_path)
