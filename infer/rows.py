"""The benchmark's row format, shared by `nox -s bench`, bench.gpu_check and the infer image's bench.

Torch-free (the infer image writes these rows too). One row per measurement, long format.
"""
from __future__ import annotations

import hashlib
import math
import platform
from pathlib import Path

from .workloads import COPY_ROWS, WORKLOADS, percentiles_ms

COLUMNS = [
    "entry", "workload", "op", "row", "dtype", "shape", "beta", "opset", "exporter", "ort_opt_level", "ort_graph_nodes",
    "execution_provider", "tf32", "threads", "isa", "warmup", "runs", "processes", "p20_ms", "p50_ms", "p80_ms", "ci_low_ms",
    "ci_high_ms", "process_spread", "device_ms", "device_noise", "device_cold_ms", "device_cold_noise",
    "timing_method", "peak_mb", "memory_method",
    "bytes_moved", "regime", "gb_per_s", "fraction_of_copy", "fraction_of_peak", "custom_node_share", "torch", "onnx", "onnxruntime", "cuda",
    "driver", "device", "arch", "host", "git_sha", "git_dirty", "image", "extension_sha256", "plugin_sha256", "model_sha256",
    "timestamp",
]
# regime: where the row's input and output fit (memory_regime): its GB/s above DRAM bandwidth is a cache's.
# device_noise, device_cold_noise: relative standard deviation of the device-time samples (GPU rows:
# bench.cuda_timing's stopping rule). device_cold_ms: one call after L2 was flushed. fraction_of_peak:
# gb_per_s over the device's peak DRAM bandwidth (NVML), where known; above 1 only for rows in a cache.
# isa: the CPU path (MYOPS_CPU_ISA) bench.run --isa capped a kernel row to; empty: not capped by --isa.
KEY = ["entry", "workload", "row", "dtype", "shape", "beta", "opset", "exporter", "ort_opt_level",
       "execution_provider", "threads", "isa"]
# The raw timings behind every row: KEY, then which process (round) and which run within it.
SAMPLE_COLUMNS = KEY + ["process", "run", "seconds"]


def ort_row_specs(common: dict, models: dict, plugin: str) -> list[dict]:
    """The ONNX Runtime rows of one workload and opset: composite at the default level and at BASIC,
    the plugin's custom op, and (activation alone) the copy floors: ORT's Identity and the plugin's Copy.

    models: {"decomposed": path, "custom": path, "copy": path, "plugin_copy": path (the last two: workloads
    of the op alone, Workload.op_alone)}.
    """
    specs = [dict(common, row="ort_composite", ort_opt_level="all", model_path=models["decomposed"]),
             dict(common, row="ort_composite", ort_opt_level="basic", model_path=models["decomposed"]),
             dict(common, row="ort_custom", ort_opt_level="all", model_path=models["custom"], plugin=plugin)]
    if models.get("copy"):
        specs.append(dict(common, row="ort_copy", ort_opt_level="all", model_path=models["copy"]))
    if models.get("plugin_copy"):
        specs.append(dict(common, row="ort_plugin_copy", ort_opt_level="all", model_path=models["plugin_copy"],
                          plugin=plugin))
    return specs


def write_copy_model(path: Path, opset: int, domain: str = "", op_type: str = "Identity", hidden: int = 768) -> str:
    """x -> Identity -> y on (batch, seq, hidden): ORT's copy floor, written without the onnx package
    (domain "myops", op_type "Copy": the plugin's)."""
    from ort_plugin.onnx_file import one_node_model

    Path(path).write_bytes(one_node_model(domain, op_type, opset=opset, shape=("batch", "seq", hidden)))
    return str(path)


def copy_models(directory: Path, opset: int, hidden: int = 768) -> dict:
    """Both ORT-side copy floors for one opset: {"copy": Identity, "plugin_copy": myops::Copy}."""
    return {"copy": write_copy_model(Path(directory) / f"copy-h{hidden}-opset{opset}.onnx", opset, hidden=hidden),
            "plugin_copy": write_copy_model(Path(directory) / f"plugin-copy-h{hidden}-opset{opset}.onnx", opset, "myops",
                                            "Copy", hidden=hidden)}


# Where a row's device column names the GPU rather than the CPU: ORT's CUDA EP, and PyTorch on CUDA
# (bench.gpu_check's rows).
GPU_PROVIDERS = ("CUDAExecutionProvider", "torch-cuda")


