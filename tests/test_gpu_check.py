"""bench.gpu_check where there is no GPU: its refusal, its nvcc builds, its stages' logic on the CPU,
and the suite stage's reading of a real pytest run.

The GPU run itself (the suite's cuda tests, the rows, the targets) needs a GPU host:
`python -m bench.gpu_check`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check
from bench.gpu import build, host, rows, suite, targets
from bench.gpu.stages import Run

REPO = Path(__file__).resolve().parent.parent


def _nvcc(in_ci: bool) -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if in_ci:
            pytest.fail("nvcc is expected on CI machines of this kind")
        pytest.skip("nvcc not installed")
    return nvcc


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


def test_without_a_gpu_one_clear_message(tmp_path):
    out = tmp_path / "results"
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on GPU machines too.
    result = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--out", str(out)], capture_output=True,
                            text=True, cwd=REPO, env=_env(CUDA_VISIBLE_DEVICES=""), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no CUDA device: run this on a GPU host; "), result.stderr
    assert "stage" not in result.stdout, "nothing may start without a GPU"
    assert not out.exists()


@pytest.mark.nvcc
def test_direct_build_cuda_objects_compile(tmp_path, monkeypatch, in_ci):
    """The no-ninja build's nvcc commands compile the extension's CUDA sources (compile only: no GPU torch)."""
    nvcc = _nvcc(in_ci)
    from torch.utils import cpp_extension

    from ops import build as ops_build

    monkeypatch.setattr(ops_build, "BUILD_ROOT", tmp_path / "build")
    # A CPU wheel of torch knows no CUDA_HOME and lacks one generated header (see test_ort_plugin.py).
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(Path(nvcc).resolve().parent.parent))
    generated = tmp_path / "generated" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    generated.parent.mkdir(parents=True)
    generated.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    jobs, link, library = build.direct_build_plan("90", nvcc)
    from opspec import TORCH_OPS
    from opspec.codegen import generated, generic_ops

    # The library's frame, then per op: its CPU source, its CUDA adapter (written from its declaration,
    # declared-<op>*, for an op of a kind; with the launchers, for an op whose math is one element's
    # functions) and its own CUDA kernels (kernels/<op>_cuda.cu, where it has them).
    generic = {spec.name for spec in generic_ops()}
    own_cuda = {op for op, spec in TORCH_OPS.items() if not generated(spec, "cuda")}
    stem = {op: f"declared-{op}" if op in generic else op for op in TORCH_OPS}
    assert {obj.name for obj in jobs} == {f"{stem[op]}{suffix}.o" for op in TORCH_OPS for suffix in ("", "_cuda_op")} | \
        {f"kernels_{op}_cuda.o" for op in own_cuda} | {"declared-library.o"}
    assert link[0] == nvcc and "-ltorch_cuda" in link and str(library) in link
    # MYOPS_CUDA_OBJECTS_OF=op,...: those ops' objects alone (test_new_op's copy: the scaffolded op's; the
    # lab's own ops are compiled by this test in the checkout)
    only = set(filter(None, os.environ.get("MYOPS_CUDA_OBJECTS_OF", "").split(","))) or set(TORCH_OPS)
    assert only <= set(TORCH_OPS), f"MYOPS_CUDA_OBJECTS_OF names ops the registry lacks: {only - set(TORCH_OPS)}"
    mine = {f"{stem[op]}_cuda_op.o" for op in only} | {f"kernels_{op}_cuda.o" for op in only & own_cuda}
    running = [(obj, subprocess.Popen([*command, f"-I{tmp_path / 'generated'}", "-o", str(obj)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
               for obj, command in jobs.items() if obj.name in mine and command[0] == nvcc]
    assert len(running) == len(only) + len(only & own_cuda)
    for obj, process in running:
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, f"{obj.name}:\n{output[-3000:]}"
        assert obj.stat().st_size > 0


def test_direct_build_cpu_links_and_runs(tmp_path):
    """The no-ninja build, CPU kernels only, in a fresh process (the session's extension is loaded here)."""
    script = (
        "import torch\n"
        "from bench.gpu.build import direct_build\n"
        "library = direct_build(None, None, timeout=600)\n"
        "torch.ops.load_library(str(library))\n"
        "x = torch.linspace(-30, 30, 1001)\n"
        "torch.testing.assert_close(torch.ops.myops.swish(x, 1.702), x * torch.sigmoid(1.702 * x), atol=1e-6, rtol=1.3e-6)\n"
        "print('ok', library)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=900,
                            env=_env(MYOPS_BUILD_DIR=str(tmp_path / "build")))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.startswith("ok ")


def test_matrix_reader_without_yaml_agrees_with_lab_matrix(monkeypatch):
    from lab import matrix

    validated = host.matrix_entries()
    assert validated["cpu"] == "cpu" and validated["cuda13.0"] == "cuda"

    def no_yaml(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'yaml'")

    monkeypatch.setattr(matrix, "load", no_yaml)
    assert host.matrix_entries() == validated


def test_entry_follows_torch_cuda():
    entries = host.matrix_entries()
    assert host.choose_entry(None, "13.0", entries) == ("cuda13.0", None)
    assert host.choose_entry(None, "11.8", entries) == ("cuda11.8", None)
    entry, note = host.choose_entry(None, "12.6", entries)
    assert entry == "cuda12.4" and "12.6" in note
    assert host.choose_entry("cuda12.1", "13.0", entries) == ("cuda12.1", None)
    for requested, cuda in ((None, "14.0"), (None, None), ("cpu", "13.0"), ("cuda9.9", "13.0")):
        with pytest.raises(host.HostError):
            host.choose_entry(requested, cuda, entries)


def test_rows_written_in_the_benchmark_format(tmp_path):
    from bench.run import COLUMNS
    from lab.files import read_csv, write_csv_atomic

    class Args:
        beta, warmup, runs = 1.0, 10, 100

    setup = host.Setup("cuda13.0", "90", "9.0", "nvcc", "NVIDIA H200", "570.00",
                       {"torch": "2.13.0", "torch_cuda": "13.0", "git_sha": "abc", "git_dirty": False,
                        "timestamp": "2026-01-01T00:00:00+00:00"})
    # Per-call times that dispatch dominates (all alike); bandwidth comes from the device times.
    measured = {"p20_ms": 0.03, "p50_ms": 0.03, "p80_ms": 0.03, "peak_mb": 256.0, "memory_method": "m"}
    made = [rows.make_row(setup, Args, "swish_large", (64, 2048, 768), "float32", row, row, factor * 4 * 3 << 25,
                          dict(measured, device_ms=device))
            for row, factor, device in (("torch_copy", 2, 0.1), ("torch_extension", 2, 0.125),
                                        ("torch_extension_backward", 3, 0.15))]
    from infer.rows import derive

    derive(made, {"L2": 50 << 20})  # the CPU bench's (one row format, one derivation); an H200's L2
    assert [r["fraction_of_copy"] for r in made] == [1.0, 0.8, 1.0]
    assert made[1]["op"] == "swish" and made[1]["dtype"] == "float32" and made[1]["shape"] == "64x2048x768"
    assert made[0]["gb_per_s"] == round(2 * 4 * 3 * 2**25 / 1e-4 / 1e9, 3)
    assert {r["regime"] for r in made} == {"DRAM"}  # 768 MiB in and out
    small = [dict(made[0], workload="swish", bytes_moved=2 * 4 * 8 * 512 * 768)]
    derive(small, {"L2": 50 << 20})
    assert small[0]["regime"] == "L2"  # 24 MiB: why its GB/s may exceed DRAM bandwidth
    # An existing CPU entry stays in the aggregate; a second write replaces the GPU rows, no duplicates.
    write_csv_atomic(tmp_path / "cpu" / "bench.csv", [dict(made[0], entry="cpu", execution_provider="torch-cpu")], COLUMNS)
    found = [{"entry": "cuda13.0", "op": "swish", "target": "t", "median_ratio": 0.5, "limit": 0.6667, "holds": True}]
    for _ in range(2):
        gpu_check.write_results(tmp_path, "cuda13.0", made, found)
    written = read_csv(tmp_path / "cuda13.0" / "bench.csv")
    assert len(written) == 3 and list(written[0]) == COLUMNS
    assert written[1]["execution_provider"] == "torch-cuda" and written[1]["device"] == "NVIDIA H200"
    assert len(read_csv(tmp_path / "bench_all.csv")) == 4
    assert read_csv(tmp_path / "cuda13.0" / "targets.csv")[0]["limit"] == "0.6667"  # numeric, as the CPU's


def test_a_device_time_without_noise_is_shown_not_a_crash():
    """Too few cold samples give a time and no noise (None); the row's log line says so (it raised
    TypeError when the host clock ran slow under load)."""
    assert rows._shown(0.25, None) == "  0.2500 ms (noise n/a)"
    assert rows._shown(0.25, 0.012) == "  0.2500 ms ( 1.2 %)"
    assert rows._shown(None, None) == "    none"


def test_target_status_says_by_how_much():
    from bench.targets import target_status

    assert target_status(0.85, 0.9) == "met (5.6 % under the limit)"
    assert target_status(1.8, 1.5) == "MISSED by 20.0 %"


def test_bench_and_target_stages_run_on_the_cpu(ext, monkeypatch, host_clock_cuda):
    """The rows, their derived columns and the paired targets, with host-clock events and CPU tensors."""
    monkeypatch.setattr(rows, "DEVICE", "cpu")
    monkeypatch.setattr(rows, "DTYPES", ("float32",))
    monkeypatch.setattr(rows, "WORKLOADS", (("swish", (2, 8, 16)), ("swish_large", (4, 64, 64)),
                                            ("rms_norm", (2, 8, 16)), ("rms_norm_4096", (2, 4, 64))))
    monkeypatch.setattr(rows, "warm_up_gpu", lambda: None)

    class Args:
        beta, warmup, runs, pairs = 1.0, 2, 5, 5
        max_noise, min_samples, time_cap = 50.0, 3, 0.05  # percent, count, seconds: quick on the host clock

    setup = host.Setup("cuda13.0", "90", "9.0", "nvcc", "GPU", None, {"git_sha": "abc", "timestamp": "t"})
    run = Run(60, gpu_check.BUDGETS_S)
    with run.stage("bench"):
        measured = rows.bench_stage(run, setup, Args)
    assert [r["row"] for r in measured[:7]] == ["torch_copy", "torch_composite", "torch_extension", "torch_silu",
                                                "torch_composite_backward", "torch_extension_backward",
                                                "torch_silu_backward"]
    rms = [r for r in measured if r["op"] == "rms_norm"]
    assert [r["row"] for r in rms[:7]] == ["torch_copy", "torch_composite", "torch_extension", "torch_rms_norm",
                                           "torch_composite_backward", "torch_extension_backward",
                                           "torch_rms_norm_backward"]
    assert len(measured) == 28 and all(r["gb_per_s"] and r["fraction_of_copy"] for r in measured)
    # RMSNorm's forward moves x, y and the weight once: a little more than its copy.
    assert rms[2]["bytes_moved"] == (2 * 2 * 8 * 16 + 16) * 4 and rms[0]["bytes_moved"] == 2 * 2 * 8 * 16 * 4
    assert all(r["device_ms"] > 0 and "spin kernel" in r["timing_method"] and r["tf32"].startswith("off")
               for r in measured)
    # Warm and cold device times, each with its noise; no peak bandwidth off the GPU.
    # (a row that reached the time cap with one sample, as on a loaded host, has no noise, and says so)
    assert all(r["device_cold_ms"] > 0 for r in measured)
    assert all(r[column] >= 0 if r[column] is not None else "stopped at the time cap" in r["timing_method"]
               for r in measured for column in ("device_noise", "device_cold_noise")), measured
    assert all("cold: one call" in r["timing_method"] and r["fraction_of_peak"] is None for r in measured)
    assert measured[0]["peak_mb"] == 1.0 and measured[0]["memory_method"].startswith("torch.cuda.max_memory_allocated")
    with run.stage("targets"):
        found = targets.targets_stage(run, setup, Args) + targets.memory_targets(setup, measured)
    assert [(t["op"], t["numerator"], t["denominator"]) for t in found] == [
        ("swish", "torch_extension", "torch_copy"), ("swish", "torch_extension", "torch_composite"),
        ("swish", "torch_extension_backward", "torch_composite_backward"),
        ("rms_norm", "torch_extension", "torch_rms_norm"),
        ("swish", "torch_extension peak - (torch_composite peak - one tensor)", "one tensor (0.1 MiB)")]
    assert all(isinstance(t["limit"], float) and t["holds"] == (t["median_ratio"] <= t["limit"]) for t in found)
    assert all(t["target"].endswith("float32 4x64x64") for t in found if t["op"] == "swish")
    assert found[3]["target"].endswith("float32 2x4x64")
    # The allocator figures are faked (every row 1 MiB): no memory saved (a whole tensor unsaved), so that target is missed.
    assert found[-1]["median_ratio"] == 1 and found[-1]["holds"] is False


@pytest.mark.parametrize("suite_fails", [False, True], ids=["all-pass", "a-check-fails"])
def test_main_runs_the_stages_and_writes_only_when_correct(ext, monkeypatch, tmp_path, capsys, suite_fails):
    """main's glue with each stage stubbed (the stages themselves are tested above, below, or need a GPU)."""
    import torch

    from bench.gpu import plugin
    from bench.gpu.stages import Check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(rows, "DEVICE", "cpu")
    setup = host.Setup("cuda13.0", "90", "9.0", "nvcc", "GPU", None, {"git_sha": "abc", "timestamp": "t"})
    monkeypatch.setattr(gpu_check, "preflight", lambda args, torch: setup)
    monkeypatch.setattr(plugin, "start_harness_build", lambda nvcc, arch, build_dir: None)
    monkeypatch.setattr(plugin, "finish_harness_build", lambda started, timeout: tmp_path / "harness")
    monkeypatch.setattr(gpu_check, "build_extension", lambda setup, run: "already loaded")
    outcome = Check("suite", "test_x.py::test_y", "FAIL" if suite_fails else "PASS", "wrong" if suite_fails else "1 passed")
    monkeypatch.setattr(gpu_check, "suite_stage", lambda run, setup, harness: run.record(outcome))
    monkeypatch.setattr(gpu_check, "load_plugin_on_cuda", lambda run, setup: None)
    measured = {"p20_ms": 1.0, "p50_ms": 1.0, "p80_ms": 1.0, "peak_mb": 1.0, "memory_method": "m"}
    monkeypatch.setattr(rows, "bench_stage", lambda run, setup, args: [
        rows.make_row(setup, args, "swish", (2,), "float32", "torch_copy", "torch.clone", 16, measured)])
    monkeypatch.setattr(targets, "targets_stage", lambda run, setup, args: [
        {"entry": "cuda13.0", "target": "t", "median_ratio": 0.8, "limit": 0.6667, "holds": False}])

    code = gpu_check.main(["--out", str(tmp_path / "results")])
    out = capsys.readouterr().out
    assert "MISSED by 20.0 %" in out
    if suite_fails:
        assert code == 1 and "not writing results" in out and not (tmp_path / "results").exists()
    else:
        assert code == 0 and (tmp_path / "results" / "cuda13.0" / "bench.csv").is_file()


SUITE_FILE = """
import pytest

@pytest.mark.cuda
@pytest.mark.parametrize("n", [1, 2, 3])
def test_mixed(n):
    assert n != 3, "three is wrong"

@pytest.mark.cuda
@pytest.mark.parametrize("n", [1, 2])
def test_all_skipped(n):
    pytest.skip("no such device here")

@pytest.mark.cuda
def test_passes():
    pass

def test_not_a_cuda_test():
    raise AssertionError("deselected by -m cuda: must not run")
"""


def test_the_suite_stage_reads_a_real_pytest_run(tmp_path):
    """A real child pytest on a small file: one check per test function, failures with their message,
    skips with their reason, and what -m cuda deselects never runs."""
    path = tmp_path / "test_sample.py"
    path.write_text(SUITE_FILE)
    checks = {c.name: c for c in suite.run_suite({}, timeout=120, files=[path])}
    assert set(checks) == {"test_sample.py::test_mixed", "test_sample.py::test_all_skipped", "test_sample.py::test_passes"}
    mixed = checks["test_sample.py::test_mixed"]
    assert mixed.status == "FAIL" and mixed.detail.startswith("2 passed, 1 failed; first: test_mixed[3]")
    assert "three is wrong" in mixed.detail
    assert checks["test_sample.py::test_all_skipped"].status == "SKIP"
    assert "no such device here" in checks["test_sample.py::test_all_skipped"].detail
    assert checks["test_sample.py::test_passes"].status == "PASS"
    empty = tmp_path / "test_empty.py"
    empty.write_text("def test_plain():\n    pass\n")
    (nothing,) = suite.run_suite({}, timeout=120, files=[empty])
    assert nothing.status == "FAIL" and "no cuda tests were collected" in nothing.detail


def test_the_suite_stage_stops_a_child_that_hangs(tmp_path):
    """The timeout holds while the child prints nothing (its output is read on another thread)."""
    import time

    path = tmp_path / "test_hang.py"
    path.write_text("import time\nimport pytest\n\n\n@pytest.mark.cuda\ndef test_hangs():\n    time.sleep(300)\n")
    began = time.monotonic()
    (check,) = suite.run_suite({}, timeout=5, files=[path])
    assert check.status == "FAIL" and check.detail.startswith("did not finish within 5 s"), check
    assert time.monotonic() - began < 60


def test_required_cuda_tests_fail_where_there_is_no_gpu():
    """gpu_check's suite sets MYOPS_REQUIRE_CUDA=1: a GPU host whose cuda tests would all skip fails instead."""
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "tests/test_swish.py",
               "-k", "default_beta"]
    required = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600,
                              env=_env(CUDA_VISIBLE_DEVICES="", MYOPS_REQUIRE_CUDA="1"))
    assert required.returncode == 1 and "MYOPS_REQUIRE_CUDA=1 says the cuda tests must run here" in required.stdout, \
        required.stdout[-2000:]
    skipped = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600,
                             env=_env(CUDA_VISIBLE_DEVICES=""))
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout[-2000:]


