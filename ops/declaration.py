"""What ops/<name>.py declares of its op: `OP = TorchOp(...)` (ops.registry collects them).

opspec/<name>.py says what the op is without torch (ONNX type, inputs, attributes, workloads, its
decomposed form, tolerances, targets, native function); an op with nothing more is its declaration and
its math, and ops.registry makes its TorchOp (TorchOp.declared). ops/<name>.py, where an op has one, adds
what needs torch code: the modules ops.apply swaps, other models that hold it, its own reference or
autograd. Export, artifacts, the bench, the doctor and the nox sessions loop over OPS.
"""
from __future__ import annotations

import functools
import importlib
import zlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

import torch

from opspec import DOMAIN, OpSpec

from . import adapters, onnx_parts

# A bench target: (name, numerator row, denominator rows, limit); it holds when median(A/B) <= limit.
Target = tuple


class Refused(Exception):
    """Raised by a replacement's bind(module): this module does not compute what the op does; the
    message is the reason, which ops.apply reports."""


# bind(module) -> (the op's weights after X, taken from the module: its own Parameters, or Offset(p, c)
# for one it uses as p + c; its attributes by ONNX or torch name), or raises Refused. See ops.patch.
Bind = Callable[[torch.nn.Module], tuple[tuple, dict]]


@dataclass(frozen=True)
class Offset:
    """A weight the module uses as `parameter + offset` (Gemma's RMSNorm scales by 1 + weight): the
    swapped module keeps the parameter and adds the offset in its forward, so training stays right."""
    parameter: torch.Tensor
    offset: float


