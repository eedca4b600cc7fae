"""Autograd for the ops, on every torch the matrix holds, and what a second derivative does.

register(qualname, backward, setup_context): torch.library.register_autograd where torch has it (2.4
on), on torch 2.3 (the cuda11.8 entry) an autograd.Function behind the op's Autograd key.

A first derivative runs the op's fused backward kernel. A second one (create_graph=True: gradient
penalties, Hessian-vector products) differentiates that backward op; without autograd of its own it
would give wrong numbers with only a warning. So the backward op is either
- differentiable_backward(...): its derivatives are the reference composite's second derivatives
  (torch.func.vjp of the composite's vjp), correct to any order; or
- refuse_double_backward(...): a backward that raises one clear error when differentiated, like
  torch's once_differentiable, which misses a saved input that requires grad.
"""
from __future__ import annotations

from typing import Callable

import torch

_libraries: list = []  # torch 2.3's Autograd-key kernels: dropping a Library unregisters its kernels


def register(qualname: str, backward: Callable, setup_context: Callable) -> None:
    if hasattr(torch.library, "register_autograd"):
        torch.library.register_autograd(qualname, backward, setup_context=setup_context)
        return
    namespace, name = qualname.split("::")
    overload = getattr(getattr(torch.ops, namespace), name).default

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            with torch._C._AutoDispatchBelowAutograd():
                output = overload(*args)
            setup_context(ctx, args, output)
            return output

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    # the dispatcher leaves out trailing arguments that equal their defaults: put them back
    arguments = overload._schema.arguments
    library = torch.library.Library(namespace, "IMPL")
    library.impl(name, lambda *args: Function.apply(*args, *(a.default_value for a in arguments[len(args):])),
                 "Autograd")
    _libraries.append(library)


def differentiable_backward(qualname: str, reference: Callable, grads: int, tensors: int) -> None:
    """Autograd for a backward op `(grad x grads, tensor x tensors, *attributes) -> one gradient per
    tensor`, from `reference(*tensors, *attributes)`: the op whose backward this is, as composite torch."""
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:grads + tensors])
        ctx.attributes = tuple(inputs[grads + tensors:])

    def backward(ctx, *outer):
        saved = ctx.saved_tensors
        given, primals = saved[:grads], saved[grads:]

        def first_derivative(given, primals):
            _, vjp = torch.func.vjp(lambda *p: reference(*p, *ctx.attributes), *primals)
            return vjp(given[0] if grads == 1 else given)

        outer = tuple(torch.zeros_like(p) if o is None else o for o, p in zip(outer, primals))
        _, vjp = torch.func.vjp(first_derivative, given, primals)
        of_given, of_primals = vjp(outer)
        return (*of_given, *of_primals, *(None,) * len(ctx.attributes))

    register(qualname, backward, setup_context)


def refuse_double_backward(qualname: str, backward: Callable) -> Callable:
    """`backward` whose results raise, when differentiated, an error that names the op and what to do."""
    message = (f"{qualname}'s backward is not differentiable: a second derivative (create_graph=True, a "
               "gradient penalty, a Hessian-vector product) through it would be wrong, so it is refused. "
               "Use the op's reference composite for second derivatives, or give the op's backward op an "
               "autograd of its own (ops.autograd.differentiable_backward).")

    def once(ctx, *grads):
        with torch.no_grad():
            results = backward(ctx, *grads)
        tensors = [*grads, *ctx.saved_tensors]
        if not torch.is_grad_enabled() or not any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
            return results
        many = isinstance(results, tuple)
        results = results if many else (results,)
        present = [r for r in results if r is not None]
        # a zero joined to every input that requires grad, so differentiating reaches the raising node
        # (once_differentiable's detached copies end in "appears to not have been used in the graph")
        joined = sum(t.reshape(-1)[:0].sum() for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad)
        raising = torch._C._functions.DelayedError(message.encode(), len(present))(
            *(r + joined.to(r.dtype) for r in present))
        raising = iter(raising if isinstance(raising, tuple) else (raising,))
        results = tuple(None if r is None else next(raising) for r in results)
        return results if many else results[0]

    return once
