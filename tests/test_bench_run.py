"""The main job end to end, small: `python -m bench.run` (what `nox -s bench` runs), and its interruption."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--workload", "swish", "--runs", "3", "--warmup", "1", "--pairs", "5", "--no-compile", "--opsets", "18",
         "--rounds", "2", "--sweep-rounds", "1", "--target-processes", "2"]


def bench_run(results: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # A run started from a background job inherits SIGINT ignored; the user's Ctrl-C is what is tested.
    return subprocess.Popen([sys.executable, "-m", "bench.run", *SMALL, "--results", str(results), *extra], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_writes_rows_samples_sweep_targets_charts_and_summary(ext, plugin_path, tmp_path):
    from infer.rows import COLUMNS, KEY, SAMPLE_COLUMNS
    from bench.sweep import SEQ, SWEEP_ROWS

    process = bench_run(tmp_path)
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output[-3000:]
    # round 1: the 5 PyTorch rows in one process, each ORT row in its own (its memory is measured there);
    # round 2: one process per framework (PyTorch, ONNX Runtime). The sweep: one per framework.
    assert "[bench   8/8 round 2/2] swish" in output and "5 ONNX Runtime rows in one process" in output
    assert "round 1/2] swish          5 PyTorch rows in one process" in output
    assert "paired target ratios" in output and "[sweep  2/2]" in output
    with open(tmp_path / "cpu" / "bench.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == COLUMNS
        rows = {(r["row"], r["ort_opt_level"]): r for r in reader}
    assert set(rows) == {("torch_composite", ""), ("torch_extension", ""), ("torch_silu", ""), ("torch_copy", ""),
                         ("torch_copy_into", ""), ("ort_composite", "all"), ("ort_composite", "basic"),
                         ("ort_custom", "all"), ("ort_copy", "all"), ("ort_plugin_copy", "all")}
    assert rows[("ort_composite", "all")]["ort_graph_nodes"] == "com.microsoft::QuickGelu"
    assert rows[("ort_plugin_copy", "all")]["ort_graph_nodes"] == "myops::Copy"
    assert rows[("torch_extension", "")]["execution_provider"] == "torch-cpu"
    assert {r["regime"] for r in rows.values()} <= {"L2", "L3", "DRAM", "unknown"} and rows[("torch_copy", "")]["regime"]
    assert all(r["git_sha"] and r["torch"] and r["onnxruntime"] for r in rows.values())
    assert all(float(r["peak_mb"]) > 0 and "VmHWM" in r["memory_method"] for r in rows.values()
               if r["row"] not in ("torch_copy_into",)), {k: r["peak_mb"] for k, r in rows.items()}
    assert all(r["processes"] == "2" and float(r["ci_low_ms"]) <= float(r["p50_ms"]) <= float(r["ci_high_ms"])
               for r in rows.values())
    # Raw timings: every row's 2 processes x 3 runs, keyed as in bench.csv; the sweep's every size.
    samples = _csv(tmp_path / "cpu" / "samples.csv")
    assert list(samples[0]) == SAMPLE_COLUMNS
    for r in rows.values():
        mine = [s for s in samples if all(s[k] == r[k] for k in KEY)]
        assert sorted((s["process"], s["run"]) for s in mine) == [(p, n) for p in "01" for n in "012"]
    sweep = _csv(tmp_path / "cpu" / "sweep.csv")
    assert len(sweep) == len(SWEEP_ROWS) * len(SEQ) and {s["regime"] for s in sweep} <= {"L2", "L3", "DRAM", "unknown"}
    assert len([s for s in samples if s["workload"] == "sweep"]) >= len(SWEEP_ROWS) * len(SEQ) * 3
    assert {r["op"] for r in rows.values()} == {"swish"}
    targets = _csv(tmp_path / "cpu" / "targets.csv")
    # 5 paired (no Swish-24 at opset 18), the two floor targets again on a DRAM-sized tensor, 2 of memory
    assert len(targets) == 9 and all(t["holds"] in ("True", "False") for t in targets)
    paired = [t for t in targets if "memory" not in t["target"]]
    assert all(t["processes"] == "2" and float(t["ci_low"]) <= float(t["median_ratio"]) <= float(t["ci_high"])
               for t in paired)
    assert {t["shape"] for t in targets} == {"8x512x768", "1x65536x768"}
    floors = {t["target"]: t for t in targets}
    assert floors["ORT custom op vs ORT-side copy floor"]["denominator"] in ("ort_plugin_copy", "ort_copy")
    assert floors["extension op vs torch-side copy floor"]["denominator"] in ("torch_copy_into", "torch_copy")
    summary = (tmp_path / "cpu" / "summary.md").read_text()
    assert "| ONNX Runtime, custom op | 18 |" in summary and "## Targets" in summary and "## Size sweep" in summary
    for name in ("latency.png", "memory.png", "sweep.png"):
        assert (tmp_path / "cpu" / name).stat().st_size > 0
    assert (tmp_path / "bench_all.csv").is_file() and (tmp_path / "across_entries.png").is_file()


def test_rms_norm_rows_targets_and_charts(ext, plugin_path, tmp_path):
    process = subprocess.run([sys.executable, "-m", "bench.run", "--workload", "rms_norm", "--runs", "3", "--warmup", "1",
                              "--pairs", "5", "--no-compile", "--opsets", "18", "--rounds", "1", "--target-processes",
                              "1", "--results", str(tmp_path)], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                             capture_output=True, text=True, timeout=900)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    rows = {(r["row"], r["ort_opt_level"]): r for r in _csv(tmp_path / "cpu" / "bench.csv")}
    assert set(rows) == {("torch_composite", ""), ("torch_extension", ""), ("torch_rms_norm", ""), ("torch_copy", ""),
                         ("torch_copy_into", ""), ("ort_composite", "all"), ("ort_composite", "basic"),
                         ("ort_custom", "all"), ("ort_copy", "all"), ("ort_plugin_copy", "all")}
    assert {r["op"] for r in rows.values()} == {"rms_norm"}
    # What ORT ran: its fused kernel at the default level, the six nodes at BASIC, ours with the plugin.
    assert rows[("ort_composite", "all")]["ort_graph_nodes"] == "SimplifiedLayerNormalization"
    assert rows[("ort_composite", "basic")]["ort_graph_nodes"] == "Pow+ReduceMean+Add+Sqrt+Div+Mul"
    assert rows[("ort_custom", "all")]["ort_graph_nodes"] == "myops::RMSNorm"
    assert rows[("torch_rms_norm", "")]["ort_graph_nodes"] == "F.rms_norm(x, weight.shape, weight, eps)"  # as declared
    targets = _csv(tmp_path / "cpu" / "targets.csv")
    assert {(t["op"], t["target"]) for t in targets} == {
        ("rms_norm", "extension op vs F.rms_norm"),
        ("rms_norm", "ORT custom op vs ORT composite (default level: SimplifiedLayerNormalization)")}
    assert all(t["shape"] == "8x512x768" and t["opset"] == "18" for t in targets)
    summary = (tmp_path / "cpu" / "summary.md").read_text()
    assert "## RMSNorm alone, 8x512x768, eps 1e-06" in summary and "| torch.nn.functional.rms_norm |" in summary
    for name in ("rms_norm_latency.png", "rms_norm_memory.png"):
        assert (tmp_path / "cpu" / name).stat().st_size > 0
    assert not (tmp_path / "cpu" / "latency.png").exists()  # Swish's charts: no Swish rows here


def test_an_interrupted_run_leaves_the_previous_results(ext, plugin_path, tmp_path):
    before = {"cpu/bench.csv": "entry,row\ncpu,old\n", "bench_all.csv": "entry,row\ncpu,old\n"}
    for name, text in before.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    process = bench_run(tmp_path)
    seen = ""
    deadline = time.monotonic() + 600
    while "[bench   2/8" not in seen and time.monotonic() < deadline:
        line = process.stdout.readline()
        assert line, f"bench.run ended before its second row:\n{seen[-3000:]}"
        seen += line
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=120)
    assert process.returncode != 0
    after = {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # no partial rows, no new files, no temporary debris


def test_isa_all_measures_every_cpu_path_as_rows_of_their_own(ext, plugin_path, tmp_path):
    from bench.cpu_paths import runnable

    paths = runnable()
    if len(paths) < 2:
        pytest.skip("this CPU has one path only")
    small = ["--workload", "swish", "--runs", "3", "--warmup", "1", "--no-compile", "--opsets", "18", "--rounds", "2",
             "--no-sweep", "--no-targets", "--isa", "all"]
    done = subprocess.run([sys.executable, "-m", "bench.run", *small, "--results", str(tmp_path)], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _csv(tmp_path / "cpu" / "bench.csv")
    capped = sorted((r["row"], r["isa"]) for r in rows if r["isa"])
    assert capped == sorted((row, path) for path in paths for row in ("torch_extension", "ort_custom"))
    assert all(r["processes"] == "2" for r in rows if r["isa"])
    samples = _csv(tmp_path / "cpu" / "samples.csv")
    assert {s["isa"] for s in samples} == {"", *paths}
    summary = (tmp_path / "cpu" / "summary.md").read_text()
    assert "## CPU paths of the kernel" in summary and "| baseline x86-64 |" in summary
    # The capped rows stay out of the main table: the extension is listed there once.
    assert summary.count("| PyTorch custom C++ extension |") == 1


def test_isa_the_cpu_cannot_run_is_refused_with_what_it_can(tmp_path, monkeypatch, capsys):
    from bench import run

    monkeypatch.setattr(run, "runnable", lambda: ["avx2", "baseline"])  # as on a CPU without AVX-512
    with pytest.raises(SystemExit) as exited:
        run.main(["--isa", "avx512", "--results", str(tmp_path)])
    assert exited.value.code == 2 and "cannot run avx512 (it runs avx2, baseline)" in capsys.readouterr().err
    assert not (tmp_path / "cpu").exists()


FAULTS_PROBE = """
import json, resource, numpy, torch, ops
from infer.measure import keep_freed_blocks
keep_freed_blocks()
torch.set_num_threads(2)
ops.load()
x = torch.from_numpy(numpy.ones(8 * 1024 * 1024, dtype=numpy.float32))  # 32 MiB, as the bench's inputs come
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x.clone()  # a functional op's fresh output, freed at once
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def test_timing_processes_reuse_a_freed_output_instead_of_faulting_in_fresh_pages(ext):
    """keep_freed_blocks plus timing_child_env's tunable: from the third call on, a functional op's output
    lands in the block the previous call freed. Without the tunable, calls 3 and 4 faulted in all 8,192
    pages again in 4 of 4 processes here (and at 192 MiB most calls did)."""
    from infer.measure import timing_child_env

    out = subprocess.run([sys.executable, "-c", FAULTS_PROBE], env=timing_child_env(REPO), cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    faults = json.loads(out.stdout.strip().splitlines()[-1])
    # Relative to the first call's (a fresh block): with transparent huge pages a block costs far fewer faults.
    assert sum(faults[2:]) < faults[0] // 10, faults


def test_every_timing_process_gets_the_allocator_tunable_and_its_cpu_path():
    from bench.rounds import run_child

    seen = run_child("tests.env_probe", {"row": "torch_extension", "isa": "avx2"})
    assert "glibc.malloc.tcache_count=0" in seen["GLIBC_TUNABLES"].split(":") and seen["MYOPS_CPU_ISA"] == "avx2"
    # Uncapped rows inherit the caller's environment (test_compare plants a slowdown through it).
    assert run_child("tests.env_probe", {"row": "torch_silu"})["MYOPS_CPU_ISA"] == os.environ.get("MYOPS_CPU_ISA")


def test_a_section_older_than_the_newest_rows_is_marked_in_the_summary():
    from bench.report import _other_run_note

    # bench.csv is upserted: a later `--workload swish --no-sweep` run leaves the FFN rows as old as the sweep.
    old, new = "2026-12-01T08:00:00+00:00", "2026-12-02T08:00:00+00:00"
    rows = [{"workload": "ffn", "timestamp": old}, {"workload": "swish", "timestamp": new}]
    assert _other_run_note([{"timestamp": new, "git_sha": "a" * 40}], rows) == []
    note = "".join(_other_run_note([{"timestamp": old, "git_sha": "b" * 40}], rows))
    assert "earlier run" in note and old in note and "b" * 12 in note
    assert _other_run_note([{"git_sha": "b" * 40}], rows) == []  # no timestamps: nothing to say
    # A user's op alone (no Swish rows): its targets against its own rows.
    mish = [{"workload": "mish", "timestamp": new}]
    assert "earlier run" in "".join(_other_run_note([{"op": "mish", "timestamp": old, "git_sha": "c" * 40}], mish))
    assert _other_run_note([{"op": "mish", "timestamp": new, "git_sha": "c" * 40}], rows + mish) == []
