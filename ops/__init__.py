"""The training side: the myops ops (swish, rms_norm) as PyTorch C++/CUDA extension ops."""
from __future__ import annotations

from . import rms_norm as _rms_norm_module
from . import swish as _swish_module
from .rms_norm import rms_norm
from .swish import reference, swish

__all__ = ["load", "reference", "rms_norm", "swish"]

# Each op module's fakes and autograd, registered after the library is loaded.
_PYTHON_PARTS = (_swish_module, _rms_norm_module)

_loaded_from: str | None = None


def load(verbose: bool = False) -> str:
    """Build if needed, load the library into torch, register fake kernels and autograd."""
    global _loaded_from
    if _loaded_from is None:
        import torch

        from .build import build

        path = build(verbose=verbose)
        torch.ops.load_library(str(path))
        for module in _PYTHON_PARTS:
            module.register_python_parts()
        _loaded_from = str(path)
    return _loaded_from
