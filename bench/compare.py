"""Compare two benchmark runs row by row from their raw samples: `nox -s compare -- BASE NEW`.

    python -m bench.compare BASE NEW [--entry cpu] [--threshold 0.05]
    python -m bench.compare --same-build N [-- BENCH OPTIONS]
    python -m bench.compare --same-build-dirs DIR DIR ...

BASE and NEW are each a results directory (results/ or results/<entry>/), a bench.csv or
samples.csv file, or a git revision (its committed results/<entry>/samples.csv). For every row
both have, NEW/BASE is the ratio of the process medians (geometric mean) with a 95% interval from
Welch's t over processes (bench.stats.change): "slower" or "faster" when the interval excludes 1;
"inconclusive" when it holds 1 and also a change of the threshold either way (too few processes or
too much spread between them to tell); else "no significant change". Each row also says the
smallest change it can detect (its interval's half-width). A row with one process a side is shown,
not judged. The exit status is 1 when any row is significantly slower by more than the threshold
(default 5%), or, with --inconclusive fail, when any row is inconclusive; else 0; 2 when an input
cannot be read or no row could be judged.

--same-build N runs the benchmark N times on this build and compares every pair of runs: each
flagged row there is a false positive. It writes results/<entry>/compare_noise.csv and states the
rate; --same-build-dirs does the same for runs already made.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .cpu_summary import sample_groups
from infer.rows import KEY
from .stats import Change, change

REPO = Path(__file__).resolve().parent.parent
DEFAULT_THRESHOLD = 0.05
# The interval treats processes as the units (bench.stats.change): a row measured in one process a
# side has no spread between processes to judge it by. Such rows are shown and not judged.
MIN_PROCESSES = 2
TOO_FEW = "too few processes to judge"
COMPARE_COLUMNS = ["row", "base_ms", "new_ms", "ratio", "ci_low", "ci_high", "resolution", "verdict", "flagged"]
VERDICTS = ("faster", "slower", "inconclusive", "no significant change")
NOISE_COLUMNS = ["entry", "base_run", "new_run"] + COMPARE_COLUMNS + ["threshold", "git_sha"]


class SourceError(RuntimeError):
    """BASE or NEW cannot be read; the message says what to give instead."""


def _parse(text: str, where: str) -> list[dict]:
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows or "seconds" not in rows[0]:
        raise SourceError(f"{where} holds no samples (no 'seconds' column): give a samples.csv written by "
                          "`nox -s bench`")
    return rows


SAMPLE_FILES = ("samples.csv", "samples.csv.gz")  # gzipped: how a kept comparison stores its runs


def _read(path: Path) -> str:
    """A samples file, gzipped or not."""
    try:
        return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path} cannot be read ({exc}): give a samples.csv (or .csv.gz) written by `nox -s bench`") \
            from exc


def load(source: str, entry: str, repo: Path = REPO) -> tuple[str, list[dict]]:
    """(where the samples came from, the samples) for a directory, a CSV file (or .csv.gz) or a git revision."""
    path = Path(source)
    if path.is_dir():
        for candidate in (folder / name for folder in (path / entry, path) for name in SAMPLE_FILES):
            if candidate.is_file():
                return str(candidate), _parse(_read(candidate), str(candidate))
        raise SourceError(f"{path} has no samples.csv (looked in {path / entry} and {path}): results written "
                          "before raw timings were kept cannot be compared; run `nox -s bench` there again")
    if path.is_file():
        beside = [path.with_name(name) for name in SAMPLE_FILES if path.with_name(name).is_file()]
        target = path if path.name != "bench.csv" else (beside or [path.with_name("samples.csv")])[0]
        if not target.is_file():
            raise SourceError(f"{path} has no samples.csv beside it: results written before raw timings were "
                              "kept cannot be compared; run `nox -s bench` again")
        return str(target), _parse(_read(target), str(target))
    inside = f"results/{entry}/samples.csv"
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{source}:{inside}"], capture_output=True, text=True)
    if shown.returncode != 0:
        reason = shown.stderr.strip().splitlines()[-1] if shown.stderr.strip() else "unknown"
        raise SourceError(f"{source!r} is neither a directory, a file nor a git revision with {inside} ({reason}): "
                          f"give a results directory, a samples.csv, or a commit that holds {inside}")
    return f"{source}:{inside}", _parse(shown.stdout, f"{source}:{inside}")


def label(key: tuple) -> str:
    fields = dict(zip(KEY, key))
    parts = [fields["workload"], fields["row"]]
    if fields["ort_opt_level"]:
        parts.append(fields["ort_opt_level"])
    if fields["opset"]:
        parts.append(f"opset {fields['opset']}")
    if fields["workload"] == "sweep":
        parts.append(fields["shape"])
    if fields.get("isa"):
        parts.append(f"isa {fields['isa']}")
    return " ".join(parts)


def compare(base: list[dict], new: list[dict], threshold: float = DEFAULT_THRESHOLD) -> tuple[list[dict], list[str]]:
    """One result per row the two share; and the rows only one of them has."""
    base_groups, new_groups = sample_groups(base), sample_groups(new)
    results = []
    for key in sorted(set(base_groups) & set(new_groups)):
        base_ms = float(np.median(np.concatenate(base_groups[key]))) * 1e3
        new_ms = float(np.median(np.concatenate(new_groups[key]))) * 1e3
        fewest = min(len(base_groups[key]), len(new_groups[key]))
        if fewest >= MIN_PROCESSES:
            c = change(base_groups[key], new_groups[key])
            verdict, resolution = c.verdict(threshold), round(c.resolution, 4)
        else:  # the ratio of medians, shown with no interval
            c, verdict = Change(new_ms / base_ms, float("nan"), float("nan")), f"{TOO_FEW} ({fewest})"
            resolution = None
        results.append(dict(row=label(key), base_ms=round(base_ms, 5), new_ms=round(new_ms, 5), ratio=round(c.ratio, 4),
                            ci_low=None if np.isnan(c.ci_low) else round(c.ci_low, 4),
                            ci_high=None if np.isnan(c.ci_high) else round(c.ci_high, 4), resolution=resolution,
                            verdict=verdict, flagged=verdict == "slower" and c.ratio > 1 + threshold))
    unmatched = [f"only in BASE: {label(k)}" for k in sorted(set(base_groups) - set(new_groups))]
    unmatched += [f"only in NEW: {label(k)}" for k in sorted(set(new_groups) - set(base_groups))]
    return results, unmatched


def print_table(results: list[dict], threshold: float) -> None:
    width = max([len(r["row"]) for r in results] + [3])
    print(f"{'row':{width}}  {'BASE ms':>10}  {'NEW ms':>10}  {'NEW/BASE [95% CI]':>24}  {'detects':>7}  verdict")
    for r in results:
        mark = f"  <-- slower by more than {threshold:.0%}" if r["flagged"] else ""
        interval = "" if r["ci_low"] is None else f"[{r['ci_low']:.3f}-{r['ci_high']:.3f}]"
        detects = "" if r["resolution"] is None else f"±{r['resolution']:.0%}"
        print(f"{r['row']:{width}}  {r['base_ms']:10.4f}  {r['new_ms']:10.4f}  "
              f"{r['ratio']:7.3f}x {interval:>15}  {detects:>7}  {r['verdict']}{mark}")


def same_build(runs: int, entry: str, bench_args: list[str], threshold: float, out_root: Path,
               results: Path) -> int:
    """Run the benchmark `runs` times and compare every pair: the flagged share is the false-positive rate."""
    if runs < 2:
        print("error: --same-build needs at least 2 runs", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    shutil.rmtree(out_root, ignore_errors=True)  # bench.run upserts: an earlier call's rows must not be compared
    dirs = []
    for i in range(runs):
        target = out_root / f"run-{i + 1}"
        print(f"[compare] same-build run {i + 1}/{runs} -> {target}", flush=True)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "bench.run", "--entry", entry, "--results", str(target),
                               *bench_args], env=env, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
            print(f"error: benchmark run {i + 1} failed (exit {done.returncode}); see above", file=sys.stderr)
            return 2
        print(f"[compare]   done in {time.perf_counter() - started:.0f} s", flush=True)
        dirs.append(target)
    return false_positives(dirs, entry, threshold, results)


def false_positives(dirs: list[Path], entry: str, threshold: float, results: Path) -> int:
    """Compare every pair of same-build runs: each flagged row is a false positive."""
    from lab.files import write_csv_atomic
    from lab.provenance import git_state

    runs = len(dirs)
    rows, flagged, significant, judged, inconclusive = [], 0, 0, 0, 0
    sha = git_state().get("git_sha")
    for a, b in itertools.combinations(range(runs), 2):
        compared, _ = compare(load(str(dirs[a]), entry)[1], load(str(dirs[b]), entry)[1], threshold)
        for r in compared:
            rows.append(dict(entry=entry, base_run=a + 1, new_run=b + 1, **r, threshold=threshold, git_sha=sha))
        flagged += sum(r["flagged"] for r in compared)
        significant += sum(r["verdict"] in ("slower", "faster") for r in compared)
        inconclusive += sum(r["verdict"] == "inconclusive" for r in compared)
        judged += sum(not r["verdict"].startswith(TOO_FEW) for r in compared)
    if not judged:
        print(f"error: no row of these runs has {MIN_PROCESSES} processes, so none could be judged: give the "
              f"benchmark --rounds {MIN_PROCESSES} or more", file=sys.stderr)
        return 2
    write_csv_atomic(results / entry / "compare_noise.csv", rows, NOISE_COLUMNS)
    print(f"[compare] {runs} runs of one build, {runs * (runs - 1) // 2} pairs, {judged} judged row comparisons"
          f"{f' ({len(rows) - judged} more with too few processes)' if len(rows) > judged else ''}: "
          f"{flagged} flagged ({flagged / judged:.1%} false positives at threshold {threshold:.0%}); "
          f"{significant} ({significant / judged:.1%}) called significant either way, {inconclusive} "
          f"({inconclusive / judged:.1%}) inconclusive; "
          f"{sum(r['flagged'] for r in pair_any(rows))} of {runs * (runs - 1) // 2} comparisons flagged a row. "
          f"Written to {results / entry / 'compare_noise.csv'}")
    return 0


def pair_any(rows: list[dict]) -> list[dict]:
    """One entry per (base_run, new_run) comparison: flagged when any of its rows was."""
    pairs: dict[tuple, bool] = {}
    for r in rows:
        key = (r["base_run"], r["new_run"])
        pairs[key] = pairs.get(key, False) or bool(r["flagged"])
    return [dict(base_run=a, new_run=b, flagged=f) for (a, b), f in pairs.items()]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="nox -s compare --", description=__doc__.splitlines()[0])
    parser.add_argument("base", nargs="?", help="results directory, bench.csv/samples.csv, or git revision")
    parser.add_argument("new", nargs="?", help="the same kinds as BASE (default: results/)")
    parser.add_argument("--entry", default="cpu")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="fail when a row is significantly slower by more than this fraction (default 0.05)")
    parser.add_argument("--inconclusive", choices=["pass", "fail"], default="pass",
                        help="the exit status where a row cannot be told from a change of the threshold: pass (0, "
                             "the rows are listed) or fail (1) (default: pass)")
    parser.add_argument("--same-build", type=int, metavar="N",
                        help="run the benchmark N times here and measure how often same-build runs are flagged")
    parser.add_argument("--same-build-dirs", type=Path, nargs="+", metavar="DIR",
                        help="results directories of same-build runs made earlier: compare them as --same-build does")
    parser.add_argument("--json", type=Path, help="also write the comparison as JSON")
    parser.add_argument("--results", type=Path, default=REPO / "results", help="where --same-build writes its CSV")
    args = parser.parse_args(argv)
    try:
        import scipy  # noqa: F401 (bench.stats.change takes Welch's interval from it)
    except ImportError:
        print("error: compare needs scipy: run it as `nox -s compare -- ...`, or "
              "`pip install -r requirements/compare.txt` into this environment", file=sys.stderr)
        return 2
    if args.same_build is not None:
        return same_build(args.same_build, args.entry, bench_args, args.threshold, REPO / "build" / "compare-noise",
                          args.results)
    if args.same_build_dirs:
        if len(args.same_build_dirs) < 2:
            parser.error("--same-build-dirs needs at least 2 directories")
        return false_positives(args.same_build_dirs, args.entry, args.threshold, args.results)
    if not args.base:
        parser.error("give BASE (and NEW), --same-build N or --same-build-dirs DIR DIR ...")
    try:
        base_where, base = load(args.base, args.entry)
        new_where, new = load(args.new or str(REPO / "results"), args.entry)
    except SourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"BASE: {base_where}\nNEW:  {new_where}")
    results, unmatched = compare(base, new, args.threshold)
    if not results:
        print("error: BASE and NEW have no row in common (another entry, workload or thread count?)", file=sys.stderr)
        return 2
    print_table(results, args.threshold)
    for line in unmatched:
        print(f"  ({line})")
    if all(r["verdict"].startswith(TOO_FEW) for r in results):
        print(f"error: no row has {MIN_PROCESSES} processes on both sides, so none could be judged: run "
              f"`nox -s bench` with --rounds {MIN_PROCESSES} or more (the default is 3)", file=sys.stderr)
        return 2
    flagged = [r for r in results if r["flagged"]]
    counts = {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}
    unjudged = sum(r["verdict"].startswith(TOO_FEW) for r in results)
    print(f"{len(results)} rows: {counts['faster']} faster, {counts['slower']} slower, "
          f"{counts['inconclusive']} inconclusive, {counts['no significant change']} no significant change"
          + (f", {unjudged} with fewer than {MIN_PROCESSES} processes a side, not judged (measure them in more: "
             "--rounds, --ffn-rounds, --sweep-rounds)" if unjudged else "") + "; "
          + (f"{len(flagged)} significantly slower by more than {args.threshold:.0%}" if flagged else
             f"none significantly slower by more than {args.threshold:.0%}"))
    if counts["inconclusive"]:
        print(f"inconclusive: {counts['inconclusive']} rows' intervals hold both no change and a {args.threshold:.0%} "
              "change (their 'detects' column is the smallest change each can tell); measure both runs with more "
              "--rounds to judge them" + ("" if args.inconclusive == "fail" else "; --inconclusive fail makes them fail"))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if flagged or (counts["inconclusive"] and args.inconclusive == "fail") else 0


if __name__ == "__main__":
    raise SystemExit(main())
