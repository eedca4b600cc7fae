"""bench.gpu_check's targets: paired device-time ratios (bench.cuda_timing) of the rows' calls, the
plugin's CUDA kernel against a copy (the harness), the ORT custom op per call where onnxruntime has a
CUDA EP, and the memory the fused op saves. Missed targets are reported, not failures."""
from __future__ import annotations

import subprocess
from pathlib import Path

from . import rows
from .host import Setup
from .plugin import parse_harness_timing
from .rows import bench_inputs, row_plan
from .stages import Run, log

RMS_NORM_TARGET_WORKLOAD = "rms_norm_4096"
TARGET_WORKLOAD = "swish_large"


# (name, numerator, denominator, limit): holds when the median over pairs of device time(numerator) /
# device time(denominator) <= limit, as every target of the lab (bench.targets) reads. Forward and
# copy move the same bytes: 1/0.9 is 90 % of the copy's bandwidth; 1/1.5 a 1.5x speed-up.
TARGETS = (
    ("fused forward vs copy floor (at least 90 % of copy bandwidth)", "torch_extension", "torch_copy", round(1 / 0.9, 4)),
    ("extension forward vs PyTorch composite (1.5x faster)", "torch_extension", "torch_composite", round(1 / 1.5, 4)),
    ("extension backward vs composite autograd (1.5x faster)", "torch_extension_backward", "torch_composite_backward",
     round(1 / 1.5, 4)),
)


def targets_stage(run: Run, setup: Setup, args) -> list[dict]:
    """Paired ratios of device time (bench.cuda_timing), each pair's two batches behind one spin:
    Swish's TARGETS on the large workload, and every other op's declared targets (opspec/<op>.py) whose
    rows are PyTorch's (RMSNorm: extension vs F.rms_norm) on its target workload."""
    import torch

    from ops.registry import OPS

    from ..cuda_timing import paired_device_ratio
    from ..targets import target_status

    rms_norm_targets = tuple((name, numerator, denominators[0], limit)
                             for name, numerator, denominators, limit in OPS["rms_norm"].targets
                             if numerator.startswith("torch_") and denominators[0].startswith("torch_"))
    plans = (("swish", TARGET_WORKLOAD, TARGETS), ("rms_norm", RMS_NORM_TARGET_WORKLOAD, rms_norm_targets))
    results = []
    for op, workload, targets in plans:
        shape = dict(rows.WORKLOADS)[workload]
        needed = {row for _, numerator, denominator, _ in targets for row in (numerator, denominator)}
        for dtype_name in rows.DTYPES:
            if run.left() <= 0:
                run.notes.append(f"targets: {op} {dtype_name} skipped, the stage ran out of its "
                                 f"budget")
                continue
            x, grad = bench_inputs(shape, dtype_name)
            calls = {row: make() for row, _, _, make in row_plan(x, grad, args.beta, op) if row in needed}
            for name, numerator, denominator, limit in targets:
                if numerator not in calls or denominator not in calls:
                    continue  # F.silu at a beta other than 1, F.rms_norm before torch 2.4
                try:  # paired_device_ratio(a, b) is t(b) / t(a)
                    ratio = paired_device_ratio(calls[denominator], calls[numerator], args.pairs)
                except Exception as exc:  # reported, like a missed target, not a correctness failure
                    run.notes.append(f"targets: {name}, {dtype_name} failed: {type(exc).__name__}: {exc}")
                    continue
                results.append({
                    "entry": setup.entry, "op": op, "target": f"{name}, {dtype_name} {'x'.join(map(str, shape))}",
                    "numerator": numerator, "denominator": denominator, "shape": "x".join(map(str, shape)),
                    "median_ratio": round(ratio, 4), "limit": limit, "holds": ratio <= limit, "pairs": args.pairs,
                    "threads": None, "opset": None, "git_sha": setup.facts.get("git_sha"),
                    "timestamp": setup.facts.get("timestamp"),
                })
                log(f"  {results[-1]['target']:90} {ratio:6.3f}  ({target_status(ratio, limit)})")
            del calls, x, grad
            torch.cuda.empty_cache()
    return results

PLUGIN_COPY_LIMIT = round(1 / 0.9, 4)  # the kernel's time over the copy's: at least 90 % of copy bandwidth


def plugin_kernel_targets(setup: Setup, harness: Path | None, reps: int = 20) -> list[dict]:
    """The plugin's CUDA launch path (the harness) against a device-to-device copy of the same bytes,
    device time, on the large workload: the ORT custom op's floor where no onnxruntime-gpu is here."""
    if harness is None:
        return []
    from ..targets import target_status

    shape = dict(rows.WORKLOADS)[TARGET_WORKLOAD]
    n = 1
    for size in shape:
        n *= size
    results = []
    for code, dtype_name in (("f32", "float32"), ("f16", "float16")):
        ran = subprocess.run([str(harness), "time", code, str(n), str(reps)], capture_output=True, text=True, timeout=120)
        if ran.returncode != 0:
            raise RuntimeError(f"plugin_harness time {code}: {ran.stderr.strip()[-300:]}")
        timing = parse_harness_timing(ran.stdout)
        ratio = timing["forward_ms"] / timing["copy_ms"]
        target = (f"plugin CUDA kernel vs cudaMemcpy D2D (at least 90 % of copy bandwidth, harness), "
                  f"{dtype_name} {'x'.join(map(str, shape))}")
        log(f"  {target:90} {ratio:6.3f}  ({target_status(ratio, PLUGIN_COPY_LIMIT)}; kernel "
            f"{timing['forward_ms']:.4f} ms, copy {timing['copy_ms']:.4f} ms)")
        results.append({"entry": setup.entry, "op": "swish", "target": target, "numerator": "plugin_kernel",
                        "denominator": "cuda_memcpy_d2d", "median_ratio": round(ratio, 4),
                        "limit": PLUGIN_COPY_LIMIT, "holds": ratio <= PLUGIN_COPY_LIMIT, "pairs": reps,
                        "threads": None, "opset": None, "git_sha": setup.facts.get("git_sha"),
                        "timestamp": setup.facts.get("timestamp")})
    return results

