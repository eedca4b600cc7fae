"""A whole model's rows, each measured in a fresh process, as the lab measures the op alone:

    python -m bench.models.rows '{"row": "ort_custom", "model_path": ..., "inputs": ..., ...}'

prints the result as JSON on its last line. PyTorch rows rebuild the model from its spec (a built-in
name or path.py:factory, seeded: the same weights in every process); ORT rows only load the ONNX
file and never import torch. Inputs come from an .npz the parent wrote. Two more modes:
"pairs" (the paired target ratios: both sides in one process, A/B alternating) and "profile" (ORT's
profiler: each node type's share of a run).
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict


# What each row runs: the four of the comparison, then the patched model's decomposed export and the
# original's export after ops.fuse beside them.
ROWS = {
    "torch_original": "PyTorch, the original model",
    "torch_patched": "PyTorch, patched with the myops ops (ops.apply)",
    "ort_original": "ONNX Runtime, the original's export (default level: ORT's own fusions)",
    "ort_decomposed": "ONNX Runtime, the patched model's decomposed export (default level)",
    "ort_custom": "ONNX Runtime, the custom export with the plugin",
    "ort_fused": "ONNX Runtime, the original's export rewritten by nox -s fuse, with the plugin",
}
TORCH_ROWS = ("torch_original", "torch_patched")
ORT_FILES = {"ort_original": "original", "ort_decomposed": "decomposed", "ort_custom": "custom", "ort_fused": "fused"}


def _inputs(spec: dict) -> dict:
    from infer.model_files import load_inputs

    return load_inputs(spec["inputs"])


def torch_call(spec: dict, feed: dict, patched: bool):
    import torch

    import ops

    from .catalog import load

    torch.set_num_threads(spec["threads"])
    case = load(spec["model"])
    model = case.model
    if patched:
        ops.apply(model)
    tensors = {name: torch.from_numpy(value) for name, value in feed.items()}

    def call():
        with torch.inference_mode():
            return model(**tensors, **case.kwargs)

    return call


def ort_call(spec: dict, feed: dict, path: str, **session_options):
    from infer.model_files import session

    run = session(path, spec["plugin"], threads=spec["threads"], **session_options)
    return (lambda: run.run(None, feed)), run


def _measure_row(spec: dict) -> dict:
    """A PyTorch row here; an ORT row is the infer runner's (`runner bench --model`): infer.model_files."""
    from infer.model_files import measure, time_calls

    row = spec["row"]
    if row not in TORCH_ROWS:
        return measure(dict(spec, path=spec["model_path"]))
    call = torch_call(spec, _inputs(spec), patched=row == "torch_patched")
    return time_calls(call, spec["warmup"], spec["runs"], "the model built and its weights loaded")


def _pairs(spec: dict) -> dict:
    """Each target's paired ratios in this process: both sides built here, A and B alternating."""
    import torch

    from bench.targets import _shared_ort_pool, paired_ratios
    from infer.measure import keep_freed_blocks

    keep_freed_blocks()
    _shared_ort_pool(spec["threads"])
    torch.set_num_threads(spec["threads"])
    feed = _inputs(spec)
    calls = {"torch_original": torch_call(spec, feed, patched=False), "torch_patched": torch_call(spec, feed, patched=True)}
    for row, kind in ORT_FILES.items():
        calls[row], _ = ort_call(spec, feed, spec["models"][kind], shared_pool=True)
    return {name: paired_ratios(calls[a], calls[b], spec["pairs"], warmup=spec["warmup"])
            for name, a, b in spec["targets"]}


def _profile(spec: dict) -> dict:
    """{op type: share of the run time} of one ONNX file at the default level, from ORT's profiler."""
    feed = _inputs(spec)
    call, session = ort_call(spec, feed, spec["model_path"], profile_prefix=spec["profile_prefix"])
    for _ in range(spec["runs"]):
        call()
    with open(session.end_profiling()) as handle:
        events = json.load(handle)
    os.remove(handle.name)
    run_time = sum(e.get("dur", 0) for e in events if e.get("name") == "model_run")
    by_type = defaultdict(int)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            args = e.get("args", {})
            by_type[(args.get("op_name", "?"), args.get("provider", ""))] += e.get("dur", 0)
    return {"run_us": run_time, "shares": {f"{op}": round(us / run_time, 5) for (op, _), us in
                                           sorted(by_type.items(), key=lambda kv: -kv[1])} if run_time else {}}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    os.environ.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    mode = spec.get("mode", "row")
    result = {"row": _measure_row, "pairs": _pairs, "profile": _profile}[mode](spec)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
