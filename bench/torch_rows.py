"""The PyTorch rows of the benchmark: what infer.measure's measure() times for them.

    python -m bench.torch_rows '{"row": "torch_extension", "workload": "swish", ...}'

The timing loop, memory baseline and result format are infer.measure's, shared with the ONNX
Runtime rows; this module adds the callables (the fused op, its composite, the native PyTorch
function, torch.compile, copies), their memory probe and profiler trace, and measure_cuda for
bench.gpu_check.
"""
from __future__ import annotations

import json
import math
import os
import sys

from infer.measure import main as measure_main
from infer.workloads import WORKLOADS, percentiles_ms


def native_applies(op: str, beta: float) -> bool:
    """Whether PyTorch's own function is the op with these attributes on this torch (F.silu is Swish
    at beta 1 only; F.rms_norm came with torch 2.4): the op's declaration says."""
    from ops.registry import OPS

    declared = OPS[op]
    return declared.native is not None and declared.native_applies(declared.attributes(beta=beta))


def _torch_functions(op_name: str):
    """Per row: the function the model calls in place of the fused op, and what the row's graph column says."""
    from ops.registry import OPS

    op = OPS[op_name]
    functions = {"torch_composite": (op.reference, op.reference_text),
                 "torch_extension": (op.function, op.torch_name),
                 "torch_compile": (op.reference, f"torch.compile({op.reference_text})")}
    if op.native is not None and op.spec.native_row:
        functions[op.spec.native_row] = (op.native, op.native_text)
    return functions


def row_callable(spec: dict, arrays: tuple):
    """The row's call on the workload's inputs (one array per graph input of its model, x first)."""
    import torch

    torch.set_num_threads(spec["threads"])
    import ops
    from ops.registry import MODEL_OP, OPS

    ops.load()
    tensors = tuple(torch.from_numpy(a) for a in arrays)
    x = tensors[0]
    if spec["row"] == "torch_copy":
        return lambda: x.clone(), "torch.clone"
    if spec["row"] == "torch_copy_into":
        out = torch.empty_like(x)
        return lambda: out.copy_(x), "Tensor.copy_ into a preallocated tensor"
    workload = WORKLOADS[spec["workload"]]
    function, graph = _torch_functions(workload.op)[spec["row"]]
    # From the registry, not ops.export: importing onnx would add ~0.6 s to every row's process.
    model = OPS[MODEL_OP[workload.model_name]].build_model(workload.model_name, hidden=workload.hidden,
                                                           function=function, attributes={"beta": spec["beta"]})
    if spec["row"] == "torch_compile":
        model = torch.compile(model)

    def call():
        with torch.inference_mode():
            return model(*tensors)

    return call, graph


def trace(call, prefix: str, calls: int = 10) -> str:
    """A torch profiler chrome trace of a few calls, after the timed runs (so timing is unaffected)."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for _ in range(calls):
            call()
    path = f"{prefix}.torch.json"
    profiler.export_chrome_trace(path)
    return path


def peak_mb(spec: dict) -> float:
    """A PyTorch row's memory, measured in a process of its own with every large block mmapped.

    Not in the timing process: mmapping each tensor would add page faults to every timed call.
    """
    import subprocess

    probe = dict(spec, memory_probe=True, warmup=0, runs=3, profile_prefix=None)
    result = subprocess.run([sys.executable, "-m", "bench.torch_rows", json.dumps(probe)], capture_output=True, text=True,
                            timeout=600, env=dict(os.environ, OMP_NUM_THREADS=str(spec["threads"])))
    if result.returncode != 0:
        raise RuntimeError(f"memory probe of {spec['row']} failed: {result.stderr.strip()[-1500:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_mb"]


MEMORY_METHOD = ("peak RSS above baseline (VmHWM reset) in a separate process, after one untimed call, "
                 "tensors mmapped: live bytes only")


# ---------------------------------------------------------------- CUDA (used by bench.gpu_check)

CUDA_MEMORY_METHOD = "torch.cuda.max_memory_allocated above memory_allocated at the row's start (peak reset per row)"


def measure_cuda(call, warmup: int, runs: int, stopping=None, flush=None) -> dict:
    """Time `call` on the current CUDA stream (bench.cuda_timing): per call, an event pair around each
    run read after one sync (what a caller waits for, dispatch included); the warm device time per
    call, from batches queued behind a spin kernel; and, given `flush` (cuda_timing.l2_flush()), the
    cold device time of one call after L2 was flushed. Both device times sample by `stopping`
    (nvbench's rule by default) and report their noise.

    Peak memory is the caching allocator's high-water mark above what was allocated when the row
    started (inputs and saved tensors).
    """
    import torch

    from .cuda_timing import PER_CALL_METHOD, LaunchBound, Stopping, cold_device_time, device_time

    stopping = stopping or Stopping()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, end in events:
        start.record()
        call()
        end.record()
        end.synchronize()  # each call starts on an idle stream, as a caller's next call would
    seconds = [start.elapsed_time(end) * 1e-3 for start, end in events]  # elapsed_time is in ms
    peak = torch.cuda.max_memory_allocated() - baseline
    figures = {"device_ms": None, "device_noise": None, "device_cold_ms": None, "device_cold_noise": None}
    methods = []

    def noise_of(measured) -> float | None:  # below two samples there is no noise to report
        return round(measured.noise, 4) if math.isfinite(measured.noise) else None

    def method_of(measured) -> str:
        return measured.method + ("" if measured.quiet else " (stopped at the time cap, noise above the limit)")

    try:
        warm = device_time(call, stopping=stopping)
        figures.update(device_ms=round(warm.ms, 5), device_noise=noise_of(warm))
        methods.append(method_of(warm))
    except LaunchBound as exc:
        methods.append(f"device: none ({exc})")
    if flush is not None:
        try:
            cold = cold_device_time(call, *flush, stopping=stopping)
            figures.update(device_cold_ms=round(cold.ms, 5), device_cold_noise=noise_of(cold))
            methods.append(method_of(cold))
        except LaunchBound as exc:
            methods.append(f"cold: none ({exc})")
    return {**percentiles_ms(seconds), **figures, "timing_method": "; ".join([PER_CALL_METHOD, *methods]),
            "peak_mb": round(max(peak, 0) / 2**20, 2), "memory_method": CUDA_MEMORY_METHOD}


if __name__ == "__main__":
    raise SystemExit(measure_main(sys.argv[1:], torch_rows=sys.modules[__name__]))
