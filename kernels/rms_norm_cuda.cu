// CUDA kernels for RMSNorm, shared by the PyTorch extension and the ORT plugin. Storage in float32,
// float16 or bfloat16; every sum in float32. One block per row: each thread sums its slice, then a
// warp shuffle reduction and one across the block's warps through shared memory. Where a row is
// whole 16-byte packs (and the pointers aligned), each thread keeps its packs of the row in registers
// between the sum and the output, so x is read once; otherwise a scalar kernel reads it twice.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda_reduce.cuh"
#include "cuda_storage.cuh"
#include "rms_norm_cuda.h"

namespace rms_norm {
namespace cuda {
// Named and hidden, not anonymous: nvcc names anonymous namespaces after a hash of the source file's
// path, which would make two checkouts build different binaries.
namespace __attribute__((visibility("hidden"))) internal {

constexpr int kThreads = 256;       // the scalar kernels' block, and the packed kernels' aim
constexpr int kMaxThreads = 512;  // the packed kernels' launch bound: at most 128 registers
constexpr int kMaxWarps = kMaxThreads / 32;
constexpr int kMaxPacksPerThread = 8;
constexpr int64_t kMaxBlocks = 65535;

using myops_cuda::block_sum;
using myops_cuda::from_float;
using myops_cuda::is_aligned;
using myops_cuda::Pack;
using myops_cuda::kPackSize;
using myops_cuda::to_float;

__device__ __forceinline__ float inv_rms(float sum_squares, int64_t cols, float eps) {
  return rsqrtf(sum_squares / static_cast<float>(cols) + eps);
}

template <typename T>
__global__ void forward_kernel(const T* x, const T* w, T* y, int64_t rows, int64_t cols, float eps) {
  __shared__ float scratch[kMaxWarps];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    float squares = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float v = to_float(xr[j]);
      squares += v * v;
    }
    const float inv = inv_rms(block_sum(squares, scratch), cols, eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      yr[j] = from_float<T>((to_float(xr[j]) * inv) * to_float(w[j]));
    }
  }
}

// dx per row (as kernels/rms_norm.h), and each row's inv_rms kept for the dw pass.
template <typename T>
__global__ void backward_dx_kernel(const T* grad, const T* x, const T* w, T* dx, float* inv_out, int64_t rows,
                                   int64_t cols, float eps) {
  __shared__ float scratch[kMaxWarps];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* gr = grad + row * cols;
    const T* xr = x + row * cols;
    float squares = 0.0f;
    float gwx = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float v = to_float(xr[j]);
      squares += v * v;
      gwx += to_float(gr[j]) * to_float(w[j]) * v;
    }
    const float inv = inv_rms(block_sum(squares, scratch), cols, eps);
    const float coeff = inv * inv * inv * block_sum(gwx, scratch) / static_cast<float>(cols);
    if (threadIdx.x == 0) inv_out[row] = inv;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float g = to_float(gr[j]) * to_float(w[j]);
      dx[row * cols + j] = from_float<T>(inv * g - to_float(xr[j]) * coeff);
    }
  }
}

// The packed forward: kPacks packs of the row per thread, held in registers between the two steps.
template <typename T, int kPacks>
__global__ void __launch_bounds__(kMaxThreads) forward_packed_kernel(const T* x, const T* w, T* y, int64_t rows, int64_t cols, float eps) {
  constexpr int N = kPackSize<T>;
  using P = Pack<T, N>;
  __shared__ float scratch[kMaxWarps];
  const int64_t packs = cols / N;
  const auto* wp = reinterpret_cast<const P*>(w);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const auto* xr = reinterpret_cast<const P*>(x + row * cols);
    auto* yr = reinterpret_cast<P*>(y + row * cols);
    P xs[kPacks];
    float squares = 0.0f;
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int64_t p = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (p < packs) {
        xs[i] = xr[p];
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float v = to_float(xs[i].v[k]);
          squares += v * v;
        }
      }
    }
    const float inv = inv_rms(block_sum(squares, scratch), cols, eps);
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int64_t p = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (p < packs) {
        const P ws = wp[p];
        P out;
#pragma unroll
        for (int k = 0; k < N; ++k) out.v[k] = from_float<T>((to_float(xs[i].v[k]) * inv) * to_float(ws.v[k]));
        yr[p] = out;
      }
    }
  }
}

