// myops::Swish on CUDAExecutionProvider (float32 and float16), launched on the kernel context's
// compute stream with the shared kernels of kernels/swish_cuda.cu. Stateless but for beta.
#include "cuda/ops.h"

#include <cstdint>

#include "swish_cuda.h"
#include "swish_op_base.h"

namespace myops {
namespace cuda {
namespace {

MYOPS_BUILD_INFO(kOpInfo, "myops-op: domain=" MYOPS_DOMAIN " op=" MYOPS_SWISH_NAME
                          " since=1 provider=CUDAExecutionProvider types=float32,float16");

template <ONNXTensorElementDataType kType>
struct SwishKernel {
  float beta;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) const {
    return GuardStatus([&] {
      Ort::KernelContext context{raw_context};
      const Ort::ConstValue input = context.GetInput(0);
      const Ort::TensorTypeAndShapeInfo info = input.GetTensorTypeAndShapeInfo();
      Ort::UnownedValue output = context.GetOutput(0, info.GetShape());
      const auto n = static_cast<int64_t>(info.GetElementCount());
      const auto stream = static_cast<cudaStream_t>(context.GetGPUComputeStream());
      constexpr auto dtype = kType == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? swish::cuda::DType::kFloat16
                                                                           : swish::cuda::DType::kFloat32;
      const cudaError_t err = swish::cuda::forward(input.GetTensorRawData(), output.GetTensorMutableRawData(), n,
                                                   beta, dtype, stream);
      if (err != cudaSuccess) {
        return Ort::Status((std::string("myops::Swish (CUDA): kernel launch failed: ") + cudaGetErrorString(err) +
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
struct SwishOp : SwishOpBase<SwishOp<kType>, SwishKernel<kType>, kType> {
  const char* GetExecutionProviderType() const { return "CUDAExecutionProvider"; }
};

void RegisterSwish(Ort::CustomOpDomain& domain) {
  static const SwishOp<ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT> swish_f32;
  static const SwishOp<ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16> swish_f16;
  domain.Add(&swish_f32);
  domain.Add(&swish_f16);
}

MYOPS_REGISTER_OP(kCuda, RegisterSwish);

}  // namespace
}  // namespace cuda
}  // namespace myops
