"""myops::RMSNorm: Y = X * rsqrt(mean(X^2, axis=-1) + epsilon) * scale, summed in float32."""
from . import FusedNode, OpSpec, Replaces, WorkloadSpec


def decomposed(op, x, scale, epsilon):
    # the pattern ORT's default level fuses into SimplifiedLayerNormalization
    return op.Mul(op.Div(x, op.Sqrt(op.Add(op.ReduceMean(op.Pow(x, 2.0)), epsilon))), scale)


# Where absent, both nodes' epsilon is 1e-5 and their axis -1 (ORT's contrib_defs.cc,
# SimplifiedLayerNormalization; onnx/defs/nn/defs.cc, RMSNormalization-23), stash_type 1 (float).
NODE_DEFAULTS = {"epsilon": 1e-5, "axis": -1, "stash_type": 1}
ONE_ROW_IN_FLOAT = {"axis": -1, "stash_type": 1}

# Hugging Face's RMSNorms that compute x * rsqrt(mean(x^2) + eps) * weight in float32 (transformers 4.x
# and 5.x): the weight as it is, eps in variance_epsilon.
HF_RMS_NORMS = {f"transformers.models.{family}.modeling_{family}.{name}RMSNorm":
                Replaces(attributes={"eps": "variance_epsilon"})
                for family, name in (("llama", "Llama"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3"), ("mistral", "Mistral"),
                                     ("mixtral", "Mixtral"), ("phi3", "Phi3"), ("olmo2", "Olmo2"), ("granite", "Granite"))}
# Gemma's scale by (1 + weight), its weight starting at zero, eps in `eps`: the 1 is added in the swapped
# module's forward, in float32.
GEMMA_RMS_NORMS = {f"transformers.models.{family}.modeling_{family}.{name}RMSNorm":
                   Replaces(attributes={"eps": "eps"}, offsets={"weight": 1.0})
                   for family, name in (("gemma", "Gemma"), ("gemma2", "Gemma2"), ("gemma3", "Gemma3"))}

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
    native="F.rms_norm(x, weight.shape, weight, eps)",
    native_when='hasattr(F, "rms_norm")',  # torch >= 2.4
    replaces={**HF_RMS_NORMS, **GEMMA_RMS_NORMS,
              # one normalised dimension; no weight (elementwise_affine=False): ones; eps=None: float32's epsilon
              "torch.nn.modules.normalization.RMSNorm": Replaces(attributes={"eps": "eps"}, none_is_epsilon=("eps",))},
    looks_like=("RMSNorm",),
    artifact_seeds={"rms_norm": 303},
    # Layer 1 (tests/test_rms_norm.py) against float64, rounded once to the dtype, for y, dx and dw.
    # float32: sums of up to 16384 squares in float32, in an order that differs by device (vector
    # lanes on the CPU, a block's tree on the GPU), and one rsqrt. 2e-6 holds for y but not for the
    # gradients: dw, a sum over 4M rows, differs by 6.7e-6 absolute; where dx's two terms cancel (a row
    # of tiny values) the test also allows twice the float32 composite's own error. float16 and bfloat16 (CUDA):
    # one ulp of the type as rtol (2^-10, 2^-7); atol where dx's two terms cancel. dw's atol grows with
    # the square root of the row count (tests/test_rms_norm.py).
    tolerances={"float32": (1e-5, 1e-5), "float16": (2**-10, 1e-3), "bfloat16": (2**-7, 1e-2)},
    # ORT's own kernel for the decomposed graph is the SimplifiedLayerNormalization its default level
    # fuses it into.
    targets=(("extension op vs F.rms_norm", "torch_extension", ("torch_rms_norm",), 1.0),
             ("ORT custom op vs ORT composite (default level: SimplifiedLayerNormalization)", "ort_custom",
              ("ort_composite_all",), 1.0)),
)
