"""The training side: myops::swish as a PyTorch C++/CUDA extension op."""
from __future__ import annotations

from .swish import reference, swish

__all__ = ["load", "reference", "swish"]

_loaded_from: str | None = None


def load(verbose: bool = False) -> str:
    """Build if needed, load the library into torch, register fake kernels and autograd."""
    global _loaded_from
    if _loaded_from is None:
        import torch

        from .build import build
        from .swish import register_python_parts

        path = build(verbose=verbose)
        torch.ops.load_library(str(path))
        register_python_parts()
        _loaded_from = str(path)
    return _loaded_from
