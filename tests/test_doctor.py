"""doctor and the failure modes users provoke: each ends in one message that names the cause and the fix.

Real plugin, real onnxruntime, real exports; the build metadata checks get the real build_info.json
with one recorded fact changed, which is exactly what a library built elsewhere looks like.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from test_ort_plugin import swish_graph

from ort_plugin import PluginError, make_session
from ort_plugin.diagnose import FeedError, check_feed, diagnose_model, failures
from ort_plugin.doctor import model_section, plugin_arch_finding, plugin_section, report
from ort_plugin.library_info import covers, read_library
from ort_plugin.onnx_file import ModelFileError, read_model

REPO = Path(__file__).resolve().parent.parent


def _write(tmp_path: Path, model: onnx.ModelProto, name: str = "model.onnx") -> Path:
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return path


def _doctor_model(tmp_path, plugin_path, model) -> tuple[int, str]:
    result = subprocess.run([sys.executable, "-m", "ort_plugin.doctor", "--plugin", str(plugin_path),
                             str(_write(tmp_path, model))], capture_output=True, text=True, cwd=REPO)
    return result.returncode, result.stdout + result.stderr


def _no_opset_import(model):
    del model.opset_import[1]
    return model


# ---------------------------------------------------------------- a healthy machine

def test_doctor_is_all_green_on_a_healthy_machine(ext, plugin_path, tmp_path):
    from ops.export import export

    model = export("swish", exporter="torchscript", lowering="custom", opset=17, path=tmp_path / "swish.onnx")
    result = subprocess.run([sys.executable, "-m", "ops.doctor", "--plugin", str(plugin_path), model.path],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "doctor: all green" in out
    for expected in ("torch:", "_GLIBCXX_USE_CXX11_ABI=", "nvcc:", "CXX11 ABI: ",
                     "onnxruntime:", "execution providers:", "exported symbols: RegisterCustomOps",
                     "C API version: built for", "myops::Swish v1+ on CPUExecutionProvider: registered and runs [float32]",
                     "opset imports: ai.onnx 17, myops 1", "myops::Swish (1 node): registered by the plugin",
                     "dynamic axes 0 (batch), 1 (seq)",
                     # the exact binaries, as result rows and results/reproducibility.csv name them
                     f"sha256 {hashlib.sha256(Path(plugin_path).read_bytes()).hexdigest()}",
                     f"sha256 {hashlib.sha256(Path(model.path).read_bytes()).hexdigest()}"):
        assert expected in out, f"{expected!r} missing from:\n{out}"


def test_doctor_json_lists_every_section(plugin_path):
    result = subprocess.run([sys.executable, "-m", "ort_plugin.doctor", "--plugin", str(plugin_path), "--json"],
                            capture_output=True, text=True, cwd=REPO)
    data = json.loads(result.stdout)
    assert [s["title"] for s in data["sections"]] == ["onnxruntime", "plugin", "GPU (plugin)"]
    assert data["counts"]["fail"] == 0 and result.returncode == 0


def test_plugin_file_describes_itself(plugin_path):
    info = read_library(plugin_path)
    assert info.exported == ["RegisterCustomOps"]
    assert info.api_version == json.loads((plugin_path.parent / "build_info.json").read_text())["ort_api_version"]
    assert ("myops", "Swish", "CPUExecutionProvider") in {(o.domain, o.op, o.provider) for o in info.ops}
    assert not any(n.startswith(("libtorch", "libc10")) for n in info.needed)


# ---------------------------------------------------------------- model vs plugin: the "No Op registered" family

@pytest.mark.parametrize("model, cause", [
    (lambda: swish_graph(domain="MyOps"), "domain case differs: the node says 'MyOps', the plugin registers 'myops'"),
    (lambda: swish_graph(op_type="swish"), "op name differs: the plugin registers ['Copy', 'RMSNorm', 'Swish'] in 'myops', not 'swish' "
                                           "(did you mean 'Swish'?"),
    (lambda: swish_graph(op_type="SiLU"), "op name differs: the plugin registers ['Copy', 'RMSNorm', 'Swish'] in 'myops', not 'SiLU'"),
    (lambda: _no_opset_import(swish_graph()), "missing custom opset import: the model has no opset_import for domain 'myops'"),
    (lambda: swish_graph(domain="mycompany.ops"), "the plugin registers no domain 'mycompany.ops'"),
], ids=["domain-case", "op-case", "op-name", "no-opset-import", "unknown-domain"])
def test_unregistered_custom_node_names_the_cause(plugin_path, tmp_path, model, cause):
    with pytest.raises(PluginError) as caught:
        make_session(model().SerializeToString(), library=plugin_path)
    assert cause in str(caught.value)
    assert "fix:" in str(caught.value)
    code, out = _doctor_model(tmp_path, plugin_path, model())
    assert code == 1 and "FAIL" in out and cause in out, out


def test_unknown_op_name_offers_every_registered_name_rather_than_guessing(plugin_path):
    with pytest.raises(PluginError) as caught:
        make_session(swish_graph(op_type="SiLU").SerializeToString(), library=plugin_path)
    assert "fix: export the node as one of myops::Copy, myops::RMSNorm, myops::Swish, or load the plugin that provides myops::SiLU" \
        in str(caught.value)


def test_domain_version_below_the_registered_one(plugin_path):
    model = swish_graph()
    model.opset_import[1].version = 0
    problems = failures(diagnose_model(read_model(model.SerializeToString()), read_library(plugin_path)))
    assert "domain version missing: the model imports 'myops' version 0, the plugin registers Swish from version 1" \
        in str(problems[0])


def test_plugin_not_loaded_is_named(plugin_path, tmp_path):
    import onnxruntime as ort

    model = swish_graph().SerializeToString()
    with pytest.raises(Exception, match="not a registered function/op"):  # what ORT alone says
        ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    problems = failures(diagnose_model(read_model(model), None))
    assert "no plugin library is loaded" in str(problems[0]) and "register_custom_ops_library" in str(problems[0])
    missing = tmp_path / "nowhere" / "libmyops_ort.so"
    code, out = _doctor_model(tmp_path, missing, swish_graph())
    assert code == 1 and f"plugin library {missing} does not exist" in out and "no plugin library is loaded" in out, out


def test_not_a_plugin_file_is_named_by_doctor(tmp_path):
    fake = tmp_path / "libmyops_ort.so"
    fake.write_text("not a library")
    result = subprocess.run([sys.executable, "-m", "ort_plugin.doctor", "--plugin", str(fake)],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 1 and "is not a shared library (no ELF header)" in result.stdout


def test_wrong_input_dtype_into_the_plugin(plugin_path):
    model = swish_graph()
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    with pytest.raises(PluginError, match=r"input 'x' is float64 but the plugin's kernels take \['float32'\]"):
        make_session(model.SerializeToString(), library=plugin_path)
    session = make_session(swish_graph().SerializeToString(), library=plugin_path)
    with pytest.raises(FeedError, match=r"input 'x' is float64 but the model takes float32 .*astype\('float32'\)"):
        check_feed(session, {"x": np.ones((1, 2, 4), dtype=np.float64)})


@pytest.mark.parametrize("shape, message", [
    ((2, 4), r"has shape \(2, 4\) \(rank 2\) but the model takes rank 3 \[batch, seq, 4\]"),
    ((2, 3, 5), r"axis 2 is fixed at 4 in the model \[batch, seq, 4\]"),
])
def test_input_shape_the_model_cannot_take(plugin_path, shape, message):
    session = make_session(swish_graph(hidden=4).SerializeToString(), library=plugin_path)
    with pytest.raises(FeedError, match=message):
        check_feed(session, {"x": np.ones(shape, dtype=np.float32)})
    with pytest.raises(FeedError, match=r"missing \['x'\], unknown \['input'\]"):
        check_feed(session, {"input": np.ones((1, 1, 4), dtype=np.float32)})
    check_feed(session, {"x": np.ones((3, 7, 4), dtype=np.float32)})  # dynamic axes take any size


def test_a_probe_of_several_outputs_declares_each():
    """The doctor probes an op of several outputs with a node and graph that name each, of x's shape
    (written without onnx, read back with it)."""
    from ort_plugin.onnx_file import one_node_model

    model = onnx.load_from_string(one_node_model("myops", "AddNorm", inputs=("x", "residual", "scale"),
                                                 outputs=("y", "sum")))
    onnx.checker.check_model(model)
    assert list(model.graph.node[0].output) == ["y", "sum"]
    assert [(v.name, [d.dim_param for d in v.type.tensor_type.shape.dim]) for v in model.graph.output] == \
        [("y", ["n"]), ("sum", ["n"])]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_broken_onnx_file_is_named(plugin_path, tmp_path, damage):
    data = swish_graph(with_neighbours=True).SerializeToString()
    broken = {"truncate": data[: len(data) - 7], "garbage": b"\x0f" + bytes(range(200)), "empty": b""}[damage]
    path = tmp_path / "broken.onnx"
    path.write_bytes(broken)
    expected = {"truncate": "is truncated", "garbage": "is not an ONNX model", "empty": "is empty"}[damage]
    with pytest.raises(ModelFileError, match=expected):
        make_session(path, library=plugin_path)
    findings = model_section(path, read_library(plugin_path))
    assert findings[0].level == "fail" and expected in findings[0].message


def test_dynamic_axes_are_reported_per_input(plugin_path):
    fixed = swish_graph()
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    fixed.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 16
    text = {f.subject: f.message for f in diagnose_model(read_model(fixed.SerializeToString()), read_library(plugin_path))}
    assert text["input 'x'"] == "float32 [2, 16, 4]: every axis is fixed, only this exact shape runs"


# ---------------------------------------------------------------- export-time mistakes

def test_symbolic_registered_above_the_export_opset(ext, tmp_path):
    from ops.export import ExportError, export

    with pytest.raises(ExportError, match="registered from opset 20 but the export asks for opset 17.*opset_version <= 17"):
        export("swish", exporter="torchscript", opset=17, symbolic_opset=20, path=tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_dynamic_axes_names_must_match_the_inputs(ext, tmp_path):
    from ops.export import ExportError, export

    with pytest.raises(ExportError, match=r"dynamic_axes names \['input'\] match no input or output.*'x'"):
        export("swish", exporter="torchscript", opset=17, dynamic_axes={"input": {0: "batch"}}, path=tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- build metadata vs the running environment

def _facts():
    from ops.build import torch_facts

    return torch_facts()


def test_abi_mismatch_is_detected_from_build_metadata(ext):
    from ops.doctor import extension_findings
    from ops.build import build_info

    info, facts = build_info(), _facts()
    assert not failures(extension_findings(info, facts))
    flipped = {**info, "cxx11_abi": 1 - info["cxx11_abi"]}
    problems = failures(extension_findings(flipped, facts))
    assert len(problems) == 1 and "_GLIBCXX_USE_CXX11_ABI=" in problems[0].message and "python -m ops.build" in problems[0].fix
    other_torch = failures(extension_findings({**info, "torch": "2.1.0"}, facts))
    assert "built against torch 2.1.0" in other_torch[0].message


def test_cuda_major_mismatch_is_detected(ext):
    from ops.doctor import extension_findings, nvcc_finding
    from ops.build import build_info

    cuda_build = {**build_info(), "with_cuda": True, "nvcc": "12.4"}
    problems = failures(extension_findings(cuda_build, {**_facts(), "torch_cuda": "13.0"}))
    assert "compiled by nvcc 12.4 but this torch runs CUDA 13.0" in problems[0].message
    finding = nvcc_finding("12.4", "13.0")
    assert finding.level == "fail" and "CUDA 13.x toolkit" in finding.fix
    assert nvcc_finding("13.0", "13.0").level == "ok"


def test_missing_gpu_architecture_names_the_arch_list_to_use(plugin_path):
    from ops.doctor import extension_arch_finding

    finding = extension_arch_finding({"with_cuda": True, "torch_cuda_arch_list": "8.0 8.6"}, (9, 0))
    assert finding.level == "fail" and 'TORCH_CUDA_ARCH_LIST="9.0"' in finding.fix
    assert extension_arch_finding({"with_cuda": True, "cuda_archs_found": ["sm_80", "sm_90"]}, (9, 0)).level == "ok"
    info = read_library(plugin_path)
    info.cuda_archs = ["80-real", "86-real"]
    finding = plugin_arch_finding(info, (9, 0))
    assert finding.level == "fail" and "90-real" in finding.fix
    assert covers(["80-real", "90"], (10, 0))[0] == "jit"  # PTX of 9.0 JIT-compiles on newer GPUs
    assert covers(["80-real"], (8, 9))[0] == "native"  # sm_80 cubins run on 8.x GPUs


def test_plugin_built_for_a_newer_c_api_than_the_runtime(plugin_path):
    findings, _ = plugin_section(plugin_path, {"version": "1.20.0", "api_max": 20, "providers": ["CPUExecutionProvider"]})
    problem = next(f for f in findings if f.subject == "C API version")
    assert problem.level == "fail" and "serves up to 20" in problem.message and "upgrade onnxruntime" in problem.fix
    assert report([("plugin", findings)], out=open("/dev/null", "w")) == 1


# ---------------------------------------------------------------- a model's external data

def _with_external_data(folder: Path) -> Path:
    """swish_graph with its two weights in model.onnx.data beside it (as a plain dynamo export writes)."""
    folder.mkdir(parents=True, exist_ok=True)
    model = swish_graph(with_neighbours=True)
    for tensor in model.graph.initializer:  # raw bytes: what onnx moves to a data file
        tensor.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor), tensor.name))
    onnx.save_model(model, folder / "model.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    return folder / "model.onnx"


def _relocated(model_path: Path, location: str) -> None:
    model = onnx.load(str(model_path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    model_path.write_bytes(model.SerializeToString())


@pytest.mark.parametrize("damage,message", [
    (None, "2 weights in model.onnx.data, beside the model"),
    ("missing", "external data file 'model.onnx.data' (of one and others) is missing from"),
    ("escapes", "external data '../model.onnx.data' (of one and others) is outside the model's folder"),
])
def test_doctor_checks_external_data_and_loads_the_model(plugin_path, tmp_path, damage, message):
    """ORT refuses a model whose data file is missing or outside its folder: so does the doctor, which
    says which file; a whole model is loaded before the doctor calls it green."""
    path = _with_external_data(tmp_path / "model")
    if damage == "missing":
        (path.parent / "model.onnx.data").unlink()
    elif damage == "escapes":
        (path.parent / "model.onnx.data").rename(tmp_path / "model.onnx.data")
        _relocated(path, "../model.onnx.data")
    result = subprocess.run([sys.executable, "-m", "ort_plugin.doctor", "--plugin", str(plugin_path), str(path)],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    out = result.stdout + result.stderr
    assert message in out, out
    if damage is None:
        assert result.returncode == 0 and "ok    loads in onnxruntime: a CPU session opens with the plugin" in out, out
    else:
        assert result.returncode == 1 and "FAIL  external data" in out and "loads in onnxruntime" not in out, out


def test_doctor_fails_a_model_onnxruntime_cannot_load(plugin_path, tmp_path):
    """Every check the doctor reads off the file passes, and ORT still refuses it (an Add of float and
    int64): the verdict is ORT's, with its reason."""
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Add", ["x", "k"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              initializer=[helper.make_tensor("k", TensorProto.INT64, [2], [1, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    code, out = _doctor_model(tmp_path, plugin_path, model)
    assert code == 1 and "FAIL  loads in onnxruntime:" in out and "doctor: 1 problem(s)" in out, out
