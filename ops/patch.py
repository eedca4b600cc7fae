"""Put the myops ops into a model a user already has: `ops.apply(model)`.

Each op declares, in opspec/<op>.py, the module classes it stands in for (replaces: Hugging Face's
LlamaRMSNorm, torch.nn.SiLU ...), the functions (replaces_functions: F.silu held as an attribute) and
the look-alikes it must refuse with a reason (refuses); a user's own classes
are declared in the call (apply(model, declare=...)). apply() walks the model once, swaps every
declared module for a `Fused` module that keeps the original's own Parameters (the state dict and an
optimiser's references stay valid), and returns a Patch: what was swapped, what was left alone and
why, and undo().

Classes are matched exactly, by import path: a subclass may have changed forward, so it is left
alone with the reason, as is any module whose class name looks like an op's (looks_like) but is not
declared.
"""
from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from .declaration import Offset, Refused, TorchOp
from .registry import OPS


class PatchError(ValueError):
    """apply() was asked for something it cannot do; the message says what to ask instead."""


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class Fused(torch.nn.Module):
    """One myops op in place of the module (or function) it replaced: that module's own Parameters, the
    op's attributes as constants."""

    def __init__(self, op: TorchOp, weights: tuple, attributes: dict, replaced: str):
        super().__init__()
        self.op_name = op.name
        self.replaced = replaced
        self.attributes = op.attributes(**attributes)
        self.offsets = {name: value.offset for name, value in zip(op.weights, weights) if isinstance(value, Offset)}
        for name, value in zip(op.weights, weights, strict=True):
            value = value.parameter if isinstance(value, Offset) else value
            if isinstance(value, torch.nn.Parameter):
                self.register_parameter(name, value)
            else:  # a module without its own weight (nn.RMSNorm without affine): ones, not in the state dict
                self.register_buffer(name, value, persistent=False)

    def forward(self, x, *others):  # others: a gated op's other full-shaped inputs, as the original took them
        op = OPS[self.op_name]
        weights = [getattr(self, name) for name in op.weights]
        # a weight the original did not have (ones) follows the input, as the original's math would
        weights = [w if isinstance(w, torch.nn.Parameter) else w.to(x.device, x.dtype) for w in weights]
        # an offset weight (1 + weight) is computed here, in the graph: its gradient reaches the parameter
        weights = [w + self.offsets[name] if name in self.offsets else w for name, w in zip(op.weights, weights)]
        return op.function(x, *others, *weights, *self.attributes.values())

    def extra_repr(self) -> str:
        attributes = ", ".join([*(f"{k}={v:g}" for k, v in self.attributes.items()),
                                *(f"{name}: {offset:g} + {name}" for name, offset in self.offsets.items())])
        return f"myops::{self.op_name} in place of {self.replaced}" + (f", {attributes}" if attributes else "")


@dataclass(frozen=True)
class Swap:
    path: str           # where in the model: "model.layers.0.input_layernorm"
    op: str
    replaced: str       # the class (or function) it stood in for
    attributes: dict


@dataclass(frozen=True)
class LeftAlone:
    path: str
    replaced: str
    reason: str


@dataclass
class Patch:
    """What apply() did to a model; undo() puts every original back."""
    model: torch.nn.Module
    swapped: list[Swap] = field(default_factory=list)
    left_alone: list[LeftAlone] = field(default_factory=list)
    _restore: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def counts(self) -> Counter:
        """Swaps per op (torch name): how many myops nodes a custom export of one forward must hold,
        where each swapped module is called once."""
        return Counter(swap.op for swap in self.swapped)

    def undo(self) -> None:
        while self._restore:
            self._restore.pop()()
        self.swapped.clear()

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def report(self) -> str:
        lines = [f"swapped {len(self.swapped)} modules: "
                 + (", ".join(f"{n} x myops::{op}" for op, n in sorted(self.counts().items())) or "none")]
        by_kind = Counter((s.op, s.replaced, tuple(sorted(s.attributes.items()))) for s in self.swapped)
        for (op, replaced, attributes), n in sorted(by_kind.items()):
            shown = ", ".join(f"{k} {v:g}" for k, v in attributes)
            lines.append(f"  {n:3} x {replaced} -> myops::{op}" + (f" ({shown})" if shown else ""))
        if self.left_alone:
            lines.append(f"left alone {len(self.left_alone)}:")
            lines += [f"  {item.path}: {item.replaced}: {item.reason}" for item in self.left_alone]
        if not self.swapped and not self.left_alone:
            lines.append(f"  no module is of a class an op declares ({', '.join(f'myops::{n}' for n in OPS)}), and "
                         "none is named like one: for a class of your own that computes an op, pass "
                         "declare={YourClass: (op, {attribute: value})} to ops.apply")
        return "\n".join(lines)


