"""An op's torch side, made from its declaration: `TorchOp.declared(spec)` (ops.registry collects them).

opspec/<name>.py says what the op is without torch (ONNX type, inputs, attributes, workloads, its
decomposed form, tolerances, targets, native function, the modules ops.apply swaps and the models that
hold it); this module turns those data into torch: the op's function, its reference, the binders that
read its arguments off a swapped module, its models. Export, artifacts, the bench, the doctor and the
nox sessions loop over OPS.
"""
from __future__ import annotations

import functools
import inspect
import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from opspec import DOMAIN, OpSpec, Replaces

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
                raise ValueError(f"opspec/{self.spec.name}.py declares no decomposed form: declare one (decomposed=...): "
                                 "it is the op's reference, its ONNX lowerings and its fuse rule")
            object.__setattr__(self, "reference", onnx_parts.torch_reference(self.spec))
        if not self.reference_text:
            object.__setattr__(self, "reference_text", self.spec.formula)
        if self.register_python_parts is None:
            if not self.spec.kind:
                raise ValueError(f"opspec/{self.spec.name}.py declares no kind: declare kind=\"elementwise\" or "
                                 "\"rowwise\" (its adapters, fakes and autograd are those of its kind)")
            parts = functools.partial(adapters.register_python_parts, self.spec, self.reference)
            object.__setattr__(self, "register_python_parts", parts)

    @classmethod
    def declared(cls, spec: OpSpec) -> "TorchOp":
        """The torch side of an op, from its declaration: its function is torch.ops.myops.<name>, its
        weights are its inputs after the full-shaped ones, its native function the declaration's expression
        (spec.native, where spec.native_when holds), its swaps and models the declared ones; an artifact's
        input seed comes from its model's name unless declared (the same on every machine, another for each)."""
        def function(*args, **kwargs):
            return getattr(getattr(torch.ops, DOMAIN), spec.name)(*args, **kwargs)

        function.__name__ = function.__qualname__ = spec.name
        function.__doc__ = f"{spec.formula or spec.name} as one fused op (torch.ops.{DOMAIN}.{spec.name})."
        function.__signature__ = inspect.Signature(  # what help() shows: the schema's arguments and defaults
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in spec.torch_input_names]
            + [inspect.Parameter(spec.torch_attribute(name), inspect.Parameter.POSITIONAL_OR_KEYWORD, default=value)
               for name, value in spec.attributes.items()])
        models = (spec.name, *spec.models)
        seeds = {model: spec.artifact_seeds.get(model, 1000 + zlib.crc32(model.encode()) % 9000) for model in models}
        return cls(spec=spec, function=function, weights=spec.torch_input_names[spec.full_inputs:],
                   native=_native_function(spec) if spec.native else None, native_text=spec.native,
                   native_applies=_native_applies(spec),
                   extra_models={name: MODEL_FORMS[form] for name, form in spec.models.items()},
                   artifact_seeds=seeds, artifact_attributes=dict(spec.artifact_attributes),
                   replaces={path: _declared_binder(spec, swap) for path, swap in spec.replaces.items()},
                   replaces_functions=dict(spec.replaces_functions), refuses=dict(spec.refuses),
                   looks_like=tuple(spec.looks_like))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def torch_name(self) -> str:
        return f"{DOMAIN}::{self.spec.name}"

    @functools.cached_property
    def onnx(self) -> onnx_parts.DeclaredOnnx:
        """The op's ONNX parts: register_schema(), torchscript_symbolic(lowering),
        dynamo_translation(lowering, opset), expected_nodes(lowering, opset, exporter, attributes),
        uses_standard(opset, exporter), fuse_rules(report), NODE_TYPES. Read from the declaration's
        decomposed form (ops.onnx_parts)."""
        if self.spec.decomposed is None:
            raise ValueError(f"opspec/{self.name}.py declares no decomposed form: declare one (decomposed=...)")
        return onnx_parts.DeclaredOnnx(self.spec)

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


