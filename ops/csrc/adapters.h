// The CPU side of every op of a kind, written once: checks with the op's and the inputs' names,
// contiguous inputs, outputs, the split over at::parallel_for, then the op's own loops from its math
// header (kernels/<op>.h). opspec/codegen writes the few lines per op that call these.
//
// The loops each kind calls, with pointers in the order of the op's declaration (opspec/<op>.py):
//   elementwise  forward_span(inputs..., outputs..., n, attributes...)
//                backward_span(grads..., inputs..., input grads..., n, attributes...)
//   rowwise      forward_rows(full inputs..., weights..., outputs..., rows, cols, attributes...)
//                backward_rows(grads..., full inputs..., weights..., their grads..., rows, cols, attributes...)
//                backward_rows adds (+=) into the weights' grads: each block of rows gets a zeroed row of
//                its own, and the blocks' rows are summed in block order (the same result on any thread count)
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <array>
#include <cstddef>

#include "dtype_name.h"

namespace myops {
// hidden, as the anonymous namespaces of hand-written adapters are: nothing here is the library's API
namespace __attribute__((visibility("hidden"))) adapters {

// Values per task: below this the thread hand-off costs more than the work.
constexpr int64_t kGrainValues = 32768;
// Blocks of rows for the weight gradients' partial sums: fixed, so the sum order (and the result) does
// not depend on how many threads ran.
constexpr int64_t kMaxBlocks = 64;

template <size_t N>
using Tensors = std::array<at::Tensor, N>;
template <size_t N>
using Names = std::array<const char*, N>;

inline void check_cpu_dtype(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, "myops::", op, ": ", name,
              " must be float32 on CPU (float64 is accepted for gradcheck); got torch.", dtype_name(t.scalar_type()),
              ". Cast with .float() first.");
}

// `t` is used element by element with x: x's dtype, shape and device.
inline void check_like(const char* op, const char* name, const at::Tensor& t, const char* x_name, const at::Tensor& x) {
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "myops::", op, ": ", name, " must have ", x_name, "'s dtype torch.",
              dtype_name(x.scalar_type()), "; got torch.", dtype_name(t.scalar_type()));
  TORCH_CHECK(t.sizes() == x.sizes(), "myops::", op, ": ", name, " must have ", x_name, "'s shape ", x.sizes(),
              " (no broadcasting); got ", t.sizes());
  TORCH_CHECK(t.device() == x.device(), "myops::", op, ": ", name, " must be on ", x_name, "'s device ", x.device(),
              "; got ", t.device());
}

// A weight of a rowwise op: [x.shape[-1]], x's dtype and device.
inline void check_weight(const char* op, const char* name, const at::Tensor& w, const at::Tensor& x) {
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1), "myops::", op, ": ", name, " must have shape [x.shape[-1]] = [",
              x.size(-1), "]; got ", w.sizes());
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), "myops::", op, ": ", name, " must have x's dtype torch.",
              dtype_name(x.scalar_type()), "; got torch.", dtype_name(w.scalar_type()));
  TORCH_CHECK(w.device() == x.device(), "myops::", op, ": ", name, " must be on x's device ", x.device(), "; got ",
              w.device());
}

// Inputs [0, kIn) that all have the shape of input `x_index` (x; a backward's grads come first).
template <size_t kIn>
Tensors<kIn> checked_like_x(const char* op, const Names<kIn>& names, size_t x_index, const Tensors<kIn>& in) {
  const at::Tensor& x = in[x_index];
  check_cpu_dtype(op, names[x_index], x);
  Tensors<kIn> contiguous;
  for (size_t k = 0; k < kIn; ++k) {
    if (k != x_index) check_like(op, names[k], in[k], names[x_index], x);
    contiguous[k] = in[k].contiguous();
  }
  return contiguous;
}

