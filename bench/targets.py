"""Performance targets as ratios of paired measurements: A, B, A, B ... in one process, one run.

The ratio of each pair is taken, and the median of those ratios is the figure: both sides see
the same machine state, so the ratio holds where absolute times drift. CPU default, activation
alone, float32.
"""
from __future__ import annotations

import statistics
import time

from .workloads import WORKLOADS

TARGET_COLUMNS = ["entry", "target", "numerator", "denominator", "median_ratio", "limit", "holds", "pairs",
                  "threads", "opset", "git_sha", "timestamp"]
# (name, numerator, denominator, limit): the target holds when median(A/B) <= limit.
TARGETS = [
    ("ORT custom op vs ORT composite (default level: QuickGelu)", "ort_custom", "ort_composite_all", 1.0),
    ("ORT custom op vs ONNX Swish-24 (ORT's own kernel)", "ort_custom_newest", "ort_standard_swish", 1.0),
    ("ORT custom op vs ORT copy floor", "ort_custom", "ort_copy", 1.3),
    ("extension op vs F.silu", "torch_extension", "torch_silu", 1.05),
    ("extension op vs PyTorch composite", "torch_extension", "torch_composite", 0.7),
]


def _callables(args, models: dict, plugin: str, opset: int, newest: int) -> dict:
    import onnxruntime as ort
    import torch

    import ops
    from ort_plugin import register

    torch.set_num_threads(args.threads)
    ops.load()
    x_np = WORKLOADS["swish"].input(seed=0)
    x = torch.from_numpy(x_np)
    paths = models[("swish", opset)]

    def session(path, with_plugin=False):
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        if with_plugin:
            register(options, plugin)
        s = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        return lambda: s.run(None, {"x": x_np})

    beta = args.beta
    calls = {
        "ort_custom": session(paths["custom"], with_plugin=True),
        "ort_composite_all": session(paths["decomposed"]),
        "ort_copy": session(paths["copy"]),
        "torch_extension": lambda: ops.swish(x, beta),
        "torch_silu": lambda: torch.nn.functional.silu(x),
        "torch_composite": lambda: ops.reference(x, beta),
    }
    if newest != opset:  # from opset 24 the decomposed lowering is the standard Swish op, not a composite
        calls["ort_custom_newest"] = session(models[("swish", newest)]["custom"], with_plugin=True)
        calls["ort_standard_swish"] = session(models[("swish", newest)]["decomposed"])
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


def measure_targets(args, models: dict, plugin: str, rows: list[dict], facts: dict) -> list[dict]:
    from ops.export import uses_standard_swish

    opsets = sorted(opset for (name, opset) in models if name == "swish")
    newest = opsets[-1]
    composite = [o for o in opsets if not uses_standard_swish(o)]
    opset = composite[-1] if composite else newest  # the newest opset whose decomposed graph is Mul/Sigmoid
    calls = _callables(args, models, plugin, opset, newest)
    results = []
    print(f"[bench] paired target ratios ({args.pairs} alternating pairs each, opset {opset}):", flush=True)
    for name, numerator, denominator, limit in TARGETS:
        if (args.beta != 1.0 and denominator == "torch_silu") or numerator not in calls or denominator not in calls:
            continue
        ratio = paired_ratio(calls[numerator], calls[denominator], args.pairs)
        holds = ratio <= limit
        print(f"  {name:48} {ratio:6.3f}x  (target <= {limit}x)  {'OK' if holds else 'MISSED'}", flush=True)
        results.append(dict(entry=args.entry, target=name, numerator=numerator, denominator=denominator,
                            median_ratio=round(ratio, 4), limit=limit, holds=holds, pairs=args.pairs,
                            threads=args.threads, opset=newest if numerator.endswith("_newest") else opset,
                            git_sha=facts["git_sha"], timestamp=facts["timestamp"]))
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
                                opset=opset, git_sha=facts["git_sha"], timestamp=facts["timestamp"]))
    return results