@dataclass(frozen=True)
class TorchOp:
    spec: OpSpec
    function: Callable              # the fused op: (x, *other full-shaped inputs, *weights, *attributes) -> y
    # the composite it replaces, same signature: layer 1's ground truth; None: the declared decomposed form's
    # (ops.onnx_parts.torch_reference)
    reference: Callable | None = None
    reference_text: str = ""        # the composite as the bench's graph column writes it (default: the form's formula)
    # fakes and autograd, once the library is loaded; None: the generic ones of the op's kind (ops.adapters)
    register_python_parts: Callable[[], None] | None = None
    weights: tuple[str, ...] = ()   # the model's parameters for the ONNX inputs after the full-shaped ones (shape [hidden])
    native: Callable | None = None  # PyTorch's own function for the op (row spec.native_row), same signature
    native_text: str = ""
    native_applies: Callable[[dict], bool] = lambda attributes: True  # with these attributes, on this torch
    extra_models: dict = field(default_factory=dict)  # name -> (hidden, function, attributes) -> Module
    artifact_seeds: dict = field(default_factory=dict)  # model -> seed of its fixed input in the artifacts
    artifact_attributes: dict = field(default_factory=dict)  # model -> ONNX attributes of its artifacts
    # layer 1 vs the reference, dtype -> (rtol, atol), and the bench targets at each op-alone workload
    # (rows: "torch_extension", native_row, "ort_custom", ...: bench.targets); None: the declaration's
    tolerances: dict | None = None
    targets: tuple[Target, ...] | None = None
    # What ops.apply swaps in a user's model: module classes by import path (nothing is imported to
    # declare them) and how to read the op's arguments off each; functions held as attributes (F.silu)
    # with the attributes they mean; classes that look alike but compute something else, with why; and
    # class-name fragments whose undeclared classes are reported as left alone.
    replaces: dict[str, Bind] = field(default_factory=dict)
    replaces_functions: dict[str, dict] = field(default_factory=dict)
    refuses: dict[str, str] = field(default_factory=dict)
    looks_like: tuple[str, ...] = ()

    def __post_init__(self):
        if self.tolerances is None:
            object.__setattr__(self, "tolerances", dict(self.spec.tolerances))
        if self.targets is None:
            object.__setattr__(self, "targets", tuple(self.spec.targets))
        if self.reference is None:
            if self.spec.decomposed is None:
                raise ValueError(f"opspec/{self.spec.name}.py declares no decomposed form: declare one (decomposed=...), "
                                 f"or give the op an ops/{self.spec.name}.py whose TorchOp has its own reference")
            object.__setattr__(self, "reference", onnx_parts.torch_reference(self.spec))
        if not self.reference_text:
            object.__setattr__(self, "reference_text", self.spec.formula)
        if self.register_python_parts is None:
            if not self.spec.kind:
                raise ValueError(f"opspec/{self.spec.name}.py declares no kind: declare kind=\"elementwise\" or "
                                 f"\"rowwise\", or give the op an ops/{self.spec.name}.py whose TorchOp has its own "
                                 "register_python_parts")
            parts = functools.partial(adapters.register_python_parts, self.spec, self.reference)
            object.__setattr__(self, "register_python_parts", parts)

    @classmethod
    def declared(cls, spec: OpSpec) -> "TorchOp":
        """The torch side of an op that has no ops/<name>.py: its function is torch.ops.myops.<name>, its
        weights are its inputs after the full-shaped ones, its native function the declaration's expression
        (spec.native); the artifacts' input seed comes from
        its name (the same on every machine, another for each op)."""
        def function(*args, **kwargs):
            return getattr(getattr(torch.ops, DOMAIN), spec.name)(*args, **kwargs)

        function.__name__ = function.__qualname__ = spec.name
        function.__doc__ = f"{spec.formula or spec.name} as one fused op (torch.ops.{DOMAIN}.{spec.name})."
        return cls(spec=spec, function=function, weights=spec.torch_input_names[spec.full_inputs:],
                   native=_native_function(spec) if spec.native else None, native_text=spec.native,
                   artifact_seeds={spec.name: 1000 + zlib.crc32(spec.name.encode()) % 9000})

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def torch_name(self) -> str:
        return f"{DOMAIN}::{self.spec.name}"

    @functools.cached_property
    def onnx(self) -> onnx_parts.DeclaredOnnx | ModuleType:
        """The op's ONNX parts: register_schema(), torchscript_symbolic(lowering),
        dynamo_translation(lowering, opset), expected_nodes(lowering, opset, exporter, attributes),
        uses_standard(opset, exporter), fuse_rules(report), NODE_TYPES. Read from the declaration's
        decomposed form (ops.onnx_parts), or, for an op without one, its own ops/<name>_onnx.py."""
        if self.spec.decomposed is not None:
            return onnx_parts.DeclaredOnnx(self.spec)
        return importlib.import_module(f"{__package__}.{self.name}_onnx")

    @property
    def models(self) -> tuple[str, ...]:
        return (self.name, *self.extra_models)

    def attributes(self, **given) -> dict:
        """The op's ONNX attributes with defaults, overridden by `given` (ONNX or torch names; unknown
        names are ignored, so a caller may pass one set for every op)."""
        values = dict(self.spec.attributes)
        for onnx_name in values:
            for key in (onnx_name, self.spec.torch_attribute(onnx_name)):
                if given.get(key) is not None:
                    values[onnx_name] = given[key]
        return values

    def build_model(self, model: str, *, hidden: int = 768, seed: int = 0, function: Callable | None = None,
                    attributes: dict | None = None) -> torch.nn.Module:
        """Deterministic weights: the same seed gives the same model on every machine. `function`
        replaces the fused op (the bench's composite, native and compiled rows)."""
        torch.manual_seed(seed)
        attributes = self.attributes(**(attributes or {}))
        function = function or self.function
        if model == self.name:
            return OpModel(self, hidden, function, attributes).eval()
        return self.extra_models[model](hidden, function, attributes).eval()

    def overload(self):
        return getattr(getattr(torch.ops, DOMAIN), self.name).default


def _native_function(spec: OpSpec) -> Callable:
    """PyTorch's own function for the op from its declared expression (spec.native), in its torch inputs
    and attributes, torch and F."""
    parameters = [*spec.torch_input_names, *(spec.torch_attribute(name) for name in spec.attributes)]
    try:
        code = compile(f"lambda {', '.join(parameters)}: ({spec.native})", f"opspec/{spec.name}.py (native=)", "eval")
    except SyntaxError as exc:
        raise ValueError(f"opspec/{spec.name}.py: native={spec.native!r} is not a Python expression ({exc.msg}); write "
                         f"PyTorch's function of {', '.join(parameters)}, e.g. \"F.gelu(x)\"") from exc
    return eval(code, {"torch": torch, "F": torch.nn.functional})  # the declaration's own text, in torch and F


class OpModel(torch.nn.Module):
    """The op alone: its full-shaped inputs as the model's (x first: spec.graph_inputs), its [hidden]
    weights as parameters (initialisers in ONNX), attributes as constants."""

    def __init__(self, op: TorchOp, hidden: int, function: Callable, attributes: dict):
        super().__init__()
        for name in op.weights:
            self.register_parameter(name, torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden)))
        self.weight_names = op.weights
        self.attribute_values = tuple(attributes.values())
        self.function = function

    def forward(self, x, *others):
        return self.function(x, *others, *(getattr(self, name) for name in self.weight_names), *self.attribute_values)
