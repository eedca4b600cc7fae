"""Statistics over samples and `nox -s compare`: intervals that cover, same-distribution runs not
flagged, planted slowdowns flagged (synthetic samples, then real runs with a slower CPU path)."""
from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import compare as C
from bench import stats
from infer.rows import SAMPLE_COLUMNS

REPO = Path(__file__).resolve().parent.parent
KEY = dict(entry="cpu", workload="swish", dtype="float32", shape="8x512x768", beta="1.0", opset="", exporter="",
           ort_opt_level="", execution_provider="torch-cpu", threads="2")


def runs_of(rng, median: float, processes: int = 3, runs: int = 60, process_sd: float = 0.02, run_sd: float = 0.05):
    """Timings as a benchmark makes them: a level per process, log-normal noise around it per run."""
    return [median * (1 + rng.normal(0, process_sd)) * np.exp(rng.normal(0, run_sd, runs)) for _ in range(processes)]


def as_samples(groups, row: str = "torch_extension") -> list[dict]:
    return [dict(KEY, row=row, process=str(p), run=str(r), seconds=repr(float(s)))
            for p, g in enumerate(groups) for r, s in enumerate(g)]


def write_samples(directory: Path, samples: list[dict]) -> Path:
    path = directory / "cpu" / "samples.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=SAMPLE_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(samples)
    return path


def test_the_interval_of_the_median_covers_the_true_one_about_as_often_as_it_says():
    rng = np.random.default_rng(1)
    # No process effect here, so the true median is known exactly: 1.0.
    covered = sum(s.ci_low <= 1.0 <= s.ci_high
                  for s in (stats.summarise(runs_of(rng, 1.0, process_sd=0.0)) for _ in range(150)))
    assert covered / 150 >= 0.88


def test_the_interval_widens_with_the_spread_between_processes():
    rng = np.random.default_rng(2)
    calm = stats.summarise(runs_of(rng, 1.0, process_sd=0.0))
    drifting = stats.summarise(runs_of(rng, 1.0, process_sd=0.10))
    assert (drifting.ci_high - drifting.ci_low) > 2 * (calm.ci_high - calm.ci_low)
    assert drifting.process_spread > calm.process_spread


def test_same_distribution_is_rarely_flagged_and_a_planted_slowdown_always():
    rng = np.random.default_rng(3)
    same = [C.compare(as_samples(runs_of(rng, 1.0)), as_samples(runs_of(rng, 1.0)))[0][0] for _ in range(100)]
    assert sum(r["flagged"] for r in same) <= 3
    # The interval must carry the processes' spread: resampling runs alone would call most of these different.
    assert sum(r["verdict"] in ("slower", "faster") for r in same) <= 12
    slower = [C.compare(as_samples(runs_of(rng, 1.0)), as_samples(runs_of(rng, 1.2)))[0][0] for _ in range(20)]
    assert all(r["flagged"] and r["verdict"] == "slower" for r in slower)
    faster = C.compare(as_samples(runs_of(rng, 1.0)), as_samples(runs_of(rng, 0.8)))[0][0]
    assert faster["verdict"] == "faster" and not faster["flagged"]


def test_a_planted_slowdown_on_two_wide_processes_is_inconclusive_not_no_change(tmp_path):
    """2 processes a side that differ a lot: the interval spans a big speed-up to a big slowdown. A 25 %
    slowdown there is "inconclusive" (counted, and a failure with --inconclusive fail), never "no change"."""
    rng = np.random.default_rng(8)
    base = runs_of(rng, 1.0, processes=2, process_sd=0.25)
    new = [g * 1.25 for g in runs_of(rng, 1.0, processes=2, process_sd=0.25)]
    (result,), _ = C.compare(as_samples(base), as_samples(new), threshold=0.05)
    assert result["ci_low"] < 1 < 1.05 < result["ci_high"], result
    assert result["verdict"] == "inconclusive" and not result["flagged"] and result["resolution"] > 0.25, result
    write_samples(tmp_path / "a", as_samples(base))
    write_samples(tmp_path / "b", as_samples(new))
    for mode, code in (("pass", 0), ("fail", 1)):
        done = subprocess.run([sys.executable, "-m", "bench.compare", str(tmp_path / "a"), str(tmp_path / "b"),
                               "--inconclusive", mode, "--json", str(tmp_path / "c.json")], cwd=REPO,
                              capture_output=True, text=True)
        assert done.returncode == code, done.stdout + done.stderr
        assert "1 inconclusive, 0 no significant change" in done.stdout, done.stdout
        assert [r["verdict"] for r in json.loads((tmp_path / "c.json").read_text())] == ["inconclusive"]


