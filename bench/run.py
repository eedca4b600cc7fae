"""The lab's main job: `python -m bench.run` (what `nox -s bench` runs).

Exports the models, measures every row in a fresh process, derives bandwidth and ratios, writes
results/<entry>/bench.csv (upserted), the aggregate results/bench_all.csv, the paired target
ratios (bench.targets) and the charts and summary (bench.report). Nothing is written until every
row of the run is measured: an interrupted run leaves the previous results as they were.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab import matrix, provenance
from lab.files import write_csv_atomic

from .rows import COLUMNS, KEY, derive, file_sha256, ort_row_specs, record, write_copy_model  # noqa: F401 (COLUMNS, KEY: imported from here elsewhere)
from .rows import write as write_rows
from .workloads import GPU_ONLY_WORKLOADS, WORKLOADS

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
ROW_TIMEOUT_S = 1800


def plan(args, opsets: list[int], models: dict, plugin: str) -> list[dict]:
    """Every row to measure, as specs for bench.measure."""
    specs = []
    for name in args.workload:
        runs = dict(warmup=args.warmup, runs=args.runs) if name == "swish" else dict(warmup=args.ffn_warmup, runs=args.ffn_runs)
        common = dict(workload=name, beta=args.beta, threads=args.threads, **runs)
        torch_rows = ["torch_composite", "torch_extension"] + (["torch_silu"] if args.beta == 1.0 else [])
        torch_rows += [] if args.no_compile else ["torch_compile"]
        torch_rows += ["torch_copy"] if name == "swish" else []
        specs += [dict(common, row=row) for row in torch_rows]
        for opset in opsets:
            specs += ort_row_specs(dict(common, opset=opset, exporter=args.exporter), models[(name, opset)], plugin)
    return specs


def export_models(args, opsets: list[int], out: Path) -> dict:
    from ops import export as E

    models = {}
    for name in args.workload:
        for opset in opsets:
            paths = {}
            for lowering in ("custom", "decomposed"):
                result = E.export(name, exporter=args.exporter, lowering=lowering, opset=opset, beta=args.beta,
                                  path=out / f"{name}-{lowering}-{args.exporter}-opset{opset}.onnx")
                paths[lowering] = result.path
                print(f"[bench] exported {name} {lowering} opset {opset}: {result.graph}", flush=True)
            if name == "swish":
                paths["copy"] = write_copy_model(out / f"copy-opset{opset}.onnx", opset)
            models[(name, opset)] = paths
    return models


def run_row(spec: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-m", "bench.measure", json.dumps(spec)], capture_output=True, text=True,
                            timeout=ROW_TIMEOUT_S, env=env, cwd=REPO)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"row {spec['row']} ({spec['workload']}, opset {spec.get('opset', '-')}) failed:\n{tail}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--entry", default=matrix.DEFAULT_ENTRY, help="matrix entry (default: cpu)")
    parser.add_argument("--workload", nargs="+", choices=sorted(set(WORKLOADS) - set(GPU_ONLY_WORKLOADS)),
                        default=["swish", "ffn"])
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch and ORT intra-op threads")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--ffn-warmup", type=int, default=2, help="the FFN is ~0.4 s a run on 2 CPU cores")
    parser.add_argument("--ffn-runs", type=int, default=10)
    parser.add_argument("--exporter", choices=["dynamo", "torchscript"], default="dynamo")
    parser.add_argument("--opsets", type=int, nargs="+", help="default: the entry's opsets")
    parser.add_argument("--pairs", type=int, default=100, help="alternating A/B pairs per target ratio")
    parser.add_argument("--no-targets", action="store_true", help="skip the paired target ratios")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile reference row")
    parser.add_argument("--profile", action="store_true",
                        help="ORT and torch profiler chrome traces under results/<entry>/traces/ (the summary "
                             "states the custom node's share of the ORT run time)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    entry = matrix.entry(args.entry)
    if entry["device"] != "cpu":
        parser.error(f"entry {args.entry} is a CUDA entry; on a GPU host run `python -m bench.gpu_check` (PyTorch "
                     "rows) and `docker run --gpus all <its infer image> bench --out /results` (ONNX Runtime rows)")
    os.environ["MYOPS_MATRIX_ENTRY"] = args.entry
    from ops.export import newest_opset
    from ort_plugin.build import build as build_plugin

    opsets = args.opsets or sorted({o if o != "newest" else newest_opset(args.exporter) for o in entry["opsets"]})
    facts = provenance.collect()
    print(f"[bench] entry {args.entry}: torch {facts['torch']}, onnxruntime {facts['onnxruntime']}, "
          f"{facts['cpu']} x{facts['cores']}, {args.threads} threads, opsets {opsets}", flush=True)
    plugin = str(build_plugin(log=lambda m: None))
    from ops.build import build as build_extension

    facts["extension_sha256"] = file_sha256(build_extension())
    out_dir = args.results / args.entry
    trace_dir = out_dir / "traces"
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        models = export_models(args, opsets, Path(tmp))
        specs = plan(args, opsets, models, plugin)
        if args.profile:
            trace_dir.mkdir(parents=True, exist_ok=True)
            for spec in specs:
                level = spec.get("ort_opt_level") or "torch"
                spec["profile_prefix"] = str(trace_dir / f"{spec['workload']}-{spec['row']}-{level}-opset{spec.get('opset', '-')}")
        rows = []
        for number, spec in enumerate(specs, 1):
            label = f"{spec['workload']:5} {spec['row']:15} {spec.get('ort_opt_level', ''):5} opset {spec.get('opset', '-')}"
            print(f"[bench {number:2}/{len(specs)}] {label} ...", end=" ", flush=True)
            started = time.perf_counter()
            measured = run_row(spec)
            print(f"p50 {measured['p50_ms']:.3f} ms, peak {measured['peak_mb']:.1f} MB ({time.perf_counter() - started:.0f} s)", flush=True)
            rows.append(record(args.entry, spec, measured, facts))
        derive(rows)
        target_rows = []
        if not args.no_targets and "swish" in args.workload:
            from .targets import measure_targets

            target_rows = measure_targets(args, models, plugin, rows, facts)

    write_rows(args.results, args.entry, rows)
    if target_rows:
        from .targets import TARGET_COLUMNS

        write_csv_atomic(out_dir / "targets.csv", target_rows, TARGET_COLUMNS)
    print(f"[bench] wrote {len(rows)} rows to {out_dir / 'bench.csv'} and {args.results / 'bench_all.csv'}", flush=True)

    from .report import main as report_main

    return report_main(["--results", str(args.results)])


if __name__ == "__main__":
    raise SystemExit(main())
