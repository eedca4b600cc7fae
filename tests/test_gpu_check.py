"""bench.gpu_check where there is no GPU: its refusal, its nvcc builds, and its logic on the CPU.

The GPU run itself (layer 1 on CUDA, the harness against its float64 reference, the rows) needs a GPU host:
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
def test_plugin_harness_compiles_and_checks_its_arguments(tmp_path, in_ci):
    harness = tmp_path / "plugin_harness"
    result = subprocess.run(gpu_check.harness_command(_nvcc(in_ci), "90", harness), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]

    def call(*args):
        return subprocess.run([str(harness), *map(str, args)], capture_output=True, text=True, timeout=60)

    assert call().returncode == 2 and "usage" in call().stderr
    assert call("f64", 0, "in", "out", 1.0).returncode == 2
    assert call("f32", "x", "in", "out", 1.0).returncode == 2
    missing = call("f32", 0, tmp_path / "missing.bin", tmp_path / "out.bin", 1.0)
    assert missing.returncode == 1 and "cannot read" in missing.stderr
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0" * 6)
    assert call("f32", 0, odd, tmp_path / "out.bin", 1.0).returncode == 2

    import numpy as np

    source = tmp_path / "in.bin"
    np.linspace(-5, 5, 37, dtype=np.float32).tofile(source)
    ran = call("f32", 1, source, tmp_path / "out.bin", 1.0, 1.702)
    if ran.returncode == 0:  # a machine with a GPU: two betas' worth of output
        assert (tmp_path / "out.bin").stat().st_size == 2 * 37 * 4
    else:  # no GPU: a CUDA error, reported as such
        assert ran.returncode == 1 and ran.stderr.startswith("plugin_harness: "), ran.stderr
    # The timing mode: its arguments checked before any CUDA call; without a GPU, a CUDA error.
    assert call("time", "f32", 0, 10).returncode == 2 and "N must be" in call("time", "f32", 0, 10).stderr
    assert call("time", "f64", 8, 10).returncode == 2
    timed = call("time", "f16", 1 << 20, 5)
    if timed.returncode == 0:
        assert gpu_check.parse_harness_timing(timed.stdout)["forward_ms"] > 0
    else:
        assert timed.returncode == 1 and timed.stderr.startswith("plugin_harness: "), timed.stderr


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
    jobs, link, library = gpu_check.direct_build_plan("90", nvcc)
    from opspec import TORCH_OPS

    # Per op: its CPU source, its CUDA adapter and its shared CUDA kernels (every op of the registry).
    assert {obj.name for obj in jobs} == {f"{op}{suffix}.o" for op in TORCH_OPS for suffix in ("", "_cuda_op")} | \
        {f"kernels_{op}_cuda.o" for op in TORCH_OPS}
    assert link[0] == nvcc and "-ltorch_cuda" in link and str(library) in link
    running = [(obj, subprocess.Popen([*command, f"-I{tmp_path / 'generated'}", "-o", str(obj)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
               for obj, command in jobs.items() if obj.suffix == ".o" and command[0] == nvcc]
    assert len(running) == 2 * len(TORCH_OPS)
    for obj, process in running:
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, f"{obj.name}:\n{output[-3000:]}"
        assert obj.stat().st_size > 0


def test_direct_build_cpu_links_and_runs(tmp_path):
    """The no-ninja build, CPU kernels only, in a fresh process (the session's extension is loaded here)."""
    script = (
        "import torch\n"
        "from bench import gpu_check\n"
        "library = gpu_check.direct_build(None, None, timeout=600)\n"
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

    validated = gpu_check.matrix_entries()
    assert validated["cpu"] == "cpu" and validated["cuda13.0"] == "cuda"

    def no_yaml(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'yaml'")

    monkeypatch.setattr(matrix, "load", no_yaml)
    assert gpu_check.matrix_entries() == validated


def test_entry_follows_torch_cuda():
    entries = gpu_check.matrix_entries()
    assert gpu_check.choose_entry(None, "13.0", entries) == ("cuda13.0", None)
    assert gpu_check.choose_entry(None, "11.8", entries) == ("cuda11.8", None)
    entry, note = gpu_check.choose_entry(None, "12.6", entries)
    assert entry == "cuda12.4" and "12.6" in note
    assert gpu_check.choose_entry("cuda12.1", "13.0", entries) == ("cuda12.1", None)
    for requested, cuda in ((None, "14.0"), (None, None), ("cpu", "13.0"), ("cuda9.9", "13.0")):
        with pytest.raises(gpu_check.HostError):
            gpu_check.choose_entry(requested, cuda, entries)


def test_rows_written_in_the_benchmark_format(tmp_path):
    from bench.run import COLUMNS
    from lab.files import read_csv, write_csv_atomic

    class Args:
        beta, warmup, runs = 1.0, 10, 100

    setup = gpu_check.Setup("cuda13.0", "90", "9.0", "nvcc", "NVIDIA H200", "570.00",
                            {"torch": "2.13.0", "torch_cuda": "13.0", "git_sha": "abc", "git_dirty": False,
                             "timestamp": "2026-01-01T00:00:00+00:00"})
    # Per-call times that dispatch dominates (all alike); bandwidth comes from the device times.
    measured = {"p20_ms": 0.03, "p50_ms": 0.03, "p80_ms": 0.03, "peak_mb": 256.0, "memory_method": "m"}
    rows = [gpu_check.make_row(setup, Args, "swish_large", (64, 2048, 768), "float32", row, row, factor * 4 * 3 << 25,
                               dict(measured, device_ms=device))
            for row, factor, device in (("torch_copy", 2, 0.1), ("torch_extension", 2, 0.125),
                                        ("torch_extension_backward", 3, 0.15))]
    from infer.rows import derive

    derive(rows, {"L2": 50 << 20})  # the CPU bench's (one row format, one derivation); an H200's L2
    assert [r["fraction_of_copy"] for r in rows] == [1.0, 0.8, 1.0]
    assert rows[1]["op"] == "swish" and rows[1]["dtype"] == "float32" and rows[1]["shape"] == "64x2048x768"
    assert rows[0]["gb_per_s"] == round(2 * 4 * 3 * 2**25 / 1e-4 / 1e9, 3)
    assert {r["regime"] for r in rows} == {"DRAM"}  # 768 MiB in and out
    small = [dict(rows[0], workload="swish", bytes_moved=2 * 4 * 8 * 512 * 768)]
    derive(small, {"L2": 50 << 20})
    assert small[0]["regime"] == "L2"  # 24 MiB: why its GB/s may exceed DRAM bandwidth
    # An existing CPU entry stays in the aggregate; a second write replaces the GPU rows, no duplicates.
    write_csv_atomic(tmp_path / "cpu" / "bench.csv", [dict(rows[0], entry="cpu", execution_provider="torch-cpu")], COLUMNS)
    targets = [{"entry": "cuda13.0", "op": "swish", "target": "t", "median_ratio": 0.5, "limit": 0.6667, "holds": True}]
    for _ in range(2):
        gpu_check.write_results(tmp_path, "cuda13.0", rows, targets)
    written = read_csv(tmp_path / "cuda13.0" / "bench.csv")
    assert len(written) == 3 and list(written[0]) == COLUMNS
    assert written[1]["execution_provider"] == "torch-cuda" and written[1]["device"] == "NVIDIA H200"
    assert len(read_csv(tmp_path / "bench_all.csv")) == 4
    assert read_csv(tmp_path / "cuda13.0" / "targets.csv")[0]["limit"] == "0.6667"  # numeric, as the CPU's


def test_target_status_says_by_how_much():
    from bench.targets import target_status

    assert target_status(0.85, 0.9) == "met (5.6 % under the limit)"
    assert target_status(1.8, 1.5) == "MISSED by 20.0 %"


def test_layer1_checks_pass_on_the_cpu_kernel(ext, monkeypatch):
    """The checks' own logic, float32 on the CPU (the CPU kernel has no float16/bfloat16)."""
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    assert gpu_check.check_random("float32") == f"{len(gpu_check.SHAPES) * len(gpu_check.BETAS)} cases"
    gpu_check.check_edges("float32")
    gpu_check.check_views("float32")
    # RMSNorm's: the chunk edges read off kernels/rms_norm_cuda.cu, then every case on the CPU kernel.
    chunk, max_chunks = gpu_check.rms_norm_chunking()
    assert (chunk, max_chunks) == (64, 65535)
    rows = [r for r, _ in gpu_check.rms_norm_shapes()]
    assert {1, 63, 64, 65, 4097, 64 * 65535 + 3} <= set(rows)
    assert gpu_check.check_rms_norm("float32") == f"{len(rows) * len(gpu_check.RMS_NORM_EPS)} cases"
    gpu_check.check_rms_norm_zero_rows("float32")
    inputs = gpu_check.plugin_inputs()
    for dtype_name, x in inputs.items():
        y = gpu_check.plugin_reference(x, 1.702)
        assert y.dtype == x.dtype and y.shape == x.shape
    with pytest.raises(AssertionError, match="not close"):
        gpu_check._close_np(inputs["float32"] * 1.001, inputs["float32"], gpu_check.PLUGIN_TOL["float32"], "scaled")


ULPS_OF_CUDA_EXPF = 2  # CUDA C++ Programming Guide, "Mathematical Functions": expf, maximum ulp error 2 (no fast math)


def _steps(values, ulps: int):
    """Finite positive values moved `ulps` float32 steps up (or down); 0, inf and NaN stay, as expf's
    special cases and its overflow (inf beyond 88.72) are exact."""
    import numpy as np

    out = values.copy()
    inexact = np.isfinite(out) & (out > 0)
    for _ in range(abs(ulps)):
        out[inexact] = np.nextafter(out[inexact], np.float32(np.inf if ulps > 0 else 0), dtype=np.float32)
    return out


def emulated_gpu_swish(x, beta: float) -> list:
    """Every result the plugin's CUDA kernel may give, in numpy's float32: beta*x rounded, expf anywhere
    within 2 ulp of e^-(beta x), then 1 + e and x / d each rounded (nvcc's IEEE division and adds), then
    rounded to x's dtype as the kernel stores it."""
    import numpy as np

    x32 = np.asarray(x, dtype=np.float32)
    scaled = np.float32(beta) * x32
    with np.errstate(over="ignore", invalid="ignore"):
        exact = np.exp(-scaled.astype(np.float64)).astype(np.float32)
        return [(x32 / (np.float32(1) + _steps(exact, k))).astype(x.dtype)
                for k in range(-ULPS_OF_CUDA_EXPF, ULPS_OF_CUDA_EXPF + 1)]


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
def test_plugin_reference_holds_against_the_gpus_float32_math(dtype_name):
    """What the GPU's plugin check compares against agrees with every result CUDA's expf allows, at
    the check's own inputs and betas: the check cannot fail on a correct kernel."""
    x = gpu_check.plugin_inputs()[dtype_name]
    for beta in gpu_check.PLUGIN_BETAS:
        want = gpu_check.plugin_reference(x, beta)
        for k, got in enumerate(emulated_gpu_swish(x, beta)):
            gpu_check._close_np(got, want, gpu_check.PLUGIN_TOL[dtype_name],
                                f"beta {beta}, expf {k - ULPS_OF_CUDA_EXPF:+d} ulp")


def test_the_cpu_kernels_vector_path_would_have_failed_the_plugin_check(ext):
    """Why the reference is not the extension's CPU kernel: on a vector path (2^t for e^-(beta x)) it
    differs from the GPU's math by more than the tolerance, where e^-(beta x) is huge."""
    import torch

    from bench.cpu_paths import runnable

    if not set(runnable()) & {"avx512", "avx2", "neon"} or os.environ.get("MYOPS_CPU_ISA") == "baseline":
        pytest.skip("this host runs the scalar path only")
    x = gpu_check.plugin_inputs()["float32"]
    cpu = torch.ops.myops.swish(torch.from_numpy(x), 1.0).numpy()
    exact_gpu = emulated_gpu_swish(x, 1.0)[ULPS_OF_CUDA_EXPF]  # expf correctly rounded
    with pytest.raises(AssertionError, match="not close"):
        gpu_check._close_np(exact_gpu, cpu, gpu_check.PLUGIN_TOL["float32"], "vector path")


def test_bench_and_target_stages_run_on_the_cpu(ext, monkeypatch, host_clock_cuda):
    """The rows, their derived columns and the paired targets, with host-clock events and CPU tensors."""
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    monkeypatch.setattr(gpu_check, "DTYPES", ("float32",))
    monkeypatch.setattr(gpu_check, "WORKLOADS", (("swish", (2, 8, 16)), ("swish_large", (4, 64, 64)),
                                                 ("rms_norm", (2, 8, 16)), ("rms_norm_4096", (2, 4, 64))))
    monkeypatch.setattr(gpu_check, "warm_up_gpu", lambda: None)

    class Args:
        beta, warmup, runs, pairs = 1.0, 2, 5, 5

    setup = gpu_check.Setup("cuda13.0", "90", "9.0", "nvcc", "GPU", None, {"git_sha": "abc", "timestamp": "t"})
    run = gpu_check.Run(60)
    with run.stage("bench"):
        rows = gpu_check.bench_stage(run, setup, Args)
    assert [r["row"] for r in rows[:7]] == ["torch_copy", "torch_composite", "torch_extension", "torch_silu",
                                            "torch_composite_backward", "torch_extension_backward", "torch_silu_backward"]
    rms = [r for r in rows if r["op"] == "rms_norm"]
    assert [r["row"] for r in rms[:7]] == ["torch_copy", "torch_composite", "torch_extension", "torch_rms_norm",
                                           "torch_composite_backward", "torch_extension_backward",
                                           "torch_rms_norm_backward"]
    assert len(rows) == 28 and all(r["gb_per_s"] and r["fraction_of_copy"] for r in rows)
    # RMSNorm's forward moves x, y and the weight once: a little more than its copy.
    assert rms[2]["bytes_moved"] == (2 * 2 * 8 * 16 + 16) * 4 and rms[0]["bytes_moved"] == 2 * 2 * 8 * 16 * 4
    assert all(r["device_ms"] > 0 and "spin kernel" in r["timing_method"] and r["tf32"].startswith("off") for r in rows)
    assert rows[0]["peak_mb"] == 1.0 and rows[0]["memory_method"].startswith("torch.cuda.max_memory_allocated")
    with run.stage("targets"):
        targets = gpu_check.targets_stage(run, setup, Args) + gpu_check.memory_targets(setup, rows)
    assert [(t["op"], t["numerator"], t["denominator"]) for t in targets] == [
        ("swish", "torch_extension", "torch_copy"), ("swish", "torch_extension", "torch_composite"),
        ("swish", "torch_extension_backward", "torch_composite_backward"),
        ("rms_norm", "torch_extension", "torch_rms_norm"),
        ("swish", "torch_extension peak - (torch_composite peak - one tensor)", "one tensor (0.1 MiB)")]
    assert all(isinstance(t["limit"], float) and t["holds"] == (t["median_ratio"] <= t["limit"]) for t in targets)
    assert all(t["target"].endswith("float32 4x64x64") for t in targets if t["op"] == "swish")
    assert targets[3]["target"].endswith("float32 2x4x64")
    # The allocator figures are faked (every row 1 MiB): no memory saved (a whole tensor unsaved), so that target is missed.
    assert targets[-1]["median_ratio"] == 1 and targets[-1]["holds"] is False


@pytest.mark.parametrize("layer1_fails", [False, True], ids=["all-pass", "a-check-fails"])
def test_main_runs_the_stages_and_writes_only_when_correct(ext, monkeypatch, tmp_path, capsys, layer1_fails):
    """main's glue with each stage stubbed (the stages themselves are tested above or need a GPU)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    setup = gpu_check.Setup("cuda13.0", "90", "9.0", "nvcc", "GPU", None, {"git_sha": "abc", "timestamp": "t"})
    monkeypatch.setattr(gpu_check, "preflight", lambda args, torch: setup)
    monkeypatch.setattr(gpu_check, "start_harness_build", lambda nvcc, arch: None)
    monkeypatch.setattr(gpu_check, "finish_harness_build", lambda started, timeout: tmp_path / "harness")
    monkeypatch.setattr(gpu_check, "build_extension", lambda setup, run: "already loaded")

    def layer1_check():
        if layer1_fails:
            raise AssertionError("wrong")
        return "ok"

    monkeypatch.setattr(gpu_check, "layer1", lambda run: run.check("layer 1", "stub", layer1_check))
    monkeypatch.setattr(gpu_check, "plugin_stage", lambda run, setup, harness: run.check("plugin", "stub", lambda: None))
    measured = {"p20_ms": 1.0, "p50_ms": 1.0, "p80_ms": 1.0, "peak_mb": 1.0, "memory_method": "m"}
    monkeypatch.setattr(gpu_check, "bench_stage", lambda run, setup, args: [
        gpu_check.make_row(setup, args, "swish", (2,), "float32", "torch_copy", "torch.clone", 16, measured)])
    monkeypatch.setattr(gpu_check, "targets_stage", lambda run, setup, args: [
        {"entry": "cuda13.0", "target": "t", "median_ratio": 0.8, "limit": 0.6667, "holds": False}])

    code = gpu_check.main(["--out", str(tmp_path / "results")])
    out = capsys.readouterr().out
    assert "MISSED by 20.0 %" in out
    if layer1_fails:
        assert code == 1 and "not writing results" in out and not (tmp_path / "results").exists()
    else:
        assert code == 0 and (tmp_path / "results" / "cuda13.0" / "bench.csv").is_file()


def test_large_cases_go_round_both_stride_loops():
    """Sizes from the kernel's own launch constants: every dtype's vector loop and scalar loop iterate."""
    assert gpu_check.launch_limits() == (256, 65535, 16)  # read off kernels/elementwise_cuda.cuh
    grid = 256 * 65535
    assert gpu_check.stride_loop_size(4) // 4 >= 2 * grid and gpu_check.stride_loop_size(2) // 8 >= 2 * grid
    assert (1 << 26) // 8 < grid  # the old float16 case (2^26 + 5) never left the first grid


def test_direct_build_uses_the_standard_of_this_torch(tmp_path):
    import torch

    from lab.compat import extension_cxx_standard

    jobs, _, _ = gpu_check.direct_build_plan(None, None)
    assert len(jobs) == 2  # swish.cpp and rms_norm.cpp
    for command in jobs.values():
        assert f"-std={extension_cxx_standard(torch.__version__)}" in command
    # An nvcc that answers as CUDA 11.8's does: C++20 torch headers cannot be compiled with it.
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n"
                    "echo 'Build cuda_11.8.r11.8/compiler.31833905_0'\n")
    nvcc.chmod(0o755)
    if extension_cxx_standard(torch.__version__) == "c++20":
        with pytest.raises(ValueError, match="nvcc 11.8 cannot compile"):
            gpu_check.direct_build_plan("90", str(nvcc))


def test_an_onnxruntime_without_the_cuda_ep_is_a_skip_not_a_failure(tmp_path):
    """What the host lacks is reported with its reason; the run still writes its rows."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA EP")
    setup = gpu_check.Setup("cuda13.0", "90", "9.0", "nvcc", "GPU", None, {})
    run = gpu_check.Run(60)
    assert run.check("plugin", "ort", lambda: gpu_check.check_ort(setup, {}))
    assert run.checks[0].status == "SKIP" and "has no CUDAExecutionProvider" in run.checks[0].detail
    assert not run.failed


def test_ort_per_call_target_pairs_the_plugin_with_the_composite(ext, plugin_path, monkeypatch, host_clock_cuda):
    """Its plumbing on the CPU EP with the CPU plugin; on a GPU host the same code runs on CUDA."""
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")

    class Args:
        beta, pairs = 1.0, 5

    setup = gpu_check.Setup("cuda13.0", "90", "9.0", "nvcc", "GPU", None, {"git_sha": "abc", "timestamp": "t"})
    assert gpu_check.ort_per_call_target(setup, Args) == []  # the plugin stage did not pass: nothing to pair
    setup.ort_plugin = plugin_path
    (target,) = gpu_check.ort_per_call_target(setup, Args)
    assert target["numerator"] == "ort_custom" and target["denominator"] == "torch_composite"
    assert target["median_ratio"] > 0 and target["limit"] == round(1 / 1.3, 4)
    assert target["holds"] == (target["median_ratio"] <= target["limit"])


def test_plugin_kernel_target_reads_the_harness_timing(tmp_path):
    """The Python side of `plugin_harness time` (the binary's side needs a GPU): a script that answers
    as the harness does stands in for it."""
    script = tmp_path / "harness"
    script.write_text('#!/bin/sh\n[ "$1" = time ] || exit 2\necho "forward_ms=0.125000 copy_ms=0.100000"\n')
    script.chmod(0o755)
    setup = gpu_check.Setup("cuda13.0", "90", "9.0", "nvcc", "GPU", None, {"git_sha": "abc", "timestamp": "t"})
    assert gpu_check.plugin_kernel_targets(setup, None) == []
    f32, f16 = gpu_check.plugin_kernel_targets(setup, script)
    assert f32["median_ratio"] == 1.25 and f32["holds"] is False and f16["target"].endswith("float16 64x2048x768")
    script.write_text("#!/bin/sh\necho 'plugin_harness: cudaMalloc(in): cudaErrorMemoryAllocation' >&2\nexit 1\n")
    with pytest.raises(RuntimeError, match="cudaErrorMemoryAllocation"):
        gpu_check.plugin_kernel_targets(setup, script)


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
    """A venv holding torch, numpy and what they require, nothing else (no packaging, no PyYAML, no
    onnxruntime): the GPU host the README promises is enough. The installed files are linked in."""
    from importlib.metadata import distribution

    venv = tmp_path_factory.mktemp("torch-numpy") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for name in sorted(_closure(["torch", "numpy"])):
        dist = distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            if not top.endswith(".pth") and not (site / top).exists():
                (site / top).symlink_to(Path(dist.locate_file(top)))
    return venv / "bin" / "python"


def test_a_torch_and_numpy_host_is_enough(torch_numpy_python, tmp_path):
    """gpu_check's preflight facts and every module its stages import, in that venv; then its no-GPU exit."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    script = (
        "import importlib.util, sys, torch\n"
        "assert importlib.util.find_spec('packaging') is None and importlib.util.find_spec('yaml') is None\n"
        "from bench import gpu_check\n"
        "entry, _ = gpu_check.choose_entry(None, '13.0', gpu_check.matrix_entries())\n"
        "from lab import compat, provenance\n"
        "compat.extension_cxx_standard(torch.__version__, '13.0')\n"
        "provenance.collect()\n"
        # what the build, layer 1, bench, targets and write stages import (the plugin-through-ORT check
        # imports onnxruntime first and is a SKIP without it)
        "for name in ('ops', 'ops.build', 'ops.registry', 'ops.rms_norm', 'infer.rows', 'infer.workloads',\n"
        "             'bench.torch_rows', 'bench.cuda_timing', 'bench.targets', 'bench.report', 'lab.files'):\n"
        "    importlib.import_module(name)\n"
        "print(entry, gpu_check.WORKLOADS)\n"
    )
    done = subprocess.run([str(torch_numpy_python), "-c", script], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("cuda13.0 ") and "('swish_large', (64, 2048, 768))" in done.stdout
    out = tmp_path / "results"
    done = subprocess.run([str(torch_numpy_python), "-m", "bench.gpu_check", "--out", str(out)], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 2 and done.stderr.startswith("error: no CUDA device: run this on a GPU host"), done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
