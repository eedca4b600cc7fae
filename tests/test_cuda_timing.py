"""Device-time measurement (bench.cuda_timing), on the host clock: no GPU is needed to check its logic.

conftest.HostClockStream stands in for the stream: calls run on the host, a spin marks the stream
busy for a while, and an event recorded meanwhile stays pending, as one queued behind a spin would.
"""
from __future__ import annotations

import time

import pytest

from bench import cuda_timing


def _sleeper(ms: float):
    def call():
        time.sleep(ms / 1e3)
    return call


def test_device_time_of_a_batch_queued_behind_the_spin(host_clock_cuda):
    ms, method = cuda_timing.device_ms(_sleeper(2), calls=5, batches=3)
    assert 1.9 < ms < 6, ms
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

    ms, _ = cuda_timing.device_ms(slowing, calls=5, batches=1)
    assert len(spins) >= 2 and spins[-1] > spins[0], spins
    assert ms > 2.5


def test_launch_bound_when_no_spin_keeps_ahead(host_clock_cuda):
    host_clock_cuda.cycles_per_s = 1e15  # every spin ends at once: the host can never get ahead
    with pytest.raises(cuda_timing.LaunchBound, match="could not queue 5 calls"):
        cuda_timing.device_ms(_sleeper(0.2), calls=5, batches=1)


def test_without_a_spin_kernel_the_method_says_so(host_clock_cuda, monkeypatch):
    import torch

    monkeypatch.delattr(torch.cuda, "_sleep")
    _, method = cuda_timing.device_ms(_sleeper(0.2), calls=3, batches=2)
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
