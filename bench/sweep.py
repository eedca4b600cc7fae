"""The activation alone across sizes: how each implementation's bandwidth changes as the tensor
leaves the caches. A process per implementation and round sweeps every size (bench.run hands one
process the implementations of a framework as a list):

    python -m bench.sweep '{"row": "ort_custom", "model_path": ..., "plugin": ..., "threads": 2, ...}'

prints {rows_of_768: [seconds, ...]} as JSON on its last line. Inputs are (1, rows, 768) float32,
from 3,072 to 50,331,648 elements (about 2^11.6 to 2^25.6): the models' hidden size is fixed at 768
and their batch and sequence are dynamic. Each size gets about the same wall time, so small sizes
get many runs and the largest a few.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from infer.measure import _ort_row, keep_freed_blocks
from opspec import OPS, PRIMARY

from .torch_rows import native_applies, row_callable
from infer.workloads import BYTES_FP32

HIDDEN = 768
# The first op's (opspec.PRIMARY) study: its native function's row (F.silu for the seed's Swish)
NATIVE_ROW = OPS[PRIMARY].native_row
SWEEP_ROWS = [  # (row, ORT level): the four-row comparison's rows, the native function's and every copy
    ("torch_composite", ""), ("torch_extension", ""), *(((NATIVE_ROW, ""),) if NATIVE_ROW else ()),
    ("torch_copy", ""), ("torch_copy_into", ""),
    ("ort_composite", "all"), ("ort_custom", "all"), ("ort_copy", "all"), ("ort_plugin_copy", "all"),
]
SEQ = [2**k for k in range(2, 17)]   # rows of 768
SECONDS_PER_SIZE = 0.08
RUNS = (3, 100)                      # at least, at most


def elements(seq: int) -> int:
    return seq * HIDDEN


def bytes_moved(seq: int) -> int:
    return 2 * elements(seq) * BYTES_FP32


def _callable(spec: dict, x: np.ndarray, work: Path):
    if spec["row"].startswith("torch_"):
        return row_callable(dict(spec, workload=PRIMARY), (x,))[0]
    return _ort_row(spec, (x,), work).call


def sweep(spec: dict) -> dict[int, list[float]]:
    timings = {}
    with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
        for seq in spec.get("seq", SEQ):
            x = np.random.default_rng(seq).standard_normal((1, seq, HIDDEN), dtype=np.float32)
            call = _callable(spec, x, Path(tmp))
            start = time.perf_counter()
            call()
            call()
            estimate = max((time.perf_counter() - start) / 2, 1e-7)
            runs = int(min(max(SECONDS_PER_SIZE / estimate, RUNS[0]), RUNS[1]))
            seconds = []
            for _ in range(runs):
                start = time.perf_counter()
                call()
                seconds.append(time.perf_counter() - start)
            timings[seq] = seconds
            del call
    return timings


def main(argv: list[str]) -> int:
    """One implementation (a JSON object), or several one after another (a JSON list, one framework)."""
    given = json.loads(argv[0])
    specs = given if isinstance(given, list) else [given]
    os.environ.setdefault("OMP_NUM_THREADS", str(specs[0]["threads"]))
    keep_freed_blocks()
    results = [{str(k): v for k, v in sweep(spec).items()} for spec in specs]
    print(json.dumps(results if isinstance(given, list) else results[0]))
    return 0


# ---------------------------------------------------------------- the sweep as bench.run runs it

SWEEP_COLUMNS = ["entry", "row", "ort_opt_level", "opset", "threads", "shape", "elements", "bytes_moved", "regime",
                 "processes", "runs", "p50_ms", "ci_low_ms", "ci_high_ms", "gb_per_s", "git_sha", "timestamp"]


def sweep_specs(args, models: dict, plugin: str, opset: int) -> list[dict]:
    paths = models[(PRIMARY, opset)]
    model_of = {"ort_composite": paths["decomposed"], "ort_custom": paths["custom"], "ort_copy": paths["copy"],
                "ort_plugin_copy": paths["plugin_copy"]}
    rows = [r for r in SWEEP_ROWS if r[0] != NATIVE_ROW or native_applies(PRIMARY, args.beta)]
    return [dict(row=row, beta=args.beta, threads=args.threads, ort_opt_level=level or None,
                 opset=opset if level else None, exporter=args.exporter if level else None,
                 model_path=model_of.get(row), plugin=plugin) for row, level in rows]


def run_sweep(args, models: dict, plugin: str, facts: dict) -> tuple[list[dict], list[dict]]:
    """The sweep's raw samples (workload "sweep", shape 1xSEQx768) and one summary row per implementation and size."""
    from lab.provenance import cpu_caches

    from infer.rows import memory_regime, samples_of
    from .rounds import run_child, schedule
    from .stats import summarise

    opset = max(o for (name, o) in models if name == PRIMARY)
    specs = sweep_specs(args, models, plugin, opset)
    caches = cpu_caches()
    print(f"[bench] size sweep: {len(specs)} implementations x {len(SEQ)} sizes ({elements(SEQ[0]):,} to "
          f"{elements(SEQ[-1]):,} elements), {args.sweep_rounds} processes each; caches {caches}", flush=True)
    timings: list[list[dict]] = [[] for _ in specs]
    order = schedule(specs, args.sweep_rounds)
    # A process per framework and round (ORT's never imports torch), its implementations in the round's order.
    processes = [[i for r, i in order if r == k and specs[i]["row"].startswith(prefix)]
                 for k in range(args.sweep_rounds) for prefix in ("torch_", "ort_")]
    processes = [group for group in processes if group]
    for done, group in enumerate(processes, 1):
        started = time.perf_counter()
        for i, result in zip(group, run_child("bench.sweep", [specs[i] for i in group]), strict=True):
            timings[i].append(result)
        print(f"[sweep {done:2}/{len(processes)}] {', '.join(specs[i]['row'] for i in group)} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    samples, rows = [], []
    for spec, per_process in zip(specs, timings):
        for seq in SEQ:
            key = dict(entry=args.entry, workload="sweep", row=spec["row"], dtype="float32", shape=f"1x{seq}x{HIDDEN}",
                       beta=args.beta, opset=spec["opset"], exporter=spec["exporter"],
                       ort_opt_level=spec["ort_opt_level"],
                       execution_provider="torch-cpu" if spec["row"].startswith("torch_") else "CPUExecutionProvider",
                       threads=args.threads)
            groups = [process[str(seq)] for process in per_process]
            samples += samples_of(key, [{"seconds": g} for g in groups])
            summary = summarise(groups)
            rows.append(dict(entry=args.entry, row=spec["row"], ort_opt_level=spec["ort_opt_level"], opset=spec["opset"],
                             threads=args.threads, shape=key["shape"], elements=elements(seq),
                             bytes_moved=bytes_moved(seq), regime=memory_regime(bytes_moved(seq), caches, args.threads),
                             processes=summary.processes, runs=summary.runs, p50_ms=round(summary.median * 1e3, 5),
                             ci_low_ms=round(summary.ci_low * 1e3, 5), ci_high_ms=round(summary.ci_high * 1e3, 5),
                             gb_per_s=round(bytes_moved(seq) / summary.median / 1e9, 3),
                             git_sha=facts.get("git_sha"), timestamp=facts.get("timestamp")))
    return samples, rows


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