ORT_PER_CALL_LIMIT = round(1 / 1.3, 4)  # the custom op's time over the composite's: 1.3x faster

PROVIDER_OF = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


def ort_per_call_target(setup: Setup, args) -> list[dict]:
    """The ORT custom op against the torch composite, per call as each caller sees it (host clock,
    each call ending in a synchronisation), on the small workload where dispatch dominates.

    Needs onnxruntime-gpu here (setup.ort_plugin, which bench.gpu_check sets where the plugin loads on
    onnxruntime's CUDA EP: bench.gpu.plugin.cuda_session_factory); one process, pairs
    alternating, so both sides share the machine's state.
    """
    if setup.ort_plugin is None:
        return []
    import numpy as np
    import onnxruntime as ort
    import torch

    import ops
    from ort_plugin.loader import exact_providers, register
    from ort_plugin.onnx_file import one_node_model

    from ..targets import paired_ratio, target_status

    shape = dict(rows.WORKLOADS)["swish"]
    x, _ = bench_inputs(shape, "float32")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    on_gpu = rows.DEVICE == "cuda"
    if on_gpu:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    register(options, setup.ort_plugin)
    session = ort.InferenceSession(one_node_model("myops", "Swish", element_type="float32"), options,
                                   providers=exact_providers([PROVIDER_OF[rows.DEVICE]], ort.__version__))
    binding = session.io_binding()
    flat = np.ascontiguousarray(x.flatten().cpu().numpy())
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(flat, rows.DEVICE, 0))
    binding.bind_output("y", rows.DEVICE, 0)

    def ort_call():
        binding.synchronize_inputs()
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()

    def torch_call():  # the model's Swish has no beta attribute: 1.0
        ops.reference(x, 1.0)
        torch.cuda.synchronize()

    ratio = paired_ratio(ort_call, torch_call, args.pairs)
    target = f"ORT custom op vs PyTorch composite, per call (host clock), float32 {'x'.join(map(str, shape))}"
    log(f"  {target:90} {ratio:6.3f}  ({target_status(ratio, ORT_PER_CALL_LIMIT)})")
    return [{"entry": setup.entry, "op": "swish", "target": target, "numerator": "ort_custom", "denominator": "torch_composite",
             "median_ratio": round(ratio, 4), "limit": ORT_PER_CALL_LIMIT, "holds": ratio <= ORT_PER_CALL_LIMIT,
             "pairs": args.pairs, "threads": None, "opset": 17, "git_sha": setup.facts.get("git_sha"),
             "timestamp": setup.facts.get("timestamp")}]

MEMORY_UNSAVED_LIMIT = 0.05


def memory_targets(setup: Setup, measured: list[dict]) -> list[dict]:
    """The fused op's peak memory below the composite's by one activation tensor (TARGET_WORKLOAD).

    At its peak the composite holds sigmoid(beta*x) beside its output; the op, only its output. The
    ratio is the fused peak over (the composite's peak less one tensor), as a share of one tensor:
    0 when exactly one tensor is saved; the limit leaves 5 % of a tensor for allocator rounding.
    """
    from ..targets import target_status

    results = []
    for dtype_name in rows.DTYPES:
        peaks = {r["row"]: r for r in measured if r["workload"] == TARGET_WORKLOAD and r["dtype"] == dtype_name}
        if "torch_composite" not in peaks or "torch_extension" not in peaks:
            continue
        tensor_mb = peaks["torch_extension"]["bytes_moved"] / 2 / 2**20  # forward rows move x in and y out
        saved = float(peaks["torch_composite"]["peak_mb"]) - float(peaks["torch_extension"]["peak_mb"])
        ratio = 1 - saved / tensor_mb
        results.append({
            "entry": setup.entry, "op": "swish", "target": f"fused peak memory not saved against the composite's, in activation "
            f"tensors (0: one tensor saved), {dtype_name} {peaks['torch_extension']['shape']}",
            "numerator": "torch_extension peak - (torch_composite peak - one tensor)",
            "denominator": f"one tensor ({tensor_mb:.1f} MiB)", "median_ratio": round(ratio, 4),
            "limit": MEMORY_UNSAVED_LIMIT, "holds": ratio <= MEMORY_UNSAVED_LIMIT, "pairs": None, "threads": None,
            "opset": None, "git_sha": setup.facts.get("git_sha"), "timestamp": setup.facts.get("timestamp"),
        })
        log(f"  {results[-1]['target']:90} {ratio:6.3f}  ({target_status(ratio, MEMORY_UNSAVED_LIMIT)})")
    return results
