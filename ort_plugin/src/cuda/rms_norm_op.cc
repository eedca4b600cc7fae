// myops::RMSNorm on CUDAExecutionProvider (float32 and float16), launched on the kernel context's
// compute stream with the shared kernels of kernels/rms_norm_cuda.cu.
#include <cstdint>
#include <string>

#include "cuda/ops.h"
#include "rms_norm_cuda.h"
#include "rms_norm_op_base.h"

namespace myops {
namespace cuda {
namespace {

MYOPS_BUILD_INFO(kOpInfo, "myops-op: domain=" MYOPS_DOMAIN " op=" MYOPS_RMS_NORM_NAME
                          " since=1 provider=CUDAExecutionProvider types=float32,float16");

template <ONNXTensorElementDataType kType>
struct RMSNormKernel {
  float epsilon;
  std::string node;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) const {
    return GuardStatus([&] {
      Ort::KernelContext context{raw_context};
      const Ort::ConstValue x = context.GetInput(0);
      const Ort::ConstValue scale = context.GetInput(1);
      RowShape rows;
      if (Ort::Status status = ReadRowShape(x, scale, node, &rows); !status.IsOK()) return status;
      Ort::UnownedValue y = context.GetOutput(0, rows.shape);
      constexpr auto dtype = kType == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? rms_norm::cuda::DType::kFloat16
                                                                           : rms_norm::cuda::DType::kFloat32;
      const cudaError_t err =
          rms_norm::cuda::forward(x.GetTensorRawData(), scale.GetTensorRawData(), y.GetTensorMutableRawData(),
                                  rows.rows, rows.cols, epsilon, dtype,
                                  static_cast<cudaStream_t>(context.GetGPUComputeStream()));
      if (err != cudaSuccess) {
        return Ort::Status((std::string("myops::RMSNorm (CUDA): kernel launch failed: ") + cudaGetErrorString(err) +
                            ". 'no kernel image is available' means the plugin was not built for this GPU's "
                            "architecture: rebuild with CMAKE_CUDA_ARCHITECTURES covering it.")
                               .c_str(),
                           ORT_RUNTIME_EXCEPTION);
      }
      return Ort::Status{nullptr};
    });
  }
};

template <ONNXTensorElementDataType kType>
struct RMSNormOp : RMSNormOpBase<RMSNormOp<kType>, RMSNormKernel<kType>, kType> {
  const char* GetExecutionProviderType() const { return "CUDAExecutionProvider"; }
};

void RegisterRMSNorm(Ort::CustomOpDomain& domain) {
  static const RMSNormOp<ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT> rms_norm_f32;
  static const RMSNormOp<ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16> rms_norm_f16;
  domain.Add(&rms_norm_f32);
  domain.Add(&rms_norm_f16);
}

MYOPS_REGISTER_OP(kCuda, RegisterRMSNorm);

}  // namespace
}  // namespace cuda
}  // namespace myops