def test_no_interval_that_holds_the_threshold_is_called_no_change():
    """Every row of the committed samples with a 25 % slowdown planted (the held-out check's): slower,
    or inconclusive where the row's processes cannot tell; and "no significant change" only where the
    whole interval lies within the threshold."""
    samples = list(csv.DictReader(open(REPO / "results" / "cpu" / "samples.csv")))
    slower = [dict(s, seconds=repr(float(s["seconds"]) * 1.25)) for s in samples]
    results, _ = C.compare(samples, slower, threshold=0.05)
    judged = [r for r in results if not r["verdict"].startswith(C.TOO_FEW)]
    assert judged and all(r["verdict"] in ("slower", "inconclusive") for r in judged), \
        [r for r in judged if r["verdict"] not in ("slower", "inconclusive")][:3]
    same, _ = C.compare(samples, samples, threshold=0.05)
    for r in same:
        if r["verdict"] == "no significant change":
            assert r["ci_high"] <= 1.05, r


def test_rows_of_one_process_are_shown_but_not_judged():
    rng = np.random.default_rng(6)
    (result,), _ = C.compare(as_samples(runs_of(rng, 1.0, processes=1)), as_samples(runs_of(rng, 1.5, processes=3)))
    assert result["verdict"] == "too few processes to judge (1)" and not result["flagged"] and result["ratio"] > 1.3


def test_a_significant_change_below_the_threshold_is_reported_but_does_not_fail():
    rng = np.random.default_rng(4)
    base, new = as_samples(runs_of(rng, 1.0, run_sd=0.005, process_sd=0.0)), \
        as_samples(runs_of(rng, 1.03, run_sd=0.005, process_sd=0.0))
    (result,), _ = C.compare(base, new, threshold=0.05)
    assert result["verdict"] == "slower" and not result["flagged"]
    (result,), _ = C.compare(base, new, threshold=0.01)
    assert result["flagged"]


def test_sources_directory_bench_csv_and_git_revision(tmp_path):
    rng = np.random.default_rng(5)
    base = write_samples(tmp_path / "base", as_samples(runs_of(rng, 1.0)))
    (base.parent / "bench.csv").write_text("entry\ncpu\n")
    assert C.load(str(tmp_path / "base"), "cpu")[0] == str(base)
    assert C.load(str(base.parent / "bench.csv"), "cpu")[0] == str(base)
    repo = tmp_path / "repo"
    write_samples(repo / "results", as_samples(runs_of(rng, 1.0)))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "results"], check=True)
    where, samples = C.load("HEAD", "cpu", repo=repo)
    assert where == "HEAD:results/cpu/samples.csv" and len(samples) == 180
    # a kept run, gzipped: the same samples from the file or its folder
    kept = tmp_path / "kept" / "samples.csv.gz"
    kept.parent.mkdir()
    kept.write_bytes(gzip.compress(base.read_bytes()))
    assert C.load(str(kept), "cpu")[1] == C.load(str(kept.parent), "cpu")[1] == C.load(str(base), "cpu")[1]
    (kept.parent / "bench.csv").write_text("entry\ncpu\n")
    assert C.load(str(kept.parent / "bench.csv"), "cpu")[0] == str(kept)
    kept.write_bytes(b"not gzip")
    with pytest.raises(C.SourceError, match="cannot be read"):
        C.load(str(kept), "cpu")


