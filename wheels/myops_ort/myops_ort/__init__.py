"""The myops custom-op library for ONNX Runtime, installed as a package (no torch).

    import onnxruntime, myops_ort
    options = onnxruntime.SessionOptions()
    myops_ort.register(options)   # or options.register_custom_ops_library(myops_ort.get_library_path())
    session = onnxruntime.InferenceSession("model.onnx", options)

myops_ort.opspec is the op catalogue (names, inputs, attributes) for probes that build their own feeds.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from . import opspec

__all__ = ["BUILD", "OnnxRuntimeMismatch", "check_onnxruntime", "get_library_path", "opspec", "register"]

_HERE = Path(__file__).resolve().parent
LIBRARY_NAME = "libmyops_ort.so"
# What the library was built against (written by lab/dist.py when the wheel was built).
BUILD: dict = json.loads((_HERE / "build.json").read_text())
__version__: str = BUILD["version"]


class OnnxRuntimeMismatch(RuntimeError):
    """The installed onnxruntime cannot load this build of the library."""


def get_library_path() -> str:
    """The path of the custom-op library, for SessionOptions.register_custom_ops_library."""
    path = _HERE / LIBRARY_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the myops-ort installation is damaged; reinstall its wheel")
    return str(path)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def check_onnxruntime(version: str | None = None) -> str:
    """Refuse an onnxruntime older than the headers the library was compiled with: its C API is
    append-only, so newer releases load the library and older ones cannot. Returns the version seen."""
    if version is None:
        try:
            import onnxruntime
        except ImportError as exc:
            raise OnnxRuntimeMismatch("onnxruntime is not installed: pip install onnxruntime (or onnxruntime-gpu) "
                                      f"{BUILD['ort_headers']} or newer") from exc
        version = onnxruntime.__version__
    if _release(version) < _release(BUILD["ort_headers"]):
        raise OnnxRuntimeMismatch(
            f"myops-ort {__version__} was compiled against the ONNX Runtime {BUILD['ort_headers']} C API; "
            f"onnxruntime {version} is older and cannot load it: upgrade onnxruntime to {BUILD['ort_headers']} "
            "or newer")
    return version


def register(session_options):
    """Register every myops op with these SessionOptions (after checking onnxruntime); returns them."""
    check_onnxruntime()
    session_options.register_custom_ops_library(get_library_path())
    return session_options
