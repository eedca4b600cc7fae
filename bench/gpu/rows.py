"""The GPU rows for results/<entry>/bench.csv: the copy, the composite, the extension and PyTorch's own
function with their backwards, per op as opspec/<op>.py declares, per call (an event pair around each
call) and device time (batches queued behind a spin kernel, bench.cuda_timing)."""
from __future__ import annotations

import time
from pathlib import Path

from .host import Setup
from .stages import Run, log

PROVIDER = "torch-cuda"
# Where the rows run; tests set "cpu" to exercise the logic without a GPU.
DEVICE = "cuda"
DTYPES = ("float32", "float16", "bfloat16")


def declared_workloads() -> tuple[tuple[str, tuple[int, int, int]], ...]:
    """Every op-alone workload as opspec/<op>.py declares it, so that these rows and the infer image's
    (which the report joins by workload and dtype) time the same tensors."""
    from infer.workloads import WORKLOADS as DECLARED

    return tuple((name, w.shape) for name, w in DECLARED.items() if w.op_alone)

WORKLOADS = declared_workloads()


def _backward_of(function, x, grad, inputs=None):
    """Maker of a timed backward: the graph is built once, each call runs its backward again."""
    import torch

    def make():
        xg = x.detach().requires_grad_(True)
        leaves = [xg] + [t.detach().requires_grad_(True) for t in (inputs or ())]
        y = function(*leaves)
        if isinstance(y, (tuple, list)):  # several outputs: the same upstream gradient into each
            return lambda: torch.autograd.grad(tuple(y), leaves, (grad,) * len(y), retain_graph=True)
        return lambda: torch.autograd.grad(y, leaves, grad, retain_graph=True)
    return make


