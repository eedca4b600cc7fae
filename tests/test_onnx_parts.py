"""An op's declared decomposed form as every world reads it (opspec/_forms.py, ops/onnx_parts.py), for
forms the lab's own ops do not use: a layer norm of two reductions and two weights, and a two-input
elementwise op with a clamp. Its torch reference, the node counts an export must hold, and the fuse
rules (both spellings of Div and of Pow 2, operands in either order, the refusals) are checked here
against torch's own arithmetic and graphs built by hand; Swish's and RMSNorm's forms run through both
exporters and ORT in test_alignment_onnx.py and test_fuse.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from opspec import FormError, FusedNode, OpSpec, forms


def layer_norm_form(op, x, weight, bias, epsilon):
    centred = op.Sub(x, op.ReduceMean(x))
    return op.Add(op.Mul(op.Div(centred, op.Sqrt(op.Add(op.ReduceMean(op.Pow(centred, 2.0)), epsilon))), weight), bias)


def clamped_form(op, x, gate, limit):
    return op.Mul(op.Min(op.Max(x, op.Neg(limit)), limit), op.Sigmoid(gate))


NORM = OpSpec("layer_norm_probe", "LayerNormProbe", ("X", "weight", "bias"), {"epsilon": 1e-5}, kind="rowwise",
              torch_attributes={"epsilon": "eps"}, decomposed=layer_norm_form,
              fused_nodes=(FusedNode("LayerNormalization", attributes={"epsilon": "epsilon"},
                                     defaults={"epsilon": 1e-5, "axis": -1, "stash_type": 1},
                                     requires={"axis": -1, "stash_type": 1}),))
CLAMPED = OpSpec("clamped_gate", "ClampedGate", ("X", "gate"), {"limit": 3.0}, kind="elementwise", full_inputs=2,
                 decomposed=clamped_form)


def test_a_form_the_emitters_cannot_read_is_refused_with_what_to_do():
    with pytest.raises(FormError, match=r"'bad'.*op\.Gelu: a decomposed form may use .*Sigmoid"):
        OpSpec("bad", "Bad", ("X",), kind="elementwise", decomposed=lambda op, x: op.Gelu(x))
    with pytest.raises(FormError, match=r"called as decomposed\(op, x, beta\)"):
        OpSpec("bad", "Bad", ("X",), {"beta": 1.0}, kind="elementwise", decomposed=lambda op, x: op.Sigmoid(x))
    with pytest.raises(FormError, match=r"only a rowwise op does: declare kind='rowwise'"):
        OpSpec("bad", "Bad", ("X",), kind="elementwise", decomposed=lambda op, x: op.Sub(x, op.ReduceMax(x)))
    with pytest.raises(FormError, match=r"returns 1 value\(s\).*the op has 2 output\(s\)"):
        OpSpec("bad", "Bad", ("X",), kind="elementwise", outputs=("Y", "Z"), decomposed=lambda op, x: op.Exp(x))
    with pytest.raises(FormError, match=r"op\.Mul takes 2 arguments, got 1"):
        OpSpec("bad", "Bad", ("X",), kind="elementwise", decomposed=lambda op, x: op.Mul(x))
    with pytest.raises(FormError, match=r"named \['context'\] would meet the fuse rules' own names"):
        OpSpec("bad", "Bad", ("X", "context"), kind="elementwise", full_inputs=2,
               decomposed=lambda op, x, context: op.Mul(x, context))
    with pytest.raises(ValueError, match=r"requires \['axis'\] without a default"):
        FusedNode("LayerNormalization", requires={"axis": -1})


def test_formulas_fold_identities_and_constants():
    assert NORM.formula == "(x-mean(x))/Sqrt(mean((x-mean(x))^2)+epsilon)*weight+bias"
    assert CLAMPED.formula == "Min(Max(x, Neg(limit)), limit)*Sigmoid(gate)"
    swish = OpSpec("s", "S", ("X",), {"beta": 1.0}, kind="elementwise",
                   decomposed=lambda op, x, beta: op.Mul(x, op.Sigmoid(op.Mul(op.Mul(2.0, 0.5), op.Mul(x, beta)))))
    from ops.onnx_parts import DeclaredOnnx

    parts = DeclaredOnnx(swish)
    # 2*0.5 folds to 1 and x*1 to x: at beta 1 the form is x*Sigmoid(x), two nodes
    assert parts.expected_nodes("decomposed", 18, "dynamo", {"beta": 1.0}) == {"Mul": 1, "Sigmoid": 1}
    assert parts.expected_nodes("decomposed", 18, "dynamo", {"beta": 1.5}) == {"Mul": 2, "Sigmoid": 1}
    assert parts.expected_nodes("decomposed", 18, "dynamo", {"beta": 1.5}, dtype="float16")["Cast"] == 2
    assert parts.expected_nodes("custom", 18, "dynamo") == {"myops::S": 1}
    # every node type a lowering may write, also one that folds away at the attributes' defaults
    assert "Neg" in DeclaredOnnx(CLAMPED).NODE_TYPES and "Neg" not in DeclaredOnnx(CLAMPED).expected_nodes(
        "decomposed", 18, "dynamo")
    # attributes by ONNX or torch name: epsilon 0 leaves no Add
    norm = DeclaredOnnx(NORM)
    assert norm.expected_nodes("decomposed", 18, "dynamo", {"eps": 0.0})["Add"] == 1  # the bias's
    assert norm.expected_nodes("decomposed", 18, "dynamo", {"epsilon": 0.5})["Add"] == 2
    # constants fold as ONNX computes them, never raising where a graph would run
    assert math.isnan(forms.UNARY["Sqrt"](-1.0)) and forms.BINARY["Div"](1.0, 0.0) == math.inf
    assert forms.UNARY["Log"](0.0) == -math.inf and math.isnan(forms.BINARY["Pow"](-8.0, 0.5))


def test_the_reference_is_the_form_in_torch_computed_in_float32_or_wider():
    from ops.onnx_parts import torch_reference

    torch.manual_seed(0)
    x, weight, bias = torch.randn(4, 6, 32), torch.rand(32) + 0.5, torch.randn(32)
    want = torch.nn.functional.layer_norm(x, (32,), weight, bias, 1e-3)
    reference = torch_reference(NORM)
    torch.testing.assert_close(reference(x, weight, bias, 1e-3), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(reference(x, weight, bias, eps=1e-3), want, rtol=1e-5, atol=1e-5)
    assert reference(x.double(), weight.double(), bias.double()).dtype == torch.float64
    half = reference(x.half(), weight.half(), bias.half(), 1e-3)
    assert half.dtype == torch.float16  # summed in float32, rounded once
    torch.testing.assert_close(half, reference(x.half().float(), weight.half().float(), bias.half().float(), 1e-3).half())
    gate = torch.randn(4, 6, 32)
    clamped = torch_reference(CLAMPED)
    torch.testing.assert_close(clamped(x * 4, gate, 2.0), torch.clamp(x * 4, -2.0, 2.0) * torch.sigmoid(gate))
    assert "Min(Max(x, Neg(limit)), limit)" in clamped.__doc__


def _model(nodes, initializers, inputs):
    graph = helper.make_graph(nodes, "form", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, inputs[0][1])],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def _fused(spec, model):
    """The model after the op's rules, as (node types, the fused node's attributes, the report)."""
    import onnx_ir as ir

    from ops.fuse import FuseReport, apply_rules
    from ops.onnx_parts import DeclaredOnnx

    report = FuseReport()
    graph = ir.from_proto(model)
    apply_rules(graph, DeclaredOnnx(spec).fuse_rules(report))
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    RemoveUnusedNodesPass()(graph)
    fused = [n for n in graph.graph if n.domain == "myops"]
    attributes = {k: v.value for k, v in fused[0].attributes.items()} if fused else {}
    return [n.op_type for n in graph.graph], attributes, report


def _form_graph(spec, attributes, weights=None):
    emitter = forms.OnnxNodes()
    names = [n.lower() for n in spec.inputs]
    weights = weights or [32] * (len(names) - spec.full_inputs)
    emitter.initializers += [helper.make_tensor(n, TensorProto.FLOAT, [c], np.linspace(0.5, 1.5, c))
                             for n, c in zip(names[spec.full_inputs:], weights)]
    spec.decomposed(emitter, *names, *attributes)
    full = [(n, ["batch", 32]) for n in names[:spec.full_inputs]]
    return _model(emitter.nodes, emitter.initializers, full)


def test_the_form_as_written_by_hand_becomes_one_node_with_its_attributes():
    types, attributes, report = _fused(NORM, _form_graph(NORM, [0.125]))
    assert types == ["LayerNormProbe"] and attributes == {"epsilon": pytest.approx(0.125)}
    assert report.replaced == {("layer_norm_probe", "(x-mean(x))/Sqrt(mean((x-mean(x))^2)+epsilon)*weight+bias"): 1}
    types, attributes, report = _fused(CLAMPED, _form_graph(CLAMPED, [2.5]))
    assert types == ["ClampedGate"] and attributes == {"limit": pytest.approx(2.5)}
    # Neg(limit) is a constant in the file, checked against the limit read from Min: -1 is not -2.5
    model = _form_graph(CLAMPED, [2.5])
    lower = next(t for t in model.graph.initializer if numpy_helper.to_array(t).tolist() == -2.5)
    lower.CopyFrom(helper.make_tensor(lower.name, TensorProto.FLOAT, [], [-1.0]))
    assert "ClampedGate" not in _fused(CLAMPED, model)[0]
    # an attribute at a value that folds its node away, as every lowering writes it: epsilon 0, no Add
    types, attributes, report = _fused(NORM, _form_graph(NORM, [0.0]))
    assert types == ["LayerNormProbe"] and attributes == {"epsilon": 0.0}
    assert list(report.replaced) == [("layer_norm_probe", "(x-mean(x))/Sqrt(mean((x-mean(x))^2))*weight+bias")]


def test_the_report_names_the_spelling_that_was_matched():
    """A Div of attributes is a constant in the file, with one spelling; the report's choices skip it."""
    drift = OpSpec("drift_probe", "DriftProbe", ("X", "gate"), {"limit": 2.0}, kind="elementwise", full_inputs=2,
                   decomposed=lambda op, x, gate, limit: op.Mul(op.Min(op.Max(x, op.Div(-1.0, limit)), limit),
                                                                op.Div(x, gate)))
    const = helper.make_tensor
    nodes = [helper.make_node("Max", ["x", "low"], ["c"]), helper.make_node("Min", ["c", "high"], ["m"]),
             helper.make_node("Reciprocal", ["gate"], ["r"]), helper.make_node("Mul", ["x", "r"], ["q"]),
             helper.make_node("Mul", ["m", "q"], ["y"])]
    types, attributes, report = _fused(drift, _model(nodes, [const("low", TensorProto.FLOAT, [], [-0.25]),
                                                             const("high", TensorProto.FLOAT, [], [4.0])],
                                                     [("x", ["batch", 32]), ("gate", ["batch", 32])]))
    assert types == ["DriftProbe"] and attributes == {"limit": pytest.approx(4.0)}
    assert list(report.replaced) == [("drift_probe", "Min(Max(x, -1/limit), limit)*x*Reciprocal(gate)")]


