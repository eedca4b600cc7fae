"""Alignment layer 2: the PyTorch model against its ONNX export run by ONNX Runtime.

Every exporter x opset x lowering x model; the plugin serves the custom lowering, plain ORT the
decomposed one. Inputs have a batch and sequence length different from the export's.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from ops import export as E
from ops.registry import OPS

SWISH_ONNX = OPS["swish"].onnx  # its declared form's ONNX parts (ops/onnx_parts.py)

LAYER2 = dict(rtol=1e-4, atol=1e-5)
RUN_SHAPE = (3, 7, 768)  # export shape is (2, 16, 768): dynamic axes must really be dynamic
BETA = {"swish": 1.702, "ffn": 1.0}
# torch 2.4/2.5 (the cuda12.1 entry) have no dynamo exporter that takes the myops translation.
needs_dynamo = pytest.mark.skipif("dynamo" not in E.available_exporters(),
                                  reason=f"torch {torch.__version__} has no dynamo exporter for custom ops")


def cases():
    for exporter in E.available_exporters():
        for opset, lowering, model in itertools.product(E.default_opsets(exporter), E.LOWERINGS, E.MODELS):
            yield pytest.param(exporter, opset, lowering, model, id=f"{exporter}-opset{opset}-{lowering}-{model}")


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


@pytest.mark.parametrize("exporter,opset,lowering,model_name", list(cases()))
def test_torch_and_ort_agree(ext, plugin_path, out_dir, exporter, opset, lowering, model_name):
    from ort_plugin import make_session

    beta = BETA.get(model_name, 1.0)
    result = E.export(model_name, exporter=exporter, lowering=lowering, opset=opset, beta=beta,
                      path=out_dir / f"{model_name}-{lowering}-{exporter}-{opset}.onnx")
    assert not [w for w in result.warnings if "shape inference" in w.lower()], result.warnings
    # The decomposed graph must run on a plain onnxruntime, without the plugin.
    session = make_session(result.path, library=plugin_path) if lowering == "custom" else _plain_session(result.path)
    x = torch.randn(*RUN_SHAPE, generator=torch.Generator().manual_seed(7)) * 3
    with torch.no_grad():
        expected = E.build_model(model_name, beta=beta)(x).numpy()
    (actual,) = session.run(None, {E.INPUT_NAME: x.numpy()})
    assert actual.shape == RUN_SHAPE
    np.testing.assert_allclose(actual, expected, **LAYER2)


def _plain_session(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@needs_dynamo
def test_decomposed_uses_standard_swish_from_opset_24(ext, tmp_path):
    if not SWISH_ONNX.uses_standard(24):
        pytest.skip("the installed onnxruntime does not run ONNX Swish-24")
    result = E.export("swish", exporter="dynamo", lowering="decomposed", opset=24, beta=1.702, path=tmp_path / "s.onnx")
    nodes = [n.op_type for n in onnx.load(result.path).graph.node]
    assert nodes == ["Swish"], nodes
    x = torch.randn(2, 5, 768)
    (y,) = _plain_session(result.path).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(y, ext.reference(x, 1.702).numpy(), **LAYER2)


def test_graph_check_prints_what_the_graph_holds(ext, tmp_path):
    result = E.export("ffn", exporter="torchscript", lowering="decomposed", opset=18, path=tmp_path / "d.onnx")
    with pytest.raises(E.ExportError) as info:
        E.check_graph(onnx.load(result.path), model_name="ffn", lowering="custom", opset=18, exporter="torchscript")
    message = str(info.value)
    assert "myops::Swish" in message and "graph holds" in message and "Sigmoid" in message, message


def test_failed_check_leaves_no_file(ext, tmp_path, monkeypatch):
    # TorchOp.onnx is cached: export reads this very object, so the planted expectation reaches its check
    monkeypatch.setattr(SWISH_ONNX, "expected_nodes", lambda *args, **kwargs: {"Relu": 1})
    target = tmp_path / "never.onnx"
    with pytest.raises(E.ExportError, match="expected"):
        E.export("swish", exporter="torchscript", lowering="custom", opset=18, path=target)
    assert list(tmp_path.iterdir()) == []


def test_opset_beyond_the_exporter_is_refused(ext, tmp_path):
    with pytest.raises(E.ExportError, match="TorchScript exporter stops at opset 20"):
        E.export("swish", exporter="torchscript", opset=21, path=tmp_path / "x.onnx")
    with pytest.raises(E.ExportError, match="dynamo exporter"):
        E.export("swish", exporter="dynamo", opset=E.dynamo_max_opset() + 1, path=tmp_path / "y.onnx")


def test_default_opsets_cover_17_18_and_newest():
    for exporter in E.available_exporters():
        opsets = E.default_opsets(exporter)
        assert opsets[:2] == [17, 18] and opsets[-1] == E.newest_opset(exporter) >= 20, opsets


def test_missing_torchscript_exporter_is_a_clear_error(ext, tmp_path, monkeypatch):
    monkeypatch.delattr(torch.onnx, "register_custom_op_symbolic")
    with pytest.raises(E.ExportError, match="no TorchScript ONNX exporter"):
        E.export("swish", exporter="torchscript", opset=18, path=tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()


@needs_dynamo
def test_missing_onnxscript_is_a_clear_error(ext, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_onnxscript(name, *args, **kwargs):
        if name == "onnxscript" or name.startswith("onnxscript."):
            raise ImportError("No module named 'onnxscript'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnxscript)
    with pytest.raises(E.ExportError, match="needs onnxscript"):
        E.export("swish", exporter="dynamo", opset=18, path=tmp_path / "y.onnx")


@needs_dynamo
def test_exported_files_hold_no_checkout_or_environment_path(ext, tmp_path):
    """The dynamo exporter's stack traces name files by absolute path; the lab keeps them relative, so
    the same export in another folder, venv or image gives the same bytes."""
    import sys

    result = E.export("ffn", exporter="dynamo", lowering="custom", opset=18, path=tmp_path / "f.onnx")
    data = Path(result.path).read_bytes()
    assert str(E.REPO).encode() not in data and sys.prefix.encode() not in data
    model = onnx.load(result.path)
    traces = [p.value for n in model.graph.node for p in n.metadata_props if p.key == "pkg.torch.onnx.stack_trace"]
    assert traces and all('File "ops/declaration.py"' in t for t in traces)  # still says where, relatively (the FFN)
    assert model.producer_name == "pytorch" and model.producer_version  # kept: what made the file


def test_source_path_normalisation_reaches_every_node():
    from onnx import helper

    node = helper.make_node("Relu", ["x"], ["y"], doc_string=f"{E.REPO}/ops/export.py:1")
    helper.set_metadata_props(node, {"pkg.torch.onnx.stack_trace":
                                     f'File "{E.REPO}/ops/export.py", line 9\n  File "/opt/venv/lib/python3.11/site-packages/torch/nn/x.py"'})
    function = helper.make_function("myops", "F", ["x"], ["y"], [node], [helper.make_opsetid("", 18)])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [1])],
                              [helper.make_tensor_value_info("y", 1, [1])])
    model = helper.make_model(graph, functions=[function])
    E.normalise_source_paths(model)
    for n in (model.graph.node[0], model.functions[0].node[0]):
        assert n.doc_string == "ops/export.py:1"
        assert n.metadata_props[0].value == 'File "ops/export.py", line 9\n  File "site-packages/torch/nn/x.py"'


def test_an_export_prints_no_torchvision_notices(ext, tmp_path):
    # torch's dynamo exporter logs "torchvision is not installed" several times an export; the lab
    # filters it (ops.export) so that a bench log shows what matters. A fresh process: it logs once.
    if "dynamo" not in E.available_exporters():
        pytest.skip(f"torch {torch.__version__}'s dynamo exporter takes no myops translation (torch >= 2.6): "
                    "the notices are the dynamo exporter's")
    import subprocess
    import sys

    script = (f"from ops import export as E; E.export('swish', path={str(tmp_path / 'm.onnx')!r})")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(E.__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "m.onnx").exists() and "torchvision" not in done.stdout + done.stderr


def test_a_pytorch_row_process_never_imports_onnx(ext):
    # A PyTorch row builds its model from the op registry: importing onnx (via ops.export) costs each
    # of the main job's row processes 0.6 s.
    import subprocess
    import sys

    script = ("import sys, numpy as np, bench.torch_rows as rows; "
              "call, _ = rows.row_callable({'row': 'torch_extension', 'workload': 'ffn', 'threads': 1, "
              "'beta': 1.0}, (np.ones((2, 4, 768), np.float32),)); call(); "
              "print(sorted(m for m in ('onnx', 'onnxscript', 'onnxruntime', 'ops.export') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(E.__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "[]", done.stdout
