"""Every op of a kind (elementwise or rowwise) through the three layers, from its declaration alone: the
extension against the declared form's reference on every device present (tests/devices.py: the CPU in float32, CUDA in float32,
float16 and bfloat16 where a GPU is), its fakes and autograd (second derivatives included), both exporters
and lowerings run by ONNX Runtime, the fuse rule, and the plugin against the extension. An op scaffolded
by `nox -s new_op` (its declaration and its math, nothing else) is tested here with no file of its own:
`nox -s tests -- tests/test_declared_ops.py -k <name>`. Tolerances are the op's (opspec/<name>.py)."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from devices import DEVICE_DTYPES, DEVICES, assert_close, tolerance
from ops.registry import OPS

DECLARED = sorted(name for name, op in OPS.items() if op.spec.kind in ("elementwise", "rowwise"))
SEVERAL_INPUTS = [name for name in DECLARED if OPS[name].spec.kind == "elementwise" and len(OPS[name].spec.inputs) > 1]
ROWWISE = [name for name in DECLARED if OPS[name].spec.kind == "rowwise"]
# empty, scalar-like, a tail, several chunks (a rowwise op: one row of each, rows of 33 and 768 columns)
SHAPES = [(0,), (1,), (7,), (3, 5, 33), (2, 16, 768), (70000,)]


def _input(shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _inputs(op, shape, seed=0, dtype=torch.float32) -> tuple:
    """One tensor per input of the op, each from its own seed: the full-shaped ones of `shape`, then a rowwise
    op's weights, [shape[-1]] each and near 1 as its models' are."""
    full = op.spec.full_inputs
    return (tuple(_input(shape, seed + 100 * k, dtype) for k in range(full)) +
            tuple(1.0 + 0.1 * _input(shape[-1:], seed + 100 * (full + k), dtype) for k in range(len(op.weights))))


def _names(op) -> tuple:
    """Every input's name, weights included, as the gradients come."""
    return (*op.spec.graph_inputs, *op.weights)


def _tolerance_of(op, dtype, name, rows) -> dict:
    """A weight's gradient is a sum over the rows: its atol grows with their square root."""
    tol = tolerance(op, dtype)
    return dict(tol, atol=tol["atol"] * max(1, rows) ** 0.5) if name in op.weights else tol


def _model_inputs(op, full, hidden) -> tuple:
    """The full-shaped inputs and the weights of the op's exported model (ops.export builds it from seed 0)."""
    model = op.build_model(op.name, hidden=hidden, seed=0)
    return (*full, *(getattr(model, name).detach() for name in op.weights))


