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
from lab.files import upsert_csv, write_csv_atomic, read_csv

from .workloads import WORKLOADS

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
COLUMNS = [
    "entry", "workload", "row", "dtype", "shape", "beta", "opset", "exporter", "ort_opt_level", "ort_graph_nodes",
    "execution_provider", "threads", "warmup", "runs", "p20_ms", "p50_ms", "p80_ms", "peak_mb", "memory_method",
    "bytes_moved", "gb_per_s", "fraction_of_copy", "custom_node_share", "torch", "onnx", "onnxruntime", "cuda",
    "driver", "device", "git_sha", "git_dirty", "image", "timestamp",
]
KEY = ["entry", "workload", "row", "dtype", "shape", "beta", "opset", "exporter", "ort_opt_level",
       "execution_provider", "threads"]
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
            paths = models[(name, opset)]
            ort_common = dict(common, opset=opset, exporter=args.exporter)
            specs.append(dict(ort_common, row="ort_composite", ort_opt_level="all", model_path=paths["decomposed"]))
            specs.append(dict(ort_common, row="ort_composite", ort_opt_level="basic", model_path=paths["decomposed"]))
            specs.append(dict(ort_common, row="ort_custom", ort_opt_level="all", model_path=paths["custom"], plugin=plugin))
            if name == "swish":
                specs.append(dict(ort_common, row="ort_copy", ort_opt_level="all", model_path=paths["copy"]))
    return specs


def copy_model(path: Path, opset: int) -> str:
    """x -> Identity -> y: ORT's copy floor for the activation's tensor."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "copy",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 768])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 768])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return str(path)


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
                paths["copy"] = copy_model(out / f"copy-opset{opset}.onnx", opset)
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


def derive(rows: list[dict]) -> None:
    """Bandwidth from the least bytes each workload must move; fraction of the copy floor."""
    copies = {(r["workload"], r["execution_provider"], r["opset"]): r for r in rows if r["row"] in ("torch_copy", "ort_copy")}
    for r in rows:
        workload = WORKLOADS[r["workload"]]
        r["bytes_moved"] = workload.bytes_moved
        r["gb_per_s"] = round(workload.bytes_moved / (r["p50_ms"] * 1e-3) / 1e9, 3)
        copy = copies.get((r["workload"], r["execution_provider"], r["opset"]))
        r["fraction_of_copy"] = round(copy["p50_ms"] / r["p50_ms"], 3) if copy else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--entry", default=matrix.DEFAULT_ENTRY, help="matrix entry (default: cpu)")
    parser.add_argument("--workload", nargs="+", choices=sorted(WORKLOADS), default=["swish", "ffn"])
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
        parser.error(f"entry {args.entry} is a CUDA entry; run its GPU benchmark on a GPU host")
    os.environ["MYOPS_MATRIX_ENTRY"] = args.entry
    from ops.export import newest_opset
    from ort_plugin.build import build as build_plugin

    opsets = args.opsets or sorted({o if o != "newest" else newest_opset(args.exporter) for o in entry["opsets"]})
    facts = provenance.collect()
    print(f"[bench] entry {args.entry}: torch {facts['torch']}, onnxruntime {facts['onnxruntime']}, "
          f"{facts['cpu']} x{facts['cores']}, {args.threads} threads, opsets {opsets}", flush=True)
    plugin = str(build_plugin(log=lambda m: None))
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
            rows.append({
                "entry": args.entry, "workload": spec["workload"], "row": spec["row"], "dtype": "float32",
                "shape": "x".join(map(str, WORKLOADS[spec["workload"]].shape)), "beta": spec["beta"],
                "opset": spec.get("opset"), "exporter": spec.get("exporter"), "ort_opt_level": spec.get("ort_opt_level"),
                "ort_graph_nodes": measured["graph"], "execution_provider": measured["execution_provider"],
                "threads": spec["threads"], "warmup": spec["warmup"], "runs": spec["runs"],
                "p20_ms": measured["p20_ms"], "p50_ms": measured["p50_ms"], "p80_ms": measured["p80_ms"],
                "peak_mb": measured["peak_mb"], "memory_method": measured["memory_method"],
                "custom_node_share": measured.get("custom_node_share"),
                "torch": facts["torch"], "onnx": facts["onnx"], "onnxruntime": facts["onnxruntime"],
                "cuda": facts.get("torch_cuda"), "driver": facts["driver"], "device": facts["gpu"] or facts["cpu"],
                "git_sha": facts["git_sha"], "git_dirty": facts["git_dirty"], "image": facts["image"] or "",
                "timestamp": facts["timestamp"],
            })
        derive(rows)
        target_rows = []
        if not args.no_targets and "swish" in args.workload:
            from .targets import measure_targets

            target_rows = measure_targets(args, models, plugin, rows, facts)

    upsert_csv(out_dir / "bench.csv", rows, COLUMNS, KEY)
    if target_rows:
        from .targets import TARGET_COLUMNS

        write_csv_atomic(out_dir / "targets.csv", target_rows, TARGET_COLUMNS)
    every = [r for path in sorted(args.results.glob("*/bench.csv")) for r in read_csv(path)]
    write_csv_atomic(args.results / "bench_all.csv", every, COLUMNS)
    print(f"[bench] wrote {len(rows)} rows to {out_dir / 'bench.csv'} and {args.results / 'bench_all.csv'}", flush=True)

    from .report import main as report_main

    return report_main(["--results", str(args.results)])


if __name__ == "__main__":
    raise SystemExit(main())
