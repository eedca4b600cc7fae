"""Python side of myops::rms_norm: the public function and what ops.apply swaps for it. Its reference and
ONNX parts are its declared form's (ops/onnx_parts.py), its fakes and autograd the rowwise kind's
(ops/adapters.py).

Gradients flow to x and weight; eps is a float attribute of the op (as epsilon is in ONNX).
"""
from __future__ import annotations

import torch

from opspec import OPS

from .declaration import Offset, Refused, TorchOp


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x * rsqrt(mean(x^2, -1) + eps) * weight as one fused op."""
    return torch.ops.myops.rms_norm(x, weight, eps)


# ---------------------------------------------------------------- what ops.apply swaps

# Hugging Face's RMSNorms that compute x * rsqrt(mean(x^2) + eps) * weight in float32 (transformers 4.x
# and 5.x): the weight as it is, eps added inside the root. Held here by import path only.
HF_RMS_NORMS = tuple(f"transformers.models.{family}.modeling_{family}.{name}RMSNorm" for family, name in (
    ("llama", "Llama"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3"), ("mistral", "Mistral"), ("mixtral", "Mixtral"),
    ("phi3", "Phi3"), ("olmo2", "Olmo2"), ("granite", "Granite")))
# Gemma's scale by (1 + weight), its weight starting at zero, eps in `eps`: myops::rms_norm with the
# scale 1 + weight, added in the swapped module's forward (ops.declaration.Offset).
GEMMA_RMS_NORMS = tuple(f"transformers.models.{family}.modeling_{family}.{name}RMSNorm"
                        for family, name in (("gemma", "Gemma"), ("gemma2", "Gemma2"), ("gemma3", "Gemma3")))
# myops::rms_norm's kernels: float32 on the CPU; float32, float16 and bfloat16 on CUDA.
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _weight_of(module: torch.nn.Module) -> torch.Tensor:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        raise Refused(f"its weight is {None if weight is None else list(weight.shape)}, not one scale per channel")
    if weight.dtype not in KERNEL_DTYPES:
        raise Refused(f"its weight is {weight.dtype}: myops::rms_norm's kernels take float32 (and float16, bfloat16 "
                      "on CUDA); a float64 path would lose precision silently")
    return weight


def _bind_hf(module: torch.nn.Module) -> tuple[tuple, dict]:
    eps = getattr(module, "variance_epsilon", None)
    if not isinstance(eps, float):
        raise Refused(f"its epsilon (variance_epsilon) is {eps!r}, not a float")
    return (_weight_of(module),), {"eps": eps}


def _bind_gemma(module: torch.nn.Module) -> tuple[tuple, dict]:
    eps = getattr(module, "eps", None)
    if not isinstance(eps, float):
        raise Refused(f"its epsilon (eps) is {eps!r}, not a float")
    weight = _weight_of(module)
    if weight.dtype != torch.float32:  # Gemma adds the 1 in float32; in 16 bits 1 + w loses w's low bits
        raise Refused(f"its weight is {weight.dtype}: Gemma scales by 1 + weight in float32, and 1 + weight in "
                      f"{weight.dtype} would round a small weight away; swap it in float32")
    return (Offset(weight, 1.0),), {"eps": eps}


def _bind_torch(module: torch.nn.Module) -> tuple[tuple, dict]:
    """torch.nn.RMSNorm: one normalised dimension; eps=None means float32's machine epsilon for a float32 input."""
    if len(module.normalized_shape) != 1:
        raise Refused(f"it normalises over the last {len(module.normalized_shape)} dimensions "
                      f"{list(module.normalized_shape)}; myops::rms_norm over the last one")
    if module.weight is None:
        if module.eps is None:
            raise Refused("eps=None follows the input's dtype, which is not known before the call and it has no "
                          "weight to tell; give it an eps")
        weight = torch.ones(module.normalized_shape)  # Fused moves it to each input's device and dtype
    else:
        weight = _weight_of(module)
    if module.eps is None and weight.dtype != torch.float32:
        raise Refused(f"eps=None follows the input's dtype ({weight.dtype} here); give it an eps")
    return (weight,), {"eps": module.eps if module.eps is not None else torch.finfo(torch.float32).eps}


def _native(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, weight.shape, weight, eps)


OP = TorchOp(
    spec=OPS["rms_norm"],
    function=rms_norm,
    weights=("weight",),
    native=_native,
    native_text="F.rms_norm",
    native_applies=lambda attributes: hasattr(torch.nn.functional, "rms_norm"),  # torch >= 2.4
    artifact_seeds={"rms_norm": 303},
    replaces={**{path: _bind_hf for path in HF_RMS_NORMS}, **{path: _bind_gemma for path in GEMMA_RMS_NORMS},
              "torch.nn.modules.normalization.RMSNorm": _bind_torch},
    looks_like=("RMSNorm",),
)
reference = OP.reference  # x/Sqrt(mean(x^2)+epsilon)*scale in float32 or wider: layer 1's ground truth
