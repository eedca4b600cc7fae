// float32 to and from the storage types of the CUDA kernels (float, half, bfloat16): every op's
// kernels compute in float32 whatever they read and write. Pack<T, N> is one 16-byte load or store.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace myops_cuda {

template <typename T> __device__ __forceinline__ float to_float(T v) { return static_cast<float>(v); }
template <> __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }

constexpr int kVecBytes = 16;  // one 128-bit load or store

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements of T in one Pack.
template <typename T>
constexpr int kPackSize = kVecBytes / static_cast<int>(sizeof(T));

// static: file-local, so that it stays out of the libraries' dynamic symbol tables.
static inline bool is_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVecBytes == 0; }

}  // namespace myops_cuda