def test_the_other_spellings_and_operand_orders_are_the_form_too():
    """Mul by Reciprocal for Div, centred*centred for Pow 2, the weight first in its Mul: as exporters write them."""
    const = helper.make_tensor
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1), helper.make_node("Sub", ["x", "m"], ["c"]),
             helper.make_node("Mul", ["c", "c"], ["sq"]), helper.make_node("ReduceMean", ["sq", "axes"], ["v"]),
             helper.make_node("Add", ["eps", "v"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["r"]),
             helper.make_node("Reciprocal", ["r"], ["inv"]), helper.make_node("Mul", ["c", "inv"], ["n"]),
             helper.make_node("Mul", ["weight", "n"], ["s"]), helper.make_node("Add", ["s", "bias"], ["y"])]
    weights = [const("weight", TensorProto.FLOAT, [32], np.ones(32)), const("bias", TensorProto.FLOAT, [32], np.zeros(32)),
               const("axes", TensorProto.INT64, [1], [-1]), const("eps", TensorProto.FLOAT, [], [1e-6])]
    types, attributes, report = _fused(NORM, _model(nodes, weights, [("x", ["batch", 32])]))
    assert types == ["LayerNormProbe"] and attributes == {"epsilon": pytest.approx(1e-6)}
    assert list(report.replaced) == [("layer_norm_probe", "(x-mean(x))*Reciprocal(Sqrt(mean((x-mean(x))*(x-mean(x)))"
                                                          "+epsilon))*weight+bias")]


