"""myops::rms_norm in ONNX: its schema, the TorchScript symbolic and the dynamo translation for
both lowerings, and the nodes each lowering must produce (ops/export.py checks every file with them).

custom      one myops::RMSNorm node (inputs X, scale; float attribute epsilon), opset import myops:1
decomposed  Pow, ReduceMean, Add, Sqrt, Div, Mul: the pattern ONNX Runtime's default optimisation
            level fuses into com.microsoft::SimplifiedLayerNormalization. A float16 X is cast to
            float first and the result back (the scale too, folded where it is an initializer), so
            that the sums are in float32 as the contract says and the constants meet float tensors. From opset 23, where the
            installed onnxruntime runs it, the standard RMSNormalization node instead (dynamo only:
            the TorchScript exporter stops at opset 20).
"""
from __future__ import annotations

import functools
import importlib
from collections import Counter

import onnx
import torch

from opspec import DOMAIN, DOMAIN_VERSION, OPS

SPEC = OPS["rms_norm"]
ONNX_TYPE = SPEC.onnx_type
TORCH_NAME = f"{DOMAIN}::{SPEC.name}"
DEFAULT_EPSILON = SPEC.attributes["epsilon"]
# ai.onnx RMSNormalization: added in opset 23 (onnx/defs/nn/defs.cc, "RMSNormalization", 23).
FIRST_STANDARD_RMS_NORM_OPSET = 23
DECOMPOSED_NODES = ("Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul")
# Every node type a lowering of this op may produce: what ops.export counts as the op's nodes.
NODE_TYPES = {f"{DOMAIN}::{ONNX_TYPE}", "RMSNormalization", "Cast", *DECOMPOSED_NODES}
# Its lowerings handle a float16 X (ops.export refuses float16 for an op without this).
EXPORTS_FLOAT16 = True
# TorchScript's scalar type names of the narrow float types X may have, and their ONNX element types.
NARROW_TYPES = {"Half": onnx.TensorProto.FLOAT16, "BFloat16": onnx.TensorProto.BFLOAT16}


