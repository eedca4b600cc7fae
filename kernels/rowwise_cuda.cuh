// The CUDA kernels of a row-wise op whose math is kernels/<op>.h's per-element functions: storage in
// float32, float16 or bfloat16, every sum in float32. One block per row: each thread sums its slice, a
// warp shuffle reduction, then one across the block's warps through shared memory; the row sums are
// combined by the op's merge(), the gradient sums added. The weight gradients are summed per chunk of
// rows, then the chunks in order: no atomics, so the result is the same on every run. (RMSNorm keeps
// kernels of its own, kernels/rms_norm_cuda.cu, with rows held in registers.)
//
// Op is the struct opspec/codegen writes (kernels/rowwise_cpu.h says what it holds); the math's
// functions are found by argument-dependent lookup. Header templates: each .cu instantiates its own.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "cuda_dtype.h"
#include "cuda_reduce.cuh"
#include "cuda_storage.cuh"

namespace rowwise_cuda {

constexpr int kThreads = 256;
constexpr int kMaxWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = 65535;
constexpr int64_t kChunkRows = 64;
constexpr int64_t kMaxChunks = 65535;

using myops_cuda::DType;
using myops_cuda::from_float;
using myops_cuda::to_float;

template <typename S, int kWeights>
struct Weights {
  S* p[kWeights];
};

// What the backward keeps of each row for the weight gradients (in the workspace).
template <typename Op>
struct RowStats {
  typename Op::template Row<float> row;
  typename Op::template GradSums<float> gs;
};

template <typename Op>
constexpr int64_t row_floats() {
  static_assert(sizeof(RowStats<Op>) % sizeof(float) == 0,
                "Row<float> and GradSums<float> must be made of floats (kept in the workspace)");
  return sizeof(RowStats<Op>) / sizeof(float);
}

struct ToFloat {
  template <typename S>
  __device__ float operator()(S v) const { return to_float(v); }
};

using myops_cuda::block_sum;  // a block's sum of one float (kernels/cuda_reduce.cuh)

// The warp's row sums merged by a butterfly: of two partners, the lower lane's sums go first, so both
// compute the same bits and every lane ends with the warp's result.
template <typename Op>
__device__ __forceinline__ typename Op::template Sums<float> warp_merge(typename Op::template Sums<float> s) {
  using Sums = typename Op::template Sums<float>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const Sums o{__shfl_xor_sync(0xffffffffu, s.a, offset), __shfl_xor_sync(0xffffffffu, s.b, offset)};
    // Operands chosen, then one call: both branches of a diverged warp would each run merge().
    const bool upper = lane & offset;
    Sums lower = upper ? o : s;
    merge(lower, upper ? s : o);
    s = lower;
  }
  return s;
}

// The block's row sums: each warp's by warp_merge, then the warps' results by the same butterfly in the
// first lanes, returned to every thread; scratch holds 2 * kMaxWarps floats.
template <typename Op>
__device__ __forceinline__ typename Op::template Sums<float> block_merge(typename Op::template Sums<float> s,
                                                                         float* scratch) {
  using Sums = typename Op::template Sums<float>;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  s = warp_merge<Op>(s);
  __syncthreads();
  if (lane == 0) scratch[warp] = s.a, scratch[kMaxWarps + warp] = s.b;
  __syncthreads();
  Sums w;
  if (lane < static_cast<int>(blockDim.x / 32)) w = {scratch[lane], scratch[kMaxWarps + lane]};
  return warp_merge<Op>(w);
}

template <typename Op, typename S>
using Ptrs = Weights<const S, Op::kWeights>;

template <typename Op, typename S>
__device__ typename Op::template Row<float> row_of(const S* xr, const Ptrs<Op, S>& w, int64_t cols,
                                                   const typename Op::Attributes& at, float* scratch) {
  typename Op::template Sums<float> s;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    accumulate(s, to_float(xr[j]), Op::template load<float>(w.p, j, ToFloat{}), at);
  }
  return finish(block_merge<Op>(s, scratch), cols, at);
}

