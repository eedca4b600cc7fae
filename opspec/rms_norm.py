"""myops::RMSNorm: Y = X * rsqrt(mean(X^2, axis=-1) + epsilon) * scale, summed in float32."""
from . import OpSpec, WorkloadSpec

SPEC = OpSpec(
    "rms_norm", "RMSNorm", ("X", "scale"), {"epsilon": 1e-6}, torch_attributes={"epsilon": "eps"},
    kind="rowwise", torch_inputs={"scale": "weight"},
    workloads=(
        WorkloadSpec("rms_norm", "RMSNorm alone"),
        WorkloadSpec("rms_norm_4096", "RMSNorm alone, hidden 4096", hidden=4096, model="rms_norm"),
    ),
    native_row="torch_rms_norm",
)
