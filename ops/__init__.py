"""The training side: the myops ops as PyTorch C++/CUDA extension ops, one declaration each
(ops/<name>.py, collected in ops.registry.OPS)."""
from __future__ import annotations

from .registry import OPS
from .rms_norm import rms_norm
from .swish import reference, swish

__all__ = ["OPS", "load", "reference", "rms_norm", "swish"]

_loaded_from: str | None = None


def load(verbose: bool = False) -> str:
    """Build if needed, load the library into torch, register every op's fakes and autograd."""
    global _loaded_from
    if _loaded_from is None:
        import torch

        from .build import build

        path = build(verbose=verbose)
        torch.ops.load_library(str(path))
        for op in OPS.values():
            op.register_python_parts()
        _loaded_from = str(path)
    return _loaded_from
