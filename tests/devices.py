"""Where layer 1 runs: on the CPU always, on CUDA where torch sees a GPU (skipped with the reason
elsewhere, or failed where MYOPS_REQUIRE_CUDA=1 says they must run: conftest.py), each device with
the dtypes its kernels take. Tests parametrize over DEVICES or DEVICE_DTYPES; `pytest -m cuda`
selects the CUDA cases (what `python -m bench.gpu_check` runs)."""
from __future__ import annotations

import warnings

import pytest
import torch


def cuda_missing() -> str | None:
    """Why the CUDA cases cannot run here, or None when they can."""
    if torch.version.cuda is None:
        return f"no CUDA: torch {torch.__version__} is a CPU-only build"
    with warnings.catch_warnings():  # a CUDA build without a driver warns; the reason below says it
        warnings.simplefilter("ignore")
        if not torch.cuda.is_available():
            return f"no CUDA device: torch {torch.__version__} sees no GPU (no driver or no device)"
    return None


CUDA_MISSING = cuda_missing()
CUDA_MARKS = (pytest.mark.cuda,)  # conftest.py skips them, or fails them, where CUDA_MISSING says why
DTYPES = {"cpu": ("float32",), "cuda": ("float32", "float16", "bfloat16")}

DEVICES = ["cpu", pytest.param("cuda", marks=CUDA_MARKS)]
DEVICE_DTYPES = [pytest.param(device, dtype, id=f"{device}-{dtype}", marks=CUDA_MARKS if device == "cuda" else ())
                 for device, dtypes in DTYPES.items() for dtype in dtypes]
CUDA_DTYPES = [pytest.param(dtype, id=dtype, marks=CUDA_MARKS) for dtype in DTYPES["cuda"]]


def tolerance(op, dtype: str) -> dict:
    """The op's declared layer-1 tolerance for dtype, as assert_close's keywords."""
    rtol, atol = op.tolerances[dtype]
    return {"rtol": rtol, "atol": atol}


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: dict, what: str = "") -> None:
    """Same dtype, shape and device as want, then close after an exact upcast (the comparison does not
    round); NaN and inf where want has them."""
    assert (got.dtype, got.shape, got.device) == (want.dtype, want.shape, want.device), (
        f"{what}: got {got.dtype} {list(got.shape)} on {got.device}, expected {want.dtype} {list(want.shape)} "
        f"on {want.device}")
    torch.testing.assert_close(got.double(), want.double(), equal_nan=True, msg=lambda m: f"{what}: {m}", **tol)


def hessian_vector_products(function, inputs: list[torch.Tensor], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """d/d(inputs) of <d(<y, u>)/d(inputs), v> for fixed random u and v: what a gradient penalty or a
    Hessian-vector product asks of the op's backward (create_graph=True)."""
    generator = torch.Generator().manual_seed(seed)
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    y = function(*leaves)
    u = torch.randn(y.shape, generator=generator, dtype=torch.float64).to(y)
    firsts = torch.autograd.grad(y, leaves, u, create_graph=True)
    vs = [torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t) for t in leaves]
    return torch.autograd.grad(firsts, leaves, vs)
