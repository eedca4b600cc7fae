"""A whole model through the chain: `python -m bench.models.run MODEL` (what `nox -s model` runs).

MODEL is a built-in (llama, qwen2, and their -tiny test sizes: bench.models.catalog) or
path/to/file.py:factory. The steps, each with its verdict, stop at the first that fails:
  1. patch      ops.apply on a copy; what it swapped and left alone
  2. layer 1    logits and every parameter's gradient, patched against original
  3. export     the original, and the patched model with both lowerings (custom, decomposed), checked
  4. fuse       ops.fuse on the original's and the decomposed export: one myops node per swapped module
  5. layer 2    each file in ONNX Runtime (the plugin registered) against its torch model, at another shape
  6. graphs     what ORT's optimizer made of each file at the default level
  7. rows       the four rows (and the decomposed and fused files), interleaved rounds of fresh processes
  8. targets    paired ratios in one process: custom export vs the original's, patched vs original,
                the original's export after ops.fuse vs before
  9. profile    each node type's share of ORT's run time, so a reader knows the ceiling
Writes results/<entry>/models/<model>/ (bench.csv, samples.csv, targets.csv, graphs.csv, profile.csv,
steps.csv, summary.md, latency.png) only when every step has passed.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab import matrix, provenance

from bench.rounds import rotation
from bench.stats import summarise, timing_figures
from .rows import ORT_FILES, ROWS

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
# Layer 2's tolerance (the brief), also layer 1's on a whole model: a few float32 roundings per op, through the layers.
RTOL, ATOL = 1e-4, 1e-5
# Gradients are summed over a batch and sequence: their absolute tolerance is relative to the largest gradient.
GRAD_RTOL, GRAD_ATOL_OF_MAX = 1e-4, 1e-5
TARGETS = [  # (name, numerator row, denominator row, limit): holds when the median paired ratio <= limit
    ("ORT custom export vs ORT on the original's export (default level)", "ort_custom", "ort_original", 1.0),
    ("PyTorch patched vs original", "torch_patched", "torch_original", 1.0),
    ("ORT on the original's export after nox -s fuse vs before", "ort_fused", "ort_original", 1.0),
]
ROW_COLUMNS = ["entry", "model", "row", "title", "graph", "shape", "threads", "warmup", "runs", "processes", "p20_ms",
               "p50_ms", "p80_ms", "ci_low_ms", "ci_high_ms", "process_spread", "peak_mb", "memory_method", "torch",
               "onnxruntime", "transformers", "cpu", "host", "git_sha", "git_dirty", "image", "model_sha256", "timestamp"]
SAMPLE_COLUMNS = ["entry", "model", "row", "process", "run", "seconds"]
TARGET_COLUMNS = ["entry", "model", "target", "numerator", "denominator", "shape", "median_ratio", "ci_low", "ci_high",
                  "limit", "holds", "settled", "pairs", "processes", "process_spread", "op_share", "git_sha", "timestamp"]
STEP_COLUMNS = ["step", "verdict", "detail"]


class StepFailed(RuntimeError):
    """A step's verdict is FAIL; the message says what differs, by how much."""


def log(message: str) -> None:
    print(message, flush=True)


# ---------------------------------------------------------------- steps 1-5 (in this process)

def _torch_inputs(feed: dict):
    import torch

    return {name: torch.from_numpy(value) for name, value in feed.items()}


def _float_outputs(output) -> list:
    import torch

    values = output.values() if isinstance(output, dict) else (output,) if isinstance(output, torch.Tensor) else output
    return [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]


