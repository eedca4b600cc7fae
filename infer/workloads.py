"""The benchmark workloads and the facts about them that need no framework (no torch here)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opspec import OPS, TORCH_OPS, model_inputs

BYTES_FP32 = 4
# The copy floor's rows, timed like the op: x copied, whatever the op takes; the fastest of a framework's
# copies (same workload, provider, opset) is its floor.
COPY_ROWS = ("torch_copy", "torch_copy_into", "ort_copy", "ort_plugin_copy")


@dataclass(frozen=True)
class Workload:
    name: str            # "swish" (the activation alone), "swish_large", "ffn" (Linear, Swish, Linear), "rms_norm"...
    batch: int = 8
    seq: int = 512
    hidden: int = 768
    model: str = ""      # which exported model runs it (batch and sequence are dynamic); default: name
    op: str = ""         # the myops op it times (opspec.OPS)
    title: str = ""
    gpu_only: bool = False

    @property
    def model_name(self) -> str:
        return self.model or self.name

    @property
    def op_alone(self) -> bool:
        """The op and nothing else (no Linear layers): the workloads with copy floors."""
        return self.model_name == self.op

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.batch, self.seq, self.hidden)

    @property
    def elements(self) -> int:
        return self.batch * self.seq * self.hidden

    @property
    def bytes_moved(self) -> int:
        """The least traffic the workload needs with a fused op (read once, write once).

        An op alone: each full-shaped input in (X, a gated op's gate), each output out (Y, a fused add +
        norm's sum), each [hidden]-shaped input (RMSNorm's scale) once. ffn: x and W1 in, h out; h in, a
        out (the fused activation); a and W2 in, y out. Biases are negligible and left out.
        """
        if self.op_alone:
            spec = OPS[self.op]
            weights = len(spec.inputs) - spec.full_inputs
            return ((spec.full_inputs + len(spec.outputs)) * self.elements + weights * self.hidden) * BYTES_FP32
        inner = self.batch * self.seq * 4 * self.hidden
        weights = 2 * self.hidden * 4 * self.hidden
        return (2 * self.elements + 4 * inner + weights) * BYTES_FP32

    @property
    def copy_bytes(self) -> int:
        """What the copy floor's rows move: x in, a copy out."""
        return 2 * self.elements * BYTES_FP32

    @property
    def graph_inputs(self) -> tuple[str, ...]:
        """The model's inputs, in order: the op alone takes each of its full-shaped inputs, the other
        models x alone."""
        return model_inputs(self.model_name)

    def input(self, seed: int = 0) -> np.ndarray:
        return np.random.default_rng(seed).standard_normal(self.shape, dtype=np.float32)

    def inputs(self, seed: int = 0) -> tuple[np.ndarray, ...]:
        """One array per graph input, x first (as input(seed)), each other from its own seed."""
        return tuple(self.input(seed + 7919 * k) for k in range(len(self.graph_inputs)))


# Every op's workloads, as opspec/<op>.py declares them.
WORKLOADS = {w.name: Workload(w.name, w.batch, w.seq, w.hidden, w.model, op=spec.name, title=w.title, gpu_only=w.gpu_only)
             for spec in TORCH_OPS.values() for w in spec.workloads}
# The row of each op's own PyTorch function (F.silu is Swish at beta 1, F.rms_norm RMSNorm), which the
# extension must beat.
NATIVE_ROWS = {name: spec.native_row for name, spec in TORCH_OPS.items() if spec.native_row}
GPU_ONLY_WORKLOADS = tuple(name for name, w in WORKLOADS.items() if w.gpu_only)


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    p20, p50, p80 = np.percentile(np.asarray(seconds) * 1e3, [20, 50, 80])
    return {"p20_ms": round(float(p20), 4), "p50_ms": round(float(p50), 4), "p80_ms": round(float(p80), 4)}
