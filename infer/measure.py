"""Measure benchmark rows in this fresh process and print the result as JSON on the last line.

    python -m infer.measure '{"row": "ort_custom", "workload": "swish", ...}'   # one row
    python -m infer.measure '[{...}, {...}]'                                  # rows one after another

A row's peak memory is only its own in a process of its own: bench.run gives each ORT row a process
of its own in its first round, where its memory is measured, and ignores the memory of later rounds; a
PyTorch row's is measured in a probe process of its own (bench.torch_rows.peak_mb). This module never
imports torch: ORT rows measure what the inference side really is. PyTorch rows run the same
measure() with their callables from bench.torch_rows (`python -m bench.torch_rows SPEC`).

With "execution_provider": "CUDAExecutionProvider" an ORT row keeps x and y on the GPU (io binding), float32 MatMuls in float32
(no TF32), and reports two times: per call, on the host between two stream synchronisations (what an
ORT caller waits for, ORT's per-run overhead included), and per run of a batch queued without
synchronisations (the device time once the GPU is the bottleneck). Its memory comes from NVML
(infer.nvml), after a first run that pays the EP's one-off costs.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .workloads import COPY_ROWS, NATIVE_ROWS, WORKLOADS, percentiles_ms

# Measured by bench.torch_rows, which hands its callables to measure(); each op's native row
# (F.silu, F.rms_norm...) as opspec declares it.
TORCH_ROWS = ("torch_composite", "torch_extension", *NATIVE_ROWS.values(), "torch_compile", "torch_copy",
              "torch_copy_into")
ORT_ROWS = ("ort_composite", "ort_custom", "ort_copy", "ort_plugin_copy")
PLUGIN_ROWS = ("ort_custom", "ort_plugin_copy")


# ---------------------------------------------------------------- memory

def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> str:
    """Start a fresh high-water mark; returns how peaks are measured."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return "peak RSS above baseline (VmHWM reset)"
    except OSError:
        return "peak RSS above baseline (VmHWM not resettable: includes start-up)"


# ---------------------------------------------------------------- callables per row

CUDA_EP = "CUDAExecutionProvider"


class RowError(RuntimeError):
    """A row that cannot be measured here; the message says what to do."""


def _ort_providers(spec: dict, ort) -> tuple[list, str | None]:
    """The providers argument of a row's session, and its TF32 setting (None on the CPU)."""
    provider = spec.get("execution_provider", "CPUExecutionProvider")
    if provider == "CPUExecutionProvider":
        return [provider], None
    if provider != CUDA_EP:
        raise RowError(f"execution provider {provider!r} is not benchmarked (CPUExecutionProvider, {CUDA_EP})")
    if CUDA_EP not in ort.get_available_providers():
        raise RowError(f"onnxruntime {ort.__version__} here has no {CUDA_EP} (it has {ort.get_available_providers()}): "
                       "install onnxruntime-gpu for this CUDA major, or run the CUDA entry's infer image with --gpus all")
    from lab.compat import ort_fp32_exact

    # float32 MatMuls in float32, as PyTorch's default does, so that ORT and torch rows do the same math.
    exact, environment = ort_fp32_exact(ort.__version__)
    os.environ.update(environment)
    tf32 = "off (" + ", ".join(f"{k}={v}" for k, v in {**exact, **environment}.items()) + ")"
    # kSameAsRequested: the arena grows by what is asked, so its growth is the row's memory (the
    # default rounds every extension up to a power of two).
    return [(CUDA_EP, {"device_id": "0", "arena_extend_strategy": "kSameAsRequested", **exact})], tf32


