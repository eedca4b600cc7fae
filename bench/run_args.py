"""bench.run's options, and where a run writes: light enough to print `nox -s bench -- --help` with no
numpy, torch or image (opspec, lab.matrix and bench.cpu_paths import nothing heavy)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from lab import matrix, provenance
from opspec import TORCH_OPS

from .cpu_paths import PATHS

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
# Where a smoke run or a run of work in progress goes, so that the committed results stay as they were.
SCRATCH = REPO / "build" / "results"
DESCRIPTION = "The lab's main job: export the models, measure every row, write results/<entry>/."
CPU_WORKLOADS = tuple(w.name for spec in TORCH_OPS.values() for w in spec.workloads if not w.gpu_only)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=DESCRIPTION)
    parser.add_argument("--entry", default=matrix.DEFAULT_ENTRY, help="matrix entry (default: cpu)")
    parser.add_argument("--workload", nargs="+", choices=sorted(CPU_WORKLOADS), default=list(CPU_WORKLOADS),
                        help="default: every op's CPU workloads (opspec/<op>.py)")
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch and ORT intra-op threads")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--ffn-warmup", type=int, default=2, help="the FFN is ~0.4 s a run on 2 CPU cores")
    parser.add_argument("--ffn-runs", type=int, default=6, help="per process")
    parser.add_argument("--ffn-rounds", type=int, default=2,
                        help="processes per FFN row, at most --rounds (its matmuls set its time; the activation is "
                             "what differs)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="fresh processes per row, interleaved: each round runs every row once, rotated")
    parser.add_argument("--no-sweep", action="store_true", help="skip the size sweep of the activation alone")
    parser.add_argument("--sweep-rounds", type=int, default=2, help="processes per implementation in the sweep")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 2 rounds, fewer runs, one opset, no sweep, no torch.compile, 30 pairs in one process")
    parser.add_argument("--exporter", choices=["dynamo", "torchscript"], default="dynamo")
    parser.add_argument("--opsets", type=int, nargs="+", help="default: the entry's opsets")
    parser.add_argument("--pairs", type=int, default=100, help="alternating A/B pairs per target ratio")
    parser.add_argument("--target-processes", type=int, default=3,
                        help="fresh processes the target pairs run in (the interval is over processes, then pairs)")
    parser.add_argument("--no-targets", action="store_true", help="skip the paired target ratios")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile reference row (otherwise measured at each op's first workload)")
    parser.add_argument("--profile", action="store_true",
                        help="ORT and torch profiler chrome traces under results/<entry>/traces/ (the summary "
                             "states the custom node's share of the ORT run time)")
    parser.add_argument("--isa", nargs="+", choices=["all", *PATHS], default=[],
                        help="also measure the extension and the plugin's op on these CPU paths (MYOPS_CPU_ISA), "
                             "each as rows of their own: `--isa all` takes every path this CPU runs")
    parser.add_argument("--results", type=Path,
                        help=f"where results/<entry>/ is written (default: {RESULTS.name}/, but {SCRATCH.relative_to(REPO)}/ for a --quick "
                             "run or one of an op whose files are not committed)")
    return parser


def destination(args) -> tuple[Path, str]:
    """Where the run writes, and why there: --results if given; else the scratch folder for a --quick
    run or one measuring an op whose files are not committed (its rows would mix work in progress into
    the committed results); else results/."""
    if args.results is not None:
        return args.results, "--results"
    if args.quick:
        return SCRATCH, "a --quick run"
    ops = sorted({spec.name for spec in TORCH_OPS.values() for w in spec.workloads if w.name in args.workload})
    uncommitted = {op: files for op in ops if (files := provenance.uncommitted_op_files(op))}
    if uncommitted:
        op, files = next(iter(uncommitted.items()))
        return SCRATCH, f"{op}'s files are not committed ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})"
    return RESULTS, "the default"
