// myops::swish for PyTorch on CUDA: checks, PyTorch's current stream, then the shared launchers
// of kernels/swish_cuda.cu (the same kernels the ORT plugin runs).
// NOTE: c10's stream/guard headers rather than ATen/cuda/CUDAContext.h, which drags in cuBLAS and
// cuSPARSE headers the kernel does not use (and a bare nvcc install does not have).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../dtype_name.h"
#include "swish_cuda.h"

namespace myops {
// Named, not anonymous: nvcc hashes the file's path into an anonymous namespace's name (see
// kernels/swish_cuda.cu).
namespace __attribute__((visibility("hidden"))) cuda_internal {

void check_cuda_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "myops::swish (CUDA): ", name, " must be a CUDA tensor; got ", t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
              "myops::swish (CUDA): ", name, " must be float32, float16 or bfloat16; got torch.",
              dtype_name(t.scalar_type()));
}

swish::cuda::DType to_kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return swish::cuda::DType::kFloat16;
    case at::kBFloat16: return swish::cuda::DType::kBFloat16;
    default: return swish::cuda::DType::kFloat32;
  }
}

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "myops::", what, " (CUDA): kernel launch failed: ", cudaGetErrorString(err),
              ". If this says 'no kernel image is available', rebuild with TORCH_CUDA_ARCH_LIST covering this GPU.");
}

at::Tensor swish_cuda(const at::Tensor& x, double beta) {
  check_cuda_input(x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  if (xc.numel() == 0) return y;
  check_launch(swish::cuda::forward(xc.const_data_ptr(), y.mutable_data_ptr(), xc.numel(), static_cast<float>(beta),
                                    to_kernel_dtype(xc.scalar_type()), c10::cuda::getCurrentCUDAStream()),
               "swish");
  return y;
}

at::Tensor swish_backward_cuda(const at::Tensor& grad, const at::Tensor& x, double beta) {
  check_cuda_input(x, "x");
  TORCH_CHECK(grad.scalar_type() == x.scalar_type() && grad.sizes() == x.sizes() && grad.device() == x.device(),
              "myops::swish_backward (CUDA): grad must match x (", x.scalar_type(), ", ", x.sizes(), ", ",
              x.device(), "); got ", grad.scalar_type(), ", ", grad.sizes(), ", ", grad.device());
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor gc = grad.contiguous();
  const at::Tensor xc = x.contiguous();
  at::Tensor dx = at::empty_like(xc, at::MemoryFormat::Contiguous);
  if (xc.numel() == 0) return dx;
  check_launch(swish::cuda::backward(gc.const_data_ptr(), xc.const_data_ptr(), dx.mutable_data_ptr(), xc.numel(),
                                     static_cast<float>(beta), to_kernel_dtype(xc.scalar_type()),
                                     c10::cuda::getCurrentCUDAStream()),
               "swish_backward");
  return dx;
}

}  // namespace cuda_internal

TORCH_LIBRARY_IMPL(myops, CUDA, m) {
  m.impl("swish", &cuda_internal::swish_cuda);
  m.impl("swish_backward", &cuda_internal::swish_backward_cuda);
}

}  // namespace myops
