"""Charts and summaries from the result CSVs alone: `python -m bench.report` (`nox -s report`).

Reads results/<entry>/bench.csv and targets.csv; writes, per entry, latency.png, memory.png and
summary.md in the reference table's layout, and results/across_entries.png.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from lab.files import read_csv, write_text_atomic

RESULTS = Path(__file__).resolve().parent.parent / "results"
# The four rows of the reference table, then the reference rows.
FOUR_ROWS = [
    ("PyTorch composite ops", "torch_composite", ""),
    ("PyTorch custom C++ extension", "torch_extension", ""),
    ("ONNX Runtime, native composite (default level)", "ort_composite", "all"),
    ("ONNX Runtime, native composite (BASIC level)", "ort_composite", "basic"),
    ("ONNX Runtime, custom op", "ort_custom", "all"),
]
REFERENCE_ROWS = [
    ("torch.nn.functional.silu", "torch_silu", ""),
    ("torch.compile(composite)", "torch_compile", ""),
    ("copy floor, PyTorch (clone)", "torch_copy", ""),
    ("copy floor, ONNX Runtime (Identity)", "ort_copy", "all"),
]


def _pick(rows, row, level, opset):
    for r in rows:
        if r["row"] == row and (r["ort_opt_level"] or "") == level and (not r["opset"] or r["opset"] == opset):
            return r
    return None


def _f(value) -> float | None:
    return float(value) if value not in (None, "", "None") else None


def summary_table(rows: list[dict], workload: str, opset: str) -> list[str]:
    rows = [r for r in rows if r["workload"] == workload]
    base = _pick(rows, "torch_composite", "", opset)
    lines = ["| implementation | p50 ms (p20-p80) | peak MB | vs PyTorch composite | GB/s | of copy floor | graph ORT ran |",
             "|---|---|---|---|---|---|---|"]
    for label, row, level in FOUR_ROWS + REFERENCE_ROWS:
        r = _pick(rows, row, level, opset)
        if r is None:
            continue
        p50 = float(r["p50_ms"])
        ratio = f"{p50 / float(base['p50_ms']):.2f}x" if base else "-"
        copy = f"{float(r['fraction_of_copy']):.2f}" if _f(r["fraction_of_copy"]) else "-"
        graph = r["ort_graph_nodes"] if row.startswith("ort_") else "-"
        lines.append(f"| {label} | {p50:.3f} ({float(r['p20_ms']):.3f}-{float(r['p80_ms']):.3f}) | {float(r['peak_mb']):.1f} "
                     f"| {ratio} | {float(r['gb_per_s']):.1f} | {copy} | {graph} |")
    return lines


def _opsets(rows):
    return sorted({r["opset"] for r in rows if r["opset"]}, key=int)


def chart(rows: list[dict], entry: str, metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in ("swish", "ffn") if any(r["workload"] == w for r in rows)]
    opsets = _opsets(rows)
    fig, axes = plt.subplots(1, len(workloads), figsize=(7 * len(workloads), 4.8), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        labels = [label for label, _, _ in FOUR_ROWS + REFERENCE_ROWS]
        width = 0.8 / max(len(opsets), 1)
        for i, opset in enumerate(opsets):
            values = []
            for _, row, level in FOUR_ROWS + REFERENCE_ROWS:
                r = _pick([x for x in rows if x["workload"] == workload], row, level, opset)
                values.append(float(r[metric]) if r else 0.0)
            ax.barh([y + i * width for y in range(len(labels))], values, height=width, label=f"opset {opset}")
        ax.set_yticks([y + width * (len(opsets) - 1) / 2 for y in range(len(labels))], labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("p50 latency (ms)" if metric == "p50_ms" else "peak memory above baseline (MB)")
        shape = next(r["shape"] for r in rows if r["workload"] == workload)
        ax.set_title(f"{entry}: {workload} {shape} float32")
        ax.legend(fontsize=8, title="ORT rows", title_fontsize=8)
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
        rows = [r for r in all_rows if r["entry"] == entry and r["workload"] == "swish"]
        opsets = _opsets(rows)
        values = [float(r["p50_ms"]) if (r := _pick(rows, row, level, opsets[-1] if opsets else "")) else 0.0
                  for _, row, level in FOUR_ROWS]
        device = rows[0]["device"] if rows else entry
        ax.bar([x + i * width for x in range(len(labels))], values, width=width, label=f"{entry} ({device})")
    ax.set_xticks([x + width * (len(entries) - 1) / 2 for x in range(len(labels))], labels, fontsize=7, rotation=12)
    ax.set_ylabel("p50 latency (ms), activation 8x512x768")
    ax.set_title("The four rows across matrix entries (newest opset)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def summary(entry_dir: Path, rows: list[dict], targets: list[dict]) -> str:
    entry = entry_dir.name
    first = rows[0]
    lines = [f"# Benchmark summary: entry `{entry}`", "",
             f"Device: {first['device']}; torch {first['torch']}, onnx {first['onnx']}, onnxruntime {first['onnxruntime']}; "
             f"{first['threads']} threads; git {first['git_sha'][:12]}{' (dirty)' if first['git_dirty'] == 'True' else ''}; "
             f"measured {first['timestamp']}.", "",
             "Latency: median (p50) of timed runs after warm-ups, `time.perf_counter`; each row in a fresh process. "
             f"Memory: {first['memory_method']}. GB/s: the least bytes the workload must move (read x, write y) "
             "over p50; 'of copy floor' is the copy's p50 over the row's (1.00 = as fast as a plain copy).", "",
             "Reading the PyTorch rows: they allocate their output on every call, and the composite two more "
             "temporaries of the same size; glibc returns blocks that large to the kernel when freed, so every "
             "call page-faults them in again, which is most of the composite's time on a VM like this one. The "
             "peaks of PyTorch rows also hold one-time start-up of the first call (OpenMP threads, allocator); "
             "ORT's arena keeps its blocks, so ORT peaks are the tensors alone. The paired ratios under Targets "
             "compare rows side by side in one warm process.", "",
             "![latency](latency.png)", "", "![memory](memory.png)", ""]
    for workload in ("swish", "ffn"):
        wrows = [r for r in rows if r["workload"] == workload]
        if not wrows:
            continue
        runs = f"{wrows[0]['warmup']} warm-ups, {wrows[0]['runs']} runs"
        for opset in _opsets(wrows):
            title = "activation alone" if workload == "swish" else "FFN block (Linear 768->3072, Swish, Linear 3072->768)"
            lines += [f"## {title}, {wrows[0]['shape']}, beta {wrows[0]['beta']}, opset {opset} ({runs})", ""]
            lines += summary_table(wrows, workload, opset) + [""]
    shares = [r for r in rows if _f(r.get("custom_node_share"))]
    if shares:
        lines += ["## Profile", ""] + [f"- {r['workload']} opset {r['opset']}: the myops::Swish node takes "
                                       f"{float(r['custom_node_share']) * 100:.1f} % of the session's run time" for r in shares] + [""]
    if targets:
        lines += ["## Targets (paired ratios, A B A B in one process)", "",
                  "| target | measured | limit | holds |", "|---|---|---|---|"]
        lines += [f"| {t['target']} | {float(t['median_ratio']):.3f}x | {t['limit']} | {'yes' if t['holds'] == 'True' else 'NO'} |"
                  for t in targets]
        lines.append("")
    return "\n".join(lines)


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
        all_rows += rows
        chart(rows, entry_dir.name, "p50_ms", entry_dir / "latency.png")
        chart(rows, entry_dir.name, "peak_mb", entry_dir / "memory.png")
        write_text_atomic(entry_dir / "summary.md", summary(entry_dir, rows, read_csv(entry_dir / "targets.csv")))
        print(f"[report] {entry_dir}/summary.md, latency.png, memory.png")
    across_entries(all_rows, args.results / "across_entries.png")
    print(f"[report] {args.results / 'across_entries.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
