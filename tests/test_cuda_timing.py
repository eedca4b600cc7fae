"""Device-time measurement (bench.cuda_timing), on the host clock: no GPU is needed to check its logic.

conftest.HostClockStream stands in for the stream: calls run on the host, a spin marks the stream
busy for a while, and an event recorded meanwhile stays pending, as one queued behind a spin would.
"""
from __future__ import annotations

import math
import re
import time

import pytest

from bench import cuda_timing


def exactly(count: int) -> cuda_timing.Stopping:
    return cuda_timing.Stopping(max_noise=math.inf, min_samples=count, time_cap_s=math.inf)


def _sleeper(ms: float):
    def call():
        time.sleep(ms / 1e3)
    return call


def test_device_time_of_a_batch_queued_behind_the_spin(host_clock_cuda):
    measured = cuda_timing.device_time(_sleeper(2), calls=5, stopping=exactly(3))
    ms, method = measured.ms, measured.method
    assert 1.9 < ms < 6 and measured.samples == 3, ms
    assert method.startswith("device: 5 calls queued behind a spin kernel") and "median over 3 batches" in method


def test_a_spin_that_ends_too_early_is_retried_longer(host_clock_cuda, monkeypatch):
    """The spin is sized from a first, fast batch; when calls then get slower, the host falls behind
    the spin: the batch is measured again behind a longer spin, not reported with launch gaps."""
    spins = []
    real_spin = cuda_timing._spin
    monkeypatch.setattr(cuda_timing, "_spin", lambda s: spins.append(s) or real_spin(s))
    slow = {"ms": 0.1}

    def call():
        time.sleep(slow["ms"] / 1e3)

    calls = iter(range(10**6))

    def slowing():
        if next(calls) == 5:  # after the sizing batch of 5
            slow["ms"] = 3
        call()

    ms = cuda_timing.device_time(slowing, calls=5, stopping=exactly(1)).ms
    assert len(spins) >= 2 and spins[-1] > spins[0], spins
    assert ms > 2.5


def test_launch_bound_when_no_spin_keeps_ahead(host_clock_cuda):
    host_clock_cuda.cycles_per_s = 1e15  # every spin ends at once: the host can never get ahead
    with pytest.raises(cuda_timing.LaunchBound, match="could not queue 5 calls"):
        cuda_timing.device_time(_sleeper(0.2), calls=5, stopping=exactly(1))


def test_without_a_spin_kernel_the_method_says_so(host_clock_cuda, monkeypatch):
    import torch

    monkeypatch.delattr(torch.cuda, "_sleep")
    method = cuda_timing.device_time(_sleeper(0.2), calls=3, stopping=exactly(2)).method
    assert "launch gaps may be included" in method


def test_paired_device_ratio_alternates_and_takes_the_median(host_clock_cuda):
    order = []

    def fast():
        order.append("f")
        time.sleep(0.002)

    def slow():
        order.append("s")
        time.sleep(0.004)

    ratio = cuda_timing.paired_device_ratio(fast, slow, pairs=4, calls=2)
    assert 1.5 < ratio < 2.6, ratio
    timed = "".join(order[-16:])  # the four pairs: fast first, then slow first, alternating
    assert timed == "ffss" "ssff" "ffss" "ssff"


def test_the_stopping_rule_stops_once_the_samples_are_quiet():
    values = iter([10.0, 11.0, 10.0, 10.0, 10.0])
    rule = cuda_timing.Stopping(max_noise=0.05, min_samples=3, time_cap_s=60)
    samples, quiet = cuda_timing.sample_until_quiet(lambda: next(values), rule)
    # After 3 samples the noise is 5.6 %; a fourth brings it to 4.9 %, under the limit: stop there.
    assert quiet and samples == [10.0, 11.0, 10.0, 10.0]
    assert cuda_timing.relative_noise(samples) <= 0.05 < cuda_timing.relative_noise(samples[:-1])


def test_the_time_cap_ends_a_noisy_measurement():
    flip = iter(range(10**6))

    def noisy():
        time.sleep(0.005)
        return 1.0 if next(flip) % 2 else 2.0

    began = time.perf_counter()
    samples, quiet = cuda_timing.sample_until_quiet(noisy, cuda_timing.Stopping(max_noise=0.005, min_samples=3,
                                                                                time_cap_s=0.1))
    assert not quiet and 0.1 <= time.perf_counter() - began < 1.0 and len(samples) >= 3
    assert cuda_timing.relative_noise(samples) > 0.3


def test_a_fixed_count_takes_exactly_that_many():
    samples, quiet = cuda_timing.sample_until_quiet(lambda: 1.0, exactly(7))
    assert len(samples) == 7 and not quiet


def test_warm_device_time_reports_its_noise(host_clock_cuda):
    measured = cuda_timing.device_time(_sleeper(1), calls=3,
                                       stopping=cuda_timing.Stopping(max_noise=0.5, min_samples=4, time_cap_s=5))
    assert measured.quiet and measured.samples >= 4 and 0 <= measured.noise <= 0.5
    assert 0.9 < measured.ms < 4 and "until the relative noise is at most 50 %" in measured.method


def test_cold_device_time_flushes_before_every_call_and_times_the_call_alone(host_clock_cuda):
    """The flush runs behind the spin before the start event: its time is not the call's."""
    order = []

    def flush():
        order.append("F")
        time.sleep(0.006)

    def call():
        order.append("c")
        time.sleep(0.002)

    rule = cuda_timing.Stopping(max_noise=10, min_samples=5, time_cap_s=30)
    measured = cuda_timing.cold_device_time(call, flush, 64 << 20, rule)
    # One warm-up call, then a flush before each call (a spin too short for the flush is retried longer).
    assert re.fullmatch(r"c(Fc)+", "".join(order)) and order.count("F") >= measured.samples
    assert measured.samples == 5 and 1.9 < measured.ms < 5.5, measured
    assert measured.method.startswith("cold: one call queued behind a spin kernel and a write of 64 MiB")


def test_peak_dram_bandwidth_from_nvmls_figures():
    from infer.nvml import peak_dram_bytes_per_s

    # An H200: NVML's top memory clock 3201 MHz and a 6144-bit bus give 4.9 TB/s (NVIDIA states 4.8).
    assert peak_dram_bytes_per_s(3201, 6144) == pytest.approx(4.917e12, rel=1e-3)


def test_derive_gives_the_fraction_of_peak_bandwidth():
    from infer.rows import derive

    rows = [{"workload": "swish_large", "row": "torch_copy", "execution_provider": "torch-cuda", "opset": None,
             "dtype": "float32", "bytes_moved": 2 * 10**9, "device_ms": 500.0, "p50_ms": 600.0, "threads": None}]
    derive(rows, {"L2": 50 << 20}, peak_bytes_per_s=5e9)
    assert rows[0]["gb_per_s"] == 4.0 and rows[0]["fraction_of_peak"] == 0.8
    derive(rows, {"L2": 50 << 20})
    assert rows[0]["fraction_of_peak"] is None