def _chosen(ops: Iterable[str] | None) -> list[TorchOp]:
    if ops is None:
        return list(OPS.values())
    names = list(ops)
    unknown = sorted(set(names) - set(OPS))
    if unknown:
        raise PatchError(f"unknown op {unknown}; the ops are {', '.join(OPS)}")
    return [OPS[name] for name in names]


def _function_path(value) -> str | None:
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        return f"{value.__module__}.{value.__qualname__}"
    return None


def _declared_by_user(op: TorchOp, attributes: dict) -> Callable:
    """bind() of a class the user declares: the op's weights are the module's attributes of their names,
    an attribute given as a string is the module's attribute of that name; before the swap, the module
    is run against the op's reference on random inputs (on its parameters' device and dtype, within the
    op's declared tolerance), and refused where they differ."""
    def bind(module: torch.nn.Module) -> tuple[tuple, dict]:
        if len(op.spec.graph_inputs) > 1:
            raise Refused(f"myops::{op.name} takes {len(op.spec.graph_inputs)} inputs: declare={{...}} swaps one-input "
                          "modules only")
        weights = []
        for name in op.weights:
            weight = getattr(module, name, None)
            if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
                raise Refused(f"declared as myops::{op.name}, but its {name!r} is "
                              f"{None if weight is None else list(weight.shape)}, not one value per channel")
            weights.append(weight)
        missing = sorted(v for v in attributes.values() if isinstance(v, str) and not hasattr(module, v))
        if missing:
            raise Refused(f"declared as myops::{op.name} with attributes read off the module, but it has no "
                          f"{', '.join(missing)}")
        values = {key: getattr(module, value) if isinstance(value, str) else value for key, value in attributes.items()}
        like = next(iter(module.parameters()), weights[0] if weights else torch.empty(0))
        dtype = like.dtype if like.is_floating_point() else torch.float32
        hidden = weights[0].shape[0] if weights else 64
        x = (3 * torch.randn(2, 5, hidden, generator=torch.Generator().manual_seed(0))).to(like.device, dtype)
        try:
            with torch.no_grad():
                mine = module(x)
                want = op.reference(x, *weights, *op.attributes(**values).values())
        except Exception as exc:  # the user's forward, or the reference, refusing these inputs
            raise Refused(f"declared as myops::{op.name}, but checking it on random inputs raised: {exc}") from None
        rtol, atol = op.tolerances.get(str(dtype).removeprefix("torch."), (1e-4, 1e-5))
        if not isinstance(mine, torch.Tensor) or mine.shape != want.shape or not torch.allclose(
                mine, want, rtol=max(rtol, 1e-4), atol=max(atol, 1e-5)):
            worst = float((mine - want).abs().max()) if isinstance(mine, torch.Tensor) and mine.shape == want.shape \
                else float("nan")
            raise Refused(f"declared as myops::{op.name} {op.attributes(**values)}, but on random inputs its forward "
                          f"differs from the op's reference {op.reference_text} by up to {worst:.3g}: left as it is")
        return tuple(weights), values
    return bind


