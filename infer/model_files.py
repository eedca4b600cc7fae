"""Any ONNX model file in ONNX Runtime, with the plugin, on random inputs (no torch): what
`runner bench --model FILE`, `nox -s model`'s ORT rows and `nox -s fuse`'s proof share.

    python -m infer.model_files '{"path": ..., "dims": [1, 128], "threads": 2, "warmup": 2, "runs": 8}'

measures one file in this fresh process and prints the result as JSON on its last line. Inputs come
from `feeds`: symbolic dimensions take `dims` in order of first appearance (batch, then sequence for a
language model), integer inputs (token ids) are drawn from [0, int_high), masks are 0 or 1; or from an
.npz (`inputs`) the caller wrote.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

ELEMENT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
                 "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


class FeedShapeError(ValueError):
    """An input cannot be fed random values; the message says which and why."""


def feeds(session, dims, *, int_high: int = 32, seed: int = 0) -> dict:
    """Random inputs for every input of an onnxruntime session."""
    rng = np.random.default_rng(seed)
    named: dict[str, int] = {}
    made = {}
    for node_arg in session.get_inputs():
        if node_arg.type not in ELEMENT_TYPES:
            raise FeedShapeError(f"input {node_arg.name} is a {node_arg.type}: random inputs are float, int and bool "
                                 "tensors only")
        shape = []
        for dim in node_arg.shape:
            if isinstance(dim, int) and dim >= 0:
                shape.append(dim)
            else:
                key = str(dim) if dim else f"?{len(named)}"
                named.setdefault(key, dims[len(named) % len(dims)])
                shape.append(named[key])
        dtype = ELEMENT_TYPES[node_arg.type]
        if dtype == np.bool_:
            made[node_arg.name] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            made[node_arg.name] = rng.integers(0, 2 if "mask" in node_arg.name.lower() else int_high, shape, dtype=dtype)
        else:
            made[node_arg.name] = rng.standard_normal(shape).astype(dtype)
    return made


def session(path, plugin: str | None, *, threads: int = 0, shared_pool: bool = False, profile_prefix: str | None = None,
            level: str = "all"):
    """An ORT CPU session of `path` (a file name or serialized bytes) with the plugin registered."""
    import onnxruntime as ort

    from ort_plugin import register

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    if shared_pool:
        options.use_per_session_threads = False
    elif threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    register(options, plugin)
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def load_inputs(path: str) -> dict:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def time_calls(call, warmup: int, runs: int, loaded: str) -> dict:
    """Warm-up, then timed calls, and the peak memory above what was loaded before (`loaded` says what):
    the whole-model rows' measurement, ORT's here and PyTorch's in bench.models.rows alike."""
    from .measure import _status_kib, reset_peak
    from .workloads import percentiles_ms

    baseline = _status_kib("VmRSS") * 1024
    memory_method = reset_peak()
    for _ in range(warmup):
        call()
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    peak = max(_status_kib("VmHWM") * 1024 - baseline, 0)
    return {**percentiles_ms(seconds), "seconds": seconds, "peak_mb": round(peak / 2**20, 2),
            "memory_method": f"{memory_method}, {loaded} before the baseline"}


def measure(spec: dict) -> dict:
    """One file in this process: warm-up, then timed runs; the peak memory above the loaded session."""
    run = session(spec["path"], spec.get("plugin"), threads=spec["threads"])
    feed = load_inputs(spec["inputs"]) if spec.get("inputs") else feeds(run, spec["dims"], int_high=spec.get("int_high", 32))
    return {**time_calls(lambda: run.run(None, feed), spec["warmup"], spec["runs"], "the session loaded"),
            "inputs": {name: list(value.shape) for name, value in feed.items()}}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    os.environ.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    print(json.dumps(measure(spec)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
