"""The lab's main job: `python -m bench.run` (what `nox -s bench` runs).

Exports the models and measures every row in interleaved rounds: each round runs every row once in
fresh processes, starting at a rotated position, so that drift of the machine during the run hits
every row alike (one process per workload and framework, rows one after another; in round 1 an ORT
row has a process of its own, which measures its memory). A row's figure is the median over all its processes' runs, with a 95%
interval from a bootstrap over processes and runs (bench.stats). Then the size sweep (bench.sweep)
and the paired target ratios (bench.targets). Writes results/<entry>/bench.csv (upserted), the raw
timings in samples.csv, sweep.csv, targets.csv, the aggregate results/bench_all.csv and the charts
and summary (bench.report). Nothing is written until everything is measured: an interrupted run
leaves the previous results as they were.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from lab import matrix, provenance
from lab.files import upsert_csv, write_csv_atomic

from infer.measure import TORCH_ROWS
from infer.rows import COLUMNS, copy_models, derive, file_sha256, ort_row_specs, record, samples_of  # noqa: F401 (COLUMNS: imported from here elsewhere)
from infer.rows import write as write_rows
from infer.workloads import NATIVE_ROWS, WORKLOADS
from opspec import PRIMARY
from . import run_args
from .cpu_paths import capped_specs, chosen, runnable
from .rounds import run_child, schedule
from .torch_rows import native_applies
from .stats import timing_figures

REPO = Path(__file__).resolve().parent.parent


def plan(args, opsets: list[int], models: dict, plugin: str) -> list[dict]:
    """Every row to measure, as specs for infer.measure (ORT rows) and bench.torch_rows (PyTorch rows)."""
    specs = []
    # torch.compile's row costs ~25 s a workload, most of it compiling: measured at each op's first
    # workload asked for (its headline shape), where it shows what the compiler makes of the composite.
    compiled = {WORKLOADS[name].op: name for name in reversed(args.workload)}
    for name in args.workload:
        workload = WORKLOADS[name]
        runs = dict(warmup=args.warmup, runs=args.runs) if workload.op_alone else \
            dict(warmup=args.ffn_warmup, runs=args.ffn_runs, rounds=args.ffn_rounds)
        common = dict(workload=name, beta=args.beta, threads=args.threads, **runs)
        native = NATIVE_ROWS.get(workload.op)
        torch_rows = ["torch_composite", "torch_extension"] + ([native] if native and native_applies(workload.op, args.beta) else [])
        torch_rows += ["torch_copy", "torch_copy_into"] if workload.op_alone else []
        specs += [dict(common, row=row) for row in torch_rows]
        # A reference row whose every process first compiles for ~8 s: measured in the first round only.
        specs += [] if args.no_compile or compiled[workload.op] != name else [dict(common, row="torch_compile", rounds=1)]
        for opset in opsets:
            specs += ort_row_specs(dict(common, opset=opset, exporter=args.exporter), models[(name, opset)], plugin)
    return specs + capped_specs(specs, args.isa_paths)


def has_targets(workloads: list[str]) -> bool:
    """Whether any of these workloads has paired target ratios: an op-alone workload (the FFN has none) of an
    op that declares targets."""
    from ops.registry import OPS

    return any(WORKLOADS[w].op_alone and OPS[WORKLOADS[w].op].targets for w in workloads)


def export_models(args, opsets: list[int], out: Path) -> dict:
    from ops import export as E

    models = {}
    for name in args.workload:
        workload = WORKLOADS[name]
        for opset in opsets:
            paths = {}
            for lowering in ("custom", "decomposed"):
                result = E.export(workload.model_name, exporter=args.exporter, lowering=lowering, opset=opset,
                                  beta=args.beta, export_shape=(2, 16, workload.hidden),
                                  path=out / f"{name}-{lowering}-{args.exporter}-opset{opset}.onnx")
                paths[lowering] = result.path
                print(f"[bench] exported {name} {lowering} opset {opset}: {result.graph}", flush=True)
            if workload.op_alone:
                paths.update(copy_models(out, opset, workload.hidden))
            models[(name, opset)] = paths
    return models


def row_module(spec: dict) -> str:
    return "bench.torch_rows" if spec["row"] in TORCH_ROWS else "infer.measure"


def run_row(spec: dict) -> dict:
    return run_child(row_module(spec), spec)


def combine(results: list[dict]) -> dict:
    """One row's figures from its processes (one per round): timings pooled, memory from the first."""
    return dict(results[0], **timing_figures([r["seconds"] for r in results]))