// The packed dx: x and grad kept in registers, the same formulas as backward_dx_kernel.
template <typename T, int kPacks>
__global__ void __launch_bounds__(kMaxThreads) backward_dx_packed_kernel(const T* grad, const T* x, const T* w, T* dx, float* inv_out, int64_t rows,
                                          int64_t cols, float eps) {
  constexpr int N = kPackSize<T>;
  using P = Pack<T, N>;
  __shared__ float scratch[kMaxWarps];
  const int64_t packs = cols / N;
  const auto* wp = reinterpret_cast<const P*>(w);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const auto* gr = reinterpret_cast<const P*>(grad + row * cols);
    const auto* xr = reinterpret_cast<const P*>(x + row * cols);
    auto* dr = reinterpret_cast<P*>(dx + row * cols);
    P xs[kPacks];
    P gs[kPacks];
    float squares = 0.0f;
    float gwx = 0.0f;
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int64_t p = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (p < packs) {
        xs[i] = xr[p];
        gs[i] = gr[p];
        const P ws = wp[p];
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float v = to_float(xs[i].v[k]);
          squares += v * v;
          gwx += to_float(gs[i].v[k]) * to_float(ws.v[k]) * v;
        }
      }
    }
    const float inv = inv_rms(block_sum(squares, scratch), cols, eps);
    const float coeff = inv * inv * inv * block_sum(gwx, scratch) / static_cast<float>(cols);
    if (threadIdx.x == 0) inv_out[row] = inv;
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int64_t p = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (p < packs) {
        const P ws = wp[p];
        P out;
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float g = to_float(gs[i].v[k]) * to_float(ws.v[k]);
          out.v[k] = from_float<T>(inv * g - to_float(xs[i].v[k]) * coeff);
        }
        dr[p] = out;
      }
    }
  }
}

// How a row is spread over a block: packs per thread (0: the scalar kernels) and threads. Packed when
// the row is whole packs, every pointer aligned, and the row fits kMaxThreads * kMaxPacksPerThread
// packs; the fewest packs per thread that keep the block within kThreads, else more threads.
struct RowPlan {
  int packs_per_thread;
  int threads;
};

RowPlan plan_rows(int64_t cols, int64_t elements_per_pack, bool aligned) {
  const int64_t packs = cols / elements_per_pack;
  if (!aligned || cols % elements_per_pack != 0 || packs > int64_t{kMaxThreads} * kMaxPacksPerThread) {
    return {0, kThreads};
  }
  int per_thread = 1;
  while (per_thread < kMaxPacksPerThread && packs > int64_t{kThreads} * per_thread) per_thread *= 2;
  const int64_t needed = (packs + per_thread - 1) / per_thread;
  return {per_thread, static_cast<int>(std::max<int64_t>((needed + 31) / 32 * 32, 32))};
}

// dw[j] = sum over rows of grad * x * inv, in two passes with no atomics (so the order of the sums
// is fixed): each block of the first sums one chunk of kChunkRows rows for a strip of columns, one
// thread per column (neighbouring threads read neighbouring addresses); the second adds the chunks
// of each column in order. One pass over all rows per column left most of a large GPU idle.
constexpr int64_t kChunkRows = 64;
constexpr int64_t kMaxChunks = 65535;

int64_t chunks_for(int64_t rows) { return std::min<int64_t>((rows + kChunkRows - 1) / kChunkRows, kMaxChunks); }

template <typename T>
__global__ void backward_dw_partial_kernel(const T* grad, const T* x, const float* inv, float* partial, int64_t rows,
                                           int64_t cols, int64_t rows_per_chunk) {
  const int64_t chunk = blockIdx.y;
  const int64_t first = chunk * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t row = first; row < last; ++row) {
      sum += to_float(grad[row * cols + j]) * (to_float(x[row * cols + j]) * inv[row]);
    }
    partial[chunk * cols + j] = sum;
  }
}

template <typename T>
__global__ void backward_dw_final_kernel(const float* partial, T* dw, int64_t chunks, int64_t cols) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * cols + j];
    dw[j] = from_float<T>(sum);
  }
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, kMaxBlocks)); }

