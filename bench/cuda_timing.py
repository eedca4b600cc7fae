"""Timing PyTorch calls on a CUDA stream: what a caller sees per call, and what the GPU spends.

A small kernel finishes long before Python has dispatched the next call (the activation on
8x512x768 fp32 is ~5 us of DRAM traffic on an H200; torch.ops plus autograd cost 10-50 us), so an
event pair around one call on an idle stream measures the dispatch, not the kernel. The device time
comes from a batch of calls queued while the stream is held busy by a spin kernel
(torch.cuda._sleep): the batch then runs back to back, and one event pair around it over the
batch size is the GPU's time per call. If the spin ends before the host has queued the whole
batch, the GPU waited for launches and the batch is measured again with a longer spin.

Two modes, as nvbench and triton's do_bench measure: warm (batches back to back, the data of one
call left in L2 for the next: what a kernel gets inside a model whose tensors fit in L2) and cold
(before each single call, a buffer twice the L2's size is written, so that the call reads and
writes DRAM). Either takes samples until they are quiet: nvbench's stopping rule.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

PER_CALL_METHOD = "per call: a CUDA event pair around each call on an idle stream (dispatch and launch included)"
DEVICE_METHOD = ("device: {calls} calls queued behind a spin kernel, one CUDA event pair around them, "
                 "median over {batches} batches / {calls}")
COLD_METHOD = ("cold: one call queued behind a spin kernel and a write of {flush_mib} MiB (twice the L2) that "
               "evicts its data, one CUDA event pair around the call, median over {samples} calls")
# nvbench's stopping rule (NVIDIA/nvbench docs/cli_help.md): samples until their relative standard
# deviation is at most 0.5 % (--max-noise 0.5), at least 10 of them (--min-samples), for 15 s of wall
# time at most (--timeout). Its --min-time (0.5 s of GPU time per measurement) is left out.
MAX_NOISE = 0.005
MIN_SAMPLES = 10
TIME_CAP_S = 15.0
# GPU clocks to size a spin; a GPU boosting above this spins for less, and a spin that ends before
# the batch is queued is retried longer.
SPIN_CYCLES_PER_S = 2.0e9
MAX_SPIN_TRIES = 4


class LaunchBound(RuntimeError):
    """The GPU ran out of queued work before the batch was launched: no device time could be taken."""


@dataclass(frozen=True)
class Stopping:
    """When to stop sampling: noise at most max_noise after min_samples, or time_cap_s of wall time."""
    max_noise: float = MAX_NOISE  # math.inf: exactly min_samples samples
    min_samples: int = MIN_SAMPLES
    time_cap_s: float = TIME_CAP_S

    def describe(self) -> str:
        return (f"until the relative noise is at most {self.max_noise * 100:g} % (at least {self.min_samples} "
                f"samples, at most {self.time_cap_s:g} s)")




@dataclass
class DeviceTime:
    ms: float          # median per call
    noise: float       # relative standard deviation of the samples
    samples: int
    quiet: bool        # the noise came under the limit before the time cap
    method: str


def relative_noise(samples: list[float]) -> float:
    """Standard deviation over mean: nvbench's noise. Infinite below two samples."""
    if len(samples) < 2 or statistics.fmean(samples) <= 0:
        return math.inf
    return statistics.stdev(samples) / statistics.fmean(samples)


def sample_until_quiet(take, stopping: Stopping) -> tuple[list[float], bool]:
    """Samples of take() until the stopping rule says so; whether their noise came under its limit."""
    began = time.perf_counter()
    samples: list[float] = []
    while True:
        samples.append(take())
        if len(samples) >= stopping.min_samples:
            if math.isinf(stopping.max_noise):  # a fixed count
                return samples, False
            if relative_noise(samples) <= stopping.max_noise:
                return samples, True
        if time.perf_counter() - began >= stopping.time_cap_s:
            return samples, False


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


def device_time(call, calls: int = 20, stopping: Stopping = Stopping()) -> DeviceTime:
    """GPU milliseconds per call of `call`, warm: batches of `calls` queued behind a spin kernel (see
    the module's docstring), sampled by the stopping rule. Raises LaunchBound when even the longest
    spin could not keep the host ahead."""
    import torch

    if calls > MAX_QUEUED_CALLS:
        raise ValueError(f"{calls} calls in one batch could overflow CUDA's launch queue (at most {MAX_QUEUED_CALLS})")
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        call()
    host_s = time.perf_counter() - began  # how long queuing a batch takes, to size the spin
    torch.cuda.synchronize()
    state = {"spin_s": 2 * host_s + 1e-4, "unproven": False}

    def batch() -> float:
        for _ in range(MAX_SPIN_TRIES):
            ms, ahead, queued_s = queued_batch_ms([call] * calls, state["spin_s"])
            if ahead is not False:
                state["unproven"] |= ahead is None
                return ms / calls
            state["spin_s"] = max(2 * state["spin_s"], 2 * queued_s)
        raise LaunchBound(f"the host could not queue {calls} calls within a {state['spin_s'] * 1e3:.1f} ms spin")

    samples, quiet = sample_until_quiet(batch, stopping)
    method = DEVICE_METHOD.format(calls=calls, batches=len(samples) if math.isinf(stopping.max_noise) else
                                  f"{len(samples)} ({stopping.describe()})")
    if state["unproven"]:
        method += " (no spin kernel in this torch: launch gaps may be included)"
    return DeviceTime(statistics.median(samples), relative_noise(samples), len(samples), quiet, method)


def l2_flush(l2_bytes: int | None = None):
    """A callable that writes a buffer twice the GPU's L2 (torch's L2_cache_size; 64 MiB if it does not
    say) on the current stream, and the buffer's size in bytes."""
    import torch

    if l2_bytes is None:
        l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 << 20
    buffer = torch.empty(2 * l2_bytes, dtype=torch.uint8, device="cuda")
    return buffer.zero_, 2 * l2_bytes


def cold_device_time(call, flush, flush_bytes: int, stopping: Stopping = Stopping()) -> DeviceTime:
    """GPU milliseconds of one call whose data is not in L2: per sample, a spin, the flush, then the
    call between an event pair, all queued before the GPU starts, sampled by the stopping rule."""
    import torch

    call()
    torch.cuda.synchronize()
    state = {"spin_s": 1e-3}

    def one() -> float:
        for _ in range(MAX_SPIN_TRIES):
            spun = _spin(state["spin_s"])
            began = time.perf_counter()
            flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            ahead = not spun or not start.query()
            end.record()
            end.synchronize()
            if ahead:
                return start.elapsed_time(end)
            state["spin_s"] = max(2 * state["spin_s"], 2 * (time.perf_counter() - began))
        raise LaunchBound(f"the host could not queue the flush and one call within a {state['spin_s'] * 1e3:.1f} ms spin")

    samples, quiet = sample_until_quiet(one, stopping)
    method = COLD_METHOD.format(flush_mib=round(flush_bytes / 2**20), samples=f"{len(samples)} ({stopping.describe()})")
    return DeviceTime(statistics.median(samples), relative_noise(samples), len(samples), quiet, method)


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