def record(entry: str, spec: dict, measured: dict, facts: dict) -> dict:
    """One CSV row from a measure spec (infer.measure, bench.torch_rows, bench.gpu_check), what it
    measured and the provenance facts. The spec may set dtype and shape (default: float32, the
    workload's) and bytes_moved (default: derive() fills in the workload's float32 forward traffic)."""
    shape = spec.get("shape") or WORKLOADS[spec["workload"]].shape
    return {
        "entry": entry, "workload": spec["workload"], "op": WORKLOADS[spec["workload"]].op, "row": spec["row"],
        "dtype": spec.get("dtype", "float32"), "shape": "x".join(map(str, shape)), "beta": spec["beta"],
        "opset": spec.get("opset"), "exporter": spec.get("exporter"), "ort_opt_level": spec.get("ort_opt_level"),
        "ort_graph_nodes": measured["graph"], "execution_provider": measured["execution_provider"],
        "tf32": measured.get("tf32"), "threads": spec["threads"], "isa": spec.get("isa"), "warmup": spec["warmup"], "runs": spec["runs"],
        "processes": measured.get("processes", 1),
        "p20_ms": measured["p20_ms"], "p50_ms": measured["p50_ms"], "p80_ms": measured["p80_ms"],
        "ci_low_ms": measured.get("ci_low_ms"), "ci_high_ms": measured.get("ci_high_ms"),
        "process_spread": measured.get("process_spread"),
        "device_ms": measured.get("device_ms"), "device_noise": measured.get("device_noise"),
        "device_cold_ms": measured.get("device_cold_ms"), "device_cold_noise": measured.get("device_cold_noise"),
        "timing_method": measured.get("timing_method"),
        "peak_mb": measured["peak_mb"], "memory_method": measured["memory_method"],
        "bytes_moved": spec.get("bytes_moved"), "custom_node_share": measured.get("custom_node_share"),
        "torch": facts.get("torch"), "onnx": facts.get("onnx"), "onnxruntime": facts.get("onnxruntime"),
        "cuda": measured.get("cuda") or facts.get("torch_cuda"), "driver": facts.get("driver"),
        "device": facts.get("gpu") if measured["execution_provider"] in GPU_PROVIDERS else facts.get("cpu"),
        "arch": platform.machine(), "host": facts.get("host"),
        "git_sha": facts.get("git_sha"), "git_dirty": facts.get("git_dirty"), "image": facts.get("image") or "",
        # The exact binaries and model the row ran: torch rows the extension, ORT rows their ONNX file
        # and (custom op) the plugin; reproducible builds make these comparable across machines.
        "extension_sha256": facts.get("extension_sha256") if spec["row"].startswith("torch_") else None,
        "plugin_sha256": file_sha256(spec["plugin"]) if spec.get("plugin") else None,
        "model_sha256": file_sha256(spec["model_path"]) if spec.get("model_path") else None,
        "timestamp": facts.get("timestamp"),
    }


def samples_of(row: dict, results: list[dict]) -> list[dict]:
    """The raw timings of one row: one result per process, each with its runs' seconds."""
    key = {k: row.get(k) for k in KEY}
    return [dict(key, process=p, run=r, seconds=round(s, 9)) for p, result in enumerate(results)
            for r, s in enumerate(result["seconds"])]


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def kernel_ms(row: dict) -> float:
    """The time bandwidth is computed from: the device time where a row has one (GPU rows), else p50."""
    return float(row.get("device_ms") or row["p50_ms"])


def memory_regime(working_set: int, caches: dict[str, int], threads: int = 1) -> str:
    """Where a working set (input + output bytes) lives: the private L2s of the cores in use (a GPU's
    one L2: threads 1), the shared L3, or DRAM; "unknown" where the caches are not known."""
    if caches.get("L2") and working_set <= caches["L2"] * threads:
        return "L2"
    if caches.get("L3") and working_set <= caches["L3"]:
        return "L3"
    return "DRAM" if caches else "unknown"


def derive(rows: list[dict], caches: dict[str, int] | None = None, peak_bytes_per_s: float | None = None) -> None:
    """Bandwidth from the least bytes each row must move (its bytes_moved where set, as a GPU row's
    backward or float16 traffic; else its workload's float32 forward traffic) over its kernel time;
    fraction of the copy floor's bandwidth (the fastest copy of the same framework, workload, dtype
    and opset); with the caches of the device the rows ran on, each row's memory regime; with the
    device's peak DRAM bandwidth, the fraction of it."""
    def key(r):
        return (r["workload"], r["execution_provider"], r["opset"], r.get("dtype") or "float32")

    def rate(r):  # bytes per second
        return float(r["bytes_moved"]) / (kernel_ms(r) * 1e-3) if kernel_ms(r) > 0 else None

    copies = {}
    for r in rows:
        if r["row"] in COPY_ROWS and (key(r) not in copies or kernel_ms(r) < kernel_ms(copies[key(r)])):
            copies[key(r)] = r
    for r in rows:
        workload = WORKLOADS[r["workload"]]
        r["bytes_moved"] = r.get("bytes_moved") or (workload.copy_bytes if r["row"] in COPY_ROWS else workload.bytes_moved)
        if caches is not None:
            r["regime"] = memory_regime(int(r["bytes_moved"]), caches, int(r.get("threads") or 1))
    for r in rows:
        mine, copy = rate(r), copies.get(key(r))
        floor = rate(copy) if copy else None
        r["gb_per_s"] = _significant(mine / 1e9) if mine else None
        r["fraction_of_copy"] = _significant(mine / floor) if mine and floor else None
        r["fraction_of_peak"] = _significant(mine / peak_bytes_per_s) if mine and peak_bytes_per_s else None


def _significant(value: float) -> float:
    """Three decimals, or four significant digits where those are finer: a slow row's small fraction
    (1e-4 of its copy) stays a number, not 0.0."""
    return round(value, max(3, 3 - math.floor(math.log10(abs(value)))))


def write(results: Path, entry: str, rows: list[dict], samples: list[dict] | None = None) -> Path:
    """Upsert into results/<entry>/bench.csv (and the rows' raw timings into samples.csv: a key's old
    samples are replaced by its new ones) and rewrite the aggregate results/bench_all.csv (atomically)."""
    from lab.files import upsert_csv

    path = Path(results) / entry / "bench.csv"
    if samples:
        upsert_csv(path.with_name("samples.csv"), samples, SAMPLE_COLUMNS, KEY)
    upsert_csv(path, rows, COLUMNS, KEY)
    write_aggregate(results)
    return path


def write_aggregate(results: Path) -> list[dict]:
    """results/bench_all.csv: every entry's rows, and those of every host a fan-out measured
    (results/<entry>/<host-id>/bench.csv); returns them."""
    from lab.files import read_csv, write_csv_atomic

    paths = sorted(Path(results).glob("*/bench.csv")) + sorted(Path(results).glob("*/*/bench.csv"))
    every = [r for p in paths for r in read_csv(p)]
    write_csv_atomic(Path(results) / "bench_all.csv", every, COLUMNS)
    return every