// kNormalize: the row's sum of forward()'s values, returned to every thread (recomputed by the output
// pass rather than stored: the GPU has arithmetic to spare, and a float16 y would round twice).
template <typename Op, typename S>
__device__ float output_sum(const S* xr, const Ptrs<Op, S>& w, const typename Op::template Row<float>& r, int64_t cols,
                            const typename Op::Attributes& at, float* scratch) {
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    s += forward(to_float(xr[j]), r, Op::template load<float>(w.p, j, ToFloat{}), at);
  }
  return block_sum(s, scratch);
}

template <typename Op, typename S>
__global__ void forward_kernel(const S* x, Ptrs<Op, S> w, S* y, int64_t rows, int64_t cols,
                               typename Op::Attributes at) {
  __shared__ float scratch[2 * kMaxWarps];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const S* xr = x + row * cols;
    const auto r = row_of<Op>(xr, w, cols, at, scratch);
    const float scale = Op::kNormalize ? 1.0f / output_sum<Op>(xr, w, r, cols, at, scratch) : 1.0f;  // v * 1 is v
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      y[row * cols + j] = from_float<S>(forward(to_float(xr[j]), r, Op::template load<float>(w.p, j, ToFloat{}), at) *
                                        scale);
    }
  }
}

// dx per row; each row's statistics and gradient sums kept in `stats` for the weight gradients.
template <typename Op, typename S>
__global__ void backward_dx_kernel(const S* grad, const S* x, Ptrs<Op, S> w, S* dx, RowStats<Op>* stats, int64_t rows,
                                   int64_t cols, typename Op::Attributes at) {
  __shared__ float scratch[2 * kMaxWarps];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const S* gr = grad + row * cols;
    const S* xr = x + row * cols;
    auto r = row_of<Op>(xr, w, cols, at, scratch);
    if constexpr (Op::kNormalize) r = with_output_sum(r, output_sum<Op>(xr, w, r, cols, at, scratch));
    typename Op::template GradSums<float> gs;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      accumulate_grad(gs, to_float(gr[j]), to_float(xr[j]), r, Op::template load<float>(w.p, j, ToFloat{}), at);
    }
    gs.a = block_sum(gs.a, scratch);
    gs.b = block_sum(gs.b, scratch);
    if (threadIdx.x == 0) stats[row] = {r, gs};
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      dx[row * cols + j] = from_float<S>(
          backward(to_float(gr[j]), to_float(xr[j]), r, gs, Op::template load<float>(w.p, j, ToFloat{}), cols, at));
    }
  }
}

// partial[chunk][k][j]: the chunk's rows' share of weight k's gradient at column j, one thread per column.
template <typename Op, typename S>
__global__ void backward_dw_partial_kernel(const S* grad, const S* x, Ptrs<Op, S> w, const RowStats<Op>* stats,
                                           float* partial, int64_t rows, int64_t cols, int64_t rows_per_chunk,
                                           typename Op::Attributes at) {
  constexpr int kWeights = Op::kWeights;
  const int64_t chunk = blockIdx.y;
  const int64_t first = chunk * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto channel = Op::template load<float>(w.p, j, ToFloat{});
    float sums[kWeights] = {};
    for (int64_t row = first; row < last; ++row) {
      float shares[kWeights];
      const RowStats<Op>& st = stats[row];
      Op::values(weight_grads(to_float(grad[row * cols + j]), to_float(x[row * cols + j]), st.row, st.gs, channel, at),
                 shares);
#pragma unroll
      for (int k = 0; k < kWeights; ++k) sums[k] += shares[k];
    }
#pragma unroll
    for (int k = 0; k < kWeights; ++k) partial[(chunk * kWeights + k) * cols + j] = sums[k];
  }
}

template <int kWeights, typename S>
__global__ void backward_dw_final_kernel(const float* partial, Weights<S, kWeights> dw, int64_t chunks, int64_t cols) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
#pragma unroll
    for (int k = 0; k < kWeights; ++k) {
      float sum = 0.0f;
      for (int64_t c = 0; c < chunks; ++c) sum += partial[(c * kWeights + k) * cols + j];
      dw.p[k][j] = from_float<S>(sum);
    }
  }
}

inline int64_t chunks_for(int64_t rows) {
  return std::min<int64_t>((rows + kChunkRows - 1) / kChunkRows, kMaxChunks);
}

inline unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, kMaxBlocks)); }

