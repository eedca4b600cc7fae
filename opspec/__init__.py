"""The myops ops as ONNX sees them: one declaration per op, with no torch and no onnx.

Both sides read it: the training side (ops/) for names and defaults, the inference side (ort_plugin/,
which the infer image ships without torch) for the inputs a probe must feed. An op's torch parts
live in ops/<name>.py, its ONNX lowerings in ops/export.py (swish) or ops/<name>_onnx.py, its
kernels in kernels/ and ort_plugin/src/{cpu,cuda}/<name>_op.cc.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DOMAIN = "myops"
DOMAIN_VERSION = 1


@dataclass(frozen=True)
class OpSpec:
    name: str                   # the torch name: torch.ops.myops.<name>
    onnx_type: str              # the ONNX node's op_type in the myops domain
    inputs: tuple[str, ...]     # ONNX inputs; the first is X, the rest are shaped [X.shape[-1]]
    attributes: dict = field(default_factory=dict)  # ONNX float attributes and their defaults
    torch_only: bool = False    # no ONNX node of its own (none today)
    plugin_only: bool = False   # a plugin kernel with no torch op (the benchmark's Copy floor)

    @property
    def qualified(self) -> str:
        return f"{DOMAIN}::{self.onnx_type}"


OPS = {
    "swish": OpSpec("swish", "Swish", ("X",), {"beta": 1.0}),
    "rms_norm": OpSpec("rms_norm", "RMSNorm", ("X", "scale"), {"epsilon": 1e-6}),
    "copy": OpSpec("copy", "Copy", ("X",), plugin_only=True),
}


def by_onnx_type(op_type: str) -> OpSpec | None:
    return next((spec for spec in OPS.values() if spec.onnx_type == op_type), None)


def probe_input_names(op_type: str) -> tuple[str, ...]:
    """The graph input names of a one-node probe: "x" first, then the op's other inputs by name
    (lower case). An op this catalogue does not know is probed with one input."""
    spec = by_onnx_type(op_type)
    return ("x",) + tuple(name.lower() for name in (spec.inputs[1:] if spec else ()))
