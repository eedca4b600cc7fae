"""Charts and summaries from the result CSVs alone: `python -m bench.report` (`nox -s report`).

Reads results/<entry>/bench.csv, samples.csv, sweep.csv and targets.csv; writes, per entry,
latency.png, memory.png, sweep.png and summary.md in the reference table's layout, and
results/across_entries.png. Where an entry has samples.csv, every timing figure is recomputed from
those samples (bench.cpu_summary lays its tables out). PyTorch-only entries (bench.gpu_check on a
GPU host) are laid out per dtype. Without matplotlib (a bare GPU host) the summaries are still
written and the charts skipped.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from lab.files import read_csv, write_text_atomic

from infer.workloads import WORKLOADS
from opspec import OPS, PRIMARY

from . import cpu_summary
from .cpu_summary import SHORT
from .stats import timing_figures

# What infer.measure.keep_freed_blocks (PyTorch rows) and timing_child_env (every timing process) do.
TORCH_ALLOCATION = ("glibc malloc keeps freed blocks (no mmap, no trim, no per-thread cache), as a caching allocator would: each call "
                    "reuses the previous call's buffers, like ORT's arena")

RESULTS = Path(__file__).resolve().parent.parent / "results"
# The four rows of the reference table, then the reference rows.
FOUR_ROWS = [
    ("PyTorch composite ops", "torch_composite", ""),
    ("PyTorch custom C++ extension", "torch_extension", ""),
    ("ONNX Runtime, native composite (default level)", "ort_composite", "all"),
    ("ONNX Runtime, native composite (BASIC level)", "ort_composite", "basic"),
    ("ONNX Runtime, custom op", "ort_custom", "all"),
]
# each op's native function as its declaration writes it (F.silu(x) -> torch.nn.functional.silu)
NATIVE_TITLES = {spec.native_row: "torch.nn.functional." + spec.native_function.removeprefix("F.")
                 for spec in OPS.values() if spec.native_row and spec.native.startswith("F.")}
REFERENCE_ROWS = [
    *((NATIVE_TITLES.get(spec.native_row, f"PyTorch's own ({spec.native_row})"), spec.native_row, "")
      for spec in OPS.values() if spec.native_row),
    ("torch.compile(composite)", "torch_compile", ""),
    ("copy, PyTorch (clone)", "torch_copy", ""),
    ("copy, PyTorch (copy_ into a preallocated tensor)", "torch_copy_into", ""),
    ("copy, ONNX Runtime (Identity)", "ort_copy", "all"),
    ("copy, the plugin's myops::Copy (the elementwise ops' threading and buffers)", "ort_plugin_copy", "all"),
]
BACKWARD_ROWS = [
    ("PyTorch composite, backward (autograd)", "torch_composite_backward", ""),
    ("PyTorch custom C++ extension, backward", "torch_extension_backward", ""),
    *((f"{NATIVE_TITLES.get(spec.native_row, spec.native_row)}, backward", f"{spec.native_row}_backward", "")
      for spec in OPS.values() if spec.native_row),
]
ALL_ROWS = FOUR_ROWS + REFERENCE_ROWS + BACKWARD_ROWS
# The first op's first (opspec.PRIMARY: the seed's Swish), then the others' as opspec declares them.
WORKLOAD_TITLES = {name: w.title for name, w in sorted(WORKLOADS.items(), key=lambda item: item[1].op != PRIMARY)}
DTYPES = ["float32", "float16", "bfloat16"]


def _op(row: dict) -> str:
    """The row's op; rows written before the op column were all the first op's."""
    return row.get("op") or PRIMARY


def _coefficient(row: dict) -> str:
    """What parametrises the row's op: Swish's beta (the bench's --beta); another op's attributes are
    its declared defaults."""
    spec = OPS[_op(row)]
    if "beta" in spec.attributes:
        return f"beta {row['beta']}"
    return ", ".join(f"{spec.torch_attribute(name)} {value:g}" for name, value in spec.attributes.items()) or "no attributes"


def _pick(rows, row, level, key, value):
    """The row measured for `key` == value (opset or dtype); opset-less rows serve every opset."""
    for r in rows:
        if r["row"] == row and (r["ort_opt_level"] or "") == level and (not r[key] or r[key] == value):
            return r
    return None


def series(rows) -> tuple[str, list[str]]:
    """What the bars and tables of an entry are split by: ONNX opsets, else dtypes (torch-only rows)."""
    opsets = _opsets(rows)
    if opsets:
        return "opset", opsets
    found = {r["dtype"] for r in rows}
    return "dtype", [d for d in DTYPES if d in found] + sorted(found - set(DTYPES))


def workloads(rows) -> list[str]:
    found = {r["workload"] for r in rows}
    return [w for w in WORKLOAD_TITLES if w in found] + sorted(found - set(WORKLOAD_TITLES))


def _f(value) -> float | None:
    return float(value) if value not in (None, "", "None") else None


def _mb(value) -> str:
    return f"{_f(value):.1f}" if _f(value) is not None else "n/a"


def summary_table(rows: list[dict], workload: str, value: str, key: str = "opset") -> list[str]:
    """One workload's rows as a markdown table. Where rows have a device time (GPU rows), it gets a
    column with its noise, and ratios and bandwidth use it; the per-call time is what a caller waits
    for. Cold device times and the fraction of peak bandwidth get columns where rows have them."""
    rows = [r for r in rows if r["workload"] == workload]
    base = _pick(rows, "torch_composite", "", key, value)
    device = any(_f(r.get("device_ms")) for r in rows)
    cold = any(_f(r.get("device_cold_ms")) for r in rows)
    peak = any(_f(r.get("fraction_of_peak")) for r in rows)
    time_of = (lambda r: _f(r.get("device_ms")) or float(r["p50_ms"])) if device else (lambda r: float(r["p50_ms"]))
    header = "| implementation | " + ("per call p50 ms (p20-p80) | device ms (noise)" if device else "p50 ms (p20-p80)")
    header += " | cold device ms (noise)" if cold else ""
    lines = [header + " | peak MB | vs PyTorch composite | GB/s | of copy floor" + (" | of peak BW" if peak else "")
             + " | graph ORT ran |",
             "|---|---|" + ("---|" if device else "") + ("---|" if cold else "") + ("---|" if peak else "")
             + "---|---|---|---|---|"]

    def timed(ms, noise) -> str:
        if not _f(ms):
            return " | -"
        return f" | {_f(ms):.4f}" + (f" ({_f(noise) * 100:.1f} %)" if _f(noise) is not None else "")

    for label, row, level in ALL_ROWS:
        r = _pick(rows, row, level, key, value)
        if r is None:
            continue
        p50 = float(r["p50_ms"])
        base_row = _pick(rows, "torch_composite_backward", "", key, value) if row.endswith("_backward") else base
        ratio = f"{time_of(r) / time_of(base_row):.2f}x" if base_row else "-"
        copy = f"{float(r['fraction_of_copy']):.2f}" if _f(r["fraction_of_copy"]) else "-"
        graph = r["ort_graph_nodes"] if row.startswith("ort_") else "-"
        device_cell = timed(r.get("device_ms"), r.get("device_noise")) if device else ""
        cold_cell = timed(r.get("device_cold_ms"), r.get("device_cold_noise")) if cold else ""
        peak_cell = (f" | {_f(r.get('fraction_of_peak')):.2f}" if _f(r.get("fraction_of_peak")) else " | -") if peak else ""
        lines.append(f"| {label} | {p50:.3f} ({float(r['p20_ms']):.3f}-{float(r['p80_ms']):.3f}){device_cell}{cold_cell} "
                     f"| {_mb(r['peak_mb'])} | {ratio} | {_f(r['gb_per_s']) or 0:.1f} | {copy}{peak_cell} | {graph} |")
    return lines


def _opsets(rows):
    return sorted({r["opset"] for r in rows if r["opset"]}, key=int)


def chart(rows: list[dict], entry: str, metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = workloads(rows)
    key, values_of_key = series(rows)
    if key == "opset":  # ORT rows are float32; a GPU entry's float16/bfloat16 torch rows have no ORT counterpart
        rows = [r for r in rows if r["dtype"] in ("float32", "")]
    present = {r["row"] for r in rows}
    layout = [(label, row, level) for label, row, level in ALL_ROWS if row in present]
    fig, axes = plt.subplots(1, len(shown), figsize=(7 * len(shown), 4.8), squeeze=False)
    for ax, workload in zip(axes[0], shown):
        labels = [label for label, _, _ in layout]
        width = 0.8 / max(len(values_of_key), 1)
        for i, value in enumerate(values_of_key):
            values, errors = [], [[], []]
            for _, row, level in layout:
                r = _pick([x for x in rows if x["workload"] == workload], row, level, key, value)
                values.append((_f(r[metric]) or 0.0) if r else 0.0)
                # The 95% interval of the median where the row has one (latency from samples).
                low, high = (_f(r.get("ci_low_ms")), _f(r.get("ci_high_ms"))) if r and metric == "p50_ms" else (None, None)
                errors[0].append(values[-1] - low if low is not None else 0.0)
                errors[1].append(high - values[-1] if high is not None else 0.0)
            ax.barh([y + i * width for y in range(len(labels))], values, height=width, xerr=errors, capsize=2,
                    label=f"opset {value}" if key == "opset" else value)
        ax.set_yticks([y + width * (len(values_of_key) - 1) / 2 for y in range(len(labels))], labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("p50 latency (ms), 95% interval" if metric == "p50_ms" else "peak memory above baseline (MB)")
        shape = next(r["shape"] for r in rows if r["workload"] == workload)
        ax.set_title(f"{entry}: {workload} {shape}" + (" float32" if key == "opset" else ""))
        ax.legend(fontsize=8, title="ORT rows" if key == "opset" else "dtype", title_fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def across_entries(all_rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = sorted({r["entry"] for r in all_rows})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(len(entries), 1)
    labels = [label for label, _, _ in FOUR_ROWS]
    for i, entry in enumerate(entries):
        rows = [r for r in all_rows if r["entry"] == entry and r["workload"] == PRIMARY
                and r["dtype"] in ("float32", "")]
        opsets = _opsets(rows)
        values = [float(r["p50_ms"]) if (r := _pick(rows, row, level, "opset", opsets[-1] if opsets else "")) else 0.0
                  for _, row, level in FOUR_ROWS]
        device = rows[0]["device"] if rows else entry
        ax.bar([x + i * width for x in range(len(labels))], values, width=width, label=f"{entry} ({device})")
    ax.set_xticks([x + width * (len(entries) - 1) / 2 for x in range(len(labels))], labels, fontsize=7, rotation=12)
    ax.set_ylabel("p50 latency (ms), activation 8x512x768 float32")
    ax.set_title("The four rows across matrix entries (newest opset)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def from_samples(rows: list[dict], groups: dict) -> None:
    """Every timing figure of the rows recomputed from their samples (where they have them)."""
    for r in rows:
        g = groups.get(cpu_summary._key(r))
        if g:
            r.update(timing_figures(g))


def sampled_summary(entry_dir: Path, rows: list[dict], groups: dict, sweep: list[dict], targets: list[dict],
                    capped: list[dict] = ()) -> str:
    entry = entry_dir.name
    first = rows[0]
    per_workload = {}
    for r in rows:
        if r["row"] != "torch_compile":
            per_workload[r["workload"]] = max(per_workload.get(r["workload"], 1), int(r["processes"] or 1))
    processes = ", ".join(f"{n} per {w} row" for w, n in per_workload.items())
    lines = [f"# Benchmark summary: entry `{entry}`", "",
             provenance_line(rows), "",
             f"Latency: rows ran in fresh processes ({processes}; torch.compile, a reference row that compiles "
             "for seconds in each, in one), in interleaved rounds (each round runs every "
             "row once, starting at a rotated position, so that the machine's drift hits every row alike). p50 is "
             "the median of all runs; the 95% interval comes from a bootstrap over processes and the runs within "
             "them; process spread is (slowest - fastest process median) / median, what a re-run can move. Rows "
             "whose intervals overlap cannot be told apart: the 'within noise of' column names them. A row that "
             "does not differ across opsets is shown once. Every latency figure here is recomputed from samples.csv. "
             f"Memory: {first['memory_method']}. GB/s: the least bytes the workload must move over p50; 'of its floor' "
             "is the fastest copy of the same framework (PyTorch: clone or copy_ into a preallocated tensor; ORT: "
             "Identity or the plugin's myops::Copy, which runs on the elementwise ops' threading and buffers) over the row "
             "(1.00 = as fast as that copy).", "",
             "Reading the PyTorch rows: they allocate their output on every call, and the composite two more "
             f"temporaries of the same size. In their timing processes {TORCH_ALLOCATION}; copy_ into a "
             "preallocated tensor allocates nothing. ORT rows write into their arena, which ORT keeps. The paired ratios under Targets compare rows side by side in warm "
             "processes.", "",
             *chart_links(rows)]
    labels = ALL_ROWS
    for workload in workloads(rows):
        wrows = [r for r in rows if r["workload"] == workload]
        runs = f"{wrows[0]['warmup']} warm-ups and {wrows[0]['runs']} runs per process"
        title = WORKLOAD_TITLES.get(workload, workload)
        lines += [f"## {title}, {wrows[0]['shape']}, {_coefficient(wrows[0])} ({runs})", ""]
        lines += cpu_summary.workload_lines(wrows, groups, labels, SHORT) + [""]
    lines += cpu_summary.isa_lines(list(capped), rows, groups)
    if sweep:
        heading, *rest = cpu_summary.sweep_lines(sweep)
        lines += [heading, *_other_run_note(sweep, rows), *rest, "![sweep](sweep.png)", ""]
    shares = [r for r in rows if _f(r.get("custom_node_share"))]
    if shares:
        lines += ["## Profile", ""] + [f"- {r['workload']} opset {r['opset']}: the myops custom node takes "
                                       f"{float(r['custom_node_share']) * 100:.1f} % of the session's run time" for r in shares] + [""]
    heading, *rest = _targets_table(targets) or [None]
    return "\n".join(lines + ([heading, *_other_run_note(targets, rows), *rest] if heading else []))


def _other_run_note(section: list[dict], rows: list[dict]) -> list[str]:
    """A note under a section older than the newest rows of the ops it covers (each op alone: a target's
    op; the sweep is Swish's): a later run passed --no-sweep or --no-targets (bench.csv is upserted, so
    other rows, the FFN's say, may still be as old as the section)."""
    stamps = [r.get("timestamp") or "" for r in section]
    ops = {r.get("op") for r in section} - {None, ""} or {PRIMARY}
    newest_rows = max((r.get("timestamp") or "" for r in rows if r.get("workload") in ops), default="")
    if not all(stamps) or not newest_rows or max(stamps) >= newest_rows:
        return []
    sha = (section[0].get("git_sha") or "")[:12]
    return ["", f"_Measured in an earlier run than the newest rows above ({max(stamps)}, git {sha}): that run "
            "skipped this part, so it may not match them._"]


def summary(entry_dir: Path, rows: list[dict], targets: list[dict]) -> str:
    entry = entry_dir.name
    first = rows[0]
    key, values_of_key = series(rows)
    if any(r["execution_provider"] == "torch-cuda" for r in rows):  # gpu_check's rows, maybe with the infer image's
        found = {r["dtype"] for r in rows}
        return _gpu_summary(entry, rows, targets, [d for d in DTYPES if d in found] + sorted(found - set(DTYPES)))
    lines = [f"# Benchmark summary: entry `{entry}`", "",
             provenance_line(rows), "",
             "Latency: median (p50) of timed runs after warm-ups, `time.perf_counter`; each row in a fresh process. "
             f"Memory: {first['memory_method']}. GB/s: the least bytes the workload must move (read x, write y) "
             "over p50; 'of copy floor' is the copy's p50 over the row's (1.00 = as fast as a plain copy).", "",
             "Reading the PyTorch rows: they allocate their output on every call, and the composite two more "
             "temporaries of the same size; glibc returns blocks that large to the kernel when freed, so every "
             "call page-faults them in again, which is most of the composite's time on a VM like this one. The "
             "peaks of PyTorch rows are measured in a process of their own with every large block mmapped, after "
             "one untimed call: the bytes live during a call, without start-up or allocator caching; ORT rows "
             "count their arena's growth, which ORT keeps. The paired ratios under Targets compare rows side by "
             "side in one warm process.", "",
             *chart_links(rows)]
    for workload in workloads(rows):
        wrows = [r for r in rows if r["workload"] == workload]
        runs = f"{wrows[0]['warmup']} warm-ups, {wrows[0]['runs']} runs"
        for opset in _opsets(wrows):
            title = WORKLOAD_TITLES.get(workload, workload)
            lines += [f"## {title}, {wrows[0]['shape']}, {_coefficient(wrows[0])}, opset {opset} ({runs})", ""]
            lines += summary_table(wrows, workload, opset) + [""]
    shares = [r for r in rows if _f(r.get("custom_node_share"))]
    if shares:
        lines += ["## Profile", ""] + [f"- {r['workload']} opset {r['opset']}: the myops custom node takes "
                                       f"{float(r['custom_node_share']) * 100:.1f} % of the session's run time" for r in shares] + [""]
    lines += _targets_table(targets)
    return "\n".join(lines)


def _targets_table(targets: list[dict]) -> list[str]:
    if not targets:
        return []
    processes = max((int(t["processes"]) for t in targets if t.get("processes")), default=1)
    lines = [f"## Targets (paired ratios, A B A B in each of {processes} processes; the interval is over processes, "
             "then pairs)" if processes > 1 else "## Targets (paired ratios, A B A B in one process)", ""]
    pools = sorted({t.get("ort_thread_pool") for t in targets} - {None, ""})
    if pools:
        lines += [f"ORT sessions in the pairs: {'; '.join(pools)} (a pool per session keeps spinning after "
                  "its run and slows the other side's next run on a 2-core machine).", ""]
    lines += ["| target | shape | measured [95% CI] | limit | holds | against |", "|---|---|---|---|---|---|"]
    for t in targets:
        ci = f" [{float(t['ci_low']):.3f}-{float(t['ci_high']):.3f}]" if t.get("ci_low") else ""
        holds = "yes" if t["holds"] == "True" else "NO"
        if t.get("ci_low") and _f(t["ci_low"]) <= _f(t["limit"]) <= _f(t["ci_high"]):
            holds += " (its interval spans the limit: within noise of it)"
        lines.append(f"| {t['target']} | {t.get('shape') or '-'} | {float(t['median_ratio']):.3f}x{ci} | {t['limit']} "
                     f"| {holds} | {t.get('note') or t['denominator']} |")
    return lines + [""]


def provenance_line(rows: list[dict], gpu: bool = False) -> str:
    """Where and when the rows shown were measured, read off those rows: one value where they agree,
    each value (with how many rows) where they do not (bench.csv is upserted, so a run of some
    workloads leaves the others' rows from an earlier run or machine)."""
    def values(key: str, short=lambda v: v) -> str:
        counts: dict[str, int] = {}
        for r in rows:
            value = short(str(r.get(key) or "-"))
            counts[value] = counts.get(value, 0) + 1
        if len(counts) == 1:
            return next(iter(counts))
        return "; ".join(f"{value} ({n} rows)" for value, n in counts.items())

    dirty = any(str(r.get("git_dirty")) == "True" for r in rows)
    stamps = sorted(str(r.get("timestamp") or "") for r in rows if r.get("timestamp"))
    when = (stamps[0] if stamps[0] == stamps[-1] else f"from {stamps[0]} to {stamps[-1]}") if stamps else "-"
    versions = (f"driver {values('driver')}; torch {values('torch')} (CUDA {values('cuda')})" if gpu else
                f"torch {values('torch')}, onnx {values('onnx')}, onnxruntime {values('onnxruntime')}; "
                f"{values('threads')} threads")
    return (f"Device: {values('device')} (host {values('host')}); {versions}; "
            f"git {values('git_sha', lambda v: v[:12])}{' (dirty)' if dirty else ''}; measured {when}" + ("" if gpu else "."))


def _gpu_summary(entry: str, rows: list[dict], targets: list[dict], dtypes: list[str]) -> str:
    ort_rows = [r for r in rows if r["execution_provider"] == "CUDAExecutionProvider"]
    first = next(r for r in rows if r["execution_provider"] == "torch-cuda")
    lines = [f"# Benchmark summary: entry `{entry}` (GPU, PyTorch rows)", "",
             provenance_line([r for r in rows if r["execution_provider"] == "torch-cuda"], gpu=True)
             + " by `python -m bench.gpu_check`.", "",
             f"Timing: {first.get('timing_method') or 'CUDA events around each run'}. Per call is what a caller "
             "waits for (dispatch and launch included); device is what the GPU spends. Memory: "
             f"{first['memory_method']}. GB/s: the least bytes a row must move (forward: read x, write y; backward: "
             "read grad and x, write dx) over the device time; 'of copy floor' is the row's GB/s over the copy's; "
             "'of peak BW' is it over the device's peak DRAM bandwidth (NVML: top memory clock x bus width x 2; above "
             "1 only for rows whose data stays in L2). Device times are warm (batches back to back) and cold (one "
             "call after L2 was flushed), each sampled until its noise (relative standard deviation, in brackets) is "
             "under the limit or the time cap is reached. Ratios compare warm device times. Backward rows compare "
             "with the composite's autograd. TF32: "
             f"{first.get('tf32') or 'not recorded'}.", "",
             *([f"ONNX Runtime rows (the infer image's `bench` on this host, onnxruntime {ort_rows[0]['onnxruntime']}, "
                f"opset {ort_rows[0]['opset']}, CUDA EP with io binding, TF32 {ort_rows[0].get('tf32') or 'not recorded'}): "
                f"{ort_rows[0].get('timing_method') or 'timed on the host between two stream synchronisations'}; "
                f"memory: {ort_rows[0]['memory_method']}; 'of copy floor' against ORT's Identity.", ""]
               if ort_rows else []),
             *(line for latency, memory in chart_names(rows).values()
               for line in (f"![latency]({latency})", "", f"![memory]({memory})", ""))]
    for workload in workloads(rows):
        wrows = [r for r in rows if r["workload"] == workload]
        runs = f"{wrows[0]['warmup']} warm-ups, {wrows[0]['runs']} runs"
        for dtype in [d for d in dtypes if any(r["dtype"] == d for r in wrows)]:
            title = WORKLOAD_TITLES.get(workload, workload)
            lines += [f"## {title}, {wrows[0]['shape']}, {dtype}, {_coefficient(wrows[0])} ({runs})", ""]
            lines += summary_table(wrows, workload, dtype, key="dtype") + [""]
    return "\n".join(lines + _targets_table(targets))


def chart_names(rows: list[dict]) -> dict[str, tuple[str, str]]:
    """Per op, its latency and memory charts: the first op's keep their names, other ops' are prefixed."""
    ops = sorted({_op(r) for r in rows}, key=lambda op: (op != PRIMARY, op))
    return {op: ("latency.png", "memory.png") if op == PRIMARY else (f"{op}_latency.png", f"{op}_memory.png")
            for op in ops}


def charts(entry_dir: Path, rows: list[dict]) -> bool:
    if not charts_possible():
        return False
    for op, (latency, memory) in chart_names(rows).items():
        mine = [r for r in rows if _op(r) == op]
        chart(mine, entry_dir.name, "p50_ms", entry_dir / latency)
        chart(mine, entry_dir.name, "peak_mb", entry_dir / memory)
    return True


def chart_links(rows: list[dict]) -> list[str]:
    lines = []
    for op, (latency, memory) in chart_names(rows).items():
        lines += [f"![{op} latency]({latency})", "", f"![{op} memory]({memory})", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    entry_dirs = sorted(p.parent for p in args.results.glob("*/bench.csv"))
    if not entry_dirs:
        print(f"error: no results/<entry>/bench.csv under {args.results}: run `nox -s bench` first")
        return 1
    all_rows = []
    for entry_dir in entry_dirs:
        rows = read_csv(entry_dir / "bench.csv")
        # Rows capped to one CPU path (bench.run --isa) get a section of their own, not a place in the tables.
        capped = [r for r in rows if r.get("isa")]
        rows = [r for r in rows if not r.get("isa")]
        if not rows:
            print(f"[report] {entry_dir}: only rows capped to one CPU path; run `nox -s bench` for the others")
            continue
        all_rows += rows
        targets = read_csv(entry_dir / "targets.csv")
        groups = cpu_summary.sample_groups(read_csv(entry_dir / "samples.csv"))
        sweep = read_csv(entry_dir / "sweep.csv")
        if groups:
            from_samples(rows + capped, groups)
        drawn = charts(entry_dir, rows)
        if drawn and sweep:
            cpu_summary.sweep_chart(sweep, entry_dir.name, entry_dir / "sweep.png")
        sampled = groups and not any(r["execution_provider"] == "torch-cuda" for r in rows)
        text = (sampled_summary(entry_dir, rows, groups, sweep, targets, capped) if sampled
                else summary(entry_dir, rows, targets))
        write_text_atomic(entry_dir / "summary.md", text)
        drawn_names = [name for pair in chart_names(rows).values() for name in pair]
        print(f"[report] {entry_dir}/summary.md" + (", " + ", ".join(drawn_names) + (", sweep.png" if sweep else "")
                                                   if drawn else
                                                   " (no matplotlib here: charts skipped, run `nox -s report` later)"))
    if charts_possible():
        across_entries(all_rows, args.results / "across_entries.png")
        print(f"[report] {args.results / 'across_entries.png'}")
    return 0


def charts_possible() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(main())
