"""The GPU check, one command on one CUDA host: `python -m bench.gpu_check [--out results] [--entry ID]`.

Needs a CUDA build of PyTorch, numpy, pytest, nvcc and a C++ compiler; no internet, no onnxruntime-gpu,
no nox. Finishes in about 3 minutes on one H200. Stages, each with a time budget (bench/gpu/, one job
per module):

  1 preflight  the GPU, the toolkit, the matrix entry, provenance (bench.gpu.host)
  2 build      the extension for this GPU's architecture only, and bench/gpu/plugin_harness.cu
               (bench.gpu.build, bench.gpu.plugin)
  3 suite      the test suite's CUDA cases, `pytest -m cuda` on tests/test_<op>.py and
               tests/test_plugin_cuda.py, against the extension and harness just built
               (bench.gpu.suite): layer 1 of every op in float32, float16 and bfloat16 (edge values,
               views, tensors beyond one grid, a side stream, RMSNorm's kernel edges), the plugin's CUDA
               kernel against its float64 reference (the harness, and onnxruntime's CUDA EP where there
               is one); the tolerances are the ops' declarations (opspec/<op>.py)
  4 bench      PyTorch rows and the copy floor for results/<entry>/bench.csv, per call and device time,
               warm and cold (L2 flushed), each sampled until its noise is under 0.5 % or its time cap
               (bench.gpu.rows, bench.cuda_timing), at the workloads opspec/<op>.py declares
  5 targets    paired device-time ratios, the plugin's kernel against a copy, the memory saved,
               results/<entry>/targets.csv (bench.gpu.targets)
  6 write      the CSVs (only when every correctness check passed)

Exit status: 0 when every correctness check passes (missed performance targets are reported, not
failures; what the host lacks, such as an onnxruntime-gpu for its CUDA, is a SKIP with the reason),
1 when one fails, 2 when this host cannot run the check (no CUDA device, no nvcc, no pytest, bad entry).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from opspec import PRIMARY

from .gpu import plugin, rows, suite, targets
from .gpu.build import build_extension
from .gpu.host import HostError, Setup, no_gpu_message, preflight
from .gpu.stages import Run, log

REPO = Path(__file__).resolve().parent.parent
BUILD_DIR = REPO / "build" / "gpu_check"
RESULTS = REPO / "results"
BUDGETS_S = {"preflight": 20, "build": 150, "suite": 150, "bench": 200, "targets": 25, "write": 10}


def write_results(out: Path, entry: str, measured: list[dict], found: list[dict]) -> None:
    from lab.files import upsert_csv, write_csv_atomic

    from infer.rows import COLUMNS, KEY, write_aggregate
    from .targets import TARGET_COLUMNS  # bench.targets: the one format of every targets.csv, CPU or GPU

    entry_dir = out / entry
    upsert_csv(entry_dir / "bench.csv", measured, COLUMNS, KEY)
    if found:
        write_csv_atomic(entry_dir / "targets.csv", found, TARGET_COLUMNS)
    write_aggregate(out)
    log(f"wrote {len(measured)} rows to {entry_dir / 'bench.csv'}, {len(found)} targets to {entry_dir / 'targets.csv'}, "
        f"and {out / 'bench_all.csv'}")
    from .report import main as report

    report(["--results", str(out)])  # summary.md per entry; charts where matplotlib is installed


# ---------------------------------------------------------------- summary and main

def summary(run: Run, found: list[dict]) -> None:
    from .targets import target_status  # bench.targets

    print("\n==== correctness " + "=" * 80)
    for c in run.checks:
        short = c.detail.strip().splitlines()[0][:100] if c.detail.strip() else ""
        print(f"{c.status:4}  {c.stage:9} {c.name:68} {short}")
    if found:
        print("\n==== targets (median of paired ratios; missed targets are reported, not failures) " + "=" * 15)
        print(f"{'target (holds when measured <= limit)':100} {'measured':>8}  {'limit':>7}  status")
        for t in found:
            limit = float(t["limit"])
            print(f"{t['target']:100} {t['median_ratio']:8.3f}  {limit:7.4g}  {target_status(t['median_ratio'], limit)}")
    for note in run.notes:
        print(f"note: {note}")
    failed = [c for c in run.checks if c.status == "FAIL"]
    elapsed = time.monotonic() - run.started
    print(f"\n[gpu_check] {len(run.checks) - len(failed)} of {len(run.checks)} checks passed or skipped, "
          f"{len(failed)} failed; {elapsed:.0f} s in all", flush=True)


def suite_stage(run: Run, setup: Setup, harness: Path | None) -> None:
    """The suite's cuda tests in a child pytest, on the extension and the harness this run built."""
    import ops

    # An empty MYOPS_PLUGIN_HARNESS: the build stage failed it (and said so); the suite skips its tests.
    env = {"MYOPS_EXTENSION_LIBRARY": str(ops.load()), "MYOPS_MATRIX_ENTRY": setup.entry,
           "MYOPS_PLUGIN_HARNESS": str(harness or "")}
    for check in suite.run_suite(env, timeout=max(run.left(), 60)):
        run.record(check)


