"""myops::RMSNorm: Y = X * rsqrt(mean(X^2, axis=-1) + epsilon) * scale, summed in float32."""
from . import FusedNode, OpSpec, WorkloadSpec


def decomposed(op, x, scale, epsilon):
    # the pattern ORT's default level fuses into SimplifiedLayerNormalization
    return op.Mul(op.Div(x, op.Sqrt(op.Add(op.ReduceMean(op.Pow(x, 2.0)), epsilon))), scale)


# Where absent, both nodes' epsilon is 1e-5 and their axis -1 (ORT's contrib_defs.cc,
# SimplifiedLayerNormalization; onnx/defs/nn/defs.cc, RMSNormalization-23), stash_type 1 (float).
NODE_DEFAULTS = {"epsilon": 1e-5, "axis": -1, "stash_type": 1}
ONE_ROW_IN_FLOAT = {"axis": -1, "stash_type": 1}

SPEC = OpSpec(
    "rms_norm", "RMSNorm", ("X", "scale"), {"epsilon": 1e-6}, torch_attributes={"epsilon": "eps"},
    kind="rowwise", torch_inputs={"scale": "weight"},
    # rows held in registers as packs, one block per row on CUDA (kernels/rms_norm.h, rms_norm_cuda.cu)
    own_kernels=("cpu", "cuda"),
    decomposed=decomposed,
    fused_nodes=(
        FusedNode("RMSNormalization", attributes={"epsilon": "epsilon"}, defaults=NODE_DEFAULTS,
                  requires=ONE_ROW_IN_FLOAT, opset=23),
        FusedNode("SimplifiedLayerNormalization", attributes={"epsilon": "epsilon"}, defaults=NODE_DEFAULTS,
                  requires=ONE_ROW_IN_FLOAT),
    ),
    workloads=(
        WorkloadSpec("rms_norm", "RMSNorm alone"),
        WorkloadSpec("rms_norm_4096", "RMSNorm alone, hidden 4096", hidden=4096, model="rms_norm"),
    ),
    native_row="torch_rms_norm",
)
