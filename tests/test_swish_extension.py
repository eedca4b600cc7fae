"""Alignment layer 1: the extension op against the PyTorch reference, forward and backward."""
from __future__ import annotations

import psutil
import pytest
import torch

from ops.registry import OPS

BETAS = [1.0, 1.702, 0.5, -0.3]
# fp32: the op's declared layer-1 tolerance (ops/swish.py says why).
FP32 = dict(zip(("rtol", "atol"), OPS["swish"].tolerances["float32"]))
EDGE_VALUES = [0.0, -0.0, 1e-8, -1e-8, 1e-40, -1e-40, 20.0, -20.0, 88.0, -88.0, 1e4, -1e4,
               float("inf"), float("-inf"), float("nan")]
SHAPES = [(), (1,), (0,), (0, 3), (7,), (17,), (1023,), (3, 5, 7), (2, 33, 65)]


def reference_with_grad(x: torch.Tensor, beta: float, grad: torch.Tensor):
    from ops import reference

    xr = x.detach().clone().requires_grad_(True)
    y = reference(xr, beta)
    y.backward(grad)
    return y.detach(), xr.grad


def op_with_grad(x: torch.Tensor, beta: float, grad: torch.Tensor):
    from ops import swish

    xo = x.detach().clone().requires_grad_(True)
    y = swish(xo, beta)
    y.backward(grad)
    return y.detach(), xo.grad


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_random(ext, shape, beta):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen) * 4
    grad = torch.randn(shape, generator=gen)
    y_ref, g_ref = reference_with_grad(x, beta, grad)
    y, g = op_with_grad(x, beta, grad)
    assert y.shape == x.shape and g.shape == x.shape
    torch.testing.assert_close(y, y_ref, **FP32)
    torch.testing.assert_close(g, g_ref, **FP32)


@pytest.mark.parametrize("beta", BETAS)
def test_edge_values_match_reference_exactly_where_special(ext, beta):
    x = torch.tensor(EDGE_VALUES, dtype=torch.float32)
    grad = torch.ones_like(x)
    y_ref, g_ref = reference_with_grad(x, beta, grad)
    y, g = op_with_grad(x, beta, grad)
    # NaN and +/-inf positions must be identical to the reference's, finite values close.
    torch.testing.assert_close(y, y_ref, equal_nan=True, **FP32)
    torch.testing.assert_close(g, g_ref, equal_nan=True, **FP32)
    finite = torch.isfinite(x)
    assert torch.isfinite(y[finite]).all(), f"overflow in forward: {y[finite]}"
    assert torch.isfinite(g[finite]).all(), f"overflow in backward: {g[finite]}"


@pytest.mark.parametrize("make_view", [
    lambda t: t.t(),
    lambda t: t[:, ::3],
    lambda t: t[1:, 2:].transpose(0, 1),
    lambda t: t[:1].expand(6, t.shape[1]),
], ids=["transposed", "strided", "offset-transposed", "expanded"])
def test_non_contiguous_inputs(ext, make_view):
    base = torch.randn(6, 257, generator=torch.Generator().manual_seed(3)) * 5
    x = make_view(base)
    assert not x.is_contiguous()
    grad = torch.randn(x.shape)
    y_ref, g_ref = reference_with_grad(x, 1.702, grad)
    y, g = op_with_grad(x, 1.702, grad)
    torch.testing.assert_close(y, y_ref, **FP32)
    torch.testing.assert_close(g, g_ref, **FP32)


def test_default_beta_is_silu(ext):
    x = torch.randn(1000)
    torch.testing.assert_close(torch.ops.myops.swish(x), torch.nn.functional.silu(x), **FP32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.complex64])
def test_unsupported_dtype_is_named(ext, dtype):
    x = torch.ones(4, dtype=dtype)
    with pytest.raises(RuntimeError) as info:
        ext.swish(x)
    message = str(info.value)
    assert "must be float32" in message and f"got {dtype}" in message, message


def test_backward_rejects_mismatched_grad(ext):
    with pytest.raises(RuntimeError, match="grad must have x's shape"):
        torch.ops.myops.swish_backward(torch.ones(3), torch.ones(4), 1.0)


def test_gradcheck_float64(ext):
    x = torch.randn(3, 11, dtype=torch.float64, requires_grad=True)
    for beta in BETAS:
        assert torch.autograd.gradcheck(lambda t: ext.swish(t, beta), (x,))


def test_opcheck(ext):
    x = torch.randn(5, 9)
    torch.library.opcheck(torch.ops.myops.swish.default, (x, 1.702))
    torch.library.opcheck(torch.ops.myops.swish.default, (x.requires_grad_(True), 0.5))
    torch.library.opcheck(torch.ops.myops.swish_backward.default, (torch.randn(5, 9), torch.randn(5, 9), -0.3))