def _outputs(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def _feed(op, inputs) -> dict:
    """The exported model's graph inputs, by name."""
    return {name: t.numpy() for name, t in zip(op.spec.graph_inputs, inputs)}


def _exporters() -> list[tuple[str, str]]:
    """(exporter, lowering) pairs; ops.export imports onnx, which a GPU host running only the CUDA cases
    may lack, so it is imported here, when the ONNX tests are collected."""
    try:
        from ops import export as E
    except ModuleNotFoundError as exc:  # only a missing exporter package; anything else is an error
        if exc.name not in ("onnx", "onnxscript", "onnxruntime"):
            raise
        return []
    return list(itertools.product(E.available_exporters(), E.LOWERINGS))


@pytest.fixture(params=DECLARED)
def op(request):
    return OPS[request.param]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer1_forward_and_backward_match_the_reference(ext, op, device, dtype, shape):
    """Against the reference in float32 on the same device, rounded once to the dtype; every output, and
    every input's gradient from a gradient for each output."""
    if dtype not in op.tolerances:
        pytest.skip(f"{op.name} declares no {dtype} tolerance: its kernels do not take {dtype}")
    inputs = tuple(t.to(device, getattr(torch, dtype)).requires_grad_(True) for t in _inputs(op, shape))
    floats = tuple(t.detach().float().requires_grad_(True) for t in inputs)
    ys, yrs = _outputs(op.function(*inputs)), _outputs(op.reference(*floats))
    assert len(ys) == len(yrs) == len(op.spec.graph_outputs)
    tol = tolerance(op, dtype)
    for name, y, yr in zip(op.spec.graph_outputs, ys, yrs):
        assert_close(y.detach(), yr.detach().to(y.dtype), tol, f"forward, {name}")
    grads_out = [_input(shape, seed=1 + k).to(device, ys[0].dtype) for k in range(len(ys))]
    grads = torch.autograd.grad(ys, inputs, grads_out)
    expected = torch.autograd.grad(yrs, floats, [g.float() for g in grads_out])
    rows = inputs[0].numel() // max(1, shape[-1])
    for name, got, want in zip(_names(op), grads, expected, strict=True):
        assert_close(got, want.to(ys[0].dtype), _tolerance_of(op, dtype, name, rows), f"backward, d{name}")


def test_an_output_the_loss_does_not_use_adds_nothing(ext, op):
    """A loss of y alone: the other outputs get no gradient (None), which the backward takes as zeros."""
    if len(op.spec.graph_outputs) == 1:
        pytest.skip("the op has one output")
    inputs = tuple(t.requires_grad_(True) for t in _inputs(op, (3, 5)))
    floats = tuple(t.detach().requires_grad_(True) for t in inputs)
    grads = torch.autograd.grad(_outputs(op.function(*inputs))[0].sum(), inputs)
    expected = torch.autograd.grad(_outputs(op.reference(*floats))[0].sum(), floats)
    for name, got, want in zip(_names(op), grads, expected, strict=True):
        assert_close(got, want, tolerance(op, "float32"), f"backward, d{name}")


# One CPU path per process (cpu_isa.h reads MYOPS_CPU_ISA once): forward and backward of a fixed input.
_PATH_CHILD = """
import sys, torch, ops
from ops.registry import OPS
ops.load()
op = OPS[sys.argv[2]]
g = torch.Generator().manual_seed(0)
inputs = [torch.randn(37, 1891, generator=g).mul_(6) for _ in range(op.spec.full_inputs)]  # several chunks
inputs += [1 + 0.1 * torch.randn(1891, generator=g) for _ in op.weights]
inputs = [t.requires_grad_(True) for t in inputs]
ys = op.function(*inputs)
ys = ys if isinstance(ys, tuple) else (ys,)
grads = torch.autograd.grad(ys, inputs, [torch.ones_like(y) for y in ys])
torch.save({"inputs": [t.detach() for t in inputs], "ys": [y.detach() for y in ys], "grads": list(grads)}, sys.argv[1])
"""


def _cpu_paths() -> list[str]:
    from bench.cpu_paths import runnable

    return runnable() or ["baseline"]


@pytest.mark.parametrize("path", _cpu_paths())
def test_every_cpu_path_matches_the_reference(ext, op, path, tmp_path):
    """The float32 CPU loops on each path this CPU runs, capped by MYOPS_CPU_ISA: the line the cap prints
    names the path taken."""
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, MYOPS_CPU_ISA=path, PYTHONPATH=str(repo))
    child = subprocess.run([sys.executable, "-c", _PATH_CHILD, str(tmp_path / "out.pt"), op.name], capture_output=True,
                           text=True, env=env, cwd=repo, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    assert f"MYOPS_CPU_ISA={path}: the CPU path is {path}" in child.stderr, child.stderr[-2000:]
    out = torch.load(tmp_path / "out.pt")
    inputs = [t.requires_grad_(True) for t in out["inputs"]]
    yrs = _outputs(op.reference(*inputs))
    expected = torch.autograd.grad(yrs, inputs, [torch.ones_like(yr) for yr in yrs])
    assert len(out["ys"]) == len(yrs)
    for name, y, yr in zip(op.spec.graph_outputs, out["ys"], yrs):
        assert_close(y, yr.detach(), tolerance(op, "float32"), f"forward, {name}")
    for name, got, want in zip(_names(op), out["grads"], expected, strict=True):
        assert_close(got, want, _tolerance_of(op, "float32", name, 37), f"backward, d{name}")


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_and_unaligned_inputs(ext, op, device):
    wide = [t.to(device) for t in _inputs(op, (4, 64))[:op.spec.full_inputs]]
    for view in (lambda t: t[:, ::2], lambda t: t.t(), lambda t: t.flatten()[1:]):
        views = [view(t) for t in wide]
        views += [w.to(device) for w in _inputs(op, views[0].shape)[op.spec.full_inputs:]]  # a rowwise op's weights
        for y, yr in zip(_outputs(op.function(*views)), _outputs(op.reference(*views)), strict=True):
            assert_close(y, yr, tolerance(op, "float32"))


def test_pytorch_s_own_function_computes_the_op(ext, op):
    """The native row the bench shows beside the op (the declaration's native=) is the same function as the
    reference, with the op's default attributes."""
    if op.native is None:
        pytest.skip(f"{op.name} declares no PyTorch function (opspec/{op.name}.py: native=)")
    attributes = op.attributes()
    if not op.native_applies(attributes):
        pytest.skip(f"{op.native_text} computes {op.name} at other attributes than its defaults")
    inputs = tuple(t * 4 for t in _inputs(op, (3, 5, 33)))
    natives = _outputs(op.native(*inputs, *attributes.values()))
    assert len(natives) == len(op.spec.graph_outputs), (
        f"native= gives {len(natives)} tensor(s), the op has {len(op.spec.graph_outputs)} outputs "
        f"({', '.join(op.spec.graph_outputs)}): make the expression return one per output, in order")
    for y, yr in zip(natives, _outputs(op.reference(*inputs)), strict=True):
        assert_close(y, yr, tolerance(op, "float32"), "native")


def test_a_nan_gives_nan_where_the_reference_does(ext, op):
    """NaN in any input: every output and every gradient is NaN where the reference's is (a select in the
    math that sends NaN to a finite branch would not be)."""
    inputs = tuple(t.requires_grad_(True) for t in _inputs(op, (3, 40)))
    floats = tuple(t.detach().clone().requires_grad_(True) for t in inputs)
    with torch.no_grad():
        for k, (t, f) in enumerate(zip(inputs, floats)):
            for x in (t, f):
                if x.dim() == 1:  # a rowwise op's weight: some columns
                    x[:: 7 + k] = float("nan")
                    continue
                x[k % 3, :: 7 + k] = float("nan")
                x[2, 5] = 30.0  # beyond a cap such as Mish's at 20
    ys, yrs = _outputs(op.function(*inputs)), _outputs(op.reference(*floats))
    for name, y, yr in zip(op.spec.graph_outputs, ys, yrs):
        assert torch.equal(torch.isnan(y), torch.isnan(yr)), f"forward, {name}"
    grads_out = [torch.ones_like(y) for y in ys]
    grads = torch.autograd.grad(ys, inputs, grads_out)
    expected = torch.autograd.grad(yrs, floats, [g.clone() for g in grads_out])
    for name, got, want in zip(_names(op), grads, expected, strict=True):
        # (a weight's gradient may have none: LayerNorm's bias gradient is the sum of the output's gradient)
        assert name in op.weights or torch.isnan(want).any(), f"backward, d{name}: the check saw no NaN"
        assert torch.equal(torch.isnan(got), torch.isnan(want)), f"backward, d{name}"


def test_gradcheck_and_gradgradcheck_in_float64(ext, op):
    """First derivatives through the op's fused backward, second ones through its backward op's own
    autograd (the reference's: ops/autograd.py)."""
    inputs = tuple(t.requires_grad_(True) for t in _inputs(op, (3, 5), dtype=torch.float64))
    assert torch.autograd.gradcheck(op.function, inputs)
    assert torch.autograd.gradgradcheck(op.function, inputs)


def test_other_dtypes_are_refused_with_a_message(ext, op):
    with pytest.raises(RuntimeError, match="must be float32"):
        op.function(*(t.to(torch.int32) for t in _inputs(op, (4,))))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_fakes_and_autograd(ext, op, device):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip(f"torch {torch.__version__} has no torch.library.opcheck")
    overload = op.overload()
    torch.library.opcheck(overload, tuple(t.to(device) for t in _inputs(op, (2, 8))))
    torch.library.opcheck(overload, tuple(t.to(device).requires_grad_(True) for t in _inputs(op, (2, 8))))


def test_torch_export_keeps_the_op(ext, op):
    model = op.build_model(op.name, hidden=16)
    inputs = _inputs(op, (2, 3, 16))[:op.spec.full_inputs]  # a rowwise op's weights are the model's
    program = torch.export.export(model, inputs)
    assert any(node.target == op.overload() for node in program.graph.nodes)
    torch.testing.assert_close(program.module()(*inputs), model(*inputs), rtol=0, atol=0)


@pytest.mark.parametrize("exporter,lowering", _exporters())
def test_exported_model_runs_in_onnx_runtime(ext, op, plugin_path, tmp_path, exporter, lowering):
    import numpy as np

    from ops import export as E
    from ort_plugin.loader import make_session

    result = E.export(op.name, exporter=exporter, lowering=lowering, opset=18, path=tmp_path / "m.onnx")
    inputs = _model_inputs(op, _inputs(op, (3, 7, 768), seed=2)[:op.spec.full_inputs], 768)  # dynamic axes
    session = make_session(result.path, library=plugin_path)
    assert [o.name for o in session.get_outputs()] == list(op.spec.graph_outputs)
    ys = session.run(None, _feed(op, inputs))
    rtol, atol = op.tolerances["float32"]
    for name, y, yr in zip(op.spec.graph_outputs, ys, _outputs(op.reference(*inputs)), strict=True):
        np.testing.assert_allclose(y, yr.numpy(), rtol=rtol, atol=atol, err_msg=name)


def test_the_plugin_infers_every_output_s_type_and_shape(ext, op, plugin_path, tmp_path):
    """The graph's outputs declared without a type: what the session reports is what ORT inferred through
    the plugin's shape inference (every output takes X's type and shape, symbolic dims included)."""
    import onnx

    from ops import export as E
    from ort_plugin.loader import make_session

    path = E.export(op.name, exporter=E.available_exporters()[0], lowering="custom", opset=18,
                    path=tmp_path / "c.onnx").path
    model = onnx.load(str(path))
    del model.graph.value_info[:]
    for output in model.graph.output:
        output.ClearField("type")
    session = make_session(model.SerializeToString(), library=plugin_path)
    x = session.get_inputs()[0]
    assert isinstance(x.shape[0], str), x.shape  # a symbolic batch: what inference must carry through
    assert [(o.name, o.type, o.shape) for o in session.get_outputs()] == \
        [(name, x.type, x.shape) for name in op.spec.graph_outputs]


def test_fuse_turns_the_decomposed_export_into_the_op(ext, op, plugin_path, tmp_path):
    """`nox -s fuse`'s rule (the declared form's) on the decomposed export: one myops node, proven in ORT
    against the file it came from."""
    import onnx

    from ops import export as E
    from ops.fuse import fuse

    source = E.export(op.name, exporter="dynamo", lowering="decomposed", opset=18, path=tmp_path / "d.onnx").path
    result = fuse(source, tmp_path / "fused.onnx", plugin=str(plugin_path), ops=[op.name], log=lambda line: None)
    nodes = onnx.load(str(result.path)).graph.node
    assert [node.op_type for node in nodes] == [op.spec.onnx_type]
    assert {a.name: a.f for a in nodes[0].attribute} == pytest.approx(op.attributes())  # read off the file


def test_plugin_equals_the_extension_bit_for_bit(ext, op, plugin_path, tmp_path):
    import numpy as np

    from ops import export as E
    from ort_plugin.loader import make_session

    path = E.export(op.name, exporter=E.available_exporters()[0], lowering="custom", opset=18,
                    path=tmp_path / "c.onnx").path
    inputs = _model_inputs(op, _inputs(op, (8, 512, 768), seed=3)[:op.spec.full_inputs], 768)
    ys = make_session(path, library=plugin_path, threads=2).run(None, _feed(op, inputs))
    for name, y, ye in zip(op.spec.graph_outputs, ys, _outputs(op.function(*inputs)), strict=True):
        np.testing.assert_array_equal(y, ye.numpy(), err_msg=name)


@pytest.mark.parametrize("name", SEVERAL_INPUTS)
def test_inputs_of_another_shape_are_refused_with_a_message(ext, plugin_path, tmp_path, name):
    """The op does not broadcast: every input has x's shape, in the extension and in the plugin."""
    from ops import export as E
    from ort_plugin.loader import make_session

    op = OPS[name]
    inputs = list(_inputs(op, (2, 3, 768)))
    inputs[-1] = inputs[-1][:, :1]
    with pytest.raises(RuntimeError, match="must have x's shape"):
        op.function(*inputs)
    elsewhere = list(_inputs(op, (2, 3, 8)))  # the fake kernel runs for a meta input: it checks the device
    elsewhere[-1] = elsewhere[-1].to("meta")
    with pytest.raises(RuntimeError, match="must be on x's device"):
        op.function(*elsewhere)
    path = E.export(name, exporter=E.available_exporters()[0], lowering="custom", opset=18,
                    path=tmp_path / "c.onnx").path
    with pytest.raises(Exception, match="must have X's shape"):
        make_session(path, library=plugin_path).run(None, _feed(op, inputs))


# Mish's shape: a select on x before the exp and another on the same condition after it.
_PROBE_MATH = """
#pragma once
#include "op_math.h"
namespace loop_probe {
template <typename T>
MYOPS_HD void forward(T x, T& y) {
  const T e = row_math::exp(x < T(20) ? x : T(20));
  y = x < T(20) ? x * e / (e + T(2)) : x;
}
template <typename T>
MYOPS_HD void backward(T grad, T x, T& dx) { dx = grad * x; }
}  // namespace loop_probe
"""


def test_the_generated_cpu_loop_vectorises_and_computes_each_exp_once(tmp_path):
    """kernels/elementwise_cpu.h's AVX-512 loop around a function of Mish's shape holds one copy of
    row_math::exp's polynomial (5 fused multiply-adds on 16 lanes): with GCC's jump threading on, it held
    two, and the Mish example ran at 1.58x the copy floor instead of 1.29x."""
    import shutil

    import platform

    if shutil.which("g++") is None or shutil.which("objdump") is None:
        pytest.skip("no g++ or objdump here")
    if platform.machine() != "x86_64":
        pytest.skip(f"the AVX-512 loop is x86-64's; this is {platform.machine()}")
    from opspec import OpSpec
    from opspec.codegen import functors

    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "loop_probe.h").write_text(_PROBE_MATH)
    spec = OpSpec("loop_probe", "LoopProbe", ("X",), kind="elementwise")
    source = tmp_path / "probe.cc"
    # the functors as the generated sources write them, in the loops the adapters call
    source.write_text('#include <array>\n#include "elementwise_cpu.h"\n' + functors(spec) +
                      "void run(const float* x, float* y, long n) {\n"
                      "  const std::array<const float*, 1> in{x};\n  const std::array<float*, 1> out{y};\n"
                      "  elementwise_cpu::map<1, 1>(myops_declared_loop_probe::Forward{}, in, out, n);\n}\n")
    built = subprocess.run(["g++", "-O2", "-std=c++17", f"-I{repo / 'kernels'}", f"-I{tmp_path}", "-c", str(source),
                            "-o", str(tmp_path / "probe.o")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(tmp_path / "probe.o")],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    clone = listing.split("loop_avx512<", 1)[1].split("\n\n", 1)[0]
    assert sum("fmadd" in line and "zmm" in line for line in clone.splitlines()) == 5, clone[-4000:]


@pytest.mark.parametrize("name", ROWWISE)
def test_a_weight_of_another_length_is_refused_with_a_message(ext, plugin_path, tmp_path, name):
    """A rowwise op's weights are [x.shape[-1]], in the extension and in the plugin."""
    from ort_plugin.loader import make_session

    op = OPS[name]
    inputs = list(_inputs(op, (2, 3, 768)))
    short = inputs[:-1] + [inputs[-1][:5]]
    with pytest.raises(RuntimeError, match=rf"{op.weights[-1]} must have shape \[x.shape\[-1\]\] = \[768\]"):
        op.function(*short)
    # the node alone, its weights graph inputs of a symbolic length: what the plugin itself checks
    from onnx import TensorProto, helper

    names = ["x", *op.weights]
    graph = helper.make_graph(
        [helper.make_node(op.spec.onnx_type, names, ["y"], domain="myops")], name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", "c"] if n == "x" else ["c"]) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("myops", 1)])
    model.ir_version = 8
    feed = {n: t.reshape(-1, 768).numpy() if n == "x" else t.numpy() for n, t in zip(names, short)}
    with pytest.raises(Exception, match=r"must have shape \[X.shape\[-1\]\]"):
        make_session(model.SerializeToString(), library=plugin_path).run(None, feed)


def test_the_torch_side_is_read_from_the_declaration_alone():
    """What ops.apply swaps, the native function and the models come from opspec data (Replaces,
    native_when, models): a declared probe's binder reads a real torch.nn.LayerNorm, refuses what the op
    does not compute with the reason, and declarations that name what the op lacks are refused."""
    import inspect

    from opspec import OpSpec, Replaces
    from ops.declaration import Offset, Refused, TorchOp

    def form(op, x, weight, eps):
        return op.Mul(op.Div(x, op.Sqrt(op.Add(op.ReduceMean(op.Pow(x, 2.0)), eps))), weight)

    path = "torch.nn.modules.normalization.LayerNorm"
    probe = OpSpec("norm_probe", "NormProbe", ("X", "weight"), {"eps": 1e-6}, kind="rowwise", decomposed=form,
                   native="F.rms_norm(x, weight.shape, weight, eps)", native_when="eps < 0.5",
                   replaces={path: Replaces(attributes={"eps": "eps"}, none_is_epsilon=("eps",)),
                             "my.Scaled": Replaces(attributes={"eps": 1e-3}, weights={"weight": "scale"},
                                                   offsets={"weight": 1.0})})
    op = TorchOp.declared(probe)
    assert op.native_text == "F.rms_norm(x, weight.shape, weight, eps)"
    assert op.native_applies({"eps": 1e-6}) and not op.native_applies({"eps": 1.0})
    act = TorchOp.declared(OpSpec("act_probe", "ActProbe", ("X",), {"alpha": 1.0}, kind="elementwise",
                                  decomposed=lambda op, x, alpha: op.Mul(x, op.Sigmoid(op.Mul(x, alpha))),
                                  models={"act_ffn": "feed_forward"}, artifact_seeds={"act_ffn": 7}))
    assert act.models == ("act_probe", "act_ffn") and act.artifact_seeds["act_ffn"] == 7
    ffn = act.build_model("act_ffn", hidden=8, function=lambda x, alpha: x * torch.sigmoid(alpha * x))
    assert ffn(torch.ones(2, 8)).shape == (2, 8) and [name for name, _ in ffn.named_children()] == ["up", "down"]
    bind = op.replaces[path]
    weights, attributes = bind(torch.nn.LayerNorm(8, eps=1e-4))
    assert attributes == {"eps": 1e-4} and weights[0].shape == (8,) and isinstance(weights[0], torch.nn.Parameter)
    weights, _ = bind(torch.nn.LayerNorm(8, elementwise_affine=False))  # no weight: ones of its shape
    assert torch.equal(weights[0], torch.ones(8))
    with pytest.raises(Refused, match=r"normalises over the last 2 dimensions \[2, 8\]"):
        bind(torch.nn.LayerNorm((2, 8)))
    with pytest.raises(Refused, match="torch.float64: myops::norm_probe's kernels take float32"):
        bind(torch.nn.LayerNorm(8).double())
    odd = torch.nn.LayerNorm(8)
    odd.eps = "small"
    with pytest.raises(Refused, match=r"its eps \(eps\) is 'small', not a number"):
        bind(odd)
    odd.eps = 0  # an int is a number
    assert bind(odd)[1] == {"eps": 0.0}
    odd.eps = None  # None means float32's epsilon, for a float32 weight
    assert bind(odd)[1] == {"eps": torch.finfo(torch.float32).eps}
    with pytest.raises(Refused, match=r"eps=None follows the input's dtype \(torch.bfloat16 here\)"):
        bind(odd.to(torch.bfloat16))

    scaled = torch.nn.Module()
    scaled.scale = torch.nn.Parameter(torch.zeros(8))
    weights, attributes = op.replaces["my.Scaled"](scaled)
    assert isinstance(weights[0], Offset) and weights[0].offset == 1.0 and attributes == {"eps": 1e-3}
    scaled.scale = torch.nn.Parameter(torch.zeros(8, dtype=torch.float16))
    with pytest.raises(Refused, match="would round a small scale away"):
        op.replaces["my.Scaled"](scaled)

    for wrong, message in ((dict(replaces={path: Replaces(attributes={"epsilon": "eps"})}), r"names \['epsilon'\]"),
                           (dict(replaces={"LayerNorm": Replaces()}), "must map a class's import path"),
                           (dict(models={"norm_mix": "mixer"}), "names forms the lab does not build"),
                           (dict(artifact_seeds={"other": 1}), r"name \['other'\], which are not its models"),
                           (dict(native_when="eps < 1"), "declare that function too"),
                           (dict(replaces={path: Replaces()}), r"does not say where \['eps'\] come from"),
                           (dict(models={"norm_ffn": "feed_forward"}), "holds an op of one input and one output")):
        with pytest.raises(ValueError, match=message):
            OpSpec("norm_probe", "NormProbe", ("X", "weight"), {"eps": 1e-6}, kind="rowwise", decomposed=form, **wrong)
    with pytest.raises(ValueError, match="the ops package has its own 'apply'"):
        OpSpec("apply", "Apply", ("X",), kind="elementwise", decomposed=lambda op, x: op.Neg(x))
    assert str(inspect.signature(op.function)) == "(x, weight, eps=1e-06)"  # help(ops.<name>) shows the schema's
    with pytest.raises(ValueError, match="native_when='eps <' is not a Python expression"):
        TorchOp.declared(OpSpec("norm_probe", "NormProbe", ("X", "weight"), {"eps": 1e-6}, kind="rowwise",
                                decomposed=form, native="F.rms_norm(x, weight.shape, weight, eps)", native_when="eps <"))
