"""myops::Swish: Y = X * sigmoid(beta * X), elementwise."""
from . import FusedNode, OpSpec, Replaces, WorkloadSpec


def decomposed(op, x, beta):
    return op.Mul(x, op.Sigmoid(op.Mul(x, beta)))


SPEC = OpSpec(
    "swish", "Swish", ("X",), {"beta": 1.0}, kind="elementwise",
    decomposed=decomposed,
    # hand-written AVX-512/AVX2/NEON loops (kernels/swish.h); on CUDA the generated launchers, with the
    # fast exp and division for 16-bit storage
    own_kernels=("cpu",),
    forward_16bit=True,
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
    native_row="torch_silu",
    native="F.silu(x)",
    native_when="beta == 1.0",  # F.silu is Swish at beta 1 only
    primary=True,  # the lab's first op
    # QuickGELU is Swish with beta 1.702: `input * torch.sigmoid(1.702 * input)` in transformers 4.x and 5.x
    # (transformers' classes are only named, never imported, here)
    replaces={
        "torch.nn.modules.activation.SiLU": Replaces(attributes={"beta": 1.0}),
        "transformers.activations.SiLUActivation": Replaces(attributes={"beta": 1.0}),  # ACT2FN["silu"] in 5.x
        "transformers.activations.QuickGELUActivation": Replaces(attributes={"beta": 1.702}),
    },
    replaces_functions={"torch.nn.functional.silu": {"beta": 1.0}},
    looks_like=("SiLU", "Swish"),
    models={"ffn": "feed_forward"},
    artifact_seeds={"swish": 101, "ffn": 202},
    artifact_attributes={"swish": {"beta": 1.702}},
    # Layer 1 (tests/test_swish.py, test_declared_ops.py), against the composite in float32 on the same
    # device, rounded once to the dtype. float32: atol 1e-6 as the brief asks, plus torch's default float32
    # rtol (1.3e-6, about 10 ulp at 1.0): two correctly rounded exps may differ by an ulp at |y| ~ 20.
    # float16 and bfloat16 (CUDA): one ulp of the type as rtol (2^-10, 2^-7), since the same float32 value
    # may round to neighbouring 16-bit values (and the 16-bit forward uses the fast exp, kernels/swish.h),
    # and atol 1e-5 for float32-level noise where the backward's two terms cancel.
    tolerances={"float32": (1.3e-6, 1e-6), "float16": (2**-10, 1e-5), "bfloat16": (2**-7, 1e-5)},
    targets=(
        # against the copy floors (the fastest of the copies timed like the op), also on a DRAM-sized tensor
        ("ORT custom op vs ORT-side copy floor", "ort_custom", ("ort_plugin_copy", "ort_copy"), 1.3),
        ("extension op vs torch-side copy floor", "torch_extension", ("torch_copy_into", "torch_copy"), 1.3),
        ("ORT custom op vs ORT composite (default level: QuickGelu)", "ort_custom", ("ort_composite_all",), 1.0),
        ("ORT custom op vs ONNX Swish-24 (ORT's own kernel)", "ort_custom_newest", ("ort_standard",), 1.0),
        ("extension op vs F.silu", "torch_extension", ("torch_silu",), 1.0),
        ("extension op vs PyTorch composite", "torch_extension", ("torch_composite",), 0.7),
        # peak memory at least 5 % below the composite's (which holds one more activation-sized tensor at its
        # peak; 5 % leaves room for allocator rounding)
        ("extension peak memory vs PyTorch composite", "peak:torch_extension", ("peak:torch_composite",), 0.95),
        ("ORT custom op peak memory vs ORT composite (basic level)", "peak:ort_custom@all",
         ("peak:ort_composite@basic",), 0.95),
    ),
)
