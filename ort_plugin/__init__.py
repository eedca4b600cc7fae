"""The inference side: the myops ONNX Runtime plugin and its Python loader. Never imports torch."""
from __future__ import annotations

from .loader import PluginError, default_library, make_session, register

__all__ = ["PluginError", "default_library", "make_session", "register"]