def test_what_is_not_the_op_is_refused_with_the_reason_or_left_alone():
    # an epsilon known only at run time
    model = _form_graph(NORM, ["eps"])
    model.graph.input.append(helper.make_tensor_value_info("eps", TensorProto.FLOAT, []))
    types, _, report = _fused(NORM, model)
    assert "LayerNormProbe" not in types
    assert any("epsilon (eps) is not a one-element constant" in reason for reason in report.refused.values())
    # a mean over the first axis
    model = _form_graph(NORM, [1e-5])
    for tensor in model.graph.initializer:
        if tensor.data_type == TensorProto.INT64:
            tensor.CopyFrom(helper.make_tensor(tensor.name, TensorProto.INT64, [1], [0]))
    types, _, report = _fused(NORM, model)
    assert "LayerNormProbe" not in types
    assert any("over axes [0], not the last one" in reason for reason in report.refused.values())
    # a weight of another length than the rows
    types, _, report = _fused(NORM, _form_graph(NORM, [1e-5], weights=(8, 32)))
    assert "LayerNormProbe" not in types
    assert any("the weight (weight) is not one value per channel of x" in r for r in report.refused.values())
    # a constant that is not the form's: Pow 3 is not a square
    model = _form_graph(NORM, [1e-5])
    pow_node = next(n for n in model.graph.node if n.op_type == "Pow")
    exponent = next(t for t in model.graph.initializer if t.name == pow_node.input[1])
    exponent.CopyFrom(helper.make_tensor(exponent.name, TensorProto.FLOAT, [], [3.0]))
    assert "LayerNormProbe" not in _fused(NORM, model)[0]


