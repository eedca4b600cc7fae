"""myops::swish in ONNX: its schema, the TorchScript symbolic and the dynamo translation for both
lowerings, and the nodes each lowering must produce (ops/export.py checks every file with them).

custom      one myops::Swish node (float attribute beta), opset import myops:1
decomposed  standard ops only: Mul(x, Sigmoid(beta*x)), or ONNX Swish where the opset has it
            (>= 24) and the installed onnxruntime runs it (dynamo only: TorchScript stops at 20).
"""
from __future__ import annotations

import importlib
from collections import Counter

import onnx
import torch

from opspec import DOMAIN, DOMAIN_VERSION, OPS

SPEC = OPS["swish"]
ONNX_TYPE = SPEC.onnx_type
# ai.onnx Swish: added in opset 24 (onnx/defs/math/defs.cc, "Swish", 24).
FIRST_STANDARD_SWISH_OPSET = 24
DECOMPOSED_NODES = ("Sigmoid", "Mul")
# Every node type a lowering of this op may produce: what ops.export counts as the op's nodes.
NODE_TYPES = {f"{DOMAIN}::{ONNX_TYPE}", "Swish", "HardSwish", "QuickGelu", *DECOMPOSED_NODES}


def uses_standard(opset: int, exporter: str = "dynamo") -> bool:
    from .export import ort_runs

    return exporter == "dynamo" and opset >= FIRST_STANDARD_SWISH_OPSET and ort_runs(opset, "Swish", alpha=1.0)


def register_schema() -> None:
    """Teach onnx (checker, onnxscript) the op: one float tensor in, same shape out, attribute beta."""
    if onnx.defs.has(ONNX_TYPE, DOMAIN):
        return
    # NOTE: onnx.reference indexes all schemas by bare name when first imported and refuses two
    # "Swish" (ai.onnx:24 and ours); onnxscript's optimizer imports it, so index before we register.
    importlib.import_module("onnx.reference")
    from onnx.defs import OpSchema

    schema = OpSchema(
        ONNX_TYPE, DOMAIN, DOMAIN_VERSION,
        doc="Y = X * sigmoid(beta * X)",
        inputs=[OpSchema.FormalParameter("X", "T")],
        outputs=[OpSchema.FormalParameter("Y", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "floating tensors")],
        attributes=[OpSchema.Attribute("beta", onnx.helper.make_attribute("beta", 1.0), "coefficient of x in the sigmoid")],
    )
    onnx.defs.register_schema(schema)


def expected_nodes(lowering: str, opset: int, exporter: str, attributes: dict, dtype: str = "float32") -> Counter:
    if lowering == "custom":
        return Counter({f"{DOMAIN}::{ONNX_TYPE}": 1})
    if uses_standard(opset, exporter):
        return Counter({"Swish": 1})
    return Counter({"Sigmoid": 1, "Mul": 1 if attributes["beta"] == 1.0 else 2})


def torchscript_symbolic(lowering: str):
    from torch.onnx import symbolic_helper

    @symbolic_helper.parse_args("v", "f")
    def custom(g, x, beta):
        y = g.op(f"{DOMAIN}::{ONNX_TYPE}", x, beta_f=beta)
        y.setType(x.type())  # output has x's type and shape: no "shape inference missing" warning
        return y

    @symbolic_helper.parse_args("v", "f")
    def decomposed(g, x, beta):
        z = x if beta == 1.0 else g.op("Mul", x, g.op("Constant", value_t=torch.tensor(beta, dtype=torch.float32)))
        y = g.op("Mul", x, g.op("Sigmoid", z))
        y.setType(x.type())
        return y

    return custom if lowering == "custom" else decomposed


def dynamo_translation(lowering: str, opset: int):
    import onnxscript

    if lowering == "custom":
        register_schema()
        myops = onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)

        def custom(x, beta: float = 1.0):
            return myops.Swish(x, beta=beta)

        return custom

    if uses_standard(opset, "dynamo"):
        standard = onnxscript.values.Opset("", opset)

        def standard_swish(x, beta: float = 1.0):
            return standard.Swish(x, alpha=beta)

        return standard_swish

    from onnxscript import opset18 as op

    def decomposed(x, beta: float = 1.0):
        z = x if beta == 1.0 else op.Mul(x, op.Constant(value_float=beta))
        return op.Mul(x, op.Sigmoid(z))

    return decomposed


def fuse_rules(report) -> list:
    """ops.fuse's onnxscript rules: every form of Swish that exporters and ORT write -> one myops::Swish.
    x*Sigmoid(x) (both exporters, F.silu), x*Sigmoid(c*x) with a constant c (this file's decomposed
    lowering, QuickGELU), ai.onnx Swish (opset 24) and ORT's com.microsoft QuickGelu (its fusion of both
    in an optimised file). Mul's operand order is covered by ops.fuse's commute."""
    from onnxscript.rewriter import pattern

    from .fuse import float_input, scalar, where

    def swish(op, x, beta: float, form: str):
        report.replace(SPEC.name, form)
        return op.Swish(x, beta=float(beta), _domain=DOMAIN)

    def plain(op, x):
        return op.Mul(x, op.Sigmoid(x))

    def scaled(op, x, c):
        return op.Mul(x, op.Sigmoid(op.Mul(x, c)))

    def plain_float(context, x, **_):
        return float_input(report, SPEC.name, "x*Sigmoid(x)", x)

    def scaled_constant(context, x, c, **_):
        if not float_input(report, SPEC.name, "x*Sigmoid(c*x)", x):
            return False
        if scalar(c) is None:
            report.refuse(SPEC.name, "x*Sigmoid(c*x)", where(c), f"c ({c.name}) is not a one-element constant, so "
                          "it is not a beta known before run time")
            return pattern.MatchResult().fail("beta is not a constant")
        return True

    def standard(op, x, alpha):
        return op.Swish(x, alpha=alpha)

    def standard_default(op, x):
        return op.Swish(x, _allow_other_attributes=False)

    def quick_gelu(op, x, alpha):
        return op.QuickGelu(x, alpha=alpha, _domain="com.microsoft")

    def quick_gelu_default(op, x):
        return op.QuickGelu(x, _domain="com.microsoft", _allow_other_attributes=False)

    return [
        pattern.RewriteRule(plain, lambda op, x: swish(op, x, 1.0, "x*Sigmoid(x)"), plain_float,
                            name="swish-plain"),
        pattern.RewriteRule(scaled, lambda op, x, c: swish(op, x, scalar(c), "x*Sigmoid(c*x)"), scaled_constant,
                            name="swish-scaled"),
        pattern.RewriteRule(standard, lambda op, x, alpha: swish(op, x, alpha.as_float(), "ai.onnx Swish"),
                            name="swish-standard"),
        # ai.onnx Swish's alpha defaults to 1.0 (onnx/defs/math/defs.cc, Swish-24)
        pattern.RewriteRule(standard_default, lambda op, x: swish(op, x, 1.0, "ai.onnx Swish"),
                            name="swish-standard-default"),
        pattern.RewriteRule(quick_gelu, lambda op, x, alpha: swish(op, x, alpha.as_float(), "com.microsoft QuickGelu"),
                            name="swish-quick-gelu"),
        # QuickGelu's alpha defaults to 1.702 (onnxruntime/core/graph/contrib_ops/contrib_defs.cc, QuickGelu)
        pattern.RewriteRule(quick_gelu_default, lambda op, x: swish(op, x, 1.702, "com.microsoft QuickGelu"),
                            name="swish-quick-gelu-default"),
    ]
