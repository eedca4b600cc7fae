"""The Python side of every op of a kind, written once from its declaration: the fake kernels that
torch.compile and torch.export trace with, and autograd (a first derivative through the op's fused
backward, a second one through its reference composite: ops.autograd). The C++ side is
ops/csrc/adapters.h; opspec/codegen writes the schemas both sides register under.
"""
from __future__ import annotations

from typing import Callable

import torch

from opspec import DOMAIN, OpSpec

from . import autograd

_registered: set[str] = set()


def _check_inputs(spec: OpSpec, op: str, names: tuple[str, ...], tensors: tuple, full: int) -> None:
    """What the kernels check, for the fakes: tensors [0, full) have x's shape, dtype and device (a
    backward's grads come first, then x), the rest are weights [x.shape[-1]] of x's dtype and device."""
    x_index = full - spec.full_inputs
    x = tensors[x_index]
    if spec.kind == "rowwise":
        torch._check(x.dim() >= 1, lambda: f"{op}: x must have at least one dimension")
    for name, tensor in zip(names[:full], tensors[:full]):
        torch._check(tensor.shape == x.shape, lambda: f"{op}: {name} must have x's shape {list(x.shape)}; got "
                                                      f"{list(tensor.shape)}")
        torch._check(tensor.dtype == x.dtype, lambda: f"{op}: {name} must have x's dtype {x.dtype}; got {tensor.dtype}")
        torch._check(tensor.device == x.device, lambda: f"{op}: {name} must be on x's device {x.device}; got "
                                                        f"{tensor.device}")
    for name, tensor in zip(names[full:], tensors[full:]):
        torch._check(tensor.shape == x.shape[-1:], lambda: f"{op}: {name} must have shape [{x.shape[-1]}]; got "
                                                           f"{list(tensor.shape)}")
        torch._check(tensor.dtype == x.dtype, lambda: f"{op}: {name} must have x's dtype {x.dtype}; got {tensor.dtype}")
        # a meta tensor among CPU ones dispatches here: this check is what refuses it
        torch._check(tensor.device == x.device, lambda: f"{op}: {name} must be on x's device {x.device}; got "
                                                        f"{tensor.device}")


def _empty_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


def _one_or_tuple(results: list):
    return results[0] if len(results) == 1 else tuple(results)


def register_python_parts(spec: OpSpec, reference: Callable) -> None:
    """Fakes and autograd of myops::<op> and myops::<op>_backward, from the declaration; idempotent.
    reference(*tensors, *attributes) is the composite the op replaces (its second derivatives)."""
    if spec.name in _registered:
        return
    # torch 2.3 (the cuda11.8 entry) names register_fake impl_abstract and has no register_autograd.
    register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
    forward, backward = f"{DOMAIN}::{spec.name}", f"{DOMAIN}::{spec.name}_backward"
    tensors, outputs, attributes = len(spec.inputs), len(spec.outputs), len(spec.attributes)
    names = spec.torch_input_names

    def forward_fake(*args):
        given = args[:tensors]
        _check_inputs(spec, forward, names, given, spec.full_inputs)
        return _one_or_tuple([_empty_like(given[0]) for _ in range(outputs)])

    def backward_fake(*args):
        given = args[:outputs + tensors]
        _check_inputs(spec, backward, spec.grad_names + names, given, outputs + spec.full_inputs)
        return _one_or_tuple([_empty_like(t) for t in given[outputs:]])

    register_fake(forward)(forward_fake)
    register_fake(backward)(backward_fake)

    def setup_context(ctx, inputs, output):  # torch passes these by name
        ctx.save_for_backward(*inputs[:tensors])
        ctx.attributes = tuple(inputs[tensors:])

    def first_derivative(ctx, *grads):
        saved = ctx.saved_tensors
        # an output that reached no loss has no gradient: zeros, as the reference's autograd would use
        grads = tuple(torch.zeros_like(saved[0]) if g is None else g for g in grads)
        results = getattr(getattr(torch.ops, DOMAIN), f"{spec.name}_backward")(*grads, *saved, *ctx.attributes)
        results = results if isinstance(results, tuple) else (results,)
        return (*results, *(None,) * attributes)

    autograd.register(forward, first_derivative, setup_context)
    # a second derivative: the backward op's own, from the composite's (ops/autograd.py)
    autograd.differentiable_backward(backward, reference, grads=outputs, tensors=tensors)
    _registered.add(spec.name)
