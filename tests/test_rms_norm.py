"""RMSNorm's layer 1: the extension against the reference in float64 (rounded once to the dtype),
forward, dx and dw, on every device present (tests/devices.py: the CPU in float32; CUDA in float32,
float16 and bfloat16 where a GPU is), then what only the CPU build has. The plugin, the CPU paths and
the ONNX lowerings are test_rms_norm_plugin.py."""
from __future__ import annotations

import pytest
import torch

from devices import DEVICE_DTYPES, DEVICES, assert_close, hessian_vector_products, tolerance
from ops.registry import OPS

OP = OPS["rms_norm"]
FP32 = tolerance(OP, "float32")  # the op's declared tolerances: opspec/rms_norm.py says why
SHAPES = [(1,), (7,), (4, 16), (3, 5, 37), (2, 33, 768), (0, 8), (5, 1)]
EPS = [1e-6, 1e-5, 0.5]


def reference64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return OP.reference(x.double(), weight.double(), eps)


def inputs(shape, seed=0, scale=3.0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=generator) * scale
    weight = 1.0 + 0.2 * torch.randn(shape[-1], generator=generator)
    return x, weight


def on(device: str, dtype: str, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(device, getattr(torch, dtype)) for t in tensors]


def check_against_float64(x, weight, grad, eps: float, what: str) -> None:
    """Forward, dx and dw of the op and its autograd against float64 autograd rounded once to x's
    dtype, within the declared tolerance plus twice the error of the composite computed in x's dtype
    (where dx's two terms cancel, a row of tiny values has terms 1000 times dx: float32's rounding of
    them is no fault of the kernel's). dw sums over every row: its absolute tolerance grows with the
    square root of the row count (each row's rounding is random)."""
    def autograd_of(function, *tensors):
        leaves = [t.detach().requires_grad_(True) for t in tensors]
        y = function(*leaves)
        return (y.detach(), *torch.autograd.grad(y, leaves, grad.to(y.dtype)))

    got = autograd_of(lambda a, b: torch.ops.myops.rms_norm(a, b, eps), x, weight)
    want = autograd_of(lambda a, b: reference64(a, b, eps), x.double(), weight.double())
    composite = autograd_of(lambda a, b: OP.reference(a, b, eps), x, weight)
    tol = tolerance(OP, str(x.dtype).removeprefix("torch."))
    rows = max(1, x.numel() // max(1, x.shape[-1]))
    for name, g, w, c, atol in zip(("forward", "dx", "dw"), got, want, composite,
                                   (tol["atol"], tol["atol"], tol["atol"] * rows ** 0.5)):
        w = w.to(x.dtype)
        assert (g.dtype, g.shape, g.device) == (w.dtype, w.shape, w.device), f"{name} {what}: {g.dtype} {g.shape} {g.device}"
        allowed = atol + tol["rtol"] * w.double().abs() + 2 * (c.double() - w.double()).abs()
        excess = (g.double() - w.double()).abs() - allowed
        off = ~((excess <= 0) | (g == w) | (g.isnan() & w.isnan()))  # NaN and inf where want has them
        assert not off.any(), (
            f"{name} {what}: {int(off.sum())} of {g.numel()} elements off by more than the declared tolerance "
            f"and twice the {x.dtype} composite's own error; worst {excess[off].max().item():.3g} over")


# ---------------------------------------------------------------- layer 1 on every device

@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("eps", EPS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_and_backward_match_the_reference(ext, device, dtype, shape, eps):
    x, weight = inputs(shape)
    grad = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    check_against_float64(*on(device, dtype, x, weight, grad), eps, f"{shape} eps {eps}")


def kernel_edge_shapes() -> list[tuple[int, int]]:
    """(rows, cols) on the CUDA kernels' edges, from their own constants (bench/gpu/kernels.py): the
    weight gradient's chunks one row short, exact and over, many, and more than the chunk cap holds
    (the last chunk takes the rest); widths below, at and beyond a warp and a block; and the packed
    kernels (rows of whole 16-byte packs held in registers), for float32's 4-element packs: the most
    packs a row may have, and one pack more (the scalar kernel then), rows whose last pass leaves
    threads idle (275 and 550 packs of float32; 275 of float16 at 2200), and more rows than one grid."""
    from bench.gpu.kernels import rms_norm_chunking, rms_norm_packing

    chunk, max_chunks = rms_norm_chunking()
    aim, max_threads, max_packs = rms_norm_packing()
    rows = [(1, 768), (chunk - 1, 768), (chunk, 768), (chunk + 1, 768), (64 * chunk + 1, 768)]
    widths = [(chunk + 1, 1), (chunk + 1, 33), (3, 1023), (5, 4096), (2, 8193)]
    most = 4 * max_threads * max_packs  # float32 columns in the most packs a packed row holds
    packed = [(3, most), (3, most + 4), (3, 4 * (aim + 19)), (3, 8 * (aim + 19)), (70_000, 8)]
    return rows + widths + packed + [(chunk * max_chunks + 3, 2)]


def test_kernel_edge_shapes_follow_the_kernel():
    from bench.gpu.kernels import rms_norm_chunking, rms_norm_packing

    chunk, max_chunks = rms_norm_chunking()
    assert {1, chunk - 1, chunk, chunk + 1, 64 * chunk + 1, chunk * max_chunks + 3} <= \
        {rows for rows, _ in kernel_edge_shapes()}
    aim, max_threads, max_packs = rms_norm_packing()
    assert (3, 4 * max_threads * max_packs) in kernel_edge_shapes() and aim <= max_threads


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("eps", [1e-6, 1e-3])
@pytest.mark.parametrize("shape", kernel_edge_shapes(), ids=lambda s: f"{s[0]}x{s[1]}")
def test_kernel_edges(ext, device, dtype, shape, eps):
    generator = torch.Generator().manual_seed(4)
    rows, cols = shape
    x = torch.randn(rows, cols, generator=generator) * 3
    weight = 1 + 0.1 * torch.randn(cols, generator=generator)
    grad = torch.randn(rows, cols, generator=generator)
    check_against_float64(*on(device, dtype, x, weight, grad), eps, f"{rows}x{cols} eps {eps}")


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_unaligned_rows_of_whole_packs(ext, device, dtype):
    """x and weight from storage offset 1: contiguous, whole 16-byte packs per row, but not aligned to
    16 bytes, which the packed kernels need (the scalar ones take them)."""
    rows, cols = 5, 768
    generator = torch.Generator().manual_seed(6)
    flat_x = torch.randn(rows * cols + 1, generator=generator) * 3
    flat_w = 1 + 0.1 * torch.randn(cols + 1, generator=generator)
    flat_x, flat_w = on(device, dtype, flat_x, flat_w)
    x, weight = flat_x[1:].view(rows, cols), flat_w[1:]
    assert x.is_contiguous() and x.data_ptr() % 16 != 0 and weight.data_ptr() % 16 != 0
    grad = on(device, dtype, torch.randn(rows, cols, generator=generator))[0]
    check_against_float64(x, weight, grad, 1e-6, "from storage offset 1")


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_a_row_of_zeros_gives_zeros(ext, device, dtype):
    """eps keeps the root finite: zeros in, zeros out, and no NaN in dx or dw."""
    x, weight = on(device, dtype, *inputs((3, 768)))
    x[0] = 0
    x[2] = 0
    xo, wo = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    y = torch.ops.myops.rms_norm(xo, wo, 1e-6)
    dx, dw = torch.autograd.grad(y, (xo, wo), torch.ones_like(y))
    assert (y[0] == 0).all() and (y[2] == 0).all()
    assert all(torch.isfinite(t).all() for t in (y, dx, dw))


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_non_contiguous_inputs(ext, device, dtype):
    """A column-major x and a strided weight give the contiguous inputs' bits."""
    x, weight = on(device, dtype, *inputs((6, 40)))
    view = x.t().contiguous().t()
    wide = torch.zeros(80, device=device, dtype=x.dtype)
    wide[::2] = weight
    torch.testing.assert_close(torch.ops.myops.rms_norm(view, wide[::2], 1e-6),
                               torch.ops.myops.rms_norm(x, weight, 1e-6), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(ext, device):
    x, weight = on(device, "float32", *inputs((5, 24)))
    torch.library.opcheck(torch.ops.myops.rms_norm.default, (x, weight, 1e-6))
    torch.library.opcheck(torch.ops.myops.rms_norm.default,
                          (x.clone().requires_grad_(True), weight.clone().requires_grad_(True), 1e-5))
    grad, x2 = on(device, "float32", torch.randn(5, 24), torch.randn(5, 24))
    torch.library.opcheck(torch.ops.myops.rms_norm_backward.default, (grad, x2, weight, 1e-6))


# ---------------------------------------------------------------- the CPU build

def test_default_eps_is_1e_6(ext):
    schema = torch.ops.myops.rms_norm.default._schema
    assert [(a.name, str(a.type)) for a in schema.arguments] == [("x", "Tensor"), ("weight", "Tensor"), ("eps", "float")]
    assert schema.arguments[2].default_value == 1e-6, str(schema)
    x, weight = inputs((4, 32), scale=1e-3)  # small values: eps matters
    torch.testing.assert_close(ext.rms_norm(x, weight), reference64(x, weight, 1e-6).float(), **FP32)


def test_gradcheck_float64(ext):
    x, weight = inputs((3, 4, 9))
    assert torch.autograd.gradcheck(lambda a, b: ext.rms_norm(a, b, 1e-3),
                                    (x.double().requires_grad_(), weight.double().requires_grad_()))


def test_second_derivatives_pass_gradgradcheck_in_float64(ext):
    """create_graph=True differentiates myops::rms_norm_backward (both gradients): it has autograd of its
    own, the composite's second derivatives; before, x's differed by up to 16 with only a warning."""
    import warnings

    x, weight = inputs((3, 4, 9))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.autograd.gradgradcheck(lambda a, b: ext.rms_norm(a, b, 1e-3),
                                            (x.double().requires_grad_(), weight.double().requires_grad_()))
    if hasattr(torch.library, "opcheck"):  # the backward op's fake and autograd, as torch checks an op's
        torch.library.opcheck(torch.ops.myops.rms_norm_backward.default,
                              (torch.randn(3, 4, 9, requires_grad=True), x.clone().requires_grad_(),
                               weight.clone().requires_grad_(), 1e-3))


@pytest.mark.parametrize("device", DEVICES)
def test_a_hessian_vector_product_is_the_composites(ext, device):
    """On every device in float32 (CUDA's kernels have no float64), against the composite's in float64."""
    x, weight = inputs((5, 64), seed=4)
    got = hessian_vector_products(lambda a, b: ext.rms_norm(a, b, 1e-6), [x.to(device), weight.to(device)])
    want = hessian_vector_products(lambda a, b: reference64(a, b, 1e-6), [x.double(), weight.double()])
    for name, g, w in zip(("x", "weight"), got, want):
        assert_close(g.cpu(), w.float(), {"rtol": 1e-4, "atol": 1e-4}, f"Hessian-vector product of {name} on {device}")


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(ext, backend):
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: ext.rms_norm(a, b, 1e-5) * 2.0, fullgraph=True, backend=backend, dynamic=True)
    x, weight = inputs((4, 9, 48))
    xo, wo = x.clone().requires_grad_(), weight.clone().requires_grad_()
    compiled(xo, wo).sum().backward()
    xr, wr = x.clone().requires_grad_(), weight.clone().requires_grad_()
    (ext.rms_norm(xr, wr, 1e-5) * 2.0).sum().backward()
    torch.testing.assert_close(xo.grad, xr.grad)
    torch.testing.assert_close(wo.grad, wr.grad)


def test_torch_export_keeps_the_op_with_dynamic_batch_and_seq(ext):
    from ops.export import build_model

    model = build_model("rms_norm", hidden=32)
    program = torch.export.export(model, (torch.randn(2, 3, 32),),
                                  dynamic_shapes={"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}})
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert "myops.rms_norm.default" in targets, targets
    x = torch.randn(5, 11, 32)
    torch.testing.assert_close(program.module()(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize("make_args,message", [
    (lambda: (torch.randn(2, 8), torch.randn(7)), r"weight must have shape \[x.shape\[-1\]\] = \[8\]"),
    (lambda: (torch.randn(2, 8), torch.randn(8, dtype=torch.float64)), "weight must have x's dtype torch.float32"),
    (lambda: (torch.randn(2, 8).half(), torch.randn(8).half()), "must be float32 on CPU"),
    (lambda: (torch.tensor(1.0), torch.randn(1)), "at least one dimension"),
    # a meta tensor among CPU ones: the fake kernel runs, and refuses it as F.rms_norm does
    (lambda: (torch.full((2, 4), 3.0), torch.empty(4, device="meta")), "weight must be on x's device cpu; got meta"),
    (lambda: (torch.empty(2, 4, device="meta"), torch.ones(4)), "weight must be on x's device meta; got cpu"),
])
def test_bad_inputs_are_named(ext, make_args, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.myops.rms_norm(*make_args(), 1e-6)


def test_weight_gradient_does_not_depend_on_the_thread_count(ext):
    x, weight = inputs((257, 384))
    grad = torch.randn(257, 384, generator=torch.Generator().manual_seed(3))
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, max(2, before)):
            torch.set_num_threads(threads)
            results.append(torch.ops.myops.rms_norm_backward(grad, x, weight, 1e-6))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


