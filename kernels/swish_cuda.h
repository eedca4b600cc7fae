// Host-side entry points of the CUDA kernels in swish_cuda.cu. Plain pointers and a stream, no
// torch and no onnxruntime types: the extension passes PyTorch's current stream, the plugin the
// kernel context's compute stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda_dtype.h"

namespace swish {
namespace cuda {

using myops_cuda::DType;

// Both return the launch status (cudaGetLastError) without synchronising.
cudaError_t forward(const void* x, void* y, int64_t n, float beta, DType dtype, cudaStream_t stream);
cudaError_t backward(const void* grad, const void* x, void* dx, int64_t n, float beta, DType dtype,
                     cudaStream_t stream);

}  // namespace cuda
}  // namespace swish
