"""Swish's layer 1: the extension op against the PyTorch composite, forward and backward, on every
device present (tests/devices.py: the CPU in float32; CUDA in float32, float16 and bfloat16 where a GPU
is), then what only the CPU build or only the GPU has."""
from __future__ import annotations

import pytest
import torch

from bench.gpu.plugin import EDGE_VALUES  # the plugin's CUDA check uses the same edge values
from devices import CUDA_DTYPES, CUDA_MARKS, DEVICE_DTYPES, DEVICES, assert_close, hessian_vector_products, tolerance
from ops.registry import OPS

OP = OPS["swish"]
BETAS = [1.0, 1.702, 0.5, -0.3]
FP32 = tolerance(OP, "float32")  # the op's declared tolerances: opspec/swish.py says why
SHAPES = [(), (1,), (0,), (0, 3), (7,), (17,), (1023,), (3, 5, 7), (2, 33, 65), (1_000_003,)]


def reference_with_grad(x: torch.Tensor, beta: float, grad: torch.Tensor):
    """The composite and its autograd in float32 on x's device (float16/bfloat16 upcast exactly),
    rounded once to x's dtype."""
    from ops import reference

    xr = x.detach().float().requires_grad_(True)
    y = reference(xr, beta)
    (dx,) = torch.autograd.grad(y, xr, grad.float())
    return y.detach().to(x.dtype), dx.to(x.dtype)


def op_with_grad(x: torch.Tensor, beta: float, grad: torch.Tensor):
    """The op and its registered autograd, on x as given (detach keeps a view's strides and offset;
    a clone could make it contiguous)."""
    from ops import swish

    xo = x.detach().requires_grad_(True)
    y = swish(xo, beta)
    (dx,) = torch.autograd.grad(y, xo, grad)
    return y.detach(), dx


def random_input(shape, device: str, dtype: str, seed: int = 0, scale: float = 4.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * scale).to(device, getattr(torch, dtype))


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_random(ext, device, dtype, shape, beta):
    x = random_input(shape, device, dtype)
    grad = random_input(shape, device, dtype, seed=1, scale=1.0)
    y_ref, g_ref = reference_with_grad(x, beta, grad)
    y, g = op_with_grad(x, beta, grad)
    tol = tolerance(OP, dtype)
    assert_close(y, y_ref, tol, f"forward {shape} beta {beta}")
    assert_close(g, g_ref, tol, f"backward {shape} beta {beta}")


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("beta", BETAS)
def test_edge_values_match_reference_exactly_where_special(ext, device, dtype, beta):
    x = torch.tensor(EDGE_VALUES, dtype=torch.float32).to(device, getattr(torch, dtype))
    grad = torch.ones_like(x)
    y_ref, g_ref = reference_with_grad(x, beta, grad)
    y, g = op_with_grad(x, beta, grad)
    # NaN and +/-inf positions must be identical to the reference's (assert_close checks), finite values close.
    tol = tolerance(OP, dtype)
    assert_close(y, y_ref, tol, "forward")
    assert_close(g, g_ref, tol, "backward")
    finite = torch.isfinite(x)
    assert torch.isfinite(y[finite]).all(), f"overflow in forward: {y[finite]}"
    assert torch.isfinite(g[finite]).all(), f"overflow in backward: {g[finite]}"


VIEWS = {
    "transposed": lambda t: t.t(),
    "strided": lambda t: t[:, ::3],
    "offset-transposed": lambda t: t[1:, 2:].transpose(0, 1),
    "expanded": lambda t: t[:1].expand(6, t.shape[1]),
    "unaligned": lambda t: t.flatten()[1:],  # contiguous, from storage offset 1: the kernels' scalar path
}


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("view", VIEWS)
def test_views_go_straight_in(ext, device, dtype, view):
    """Views into the op and its backward as they are (no clone, which could make them contiguous)."""
    x = VIEWS[view](random_input((6, 257), device, dtype, seed=3, scale=5.0))
    if view == "unaligned":
        assert x.is_contiguous() and x.data_ptr() % 16 != 0
    else:
        assert not x.is_contiguous()
    grad = VIEWS[view](random_input((6, 257), device, dtype, seed=4, scale=1.0))
    y_ref, g_ref = reference_with_grad(x, 1.702, grad)
    y, g = op_with_grad(x, 1.702, grad)
    tol = tolerance(OP, dtype)
    assert_close(y, y_ref, tol, f"{view} forward")
    assert_close(g, g_ref, tol, f"{view} backward")


