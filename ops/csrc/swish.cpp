// myops::swish for PyTorch: the schema (declared once, here) and the CPU kernels.
// The math comes from kernels/swish.h, shared with the ONNX Runtime plugin.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "dtype_name.h"
#include "swish.h"

namespace myops {
namespace {

// Elements per task: below this the thread hand-off costs more than the work.
constexpr int64_t kGrainSize = 32768;

void check_cpu_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble,
              "myops::swish: ", name, " must be float32 (float64 is accepted on CPU for gradcheck); got torch.",
              dtype_name(t.scalar_type()), ". Cast with .float() first.");
}

at::Tensor swish_cpu(const at::Tensor& x, double beta) {
  check_cpu_dtype(x, "x");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "myops::swish", [&] {
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    const auto b = static_cast<scalar_t>(beta);
    at::parallel_for(0, xc.numel(), kGrainSize, [&](int64_t begin, int64_t end) {
      swish::forward_span(xp + begin, yp + begin, end - begin, b);
    });
  });
  return y;
}

at::Tensor swish_backward_cpu(const at::Tensor& grad, const at::Tensor& x, double beta) {
  check_cpu_dtype(x, "x");
  TORCH_CHECK(grad.scalar_type() == x.scalar_type(), "myops::swish_backward: grad must have x's dtype torch.",
              dtype_name(x.scalar_type()), "; got torch.", dtype_name(grad.scalar_type()));
  TORCH_CHECK(grad.sizes() == x.sizes(), "myops::swish_backward: grad must have x's shape ", x.sizes(),
              "; got ", grad.sizes());
  const at::Tensor gc = grad.contiguous();
  const at::Tensor xc = x.contiguous();
  at::Tensor dx = at::empty_like(xc, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "myops::swish_backward", [&] {
    const scalar_t* gp = gc.const_data_ptr<scalar_t>();
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    const auto b = static_cast<scalar_t>(beta);
    at::parallel_for(0, xc.numel(), kGrainSize, [&](int64_t begin, int64_t end) {
      swish::backward_span(gp + begin, xp + begin, dxp + begin, end - begin, b);
    });
  });
  return dx;
}

}  // namespace

// The schema is what torch.onnx sees: "myops::swish" is the name the ONNX symbolic and the
// torch.export translation are registered under (ops/export.py).
TORCH_LIBRARY(myops, m) {
  m.def("swish(Tensor x, float beta=1.0) -> Tensor");
  m.def("swish_backward(Tensor grad, Tensor x, float beta) -> Tensor");
}

TORCH_LIBRARY_IMPL(myops, CPU, m) {
  m.impl("swish", &swish_cpu);
  m.impl("swish_backward", &swish_backward_cpu);
}

}  // namespace myops
