"""The training side: the myops ops as PyTorch C++/CUDA extension ops, one declaration each
(opspec/<name>.py, made torch ops in ops.registry.OPS)."""
from __future__ import annotations

from opspec import PRIMARY

from .patch import apply
from .registry import OPS

# each op's function by its name (ops.swish, ops.rms_norm ...), and the first op's reference
globals().update({name: op.function for name, op in OPS.items()})
reference = OPS[PRIMARY].reference

__all__ = ["OPS", "apply", "export_model", "load", "reference", *OPS]


def export_model(*args, **kwargs):
    """ops.model_export.export_model (imported on first use: it needs onnx, which training code may lack)."""
    from .model_export import export_model as export

    return export(*args, **kwargs)

_loaded_from: str | None = None


def load(verbose: bool = False) -> str:
    """Build if needed, load the library into torch, register every op's fakes and autograd.

    MYOPS_EXTENSION_LIBRARY names a library built elsewhere (bench.gpu_check's build without ninja
    hands its own to the tests it runs) to load instead of building."""
    global _loaded_from
    if _loaded_from is None:
        import os
        from pathlib import Path

        import torch

        from .build import build

        prebuilt = os.environ.get("MYOPS_EXTENSION_LIBRARY")
        if prebuilt and not Path(prebuilt).is_file():
            raise FileNotFoundError(f"MYOPS_EXTENSION_LIBRARY={prebuilt}: no such file (unset it to build the "
                                    "extension from this checkout)")
        path = Path(prebuilt) if prebuilt else build(verbose=verbose)
        torch.ops.load_library(str(path))
        for op in OPS.values():
            op.register_python_parts()
        _loaded_from = str(path)
    return _loaded_from
