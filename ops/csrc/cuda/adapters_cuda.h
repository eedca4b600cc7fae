// The CUDA side of every op of a kind, written once: checks, the device guard, contiguous inputs,
// outputs, PyTorch's current stream, then the op's host launcher (kernels/<op>_cuda.h), whose status
// is checked. opspec/codegen writes the few lines per op that call these. The launchers take
// pointers in the order of the CPU loops (ops/csrc/adapters.h), then the storage type and the stream:
//   elementwise  forward(inputs..., outputs..., n, attributes..., dtype, stream), backward likewise
//   rowwise      forward(full inputs..., weights..., outputs..., rows, cols, attributes..., dtype, stream)
//                backward(grads..., full inputs..., weights..., their grads..., workspace, rows, cols,
//                         attributes..., dtype, stream), with backward_workspace_floats(rows, cols)
// NOTE: c10's stream/guard headers rather than ATen/cuda/CUDAContext.h, which drags in cuBLAS and
// cuSPARSE headers the kernels do not use (and a bare nvcc install does not have).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <cstddef>

#include "../dtype_name.h"
#include "cuda_dtype.h"

namespace myops {
// Named, not anonymous: nvcc hashes the file's path into an anonymous namespace's name, which would
// make two checkouts build different binaries; hidden, as an anonymous namespace's symbols would be.
namespace __attribute__((visibility("hidden"))) cuda_adapters {

template <size_t N>
using Tensors = std::array<at::Tensor, N>;
template <size_t N>
using Names = std::array<const char*, N>;
template <size_t N>
using Pointers = std::array<const void*, N>;
template <size_t N>
using OutPointers = std::array<void*, N>;

inline myops_cuda::DType checked_dtype(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda(), "myops::", op, " (CUDA): ", name, " must be a CUDA tensor; got ", t.device());
  switch (t.scalar_type()) {
    case at::kFloat: return myops_cuda::DType::kFloat32;
    case at::kHalf: return myops_cuda::DType::kFloat16;
    case at::kBFloat16: return myops_cuda::DType::kBFloat16;
    default:
      TORCH_CHECK(false, "myops::", op, " (CUDA): ", name, " must be float32, float16 or bfloat16; got torch.",
                  dtype_name(t.scalar_type()));
  }
}

inline void check_like(const char* op, const char* name, const at::Tensor& t, const char* x_name, const at::Tensor& x) {
  TORCH_CHECK(t.scalar_type() == x.scalar_type() && t.sizes() == x.sizes() && t.device() == x.device(), "myops::", op,
              " (CUDA): ", name, " must match ", x_name, " (torch.", dtype_name(x.scalar_type()), ", ", x.sizes(), ", ",
              x.device(), "); got torch.", dtype_name(t.scalar_type()), ", ", t.sizes(), ", ", t.device());
}

inline void check_weight(const char* op, const char* name, const at::Tensor& w, const at::Tensor& x) {
  TORCH_CHECK(w.device() == x.device(), "myops::", op, ": x and ", name, " must be on the same device; got x on ",
              x.device(), " and ", name, " on ", w.device(), ". Move both with .to(device) first.");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1) && w.scalar_type() == x.scalar_type(), "myops::", op,
              " (CUDA): ", name, " must be [", x.size(-1), "] of x's dtype on x's device; got ", w.sizes(), " torch.",
              dtype_name(w.scalar_type()), " on ", w.device());
}

inline void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "myops::", op, " (CUDA): kernel launch failed: ", cudaGetErrorString(err),
              ". If this says 'no kernel image is available', rebuild with TORCH_CUDA_ARCH_LIST covering this GPU.");
}

// Elementwise: launch(in, out, n, dtype, stream) on whole tensors; kOut outputs of x's shape.
template <size_t kIn, size_t kOut, typename Launch>
Tensors<kOut> elementwise(const char* op, const Names<kIn>& names, size_t x_index, const Tensors<kIn>& given,
                          Launch launch) {
  const auto dtype = checked_dtype(op, names[x_index], given[x_index]);
  for (size_t k = 0; k < kIn; ++k) {
    if (k != x_index) check_like(op, names[k], given[k], names[x_index], given[x_index]);
  }
  const c10::cuda::CUDAGuard guard(given[x_index].device());
  Tensors<kIn> in;
  for (size_t k = 0; k < kIn; ++k) in[k] = given[k].contiguous();
  Tensors<kOut> out;
  for (auto& t : out) t = at::empty_like(in[x_index], at::MemoryFormat::Contiguous);
  if (in[x_index].numel() == 0) return out;
  Pointers<kIn> ip;
  OutPointers<kOut> outp;
  for (size_t k = 0; k < kIn; ++k) ip[k] = in[k].const_data_ptr();
  for (size_t k = 0; k < kOut; ++k) outp[k] = out[k].mutable_data_ptr();
  check_launch(op, launch(ip, outp, in[x_index].numel(), dtype, c10::cuda::getCurrentCUDAStream()));
  return out;
}

// Rowwise: as ops/csrc/adapters.h's; the weights' grads (kOutWeights) come whole from the launcher,
// which gets workspace_floats(rows, cols) floats of scratch (a backward's partial sums).
template <size_t kIn, size_t kFull, size_t kOutFull, size_t kOutWeights, typename Workspace, typename Launch>
Tensors<kOutFull + kOutWeights> rowwise(const char* op, const Names<kIn>& names, size_t x_index,
                                        const Tensors<kIn>& given, Workspace workspace_floats, Launch launch) {
  const at::Tensor& x0 = given[x_index];
  TORCH_CHECK(x0.dim() >= 1, "myops::", op, ": ", names[x_index],
              " must have at least one dimension (normalised over the last)");
  for (size_t k = kFull; k < kIn; ++k) check_weight(op, names[k], given[k], x0);
  const auto dtype = checked_dtype(op, names[x_index], x0);
  for (size_t k = 0; k < kFull; ++k) {
    if (k != x_index) check_like(op, names[k], given[k], names[x_index], x0);
  }
  const c10::cuda::CUDAGuard guard(x0.device());
  Tensors<kIn> in;
  for (size_t k = 0; k < kIn; ++k) in[k] = given[k].contiguous();
  const at::Tensor& x = in[x_index];
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  Tensors<kOutFull + kOutWeights> out;
  for (size_t k = 0; k < kOutFull; ++k) out[k] = at::empty_like(x, at::MemoryFormat::Contiguous);
  for (size_t k = 0; k < kOutWeights; ++k) out[kOutFull + k] = at::empty_like(in[kFull + k], at::MemoryFormat::Contiguous);
  const int64_t scratch = workspace_floats(rows, cols);
  at::Tensor workspace;  // none where none is asked for: a forward allocates nothing more than its outputs
  if (scratch > 0) workspace = at::empty({scratch}, x.options().dtype(at::kFloat));
  Pointers<kIn> ip;
  OutPointers<kOutFull + kOutWeights> outp;
  for (size_t k = 0; k < kIn; ++k) ip[k] = in[k].const_data_ptr();
  for (size_t k = 0; k < kOutFull + kOutWeights; ++k) outp[k] = out[k].mutable_data_ptr();
  check_launch(op, launch(ip, outp, scratch > 0 ? workspace.mutable_data_ptr<float>() : nullptr, rows, cols, dtype,
                          c10::cuda::getCurrentCUDAStream()));
  return out;
}

inline int64_t no_workspace(int64_t, int64_t) { return 0; }

}  // namespace cuda_adapters
}  // namespace myops
