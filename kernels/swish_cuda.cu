// CUDA kernels for Swish, shared by the PyTorch extension and the ORT plugin. The math is
// kernels/swish.h, evaluated in float32 whatever the storage type.
#include "elementwise_cuda.cuh"
#include "swish.h"
#include "swish_cuda.h"

namespace swish {
namespace cuda {
// A named namespace, not an anonymous one: nvcc names anonymous namespaces after a hash of the
// source file's path, which would make two checkouts build different binaries. Hidden, so that
// these stay out of the dynamic symbol table as an anonymous namespace's would.
namespace __attribute__((visibility("hidden"))) internal {

using myops_cuda::dispatch;

struct Forward {
  float beta;
  __device__ float operator()(float x, float) const { return swish::forward(x, beta); }
};

// float16 and bfloat16 storage: see swish::forward_16bit.
struct Forward16 {
  float beta;
  __device__ float operator()(float x, float) const { return swish::forward_16bit(x, beta); }
};

// a = grad, b = x
struct Backward {
  float beta;
  __device__ float operator()(float grad, float x) const { return swish::backward(grad, x, beta); }
};

}  // namespace internal

cudaError_t forward(const void* x, void* y, int64_t n, float beta, DType dtype, cudaStream_t stream) {
  using myops_cuda::launch;
  switch (dtype) {
    case DType::kFloat16: return launch<__half>(internal::Forward16{beta}, x, nullptr, y, n, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(internal::Forward16{beta}, x, nullptr, y, n, stream);
    default: return launch<float>(internal::Forward{beta}, x, nullptr, y, n, stream);
  }
}

cudaError_t backward(const void* grad, const void* x, void* dx, int64_t n, float beta, DType dtype,
                     cudaStream_t stream) {
  return dispatch(dtype, internal::Backward{beta}, grad, x, dx, n, stream);
}

}  // namespace cuda
}  // namespace swish