def test_the_suite_runs_every_ops_layer1_file():
    from opspec import TORCH_OPS

    names = [path.name for path in suite.test_files()]
    own = [f"test_{op}.py" for op in TORCH_OPS if (REPO / "tests" / f"test_{op}.py").is_file()]
    assert names == own + ["test_declared_ops.py", "test_plugin_cuda.py"]
    assert own == ["test_rms_norm.py", "test_swish.py"]  # the lab's own ops; a scaffolded one has none


def test_direct_build_uses_the_standard_of_this_torch(tmp_path):
    import torch

    from lab.compat import extension_cxx_standard

    jobs, _, _ = build.direct_build_plan(None, None)
    from opspec.codegen import generic_ops

    assert len(jobs) == 1 + len(generic_ops())  # the library's frame, each op's schema and CPU kernels
    for command in jobs.values():
        assert f"-std={extension_cxx_standard(torch.__version__)}" in command
    # An nvcc that answers as CUDA 11.8's does: C++20 torch headers cannot be compiled with it.
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n"
                    "echo 'Build cuda_11.8.r11.8/compiler.31833905_0'\n")
    nvcc.chmod(0o755)
    if extension_cxx_standard(torch.__version__) == "c++20":
        with pytest.raises(ValueError, match="nvcc 11.8 cannot compile"):
            build.direct_build_plan("90", str(nvcc))


