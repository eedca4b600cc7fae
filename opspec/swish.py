"""myops::Swish: Y = X * sigmoid(beta * X), elementwise."""
from . import FusedNode, OpSpec, WorkloadSpec


def decomposed(op, x, beta):
    return op.Mul(x, op.Sigmoid(op.Mul(x, beta)))


SPEC = OpSpec(
    "swish", "Swish", ("X",), {"beta": 1.0}, kind="elementwise",
    decomposed=decomposed,
    # hand-written AVX-512/AVX2/NEON loops, and a 16-bit CUDA form with the fast exp (kernels/swish*.h)
    own_kernels=("cpu", "cuda"),
    fused_nodes=(
        # ai.onnx Swish, added in opset 24 with alpha defaulting to 1.0 (onnx/defs/math/defs.cc, Swish-24)
        FusedNode("Swish", attributes={"beta": "alpha"}, defaults={"alpha": 1.0}, opset=24),
        # what ORT's default level fuses x*Sigmoid(c*x) into; alpha defaults to 1.702
        # (onnxruntime/core/graph/contrib_ops/contrib_defs.cc, QuickGelu)
        FusedNode("QuickGelu", "com.microsoft", attributes={"beta": "alpha"}, defaults={"alpha": 1.702}),
    ),
    workloads=(
        WorkloadSpec("swish", "activation alone"),
        # 403 MB in and out in float32, far beyond any GPU's L2 (50 MB on an H100/H200), so the copy
        # floor is DRAM bandwidth; the small swish fits in L2 there.
        WorkloadSpec("swish_large", "activation alone, large tensor", batch=64, seq=2048, model="swish", gpu_only=True),
        WorkloadSpec("ffn", "FFN block (Linear 768->3072, Swish, Linear 3072->768)", model="ffn"),
    ),
    native_row="torch_silu",  # F.silu is Swish at beta 1
)