def test_a_fused_node_becomes_the_op_where_its_attributes_say_it_is():
    const = helper.make_tensor
    weights = [const("weight", TensorProto.FLOAT, [32], np.ones(32)), const("bias", TensorProto.FLOAT, [32], np.zeros(32))]
    plain = _model([helper.make_node("LayerNormalization", ["x", "weight", "bias"], ["y"], epsilon=0.01)], weights,
                   [("x", ["batch", 32])])
    types, attributes, report = _fused(NORM, plain)
    assert types == ["LayerNormProbe"] and attributes == {"epsilon": pytest.approx(0.01)}
    # the axis counted from the front is the last one where the rank is known
    types, _, _ = _fused(NORM, _model([helper.make_node("LayerNormalization", ["x", "weight", "bias"], ["y"], axis=1)],
                                      weights, [("x", ["batch", 32])]))
    assert types == ["LayerNormProbe"]
    types, _, report = _fused(NORM, _model([helper.make_node("LayerNormalization", ["x", "weight", "bias"], ["y"],
                                                             axis=0)], weights, [("x", ["batch", 32])]))
    assert types == ["LayerNormalization"]
    assert any("its axis is 0, not -1" in reason for reason in report.refused.values())


TAILED = OpSpec("tailed", "Tailed", ("X", "w"), {"shift": 0.5}, kind="rowwise",
                decomposed=lambda op, x, w, shift: op.Add(op.Mul(op.Sub(x, op.ReduceMean(x)), w), shift))
SOFTMAX = OpSpec("bias_softmax_probe", "BiasSoftmaxProbe", ("X", "bias"), kind="rowwise",
                 decomposed=lambda op, x, bias: op.Softmax(op.Add(x, bias)))


def test_a_form_ending_in_an_attribute_s_node_becomes_one_node():
    """Without its Add (shift at 0, the identity) the form is part of the whole one, matched at an inner node:
    whole forms are tried first (ops.fuse.apply_rules), so the Add does not stay beside the fused node."""
    for shift in (0.5, 0.0):
        types, attributes, _ = _fused(TAILED, _form_graph(TAILED, [shift]))
        assert types == ["Tailed"] and attributes == {"shift": pytest.approx(shift)}


def test_softmax_is_a_row_op_of_the_forms():
    """torch.softmax over the last axis in the reference, Softmax(axis=-1) in the graphs; the fuse rule takes
    the last axis only, and only a rowwise op may use it."""
    from ops.onnx_parts import torch_reference

    x, bias = torch.randn(3, 5, 32) * 8, torch.randn(32)
    torch.testing.assert_close(torch_reference(SOFTMAX)(x, bias), torch.softmax(x + bias, -1))
    assert SOFTMAX.formula == "Softmax(x+bias)"
    types, _, _ = _fused(SOFTMAX, _form_graph(SOFTMAX, []))
    assert types == ["BiasSoftmaxProbe"]
    model = _form_graph(SOFTMAX, [])
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    del softmax.attribute[:]
    softmax.attribute.append(helper.make_attribute("axis", 0))
    types, _, report = _fused(SOFTMAX, model)
    assert "BiasSoftmaxProbe" not in types and "the Softmax is over axes [0], not the last one" in "".join(report.lines())
    with pytest.raises(FormError, match="only a rowwise op does"):
        OpSpec("bad", "Bad", ("X",), kind="elementwise", decomposed=lambda op, x: op.Softmax(x))


def test_an_attribute_the_form_does_not_use_is_refused():
    """The reference would ignore it and no fuse rule could read it off a file."""
    with pytest.raises(FormError, match=r"does not use the attribute\(s\) eps: .*use them in the form"):
        OpSpec("bad", "Bad", ("X",), {"eps": 1e-5, "beta": 1.0}, kind="elementwise",
               decomposed=lambda op, x, eps, beta: op.Mul(x, op.Sigmoid(op.Mul(x, beta))))
