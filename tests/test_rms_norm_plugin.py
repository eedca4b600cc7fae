"""myops::rms_norm beyond layer 1: the ORT plugin against the extension (the same kernel header, so
the same bits), every CPU path, drawn inputs, doctor, and the ONNX lowerings ORT optimises (layer 2
runs every export in test_alignment_onnx.py; layer 3 runs the rms_norm artifacts in the images).
Layer 1 on every device is test_rms_norm.py.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from test_rms_norm import FP32, inputs, reference64

REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------- the plugin

def rms_norm_graph(*, epsilon=None, hidden=16, scale_dim=None, with_neighbours=False) -> onnx.ModelProto:
    """x[batch, seq, hidden], scale[hidden] -> myops::RMSNorm (-> Mul 2) -> y, y left without a shape."""
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    nodes = [helper.make_node("RMSNorm", ["x", "scale"], ["n" if with_neighbours else "y"], domain="myops", **attrs)]
    inits = []
    if with_neighbours:
        inits.append(helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0]))
        nodes.append(helper.make_node("Mul", ["n", "two"], ["y"]))
    graph = helper.make_graph(
        nodes, "rms_norm_graph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [scale_dim or hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("myops", 1)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(8, 512, 768), (2, 3, 37), (1, 1, 4096), (0, 5, 16)], ids=str)
def test_plugin_gives_the_extension_bits(plugin_path, ext, shape, threads):
    from ort_plugin import make_session

    session = make_session(rms_norm_graph(epsilon=1e-5, hidden=shape[-1]).SerializeToString(), library=plugin_path,
                           threads=threads)
    x, weight = inputs(shape, seed=5)
    (y,) = session.run(None, {"x": x.numpy(), "scale": weight.numpy()})
    # One home for the math: the same header gives the same bits in both layers, however the rows
    # are split over the two thread pools.
    np.testing.assert_array_equal(y, ext.rms_norm(x, weight, 1e-5).numpy())


def test_plugin_default_epsilon_and_zero_rows(plugin_path, ext):
    from ort_plugin import make_session

    session = make_session(rms_norm_graph().SerializeToString(), library=plugin_path)
    x, weight = inputs((2, 3, 16), scale=1e-3)
    x[1, 2] = 0.0
    (y,) = session.run(None, {"x": x.numpy(), "scale": weight.numpy()})
    np.testing.assert_array_equal(y, ext.rms_norm(x, weight, 1e-6).numpy())
    assert not y[1, 2].any()


@pytest.mark.parametrize("with_neighbours", [False, True])
def test_plugin_output_shape_is_inferred(plugin_path, with_neighbours):
    from ort_plugin import make_session

    session = make_session(rms_norm_graph(with_neighbours=with_neighbours).SerializeToString(), library=plugin_path)
    assert session.get_outputs()[0].shape == ["batch", "seq", 16]
    assert session.get_outputs()[0].type == "tensor(float)"


def test_plugin_epsilon_of_the_wrong_type_is_named(plugin_path):
    from ort_plugin import make_session

    model = rms_norm_graph()
    model.graph.node[0].attribute.append(helper.make_attribute("epsilon", 1))
    with pytest.raises(Exception, match="myops::RMSNorm .*attribute 'epsilon' must be a float"):
        make_session(model.SerializeToString(), library=plugin_path)


def test_plugin_scale_of_the_wrong_length_is_named(plugin_path):
    from ort_plugin import make_session

    # A symbolic scale length: ORT cannot check it against the graph, the kernel must.
    session = make_session(rms_norm_graph(scale_dim="hidden_again").SerializeToString(), library=plugin_path)
    x, weight = inputs((2, 3, 16))
    with pytest.raises(Exception, match=r"scale must have shape \[X.shape\[-1\]\] = \[16\]; got \[15\]"):
        session.run(None, {"x": x.numpy(), "scale": weight[:15].numpy()})


# ---------------------------------------------------------------- every CPU path

CHILD = r"""
import sys
import numpy as np, torch
import ops
from ort_plugin import make_session
from tests.test_rms_norm_plugin import rms_norm_graph