def _check_plugin_serves(spec: dict) -> None:
    """The custom row on a GPU must run the plugin's CUDA kernel, not fall back to its CPU one."""
    from ort_plugin.diagnose import diagnose_model, failures
    from ort_plugin.library_info import read_library
    from ort_plugin.onnx_file import read_model

    problems = failures(diagnose_model(read_model(spec["model_path"]), read_library(spec["plugin"]),
                                       providers=[spec["execution_provider"]]))
    if problems:
        raise RowError(f"{spec['plugin']} cannot serve {spec['model_path']} on {spec['execution_provider']}: "
                       + "; ".join(map(str, problems)) + ". Use the plugin built for the CUDA entry "
                       "(its infer image, or `python -m ort_plugin.build --cuda ON`)")


@dataclass
class OrtRow:
    call: Callable            # one run as a caller makes it: inputs synchronised, run, outputs synchronised
    graph: str                # the node types ORT ran
    session: object
    tf32: str | None
    batch: Callable | None = None       # batch(k): k runs without a synchronisation between them (io binding)
    use_input: Callable | None = None   # use_input(tiny): bind a one-row input (True) or the real one (False)


# A run option, not a session option: unknown keys are ignored, so on a release without it every run
# synchronises and the batch is a per-call time again (an upper bound of the device time).
NO_SYNC_BETWEEN_RUNS = "disable_synchronize_execution_providers"


def _ort_row(spec: dict, arrays: tuple, work: Path) -> OrtRow:
    """arrays: one per graph input of the model, in order (the workload's inputs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = spec["threads"]
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[spec.get("ort_opt_level", "all")]
    options.optimized_model_filepath = str(work / "optimized.onnx")
    if spec.get("profile_prefix"):
        options.enable_profiling = True
        options.profile_file_prefix = spec["profile_prefix"]
    providers, tf32 = _ort_providers(spec, ort)
    on_gpu = spec.get("execution_provider") == CUDA_EP
    if on_gpu:
        # Every node on the GPU or no session: a silent CPU fallback would be measured as the GPU row.
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if spec["row"] in PLUGIN_ROWS:
        from ort_plugin import register

        if on_gpu:
            _check_plugin_serves(spec)
        register(options, spec["plugin"])
    try:
        session = ort.InferenceSession(spec["model_path"], options, providers=providers)
    except Exception as exc:  # onnxruntime's own exception types
        raise RowError(f"onnxruntime could not create a session for {spec['model_path']} on "
                       f"{[p if isinstance(p, str) else p[0] for p in providers]}: {exc}") from exc
    graph = _graph_nodes(work / "optimized.onnx")
    input_names = [i.name for i in session.get_inputs()]
    if len(input_names) != len(arrays):
        raise RowError(f"{spec['model_path']} takes {len(input_names)} inputs ({', '.join(input_names)}); the "
                       f"{spec['workload']} workload feeds {len(arrays)}: export the model again (ops.export)")
    if not (on_gpu or spec.get("io_binding")):
        feed = dict(zip(input_names, arrays))

        def run():
            return session.run(None, feed)

        return OrtRow(run, graph, session, tf32)
    device = "cuda" if on_gpu else "cpu"
    binding = session.io_binding()
    output_names = [output.name for output in session.get_outputs()]
    inputs = {False: [ort.OrtValue.ortvalue_from_numpy(a, device, 0) for a in arrays]}
    if _leading_axes_dynamic(session):
        inputs[True] = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a[:1, :1]), device, 0) for a in arrays]

    def use_input(tiny: bool) -> bool:
        """Bind the one-row input or the real one; False where the model's batch and sequence are fixed."""
        if tiny not in inputs:
            return False
        for name, value in zip(input_names, inputs[tiny]):
            binding.bind_ortvalue_input(name, value)
        binding.clear_binding_outputs()  # an output of the other shape stays bound otherwise, and the run refuses it
        for name in output_names:
            binding.bind_output(name, device, 0)
        return True

    def call():  # timed on the host between two synchronisations: torch-free, and what an ORT caller waits
        binding.synchronize_inputs()
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return binding

    no_sync = ort.RunOptions()
    no_sync.add_run_config_entry(NO_SYNC_BETWEEN_RUNS, "1")

    def batch(runs: int):
        binding.synchronize_inputs()
        for _ in range(runs):
            session.run_with_iobinding(binding, no_sync)
        binding.synchronize_outputs()
        return binding

    use_input(False)
    return OrtRow(call, graph, session, tf32, batch, use_input)


