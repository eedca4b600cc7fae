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
