"""`nox -s fuse` (ops.fuse): ONNX files users already have, rewritten so that each op is one myops node,
proven in ONNX Runtime against the file they came from; refusals leave nothing behind."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ops.fuse import FuseError, fuse

OP_PIECES = {"Sigmoid", "Pow", "ReduceMean", "Sqrt", "Reciprocal", "QuickGelu", "SimplifiedLayerNormalization",
             "RMSNormalization"}


def types(path: Path) -> Counter:
    return Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in onnx.load(str(path)).graph.node)


def quiet(message: str) -> None:
    pass


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("model, beta, expected", [
    ("swish", 1.0, {"myops::Swish": 1}),
    ("swish", 1.702, {"myops::Swish": 1}),          # x * Sigmoid(x * beta)
    ("rms_norm", None, {"myops::RMSNorm": 1}),
    ("ffn", 1.0, {"myops::Swish": 1}),
])
def test_fuse_turns_each_exporters_decomposed_file_into_myops_nodes(ext, plugin_path, tmp_path, exporter, model,
                                                                     beta, expected):
    from ops.export import export

    source = export(model, exporter=exporter, lowering="decomposed", opset=17, beta=beta, export_shape=(2, 4, 64),
                    path=tmp_path / "in.onnx").path
    result = fuse(source, tmp_path / "out.onnx", plugin=str(plugin_path), log=quiet)
    after = types(result.path)
    assert {t: n for t, n in after.items() if t.startswith("myops::")} == expected
    assert not OP_PIECES & set(after), after
    assert len(result.proof) == 2 and all(line.startswith("proved at") for line in result.proof)
    imports = {o.domain: o.version for o in onnx.load(str(result.path)).opset_import}
    assert imports["myops"] == 1
    if beta == 1.702:
        attribute = next(n for n in onnx.load(str(result.path)).graph.node if n.op_type == "Swish").attribute[0]
        assert attribute.name == "beta" and attribute.f == pytest.approx(1.702)


def test_fuse_rewrites_an_ort_optimised_file(ext, plugin_path, tmp_path):
    """ORT's default level writes QuickGelu and SimplifiedLayerNormalization: both become myops nodes."""
    import onnxruntime as ort

    from ops.export import export

    for model, beta, fused_type, ours in (("swish", 1.702, "com.microsoft::QuickGelu", "myops::Swish"),
                                          ("rms_norm", None, "SimplifiedLayerNormalization", "myops::RMSNorm")):
        source = export(model, exporter="dynamo", lowering="decomposed", opset=17, beta=beta,
                        export_shape=(2, 4, 64), path=tmp_path / f"{model}.onnx").path
        optimised = tmp_path / f"{model}.optimised.onnx"
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(optimised)
        ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        assert types(optimised)[fused_type] == 1
        result = fuse(optimised, tmp_path / f"{model}.fused.onnx", plugin=str(plugin_path), log=quiet)
        assert types(result.path)[ours] == 1 and fused_type not in types(result.path)


