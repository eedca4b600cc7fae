"""myops::Swish: Y = X * sigmoid(beta * X), elementwise."""
from . import OpSpec, WorkloadSpec

SPEC = OpSpec(
    "swish", "Swish", ("X",), {"beta": 1.0}, kind="elementwise",
    workloads=(
        WorkloadSpec("swish", "activation alone"),
        # 403 MB in and out in float32, far beyond any GPU's L2 (50 MB on an H100/H200), so the copy
        # floor is DRAM bandwidth; the small swish fits in L2 there.
        WorkloadSpec("swish_large", "activation alone, large tensor", batch=64, seq=2048, model="swish", gpu_only=True),
        WorkloadSpec("ffn", "FFN block (Linear 768->3072, Swish, Linear 3072->768)", model="ffn"),
    ),
    native_row="torch_silu",  # F.silu is Swish at beta 1
)
