"""Every op's torch side, collected: OPS maps each op of the opspec catalogue (plugin-only ones aside)
to the TorchOp its declaration makes (TorchOp.declared). Export, artifacts, the bench, the doctor and the
nox sessions loop over it; adding an op edits none of them.
"""
from __future__ import annotations

from opspec import TORCH_OPS

from .declaration import TorchOp


def _load() -> dict[str, TorchOp]:
    return {name: TorchOp.declared(spec) for name, spec in TORCH_OPS.items()}


def _model_ops(ops: dict[str, TorchOp]) -> dict[str, str]:
    found = {}
    for op in ops.values():
        for model in op.models:
            if model in found:
                raise ImportError(f"the model {model!r} is declared by opspec/{found[model]}.py and opspec/{op.name}.py: "
                                  "rename one")
            found[model] = op.name
    return found


OPS: dict[str, TorchOp] = _load()
MODEL_OP = _model_ops(OPS)
