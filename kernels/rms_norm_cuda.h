// Host-side entry points of the CUDA kernels in rms_norm_cuda.cu: plain pointers and a stream, no
// torch and no onnxruntime types (the extension passes PyTorch's current stream, the plugin the
// kernel context's compute stream). x, y, grad, dx: [rows, cols] contiguous; weight, dw: [cols].
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda_dtype.h"

namespace rms_norm {
namespace cuda {

using myops_cuda::DType;

// Both return the launch status (cudaGetLastError) without synchronising.
cudaError_t forward(const void* x, const void* weight, void* y, int64_t rows, int64_t cols, float eps, DType dtype,
                    cudaStream_t stream);
// workspace: backward_workspace_floats(rows, cols) floats of device memory the caller owns (each
// row's inv_rms, then the weight gradient's per-chunk partial sums).
int64_t backward_workspace_floats(int64_t rows, int64_t cols);
cudaError_t backward(const void* grad, const void* x, const void* weight, void* dx, void* dw, float* workspace,
                     int64_t rows, int64_t cols, float eps, DType dtype, cudaStream_t stream);

}  // namespace cuda
}  // namespace rms_norm
