// Host-side entry point of the Copy floor's CUDA kernel (copy_cuda.cu): the shared elementwise launcher
// with nothing to compute, so that the floor has the ops' launch configuration.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda_dtype.h"

namespace copy {
namespace cuda {

using myops_cuda::DType;

// Returns the launch status (cudaGetLastError) without synchronising.
cudaError_t forward(const void* x, void* y, int64_t n, DType dtype, cudaStream_t stream);

}  // namespace cuda
}  // namespace copy
