// Swish with a coefficient: y = x * sigmoid(beta * x)   (beta = 1: SiLU, 1.702: QuickGELU).
//
// The one home of the forward and backward math. Header-only and free of torch and of
// onnxruntime: the PyTorch extension (ops/) and the ORT plugin (ort_plugin/) both include it,
// so the two layers cannot drift apart. CUDA kernels live next door in swish_cuda.cu.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__CUDACC__)
#define SWISH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SWISH_HOST_DEVICE inline
#endif

// NOTE: the CPU span loops are compiled three times (AVX-512 with 512-bit vectors, AVX2+FMA,
// baseline x86-64) and picked once at run time, so one binary runs everywhere and still uses the
// widest vectors the machine has.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define SWISH_X86_DISPATCH 1
#else
#define SWISH_X86_DISPATCH 0
#endif

// NOTE: without no-trapping-math GCC refuses to if-convert the float selects below and the loops
// stay scalar (~8x slower); it changes no result, since nothing here reads floating-point flags.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC push_options
#pragma GCC optimize("O3", "no-trapping-math")
#endif

namespace swish {

// exp for float built from mul/add/select only, so that the CPU loops vectorise (a libm call per
// element is what makes a scalar loop ~6x slower than PyTorch's composite). Cody-Waite reduction
// x = n*ln2 + r, |r| <= ln2/2, then the Cephes minimax polynomial for e^r (about 1 ulp).
// Above the float range the result is +inf and NaN stays NaN; below e^-87.3 (where the true result
// is subnormal) it is e^-87.3 ~ 1.2e-38 rather than smaller. Only 1 + e^x is ever formed from it,
// and 1 + 1.2e-38 is exactly 1 in float: sigmoid needs no more, and skipping a select pays.
SWISH_HOST_DEVICE float exp_f32(float x) {
#if defined(__CUDA_ARCH__)
  return ::expf(x);
#else
  constexpr float kMax = 88.3762626647949f;  // the largest x with 2^n a normal float
  constexpr float kMin = -87.3365447504f;    // the smallest x with a normal float result
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // Clamped so that the integer conversion below never sees NaN or an out-of-range value; a NaN x
  // compares false and becomes kMin, and is put back at the end.
  float xc = x > kMin ? x : kMin;
  xc = xc < kMax ? xc : kMax;
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t biased = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &biased, sizeof(scale));
  float result = p * scale;
  result = x > kMax ? std::numeric_limits<float>::infinity() : result;
  return x == x ? result : x;
#endif
}

SWISH_HOST_DEVICE double exp_any(double x) { return ::exp(x); }
SWISH_HOST_DEVICE float exp_any(float x) { return exp_f32(x); }

// sigmoid(z) = 1 / (1 + e^-z): for very negative z, e^-z is +inf and the result a clean 0 (the
// e^z / (1 + e^z) form would give inf/inf = NaN there).
template <typename T>
SWISH_HOST_DEVICE T sigmoid(T z) {
  return T(1) / (T(1) + exp_any(-z));
}

// NOTE: the operations below follow the order of PyTorch's own evaluation of
// x * sigmoid(beta * x) and of its autograd graph, so that +/-inf and NaN give the same results
// as the reference (e.g. x = -inf gives NaN, x = +/-1e4 gives finite values and gradients).
// x / (1 + e^-z) is x * sigmoid(z) with one rounding less and one division instead of a division
// and a product; the special cases stay those of the reference: x = -inf gives -inf / inf = NaN,
// x = +inf gives inf, very negative finite x gives -0.
template <typename T>
SWISH_HOST_DEVICE T forward(T x, T beta) {
  return x / (T(1) + exp_any(-(beta * x)));
}

// d/dx [x * s(beta x)] = s + beta * x * s * (1 - s), evaluated as autograd does:
// the Mul's two branches, then sigmoid_backward (grad * (1 - s) * s), then the scale by beta.
template <typename T>
SWISH_HOST_DEVICE T backward(T grad, T x, T beta) {
  const T s = sigmoid(beta * x);
  const T through_mul = grad * s;
  const T through_sigmoid = (grad * x) * (T(1) - s) * s;
  return through_mul + through_sigmoid * beta;
}

// Contiguous spans for the CPU kernels: the callers split the work across their own thread pool
// (at::parallel_for, KernelContext_ParallelFor) and hand each thread one span. Sizes are int64.
namespace detail {

#define SWISH_DEFINE_SPANS(SUFFIX, ATTRIBUTES)                                                     \
  ATTRIBUTES inline void forward_span_##SUFFIX(const float* x, float* y, int64_t n, float beta) {  \
    for (int64_t i = 0; i < n; ++i) y[i] = forward(x[i], beta);                                    \
  }                                                                                                \
  ATTRIBUTES inline void backward_span_##SUFFIX(const float* grad, const float* x, float* dx,      \
                                                int64_t n, float beta) {                           \
    for (int64_t i = 0; i < n; ++i) dx[i] = backward(grad[i], x[i], beta);                         \
  }

SWISH_DEFINE_SPANS(baseline, )
#if SWISH_X86_DISPATCH
SWISH_DEFINE_SPANS(avx512, __attribute__((target("arch=x86-64-v4,prefer-vector-width=512"))))
SWISH_DEFINE_SPANS(avx2, __attribute__((target("arch=x86-64-v3"))))
#endif
#undef SWISH_DEFINE_SPANS

enum class Isa { kBaseline, kAvx2, kAvx512 };

inline Isa detect_isa() {
#if SWISH_X86_DISPATCH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kBaseline;
}

inline Isa isa() {
  static const Isa detected = detect_isa();
  return detected;
}

}  // namespace detail

inline void forward_span(const float* x, float* y, int64_t n, float beta) {
#if SWISH_X86_DISPATCH
  switch (detail::isa()) {
    case detail::Isa::kAvx512: return detail::forward_span_avx512(x, y, n, beta);
    case detail::Isa::kAvx2: return detail::forward_span_avx2(x, y, n, beta);
    default: break;
  }
#endif
  detail::forward_span_baseline(x, y, n, beta);
}

inline void backward_span(const float* grad, const float* x, float* dx, int64_t n, float beta) {
#if SWISH_X86_DISPATCH
  switch (detail::isa()) {
    case detail::Isa::kAvx512: return detail::backward_span_avx512(grad, x, dx, n, beta);
    case detail::Isa::kAvx2: return detail::backward_span_avx2(grad, x, dx, n, beta);
    default: break;
  }
#endif
  detail::backward_span_baseline(grad, x, dx, n, beta);
}

// float64 exists for gradcheck only; plain libm is fine there.
inline void forward_span(const double* x, double* y, int64_t n, double beta) {
  for (int64_t i = 0; i < n; ++i) y[i] = forward(x[i], beta);
}

inline void backward_span(const double* grad, const double* x, double* dx, int64_t n,
                          double beta) {
  for (int64_t i = 0; i < n; ++i) dx[i] = backward(grad[i], x[i], beta);
}

}  // namespace swish

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC pop_options
#endif