// Elementwise: kOut outputs of x's shape; span(in, out, count, attributes) on chunks of every tensor.
template <size_t kIn, size_t kOut, size_t kAttr, typename Span>
Tensors<kOut> elementwise(const char* op, const Names<kIn>& names, size_t x_index, const Tensors<kIn>& given,
                          const std::array<double, kAttr>& attributes, Span span) {
  const Tensors<kIn> in = checked_like_x(op, names, x_index, given);
  const at::Tensor& x = in[x_index];
  Tensors<kOut> out;
  for (auto& t : out) t = at::empty_like(x, at::MemoryFormat::Contiguous);
  // the dispatch's name must be a literal; the checks above have named the op already
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "myops::adapters", [&] {
    std::array<scalar_t, kAttr> values;
    for (size_t k = 0; k < kAttr; ++k) values[k] = static_cast<scalar_t>(attributes[k]);
    at::parallel_for(0, x.numel(), kGrainValues, [&](int64_t begin, int64_t end) {
      std::array<const scalar_t*, kIn> ip;
      std::array<scalar_t*, kOut> outp;
      for (size_t k = 0; k < kIn; ++k) ip[k] = in[k].template const_data_ptr<scalar_t>() + begin;
      for (size_t k = 0; k < kOut; ++k) outp[k] = out[k].template mutable_data_ptr<scalar_t>() + begin;
      span(ip, outp, end - begin, values);
    });
  });
  return out;
}

// Rowwise: inputs [0, kFull) have x's shape (x at x_index), [kFull, kIn) are weights [cols]; kOutFull
// outputs of x's shape, then kOutWeights of the weights' (summed over blocks of rows: a backward).
template <size_t kIn, size_t kFull, size_t kOutFull, size_t kOutWeights, size_t kAttr, typename Rows>
Tensors<kOutFull + kOutWeights> rowwise(const char* op, const Names<kIn>& names, size_t x_index,
                                        const Tensors<kIn>& given, const std::array<double, kAttr>& attributes,
                                        Rows rows_fn) {
  const at::Tensor& x0 = given[x_index];
  TORCH_CHECK(x0.dim() >= 1, "myops::", op, ": ", names[x_index],
              " must have at least one dimension (normalised over the last); got a scalar");
  for (size_t k = kFull; k < kIn; ++k) check_weight(op, names[k], given[k], x0);
  check_cpu_dtype(op, names[x_index], x0);
  Tensors<kIn> in;
  for (size_t k = 0; k < kIn; ++k) {
    if (k < kFull && k != x_index) check_like(op, names[k], given[k], names[x_index], x0);
    in[k] = given[k].contiguous();
  }
  const at::Tensor& x = in[x_index];
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  Tensors<kOutFull + kOutWeights> out;
  for (size_t k = 0; k < kOutFull; ++k) out[k] = at::empty_like(x, at::MemoryFormat::Contiguous);
  // a backward: each block of rows adds its share of the weights' grads to zeroed rows of its own
  const int64_t blocks = kOutWeights == 0 ? 0 : std::max<int64_t>(1, std::min<int64_t>(kMaxBlocks, rows));
  std::array<at::Tensor, kOutWeights> partial;
  for (auto& t : partial) t = at::zeros({blocks, cols}, x.options());
  // the dispatch's name must be a literal; the checks above have named the op already
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "myops::adapters", [&] {
    std::array<scalar_t, kAttr> values;
    for (size_t k = 0; k < kAttr; ++k) values[k] = static_cast<scalar_t>(attributes[k]);
    auto run = [&](int64_t begin, int64_t count, int64_t block) {
      std::array<const scalar_t*, kIn> ip;
      std::array<scalar_t*, kOutFull + kOutWeights> outp;
      for (size_t k = 0; k < kIn; ++k) {
        ip[k] = in[k].template const_data_ptr<scalar_t>() + (k < kFull ? begin * cols : 0);
      }
      for (size_t k = 0; k < kOutFull; ++k) outp[k] = out[k].template mutable_data_ptr<scalar_t>() + begin * cols;
      for (size_t k = 0; k < kOutWeights; ++k) {
        outp[kOutFull + k] = partial[k].template mutable_data_ptr<scalar_t>() + block * cols;
      }
      rows_fn(ip, outp, count, cols, values);
    };
    if (kOutWeights == 0) {
      const int64_t rows_per_task = std::max<int64_t>(1, kGrainValues / std::max<int64_t>(cols, 1));
      at::parallel_for(0, rows, rows_per_task, [&](int64_t begin, int64_t end) { run(begin, end - begin, 0); });
    } else {
      const int64_t block_rows = rows == 0 ? 0 : (rows + blocks - 1) / blocks;
      at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
        for (int64_t b = first; b < last; ++b) {
          const int64_t begin = std::min(rows, b * block_rows);
          run(begin, std::min(rows, begin + block_rows) - begin, b);
        }
      });
    }
  });
  for (size_t k = 0; k < kOutWeights; ++k) out[kOutFull + k] = partial[k].sum(0);
  return out;
}

}  // namespace adapters
}  // namespace myops