def shared_processes(specs: list[dict], order: list[int], first_round: bool = False) -> list[list[int]]:
    """The processes of a round: the rows of one workload, framework (torch or onnxruntime: ORT rows never
    share a process with torch) and CPU path together, each group in the round's order. In the first
    round an ORT row has a process of its own: its peak memory is measured in it (a PyTorch row's is
    measured in a probe process of its own, bench.torch_rows.peak_mb, wherever it is timed)."""
    groups: dict[tuple, list[int]] = {}
    for i in order:
        module = row_module(specs[i])
        alone = first_round and module == "infer.measure"
        key = ("alone", i) if alone else (specs[i]["workload"], module, specs[i].get("isa") or "")
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def measure_rounds(specs: list[dict], rounds: int, label, log=print) -> list[list[dict]]:
    """Each spec measured `rounds` times (fewer where it says so), each time in another fresh process.

    Rows of one workload and framework share a process, one after another in the round's rotated order:
    a process start (2-3 s importing torch) then costs once per group instead of once per row. Peak
    memory is measured in the first round only: an ORT row's in a process of its own, a PyTorch row's in
    its memory probe. Each row still has one process per round, the unit bench.stats and bench.compare
    take the spread over."""
    measured: list[list[dict]] = [[] for _ in specs]
    order = schedule(specs, rounds)
    plan_ = [shared_processes(specs, [i for r, i in order if r == k], first_round=k == 0) for k in range(rounds)]
    total = sum(len(groups) for groups in plan_)
    done = 0
    for k, groups in enumerate(plan_, 1):
        for group in groups:
            done += 1
            head = specs[group[0]]
            started = time.perf_counter()
            if len(group) == 1 and k == 1:
                log(f"[bench {done:3}/{total} round 1/{rounds}] {label(head)} ...", end=" ", flush=True)
                result = run_row(head)
                log(f"p50 {result['p50_ms']:.3f} ms ({time.perf_counter() - started:.0f} s)", flush=True)
                measured[group[0]].append(result)
                continue
            framework = "PyTorch" if row_module(head) == "bench.torch_rows" else "ONNX Runtime"
            log(f"[bench {done:3}/{total} round {k}/{rounds}] {head['workload']:13} {len(group):2} {framework} rows"
                + (f" isa {head['isa']}" if head.get("isa") else "") + " in one process ...", end=" ", flush=True)
            # Peak memory is the same in every round: measured in the first only.
            results = run_child(row_module(head), [dict(specs[i], no_memory=k > 1) for i in group])
            log(f"({time.perf_counter() - started:.0f} s)", flush=True)
            for i, result in zip(group, results, strict=True):
                measured[i].append(result)
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = run_args.parser()
    args = parser.parse_args(argv)
    args.results, why = run_args.destination(args)
    if args.results == run_args.SCRATCH and why != "--results":
        print(f"[bench] writing to {args.results} ({why}), not the committed results/; pass --results results to "
              "write there", flush=True)
    try:
        args.isa_paths = chosen(args.isa, runnable()) if args.isa else []
    except ValueError as exc:
        parser.error(str(exc))
    if args.isa and PRIMARY not in args.workload:
        parser.error(f"--isa measures the first op alone: add {PRIMARY} to --workload")
    if os.environ.get("MYOPS_CPU_ISA"):
        print(f"[bench] note: MYOPS_CPU_ISA={os.environ['MYOPS_CPU_ISA']} is set, so every row without --isa runs "
              "capped to it although its isa column is empty; unset it to measure the widest path", flush=True)
    if args.quick:
        args.rounds, args.runs, args.ffn_runs, args.ffn_warmup, args.pairs, args.target_processes = 2, 30, 3, 1, 30, 1
        args.no_sweep = args.no_compile = True
    counts = ("rounds", "runs", "ffn_rounds", "ffn_runs", "sweep_rounds", "target_processes")
    if min(getattr(args, c) for c in counts) < 1:
        parser.error(f"{', '.join('--' + c.replace('_', '-') for c in counts)} must each be at least 1")

    entry = matrix.entry(args.entry)
    if entry["device"] != "cpu":
        parser.error(f"entry {args.entry} is a CUDA entry; on a GPU host run `python -m bench.gpu_check` (PyTorch "
                     "rows) and `docker run --gpus all <its infer image> bench --out /results` (ONNX Runtime rows)")
    os.environ["MYOPS_MATRIX_ENTRY"] = args.entry
    from ops.export import newest_opset
    from ort_plugin.build import build as build_plugin

    opsets = args.opsets or sorted({o if o != "newest" else newest_opset(args.exporter) for o in entry["opsets"]})
    if args.quick and not args.opsets:
        opsets = opsets[:1]
    started = time.perf_counter()
    facts = provenance.collect()
    print(f"[bench] entry {args.entry}: torch {facts['torch']}, onnxruntime {facts['onnxruntime']}, "
          f"{facts['cpu']} x{facts['cores']}, {args.threads} threads, opsets {opsets}", flush=True)
    plugin = str(build_plugin(entry=args.entry, log=lambda m: None))
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
                spec["profile_prefix"] = str(trace_dir / (f"{spec['workload']}-{spec['row']}-{level}-opset{spec.get('opset', '-')}"
                                                          + (f"-{spec['isa']}" if spec.get("isa") else "")))
        print(f"[bench] {len(specs)} rows x {args.rounds} rounds, a fresh process per workload and framework each round "
              "(in round 1 each ONNX Runtime row alone, which measures its memory)", flush=True)
        measured = measure_rounds(
            specs, args.rounds,
            lambda s: f"{s['workload']:13} {s['row']:15} {s.get('ort_opt_level', ''):5} opset {s.get('opset', '-')}"
                      + (f" isa {s['isa']}" if s.get("isa") else ""))
        rows, samples = [], []
        for spec, results in zip(specs, measured):
            rows.append(record(args.entry, spec, combine(results), facts))
            samples += samples_of(rows[-1], results)
        derive(rows, provenance.cpu_caches())
        print(f"[bench] rows measured ({time.perf_counter() - started:.0f} s since start)", flush=True)
        sweep_rows = []
        if not args.no_sweep and PRIMARY in args.workload:
            from .sweep import run_sweep

            sweep_samples, sweep_rows = run_sweep(args, models, plugin, facts)
            samples += sweep_samples
            print(f"[bench] sweep measured ({time.perf_counter() - started:.0f} s since start)", flush=True)
        target_rows = []
        if not args.no_targets and has_targets(args.workload):
            from .targets import measure_targets

            target_rows = measure_targets(args, models, plugin, rows, facts)
            print(f"[bench] targets measured ({time.perf_counter() - started:.0f} s since start)", flush=True)

    write_rows(args.results, args.entry, rows, samples)
    if sweep_rows:
        from .sweep import SWEEP_COLUMNS

        write_csv_atomic(out_dir / "sweep.csv", sweep_rows, SWEEP_COLUMNS)
    if target_rows:
        from .targets import TARGET_COLUMNS

        # Merged, as bench.csv is: a run of one op's workloads keeps the other op's targets.
        upsert_csv(out_dir / "targets.csv", target_rows, TARGET_COLUMNS, ["entry", "op", "target", "shape"])
    print(f"[bench] wrote {len(rows)} rows to {out_dir / 'bench.csv'} and {args.results / 'bench_all.csv'}", flush=True)

    from .report import main as report_main

    return report_main(["--results", str(args.results)])


if __name__ == "__main__":
    raise SystemExit(main())