def _leading_axes_dynamic(session) -> bool:
    shape = session.get_inputs()[0].shape
    return len(shape) >= 2 and not any(isinstance(dim, int) for dim in shape[:2])


def _graph_nodes(path: Path) -> str:
    """The node types of the graph ORT actually ran (after its optimizer), e.g. 'com.microsoft::QuickGelu'.

    Read with the plugin side's own reader even where onnx is installed: importing onnx costs ~0.9 s,
    paid by every row's process."""
    from ort_plugin.onnx_file import read_model

    names = [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in read_model(path).nodes if n.where == "graph"]
    return "+".join(sorted(set(names), key=names.index))


def _profile_share(trace_path: str, op_type: str) -> float | None:
    """Share of the run time spent in the custom op's nodes (op_type, e.g. Swish), from an ORT chrome trace."""
    events = json.loads(Path(trace_path).read_text())
    runs = sum(e.get("dur", 0) for e in events if e.get("name") == "model_run")
    custom = sum(e.get("dur", 0) for e in events
                 if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == op_type and e["name"].endswith("_kernel_time"))
    return round(custom / runs, 4) if runs else None


# ---------------------------------------------------------------- measurement

def _mmap_large_blocks() -> None:
    """Every block over 64 KiB from mmap, returned on free: RSS then follows the live tensors.

    Otherwise glibc raises its mmap threshold after the first large free and keeps later blocks in
    the heap, and PyTorch rows' peaks depend on its trimming heuristics (seen: 60-120 MB for one row).
    """
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD; also stops the dynamic threshold
    except (OSError, AttributeError):
        pass


# glibc reads its tunables once, at start-up: set for every timing process by its parent.
NO_THREAD_CACHE = "glibc.malloc.tcache_count=0"


def timing_child_env(repo: Path) -> dict:
    """The environment of a timing process: the repository importable, glibc's per-thread cache off.

    torch asks for 64-byte aligned blocks; glibc's memalign cuts a few bytes off either end of each
    one, and while those scraps sit in the per-thread cache a freed output cannot merge back into a
    block as large as the next request. A DRAM-sized output then took fresh pages from the kernel in
    most calls and faulted in all 49,152 of them (ru_minflt), 3x-18x a copy_; with the cache off
    there were none from the third call on. ORT rows get it too: the same allocator for every row.
    The memory probe a row starts inherits it; its blocks are mmapped, which the cache never holds.
    """
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t]
    if NO_THREAD_CACHE not in tunables:
        tunables.append(NO_THREAD_CACHE)
    return dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                GLIBC_TUNABLES=":".join(tunables))


