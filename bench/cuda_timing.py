"""Timing PyTorch calls on a CUDA stream: what a caller sees per call, and what the GPU spends.

A small kernel finishes long before Python has dispatched the next call (the activation on
8x512x768 fp32 is ~5 us of DRAM traffic on an H200; torch.ops plus autograd cost 10-50 us), so an
event pair around one call on an idle stream measures the dispatch, not the kernel. The device time
comes from a batch of calls queued while the stream is held busy by a spin kernel
(torch.cuda._sleep): the batch then runs back to back, and one event pair around it over the
batch size is the GPU's time per call. If the spin ends before the host has queued the whole
batch, the GPU waited for launches and the batch is measured again with a longer spin.
"""
from __future__ import annotations

import statistics
import time

PER_CALL_METHOD = "per call: a CUDA event pair around each call on an idle stream (dispatch and launch included)"
DEVICE_METHOD = ("device: {calls} calls queued behind a spin kernel, one CUDA event pair around them, "
                 "median over {batches} batches / {calls}")
# GPU clocks to size a spin; a GPU boosting above this spins for less, and a spin that ends before
# the batch is queued is retried longer.
SPIN_CYCLES_PER_S = 2.0e9
MAX_SPIN_TRIES = 4


class LaunchBound(RuntimeError):
    """The GPU ran out of queued work before the batch was launched: no device time could be taken."""


def _spin(seconds: float) -> bool:
    """Hold the current stream busy for about `seconds`; False where this torch has no spin kernel."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return False
    sleep(int(seconds * SPIN_CYCLES_PER_S))
    return True


def queued_batch_ms(calls: list, spin_s: float) -> tuple[float, bool | None, float]:
    """GPU milliseconds of `calls` run back to back; whether the host kept ahead of the GPU (None:
    this torch has no spin kernel, so it cannot be known); and the host's seconds to queue them.

    The start event is recorded after the spin; it must still be pending once every call has been
    queued, or the calls did not run back to back.
    """
    import torch

    spun = _spin(spin_s)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began = time.perf_counter()
    start.record()
    for call in calls:
        call()
    ahead = (not start.query()) if spun else None
    queued_s = time.perf_counter() - began
    end.record()
    end.synchronize()
    return start.elapsed_time(end), ahead, queued_s


MAX_QUEUED_CALLS = 64  # CUDA's launch queue holds about a thousand launches; a call may launch several


def device_ms(call, calls: int = 20, batches: int = 10) -> tuple[float, str]:
    """Median GPU milliseconds per call of `call` (see the module's docstring), and the method used.

    Raises LaunchBound when even the longest spin could not keep the host ahead.
    """
    import torch

    if calls > MAX_QUEUED_CALLS:
        raise ValueError(f"{calls} calls in one batch could overflow CUDA's launch queue (at most {MAX_QUEUED_CALLS})")
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        call()
    host_s = time.perf_counter() - began  # how long queuing a batch takes, to size the spin
    torch.cuda.synchronize()
    spin_s = 2 * host_s + 1e-4
    per_call, unproven = [], False
    while len(per_call) < batches:
        for _ in range(MAX_SPIN_TRIES):
            ms, ahead, queued_s = queued_batch_ms([call] * calls, spin_s)
            if ahead is not False:
                unproven |= ahead is None
                break
            spin_s = max(2 * spin_s, 2 * queued_s)
        else:
            raise LaunchBound(f"the host could not queue {calls} calls within a {spin_s * 1e3:.1f} ms spin")
        per_call.append(ms / calls)
    method = DEVICE_METHOD.format(calls=calls, batches=batches)
    if unproven:
        method += " (no spin kernel in this torch: launch gaps may be included)"
    return statistics.median(per_call), method


def paired_device_ratio(fast, slow, pairs: int, calls: int = 10) -> float:
    """Median over pairs of device time(slow) / device time(fast), both batches queued behind one spin.

    The order alternates between pairs, so that neither side always runs first.
    """
    import torch

    for function in (fast, slow):
        function()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fast()
        slow()
    spin_s = 2 * (time.perf_counter() - began) + 1e-4
    torch.cuda.synchronize()
    ratios = []
    for i in range(pairs):
        first, second = (fast, slow) if i % 2 == 0 else (slow, fast)
        for _ in range(MAX_SPIN_TRIES):
            spun = _spin(spin_s)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            began = time.perf_counter()
            events[0].record()
            for _ in range(calls):
                first()
            events[1].record()
            for _ in range(calls):
                second()
            ahead = not spun or not events[0].query()
            events[2].record()
            events[2].synchronize()
            if ahead:
                break
            spin_s = max(2 * spin_s, 2 * (time.perf_counter() - began))
        else:
            raise LaunchBound(f"the host could not queue 2 x {calls} calls within a {spin_s * 1e3:.1f} ms spin")
        t_first, t_second = events[0].elapsed_time(events[1]), events[1].elapsed_time(events[2])
        t_fast, t_slow = (t_first, t_second) if i % 2 == 0 else (t_second, t_first)
        ratios.append(t_slow / max(t_fast, 1e-9))
    return statistics.median(ratios)