template <typename T>
cudaError_t launch_forward(const void* x, const void* w, void* y, int64_t rows, int64_t cols, float eps,
                           cudaStream_t stream) {
  const auto* xt = static_cast<const T*>(x);
  const auto* wt = static_cast<const T*>(w);
  auto* yt = static_cast<T*>(y);
  const RowPlan plan = plan_rows(cols, kPackSize<T>, is_aligned(x) && is_aligned(w) && is_aligned(y));
  const unsigned blocks = row_blocks(rows);
  switch (plan.packs_per_thread) {
    case 1: forward_packed_kernel<T, 1><<<blocks, plan.threads, 0, stream>>>(xt, wt, yt, rows, cols, eps); break;
    case 2: forward_packed_kernel<T, 2><<<blocks, plan.threads, 0, stream>>>(xt, wt, yt, rows, cols, eps); break;
    case 4: forward_packed_kernel<T, 4><<<blocks, plan.threads, 0, stream>>>(xt, wt, yt, rows, cols, eps); break;
    case 8: forward_packed_kernel<T, 8><<<blocks, plan.threads, 0, stream>>>(xt, wt, yt, rows, cols, eps); break;
    default: forward_kernel<T><<<blocks, kThreads, 0, stream>>>(xt, wt, yt, rows, cols, eps);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_backward_dx(const T* g, const T* xt, const T* wt, T* dx, float* inv, int64_t rows, int64_t cols,
                               float eps, cudaStream_t stream) {
  const RowPlan plan = plan_rows(cols, kPackSize<T>, is_aligned(g) && is_aligned(xt) && is_aligned(wt) &&
                                                           is_aligned(dx));
  const unsigned blocks = row_blocks(rows);
  const int threads = plan.threads;
  switch (plan.packs_per_thread) {
    case 1: backward_dx_packed_kernel<T, 1><<<blocks, threads, 0, stream>>>(g, xt, wt, dx, inv, rows, cols, eps); break;
    case 2: backward_dx_packed_kernel<T, 2><<<blocks, threads, 0, stream>>>(g, xt, wt, dx, inv, rows, cols, eps); break;
    case 4: backward_dx_packed_kernel<T, 4><<<blocks, threads, 0, stream>>>(g, xt, wt, dx, inv, rows, cols, eps); break;
    case 8: backward_dx_packed_kernel<T, 8><<<blocks, threads, 0, stream>>>(g, xt, wt, dx, inv, rows, cols, eps); break;
    default: backward_dx_kernel<T><<<blocks, kThreads, 0, stream>>>(g, xt, wt, dx, inv, rows, cols, eps);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_backward(const void* grad, const void* x, const void* w, void* dx, void* dw, float* inv,
                            int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  const auto* g = static_cast<const T*>(grad);
  const auto* xt = static_cast<const T*>(x);
  const cudaError_t dx_err = launch_backward_dx<T>(g, xt, static_cast<const T*>(w), static_cast<T*>(dx), inv, rows,
                                                   cols, eps, stream);
  if (dx_err != cudaSuccess) return dx_err;
  const auto column_blocks = static_cast<unsigned>(std::min<int64_t>((cols + kThreads - 1) / kThreads, kMaxBlocks));
  const int64_t chunks = chunks_for(rows);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  float* partial = inv + rows;
  backward_dw_partial_kernel<T><<<dim3(column_blocks, static_cast<unsigned>(chunks)), kThreads, 0, stream>>>(
      g, xt, inv, partial, rows, cols, rows_per_chunk);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  backward_dw_final_kernel<T><<<column_blocks, kThreads, 0, stream>>>(partial, static_cast<T*>(dw), chunks, cols);
  return cudaGetLastError();
}

}  // namespace internal

cudaError_t forward(const void* x, const void* weight, void* y, int64_t rows, int64_t cols, float eps, DType dtype,
                    cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat16: return internal::launch_forward<__half>(x, weight, y, rows, cols, eps, stream);
    case DType::kBFloat16: return internal::launch_forward<__nv_bfloat16>(x, weight, y, rows, cols, eps, stream);
    default: return internal::launch_forward<float>(x, weight, y, rows, cols, eps, stream);
  }
}

int64_t backward_workspace_floats(int64_t rows, int64_t cols) { return rows + internal::chunks_for(rows) * cols; }

cudaError_t backward(const void* grad, const void* x, const void* weight, void* dx, void* dw, float* workspace,
                     int64_t rows, int64_t cols, float eps, DType dtype, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  if (rows == 0) return cudaMemsetAsync(dw, 0, static_cast<size_t>(cols) * (dtype == DType::kFloat32 ? 4 : 2), stream);
  switch (dtype) {
    case DType::kFloat16:
      return internal::launch_backward<__half>(grad, x, weight, dx, dw, workspace, rows, cols, eps, stream);
    case DType::kBFloat16:
      return internal::launch_backward<__nv_bfloat16>(grad, x, weight, dx, dw, workspace, rows, cols, eps,
                                                      stream);
    default:
      return internal::launch_backward<float>(grad, x, weight, dx, dw, workspace, rows, cols, eps, stream);
  }
}

}  // namespace cuda
}  // namespace rms_norm