def keep_freed_blocks() -> None:
    """Timing processes of PyTorch rows: freed blocks stay in the heap for the next call.

    By default glibc's dynamic mmap threshold decides, from the history of each process, whether a
    block of this size comes from the heap or as fresh pages that every call page-faults in again
    (and the composite's temporaries with it): a variable that differs between processes. ORT rows
    write into an arena ORT keeps; with this (and timing_child_env's tunable), PyTorch rows reuse
    their buffers as well.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-4, 0)            # M_MMAP_MAX: no block from mmap
    libc.mallopt(-1, 2**31 - 1)    # M_TRIM_THRESHOLD: never give the top of the heap back


ORT_CUDA_MEMORY_METHOD = ("NVML device memory used after the timed runs minus after a first run on a one-row input "
                          "(which pays the EP's handles and workspace; ORT's CUDA arena, kSameAsRequested, only grows; "
                          "the whole device is counted)")


def _gpu_memory_probe():
    """(read used bytes, method) for an ORT row on the GPU; None reader when NVML is not there."""
    from .nvml import DeviceMemory, NvmlUnavailable

    try:
        return DeviceMemory(0).used_bytes, ORT_CUDA_MEMORY_METHOD
    except NvmlUnavailable as exc:
        return None, f"unavailable: {exc}"


def _ort_cuda_version() -> str | None:
    try:
        from onnxruntime.capi import build_and_package_info
    except ImportError:
        return None
    return getattr(build_and_package_info, "cuda_version", None)


HOST_TIMING_METHOD = "per call: host clock around each call"
ORT_CUDA_TIMING_METHOD = ("per call: host clock around synchronize inputs, run, synchronize outputs (ORT's per-run "
                          "overhead included); device: {calls} runs without a synchronisation between them, host "
                          "clock, median over {batches} batches / {calls}")
# The batch is the GPU's time only when the GPU, not ORT's per-run overhead, is the bottleneck: the
# same batch on a one-row input (microseconds of GPU work) is that overhead, and the real input's
# batch must take clearly longer.
DEVICE_BOUND_FACTOR = 1.5
BATCH_CALLS, BATCHES = 20, 10


def batched_ms(batch: Callable, calls: int = BATCH_CALLS, batches: int = BATCHES) -> float:
    """Median milliseconds per run of batch(calls), over `batches` batches."""
    per_run = []
    for _ in range(batches):
        start = time.perf_counter()
        batch(calls)
        per_run.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(per_run)


def ort_device_ms(row: OrtRow) -> tuple[float | None, str]:
    """The device time per run of an ORT row on the GPU, or None where ORT's own per-run overhead
    hides it; and how it was taken."""
    method = ORT_CUDA_TIMING_METHOD.format(calls=BATCH_CALLS, batches=BATCHES)
    real = batched_ms(row.batch)
    if not row.use_input(True):
        return round(real, 5), method + " (an upper bound: the model's batch and sequence axes are fixed, so ORT's " \
                                        "per-run overhead could not be measured apart)"
    try:
        overhead = batched_ms(row.batch)
    finally:
        row.use_input(False)
    if real < DEVICE_BOUND_FACTOR * overhead:
        return None, method + (f"; no device time: {real:.4f} ms a run against {overhead:.4f} ms for a one-row input, "
                               "so ORT's per-run overhead, not the GPU, sets the pace (see the large workload)")
    return round(real, 5), method + f" (ORT's per-run overhead, from a one-row input: {overhead:.4f} ms)"


def _ort_step(step: Callable, what: str):
    """Run one step of an ORT row; onnxruntime's own failure (a shape the model refuses, out of
    memory) becomes a RowError that names the step."""
    try:
        return step()
    except RowError:
        raise
    except Exception as exc:  # onnxruntime's exception types
        raise RowError(f"onnxruntime failed in {what}: {str(exc).strip().splitlines()[0][:400]}") from exc


def measure(spec: dict, torch_rows=None) -> dict:
    """One row's figures. torch_rows: what PyTorch rows need (bench.torch_rows: callable, peak_mb,
    trace, MEMORY_METHOD); without it a PyTorch row is refused."""
    if spec.get("memory_probe"):
        _mmap_large_blocks()
    workload = WORKLOADS[spec["workload"]]
    arrays = workload.inputs(seed=0)
    if spec["row"] in COPY_ROWS:  # the copy floor copies x alone
        arrays = arrays[:1]
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        session, tf32, ort_row = None, None, None
        if spec["row"] in TORCH_ROWS:
            if torch_rows is None:
                raise RowError(f"{spec['row']} is a PyTorch row: measure it with python -m bench.torch_rows "
                               "(the inference side has no torch)")
            if not spec.get("memory_probe"):
                keep_freed_blocks()
            call, graph = torch_rows.row_callable(spec, arrays)
            provider = "torch-cpu"
        else:
            ort_row = _ort_row(spec, arrays, Path(tmp))
            call, graph, session, tf32 = ort_row.call, ort_row.graph, ort_row.session, ort_row.tf32
            provider = spec.get("execution_provider", "CPUExecutionProvider")
        on_gpu = provider == CUDA_EP
        if spec.get("memory_probe"):
            # One untimed call first: PyTorch's one-time start-up (OpenMP threads, allocator pools) is
            # not the row's memory. ORT rows on the CPU keep it in: their arena holds the blocks, which is their cost.
            call()
        if on_gpu:
            # The CUDA EP creates its stream, cuBLAS/cuDNN handles and workspace in the first run: one-off
            # costs, not the row's memory, so the baseline is read after a first run on a one-row input
            # (on the real one where the model's axes are fixed: its arena growth is then left out).
            tiny = ort_row.use_input(True)
            _ort_step(call, "a first run")
            if tiny:
                ort_row.use_input(False)
            read_used, memory_method = _gpu_memory_probe()
            if not tiny:
                memory_method += "; batch and sequence fixed: the first run was the real input, so its arena growth is not counted"
            baseline = read_used() if read_used else 0
        else:
            baseline = _status_kib("VmRSS") * 1024
            memory_method = reset_peak()
        for _ in range(spec["warmup"]):
            _ort_step(call, "a warm-up run") if ort_row else call()
        times = []
        for _ in range(spec["runs"]):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        device_ms, timing_method = None, HOST_TIMING_METHOD
        if on_gpu:
            device_ms, timing_method = _ort_step(lambda: ort_device_ms(ort_row), "the batched runs")
            peak_mb = round(max(read_used() - baseline, 0) / 2**20, 2) if read_used else None
        else:
            peak_mb = round(max(_status_kib("VmHWM") * 1024 - baseline, 0) / 2**20, 2)
        if session is None and not spec.get("memory_probe"):
            # Memory is measured once per row (bench.run asks in its first round only).
            peak_mb, memory_method = (None, "") if spec.get("no_memory") else (torch_rows.peak_mb(spec),
                                                                               torch_rows.MEMORY_METHOD)
        result = {
            **percentiles_ms(times),
            "seconds": times,
            "device_ms": device_ms,
            "timing_method": timing_method,
            "peak_mb": peak_mb,
            "memory_method": memory_method,
            "graph": graph,
            "execution_provider": provider,
            "tf32": tf32,
        }
        if on_gpu:
            result["cuda"] = _ort_cuda_version()
        if session is not None and spec.get("profile_prefix"):
            trace = session.end_profiling()
            result["trace"] = trace
            from opspec import OPS

            op_type = OPS[WORKLOADS[spec["workload"]].op].onnx_type
            result["custom_node_share"] = _profile_share(trace, op_type) if spec["row"] == "ort_custom" else None
        elif spec.get("profile_prefix"):
            result["trace"] = torch_rows.trace(call, spec["profile_prefix"])
    return result


def main(argv: list[str], torch_rows=None) -> int:
    """One row (a JSON object), or several measured one after another in this process (a JSON list:
    bench.run's later rounds); prints the result, or the list of results, as JSON."""
    given = json.loads(argv[0])
    # After the first row, a process's peak memory holds the rows before: an ORT row's is then not
    # measured (a PyTorch row's is, in a probe process of its own).
    specs = [given] if isinstance(given, dict) else \
        given[:1] + [spec if spec["row"] in TORCH_ROWS else dict(spec, no_memory=True) for spec in given[1:]]
    os.environ.setdefault("OMP_NUM_THREADS", str(specs[0]["threads"]))
    results = []
    try:
        for spec in specs:
            results.append(measure(spec, torch_rows))
            gc.collect()  # the row's session or tensors go before the next row is set up
    except RowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(results if isinstance(given, list) else results[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
