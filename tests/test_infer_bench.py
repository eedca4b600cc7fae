"""The infer side's benchmark: `python -m infer.runner bench` (what the infer image runs on a GPU host).

Run here on the CPU EP with torch and onnx made unimportable, as in the image. The CUDA EP path
cannot run without a GPU; what it refuses, and its io-binding code on the CPU device, are tested.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent



@pytest.fixture(scope="module")
def no_torch_no_onnx(tmp_path_factory) -> Path:
    """A PYTHONPATH entry whose torch and onnx raise on import, like the infer image (which has neither)."""
    shims = tmp_path_factory.mktemp("shims")
    for name in ("torch", "onnx"):
        (shims / f"{name}.py").write_text(f"raise ImportError('{name} is not on the inference side')\n")
    return shims


def runner(*args, shims: Path, env=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shims), str(REPO)]), MYOPS_MATRIX_ENTRY="cpu", **(env or {}))
    return subprocess.run([sys.executable, "-m", "infer.runner", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=600)


def test_rms_norm_rows_without_torch(artifacts, plugin_path, no_torch_no_onnx, tmp_path):
    out = tmp_path / "results"
    result = runner("bench", "--artifacts", str(artifacts), "--plugin", str(plugin_path), "--workload", "rms_norm",
                    "--warmup", "1", "--runs", "3", "--providers", "CPUExecutionProvider", "--out", str(out),
                    shims=no_torch_no_onnx)
    assert result.returncode == 0, result.stderr
    with open(out / "cpu" / "bench.csv", newline="") as handle:
        rows = {(r["row"], r["ort_opt_level"]): r for r in csv.DictReader(handle)}
    assert rows[("ort_composite", "all")]["ort_graph_nodes"] == "SimplifiedLayerNormalization"
    assert rows[("ort_custom", "all")]["ort_graph_nodes"] == "myops::RMSNorm"
    assert rows[("ort_plugin_copy", "all")]["ort_graph_nodes"] == "myops::Copy"
    assert {r["op"] for r in rows.values()} == {"rms_norm"} and {r["beta"] for r in rows.values()} == {"1.0"}


def test_writes_the_ort_rows_in_the_results_format(artifacts, plugin_path, no_torch_no_onnx, tmp_path):
    from infer.rows import COLUMNS

    out = tmp_path / "results"
    result = runner("bench", "--artifacts", str(artifacts), "--plugin", str(plugin_path), "--workload", "swish",
                    "--warmup", "1", "--runs", "5", "--providers", "CPUExecutionProvider", "--out", str(out),
                    shims=no_torch_no_onnx, env={"MYOPS_IMAGE": "myops-lab/infer:test"})
    assert result.returncode == 0, result.stderr
    assert "[bench 5/5]" in result.stdout  # progress per row
    with open(out / "cpu" / "bench.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == COLUMNS
        rows = {(r["row"], r["ort_opt_level"]): r for r in reader}
    assert set(rows) == {("ort_composite", "all"), ("ort_composite", "basic"), ("ort_custom", "all"), ("ort_copy", "all"),
                         ("ort_plugin_copy", "all")}
    # What ORT ran, read from its optimized model without the onnx package.
    assert rows[("ort_composite", "all")]["ort_graph_nodes"] == "com.microsoft::QuickGelu"
    assert rows[("ort_composite", "basic")]["ort_graph_nodes"] == "Mul+Sigmoid"
    assert rows[("ort_custom", "all")]["ort_graph_nodes"] == "myops::Swish"
    assert rows[("ort_copy", "all")]["ort_graph_nodes"] == "Identity"
    assert rows[("ort_plugin_copy", "all")]["ort_graph_nodes"] == "myops::Copy"
    import onnxruntime

    for r in rows.values():
        assert r["execution_provider"] == "CPUExecutionProvider" and r["opset"] == "18" and r["beta"] == "1.702"
        assert float(r["p20_ms"]) <= float(r["p50_ms"]) <= float(r["p80_ms"]) and float(r["peak_mb"]) > 0
        assert r["onnxruntime"] == onnxruntime.__version__ and r["torch"] == "" and r["image"] == "myops-lab/infer:test"
        assert len(r["git_sha"]) == 40 and r["bytes_moved"] == str(2 * 8 * 512 * 768 * 4)
    p50 = {k: float(r["p50_ms"]) for k, r in rows.items()}
    floor = min(p50[("ort_copy", "all")], p50[("ort_plugin_copy", "all")])  # the fastest copy is the floor
    assert float(rows[("ort_custom", "all")]["fraction_of_copy"]) == pytest.approx(floor / p50[("ort_custom", "all")], rel=2e-3)
    assert (out / "bench_all.csv").is_file()
    samples = list(csv.DictReader(open(out / "cpu" / "samples.csv", newline="")))
    assert len(samples) == 5 * 5 and {s["row"] for s in samples} == {r for r, _ in rows}
    # Each row names the exact plugin and model it ran.
    manifest = json.loads((artifacts / "manifest.json").read_text())
    custom = rows[("ort_custom", "all")]
    assert custom["plugin_sha256"] == hashlib.sha256(Path(plugin_path).read_bytes()).hexdigest()
    assert custom["model_sha256"] == manifest["files"]["swish-custom-dynamo-opset18.onnx"]
    assert rows[("ort_composite", "all")]["model_sha256"] == manifest["files"]["swish-decomposed-dynamo-opset18.onnx"]
    assert rows[("ort_composite", "all")]["plugin_sha256"] == "" and custom["extension_sha256"] == ""


def test_a_failing_row_writes_nothing(artifacts, no_torch_no_onnx, tmp_path):
    out = tmp_path / "results"
    result = runner("bench", "--artifacts", str(artifacts), "--plugin", "/nonexistent/libmyops_ort.so", "--workload",
                    "swish", "--runs", "2", "--providers", "CPUExecutionProvider", "--out", str(out),
                    shims=no_torch_no_onnx)
    assert result.returncode == 1
    assert "nothing was written" in result.stderr and "/nonexistent/libmyops_ort.so" in result.stderr
    assert not out.exists()


def test_cuda_rows_without_a_cuda_onnxruntime_say_what_to_do(artifacts, plugin_path, no_torch_no_onnx, tmp_path):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA EP")
    result = runner("bench", "--artifacts", str(artifacts), "--plugin", str(plugin_path), "--providers",
                    "CUDAExecutionProvider", "--out", str(tmp_path / "r"), shims=no_torch_no_onnx)
    assert result.returncode == 2 and "--gpus all" in result.stderr and "onnxruntime-gpu" in result.stderr
    assert not (tmp_path / "r").exists()
    # infer.measure itself refuses the same way (the row processes of `nox -s bench`).
    from infer.measure import RowError, _ort_providers

    with pytest.raises(RowError, match="no CUDAExecutionProvider.*--gpus all"):
        _ort_providers({"execution_provider": "CUDAExecutionProvider"}, ort)
    with pytest.raises(RowError, match="not benchmarked"):
        _ort_providers({"execution_provider": "TensorrtExecutionProvider"}, ort)


def test_gpu_custom_row_refuses_a_plugin_without_cuda_kernels(artifacts):
    """Else ORT would quietly run the plugin's CPU kernel and the row would be labelled a GPU row."""
    from infer.measure import RowError, _check_plugin_serves
    from ort_plugin.build import build

    cpu_only = build(cuda="OFF", log=lambda m: None)
    model = str(artifacts / "swish-custom-dynamo-opset18.onnx")
    with pytest.raises(RowError, match=r"only on \['CPUExecutionProvider'\].*built for the CUDA entry"):
        _check_plugin_serves({"model_path": model, "plugin": str(cpu_only), "execution_provider": "CUDAExecutionProvider"})
    _check_plugin_serves({"model_path": model, "plugin": str(cpu_only), "execution_provider": "CPUExecutionProvider"})


