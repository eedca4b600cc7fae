"""Every op's torch side, collected: OPS maps each op of the opspec catalogue (plugin-only ones aside)
to the `OP = TorchOp(...)` its ops/<name>.py declares (see ops.declaration), or, for an op without one,
the TorchOp its declaration makes (TorchOp.declared). Export, artifacts,
the bench, the doctor and the nox sessions loop over it; adding an op edits none of them.
"""
from __future__ import annotations

import importlib
import importlib.util

from opspec import TORCH_OPS

from .declaration import TorchOp


def _load() -> dict[str, TorchOp]:
    found = {}
    for name, spec in TORCH_OPS.items():
        if importlib.util.find_spec(f"{__package__}.{name}") is None:
            found[name] = TorchOp.declared(spec)  # an op that is its declaration and its math alone
            continue
        module = importlib.import_module(f"{__package__}.{name}")
        op = getattr(module, "OP", None)
        if not isinstance(op, TorchOp) or op.name != name:
            raise ImportError(f"ops/{name}.py must declare OP = TorchOp(spec=opspec.OPS[{name!r}], ...)")
        found[name] = op
    return found


def _model_ops(ops: dict[str, TorchOp]) -> dict[str, str]:
    found = {}
    for op in ops.values():
        for model in op.models:
            if model in found:
                raise ImportError(f"the model {model!r} is declared by ops/{found[model]}.py and ops/{op.name}.py: rename one")
            found[model] = op.name
    return found


OPS: dict[str, TorchOp] = _load()
MODEL_OP = _model_ops(OPS)