def _native_applies(spec: OpSpec) -> Callable[[dict], bool]:
    """Whether the native function is the op with these ONNX attributes on this torch (spec.native_when)."""
    if not spec.native_when:
        return lambda attributes: True
    names = [spec.torch_attribute(name) for name in spec.attributes]
    try:
        code = compile(f"lambda {', '.join(names)}: ({spec.native_when})", f"opspec/{spec.name}.py (native_when=)",
                       "eval")
    except SyntaxError as exc:
        raise ValueError(f"opspec/{spec.name}.py: native_when={spec.native_when!r} is not a Python expression "
                         f"({exc.msg}); write a condition on {', '.join(names) or 'torch and F'}") from exc
    condition = eval(code, {"torch": torch, "F": torch.nn.functional})  # the declaration's own text
    return lambda attributes: bool(condition(*attributes.values()))


# myops' kernels of a row-wise op: float32 on the CPU; float16 and bfloat16 too on CUDA.
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _declared_binder(spec: OpSpec, swap: Replaces) -> Bind:
    """bind(module) of a class the declaration says the op replaces (opspec Replaces): each weight from the
    module's attribute of its name (one value per channel; ones where the module has none but a
    normalized_shape, as torch's norms without elementwise_affine), each attribute from the module's
    attribute or a constant; Refused, with the reason, where the module is not what the op computes."""
    weight_names = spec.torch_input_names[spec.full_inputs:]

    def bind(module: torch.nn.Module) -> tuple[tuple, dict]:
        shape = getattr(module, "normalized_shape", None)
        if shape is not None and len(shape) != 1:
            raise Refused(f"it normalises over the last {len(shape)} dimensions {list(shape)}; myops::{spec.name} "
                          "over the last one")
        weights = []
        for name in weight_names:
            held = swap.weights.get(name, name)
            weight = getattr(module, held, None)
            if weight is None and shape is not None and name not in swap.offsets:
                weights.append(torch.ones(tuple(shape)))  # Fused moves it to each input's device and dtype
                continue
            if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
                raise Refused(f"its {held} is {None if weight is None else list(weight.shape)}, not one value per "
                              "channel")
            if weight.dtype not in KERNEL_DTYPES:
                raise Refused(f"its {held} is {weight.dtype}: myops::{spec.name}'s kernels take float32 (and float16, "
                              "bfloat16 on CUDA); a float64 path would lose precision silently")
            if name in swap.offsets:
                if weight.dtype != torch.float32:  # in 16 bits, c + w would round a small weight away
                    raise Refused(f"its {held} is {weight.dtype}: it scales by {swap.offsets[name]:g} + {held} in "
                                  f"float32, and that sum in {weight.dtype} would round a small {held} away; swap it "
                                  "in float32")
                weight = Offset(weight, float(swap.offsets[name]))
            weights.append(weight)
        attributes = {}
        for name, source in swap.attributes.items():
            if not isinstance(source, str):
                attributes[name] = float(source)
                continue
            value = getattr(module, source, None)
            if value is None and name in swap.none_is_epsilon:
                weight = weights[0] if weights else None
                weight = weight.parameter if isinstance(weight, Offset) else weight
                if weight is None or not isinstance(weight, torch.nn.Parameter):
                    raise Refused(f"{source}=None follows the input's dtype, which is not known before the call and "
                                  f"it has no weight to tell; give it an {source}")
                if weight.dtype != torch.float32:
                    raise Refused(f"{source}=None follows the input's dtype ({weight.dtype} here); give it an {source}")
                value = torch.finfo(torch.float32).eps
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise Refused(f"its {name} ({source}) is {value!r}, not a number")
            attributes[name] = float(value)
        return tuple(weights), attributes
    return bind


class FeedForward(torch.nn.Module):
    """A transformer's feed-forward block around the op: Linear(h -> 4h), the op, Linear(4h -> h)."""

    def __init__(self, hidden: int, function: Callable, attributes: dict):
        super().__init__()
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)
        self.attribute_values = tuple(attributes.values())
        self.function = function

    def forward(self, x):
        return self.down(self.function(self.up(x), *self.attribute_values))


# What each of opspec.MODEL_FORMS is: (hidden, function, attributes) -> Module
MODEL_FORMS = {"feed_forward": FeedForward}


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
