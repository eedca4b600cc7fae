"""The main job end to end, small: `python -m bench.run` (what `nox -s bench` runs), and its interruption."""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--workload", "swish", "--runs", "3", "--warmup", "1", "--pairs", "5", "--no-compile", "--opsets", "18"]


def bench_run(results: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # A run started from a background job inherits SIGINT ignored; the user's Ctrl-C is what is tested.
    return subprocess.Popen([sys.executable, "-m", "bench.run", *SMALL, "--results", str(results), *extra], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_writes_rows_targets_charts_and_summary(ext, plugin_path, tmp_path):
    from bench.rows import COLUMNS

    process = bench_run(tmp_path)
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output[-3000:]
    assert "[bench  8/8]" in output and "paired target ratios" in output
    with open(tmp_path / "cpu" / "bench.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == COLUMNS
        rows = {(r["row"], r["ort_opt_level"]): r for r in reader}
    assert set(rows) == {("torch_composite", ""), ("torch_extension", ""), ("torch_silu", ""), ("torch_copy", ""),
                         ("ort_composite", "all"), ("ort_composite", "basic"), ("ort_custom", "all"), ("ort_copy", "all")}
    assert rows[("ort_composite", "all")]["ort_graph_nodes"] == "com.microsoft::QuickGelu"
    assert rows[("torch_extension", "")]["execution_provider"] == "torch-cpu"
    assert all(r["git_sha"] and r["torch"] and r["onnxruntime"] for r in rows.values())
    with open(tmp_path / "cpu" / "targets.csv", newline="") as handle:
        targets = list(csv.DictReader(handle))
    assert len(targets) == 6 and all(t["holds"] in ("True", "False") for t in targets)
    summary = (tmp_path / "cpu" / "summary.md").read_text()
    assert "| ONNX Runtime, custom op |" in summary and "## Targets" in summary
    for name in ("latency.png", "memory.png"):
        assert (tmp_path / "cpu" / name).stat().st_size > 0
    assert (tmp_path / "bench_all.csv").is_file() and (tmp_path / "across_entries.png").is_file()


def test_an_interrupted_run_leaves_the_previous_results(ext, plugin_path, tmp_path):
    before = {"cpu/bench.csv": "entry,row\ncpu,old\n", "bench_all.csv": "entry,row\ncpu,old\n"}
    for name, text in before.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    process = bench_run(tmp_path)
    seen = ""
    deadline = time.monotonic() + 600
    while "[bench  2/8]" not in seen and time.monotonic() < deadline:
        line = process.stdout.readline()
        assert line, f"bench.run ended before its second row:\n{seen[-3000:]}"
        seen += line
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=120)
    assert process.returncode != 0
    after = {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # no partial rows, no new files, no temporary debris