def test_an_onnxruntime_without_the_cuda_ep_is_a_skip_not_a_failure(tmp_path):
    """What the host lacks is reported with its reason (the suite's test skips, the target is a note)."""
    import onnxruntime as ort

    from bench.gpu import plugin

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA EP")
    with pytest.raises(plugin.Unavailable, match="has no CUDAExecutionProvider"):
        plugin.cuda_session_factory("90", "cuda13.0", tmp_path / "ort_plugin")
    setup = host.Setup("cuda13.0", "90", "9.0", "nvcc", "GPU", None, {})
    run = Run(60, gpu_check.BUDGETS_S)
    gpu_check.load_plugin_on_cuda(run, setup)
    assert setup.ort_plugin is None and "has no CUDAExecutionProvider" in run.notes[0] and not run.failed


def test_ort_per_call_target_pairs_the_plugin_with_the_composite(ext, plugin_path, monkeypatch, host_clock_cuda):
    """Its plumbing on the CPU EP with the CPU plugin; on a GPU host the same code runs on CUDA."""
    monkeypatch.setattr(rows, "DEVICE", "cpu")

    class Args:
        beta, pairs = 1.0, 5

    setup = host.Setup("cuda13.0", "90", "9.0", "nvcc", "GPU", None, {"git_sha": "abc", "timestamp": "t"})
    assert targets.ort_per_call_target(setup, Args) == []  # the plugin stage did not pass: nothing to pair
    setup.ort_plugin = plugin_path
    (target,) = targets.ort_per_call_target(setup, Args)
    assert target["numerator"] == "ort_custom" and target["denominator"] == "torch_composite"
    assert target["median_ratio"] > 0 and target["limit"] == round(1 / 1.3, 4)
    assert target["holds"] == (target["median_ratio"] <= target["limit"])


