"""Python side of myops::swish: the public function, the models that hold it and what ops.apply swaps
for it. Its reference and ONNX parts are its declared form's (ops/onnx_parts.py), its fakes and autograd
the elementwise kind's (ops/adapters.py).

Gradients flow to x only: beta is a float attribute of the op (as it is in ONNX), not a tensor.
"""
from __future__ import annotations

import torch

from opspec import OPS

from .declaration import TorchOp


def swish(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """y = x * sigmoid(beta * x) as one fused op."""
    return torch.ops.myops.swish(x, beta)


class SwishFFN(torch.nn.Module):
    """Transformer feed-forward block: Linear(h -> 4h), Swish, Linear(4h -> h)."""

    def __init__(self, hidden: int, function, attributes: dict):
        super().__init__()
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)
        self.beta = attributes["beta"]
        self.activation = function

    def forward(self, x):
        return self.down(self.activation(self.up(x), self.beta))


# ---------------------------------------------------------------- what ops.apply swaps

def _fixed_beta(beta: float):
    """A module whose forward is x * sigmoid(beta * x) with this constant beta (it has no state)."""
    def bind(module: torch.nn.Module) -> tuple[tuple, dict]:
        return (), {"beta": beta}
    return bind


# Modules by import path (transformers' are only named, never imported, here). QuickGELU is Swish with
# beta 1.702: `input * torch.sigmoid(1.702 * input)` in transformers 4.x and 5.x.
REPLACES = {
    "torch.nn.modules.activation.SiLU": _fixed_beta(1.0),
    "transformers.activations.SiLUActivation": _fixed_beta(1.0),    # ACT2FN["silu"] in transformers 5
    "transformers.activations.QuickGELUActivation": _fixed_beta(1.702),
}
REPLACES_FUNCTIONS = {"torch.nn.functional.silu": {"beta": 1.0}}


OP = TorchOp(
    spec=OPS["swish"],
    function=swish,
    native=lambda x, beta: torch.nn.functional.silu(x),
    native_text="F.silu",
    native_applies=lambda attributes: attributes["beta"] == 1.0,  # F.silu is Swish at beta 1 only
    extra_models={"ffn": SwishFFN},
    replaces=REPLACES,
    replaces_functions=REPLACES_FUNCTIONS,
    looks_like=("SiLU", "Swish"),
    artifact_seeds={"swish": 101, "ffn": 202},
    artifact_attributes={"swish": {"beta": 1.702}},
)
reference = OP.reference  # x*Sigmoid(x*beta) in x's dtype: alignment layer 1's ground truth
