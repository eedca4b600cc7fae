// The Copy floor's CUDA kernel: y = x through the launcher every elementwise op uses.
#include "copy_cuda.h"
#include "elementwise_cuda.cuh"

namespace copy {
namespace cuda {
// Named and hidden, not anonymous: nvcc hashes the file's path into an anonymous namespace's name.
namespace __attribute__((visibility("hidden"))) internal {

struct Identity {
  __device__ float operator()(float x, float) const { return x; }
};

}  // namespace internal

cudaError_t forward(const void* x, void* y, int64_t n, DType dtype, cudaStream_t stream) {
  return myops_cuda::dispatch(dtype, internal::Identity{}, x, nullptr, y, n, stream);
}

}  // namespace cuda
}  // namespace copy