def test_plugin_kernel_target_reads_the_harness_timing(tmp_path):
    """The Python side of `plugin_harness time` (the binary's side needs a GPU): a script that answers
    as the harness does stands in for it."""
    script = tmp_path / "harness"
    script.write_text('#!/bin/sh\n[ "$1" = time ] || exit 2\necho "forward_ms=0.125000 copy_ms=0.100000"\n')
    script.chmod(0o755)
    setup = host.Setup("cuda13.0", "90", "9.0", "nvcc", "GPU", None, {"git_sha": "abc", "timestamp": "t"})
    assert targets.plugin_kernel_targets(setup, None) == []
    f32, f16 = targets.plugin_kernel_targets(setup, script)
    assert f32["median_ratio"] == 1.25 and f32["holds"] is False and f16["target"].endswith("float16 64x2048x768")
    script.write_text("#!/bin/sh\necho 'plugin_harness: cudaMalloc(in): cudaErrorMemoryAllocation' >&2\nexit 1\n")
    with pytest.raises(RuntimeError, match="cudaErrorMemoryAllocation"):
        targets.plugin_kernel_targets(setup, script)


def _closure(names: list[str]) -> set[str]:
    """The installed distributions `names` need (their run-time requirements on this interpreter)."""
    import re
    from importlib.metadata import requires

    from packaging.markers import Marker

    found, todo = set(), list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in found:
            continue
        found.add(name)
        for requirement in requires(name) or []:
            spec, _, marker = requirement.partition(";")
            if marker and not Marker(marker).evaluate({"extra": ""}):
                continue
            todo.append(re.match(r"[A-Za-z0-9_.-]+", spec.strip())[0])
    return found