def test_nothing_judged_exits_2_with_what_to_do(tmp_path):
    rng = np.random.default_rng(7)
    write_samples(tmp_path / "a", as_samples(runs_of(rng, 1.0, processes=1)))
    write_samples(tmp_path / "b", as_samples(runs_of(rng, 2.0, processes=1)))
    done = subprocess.run([sys.executable, "-m", "bench.compare", str(tmp_path / "a"), str(tmp_path / "b")],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and "--rounds 2" in done.stderr, done.stdout + done.stderr


def test_unreadable_inputs_exit_2_with_what_to_do(tmp_path):
    (tmp_path / "old" / "cpu").mkdir(parents=True)
    (tmp_path / "old" / "cpu" / "bench.csv").write_text("entry,row\ncpu,x\n")
    done = subprocess.run([sys.executable, "-m", "bench.compare", str(tmp_path / "old"), str(tmp_path / "old")],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2
    assert "no samples.csv" in done.stderr and "nox -s bench" in done.stderr


def test_without_scipy_it_exits_2_and_says_how_to_get_it(tmp_path):
    rng = np.random.default_rng(7)
    write_samples(tmp_path / "a", as_samples(runs_of(rng, 1.0, processes=3)))
    # A None entry in sys.modules makes `import scipy` fail as in an environment without it.
    code = ("import sys; sys.modules['scipy'] = None; from bench.compare import main; "
            f"sys.exit(main([{str(tmp_path / 'a')!r}, {str(tmp_path / 'a')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and "requirements/compare.txt" in done.stderr, done.stdout + done.stderr


def _bench(results: Path, **env) -> None:
    small = ["--workload", "swish", "--opsets", "18", "--rounds", "3", "--runs", "40", "--no-sweep", "--no-targets",
             "--no-compile"]
    done = subprocess.run([sys.executable, "-m", "bench.run", *small, "--results", str(results)], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO), **env), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.skipif("avx2" not in Path("/proc/cpuinfo").read_text(),
                    reason="the planted slowdown is the baseline path, which is this CPU's own without AVX2")
@pytest.mark.alone  # its verdict is on timings: another worker's load would blur them
def test_a_planted_slowdown_is_flagged_on_real_runs(ext, plugin_path, tmp_path):
    """The kernel capped at its baseline path (no AVX2/AVX-512): the extension and the plugin's op
    must come out significantly slower; compare exits 1."""
    _bench(tmp_path / "base")
    _bench(tmp_path / "new", MYOPS_CPU_ISA="baseline")
    done = subprocess.run([sys.executable, "-m", "bench.compare", str(tmp_path / "base"), str(tmp_path / "new"),
                           "--json", str(tmp_path / "compare.json")], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    flagged = {r["row"] for r in json.loads((tmp_path / "compare.json").read_text()) if r["flagged"]}
    assert {"swish torch_extension", "swish ort_custom all opset 18"} <= flagged, done.stdout


@pytest.mark.parametrize("count,rounds", [(10, 3), (7, 2), (3, 3)])
def test_each_round_runs_every_row_once_from_a_rotated_start(count, rounds):
    from bench.rounds import rotation

    orders = [rotation(count, rounds, r) for r in range(rounds)]
    assert all(sorted(o) == list(range(count)) for o in orders)
    assert len({o[0] for o in orders}) == rounds


def test_a_row_with_its_own_round_count_runs_only_in_the_first_rounds():
    from bench.rounds import schedule

    specs = [{"row": "a"}, {"row": "torch_compile", "rounds": 1}, {"row": "b"}]
    order = schedule(specs, 3)
    assert [i for _, i in order].count(1) == 1 and order.count((0, 1)) == 1
    assert [i for _, i in order].count(0) == 3 and [i for _, i in order].count(2) == 3
    assert [r for r, _ in order] == sorted(r for r, _ in order)  # rounds stay interleaved, one after another


def test_rounds_share_a_process_per_workload_framework_and_cpu_path():
    """Rows share a process per workload, framework and CPU path, never torch with onnxruntime (ORT rows
    must run in a torch-free process) nor two CPU paths (MYOPS_CPU_ISA is read once a process); in round
    1 each ORT row has a process of its own, where its peak memory is measured."""
    from bench.rounds import schedule
    from bench.run import row_module, shared_processes

    specs = [{"workload": w, "row": r, **({"isa": isa} if isa else {})}
             for w in ("swish", "ffn") for r in ("torch_extension", "torch_composite", "ort_custom", "ort_composite")
             for isa in ("", "avx2")]
    order = schedule(specs, 3)
    for round_index in (0, 1, 2):
        groups = shared_processes(specs, [i for r, i in order if r == round_index], first_round=round_index == 0)
        assert sorted(i for g in groups for i in g) == list(range(len(specs)))  # every row once
        for group in groups:
            assert len({(specs[i]["workload"], row_module(specs[i]), specs[i].get("isa")) for i in group}) == 1
        ort_alone = [g for g in groups if row_module(specs[g[0]]) == "infer.measure"]
        if round_index == 0:
            assert all(len(g) == 1 for g in ort_alone) and len(ort_alone) == 8
            assert len(groups) == 8 + 2 * 2  # the PyTorch rows still share, per workload and path
        else:
            assert len(groups) == 2 * 2 * 2