def apply(model: torch.nn.Module, ops: Iterable[str] | None = None, *, declare: dict | None = None) -> Patch:
    """Swap, in place, every module (and function attribute) of `model` that one of `ops` (default:
    every registered op) declares it replaces. Returns the Patch: its report(), counts() and undo().

    declare={MyActivation: ("swish", {"beta": 1.3}), MyNorm: ("rms_norm", {"eps": "eps"})}: the user's
    own classes (matched exactly), each checked against the op's reference on random inputs before it
    is swapped; an attribute given as a string is read off the module."""
    from . import load

    chosen = _chosen(ops)
    load()
    patch = Patch(model)
    declared = {path: (op, bind) for op in chosen for path, bind in op.replaces.items()}
    for cls, (op_name, attributes) in (declare or {}).items():
        if not isinstance(cls, type) or op_name not in OPS:
            raise PatchError(f"declare={{{cls!r}: ({op_name!r}, ...)}}: give a module class and one of the ops "
                             f"{', '.join(OPS)}")
        op = OPS[op_name]
        known = {name for onnx_name in op.spec.attributes for name in (onnx_name, op.spec.torch_attribute(onnx_name))}
        if set(attributes) - known:
            raise PatchError(f"declare={{{cls.__name__}: ({op_name!r}, {dict(attributes)})}}: myops::{op_name} has no "
                             f"attribute {', '.join(sorted(set(attributes) - known))}; its attributes are "
                             f"{', '.join(sorted(known)) or 'none'}")
        declared[class_path(cls)] = (op, _declared_by_user(op, dict(attributes)))
    refused = {path: reason for op in chosen for path, reason in op.refuses.items()}
    functions = {path: (op, attributes) for op in chosen for path, attributes in op.replaces_functions.items()}
    hints = [(fragment.lower(), op) for op in chosen for fragment in op.looks_like]
    classes = {}  # declared classes that are importable here: for the subclass check
    for path in declared:
        module_name, _, name = path.rpartition(".")
        try:
            classes[path] = getattr(__import__(module_name, fromlist=[name]), name)
        except (ImportError, AttributeError):
            pass

    for parent_path, parent in list(model.named_modules()):
        if isinstance(parent, Fused):
            continue
        prefix = f"{parent_path}." if parent_path else ""
        for name, child in list(parent.named_children()):
            path, cls = prefix + name, class_path(type(child))
            if cls in declared:
                op, bind = declared[cls]
                try:
                    weights, attributes = bind(child)
                except Refused as exc:
                    patch.left_alone.append(LeftAlone(path, cls, str(exc)))
                    continue
                fused = Fused(op, weights, attributes, cls)
                setattr(parent, name, fused)
                patch._restore.append(lambda parent=parent, name=name, child=child: setattr(parent, name, child))
                patch.swapped.append(Swap(path, op.name, cls, dict(fused.attributes)))
            elif cls in refused:
                patch.left_alone.append(LeftAlone(path, cls, refused[cls]))
            elif base := next((p for p, c in classes.items() if isinstance(child, c)), None):
                patch.left_alone.append(LeftAlone(path, cls, f"a subclass of {base}, whose forward it may change: "
                                                             f"if it computes the same, pass declare={{"
                                                             f"{type(child).__name__}: (\"{declared[base][0].name}\", "
                                                             "{...})} to ops.apply"))
            elif op := next((op for fragment, op in hints if fragment in type(child).__name__.lower()), None):
                example = ", ".join(f'"{k}": {v:g}' for k, v in op.spec.attributes.items())
                patch.left_alone.append(LeftAlone(path, cls, f"looks like myops::{op.name} but is not declared: if its "
                                                             f"forward is {op.reference_text}, pass "
                                                             f"declare={{{type(child).__name__}: (\"{op.name}\", "
                                                             f"{{{example}}})}} to ops.apply (it is checked against "
                                                             "the op's reference before the swap)"))
        for name, value in list(vars(parent).items()):
            function = _function_path(value)
            if function in functions:
                op, attributes = functions[function]
                fused = Fused(op, (), attributes, function)
                object.__delattr__(parent, name)
                setattr(parent, name, fused)

                def restore(parent=parent, name=name, value=value):
                    delattr(parent, name)
                    object.__setattr__(parent, name, value)

                patch._restore.append(restore)
                patch.swapped.append(Swap(prefix + name, op.name, function, dict(fused.attributes)))
    return patch