@functools.lru_cache(maxsize=None)
def ort_runs_standard(opset: int) -> bool:
    """Whether the installed onnxruntime loads and runs ai.onnx RMSNormalization at `opset`."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if opset < FIRST_STANDARD_RMS_NORM_OPSET:
        return False
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=DEFAULT_EPSILON)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                                helper.make_tensor_value_info("scale", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session.run(None, {"x": np.ones((2, 4), np.float32), "scale": np.ones(4, np.float32)})
    except Exception:  # onnxruntime's own exception types; a failure is the answer
        return False
    return True


def uses_standard(opset: int, exporter: str = "dynamo") -> bool:
    return exporter == "dynamo" and ort_runs_standard(opset)


def register_schema() -> None:
    """Teach onnx (checker, onnxscript) the op: X and scale of one float type, Y like X, epsilon."""
    if onnx.defs.has(ONNX_TYPE, DOMAIN):
        return
    importlib.import_module("onnx.reference")  # index the standard schemas first (see ops/export.py)
    from onnx.defs import OpSchema

    schema = OpSchema(
        ONNX_TYPE, DOMAIN, DOMAIN_VERSION,
        doc="Y = X * rsqrt(mean(X^2, axis=-1) + epsilon) * scale, accumulated in float32",
        inputs=[OpSchema.FormalParameter("X", "T"), OpSchema.FormalParameter("scale", "T")],
        outputs=[OpSchema.FormalParameter("Y", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "floating tensors")],
        attributes=[OpSchema.Attribute("epsilon", onnx.helper.make_attribute("epsilon", DEFAULT_EPSILON),
                                       "added to the mean square before the square root")],
    )
    onnx.defs.register_schema(schema)


def expected_nodes(lowering: str, opset: int, exporter: str, attributes: dict | None = None,
                   dtype: str = "float32") -> Counter:
    if lowering == "custom":
        return Counter({f"{DOMAIN}::{ONNX_TYPE}": 1})
    if uses_standard(opset, exporter):
        return Counter({"RMSNormalization": 1})
    # float16: X cast in and Y cast out; the scale's Cast meets an initializer, which the exporter's
    # optimiser folds (the scale is then stored as float32).
    return Counter({name: 1 for name in DECOMPOSED_NODES}) + (Counter({"Cast": 2}) if dtype != "float32" else Counter())


def torchscript_symbolic(lowering: str):
    from torch.onnx import symbolic_helper

    @symbolic_helper.parse_args("v", "v", "f")
    def custom(g, x, weight, eps):
        y = g.op(f"{DOMAIN}::{ONNX_TYPE}", x, weight, epsilon_f=eps)
        y.setType(x.type())
        return y

    @symbolic_helper.parse_args("v", "v", "f")
    def decomposed(g, x, weight, eps):
        def constant(value, dtype=torch.float32):
            return g.op("Constant", value_t=torch.tensor(value, dtype=dtype))

        stored = x.type().scalarType() if x.type().kind() == "TensorType" else None
        narrow = stored not in (None, "Float")  # float16: sum in float32, as the contract says
        x32 = g.op("Cast", x, to_i=onnx.TensorProto.FLOAT) if narrow else x
        squares = g.op("Pow", x32, constant(2.0))
        if g.opset >= 18:  # ReduceMean's axes became an input in opset 18
            mean = g.op("ReduceMean", squares, constant([-1], torch.int64), keepdims_i=1)
        else:
            mean = g.op("ReduceMean", squares, axes_i=[-1], keepdims_i=1)
        root = g.op("Sqrt", g.op("Add", mean, constant(eps)))
        if narrow:
            scaled = g.op("Mul", g.op("Div", x32, root), g.op("Cast", weight, to_i=onnx.TensorProto.FLOAT))
            y = g.op("Cast", scaled, to_i=NARROW_TYPES[stored])
        else:
            y = g.op("Mul", g.op("Div", x, root), weight)
        y.setType(x.type())
        return y

    return custom if lowering == "custom" else decomposed


def dynamo_translation(lowering: str, opset: int):
    import onnxscript

    if lowering == "custom":
        register_schema()
        myops = onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)

        def custom(x, weight, eps: float = DEFAULT_EPSILON):
            return myops.RMSNorm(x, weight, epsilon=eps)

        return custom

    if uses_standard(opset, "dynamo"):
        standard = onnxscript.values.Opset("", opset)

        def standard_rms_norm(x, weight, eps: float = DEFAULT_EPSILON):
            return standard.RMSNormalization(x, weight, axis=-1, epsilon=eps)

        return standard_rms_norm

    from onnxscript import opset18 as op

    def decomposed(x, weight, eps: float = DEFAULT_EPSILON):
        # The exporter's values carry their element type (onnx_ir DataType, an int enum); float16
        # sums in float32, as the contract says: cast in, compute, cast back.
        stored = getattr(x, "dtype", None)
        narrow = stored is not None and int(stored) != onnx.TensorProto.FLOAT
        x32 = op.Cast(x, to=onnx.TensorProto.FLOAT) if narrow else x
        mean = op.ReduceMean(op.Pow(x32, op.Constant(value_float=2.0)), op.Constant(value_ints=[-1]), keepdims=1)
        root = op.Sqrt(op.Add(mean, op.Constant(value_float=eps)))
        if narrow:
            return op.Cast(op.Mul(op.Div(x32, root), op.Cast(weight, to=onnx.TensorProto.FLOAT)), to=int(stored))
        return op.Mul(op.Div(x, root), weight)

    return decomposed


# Defaults of the fused nodes ops.fuse reads: ORT's SimplifiedLayerNormalization (epsilon 1e-5, axis -1:
# onnxruntime/core/graph/contrib_ops/contrib_defs.cc) and ai.onnx RMSNormalization (the same, opset 23).
FUSED_NODE_DEFAULTS = {"epsilon": 1e-5, "axis": -1, "stash_type": 1}


def fuse_rules(report) -> list:
    """ops.fuse's onnxscript rules: every form of RMSNorm that exporters and ORT write -> one myops::RMSNorm.
    x / Sqrt(ReduceMean(x^2) + eps) * w (this file's decomposed lowering), x * Reciprocal(Sqrt(...)) * w
    (torch.rsqrt as both exporters write it: Hugging Face's LlamaRMSNorm), x*x in place of Pow(x, 2), and
    the fused nodes of an optimised file: ORT's SimplifiedLayerNormalization (in the default domain, as ORT
    writes it) and ai.onnx RMSNormalization.
    Only a mean over the last axis with a constant epsilon and one scale per channel is this op."""
    from onnxscript.rewriter import pattern

    from .fuse import float_input, scalar, where

    pending = {}  # the matched node's epsilon, from check to rewrite (called in turn for each match)

    def squares(op, x, two):
        return pattern.OrValue([op.Pow(x, two), op.Mul(x, x)])

    def root(op, x, two, eps):
        mean = op.ReduceMean(squares(op, x, two), _allow_other_inputs=True, _allow_other_attributes=True,
                             _outputs=["mean"])
        return op.Sqrt(op.Add(mean, eps))

    def divided(op, x, two, eps, scale):
        return op.Mul(op.Div(x, root(op, x, two, eps)), scale)

    def reciprocal(op, x, two, eps, scale):
        return op.Mul(op.Mul(x, op.Reciprocal(root(op, x, two, eps))), scale)

    def refuse(form: str, value, reason: str):
        report.refuse(SPEC.name, form, where(value), reason)
        return pattern.MatchResult().fail(reason)

    def last_axis(axes, rank) -> bool:
        return len(axes) == 1 and (axes[0] == -1 or (rank is not None and axes[0] == rank - 1))

    def rank(x):
        return len(x.shape) if x.shape is not None else None

    def shape_of(value):
        return None if value.shape is None else [str(d) for d in value.shape]

    def per_channel(x, scale) -> bool:
        """scale is [C] where x is [..., C] (C unknown on either side: the proof decides)."""
        if scale.shape is None or len(scale.shape) != 1:
            return False
        channels = x.shape[-1] if x.shape is not None and len(x.shape) else None
        return not (isinstance(channels, int) and isinstance(scale.shape[0], int) and channels != scale.shape[0])

    def decomposed_check(form: str):
        def check(context, x, two, eps, scale, mean, **_):
            if not float_input(report, SPEC.name, form, x):
                return False
            if two is not None and scalar(two) != 2.0:
                return pattern.MatchResult().fail("not a square")
            mean_node = mean.producer()
            axes_input = mean_node.inputs[1] if len(mean_node.inputs) > 1 else None
            axes = (axes_input.const_value.numpy().tolist() if axes_input is not None and axes_input.const_value is not None
                    else list(mean_node.attributes["axes"].as_ints()) if "axes" in mean_node.attributes else None)
            if axes is None or not last_axis(axes, rank(x)):
                return refuse(form, mean, f"the mean is over axes {axes}, not the last one")
            if mean_node.attributes.get("keepdims") is not None and mean_node.attributes["keepdims"].as_int() != 1:
                return refuse(form, mean, "the mean drops its axis (keepdims 0)")
            epsilon = scalar(eps)
            if epsilon is None:
                return refuse(form, eps, f"epsilon ({eps.name}) is not a one-element constant")
            if not per_channel(x, scale):
                return refuse(form, scale, f"the scale ({scale.name}) is not one value per channel of x (shapes "
                                           f"{shape_of(scale)} and {shape_of(x)})")
            pending["epsilon"] = epsilon
            return True
        return check

    def rms_norm(op, x, scale, form: str):
        report.replace(SPEC.name, form)
        return op.RMSNorm(x, scale, epsilon=float(pending.pop("epsilon")), _domain=DOMAIN)

    def fused_check(form: str):
        def check(context, x, scale, **_):
            node = context.root
            attributes = {k: node.attributes[k].value if k in node.attributes else v
                          for k, v in FUSED_NODE_DEFAULTS.items()}
            if not float_input(report, SPEC.name, form, x):
                return False
            if x.dtype is not None and scale.dtype is not None and x.dtype != scale.dtype:
                return refuse(form, node.outputs[0], f"x is {x.dtype.name} and its scale {scale.dtype.name}; "
                                                     f"{DOMAIN}::{ONNX_TYPE} takes one type for both")
            if not per_channel(x, scale):
                return refuse(form, node.outputs[0], f"the scale is not one value per channel of x (shapes "
                                                     f"{shape_of(scale)} and {shape_of(x)})")
            if not last_axis([attributes["axis"]], rank(x)):
                return refuse(form, node.outputs[0], f"normalised over axis {attributes['axis']}, not the last one")
            if attributes["stash_type"] != 1:
                return refuse(form, node.outputs[0], "stash_type is not float (the op accumulates in float32)")
            if any(out.uses() for out in node.outputs[1:]):
                return refuse(form, node.outputs[0], "its mean or inverse-std output is used")
            pending["epsilon"] = float(attributes["epsilon"])
            return True
        return check

    def simplified(op, x, scale):
        return op.SimplifiedLayerNormalization(x, scale, _allow_other_attributes=True)

    def standard(op, x, scale):
        return op.RMSNormalization(x, scale, _allow_other_attributes=True)

    forms = {"x/Sqrt(mean(x^2)+eps)*w": divided, "x*Reciprocal(Sqrt(mean(x^2)+eps))*w": reciprocal}
    found = [pattern.RewriteRule(target, lambda op, x, scale, form=form, **_: rms_norm(op, x, scale, form),
                                 decomposed_check(form), name=f"rms-norm {form}") for form, target in forms.items()]
    for form, target in {"SimplifiedLayerNormalization": simplified, "ai.onnx RMSNormalization": standard}.items():
        found.append(pattern.RewriteRule(target, lambda op, x, scale, form=form, **_: rms_norm(op, x, scale, form),
                                         fused_check(form), name=f"rms-norm {form}"))
    return found