@pytest.mark.parametrize("device", DEVICES)
def test_default_beta_is_silu(ext, device):
    x = torch.randn(1000).to(device)
    torch.testing.assert_close(torch.ops.myops.swish(x), torch.nn.functional.silu(x), **FP32)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(ext, device):
    x = torch.randn(5, 9).to(device)
    torch.library.opcheck(torch.ops.myops.swish.default, (x, 1.702))
    torch.library.opcheck(torch.ops.myops.swish.default, (x.clone().requires_grad_(True), 0.5))
    torch.library.opcheck(torch.ops.myops.swish_backward.default,
                          (torch.randn(5, 9).to(device), torch.randn(5, 9).to(device), -0.3))


# ---------------------------------------------------------------- CUDA only

def grid_stride_size(itemsize: int) -> int:
    """Elements for which both grid-stride loops of the elementwise launcher go round at least twice:
    the vector loop (16-byte packs, aligned) and the scalar loop (the same tensor from offset 1), from
    the launcher's own constants (kernels/elementwise_cuda.cuh, cuda_storage.cuh)."""
    from bench.gpu.kernels import launch_limits

    threads, blocks, vec_bytes = launch_limits()
    return 2 * threads * blocks * (vec_bytes // itemsize) + 5


def test_grid_stride_size_leaves_the_first_grid():
    from bench.gpu.kernels import launch_limits

    assert launch_limits() == (256, 65535, 16)
    grid = 256 * 65535
    assert grid_stride_size(4) // 4 >= 2 * grid and grid_stride_size(2) // 8 >= 2 * grid


@pytest.mark.parametrize("dtype", CUDA_DTYPES)
def test_beyond_one_grid(ext, dtype):
    """Tensors beyond one grid: the vector path's stride loop, then (offset 1) the scalar path's."""
    torch_dtype = getattr(torch, dtype)
    n = grid_stride_size(torch.empty((), dtype=torch_dtype).element_size())
    generator = torch.Generator(device="cuda").manual_seed(1)
    x = (torch.randn(n, generator=generator, device="cuda") * 4).to(torch_dtype)
    grad = torch.randn(n, generator=generator, device="cuda").to(torch_dtype)
    for name, view in (("aligned", lambda t: t), ("unaligned (offset 1)", lambda t: t[1:])):
        xv, gv = view(x), view(grad)
        y = torch.ops.myops.swish(xv, 0.5)
        dx = torch.ops.myops.swish_backward(gv, xv, 0.5)
        y_ref, dx_ref = reference_with_grad(xv, 0.5, gv)
        assert_close(y, y_ref, tolerance(OP, dtype), f"{name} forward n={xv.numel()}")
        assert_close(dx, dx_ref, tolerance(OP, dtype), f"{name} backward n={xv.numel()}")
        del y, dx, y_ref, dx_ref


def keep_stream_busy() -> None:
    """About 0.1 s of GPU work on the current stream, so that anything queued behind it waits visibly."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(200_000_000)  # clock cycles: ~0.1 s at 2 GHz
        return
    a = torch.rand(4096, 4096, device="cuda")
    for _ in range(40):
        torch.mm(a, a)


@pytest.mark.parametrize("dtype", CUDA_DTYPES[:1])
def test_the_op_runs_on_the_current_stream(ext, dtype):
    """Queued on a side stream behind a busy kernel and the copy that fills x, the op sees the filled
    x. Launched on the default stream instead, it would read the zeros (PyTorch's side streams do not
    synchronise with the default stream)."""
    n, beta = 1 << 22, 1.702
    generator = torch.Generator(device="cuda").manual_seed(2)
    source = torch.randn(n, generator=generator, device="cuda") * 4
    grad = torch.randn(n, generator=generator, device="cuda")
    y_ref, dx_ref = reference_with_grad(source, beta, grad)
    x = torch.zeros_like(source)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        keep_stream_busy()
        x.copy_(source)
        xo = x.detach().requires_grad_(True)
        y = torch.ops.myops.swish(xo, beta)
        (dx,) = torch.autograd.grad(y, xo, grad)  # autograd runs the backward on the forward's stream
        busy = not side.query()
    side.synchronize()
    torch.cuda.synchronize()
    assert busy, "inconclusive: the side stream was idle before the check could look (delay too short)"
    assert_close(y.detach(), y_ref, FP32, "forward on a side stream")
    assert_close(dx, dx_ref, FP32, "backward on a side stream")


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA_MARKS)])
def test_float64_on_cuda_is_refused_by_name(ext, device):
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        torch.ops.myops.swish(torch.ones(4, device=device, dtype=torch.float64), 1.0)


# ---------------------------------------------------------------- the CPU build

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.complex64])
def test_unsupported_dtype_is_named_on_the_cpu(ext, dtype):
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


def test_second_derivatives_pass_gradgradcheck_in_float64(ext):
    """create_graph=True differentiates myops::swish_backward: it has autograd of its own (the composite's
    second derivative), so no "autograd kernel was not registered" warning and no wrong number."""
    import warnings

    x = torch.randn(3, 11, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for beta in BETAS:
            assert torch.autograd.gradgradcheck(lambda t: ext.swish(t, beta), (x,))
    if hasattr(torch.library, "opcheck"):  # the backward op's fake and autograd, as torch checks an op's
        torch.library.opcheck(torch.ops.myops.swish_backward.default,
                              (torch.randn(3, 11, requires_grad=True), torch.randn(3, 11, requires_grad=True), 1.3))


@pytest.mark.parametrize("device", DEVICES)
def test_a_hessian_vector_product_is_the_composites(ext, device):
    """On every device in float32 (CUDA's kernels have no float64), against the composite's in float64."""
    x = (torch.randn(4, 33, generator=torch.Generator().manual_seed(3)) * 3).to(device)
    got = hessian_vector_products(lambda t: ext.swish(t, 1.702), [x])
    want = hessian_vector_products(lambda t: OP.reference(t, 1.702), [x.double()])
    assert_close(got[0], want[0].float(), {"rtol": 1e-4, "atol": 1e-5}, f"Hessian-vector product on {device}")


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
    import psutil

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
# What torch 2.3 lacks. (Its impl_abstract, which ops/adapters.py uses for the fake kernel there, is
# register_fake under its old name; from 2.4 it calls register_fake, so that one stays.)
kept = torch.library.register_autograd
del torch.library.register_autograd
import ops
ops.load()
torch.library.register_autograd = kept  # the ops are registered; torch's own modules (gradgradcheck's) need it
x = torch.randn(257, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(lambda t: torch.ops.myops.swish(t, 1.3), (x,))
ref = x.detach().clone().requires_grad_(True)
(ref * torch.sigmoid(1.3 * ref)).sum().backward()
torch.ops.myops.swish(x, 1.3).sum().backward()
assert torch.allclose(x.grad, ref.grad, rtol=1e-12, atol=1e-12)
assert torch.autograd.gradgradcheck(lambda t: torch.ops.myops.swish(t, 1.3), (x,))  # the backward op's autograd
w = torch.randn(257, dtype=torch.float64, requires_grad=True)  # and RMSNorm's two outputs' autograd
assert torch.autograd.gradgradcheck(lambda a, b: torch.ops.myops.rms_norm(a, b, 1e-3), (x.view(1, 257), w))
y = torch.ops.myops.swish(x)  # beta left at its default
assert torch.allclose(y, x * torch.sigmoid(x)) and y.requires_grad
with torch.device("meta"):
    assert torch.ops.myops.swish(torch.empty(3, 4), 1.0).shape == (3, 4)
print("torch 2.3 fallback: autograd and fake kernel work")
"""


def test_the_torch_2_3_fallback_registers_fake_and_autograd(ext):
    """cuda11.8's torch 2.3 has neither register_fake nor register_autograd: ops/adapters.py then uses
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