template <typename Op, typename P>
Weights<P, Op::kWeights> typed(void* const* given) {
  Weights<P, Op::kWeights> w;
  for (int k = 0; k < Op::kWeights; ++k) w.p[k] = static_cast<P*>(given[k]);
  return w;
}

template <typename Op, typename S>
cudaError_t launch_forward(const void* x, const void* const* weights, void* y, int64_t rows, int64_t cols,
                           const typename Op::Attributes& at, cudaStream_t stream) {
  const auto w = typed<Op, const S>(const_cast<void* const*>(weights));
  forward_kernel<Op, S><<<row_blocks(rows), kThreads, 0, stream>>>(static_cast<const S*>(x), w, static_cast<S*>(y),
                                                                    rows, cols, at);
  return cudaGetLastError();
}

template <typename Op, typename S>
cudaError_t launch_backward(const void* grad, const void* x, const void* const* weights, void* dx, void* const* dw,
                            float* workspace, int64_t rows, int64_t cols, const typename Op::Attributes& at,
                            cudaStream_t stream) {
  const auto* g = static_cast<const S*>(grad);
  const auto* xs = static_cast<const S*>(x);
  const auto w = typed<Op, const S>(const_cast<void* const*>(weights));
  auto* stats = reinterpret_cast<RowStats<Op>*>(workspace);
  backward_dx_kernel<Op, S><<<row_blocks(rows), kThreads, 0, stream>>>(g, xs, w, static_cast<S*>(dx), stats, rows,
                                                                        cols, at);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  const auto column_blocks = static_cast<unsigned>(std::min<int64_t>((cols + kThreads - 1) / kThreads, kMaxBlocks));
  const int64_t chunks = chunks_for(rows);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  float* partial = workspace + rows * row_floats<Op>();
  backward_dw_partial_kernel<Op, S><<<dim3(column_blocks, static_cast<unsigned>(chunks)), kThreads, 0, stream>>>(
      g, xs, w, stats, partial, rows, cols, rows_per_chunk, at);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  backward_dw_final_kernel<Op::kWeights, S><<<column_blocks, kThreads, 0, stream>>>(partial, typed<Op, S>(dw),
                                                                                   chunks, cols);
  return cudaGetLastError();
}

// y[rows, cols] from x and weights[k][cols]; the launch status (cudaGetLastError), not synchronised.
template <typename Op>
cudaError_t forward_rows(const void* x, const void* const* weights, void* y, int64_t rows, int64_t cols,
                    const typename Op::Attributes& at, DType dtype, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat16: return launch_forward<Op, __half>(x, weights, y, rows, cols, at, stream);
    case DType::kBFloat16: return launch_forward<Op, __nv_bfloat16>(x, weights, y, rows, cols, at, stream);
    default: return launch_forward<Op, float>(x, weights, y, rows, cols, at, stream);
  }
}

// The floats of device memory backward_rows() needs: each row's statistics and gradient sums, then the weight
// gradients' per-chunk partial sums.
template <typename Op>
int64_t backward_workspace_floats(int64_t rows, int64_t cols) {
  return rows * row_floats<Op>() + chunks_for(rows) * Op::kWeights * cols;
}

template <typename Op>
cudaError_t backward_rows(const void* grad, const void* x, const void* const* weights, void* dx, void* const* dw,
                     float* workspace, int64_t rows, int64_t cols, const typename Op::Attributes& at, DType dtype,
                     cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  if (rows == 0) {
    const size_t bytes = static_cast<size_t>(cols) * (dtype == DType::kFloat32 ? 4 : 2);
    for (int k = 0; k < Op::kWeights; ++k) {
      if (const cudaError_t err = cudaMemsetAsync(dw[k], 0, bytes, stream); err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
  switch (dtype) {
    case DType::kFloat16:
      return launch_backward<Op, __half>(grad, x, weights, dx, dw, workspace, rows, cols, at, stream);
    case DType::kBFloat16:
      return launch_backward<Op, __nv_bfloat16>(grad, x, weights, dx, dw, workspace, rows, cols, at, stream);
    default:
      return launch_backward<Op, float>(grad, x, weights, dx, dw, workspace, rows, cols, at, stream);
  }
}

}  // namespace rowwise_cuda