def layer1(case, original, patched) -> str:
    """Outputs and every parameter's gradient of the patched model against the original's."""
    import torch

    feed = _torch_inputs(case.inputs(*case.export_shape, 1))
    worst_output = worst_grad = 0.0
    results = []
    for model in (original, patched):
        model.zero_grad(set_to_none=True)
        outputs = _float_outputs(model(**feed, **case.kwargs))
        sum(o.float().pow(2).mean() for o in outputs).backward()
        results.append((outputs, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (a_out, a_grad), (b_out, b_grad) = results
    for k, (a, b) in enumerate(zip(a_out, b_out, strict=True)):
        a, b = a.detach(), b.detach()
        if a.shape != b.shape or not torch.allclose(b, a, rtol=RTOL, atol=ATOL):
            worst = float((a - b).abs().max()) if a.shape == b.shape else float("nan")
            raise StepFailed(f"output {k} differs by up to {worst:.3e} (shapes {list(a.shape)}, {list(b.shape)}); "
                             f"allowed: rtol {RTOL}, atol {ATOL}")
        worst_output = max(worst_output, float((a - b).abs().max()))
    if set(a_grad) != set(b_grad):
        raise StepFailed(f"the patched model's parameters with gradients differ: {sorted(set(a_grad) ^ set(b_grad))}")
    # Judged against the model's scale, not each parameter's own: a key bias's gradient is zero in exact
    # math (softmax ignores a shift shared by every score), 3e-12 in float32, and no relative tolerance
    # of that noise can hold.
    scale = max((float(grad.abs().max()) for grad in a_grad.values()), default=0.0)
    atol = GRAD_ATOL_OF_MAX * scale
    for name, grad in a_grad.items():
        difference = float((grad - b_grad[name]).abs().max())
        allowed = (atol + GRAD_RTOL * grad.abs()).double()
        if not bool(((grad - b_grad[name]).abs().double() <= allowed).all()):
            raise StepFailed(f"gradient of {name} differs by up to {difference:.3e} (its largest |gradient| "
                             f"{float(grad.abs().max()):.3e}); allowed: rtol {GRAD_RTOL} and atol {atol:.3e} "
                             f"({GRAD_ATOL_OF_MAX} of the model's largest |gradient|, {scale:.3e})")
        worst_grad = max(worst_grad, difference)
    original.zero_grad(set_to_none=True)
    patched.zero_grad(set_to_none=True)
    return (f"outputs within {worst_output:.2e} (rtol {RTOL}, atol {ATOL}); {len(a_grad)} parameters' gradients within "
            f"{worst_grad:.2e} (rtol {GRAD_RTOL}, atol {GRAD_ATOL_OF_MAX} of the model's largest |gradient|, {scale:.2e})")


def export_all(case, original, patched, out: Path, *, exporter: str, opset: int, external_data: bool | None = None) -> dict:
    import torch

    from ops.model_export import export_model

    example = {**_torch_inputs(case.inputs(*case.export_shape, 0)), **case.kwargs}
    files = {}
    with torch.no_grad():
        for kind, model, lowering in (("original", original, "decomposed"), ("custom", patched, "custom"),
                                      ("decomposed", patched, "decomposed")):
            started = time.perf_counter()
            result = export_model(model, example, out / f"{kind}.onnx", exporter=exporter, lowering=lowering,
                                  opset=opset, dynamic_shapes=case.dynamic_shapes, external_data=external_data)
            files[kind] = result
            apart = f", weights in {Path(result.external_data).name}" if result.external_data else ""
            log(f"[model]   {kind:10} {exporter} opset {opset}: myops nodes {result.myops_nodes or 'none'}{apart} "
                f"({time.perf_counter() - started:.0f} s)")
    return files


@dataclass
class FusedFile:
    path: str
    sha256: str
    outputs: list
    myops_nodes: dict
    external_data: str | None = None  # fuse writes a model back as it read it: its data file beside it


def fuse_exports(files: dict, plugin: str, work: Path) -> str:
    """ops.fuse on the original's and the decomposed export: each must come out with the myops nodes of
    the custom export (one per op call), proven in ORT; the original's, rewritten, is measured as a row."""
    import hashlib

    import onnx

    from ops.fuse import FuseError, fuse

    wanted = {f"myops::{op_type}": n for op_type, n in files["custom"].myops_nodes.items()}
    details = []
    for kind in ("original", "decomposed"):
        target = work / f"{kind}.fused.onnx"
        try:
            result = fuse(files[kind].path, target, plugin=plugin, log=lambda line: None)
        except FuseError as exc:
            raise StepFailed(f"fuse {kind}.onnx: {exc}") from None
        found = {t: n for t, n in result.after.items() if t.startswith("myops::")}
        leftover = sorted(t for t in result.after if t.split("::")[-1] in FUSED_AWAY)
        if found != wanted or leftover:
            raise StepFailed(f"fuse {kind}.onnx gave {found} (want {wanted}, as the custom export)"
                             + (f", and left {leftover}" if leftover else ""))
        details.append(f"{kind}.onnx: " + ", ".join(result.report.lines()) + f"; {result.proof[-1]}")
        if kind == "original":
            proto = onnx.load(str(target), load_external_data=False)
            data = target.with_name(f"{target.name}.data")
            files["fused"] = FusedFile(str(target), hashlib.sha256(target.read_bytes()).hexdigest(),
                                       [o.name for o in proto.graph.output], found, str(data) if data.exists() else None)
    return "; ".join(details)


# Node types that must be gone from a fused file: the ops' pieces and ORT's fusions of them.
FUSED_AWAY = ("Sigmoid", "Pow", "ReduceMean", "Sqrt", "Reciprocal", "QuickGelu", "SimplifiedLayerNormalization",
              "RMSNormalization")


def layer2(case, original, patched, files: dict, plugin: str, threads: int) -> str:
    import torch

    from infer.model_files import session

    feed = case.inputs(*case.check_shape, 2)
    details = []
    for kind, result in files.items():
        model = original if kind in ("original", "fused") else patched
        with torch.no_grad():
            expected = _float_outputs(model(**_torch_inputs(feed), **case.kwargs))
        got = [value for value in session(result.path, plugin, threads=threads).run(None, feed) if value.dtype.kind == "f"]
        if len(got) != len(expected):
            raise StepFailed(f"{kind}.onnx has {len(got)} float outputs, the torch model {len(expected)}")
        for name, want, have in zip(result.outputs, expected, got, strict=False):
            want = want.numpy()
            if have.shape != want.shape or not np.allclose(have, want, rtol=RTOL, atol=ATOL):
                worst = float(np.abs(have - want).max()) if have.shape == want.shape else float("nan")
                raise StepFailed(f"{kind}.onnx's {name} at {shape_label(feed)} differs from torch: max abs {worst:.3e} "
                                 f"(rtol {RTOL}, atol {ATOL}; shapes {list(have.shape)} vs {list(want.shape)})")
            details.append(f"{kind} {float(np.abs(have - want).max()):.1e}")
    return f"at {shape_label(feed)} (export {shape_label(case.inputs(*case.export_shape, 0))}), max abs: " + \
        ", ".join(details)


def shape_label(feed: dict) -> str:
    """The inputs' real shapes, as the rows are labelled: "input_ids 1x128", "pixel_values 1x3x224x224"."""
    return ", ".join(f"{name} {'x'.join(map(str, np.shape(value)))}" for name, value in feed.items())


def graphs(files: dict, plugin: str, threads: int, work: Path) -> list[dict]:
    """Node types in each file and in what ORT's default level made of it."""
    import onnx
    import onnxruntime as ort

    from ort_plugin import register

    rows = []
    for kind, result in files.items():
        optimised = work / f"{kind}.optimised.onnx"
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = threads
        options.optimized_model_filepath = str(optimised)
        if result.external_data:  # what ORT made of a model past 2 GB must keep its weights apart too
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                             f"{optimised.name}.data")
        register(options, plugin)
        ort.InferenceSession(result.path, options, providers=["CPUExecutionProvider"])
        before = _node_types(onnx.load(result.path, load_external_data=False))
        after = _node_types(onnx.load(str(optimised), load_external_data=False))
        for node_type in sorted(set(before) | set(after), key=lambda t: (-after.get(t, 0), t)):
            rows.append(dict(file=f"{kind}.onnx", node_type=node_type, exported=before.get(node_type, 0),
                             after_ort=after.get(node_type, 0)))
    return rows


def _node_types(model) -> Counter:
    return Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


# ---------------------------------------------------------------- steps 6-8 (fresh processes)

def run_child(spec: dict, timeout: int = 3600):
    from infer.measure import timing_child_env

    done = subprocess.run([sys.executable, "-m", "bench.models.rows", json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout, env=timing_child_env(REPO), cwd=REPO)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise StepFailed(f"{spec.get('row', spec.get('mode'))} failed:\n{tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_rows(base: dict, files: dict, rounds: int) -> dict:
    rows = list(ROWS)
    measured = {row: [] for row in rows}
    total = rounds * len(rows)
    done = 0
    for k in range(rounds):
        for i in rotation(len(rows), rounds, k):
            row = rows[i]
            done += 1
            started = time.perf_counter()
            spec = dict(base, row=row, model_path=files[ORT_FILES[row]].path if row in ORT_FILES else None)
            result = run_child(spec)
            measured[row].append(result)
            log(f"[model {done:2}/{total} round {k + 1}/{rounds}] {row:15} p50 {result['p50_ms']:9.2f} ms "
                f"({time.perf_counter() - started:.0f} s)")
    return measured


def measure_targets(base: dict, files: dict, processes: int, pairs: int) -> list[dict]:
    spec = dict(base, mode="pairs", pairs=pairs, models={kind: r.path for kind, r in files.items()},
                targets=[(name, a, b) for name, a, b, _ in TARGETS])
    per_process = []
    for number in range(1, processes + 1):
        started = time.perf_counter()
        per_process.append(run_child(spec))
        log(f"[targets {number}/{processes}] {pairs} pairs each ({time.perf_counter() - started:.0f} s)")
    combined = []
    for name, numerator, denominator, limit in TARGETS:
        summary = summarise([process[name] for process in per_process])
        combined.append(dict(target=name, numerator=numerator, denominator=denominator, ratio=summary.median,
                             ci_low=summary.ci_low, ci_high=summary.ci_high, limit=limit, pairs=pairs,
                             processes=summary.processes, process_spread=summary.process_spread))
    return combined


def profile(base: dict, files: dict, work: Path, runs: int) -> dict:
    return {kind: run_child(dict(base, mode="profile", model_path=files[kind].path, runs=runs,
                                 profile_prefix=str(work / f"profile-{kind}")))
            for kind in ("original", "custom")}


# Node types that are the ops' work, in each graph: ours, ORT's fusions of them, and the original's pieces.
OP_NODE_TYPES = {
    "rms_norm": ("RMSNorm", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization",
                 "Pow", "ReduceMean", "Sqrt", "Reciprocal", "Div"),
    "swish": ("Swish", "QuickGelu", "Sigmoid"),
}


def op_shares(shares: dict) -> dict:
    """Each op's share of a run: the node types that do its work. Approximate in the original graph,
    where Add and Mul serve the ops and the rest alike and are left out."""
    return {op: round(sum(shares.get(t, 0.0) for t in types), 4) for op, types in OP_NODE_TYPES.items()}


# ---------------------------------------------------------------- writing

def write_results(out_dir: Path, tables: dict[str, tuple[list[dict], list[str]]], summary: str, rows: list[dict]) -> None:
    """Everything into a temporary folder beside the target, then swapped in: a run leaves all or nothing."""
    from lab.files import write_csv_atomic

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}-"))
    try:
        for name, (table, columns) in tables.items():
            write_csv_atomic(staging / name, table, columns)
        (staging / "summary.md").write_text(summary)
        chart(rows, staging / "latency.png")
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out_dir, old)
            os.replace(staging, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def chart(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 3.2))
    titles = [r["title"] for r in rows][::-1]
    medians = [float(r["p50_ms"]) for r in rows][::-1]
    errors = [[m - float(r["ci_low_ms"]) for m, r in zip(medians, rows[::-1])],
              [float(r["ci_high_ms"]) - m for m, r in zip(medians, rows[::-1])]]
    ax.barh(titles, medians, xerr=errors, color="#4477aa")
    ax.set_xlabel("median latency per forward (ms), 95% interval")
    ax.set_title(f"{rows[0]['model']}: {rows[0]['shape']}\n{rows[0]['threads']} threads ({rows[0]['entry']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the long row titles and the shapes stay whole
    plt.close(fig)


def render_summary(name: str, case, facts: dict, steps: list[dict], rows: list[dict], targets: list[dict],
                   graph_rows: list[dict], shares: dict, patch_report: str) -> str:
    lines = [f"# {name}: the whole model", "", case.description or "", "",
             f"torch {facts.get('torch')}, onnxruntime {facts.get('onnxruntime')}, {facts.get('cpu')} x{facts.get('cores')}, "
             f"git {str(facts.get('git_sha'))[:12]}{' (dirty)' if facts.get('git_dirty') else ''}, {facts.get('timestamp')}", "",
             "## Steps", "", "| step | verdict | detail |", "|---|---|---|"]
    lines += [f"| {s['step']} | {s['verdict']} | {s['detail']} |" for s in steps]
    lines += ["", "What ops.apply swapped:", "", "```", patch_report, "```", "",
              f"## Rows ({rows[0]['shape']}, {rows[0]['threads']} threads, {rows[0]['processes']} processes x {rows[0]['runs']} runs)",
              "", "| row | median ms | 95% interval | process spread | peak MB |", "|---|---|---|---|---|"]
    lines += [f"| {r['title']} | {float(r['p50_ms']):.2f} | {float(r['ci_low_ms']):.2f}-{float(r['ci_high_ms']):.2f} | "
              f"{float(r['process_spread']):.1%} | {r['peak_mb']} |" for r in rows]
    lines += ["", "## Targets (paired ratios in one process)", "",
              "| target | median ratio | 95% interval | limit | holds | the ops' share of the denominator's time |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['median_ratio']:.3f}x | {t['ci_low']:.3f}-{t['ci_high']:.3f} | {t['limit']} | "
              f"{'yes' if t['holds'] else 'NO'}{'' if t['settled'] else ' (within noise: the interval holds the limit)'} | "
              f"{t['op_share']} |" for t in targets]
    lines += ["", "## Where ORT's time goes (profiler, default level)", ""]
    for kind, result in shares.items():
        top = list(result["shares"].items())[:8]
        lines.append(f"- {kind}.onnx: " + ", ".join(f"{op} {share:.1%}" for op, share in top)
                     + "; the ops: " + ", ".join(f"{op} {share:.1%}" for op, share in op_shares(result["shares"]).items()))
    lines += ["", "## What ORT's optimizer did (default level)", "", "| file | node type | exported | ORT ran |",
              "|---|---|---|---|"]
    lines += [f"| {g['file']} | {g['node_type']} | {g['exported']} | {g['after_ort']} |" for g in graph_rows
              if g["exported"] != g["after_ort"] or "myops" in g["node_type"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.models.run", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a built-in model (llama, qwen2, llama-tiny, qwen2-tiny) or path/to/file.py:factory")
    parser.add_argument("--entry", default=matrix.DEFAULT_ENTRY)
    parser.add_argument("--exporter", choices=["dynamo", "torchscript"], default="dynamo")
    parser.add_argument("--opset", type=int, default=18)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per row, interleaved")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runs", type=int, default=8, help="timed forwards per process")
    parser.add_argument("--pairs", type=int, default=20, help="alternating pairs per target and process")
    parser.add_argument("--target-processes", type=int, default=3)
    parser.add_argument("--profile-runs", type=int, default=10)
    parser.add_argument("--shape", help="batch x seq of the measured rows, e.g. 1x128 (default: the model's)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--external-data", action="store_true",
                        help="export with the weights in a data file beside each model (a model past 2 GB always is)")
    args = parser.parse_args(argv)
    if min(args.rounds, args.runs, args.pairs, args.target_processes, args.profile_runs) < 1:
        parser.error("--rounds, --runs, --pairs, --target-processes and --profile-runs must each be at least 1")
    entry = matrix.entry(args.entry)
    if entry["device"] != "cpu":
        parser.error(f"entry {args.entry} is a CUDA entry: whole-model rows run on the CPU entry here")
    os.environ["MYOPS_MATRIX_ENTRY"] = args.entry
    try:
        return _run(args)
    except StepFailed as exc:
        log(f"[model] FAIL: {exc}\n[model] nothing was written")
        return 1


def _run(args) -> int:
    import torch

    import ops
    from ops.export import ExportError
    from ort_plugin.build import build as build_plugin
    from ops.build import build as build_extension

    from . import catalog

    started = time.perf_counter()
    try:
        case = catalog.load(args.model)
    except catalog.ModelSpecError as exc:
        raise StepFailed(str(exc)) from None
    if args.shape:
        batch, _, seq = args.shape.partition("x")
        case.bench_shape = (int(batch), int(seq))
    name = catalog.slug(args.model)
    facts = provenance.collect()
    try:
        import transformers
        facts["transformers"] = transformers.__version__
    except ImportError:
        facts["transformers"] = None
    plugin = str(build_plugin(entry=args.entry, log=lambda m: None))
    build_extension()
    torch.set_num_threads(args.threads)
    log(f"[model] {name}: {case.description or type(case.model).__name__}; torch {facts['torch']}, onnxruntime "
        f"{facts['onnxruntime']}, {args.threads} threads")
    steps = []

    def passed(step: str, detail: str) -> None:
        steps.append(dict(step=step, verdict="PASS", detail=detail))
        log(f"[model] {step:9} PASS  {detail}")

    original = case.model.eval()
    patched = copy.deepcopy(original)
    patch = ops.apply(patched)
    if not patch.swapped:
        raise StepFailed("ops.apply swapped nothing in this model:\n" + patch.report())
    passed("patch", f"{len(patch.swapped)} modules swapped ({', '.join(f'{n} x myops::{op}' for op, n in sorted(patch.counts().items()))}), "
                    f"{len(patch.left_alone)} left alone")
    try:
        passed("layer 1", layer1(case, original, patched))
    except (AssertionError, StepFailed) as exc:
        raise StepFailed(f"layer 1: {str(exc).splitlines()[0]}") from None
    with tempfile.TemporaryDirectory(prefix="model-") as tmp:
        work = Path(tmp)
        try:
            files = export_all(case, original, patched, work, exporter=args.exporter, opset=args.opset,
                               external_data=True if args.external_data else None)
        except ExportError as exc:
            raise StepFailed(f"export: {exc}") from None
        passed("export", "; ".join(f"{kind}.onnx {r.myops_nodes or 'no myops node'}"
                                   + (f" (weights in {Path(r.external_data).name})" if r.external_data else "")
                                   for kind, r in files.items()))
        passed("fuse", fuse_exports(files, plugin, work))
        passed("layer 2", layer2(case, original, patched, files, plugin, args.threads))
        graph_rows = graphs(files, plugin, args.threads, work)
        made = {kind: sorted(g["node_type"] for g in graph_rows if g["file"] == f"{kind}.onnx"
                             and g["after_ort"] > g["exported"]) for kind in files}
        passed("graphs", "; ".join(f"{kind}: ORT made {', '.join(types) or 'no new node type'}"
                                   for kind, types in made.items()))
        inputs = work / "inputs.npz"
        bench_feed = case.inputs(*case.bench_shape, 0)
        np.savez(inputs, **bench_feed)
        base = dict(model=args.model, inputs=str(inputs), threads=args.threads, warmup=args.warmup, runs=args.runs,
                    plugin=plugin)
        log(f"[model] rows: {len(ROWS)} x {args.rounds} rounds, a fresh process each, {args.runs} runs after "
            f"{args.warmup} warm-up at {shape_label(bench_feed)}")
        measured = measure_rows(base, files, args.rounds)
        log(f"[model] paired targets: {args.pairs} pairs each in {args.target_processes} processes")
        target_results = measure_targets(base, files, args.target_processes, args.pairs)
        shares = profile(base, files, work, args.profile_runs)
        model_digest = {kind: r.sha256 for kind, r in files.items()}
    shape = shape_label(bench_feed)
    graph_of = {"torch_original": "eager", "torch_patched": ", ".join(f"{n} x myops::{op}" for op, n in sorted(patch.counts().items()))}
    for row, kind in ORT_FILES.items():
        # the myops nodes it runs and the node types ORT's optimizer made (its fusions)
        graph_of[row] = "+".join(sorted({g["node_type"] for g in graph_rows if g["file"] == f"{kind}.onnx" and g["after_ort"]
                                         and (g["node_type"].startswith("myops") or g["after_ort"] > g["exported"])})) \
            or "standard ops"
    rows, samples = [], []
    for row, results in measured.items():
        figures = timing_figures([r["seconds"] for r in results])
        rows.append(dict(entry=args.entry, model=name, row=row, title=ROWS[row], graph=graph_of[row], shape=shape,
                         threads=args.threads, warmup=args.warmup, runs=args.runs, **figures,
                         peak_mb=results[0]["peak_mb"], memory_method=results[0]["memory_method"],
                         model_sha256=model_digest.get(ORT_FILES.get(row, "")), **{k: facts.get(k) for k in (
                             "torch", "onnxruntime", "transformers", "cpu", "host", "git_sha", "git_dirty", "image",
                             "timestamp")}))
        samples += [dict(entry=args.entry, model=name, row=row, process=p, run=i, seconds=round(s, 9))
                    for p, r in enumerate(results) for i, s in enumerate(r["seconds"])]
    denominators = {"ort_original": op_shares(shares["original"]["shares"]),
                    "torch_original": op_shares(shares["original"]["shares"])}
    targets = []
    for t in target_results:
        share = ", ".join(f"{op} {s:.1%}" for op, s in denominators[t["denominator"]].items())
        if t["denominator"] == "torch_original":
            share += " (ORT's profile of the original)"
        targets.append(dict(entry=args.entry, model=name, target=t["target"], numerator=t["numerator"],
                            denominator=t["denominator"], shape=shape, median_ratio=round(t["ratio"], 4),
                            ci_low=round(t["ci_low"], 4), ci_high=round(t["ci_high"], 4), limit=t["limit"],
                            holds=t["ratio"] <= t["limit"], settled=not t["ci_low"] <= t["limit"] <= t["ci_high"],
                            pairs=t["pairs"], processes=t["processes"],
                            process_spread=round(t["process_spread"], 4), op_share=share,
                            git_sha=facts["git_sha"], timestamp=facts["timestamp"]))
        log(f"  {t['target']:66} {t['ratio']:.3f}x [{t['ci_low']:.3f}-{t['ci_high']:.3f}] (target <= {t['limit']}x) "
            f"{'OK' if t['ratio'] <= t['limit'] else 'MISSED'}"
            f"{'' if t['ci_low'] > t['limit'] or t['ci_high'] < t['limit'] else ' (within noise)'}; the ops' share: {share}")
    profile_rows = [dict(file=f"{kind}.onnx", node_type=op, share=share) for kind, r in shares.items()
                    for op, share in r["shares"].items()]
    out_dir = args.results / args.entry / "models" / name
    summary = render_summary(name, case, facts, steps, rows, targets, graph_rows, shares, patch.report())
    write_results(out_dir, {
        "bench.csv": (rows, ROW_COLUMNS), "samples.csv": (samples, SAMPLE_COLUMNS), "targets.csv": (targets, TARGET_COLUMNS),
        "steps.csv": (steps, STEP_COLUMNS), "graphs.csv": (graph_rows, ["file", "node_type", "exported", "after_ort"]),
        "profile.csv": (profile_rows, ["file", "node_type", "share"]),
    }, summary, rows)
    log(f"[model] wrote {out_dir} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
