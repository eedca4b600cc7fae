"""The summary of an entry measured by `bench.run` (CPU rows in interleaved rounds), from its CSVs:
bench.csv for what each row is, samples.csv for every timing (medians and intervals are recomputed
from the samples), sweep.csv for the size sweep, targets.csv for the paired ratios.

A row whose figures do not differ across opsets (their intervals overlap) is shown once with the
opsets it covers; where an opset does differ, each opset gets its line. A column names the rows a
row cannot be told apart from (overlapping 95% intervals), so that no difference within noise reads
as a result.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from opspec import OPS, PRIMARY

from .cpu_paths import PATHS
from infer.rows import COPY_ROWS, KEY
from .stats import Summary, overlap, summarise


# Short names of the rows (row, ORT level), for the "within noise of" column and the sweep.
SHORT = {("torch_composite", ""): "composite", ("torch_extension", ""): "extension",
         **{(spec.native_row, ""): spec.native_function for spec in OPS.values() if spec.native_row},  # F.silu ...
         ("torch_compile", ""): "compile", ("torch_copy", ""): "clone", ("torch_copy_into", ""): "copy_",
         ("ort_composite", "all"): "ORT default", ("ort_composite", "basic"): "ORT BASIC",
         ("ort_custom", "all"): "ORT custom", ("ort_copy", "all"): "Identity", ("ort_plugin_copy", "all"): "plugin Copy"}


def _key(row: dict) -> tuple:
    return tuple("" if row.get(k) in (None, "None") else str(row.get(k)) for k in KEY)


def sample_groups(samples: list[dict]) -> dict[tuple, list[list[float]]]:
    """KEY -> the seconds of each process, in process order."""
    by_key: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        by_key[_key(s)][s["process"]].append(float(s["seconds"]))
    return {k: [v[p] for p in sorted(v, key=int)] for k, v in by_key.items()}


def _ms(summary: Summary) -> str:
    return f"{summary.median * 1e3:.3f} [{summary.ci_low * 1e3:.3f}-{summary.ci_high * 1e3:.3f}]"


def workload_lines(rows: list[dict], groups: dict, labels: list[tuple[str, str, str]], short: dict) -> list[str]:
    """One workload's table: each implementation once, or once per opset where the opsets differ."""
    entries = []  # (label, row, level, opsets, Summary, bench row)
    for label, row, level in labels:
        mine = [r for r in rows if r["row"] == row and (r["ort_opt_level"] or "") == level]
        if not mine:
            continue
        with_samples = [(r, groups.get(_key(r))) for r in mine]
        if any(g is None for _, g in with_samples):
            continue
        per_opset = [(r, summarise(g), g) for r, g in with_samples]
        same = all(overlap(a, b) for i, (_, a, _) in enumerate(per_opset) for (_, b, _) in per_opset[i + 1:])
        if same:
            pooled = [g for _, _, gs in per_opset for g in gs]
            opsets = ", ".join(r["opset"] for r, _, _ in per_opset if r["opset"]) or "-"
            entries.append((label, row, level, opsets, summarise(pooled), mine[0]))
        else:
            for r, summary, _ in per_opset:
                entries.append((label, row, level, f"{r['opset']} (differs)", summary, r))
    if not entries:
        return []
    floor = {}
    for label, row, level, opsets, summary, r in entries:
        if row in COPY_ROWS:
            side = "torch" if row.startswith("torch_") else "ort"
            if side not in floor or summary.median < floor[side].median:
                floor[side] = summary
    base = next((e[4] for e in entries if e[1] == "torch_composite"), None)
    lines = ["| implementation | opsets | p50 ms [95% CI] | process spread | peak MB | vs PyTorch composite | GB/s "
             "| of its floor | within noise of | graph ORT ran |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, row, level, opsets, summary, r in entries:
        ties = [short.get((e[1], e[2]), e[1]) + (f" ({e[3].split()[0]})" if "differs" in e[3] else "")
                for e in entries if e[4] is not summary and overlap(e[4], summary)]
        side_floor = floor.get("torch" if row.startswith("torch_") else "ort")
        of_floor = f"{side_floor.median / summary.median:.2f}" if side_floor else "-"
        ratio = f"{summary.median / base.median:.2f}x" if base else "-"
        gbs = float(r["bytes_moved"]) / summary.median / 1e9 if r.get("bytes_moved") else 0.0
        peak = f"{float(r['peak_mb']):.1f}" if r.get("peak_mb") not in (None, "") else "n/a"
        graph = r["ort_graph_nodes"] if row.startswith("ort_") else "-"
        lines.append(f"| {label} | {opsets} | {_ms(summary)} | {summary.process_spread * 100:.1f} % | {peak} | {ratio} "
                     f"| {gbs:.1f} | {of_floor} | {', '.join(ties) or '-'} | {graph} |")
    return lines


PATH_NAMES = {"avx512": "AVX-512 (intrinsics)", "avx2": "AVX2 + FMA", "baseline": "baseline x86-64"}


def isa_lines(capped: list[dict], rows: list[dict], groups: dict) -> list[str]:
    """Each CPU path's extension and plugin op against the first op's native function and ORT's fused kernel
    for its composite (the seed's F.silu and QuickGelu), same run."""
    if not capped:
        return []
    # The newest --isa run only (results are upserted: an earlier one's paths may linger), against the
    # uncapped rows of the same workload, shape, beta and threads, from that run where it measured them.
    stamp = max(r.get("timestamp") or "" for r in capped)
    capped = [r for r in capped if (r.get("timestamp") or "") == stamp]
    alike = ("entry", "workload", "dtype", "shape", "beta", "threads")
    peers = [r for r in rows if all((r.get(k) or "") == (capped[0].get(k) or "") for k in alike)]
    same_run = [r for r in peers if (r.get("timestamp") or "") == stamp]
    peers = same_run or peers
    opsets = [int(r["opset"]) for r in capped if r.get("opset")]
    opset = str(max(opsets)) if opsets else ""

    def find(pool, row, level=""):
        hit = sorted((r for r in pool if r["row"] == row and (r.get("ort_opt_level") or "") == level
                      and (not level or (r.get("opset") or "") == opset)), key=lambda r: r.get("timestamp") or "")
        group = groups.get(_key(hit[-1])) if hit else None
        return summarise(group) if group else None

    def versus(a, b):
        if a is None or b is None:
            return "-"
        return f"{a.median / b.median:.2f}x" + (" (within noise)" if overlap(a, b) else "")

    spec = OPS[PRIMARY]
    native_name = spec.native_function or "PyTorch's own function"
    # the node ORT's default level makes of the composite, where the declaration names one (a fused node with
    # no opset: not a standard one)
    fused = next((node.op_type for node in spec.fused_nodes if node.opset is None), "")
    native, ort_composite = find(peers, spec.native_row), find(peers, "ort_composite", "all")
    when = ("in the same interleaved rounds as the rows above" if same_run else
            f"in an earlier run ({stamp}) than the rows above, so the ratios mix two runs")
    lines = [f"## CPU paths of the kernel (activation alone, {capped[0]['shape']})", "",
             f"Each path of kernels/{PRIMARY}.h measured in processes started with MYOPS_CPU_ISA capping it (`bench.run "
             f"--isa`), {when}. The ratios are of the rows' medians (separate processes, not paired); '(within "
             f"noise)' where the two intervals overlap. {f'ORT runs the composite as its {fused} kernel; ' if fused else ''}"
             f"{native_name} is PyTorch's own.", "",
             f"| path | extension p50 ms [95% CI] | vs {native_name} | ORT custom op, opset {opset or '-'}, p50 ms "
             f"[95% CI] | vs ORT's {fused or 'composite'} |", "|---|---|---|---|---|"]
    paths = [("", "uncapped (the widest this CPU has)")] + [(p, PATH_NAMES[p]) for p in PATHS
                                                           if any(r.get("isa") == p for r in capped)]
    for isa, name in paths:
        pool = [r for r in capped if r.get("isa") == isa] if isa else peers
        ext, ort = find(pool, "torch_extension"), find(pool, "ort_custom", "all")
        lines.append(f"| {name} | {_ms(ext) if ext else '-'} | {versus(ext, native)} | {_ms(ort) if ort else '-'} "
                     f"| {versus(ort, ort_composite)} |")
    return lines + [""]


# The sweep's implementations (no BASIC level, no torch.compile), keyed by row alone.
SWEEP_LABELS = {row: label for (row, level), label in SHORT.items() if (row, level) not in
                {("ort_composite", "basic"), ("torch_compile", "")}}


def sweep_lines(sweep: list[dict]) -> list[str]:
    """GB/s of every implementation at every size, with each size's memory regime."""
    if not sweep:
        return []
    rows = [r for r in SWEEP_LABELS if any(s["row"] == r for s in sweep)]
    sizes = sorted({int(s["elements"]) for s in sweep})
    cell = {(s["row"], int(s["elements"])): s for s in sweep}
    lines = ["## Size sweep: the activation alone, (1, n/768, 768) float32", "",
             "GB/s = (input + output bytes) / median time. The regime is where input and output fit: the L2 "
             "caches of the cores in use, the shared L3, or DRAM. Each framework's floor is its fastest copy "
             "at that size. Chart: sweep.png.", "",
             "| elements | in + out | regime | " + " | ".join(SWEEP_LABELS[r] for r in rows) + " |",
             "|---|---|---|" + "---|" * len(rows)]
    for n in sizes:
        some = next(cell[(r, n)] for r in rows if (r, n) in cell)
        values = []
        for r in rows:
            s = cell.get((r, n))
            values.append(f"{float(s['gb_per_s']):.1f}" if s else "-")
        lines.append(f"| {n:,} | {int(some['bytes_moved']) / 2**20:.2f} MiB | {some['regime']} | " + " | ".join(values) + " |")
    return lines + [""]


def sweep_chart(sweep: list[dict], entry: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for ax, side, title in ((axes[0], "torch_", "PyTorch"), (axes[1], "ort_", "ONNX Runtime")):
        for row, label in SWEEP_LABELS.items():
            points = sorted((int(s["elements"]), float(s["gb_per_s"])) for s in sweep if s["row"] == row)
            if not points or not row.startswith(side):
                continue
            style = dict(linestyle="--", linewidth=1) if row in COPY_ROWS else dict(marker="o", markersize=3)
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label + (" (copy)" if row in COPY_ROWS else ""),
                    **style)
        floor = defaultdict(float)
        for s in sweep:
            if s["row"] in COPY_ROWS and s["row"].startswith(side):
                floor[int(s["elements"])] = max(floor[int(s["elements"])], float(s["gb_per_s"]))
        if floor:
            sizes = sorted(floor)
            ax.fill_between(sizes, [floor[n] for n in sizes], alpha=0.12, color="grey", label="floor (best copy)")
        for regime in ("L2", "L3"):
            inside = [int(s["elements"]) for s in sweep if s["regime"] == regime]
            if inside:
                ax.axvline(max(inside), color="grey", linewidth=0.6, linestyle=":")
                ax.text(max(inside), 0, f" {regime} ends", fontsize=7, rotation=90, va="bottom")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("elements (float32)")
        ax.set_title(f"{entry}: {title}, activation alone")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("GB/s (input + output bytes / median time)")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