def test_fuse_turns_a_hugging_face_llama_export_into_myops_nodes(ext, plugin_path, tmp_path):
    """The original model's export: torch.rsqrt as Reciprocal(Sqrt), which ORT's own fusion misses."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, vocab_size=100, use_cache=False)
    model = transformers.LlamaForCausalLM(config).eval()
    source = ext.export_model(model, {"input_ids": torch.randint(0, 100, (2, 8)), "use_cache": False},
                              tmp_path / "llama.onnx", lowering="decomposed",
                              dynamic_shapes={"input_ids": {0: "batch", 1: "seq"}}).path
    assert types(source)["Reciprocal"] == 5
    result = fuse(source, tmp_path / "llama.fused.onnx", plugin=str(plugin_path), log=quiet)
    after = types(result.path)
    assert after["myops::RMSNorm"] == 5 and after["myops::Swish"] == 2
    assert not OP_PIECES & set(after), after
    assert result.report.replaced == {("rms_norm", "x*Reciprocal(Sqrt(mean(x^2)+epsilon))*scale"): 5,
                                      ("swish", "x*Sigmoid(x)"): 2}


def hand_made(tmp_path: Path, nodes, inputs, initializers=()) -> Path:
    graph = helper.make_graph(nodes, "hand", [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
                                              for name, shape in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    path = tmp_path / "hand.onnx"
    onnx.save(model, str(path))
    return path


def test_fuse_refuses_a_beta_or_an_epsilon_known_only_at_run_time(plugin_path, tmp_path):
    swish = hand_made(tmp_path, [helper.make_node("Mul", ["x", "beta"], ["bx"]), helper.make_node("Sigmoid", ["bx"], ["s"]),
                                 helper.make_node("Mul", ["x", "s"], ["y"])], [("x", ["n", 8]), ("beta", [])])
    with pytest.raises(FuseError, match=r"refused x\*Sigmoid\(x\*beta\).*beta \(beta\) is not a one-element constant"):
        fuse(swish, tmp_path / "out.onnx", plugin=str(plugin_path), log=quiet)
    norm = hand_made(tmp_path, [
        helper.make_node("Pow", ["x", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq", "axes"], ["m"]),
        helper.make_node("Add", ["m", "eps"], ["me"]), helper.make_node("Sqrt", ["me"], ["r"]),
        helper.make_node("Div", ["x", "r"], ["n"]), helper.make_node("Mul", ["n", "w"], ["y"])],
        [("x", ["n", 8]), ("eps", [])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("axes", TensorProto.INT64, [1], [-1]),
         helper.make_tensor("w", TensorProto.FLOAT, [8], np.linspace(0.5, 1.5, 8))])
    with pytest.raises(FuseError, match=r"epsilon \(eps\) is not a one-element constant"):
        fuse(norm, tmp_path / "out.onnx", plugin=str(plugin_path), log=quiet)
    assert not (tmp_path / "out.onnx").exists() and not list(tmp_path.glob(".out.onnx.*"))


def test_fuse_refuses_a_rewrite_that_changes_results(plugin_path, tmp_path):
    """A wrong rule (Sigmoid(x) taken for Swish) is caught by the proof, and nothing is written."""
    from onnxscript.rewriter import pattern

    source = hand_made(tmp_path, [helper.make_node("Sigmoid", ["x"], ["y"])], [("x", ["n", 8])])
    wrong = pattern.RewriteRule(lambda op, x: op.Sigmoid(x), lambda op, x: op.Swish(x, beta=1.0, _domain="myops"))
    report_line = []
    with pytest.raises(FuseError, match="the rewrite changes results, so it is refused"):
        fuse(source, tmp_path / "out.onnx", plugin=str(plugin_path), extra_rules=[wrong], log=report_line.append)
    assert not (tmp_path / "out.onnx").exists() and not list(tmp_path.glob(".out.onnx.*"))


def test_fuse_cli_reports_and_exits_1_with_nothing_written(plugin_path, tmp_path):
    import subprocess
    import sys

    source = hand_made(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", ["n", 8])])
    done = subprocess.run([sys.executable, "-m", "ops.fuse", str(source), str(tmp_path / "out.onnx"), "--plugin",
                           str(plugin_path)], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert done.returncode == 1
    assert "nothing to replace" in done.stderr and "nothing was written" in done.stderr


def test_the_infer_runner_measures_model_files_like_the_rows(ext, plugin_path, tmp_path):
    """`runner bench --model`: a file and its fused rewrite, interleaved fresh processes, written as CSV."""
    import csv
    import subprocess
    import sys

    from ops.export import export

    source = export("ffn", exporter="dynamo", lowering="decomposed", opset=18, export_shape=(2, 4, 64),
                    path=tmp_path / "ffn.onnx").path
    fused = fuse(source, tmp_path / "ffn.fused.onnx", plugin=str(plugin_path), log=quiet).path
    done = subprocess.run([sys.executable, "-m", "infer.runner", "bench", "--model", source, str(fused), "--shape", "2x8",
                           "--rounds", "2", "--runs", "3", "--warmup", "1", "--threads", "1", "--plugin", str(plugin_path),
                           "--out", str(tmp_path / "results")], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, env={**__import__("os").environ, "MYOPS_MATRIX_ENTRY": "cpu"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("[bench round") == 4
    rows = list(csv.DictReader(open(tmp_path / "results" / "cpu" / "model_files.csv")))
    assert [r["file"] for r in rows] == ["ffn.onnx", "ffn.fused.onnx"]
    assert all(r["processes"] == "2" and float(r["p50_ms"]) > 0 and r["inputs"] == '{"x": [2, 8, 64]}' for r in rows)
    done = subprocess.run([sys.executable, "-m", "infer.runner", "bench", "--model", str(tmp_path / "nothing.onnx"),
                           "--plugin", str(plugin_path)], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert done.returncode == 2 and "no such ONNX file" in done.stderr


def test_fuse_takes_onnx_swish_at_its_default_alpha_and_refuses_a_scale_not_per_channel(plugin_path, tmp_path):
    graph = helper.make_graph([helper.make_node("Swish", ["x"], ["y"])], "swish24",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "swish24.onnx"))
    result = fuse(tmp_path / "swish24.onnx", tmp_path / "swish24.fused.onnx", plugin=str(plugin_path), log=quiet)
    (node,) = onnx.load(str(result.path)).graph.node
    assert (node.domain, node.op_type, node.attribute[0].f) == ("myops", "Swish", 1.0)

    norm = hand_made(tmp_path, [
        helper.make_node("Pow", ["x", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq", "axes"], ["m"]),
        helper.make_node("Add", ["m", "eps"], ["me"]), helper.make_node("Sqrt", ["me"], ["r"]),
        helper.make_node("Div", ["x", "r"], ["n"]), helper.make_node("Mul", ["n", "w"], ["y"])], [("x", ["n", 8])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("axes", TensorProto.INT64, [1], [-1]),
         helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6]), helper.make_tensor("w", TensorProto.FLOAT, [1], [0.5])])
    with pytest.raises(FuseError, match=r"the scale \(w\) is not one value per channel of x"):
        fuse(norm, tmp_path / "out.onnx", plugin=str(plugin_path), log=quiet)


def test_inputs_that_may_broadcast_are_told_from_ones_that_cannot():
    """A several-input op's rule refuses operands whose known shapes may differ (the fused op does not
    broadcast): another rank, two fixed sizes that differ, a fixed 1 against a symbolic size."""
    import onnx_ir as ir

    from ops.onnx_parts import _may_broadcast

    batch, seq = ir.SymbolicDim("batch"), ir.SymbolicDim("seq")
    assert not _may_broadcast((batch, seq, 768), (batch, seq, 768))
    assert _may_broadcast((batch, seq, 768), (768,))
    assert _may_broadcast((batch, seq, 768), (1, 1, 768))
    assert _may_broadcast((2, 3, 768), (2, 3, 64))
    assert not _may_broadcast((batch, seq, 768), (ir.SymbolicDim("n"), seq, 768))  # unknown: the proof decides


def _plain_export(tmp_path: Path) -> Path:
    """A user's model exported with nothing but torch.onnx.export(model, args, path): with the pinned
    torch that is the dynamo exporter, which writes the weights to model.onnx.data beside the file."""
    import torch

    class TeamActivation(torch.nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(1.3 * x)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), TeamActivation(), torch.nn.Linear(256, 64)).eval()
    path = tmp_path / "user" / "model.onnx"
    path.parent.mkdir()
    torch.onnx.export(model, (torch.randn(2, 8, 64),), str(path))
    return path


def _relocate(model_path: Path, location: str) -> None:
    moved = onnx.load(str(model_path), load_external_data=False)
    for tensor in moved.graph.initializer:
        for entry in tensor.external_data:
            entry.value = location if entry.key == "location" else entry.value
    model_path.write_bytes(moved.SerializeToString())


def test_a_plain_export_with_external_data_is_fused_and_benched(ext, plugin_path, tmp_path):
    """fuse reads the weights beside the model and writes its own the same way (OUT.onnx.data), proven
    in ORT; the runner measures both files; a data file outside the model's folder is refused, as ORT does."""
    import os
    import subprocess
    import sys

    source = _plain_export(tmp_path)
    if not (source.parent / "model.onnx.data").exists():  # a torch whose plain export keeps them inside
        onnx.save_model(onnx.load(str(source)), str(source), save_as_external_data=True, location="model.onnx.data",
                        size_threshold=0)
    out = tmp_path / "fused" / "model.fused.onnx"
    done = subprocess.run([sys.executable, "-m", "ops.fuse", str(source), str(out), "--plugin", str(plugin_path)],
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.fused.onnx", "model.fused.onnx.data"]
    written = onnx.load(str(out))  # the weights read back through the data file's reference
    swish = [n for n in written.graph.node if n.op_type == "Swish"]
    assert len(swish) == 1 and abs(swish[0].attribute[0].f - 1.3) < 1e-6, written.graph.node
    assert any(t.data_location == TensorProto.EXTERNAL for t in onnx.load(str(out), load_external_data=False).graph.initializer)
    done = subprocess.run([sys.executable, "-m", "infer.runner", "bench", "--model", str(source), str(out), "--shape",
                           "2x8", "--rounds", "1", "--runs", "3", "--warmup", "1", "--threads", "1", "--plugin",
                           str(plugin_path), "--out", str(tmp_path / "results")], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, env={**os.environ, "MYOPS_MATRIX_ENTRY": "cpu"}, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # The data file moved out of the model's folder and the reference pointed at it: refused, nothing written.
    _relocate(source, "../model.onnx.data")
    (source.parent / "model.onnx.data").rename(tmp_path / "model.onnx.data")
    with pytest.raises(FuseError, match="outside the model's folder"):
        fuse(source, tmp_path / "refused" / "x.onnx", plugin=str(plugin_path), log=quiet)
    assert not (tmp_path / "refused").exists()
    # A rewrite whose proof fails (here: no plugin that serves the op) leaves the earlier output as it was.
    (tmp_path / "model.onnx.data").rename(source.parent / "model.onnx.data")
    _relocate(source, "model.onnx.data")
    before = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    with pytest.raises(FuseError):
        fuse(source, out, plugin=str(tmp_path / "no-plugin.so"), log=quiet)
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before
