"""The aarch64 NEON path of kernels/swish.h, on an x86-64 host.

tests/neon_driver.cc runs the header's public spans over a file of cases. It is cross-compiled with
Debian's aarch64-linux-gnu-g++ and run under qemu-aarch64-static, and built natively as well, where
MYOPS_CPU_ISA=avx2 picks the AVX2 path. The NEON path must give the AVX2 path's bits, NaNs and
zeros included, stay within the float64 reference's tolerance, and be what aarch64 picks unless
MYOPS_CPU_ISA=baseline caps it.

Skipped without the cross compiler or qemu; MYOPS_REQUIRE_ARM64=1 turns that into a failure.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.test_under_load import ATOL, RTOL, reference_mismatch, same_bits

REPO = Path(__file__).resolve().parent.parent
DRIVER = REPO / "tests" / "neon_driver.cc"
FLAGS = ["-O2", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-I", str(REPO / "kernels")]
CROSS, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64-static"

# 3e38: -beta * log2(e) overflows, so every vector path hands the span to its scalar baseline.
BETAS = (1.0, 1.702, 0.0, -1.0, float("nan"), float("inf"), 3e38)
LENGTHS = (*range(18), 1000)  # every tail length of a 4- and an 8-float loop, and a long span
LOG2E = 1.4426950408889634


SPECIALS = np.concatenate([
    np.array([0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754944e-38, 1e-3, -1e-3, 1.0, -1.0, 20.0, -20.0, 88.5, -88.5,
              1e4, -1e4, 1e30, -1e30, 3.4e38, -3.4e38, float("inf"), float("-inf"), float("nan")], dtype=np.float32),
    # -NaN, a NaN with a payload, a signalling one: an input NaN leaves as it came (quietened). As bits: a
    # conversion through float64 would quieten the signalling one.
    np.array([0xFFC00000, 0x7FC12345, 0x7F812345], dtype=np.uint32).view(np.float32)])


def _values() -> np.ndarray:
    """The inputs of every case: odd values first (the short spans see them in their tails), then x
    where t = -beta log2(e) x is at or next to the clamp edges -127, 128 and the exponent edges
    -126, 127 for the betas above, then random normals."""
    edges = []
    for beta in (1.0, 1.702, -1.0):
        for t in (-127.0, -126.0, 127.0, 128.0, -127.5, 127.5):
            x = np.float32(-t / (np.float64(np.float32(beta)) * LOG2E))
            edges += [np.nextafter(x, np.float32(-np.inf)), x, np.nextafter(x, np.float32(np.inf))]
    rng = np.random.default_rng(20240611)
    values = np.concatenate([SPECIALS, np.array(edges, dtype=np.float32),
                             rng.normal(scale=8.0, size=1000).astype(np.float32),
                             rng.normal(scale=60.0, size=200).astype(np.float32)])
    return values[:max(LENGTHS)]


def _grads(n: int) -> np.ndarray:
    grad = np.random.default_rng(11).normal(size=n).astype(np.float32)
    grad[-8:] = [0.0, -0.0, 1.0, -1.0, 1e30, float("inf"), float("-inf"), float("nan")]  # odd grads, in the body only
    return grad


def _cases() -> list[tuple[float, np.ndarray, np.ndarray]]:
    x, grad = _values(), _grads(max(LENGTHS))
    return [(beta, x[:n], grad[:n]) for beta in BETAS for n in LENGTHS]


def _write_cases(path: Path, cases) -> None:
    with path.open("wb") as f:
        for beta, x, grad in cases:
            f.write(np.float32(beta).tobytes() + np.int64(len(x)).tobytes() + x.tobytes() + grad.tobytes())


def _run(command: list[str], cases_file: Path, out: Path, cap: str | None, cases) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MYOPS_CPU_ISA"}
    if cap is not None:
        env["MYOPS_CPU_ISA"] = cap
    done = subprocess.run([*command, str(cases_file), str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, f"{command} exited {done.returncode}: {done.stderr[-3000:]}"
    raw, at, results = np.fromfile(out, dtype=np.float32), 0, []
    for _, x, _ in cases:
        n = len(x)
        results.append((raw[at:at + n], raw[at + n:at + 2 * n]))
        at += 2 * n
    assert at == raw.size
    isa = done.stdout.strip().removeprefix("isa=")
    return {"isa": isa, "stderr": done.stderr, "results": results}


@pytest.fixture(scope="module")
def toolchain() -> tuple[str, str]:
    missing = [tool for tool in (CROSS, QEMU) if shutil.which(tool) is None]
    if missing:
        reason = f"{' and '.join(missing)} not found: the NEON path cannot be built and run on this host"
        if os.environ.get("MYOPS_REQUIRE_ARM64") == "1":
            pytest.fail(reason + "; MYOPS_REQUIRE_ARM64=1 says it must: apt-get install g++-aarch64-linux-gnu "
                        "qemu-user-static")
        pytest.skip(reason)
    return shutil.which(CROSS), shutil.which(QEMU)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("neon")
    cases = _cases()
    _write_cases(root / "cases.bin", cases)
    return root, cases


@pytest.fixture(scope="module")
def arm(toolchain, work) -> list[str]:
    cross, qemu = toolchain
    root, _ = work
    binary = root / "driver-aarch64"
    subprocess.run([cross, *FLAGS, "-static", str(DRIVER), "-o", str(binary)], check=True, timeout=600)
    return [qemu, str(binary)]


@pytest.fixture(scope="module")
def native(work) -> list[str]:
    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("g++") is None:
        pytest.skip("the x86 vector paths to compare with need an x86-64 host with g++")
    root, _ = work
    binary = root / "driver-native"
    subprocess.run(["g++", *FLAGS, str(DRIVER), "-o", str(binary)], check=True, timeout=600)
    return [str(binary)]


@pytest.fixture(scope="module")
def neon(arm, work) -> dict:
    root, cases = work
    return _run(arm, root / "cases.bin", root / "neon.bin", None, cases)


@pytest.fixture(scope="module")
def arm_baseline(arm, work) -> dict:
    root, cases = work
    return _run(arm, root / "cases.bin", root / "arm-baseline.bin", "baseline", cases)


@pytest.fixture(scope="module")
def avx2(native, work) -> dict:
    root, cases = work
    run = _run(native, root / "cases.bin", root / "avx2.bin", "avx2", cases)
    if run["isa"] != "avx2":
        pytest.skip(f"this x86-64 host has no AVX2 + FMA path (MYOPS_CPU_ISA=avx2 gave {run['isa']})")
    return run


def _first_difference(a: np.ndarray, b: np.ndarray, x: np.ndarray, grad: np.ndarray) -> str:
    i = int(np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))[0])
    return (f"{np.count_nonzero(a.view(np.uint32) != b.view(np.uint32))} differ, first at {i}: x={x[i]!r} "
            f"(0x{x[i:i + 1].view(np.uint32)[0]:08x}) grad={grad[i]!r}: 0x{a[i:i + 1].view(np.uint32)[0]:08x} "
            f"!= 0x{b[i:i + 1].view(np.uint32)[0]:08x}")


def _derivative64(x: np.ndarray, grad: np.ndarray, beta: float) -> np.ndarray:
    b = np.float64(np.float32(beta))
    with np.errstate(over="ignore", invalid="ignore"):
        x64 = x.astype(np.float64)
        s = 1.0 / (1.0 + np.exp(-(b * x64)))
        return grad.astype(np.float64) * (s + b * x64 * s * (1.0 - s))


def _check_reference(run: dict, cases) -> None:
    for (beta, x, grad), (y, dx) in zip(cases, run["results"]):
        with np.errstate(invalid="ignore"):  # the signalling NaN, widened to float64
            problem = reference_mismatch(y, x, beta)
        assert problem is None, f"forward, beta {beta}, n {len(x)}: {problem}"
        ref = _derivative64(x, grad, beta)
        finite = np.isfinite(x) & np.isfinite(grad) & np.isfinite(ref)
        np.testing.assert_allclose(dx[finite], ref[finite], rtol=RTOL, atol=ATOL,
                                   err_msg=f"backward, beta {beta}, n {len(x)}")


# ------------------------------------------------------------------ (a) the AVX2 path's bits


@pytest.mark.parametrize("beta", [b for b in BETAS if b != 3e38])
def test_neon_gives_the_avx2_bits(neon, avx2, work, beta):
    _, cases = work
    assert neon["isa"] == "neon"
    for (b, x, grad), (y, dx), (y86, dx86) in zip(cases, neon["results"], avx2["results"]):
        if np.float32(b).tobytes() != np.float32(beta).tobytes():
            continue
        assert same_bits(y, y86), f"forward, beta {beta}, n {len(x)}: " + _first_difference(y, y86, x, grad)
        # Where two NaNs meet in one instruction, x86 returns the first operand's and aarch64 too, unless
        # the other is signalling; and GCC orders the operands of a product as it likes (differently
        # in the AVX2 loop and in its tail, and in the two vectors of the NEON loop). Forward ends
        # in x / d, which keeps x first; backward's bits hold wherever at most one of x, grad and beta
        # is NaN, NaN-ness elsewhere. With a NaN beta the AVX2 tail puts beta first in its last
        # vfmadd and the loop last: bits hold for the 8-float loop's elements.
        loose = (np.isnan(x).astype(int) + np.isnan(grad) + np.isnan(beta)) >= 2
        if np.isnan(beta):
            loose[len(x) - len(x) % 8:] = True
        assert np.array_equal(np.isnan(dx[loose]), np.isnan(dx86[loose])), f"backward, beta {beta}, n {len(x)}"
        exact = ~loose
        assert same_bits(dx[exact], dx86[exact]), \
            f"backward, beta {beta}, n {len(x)}: " + _first_difference(dx[exact], dx86[exact], x[exact], grad[exact])


def test_a_beta_whose_factor_overflows_takes_each_machines_scalar_code(neon, arm_baseline, avx2, work):
    # beta = 3e38: both vector paths hand the span to the baseline. The two machines' baselines differ
    # in their last bits (GCC fuses multiply-adds on aarch64, x86-64 has no FMA) and in the sign of a
    # NaN made from non-NaN operands, so there: NEON == aarch64 baseline, bit for bit, and the same
    # NaN positions and values within float32 rounding of the x86 run.
    _, cases = work
    for (beta, x, grad), (y, dx), (yb, dxb), (y86, dx86) in zip(cases, neon["results"], arm_baseline["results"],
                                                                 avx2["results"]):
        if beta != 3e38:
            continue
        assert same_bits(y, yb) and same_bits(dx, dxb), f"n {len(x)}"
        np.testing.assert_allclose(y, y86, rtol=1e-6, atol=0, equal_nan=True, err_msg=f"forward, n {len(x)}")
        np.testing.assert_allclose(dx, dx86, rtol=1e-6, atol=1e-30, equal_nan=True, err_msg=f"backward, n {len(x)}")


def test_every_tail_takes_the_vector_code(neon, work):
    # A span of n < 1000 holds the first n inputs of the 1000-long one: the same bits, wherever an
    # element falls (body, 4-float block or padded tail).
    _, cases = work
    long = {np.float32(beta).tobytes(): out for (beta, x, _), out in zip(cases, neon["results"]) if len(x) == 1000}
    for (beta, x, _), (y, dx) in zip(cases, neon["results"]):
        y_long, dx_long = long[np.float32(beta).tobytes()]
        n = len(x)
        assert same_bits(y, y_long[:n]) and same_bits(dx, dx_long[:n]), f"beta {beta}, n {n}"


# ------------------------------------------------------------------ (b) the float64 reference


def test_neon_matches_float64(neon, work):
    _, cases = work
    assert neon["isa"] == "neon"
    _check_reference(neon, cases)


# ------------------------------------------------------------------ (c) which path aarch64 takes


def test_aarch64_takes_neon_unless_capped(neon, arm_baseline, arm, work):
    root, cases = work
    assert neon["isa"] == "neon" and "MYOPS_CPU_ISA" not in neon["stderr"]
    assert arm_baseline["isa"] == "baseline"
    assert "[myops] MYOPS_CPU_ISA=baseline: the CPU path is baseline" in arm_baseline["stderr"]
    _check_reference(arm_baseline, cases)
    # The cap really switched: the scalar exp's polynomial is not the vector paths' 2^t.
    assert not all(same_bits(a[0], b[0]) for a, b in zip(neon["results"], arm_baseline["results"]))
    # neon names this path; an x86 path's name caps nothing on aarch64 (as neon caps nothing on x86).
    for cap in ("neon", "avx2", "avx512"):
        run = _run(arm, root / "cases.bin", root / f"arm-{cap}.bin", cap, cases)
        assert run["isa"] == "neon" and f"[myops] MYOPS_CPU_ISA={cap}: the CPU path is neon" in run["stderr"]
        assert all(same_bits(a[0], b[0]) and same_bits(a[1], b[1]) for a, b in zip(neon["results"], run["results"]))


def test_neon_caps_nothing_on_x86(native, work):
    root, cases = work
    free = _run(native, root / "cases.bin", root / "x86.bin", None, cases)
    run = _run(native, root / "cases.bin", root / "x86-neon.bin", "neon", cases)
    assert run["isa"] == free["isa"] != "neon"
    assert f"[myops] MYOPS_CPU_ISA=neon: the CPU path is {free['isa']}" in run["stderr"]