def test_beta_gets_no_gradient(ext):
    # beta is a float attribute (as in ONNX); only x receives a gradient.
    schema = str(torch.ops.myops.swish.default._schema)
    assert schema == "myops::swish(Tensor x, float beta=1.) -> Tensor", schema


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(ext, backend):
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: ext.swish(t, 1.702) * 2.0, fullgraph=True, backend=backend, dynamic=True)
    x = torch.randn(4, 37, requires_grad=True)
    y = compiled(x)
    y.sum().backward()
    y_ref, g_ref = reference_with_grad(x, 1.702, torch.full_like(x, 2.0))
    torch.testing.assert_close(y, y_ref * 2.0, **FP32)
    torch.testing.assert_close(x.grad, g_ref, **FP32)


def test_torch_export_keeps_the_op(ext):
    from ops.export import build_model

    batch = torch.export.Dim("batch")
    program = torch.export.export(build_model("ffn", beta=0.5, hidden=16), (torch.randn(2, 3, 16),),
                                  dynamic_shapes={"x": {0: batch}})
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert "myops.swish.default" in targets, targets
    x = torch.randn(5, 3, 16)
    torch.testing.assert_close(program.module()(x), build_model("ffn", beta=0.5, hidden=16)(x))


@pytest.mark.bigmem
def test_more_than_2_pow_31_elements(ext):
    n = 2**31 + 37
    needed = 2 * n * 4 + (2 << 30)
    if psutil.virtual_memory().available < needed:
        pytest.skip(f"needs {needed / 2**30:.1f} GiB free, have {psutil.virtual_memory().available / 2**30:.1f}")
    x = torch.empty(n, dtype=torch.float32)
    x[: 1 << 20].uniform_(-8, 8)
    x[1 << 20:].fill_(3.0)  # cheap fill; the interesting part is the tail beyond 2^31
    tail = torch.tensor([-1e4, -20.0, -1.0, 0.0, 0.5, 7.0, 1e4, float("inf"), float("-inf")])
    x[-tail.numel():] = tail
    y = ext.swish(x, 1.702)
    torch.testing.assert_close(y[-tail.numel():], ext.reference(tail, 1.702), equal_nan=True, **FP32)
    torch.testing.assert_close(y[2**31 - 5: 2**31 + 5], ext.reference(x[2**31 - 5: 2**31 + 5], 1.702), **FP32)
    torch.testing.assert_close(y[: 1 << 20], ext.reference(x[: 1 << 20], 1.702), **FP32)


def test_build_records_abi_and_compiler_and_is_reused(ext):
    from ops.build import build, build_info

    info = build_info()
    assert info["cxx11_abi"] == int(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert info["torch"] == torch.__version__ and info["compiler"]
    library = __import__("pathlib").Path(info["library"])
    before = library.stat().st_mtime_ns
    assert build() == library
    assert library.stat().st_mtime_ns == before, "an unchanged build must be reused, not recompiled"


FALLBACK = r"""
import sys, torch
if not hasattr(torch.library, "impl_abstract"):
    sys.exit(77)
# What torch 2.3 lacks. (Its impl_abstract, which ops/swish.py uses for the fake kernel there, is
# register_fake under its old name; from 2.4 it calls register_fake, so that one stays.)
del torch.library.register_autograd
import ops
ops.load()
x = torch.randn(257, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(lambda t: torch.ops.myops.swish(t, 1.3), (x,))
ref = x.detach().clone().requires_grad_(True)
(ref * torch.sigmoid(1.3 * ref)).sum().backward()
torch.ops.myops.swish(x, 1.3).sum().backward()
assert torch.allclose(x.grad, ref.grad, rtol=1e-12, atol=1e-12)  # (assert_close imports modules that need register_autograd)
with torch.device("meta"):
    assert torch.ops.myops.swish(torch.empty(3, 4), 1.0).shape == (3, 4)
print("torch 2.3 fallback: autograd and fake kernel work")
"""


def test_the_torch_2_3_fallback_registers_fake_and_autograd(ext):
    """cuda11.8's torch 2.3 has neither register_fake nor register_autograd: ops/swish.py then uses
    impl_abstract and its own Autograd-key kernel. That kernel runs here, with register_autograd
    removed, in a fresh process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parent.parent)
    result = subprocess.run([sys.executable, "-c", FALLBACK], capture_output=True, text=True, cwd=repo,
                            env=dict(os.environ, PYTHONPATH=repo))
    if result.returncode == 77:
        pytest.skip(f"torch {torch.__version__} no longer has impl_abstract to fall back to")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "fallback: autograd and fake kernel work" in result.stdout
