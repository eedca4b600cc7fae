"""The myops ops for PyTorch, installed as a package: importing it loads the compiled ops into
torch.ops.myops and registers their fakes (torch.compile, torch.export) and autograd.

    import torch, myops_torch
    y = torch.ops.myops.swish(x)          # or myops_torch.swish(x)
    myops_torch.apply(model)              # swap the ops into a model's modules (see ops.patch)
    myops_torch.export_model(model, (x,), "model.onnx")  # needs onnx and onnxscript

The compiled library follows torch's C++ ABI, which changes with every release: the wheel is built for
one torch (its version's local label says which) and refuses any other with a message, not a crash.
"""
from __future__ import annotations

import json
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# What the library was built against (written by lab/dist.py when the wheel was built).
BUILD: dict = json.loads((_HERE / "build.json").read_text())
__version__: str = BUILD["version"]


class TorchMismatch(ImportError):
    """The installed torch is not the release this wheel's library was compiled for."""


def _device(cuda: str | None) -> str:
    return f"CUDA {cuda}" if cuda else "CPU"


def check_torch(version: str, cuda: str | None) -> None:
    """Raise TorchMismatch unless torch `version` (CUDA `cuda`) can load this build."""
    built = f"torch {BUILD['torch']} ({_device(BUILD['torch_cuda'])})"
    if version.split("+")[0] != BUILD["torch"]:
        raise TorchMismatch(
            f"myops-torch {__version__} was compiled for {built}, but this environment has torch {version}: "
            f"the library would not load (torch's C++ ABI changes with every release). Install "
            f"torch=={BUILD['torch']}, or build the wheel for your torch with `nox -s wheels -- ENTRY` from an entry "
            "that pins it")
    if BUILD["torch_cuda"] and (cuda or "").split(".")[0] != BUILD["torch_cuda"].split(".")[0]:
        raise TorchMismatch(f"myops-torch {__version__} was compiled for {built}, but this torch is a "
                            f"{_device(cuda)} build: install the torch build for CUDA {BUILD['torch_cuda']}")


def _load() -> str:
    import torch

    check_torch(torch.__version__, torch.version.cuda)
    found = sorted(_HERE.glob("_myops*.so"))
    if not found:
        raise ImportError(f"{_HERE} holds no compiled library (_myops*.so): the installation is damaged; reinstall "
                          "the wheel")
    torch.ops.load_library(str(found[0]))
    return str(found[0])


_LIBRARY = _load()

from . import ops as _ops  # noqa: E402  (after the library: the declarations look its ops up)

_ops._loaded_from = _LIBRARY  # ops.load() then reports this library instead of building one
for _op in _ops.OPS.values():
    _op.register_python_parts()

# the same names as the checkout's `ops` package: OPS, apply, export_model, load, and each op's function
__all__ = ["BUILD", "TorchMismatch", "check_torch", *_ops.__all__]
globals().update({name: getattr(_ops, name) for name in _ops.__all__})