def test_io_binding_path_gives_the_operators_output(artifacts, plugin_path, tmp_path):
    """The GPU rows' binding code, run on the CPU device: a one-row input and the real one in turn,
    per-call runs and a batch without synchronisation all give the custom op's result."""
    from infer.measure import _ort_row
    from infer.workloads import WORKLOADS

    x = WORKLOADS["swish"].input(seed=0)[:2]
    spec = {"row": "ort_custom", "threads": 2, "ort_opt_level": "all", "io_binding": True, "plugin": str(plugin_path),
            "model_path": str(artifacts / "swish-custom-dynamo-opset18.onnx")}
    row = _ort_row(spec, (x,), tmp_path)
    assert row.graph == "myops::Swish" and row.tf32 is None
    assert row.use_input(True)
    assert row.call().copy_outputs_to_cpu()[0].shape == (1, 1, 768)
    assert row.use_input(False)
    y = row.call().copy_outputs_to_cpu()[0]
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y, x64 / (1 + np.exp(-1.702 * x64)), rtol=2e-6, atol=1e-7)
    assert np.array_equal(row.call().copy_outputs_to_cpu()[0], y)  # a second run through the same binding
    assert np.array_equal(row.batch(3).copy_outputs_to_cpu()[0], y)


def test_device_time_only_where_the_runs_outlast_ort_overhead(artifacts, plugin_path, tmp_path, monkeypatch):
    """ort_device_ms against the one-row input's batch (ORT's per-run overhead): a time where the
    real input clearly takes longer, none where it does not (forced here with a huge factor)."""
    from infer import measure
    from infer.workloads import WORKLOADS

    x = WORKLOADS["swish"].input(seed=0)
    spec = {"row": "ort_custom", "threads": 2, "ort_opt_level": "all", "io_binding": True, "plugin": str(plugin_path),
            "model_path": str(artifacts / "swish-custom-dynamo-opset18.onnx")}
    row = measure._ort_row(spec, (x,), tmp_path)
    ms, method = measure.ort_device_ms(row)
    assert ms > 0 and "per-run overhead, from a one-row input" in method
    assert row.call().copy_outputs_to_cpu()[0].shape == x.shape  # the real input is bound again
    monkeypatch.setattr(measure, "DEVICE_BOUND_FACTOR", 1e9)
    ms, method = measure.ort_device_ms(row)
    assert ms is None and "sets the pace" in method


