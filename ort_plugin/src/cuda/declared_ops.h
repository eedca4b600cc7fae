// The CUDA kernels of every op of a kind (float32 and float16): the op's host launcher (Decl::Launch:
// the one opspec/codegen writes over its math, or its own in kernels/<op>_cuda.h) on the kernel
// context's compute stream, whose launch status is checked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/ops.h"
#include "cuda_dtype.h"
#include "declared_op.h"
#include "shapes.h"

namespace myops {
namespace cuda {

template <size_t kIn>
using Inputs = std::array<const void*, kIn>;
template <size_t kOut>
using Outputs = std::array<void*, kOut>;

template <ONNXTensorElementDataType kType>
constexpr myops_cuda::DType kStorage =
    kType == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? myops_cuda::DType::kFloat16 : myops_cuda::DType::kFloat32;

inline Ort::Status LaunchStatus(const char* op, cudaError_t err) {
  if (err == cudaSuccess) return Ort::Status{nullptr};
  return Ort::Status((std::string("myops::") + op + " (CUDA): kernel launch failed: " + cudaGetErrorString(err) +
                      ". 'no kernel image is available' means the plugin was not built for this GPU's "
                      "architecture: rebuild with CMAKE_CUDA_ARCHITECTURES covering it.")
                         .c_str(),
                     ORT_RUNTIME_EXCEPTION);
}

// Pointers to the inputs and to kOut outputs of X's shape, allocated by ORT.
template <size_t kIn, size_t kOut>
void Buffers(Ort::KernelContext& context, const std::vector<int64_t>& shape, Inputs<kIn>* in, Outputs<kOut>* out) {
  for (size_t k = 0; k < kIn; ++k) (*in)[k] = context.GetInput(k).GetTensorRawData();
  for (size_t k = 0; k < kOut; ++k) (*out)[k] = context.GetOutput(k, shape).GetTensorMutableRawData();
}

template <class Decl, ONNXTensorElementDataType kType>
struct RunElementwiseKind {
  Ort::Status operator()(Ort::KernelContext& context, const AttributeValues<Decl>& values, const std::string& node) const {
    std::vector<int64_t> shape;
    if (Ort::Status status = ElementwiseShape<Decl::kInputs>(context, Decl::kName, node, &shape); !status.IsOK()) {
      return status;
    }
    Inputs<Decl::kInputs> in;
    Outputs<Decl::kOutputs> out;
    Buffers(context, shape, &in, &out);
    const int64_t n = ElementCount(shape);
    if (n == 0) return Ort::Status{nullptr};
    const auto stream = static_cast<cudaStream_t>(context.GetGPUComputeStream());
    return LaunchStatus(Decl::kName, typename Decl::Launch{}(in, out, n, values, kStorage<kType>, stream));
  }
};

template <class Decl, ONNXTensorElementDataType kType>
struct RunRowwiseKind {
  Ort::Status operator()(Ort::KernelContext& context, const AttributeValues<Decl>& values, const std::string& node) const {
    std::vector<int64_t> shape;
    if (Ort::Status status =
            RowShape<Decl::kInputs, Decl::kFullInputs>(context, Decl::kName, Decl::kInputNames, node, &shape);
        !status.IsOK()) {
      return status;
    }
    Inputs<Decl::kInputs> in;
    Outputs<Decl::kOutputs> out;
    Buffers(context, shape, &in, &out);
    const int64_t count = ElementCount(shape);
    if (count == 0) return Ort::Status{nullptr};  // no rows, or rows of nothing: no launch (a grid of 0 fails)
    const int64_t cols = shape.back();
    const int64_t rows = count / cols;
    const auto stream = static_cast<cudaStream_t>(context.GetGPUComputeStream());
    return LaunchStatus(Decl::kName, typename Decl::Launch{}(in, out, rows, cols, values, kStorage<kType>, stream));
  }
};

template <class Decl, ONNXTensorElementDataType kType>
using ElementwiseKernel = DeclaredKernel<Decl, RunElementwiseKind<Decl, kType>>;
template <class Decl, ONNXTensorElementDataType kType>
using RowwiseKernel = DeclaredKernel<Decl, RunRowwiseKind<Decl, kType>>;

template <class Decl, template <class, ONNXTensorElementDataType> class Kernel, ONNXTensorElementDataType kType>
struct DeclaredOp : DeclaredOpBase<DeclaredOp<Decl, Kernel, kType>, Decl, Kernel<Decl, kType>, kType> {
  const char* GetExecutionProviderType() const { return "CUDAExecutionProvider"; }
};

}  // namespace cuda
}  // namespace myops