def load_plugin_on_cuda(run: Run, setup: Setup) -> None:
    """setup.ort_plugin for the per-call target, where onnxruntime has a CUDA EP (else a note)."""
    try:
        _, setup.ort_plugin, _ = plugin.cuda_session_factory(setup.arch, setup.entry, BUILD_DIR / "ort_plugin",
                                                             run.left())
    except plugin.Unavailable as exc:
        run.notes.append(f"targets: ORT custom op per call skipped: {exc}")


def first_op_runs() -> str:
    """The first op's model (opspec.PRIMARY: the op alone, its weights as parameters) on the GPU, on ones."""
    import torch

    from ops.registry import OPS as TORCH_OPS

    op = TORCH_OPS[PRIMARY]
    x = torch.ones(2, 4, device=rows.DEVICE)
    out = op.build_model(PRIMARY, hidden=4).to(rows.DEVICE)(*[x] * len(op.spec.graph_inputs))
    return str((out[0] if isinstance(out, tuple) else out).tolist())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: results/)")
    parser.add_argument("--entry", help="CUDA matrix entry for the rows (default: the one matching torch's CUDA)")
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=100, help="alternating A/B pairs per target ratio")
    parser.add_argument("--max-noise", type=float, default=0.5,
                        help="device times: sample until their relative noise is at most this percent (nvbench's 0.5)")
    parser.add_argument("--min-samples", type=int, default=10, help="device times: at least this many samples")
    parser.add_argument("--time-cap", type=float, default=0.5,
                        help="device times: at most this many seconds per row and mode (nvbench's 15 would take "
                             "84 rows x 2 modes x 15 s where the noise stays above the limit)")
    parser.add_argument("--time-limit", type=float, default=sum(BUDGETS_S.values()),
                        help=f"seconds for all stages together (default {sum(BUDGETS_S.values())})")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("error: torch is not importable: this check needs a CUDA build of PyTorch", file=sys.stderr)
        return 2
    with warnings.catch_warnings():  # a CUDA build without a driver warns; the one line below says it all
        warnings.simplefilter("ignore")
        available = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if not available:
        print(f"error: {no_gpu_message(torch)}", file=sys.stderr)
        return 2

    run = Run(args.time_limit, BUDGETS_S)
    try:
        with run.stage("preflight"):
            setup = preflight(args, torch)
    except HostError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    harness = None
    with run.stage("build"):
        started = plugin.start_harness_build(setup.nvcc, setup.arch, BUILD_DIR)
        built = run.check("build", "extension built for this GPU and loaded", lambda: build_extension(setup, run))

        def harness_built():
            nonlocal harness
            harness = plugin.finish_harness_build(started, timeout=max(run.left(), 60))
            return str(harness)

        run.check("build", "plugin harness compiled with nvcc", harness_built)
        if built:
            built = run.check("build", "the op runs on this GPU", first_op_runs)
    if not built:
        summary(run, [])
        return 1

    with run.stage("suite"):
        suite_stage(run, setup, harness)
    with run.stage("bench"):
        measured = rows.bench_stage(run, setup, args)
    with run.stage("targets"):
        load_plugin_on_cuda(run, setup)
        found = targets.targets_stage(run, setup, args) + targets.memory_targets(setup, measured)
        for name, extra in (("plugin kernel vs copy", lambda: targets.plugin_kernel_targets(setup, harness)),
                            ("ORT custom op per call", lambda: targets.ort_per_call_target(setup, args))):
            try:
                found += extra()
            except Exception as exc:  # reported, like a missed target, not a correctness failure
                run.notes.append(f"targets: {name} failed: {type(exc).__name__}: {exc}")
    with run.stage("write"):
        if run.failed:
            log("not writing results: a correctness check failed (see the summary)")
        else:
            write_results(args.out, setup.entry, measured, found)
    summary(run, found)
    return 1 if run.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