def test_gpu_memory_without_nvml_is_stated_not_guessed():
    from infer import measure, nvml

    try:
        nvml.DeviceMemory(0)
    except nvml.NvmlUnavailable as exc:
        assert "--gpus" in str(exc)
    else:
        pytest.skip("NVML answers here")
    reader, method = measure._gpu_memory_probe()
    assert reader is None and method.startswith("unavailable: ")


def test_copy_model_is_written_without_onnx(tmp_path):
    from infer.rows import write_copy_model
    from ort_plugin.onnx_file import read_model

    summary = read_model(write_copy_model(tmp_path / "copy.onnx", 21))
    assert summary.opset_imports == {"": 21}
    assert [n.qualified for n in summary.nodes] == ["ai.onnx::Identity"]
    assert summary.inputs[0].dims == ("batch", "seq", 768)


def test_nvml_finds_the_gpu_cuda_means():
    """Without the CUDA runtime to ask for the PCI bus id: CUDA_VISIBLE_DEVICES' index or UUID, and
    no guess where CUDA's order (fastest first) and NVML's (PCI bus) may differ."""
    from infer.nvml import NvmlUnavailable, nvml_selector

    assert nvml_selector(0, None, "PCI_BUS_ID") == ("index", 0)
    assert nvml_selector(0, "2,3", "PCI_BUS_ID") == ("index", 2)
    assert nvml_selector(1, "GPU-aaaa, GPU-bbbb", None) == ("uuid", "GPU-bbbb")
    for visible in (None, "2,3"):  # fastest-first order: even device 0 may be another GPU
        with pytest.raises(NvmlUnavailable, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
            nvml_selector(0, visible, None)
    with pytest.raises(NvmlUnavailable, match="MIG instance"):
        nvml_selector(0, "MIG-1234", "PCI_BUS_ID")
    with pytest.raises(NvmlUnavailable, match="has no device 1"):
        nvml_selector(1, "0", "PCI_BUS_ID")


def test_cuda_sessions_keep_float32_matmuls_exact():
    """Alignment sessions (verify, dump, layer 3) ask the CUDA EP for full float32, in the form this ORT takes."""
    from ort_plugin.loader import exact_providers

    assert exact_providers(["CUDAExecutionProvider", "CPUExecutionProvider"], "1.21.1") == [
        ("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    assert exact_providers(["CPUExecutionProvider"], "1.17.1") == ["CPUExecutionProvider"]


def test_large_workload_is_for_the_gpu_only(artifacts, plugin_path, no_torch_no_onnx, tmp_path):
    result = runner("bench", "--artifacts", str(artifacts), "--plugin", str(plugin_path), "--providers",
                    "CPUExecutionProvider", "--workload", "swish_large", "--out", str(tmp_path / "r"),
                    shims=no_torch_no_onnx)
    assert result.returncode == 2 and "swish_large is for CUDAExecutionProvider only" in result.stderr
    assert not (tmp_path / "r").exists()


def test_a_gated_op_s_workload_feeds_and_counts_each_full_shaped_input(monkeypatch):
    """An op of two full-shaped inputs and a [hidden] weight: its op-alone model takes x and gate, the
    bench feeds one array for each, and the least traffic counts x, gate, y and the weight."""
    from infer import workloads
    from opspec import OpSpec, WorkloadSpec

    spec = OpSpec("gated", "Gated", ("X", "gate", "scale"), full_inputs=2, workloads=(WorkloadSpec("gated", "alone"),))
    assert spec.graph_inputs == ("x", "gate")
    monkeypatch.setitem(workloads.OPS, "gated", spec)
    alone = workloads.Workload("gated", 2, 3, 8, op="gated")
    assert alone.graph_inputs == ("x", "gate")
    x, gate = alone.inputs(seed=0)
    assert x.shape == gate.shape == (2, 3, 8) and np.array_equal(x, alone.input(seed=0)) and not np.array_equal(x, gate)
    assert alone.bytes_moved == (3 * 2 * 3 * 8 + 8) * 4
    in_a_model = workloads.Workload("gated_ffn", 2, 3, 8, model="ffn", op="gated")
    assert in_a_model.graph_inputs == ("x",) and len(in_a_model.inputs(seed=0)) == 1
    with pytest.raises(ValueError, match="full_inputs=3 must be 1 to 2"):
        OpSpec("bad", "Bad", ("X", "gate"), full_inputs=3)


def test_an_op_of_several_outputs_names_and_counts_each(monkeypatch):
    """A fused add + norm returns Y and the sum, both of X's shape: the op-alone model's graph outputs
    are y then the others by name, and the least traffic counts every output once."""
    from infer import workloads
    from opspec import OpSpec, WorkloadSpec, model_outputs

    spec = OpSpec("add_norm", "AddNorm", ("X", "Residual", "scale"), full_inputs=2, outputs=("Y", "Sum"),
                  workloads=(WorkloadSpec("add_norm", "alone"),))
    assert spec.graph_inputs == ("x", "residual") and spec.graph_outputs == ("y", "sum")
    monkeypatch.setitem(workloads.OPS, "add_norm", spec)
    alone = workloads.Workload("add_norm", 2, 3, 8, op="add_norm")
    assert alone.bytes_moved == ((2 + 2) * 2 * 3 * 8 + 8) * 4
    assert model_outputs("swish") == ("y",) and model_outputs("ffn") == ("y",)
    for inputs, outputs in ((("X", "scale"), ("Y", "scale")), (("X",), ("Y", "x")), (("X", "y"), ("Out",)),
                            (("X",), ("Y", "Sum", "sum")), (("X",), ()), (("X",), ("Out", "y")), (("In", "x"), ("Y",))):
        with pytest.raises(ValueError, match="distinct names|at least one output"):
            OpSpec("bad", "Bad", inputs, outputs=outputs)


def test_verify_only_runs_the_models_it_names_and_refuses_a_pattern_that_names_none(artifacts, plugin_path,
                                                                                  no_torch_no_onnx):
    """`verify --only '*-custom-*'`: the models that run the plugin (the arm64 tests verify each CPU path
    with them under emulation, where each model takes seconds), and nothing else."""
    models = [m["file"] for m in json.loads((artifacts / "manifest.json").read_text())["models"]]
    custom = [name for name in models if "-custom-" in name]
    done = runner("verify", "--artifacts", str(artifacts), "--plugin", str(plugin_path), "--only", "*-custom-*",
                  shims=no_torch_no_onnx)
    assert done.returncode == 0 and "all models match" in done.stdout, done.stdout + done.stderr
    assert f"verify: {len(custom)} of the {len(models)} models (--only *-custom-*)" in done.stdout
    ran = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("  ok ")]
    assert sorted(set(ran)) == sorted(custom) and 0 < len(custom) < len(models)
    none = runner("verify", "--artifacts", str(artifacts), "--plugin", str(plugin_path), "--only", "nothing-*",
                  shims=no_torch_no_onnx)
    assert none.returncode == 2 and "no model of" in none.stderr and "matches --only nothing-*" in none.stderr
