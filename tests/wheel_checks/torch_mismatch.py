"""Run in the venv of torch_layer1.py: a torch of another release must be refused on import with
one message (torch.__version__ is set to another release before the import).   python -I torch_mismatch.py"""
import json

import torch

torch.__version__ = "2.12.1"
try:
    import myops_torch  # noqa: F401
except ImportError as exc:
    print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
else:
    raise AssertionError("myops_torch imported into another torch release")