def row_plan(x, grad, beta: float, op: str = "swish") -> list[tuple[str, str, float, object]]:
    """(row, what runs, tensors of x's size moved per call, maker of the timed call) for one input,
    from the op's declaration (opspec/<op>.py): the copy, the composite, the extension and PyTorch's
    own function where it applies, then their backwards. A gated op's other full-shaped inputs are
    random tensors like x; the weights are those the exported models hold (the op's model, seed 0);
    the attributes its defaults, with the run's beta for Swish."""
    import torch

    from ops.registry import OPS

    declared = OPS[op]
    attributes = declared.attributes(beta=beta)
    model = declared.build_model(declared.name, hidden=x.shape[-1], attributes=attributes)
    weights = tuple(getattr(model, name).detach().to(x.device, x.dtype) for name in declared.weights)
    generator = torch.Generator(device=x.device).manual_seed(1)
    others = tuple(torch.randn(x.shape, generator=generator, device=x.device).to(x.dtype)
                   for _ in range(declared.spec.full_inputs - 1))
    constants = tuple(attributes.values())
    per_weight = 1 / (x.numel() // x.shape[-1]) if x.numel() else 0  # a [hidden] weight, in tensors of x's size

    def forward(function):
        return lambda: (lambda: function(x, *others, *weights, *constants))

    def backward(function):
        return _backward_of(lambda t, *w: function(t, *w, *constants), x, grad, others + weights)

    native = declared.native is not None and declared.native_applies(attributes)
    # each full-shaped input read, each output written; backward: each output's grad and each input read,
    # each gradient written
    full, outputs = 1 + len(others), len(declared.spec.outputs)
    moved = full + outputs + len(weights) * per_weight
    moved_back = outputs + 2 * full + 2 * len(weights) * per_weight
    plan = [
        ("torch_copy", "torch.clone", 2, lambda: (lambda: x.clone())),
        ("torch_composite", declared.reference_text, moved, forward(declared.reference)),
        ("torch_extension", declared.torch_name, moved, forward(declared.function)),
    ]
    if native:
        plan.append((declared.spec.native_row, declared.native_text, moved, forward(declared.native)))
    # Backward: read grad, x (and the weights), write dx (and their gradients).
    plan += [
        ("torch_composite_backward", f"autograd of {declared.reference_text}", moved_back, backward(declared.reference)),
        ("torch_extension_backward", f"{declared.torch_name}_backward", moved_back, backward(declared.function)),
    ]
    if native:
        plan.append((f"{declared.spec.native_row}_backward", f"{declared.native_text} backward", moved_back,
                     backward(declared.native)))
    return plan


def bench_inputs(shape, dtype_name: str):
    import torch

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(shape, generator=gen, device=DEVICE).to(getattr(torch, dtype_name))
    grad = torch.randn(shape, generator=gen, device=DEVICE).to(getattr(torch, dtype_name))
    return x, grad


def warm_up_gpu(seconds: float = 0.5) -> None:
    """Clocks up before the first row: copies of 512 MiB until `seconds` have passed."""
    import torch

    buffer = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        for _ in range(20):
            buffer.clone()
        torch.cuda.synchronize()


def make_row(setup: Setup, args, workload: str, shape, dtype_name: str, row: str, graph: str, bytes_moved: int,
             measured: dict) -> dict:
    """A bench.csv row in the format every bench writes (infer.rows.record): this host's facts, the
    row's own shape, dtype and bytes."""
    from infer.rows import record

    spec = dict(workload=workload, row=row, dtype=dtype_name, shape=shape, beta=args.beta, warmup=args.warmup,
                runs=args.runs, threads=None, bytes_moved=bytes_moved)
    facts = dict(setup.facts, gpu=setup.device, driver=setup.driver, extension_sha256=extension_sha256())
    return record(setup.entry, spec, dict(measured, graph=graph, execution_provider=PROVIDER, tf32=torch_tf32()), facts)


def extension_sha256() -> str | None:
    """The sha256 of the extension library this process loaded."""
    import ops

    from infer.rows import file_sha256

    library = getattr(ops, "_loaded_from", None)
    return file_sha256(library) if library and Path(library).is_file() else None


def torch_tf32() -> str:
    """The TF32 setting the torch rows ran with (float32 matmuls; the activation itself has none)."""
    import torch

    return "on" if torch.backends.cuda.matmul.allow_tf32 else "off (torch.backends.cuda.matmul.allow_tf32=False)"


def bench_stage(run: Run, setup: Setup, args) -> list[dict]:
    """Every declared op-alone workload in every dtype; rows the stage's budget leaves out are noted."""
    import torch

    from infer.rows import derive
    from infer.workloads import WORKLOADS as KNOWN_WORKLOADS

    from ..torch_rows import measure_cuda

    warm_up_gpu()
    stopping, flush = stopping_of(args), l2_flush()
    log(f"  device times: warm and cold (L2 flushed by a {flush[1] >> 20} MiB write), sampled "
        f"{stopping.describe()}")
    rows, skipped = [], 0
    for workload, shape in WORKLOADS:
        for dtype_name in DTYPES:
            x, grad = bench_inputs(shape, dtype_name)
            itemsize = x.element_size()
            op = KNOWN_WORKLOADS[workload].op
            for row, graph, tensors, make in row_plan(x, grad, args.beta, op):
                if run.left() <= 0:
                    skipped += 1
                    continue
                try:
                    call = make()
                    measured = measure_cuda(call, args.warmup, args.runs, stopping, flush)
                    del call  # frees a backward row's graph before the next row's peak is measured
                except Exception as exc:  # e.g. out of memory: reported with the rows, not a correctness failure
                    run.notes.append(f"bench: {workload} {dtype_name} {row} failed: {type(exc).__name__}: {exc}")
                    log(f"  {workload:11} {dtype_name:8} {row:24} FAILED: {type(exc).__name__}: {exc}")
                    continue
                rows.append(make_row(setup, args, workload, shape, dtype_name, row, graph,
                                     round(tensors * x.numel() * itemsize), measured))
                log(f"  {workload:13} {dtype_name:8} {row:24} per call p50 {measured['p50_ms']:8.4f} ms, device "
                    f"{_shown(measured['device_ms'], measured['device_noise'])}, cold "
                    f"{_shown(measured['device_cold_ms'], measured['device_cold_noise'])}, "
                    f"peak {measured['peak_mb']:8.1f} MiB")
            del x, grad
            torch.cuda.empty_cache()
    if skipped:
        run.notes.append(f"bench: {skipped} rows skipped, the stage ran out of its budget")
        log(f"  {skipped} rows skipped: out of the stage's budget")
    derive(rows, device_caches(), peak_bandwidth(run))
    return rows


def _shown(ms, noise) -> str:
    """A device time and its noise; a time of too few samples has no noise (None), and says so."""
    if ms is None:
        return "    none"
    return f"{ms:8.4f} ms ({'noise n/a' if noise is None else f'{noise * 100:4.1f} %'})"


def stopping_of(args):
    """The stopping rule of the device times: the run's options, else nvbench's defaults."""
    from ..cuda_timing import MAX_NOISE, MIN_SAMPLES, TIME_CAP_S, Stopping

    return Stopping(getattr(args, "max_noise", MAX_NOISE * 100) / 100, getattr(args, "min_samples", MIN_SAMPLES),
                    getattr(args, "time_cap", TIME_CAP_S))


def l2_flush():
    """(flush, bytes) for the cold device time: on the GPU a write of twice its L2; where tests run the
    rows on the CPU, a small buffer."""
    if DEVICE == "cuda":
        from ..cuda_timing import l2_flush as gpu_flush

        return gpu_flush()
    import torch

    buffer = torch.empty(1 << 20, dtype=torch.uint8)
    return buffer.zero_, buffer.numel()


def peak_bandwidth(run: Run) -> float | None:
    """The GPU's peak DRAM bandwidth from NVML (bytes/s), or None with a note where NVML cannot say."""
    if DEVICE != "cuda":
        return None
    from infer.nvml import DeviceMemory, NvmlUnavailable

    try:
        return DeviceMemory(0).peak_dram_bytes_per_s()
    except NvmlUnavailable as exc:
        run.notes.append(f"bench: no fraction of peak bandwidth: {exc}")
        return None


def device_caches() -> dict[str, int]:
    """The GPU's L2, which all its SMs share: rows that fit in it (8x512x768 on an H100/H200's 50 MB)
    run at L2 bandwidth, above DRAM's. {} where torch does not say (regime "unknown")."""
    import torch

    if DEVICE != "cuda":
        from lab.provenance import cpu_caches

        return cpu_caches()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
    return {"L2": int(l2)} if l2 else {}
