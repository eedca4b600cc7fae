// myops::rms_norm for PyTorch: the schema and the CPU kernels. The math comes from
// kernels/rms_norm.h, shared with the ONNX Runtime plugin.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "dtype_name.h"
#include "rms_norm.h"

namespace myops {
namespace {

// Values per task: below this the thread hand-off costs more than the work.
constexpr int64_t kGrainValues = 32768;
// Blocks of rows for the weight gradient's partial sums: fixed, so the sum order (and the result)
// does not depend on how many threads ran.
constexpr int64_t kMaxBlocks = 64;

void check_inputs(const char* op, const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1, "myops::", op, ": x must have at least one dimension (normalised over the last); got a scalar");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "myops::", op,
              ": weight must have shape [x.shape[-1]] = [", x.size(-1), "]; got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "myops::", op, ": weight must have x's dtype torch.",
              dtype_name(x.scalar_type()), "; got torch.", dtype_name(weight.scalar_type()));
  TORCH_CHECK(weight.device() == x.device(), "myops::", op, ": weight must be on x's device ", x.device(), "; got ",
              weight.device());
}

void check_cpu_dtype(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "myops::rms_norm: x must be float32 on CPU (float64 is accepted for gradcheck); got torch.",
              dtype_name(x.scalar_type()), ". Cast with .float() first.");
}

int64_t rows_per_task(int64_t cols) { return std::max<int64_t>(1, kGrainValues / std::max<int64_t>(cols, 1)); }

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_inputs("rms_norm", x, weight);
  check_cpu_dtype(x);
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t cols = xc.size(-1);
  const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "myops::rms_norm", [&] {
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    const scalar_t* wp = wc.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    const auto e = static_cast<scalar_t>(eps);
    at::parallel_for(0, rows, rows_per_task(cols), [&](int64_t begin, int64_t end) {
      rms_norm::forward_rows(xp + begin * cols, wp, yp + begin * cols, end - begin, cols, e);
    });
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                                         const at::Tensor& weight, double eps) {
  check_inputs("rms_norm_backward", x, weight);
  check_cpu_dtype(x);
  TORCH_CHECK(grad.scalar_type() == x.scalar_type() && grad.sizes() == x.sizes(),
              "myops::rms_norm_backward: grad must match x (torch.", dtype_name(x.scalar_type()), ", ", x.sizes(),
              "); got torch.", dtype_name(grad.scalar_type()), ", ", grad.sizes());
  const at::Tensor gc = grad.contiguous();
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  at::Tensor dx = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t cols = xc.size(-1);
  const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(kMaxBlocks, rows));
  const int64_t block_rows = rows == 0 ? 0 : (rows + blocks - 1) / blocks;
  at::Tensor partial = at::zeros({blocks, cols}, xc.options());
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "myops::rms_norm_backward", [&] {
    const scalar_t* gp = gc.const_data_ptr<scalar_t>();
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    const scalar_t* wp = wc.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    scalar_t* pp = partial.mutable_data_ptr<scalar_t>();
    const auto e = static_cast<scalar_t>(eps);
    at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
      for (int64_t b = first; b < last; ++b) {
        const int64_t begin = std::min(rows, b * block_rows);
        const int64_t count = std::min(rows, begin + block_rows) - begin;
        rms_norm::backward_rows(gp + begin * cols, xp + begin * cols, wp, dxp + begin * cols, pp + b * cols, count,
                                cols, e);
      }
    });
  });
  return {dx, partial.sum(0)};
}

}  // namespace

// The schema is what torch.onnx sees: "myops::rms_norm" is the name the ONNX symbolic and the
// torch.export translation are registered under (ops/export.py). A fragment: swish.cpp holds the
// library's TORCH_LIBRARY block.
TORCH_LIBRARY_FRAGMENT(myops, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor");
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(myops, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("rms_norm_backward", &rms_norm_backward_cpu);
}

}  // namespace myops
