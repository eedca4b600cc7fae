// RMSNorm over the last dimension: y = x * rsqrt(mean(x^2) + eps) * weight.
//
// The one home of the CPU math, shared by the PyTorch extension (ops/) and the ORT plugin
// (ort_plugin/); CUDA kernels live next door in rms_norm_cuda.cu. Header-only, no torch, no
// onnxruntime. Callers hand over whole rows (contiguous, `cols` values each) and split rows across
// their own thread pool. Sums accumulate in float for float data (double for double).
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu_isa.h"

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC push_options
#pragma GCC optimize("O3", "no-trapping-math")
#endif

namespace rms_norm {

// Partial sums kept apart in a reduction: four AVX-512 vectors, eight AVX2 ones, sixteen NEON ones,
// so that several FMA chains run at once (with 16, the AVX-512 loop waited on one chain). Their
// count, not the ISA, fixes the order of additions.
inline constexpr int kLanes = 64;

namespace detail {

// sum(a[i] * b[i]) with kLanes independent partial sums (the loop GCC turns into vector FMAs),
// then a fixed pairwise fold.
template <typename T>
inline T dot_plain(const T* a, const T* b, int64_t n) {
  T lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) lanes[k] += a[i + k] * b[i + k];
  }
  const int64_t tail = n - i;  // counted (< kLanes): GCC can see no lane index reaches kLanes
  for (int64_t k = 0; k < tail; ++k) lanes[k] += a[i + k] * b[i + k];
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) lanes[k] += lanes[k + width];
  }
  return lanes[0];
}

// One row forward: inv = 1 / sqrt(mean(x^2) + eps), then (x * inv) * w in the reference's order.
template <typename T>
inline void forward_row_plain(const T* x, const T* w, T* y, int64_t cols, T eps) {
  const T inv = T(1) / std::sqrt(dot_plain(x, x, cols) / static_cast<T>(cols) + eps);
  for (int64_t j = 0; j < cols; ++j) y[j] = (x[j] * inv) * w[j];
}

// One row backward. With g = grad * w and inv as above:
//   dx = inv * g - x * inv^3 * sum(g * x) / cols,   dw += grad * x * inv   (dw accumulates over rows)
template <typename T>
inline void backward_row_plain(const T* grad, const T* x, const T* w, T* dx, T* dw, int64_t cols, T eps) {
  const T inv = T(1) / std::sqrt(dot_plain(x, x, cols) / static_cast<T>(cols) + eps);
  T gx_lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) gx_lanes[k] += (grad[j + k] * w[j + k]) * x[j + k];
  }
  const int64_t tail = cols - j;
  for (int64_t k = 0; k < tail; ++k) gx_lanes[k] += (grad[j + k] * w[j + k]) * x[j + k];
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) gx_lanes[k] += gx_lanes[k + width];
  }
  const T coeff = inv * inv * inv * gx_lanes[0] / static_cast<T>(cols);
  for (int64_t c = 0; c < cols; ++c) {
    dx[c] = inv * (grad[c] * w[c]) - x[c] * coeff;
    dw[c] += grad[c] * (x[c] * inv);
  }
}

// flatten: the row templates are inlined into each clone, so each is compiled for the clone's target
// (GCC may otherwise call one shared out-of-line copy built for the baseline).
#define RMS_NORM_DEFINE_ROWS(SUFFIX, ATTRIBUTES)                                                    \
  ATTRIBUTES __attribute__((flatten)) inline void forward_rows_##SUFFIX(const float* x, const float* w, float* y, int64_t rows, \
                                               int64_t cols, float eps) {                           \
    for (int64_t r = 0; r < rows; ++r) forward_row_plain(x + r * cols, w, y + r * cols, cols, eps); \
  }                                                                                                 \
  ATTRIBUTES __attribute__((flatten)) inline void backward_rows_##SUFFIX(const float* grad, const float* x, const float* w,  \
                                                float* dx, float* dw, int64_t rows, int64_t cols,   \
                                                float eps) {                                        \
    for (int64_t r = 0; r < rows; ++r) {                                                            \
      backward_row_plain(grad + r * cols, x + r * cols, w, dx + r * cols, dw, cols, eps);           \
    }                                                                                               \
  }

// The same source, three instruction sets.
RMS_NORM_DEFINE_ROWS(baseline, )
#if MYOPS_X86_DISPATCH
RMS_NORM_DEFINE_ROWS(avx2, MYOPS_TARGET_AVX2)
RMS_NORM_DEFINE_ROWS(avx512, MYOPS_TARGET_AVX512)
#endif
#undef RMS_NORM_DEFINE_ROWS

}  // namespace detail

// y[rows, cols] = RMSNorm(x[rows, cols]) * w[cols]. On aarch64 every path, MYOPS_CPU_ISA=baseline
// included, is GCC's NEON code for the plain loops.
inline void forward_rows(const float* x, const float* w, float* y, int64_t rows, int64_t cols, float eps) {
#if MYOPS_X86_DISPATCH
  switch (cpu_isa::isa()) {
    case cpu_isa::Isa::kAvx512: return detail::forward_rows_avx512(x, w, y, rows, cols, eps);
    case cpu_isa::Isa::kAvx2: return detail::forward_rows_avx2(x, w, y, rows, cols, eps);
    default: break;
  }
#endif
  detail::forward_rows_baseline(x, w, y, rows, cols, eps);
}

// dx[rows, cols] and dw[cols] += this block's share of the weight gradient (the caller zeroes dw
// and sums the blocks' partial dw in a fixed order, so results do not depend on thread timing).
inline void backward_rows(const float* grad, const float* x, const float* w, float* dx, float* dw, int64_t rows,
                          int64_t cols, float eps) {
#if MYOPS_X86_DISPATCH
  switch (cpu_isa::isa()) {
    case cpu_isa::Isa::kAvx512: return detail::backward_rows_avx512(grad, x, w, dx, dw, rows, cols, eps);
    case cpu_isa::Isa::kAvx2: return detail::backward_rows_avx2(grad, x, w, dx, dw, rows, cols, eps);
    default: break;
  }
#endif
  detail::backward_rows_baseline(grad, x, w, dx, dw, rows, cols, eps);
}

// float64 exists for gradcheck only: the plain loops.
inline void forward_rows(const double* x, const double* w, double* y, int64_t rows, int64_t cols, double eps) {
  for (int64_t r = 0; r < rows; ++r) detail::forward_row_plain(x + r * cols, w, y + r * cols, cols, eps);
}

inline void backward_rows(const double* grad, const double* x, const double* w, double* dx, double* dw,
                          int64_t rows, int64_t cols, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    detail::backward_row_plain(grad + r * cols, x + r * cols, w, dx + r * cols, dw, cols, eps);
  }
}

}  // namespace rms_norm

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC pop_options
#endif