data = np.load(sys.argv[1])
ops.load()
x, w, g = (torch.from_numpy(data[k]) for k in ("x", "w", "g"))
session = make_session(rms_norm_graph(epsilon=1e-6, hidden=x.shape[-1]).SerializeToString(), library=sys.argv[2])
dx, dw = torch.ops.myops.rms_norm_backward(g, x, w, 1e-6)
np.savez(sys.argv[3], extension=ops.rms_norm(x, w, 1e-6).numpy(), dx=dx.numpy(), dw=dw.numpy(),
         plugin=session.run(None, {"x": data["x"], "scale": data["w"]})[0])
"""


def test_every_cpu_path_agrees(plugin_path, ext, tmp_path):
    from bench.cpu_paths import runnable

    paths = [p for p in runnable() if p != "neon"]
    if paths == ["baseline"]:
        pytest.skip("this CPU runs the baseline path only: nothing to compare it with")
    rng = np.random.default_rng(11)
    shape = (4, 9, 1001)  # a width that is no multiple of any vector: every row ends in a tail
    data = dict(x=rng.normal(scale=4, size=shape).astype(np.float32), w=rng.normal(1, 0.2, shape[-1]).astype(np.float32),
                g=rng.normal(size=shape).astype(np.float32))
    np.savez(tmp_path / "in.npz", **data)
    runs = {}
    for path in paths:
        out = tmp_path / f"{path}.npz"
        child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "in.npz"), str(plugin_path), str(out)],
                               capture_output=True, text=True, cwd=REPO, timeout=600,
                               env=dict(os.environ, MYOPS_CPU_ISA=path, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / 'tests')])))
        assert child.returncode == 0, child.stderr
        runs[path] = dict(np.load(out))
        said = [line for line in child.stderr.splitlines() if line.startswith("[myops] MYOPS_CPU_ISA=")]
        # One line per library (extension, plugin), not per op: the ops of a library share one choice.
        assert said == [f"[myops] MYOPS_CPU_ISA={path}: the CPU path is {path}"] * 2, child.stderr
    x, w, g = (torch.from_numpy(data[k]).double() for k in ("x", "w", "g"))
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    expected = reference64(xr, wr, 1e-6)
    expected.backward(g)
    for path, run in runs.items():
        np.testing.assert_array_equal(run["plugin"], run["extension"], err_msg=path)
        np.testing.assert_allclose(run["extension"], expected.detach().numpy(), **FP32, err_msg=path)
        np.testing.assert_allclose(run["dx"], xr.grad.numpy(), atol=1e-5, rtol=1e-5, err_msg=path)
        np.testing.assert_allclose(run["dw"], wr.grad.numpy(), atol=1e-3, rtol=1e-5, err_msg=path)


# ---------------------------------------------------------------- what ORT makes of the lowerings

def optimised_nodes(path: Path, level) -> Counter:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(path.with_suffix(".optimised.onnx"))
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    model = onnx.load(options.optimized_model_filepath)
    return Counter(n.op_type for n in model.graph.node if n.op_type != "Constant")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_decomposed_lowering_is_fused_by_ort_at_its_default_level(ext, tmp_path, exporter):
    import onnxruntime as ort

    from ops import export as E

    if exporter not in E.available_exporters():
        pytest.skip(f"torch {torch.__version__} has no {exporter} exporter for custom ops")
    result = E.export("rms_norm", exporter=exporter, lowering="decomposed", opset=18, path=tmp_path / "d.onnx")
    assert optimised_nodes(Path(result.path), ort.GraphOptimizationLevel.ORT_ENABLE_ALL) == \
        Counter({"SimplifiedLayerNormalization": 1})
    # BASIC leaves the six nodes: the bench's "ORT composite, BASIC" row times them unfused.
    assert optimised_nodes(Path(result.path), ort.GraphOptimizationLevel.ORT_ENABLE_BASIC) == \
        Counter({n: 1 for n in ("Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul")})


def test_decomposed_uses_standard_rms_normalization_from_opset_23(ext, tmp_path):
    from ops import export as E
    from ops.registry import OPS

    if "dynamo" not in E.available_exporters() or E.dynamo_max_opset() < 23 or not OPS["rms_norm"].onnx.uses_standard(23):
        pytest.skip("needs the dynamo exporter and an onnxruntime that runs RMSNormalization (opset 23)")
    result = E.export("rms_norm", exporter="dynamo", lowering="decomposed", opset=23, eps=1e-5, path=tmp_path / "s.onnx")
    nodes = [n for n in onnx.load(result.path).graph.node if n.op_type != "Constant"]
    assert [n.op_type for n in nodes] == ["RMSNormalization"]
    attributes = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes["axis"] == -1 and attributes["epsilon"] == pytest.approx(1e-5)


@pytest.mark.parametrize("opset", [17, 18])
def test_float16_decomposed_export_sums_in_float32_and_runs_in_ort(ext, tmp_path, opset):
    """X float16: the decomposed graph casts X (and the scale) to float, sums there, casts Y back
    (the constants then meet float tensors); ONNX Runtime runs it and matches the float32 reference
    rounded once to float16."""
    import onnxruntime as ort

    from ops import export as E

    if "dynamo" not in E.available_exporters():
        pytest.skip("float16 export needs the dynamo exporter (TorchScript runs the float32 CPU kernels)")
    result = E.export("rms_norm", exporter="dynamo", lowering="decomposed", opset=opset, dtype="float16",
                      path=tmp_path / "h.onnx")
    model = onnx.load(result.path)
    nodes = [n.op_type for n in model.graph.node if n.op_type != "Constant"]
    # X cast in, Y cast out; the scale's Cast was folded into its initializer by the exporter.
    assert Counter(nodes) == Counter({"Cast": 2, "Pow": 1, "ReduceMean": 1, "Add": 1, "Sqrt": 1, "Div": 1, "Mul": 1})
    assert {i.type.tensor_type.elem_type for i in model.graph.input} == {onnx.TensorProto.FLOAT16}
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    x = (torch.randn(3, 7, 768) * 30).half()  # squares beyond float16's range: they must be summed in float32
    weight = E.build_model("rms_norm").weight.detach().half()
    (y,) = ort.InferenceSession(result.path, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    from ops import OPS

    expected = OPS["rms_norm"].reference(x, weight)  # float32 sums, rounded once to float16
    assert y.dtype == np.float16 and np.isfinite(y).all()
    np.testing.assert_allclose(y.astype(np.float32), expected.float().numpy(), rtol=2**-10, atol=1e-3)


def test_float16_custom_export_types_the_node(ext, tmp_path):
    from ops import export as E

    if "dynamo" not in E.available_exporters():
        pytest.skip("float16 export needs the dynamo exporter")
    model = onnx.load(E.export("rms_norm", exporter="dynamo", lowering="custom", opset=18, dtype="float16",
                               path=tmp_path / "c.onnx").path)
    assert [n.op_type for n in model.graph.node if n.op_type != "Constant"] == ["RMSNorm"]
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    with pytest.raises(E.ExportError, match="use --exporter dynamo"):
        E.export("rms_norm", exporter="torchscript", lowering="decomposed", opset=18, dtype="float16",
                 path=tmp_path / "t.onnx")
    assert not (tmp_path / "t.onnx").exists()
    # Every declared form's decomposed lowering takes float16 the same way: cast in, computed in float32
    # (Swish's beta a float constant there), cast back.
    swish = onnx.load(E.export("swish", exporter="dynamo", lowering="decomposed", opset=18, beta=1.702,
                               dtype="float16", path=tmp_path / "s.onnx").path)
    assert sorted(n.op_type for n in swish.graph.node if n.op_type != "Constant") == ["Cast", "Cast", "Mul", "Mul",
                                                                                      "Sigmoid"]
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((2, 5, 768)).astype(np.float16)
    (y,) = ort.InferenceSession(str(tmp_path / "s.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    want = ext.reference(torch.from_numpy(x), 1.702).numpy()
    assert y.dtype == np.float16 and np.abs(y.astype(np.float32) - want.astype(np.float32)).max() <= 2 ** -10 * 8


def test_doctor_probes_and_reads_rms_norm(ext, plugin_path, tmp_path):
    from ops.export import export

    model = export("rms_norm", exporter="torchscript", lowering="custom", opset=17, path=tmp_path / "rms_norm.onnx")
    result = subprocess.run([sys.executable, "-m", "ops.doctor", "--plugin", str(plugin_path), model.path],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for expected in ("myops::RMSNorm v1+ on CPUExecutionProvider: registered and runs [float32]",
                     "myops::RMSNorm (1 node): registered by the plugin", "dynamic axes 0 (batch), 1 (seq)",
                     "doctor: all green"):
        assert expected in result.stdout, result.stdout


# ---------------------------------------------------------------- under load: drawn inputs, threads

from hypothesis import given  # noqa: E402  (here: the property tests below are the only users)
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import array_shapes  # noqa: E402

from tests.test_under_load import PROPERTY_SETTINGS  # noqa: E402


@st.composite
def rms_cases(draw):
    return {
        "shape": draw(st.one_of(array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=9),
                                array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=300))),
        "eps": draw(st.sampled_from([1e-6, 1e-5, 1e-3, 0.5])),
        "scale": draw(st.sampled_from([1e-3, 1.0, 30.0, 1e4])),
        "strided": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


@functools.lru_cache(maxsize=32)
def rms_session(library: str, eps: float, rank: int):
    from ort_plugin import make_session

    model = rms_norm_graph(epsilon=eps)
    dims = [f"d{i}" for i in range(rank)]
    x, scale = model.graph.input
    x.CopyFrom(helper.make_tensor_value_info("x", TensorProto.FLOAT, dims))
    scale.CopyFrom(helper.make_tensor_value_info("scale", TensorProto.FLOAT, [dims[-1]]))
    return make_session(model.SerializeToString(), library=library, threads=2)


@PROPERTY_SETTINGS
@given(case=rms_cases())
def test_drawn_inputs_match_float64_and_the_plugin_bitwise(ext, plugin_path, case):
    rng = np.random.default_rng(case["seed"])
    shape = tuple(case["shape"])
    wide = rng.normal(scale=case["scale"], size=shape[:-1] + (shape[-1] * 2,)).astype(np.float32)
    # Every other column of a wider array: the extension makes it contiguous first.
    view = torch.from_numpy(wide)[..., ::2] if case["strided"] else torch.from_numpy(wide[..., : shape[-1]].copy())
    weight = torch.from_numpy(rng.normal(1.0, 0.3, size=shape[-1]).astype(np.float32))
    y = ext.rms_norm(view, weight, case["eps"])
    expected = reference64(view, weight, case["eps"]).float()
    torch.testing.assert_close(y, expected, atol=4e-6, rtol=4e-6)
    (y_ort,) = rms_session(str(plugin_path), case["eps"], len(shape)).run(
        None, {"x": view.contiguous().numpy(), "scale": weight.numpy()})
    np.testing.assert_array_equal(y_ort, y.numpy())


def test_sessions_on_many_threads_keep_their_own_epsilon(plugin_path, ext):
    import threading

    from ort_plugin import make_session

    epsilons = (1e-6, 1e-3, 0.5, 2.0)
    sessions = [make_session(rms_norm_graph(epsilon=e, hidden=256).SerializeToString(), library=plugin_path, threads=2)
                for e in epsilons]
    x, weight = inputs((64, 37, 256), seed=9, scale=0.05)  # small values: epsilon decides the output
    expected = [ext.rms_norm(x, weight, e).numpy() for e in epsilons]
    failures = []

    def work(t):
        for i in range(20):
            s = (t + i) % len(sessions)
            (y,) = sessions[s].run(None, {"x": x.numpy(), "scale": weight.numpy()})
            if not np.array_equal(y, expected[s]):
                failures.append(f"thread {t}, iteration {i}, epsilon {epsilons[s]}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:5]