@pytest.fixture(scope="module")
def torch_numpy_python(tmp_path_factory) -> Path:
    """A venv holding torch, numpy, pytest and what they require, nothing else (no PyYAML,
    no onnx, no onnxruntime): the GPU host the README promises is enough. The installed files are linked in."""
    from importlib.metadata import distribution

    venv = tmp_path_factory.mktemp("torch-numpy") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for name in sorted(_closure(["torch", "numpy", "pytest"])):
        dist = distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            if not top.endswith(".pth") and not (site / top).exists():
                (site / top).symlink_to(Path(dist.locate_file(top)))
    return venv / "bin" / "python"


def test_a_torch_numpy_and_pytest_host_is_enough(torch_numpy_python, tmp_path):
    """gpu_check's preflight facts and every module its stages import, and the suite's test files
    collected, in that venv; then its no-GPU exit."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    script = (
        "import importlib.util, sys, torch\n"
        "for absent in ('yaml', 'onnx', 'onnxruntime'):\n"
        "    assert importlib.util.find_spec(absent) is None, absent\n"
        "from bench import gpu_check\n"
        "from bench.gpu import host, rows, suite\n"
        "entry, _ = host.choose_entry(None, '13.0', host.matrix_entries())\n"
        "from lab import compat, provenance\n"
        "compat.extension_cxx_standard(torch.__version__, '13.0')\n"
        "provenance.collect()\n"
        # what the build, bench, targets and write stages import (the plugin through onnxruntime's CUDA EP
        # imports onnxruntime first, and is a skip or a note without it)
        "for name in ('ops', 'ops.build', 'ops.registry', 'ops.declaration', 'infer.rows', 'infer.workloads',\n"
        "             'bench.torch_rows', 'bench.cuda_timing', 'bench.targets', 'bench.report', 'lab.files'):\n"
        "    importlib.import_module(name)\n"
        "print(entry, rows.WORKLOADS)\n"
        "print(' '.join(str(f) for f in suite.test_files()))\n"
    )
    done = subprocess.run([str(torch_numpy_python), "-c", script], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    first, files = done.stdout.splitlines()[:2]
    assert first.startswith("cuda13.0 ") and "('swish_large', (64, 2048, 768))" in first
    # The suite's files import in that venv: collected, their cuda cases skipped with the reason.
    collected = subprocess.run([str(torch_numpy_python), "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p",
                                "no:cacheprovider", *files.split()], capture_output=True, text=True, cwd=REPO,
                               env=dict(env, PYTHONPATH=str(REPO)), timeout=600)
    assert collected.returncode == 0 and " skipped" in collected.stdout, collected.stdout[-3000:] + collected.stderr[-2000:]
    assert "no CUDA device" in collected.stdout or "CPU-only build" in collected.stdout, collected.stdout[-2000:]
    out = tmp_path / "results"
    done = subprocess.run([str(torch_numpy_python), "-m", "bench.gpu_check", "--out", str(out)], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 2 and done.stderr.startswith("error: no CUDA device: run this on a GPU host"), done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
