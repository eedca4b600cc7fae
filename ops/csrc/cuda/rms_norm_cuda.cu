// myops::rms_norm for PyTorch on CUDA: checks, PyTorch's current stream, then the shared launchers
// of kernels/rms_norm_cuda.cu (the kernels the ORT plugin runs). See swish_cuda.cu for the headers.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "../dtype_name.h"
#include "rms_norm_cuda.h"

namespace myops {
namespace __attribute__((visibility("hidden"))) rms_norm_cuda_internal {

rms_norm::cuda::DType checked_dtype(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  TORCH_CHECK(x.device() == weight.device(), "myops::", op, ": x and weight must be on the same device; got x on ",
              x.device(), " and weight on ", weight.device(), ". Move both with .to(device) first.");
  TORCH_CHECK(x.is_cuda(), "myops::", op, " (CUDA): x must be a CUDA tensor; got ", x.device());
  TORCH_CHECK(x.dim() >= 1, "myops::", op, ": x must have at least one dimension (normalised over the last)");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1) && weight.scalar_type() == x.scalar_type() &&
                  weight.device() == x.device(),
              "myops::", op, " (CUDA): weight must be [", x.size(-1), "] of x's dtype on x's device; got ",
              weight.sizes(), " torch.", dtype_name(weight.scalar_type()), " on ", weight.device());
  switch (x.scalar_type()) {
    case at::kFloat: return rms_norm::cuda::DType::kFloat32;
    case at::kHalf: return rms_norm::cuda::DType::kFloat16;
    case at::kBFloat16: return rms_norm::cuda::DType::kBFloat16;
    default:
      TORCH_CHECK(false, "myops::", op, " (CUDA): x must be float32, float16 or bfloat16; got torch.",
                  dtype_name(x.scalar_type()));
  }
}

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "myops::", what, " (CUDA): kernel launch failed: ", cudaGetErrorString(err),
              ". If this says 'no kernel image is available', rebuild with TORCH_CUDA_ARCH_LIST covering this GPU.");
}

at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto dtype = checked_dtype(x, weight, "rms_norm");
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t cols = xc.size(-1);
  const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  check_launch(rms_norm::cuda::forward(xc.const_data_ptr(), wc.const_data_ptr(), y.mutable_data_ptr(), rows, cols,
                                       static_cast<float>(eps), dtype, c10::cuda::getCurrentCUDAStream()),
               "rms_norm");
  return y;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                          const at::Tensor& weight, double eps) {
  const auto dtype = checked_dtype(x, weight, "rms_norm_backward");
  TORCH_CHECK(grad.scalar_type() == x.scalar_type() && grad.sizes() == x.sizes() && grad.device() == x.device(),
              "myops::rms_norm_backward (CUDA): grad must match x (", x.scalar_type(), ", ", x.sizes(), ", ",
              x.device(), "); got ", grad.scalar_type(), ", ", grad.sizes(), ", ", grad.device());
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor gc = grad.contiguous();
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  at::Tensor dx = at::empty_like(xc, at::MemoryFormat::Contiguous);
  at::Tensor dw = at::empty_like(wc, at::MemoryFormat::Contiguous);
  const int64_t cols = xc.size(-1);
  const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  at::Tensor workspace =
      at::empty({rms_norm::cuda::backward_workspace_floats(rows, cols)}, xc.options().dtype(at::kFloat));
  check_launch(rms_norm::cuda::backward(gc.const_data_ptr(), xc.const_data_ptr(), wc.const_data_ptr(),
                                        dx.mutable_data_ptr(), dw.mutable_data_ptr(),
                                        workspace.mutable_data_ptr<float>(), rows, cols, static_cast<float>(eps), dtype,
                                        c10::cuda::getCurrentCUDAStream()),
               "rms_norm_backward");
  return {dx, dw};
}

}  // namespace rms_norm_cuda_internal

TORCH_LIBRARY_IMPL(myops, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda_internal::rms_norm_cuda);
  m.impl("rms_norm_backward", &rms_norm_cuda_internal::rms_norm_backward_cuda);
}

}  // namespace myops
