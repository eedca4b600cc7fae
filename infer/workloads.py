"""The benchmark workloads and the facts about them that need no framework (no torch here)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BYTES_FP32 = 4


@dataclass(frozen=True)
class Workload:
    name: str            # "swish" (the activation alone), "swish_large", "ffn" (Linear, Swish, Linear), "rms_norm"...
    batch: int = 8
    seq: int = 512
    hidden: int = 768
    model: str = ""      # which exported model runs it (batch and sequence are dynamic); default: name
    op: str = "swish"    # the myops op it times (opspec.OPS)

    @property
    def model_name(self) -> str:
        return self.model or self.name

    @property
    def op_alone(self) -> bool:
        """The op and nothing else (no Linear layers): the workloads with copy floors."""
        return self.model_name != "ffn"

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.batch, self.seq, self.hidden)

    @property
    def elements(self) -> int:
        return self.batch * self.seq * self.hidden

    @property
    def bytes_moved(self) -> int:
        """The least traffic the workload needs with a fused activation (read once, write once).

        swish: x in, y out. rms_norm: x in, y out, the scale once. ffn: x and W1 in, h out; h in, a
        out (the fused activation); a and W2 in, y out. Biases are negligible and left out.
        """
        if self.model_name == "swish":
            return 2 * self.elements * BYTES_FP32
        if self.model_name == "rms_norm":
            return (2 * self.elements + self.hidden) * BYTES_FP32
        inner = self.batch * self.seq * 4 * self.hidden
        weights = 2 * self.hidden * 4 * self.hidden
        return (2 * self.elements + 4 * inner + weights) * BYTES_FP32

    def input(self, seed: int = 0) -> np.ndarray:
        return np.random.default_rng(seed).standard_normal(self.shape, dtype=np.float32)


# swish_large: 403 MB in and out in float32, far beyond any GPU's L2 (50 MB on an H100/H200), so the
# copy floor is DRAM bandwidth; the small swish fits in L2 there. GPU rows only.
WORKLOADS = {"swish": Workload("swish"), "swish_large": Workload("swish_large", batch=64, seq=2048, model="swish"),
             "ffn": Workload("ffn"),
             "rms_norm": Workload("rms_norm", op="rms_norm"),
             "rms_norm_4096": Workload("rms_norm_4096", hidden=4096, model="rms_norm", op="rms_norm")}
# The row of each op's own PyTorch function (F.silu is Swish at beta 1, F.rms_norm RMSNorm), which the
# extension must beat.
NATIVE_ROWS = {"swish": "torch_silu", "rms_norm": "torch_rms_norm"}
GPU_ONLY_WORKLOADS = ("swish_large",)


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    p20, p50, p80 = np.percentile(np.asarray(seconds) * 1e3, [20, 50, 80])
    return {"p20_ms": round(float(p20), 4), "p50_ms": round(float(p50), 4), "p80_ms": round(float(p80), 4)}
