// The elementwise launcher every CUDA op of the lab shares: `op(a[i], b[i])` (b may be absent) over
// n elements of float, half or bfloat16, computed in float32. A kernel file defines its functors and
// calls myops_cuda::dispatch (see kernels/copy_cuda.cu), or dispatch_many for several inputs and outputs (the
// launchers opspec/codegen writes from an elementwise op's math). Header templates: each .cu instantiates its own.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "cuda_storage.cuh"

namespace myops_cuda {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

// Applies `op` to n elements. Vector body (one 16-byte pack per thread and step) when every pointer
// is 16-byte aligned, scalar tail, and a scalar path otherwise. Indices are int64: tensors beyond 2^31
// elements are fine. Two or four packs per thread and step were measured on an H200 (float32 and
// float16, 64x2048x768): no faster than one, float32 up to 3 % slower with four.
template <typename T, typename Op>
__global__ void elementwise(int64_t n, bool aligned, Op op, const T* a, const T* b, T* out) {
  constexpr int N = kPackSize<T>;
  using P = Pack<T, N>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (aligned) {
    const int64_t packs = n / N;
    for (int64_t p = tid; p < packs; p += stride) {
      const P pa = reinterpret_cast<const P*>(a)[p];
      P pb;
      if (b != nullptr) pb = reinterpret_cast<const P*>(b)[p];
      P po;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        po.v[k] = from_float<T>(op(to_float(pa.v[k]), b != nullptr ? to_float(pb.v[k]) : 0.0f));
      }
      reinterpret_cast<P*>(out)[p] = po;
    }
    done = packs * N;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    out[i] = from_float<T>(op(to_float(a[i]), b != nullptr ? to_float(b[i]) : 0.0f));
  }
}

template <typename T, typename Op>
cudaError_t launch(Op op, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int N = kPackSize<T>;
  const bool aligned = is_aligned(a) && is_aligned(out) && (b == nullptr || is_aligned(b));
  const int64_t work = aligned ? std::max<int64_t>(n / N, 1) : n;
  const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, kMaxBlocks);
  elementwise<T, Op><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      n, aligned, op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out));
  return cudaGetLastError();
}

template <typename DType, typename Op>
cudaError_t dispatch(DType dtype, Op op, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat16: return launch<__half>(op, a, b, out, n, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(op, a, b, out, n, stream);
    default: return launch<float>(op, a, b, out, n, stream);
  }
}

// The same for ops of several same-shaped inputs and outputs (a gated op's forward: x and gate in, y out;
// its backward: grad, x and gate in, dx and dgate out): `op(in, out)` on float arrays of kIn and kOut
// values per element. Pointers travel by value in a struct (kernel arguments), so no device memory is
// allocated for them.
template <typename T, int kIn, int kOut>
struct Pointers {
  const T* in[kIn];
  T* out[kOut];
};

template <typename T, int kIn, int kOut, typename Op>
__global__ void elementwise_many(int64_t n, bool aligned, Op op, Pointers<T, kIn, kOut> p) {
  constexpr int N = kPackSize<T>;
  using P = Pack<T, N>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float in[kIn];
  float out[kOut];
  int64_t done = 0;
  if (aligned) {
    const int64_t packs = n / N;
    for (int64_t q = tid; q < packs; q += stride) {
      P pin[kIn];
      P pout[kOut];
#pragma unroll
      for (int i = 0; i < kIn; ++i) pin[i] = reinterpret_cast<const P*>(p.in[i])[q];
#pragma unroll
      for (int k = 0; k < N; ++k) {
#pragma unroll
        for (int i = 0; i < kIn; ++i) in[i] = to_float(pin[i].v[k]);
        op(in, out);
#pragma unroll
        for (int o = 0; o < kOut; ++o) pout[o].v[k] = from_float<T>(out[o]);
      }
#pragma unroll
      for (int o = 0; o < kOut; ++o) reinterpret_cast<P*>(p.out[o])[q] = pout[o];
    }
    done = packs * N;
  }
  for (int64_t e = done + tid; e < n; e += stride) {
#pragma unroll
    for (int i = 0; i < kIn; ++i) in[i] = to_float(p.in[i][e]);
    op(in, out);
#pragma unroll
    for (int o = 0; o < kOut; ++o) p.out[o][e] = from_float<T>(out[o]);
  }
}

template <typename T, int kIn, int kOut, typename Op>
cudaError_t launch_many(Op op, const void* const (&in)[kIn], void* const (&out)[kOut], int64_t n,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int N = kPackSize<T>;
  Pointers<T, kIn, kOut> p{};
  bool aligned = true;
  for (int i = 0; i < kIn; ++i) {
    p.in[i] = static_cast<const T*>(in[i]);
    aligned = aligned && is_aligned(in[i]);
  }
  for (int o = 0; o < kOut; ++o) {
    p.out[o] = static_cast<T*>(out[o]);
    aligned = aligned && is_aligned(out[o]);
  }
  const int64_t work = aligned ? std::max<int64_t>(n / N, 1) : n;
  const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, kMaxBlocks);
  elementwise_many<T, kIn, kOut, Op><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(n, aligned, op, p);
  return cudaGetLastError();
}

// op16 for float16 and bfloat16 storage (an op's faster 16-bit forward: opspec forward_16bit), op for float.
template <typename DType, int kIn, int kOut, typename Op, typename Op16>
cudaError_t dispatch_many(DType dtype, Op op, Op16 op16, const void* const (&in)[kIn], void* const (&out)[kOut],
                          int64_t n, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat16: return launch_many<__half>(op16, in, out, n, stream);
    case DType::kBFloat16: return launch_many<__nv_bfloat16>(op16, in, out, n, stream);
    default: return launch_many<float>(op, in, out, n, stream);
  }
}

template <typename DType, int kIn, int kOut, typename Op>
cudaError_t dispatch_many(DType dtype, Op op, const void* const (&in)[kIn], void* const (&out)[kOut], int64_t n,
                          cudaStream_t stream) {
  return dispatch_many(dtype, op, op, in, out, n, stream);
}

}  // namespace myops_cuda
