"""Performance targets as ratios of paired measurements: A, B, A, B ... in one process, one run.

The ratio of each pair is taken, and the median of those ratios is the figure: both sides see
the same machine state, so the ratio holds where absolute times drift. CPU default, activation
alone, float32.

The pairs run in a child process (`python -m bench.targets SPEC`) whose ORT sessions share one
intra-op thread pool, as one process serving several models would. With a pool per session, the
pool that has just run keeps its threads spinning and, on a 2-core machine, slows whichever
session runs next: ratios then swung between 0.4x and 1.3x from one block of pairs to the next.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .workloads import WORKLOADS

REPO = Path(__file__).resolve().parent.parent
PAIRS_TIMEOUT_S = 1800
ORT_THREAD_POOL = "one intra-op pool shared by the sessions"
TARGET_COLUMNS = ["entry", "target", "numerator", "denominator", "median_ratio", "limit", "holds", "pairs",
                  "threads", "opset", "ort_thread_pool", "git_sha", "timestamp"]
# (name, numerator, denominator, limit): the target holds when median(A/B) <= limit.
TARGETS = [
    ("ORT custom op vs ORT composite (default level: QuickGelu)", "ort_custom", "ort_composite_all", 1.0),
    ("ORT custom op vs ONNX Swish-24 (ORT's own kernel)", "ort_custom_newest", "ort_standard_swish", 1.0),
    ("ORT custom op vs ORT copy floor", "ort_custom", "ort_copy", 1.3),
    ("extension op vs F.silu", "torch_extension", "torch_silu", 1.05),
    ("extension op vs PyTorch composite", "torch_extension", "torch_composite", 0.7),
]


def _shared_ort_pool(threads: int) -> None:
    """Before the first session: every session of this process uses one global intra-op pool."""
    from onnxruntime.capi import _pybind_state

    _pybind_state.set_global_thread_pool_sizes(threads, 1)


def _callables(spec: dict) -> dict:
    import onnxruntime as ort
    import torch

    import ops
    from ort_plugin import register

    _shared_ort_pool(spec["threads"])
    torch.set_num_threads(spec["threads"])
    ops.load()
    x_np = WORKLOADS["swish"].input(seed=0)
    x = torch.from_numpy(x_np)
    paths = spec["models"]

    def session(path, with_plugin=False):
        options = ort.SessionOptions()
        options.use_per_session_threads = False
        options.log_severity_level = 3
        if with_plugin:
            register(options, spec["plugin"])
        s = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        return lambda: s.run(None, {"x": x_np})

    beta = spec["beta"]
    calls = {
        "ort_custom": session(paths["custom"], with_plugin=True),
        "ort_composite_all": session(paths["decomposed"]),
        "ort_copy": session(paths["copy"]),
        "torch_extension": lambda: ops.swish(x, beta),
        "torch_silu": lambda: torch.nn.functional.silu(x),
        "torch_composite": lambda: ops.reference(x, beta),
    }
    if "newest_custom" in paths:  # from opset 24 the decomposed lowering is the standard Swish op
        calls["ort_custom_newest"] = session(paths["newest_custom"], with_plugin=True)
        calls["ort_standard_swish"] = session(paths["newest_decomposed"])
    return calls


def paired_ratio(a, b, pairs: int, warmup: int = 10) -> float:
    """Median over pairs of t(a) / t(b), timed back to back; the order alternates between pairs,
    so that neither side always inherits the other's cache and thread-pool state."""
    for _ in range(warmup):
        a()
        b()
    ratios = []
    for i in range(pairs):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        start = time.perf_counter()
        first()
        middle = time.perf_counter()
        second()
        end = time.perf_counter()
        t_first, t_second = middle - start, end - middle
        ratios.append(t_first / t_second if i % 2 == 0 else t_second / t_first)
    return statistics.median(ratios)


def _child(spec: dict) -> list[dict]:
    calls = _callables(spec)
    measured = []
    for name, numerator, denominator, limit in TARGETS:
        if (spec["beta"] != 1.0 and denominator == "torch_silu") or numerator not in calls or denominator not in calls:
            continue
        ratio = paired_ratio(calls[numerator], calls[denominator], spec["pairs"])
        print(f"  {name:48} {ratio:6.3f}x  (target <= {limit}x)  {'OK' if ratio <= limit else 'MISSED'}",
              file=sys.stderr, flush=True)
        measured.append(dict(target=name, numerator=numerator, denominator=denominator, ratio=ratio, limit=limit))
    return measured


def measure_targets(args, models: dict, plugin: str, rows: list[dict], facts: dict) -> list[dict]:
    from ops.export import uses_standard_swish

    opsets = sorted(opset for (name, opset) in models if name == "swish")
    newest = opsets[-1]
    composite = [o for o in opsets if not uses_standard_swish(o)]
    opset = composite[-1] if composite else newest  # the newest opset whose decomposed graph is Mul/Sigmoid
    paths = {key: str(value) for key, value in models[("swish", opset)].items()}
    if newest != opset:
        paths["newest_custom"] = str(models[("swish", newest)]["custom"])
        paths["newest_decomposed"] = str(models[("swish", newest)]["decomposed"])
    spec = dict(threads=args.threads, beta=args.beta, pairs=args.pairs, plugin=str(plugin), models=paths)
    print(f"[bench] paired target ratios ({args.pairs} alternating pairs each, opset {opset}, ORT sessions "
          f"sharing one thread pool):", flush=True)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # stderr (one line per target as it is measured) goes straight to the terminal.
    child = subprocess.run([sys.executable, "-m", "bench.targets", json.dumps(spec)], stdout=subprocess.PIPE,
                           text=True, timeout=PAIRS_TIMEOUT_S, env=env, cwd=REPO)
    if child.returncode != 0:
        raise RuntimeError(f"the paired target ratios failed (exit status {child.returncode}); see the lines above")
    results = []
    for m in json.loads(child.stdout.strip().splitlines()[-1]):
        results.append(dict(entry=args.entry, target=m["target"], numerator=m["numerator"],
                            denominator=m["denominator"], median_ratio=round(m["ratio"], 4), limit=m["limit"],
                            holds=m["ratio"] <= m["limit"], pairs=args.pairs, threads=args.threads,
                            opset=newest if m["numerator"].endswith("_newest") else opset,
                            ort_thread_pool=ORT_THREAD_POOL, git_sha=facts["git_sha"], timestamp=facts["timestamp"]))
    # Memory: fused rows must peak below their composite rows (fresh-process figures of this run).
    peaks = {(r["row"], r.get("ort_opt_level") or "", r.get("opset") or ""): r["peak_mb"] for r in rows if r["workload"] == "swish"}
    for name, fused, composite in (
        ("extension peak memory vs PyTorch composite", ("torch_extension", "", ""), ("torch_composite", "", "")),
        ("ORT custom op peak memory vs ORT composite (basic level)", ("ort_custom", "all", opset), ("ort_composite", "basic", opset)),
    ):
        if fused in peaks and composite in peaks:
            ratio = peaks[fused] / peaks[composite] if peaks[composite] else float("inf")
            holds = peaks[fused] < peaks[composite]
            print(f"  {name:48} {peaks[fused]:.1f} MB vs {peaks[composite]:.1f} MB  {'OK' if holds else 'MISSED'}", flush=True)
            results.append(dict(entry=args.entry, target=name, numerator=fused[0], denominator=composite[0],
                                median_ratio=round(ratio, 4), limit="< 1", holds=holds, pairs=1, threads=args.threads,
                                opset=opset, ort_thread_pool="", git_sha=facts["git_sha"],
                                timestamp=facts["timestamp"]))
    return results


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
