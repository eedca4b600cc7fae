// Swish with a coefficient: y = x * sigmoid(beta * x)   (beta = 1: SiLU, 1.702: QuickGELU).
//
// The one home of the forward and backward math. Header-only and free of torch and of
// onnxruntime: the PyTorch extension (ops/) and the ORT plugin (ort_plugin/) both include it,
// so the two layers cannot drift apart. The CUDA launchers are written around forward, forward_16bit
// and backward by opspec/codegen.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(__CUDACC__)
#define SWISH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SWISH_HOST_DEVICE inline
#endif

// NOTE: the CPU span loops exist three times (AVX-512 and AVX2+FMA intrinsics; baseline x86-64
// compiled from the scalar code) and are picked once at run time (cpu_isa.h), so one binary runs
// everywhere and still uses the widest vectors the machine has. On aarch64 NEON is always there: a
// NEON intrinsics path, with the baseline left for MYOPS_CPU_ISA=baseline.
#include "cpu_isa.h"
#define SWISH_X86_DISPATCH MYOPS_X86_DISPATCH
#define SWISH_ARM_NEON MYOPS_ARM_NEON
#if SWISH_X86_DISPATCH
#include <immintrin.h>
#endif
#if SWISH_ARM_NEON
#include <arm_neon.h>
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
// Out-parameter forms, as the launchers opspec/codegen writes call an elementwise op's math.
template <typename T>
SWISH_HOST_DEVICE void forward(T x, T beta, T& y) {
  y = x / (T(1) + exp_any(-(beta * x)));
}

// The forward for float16 and bfloat16 storage on the GPU (opspec/swish.py: forward_16bit): the
// hardware's approximate exp (ex2.approx) and division. Their error, a few float32 ulp (more as
// |beta x| nears 88), is far below one ulp of the 16-bit result, which is then within one ulp of
// forward() rounded once. Where 1 + e^-(beta x) exceeds 2^126 the result is 0, not a value below
// 1e-36. The accurate forms spend two multi-instruction sequences per element: on an H200 the
// float16 kernel was arithmetic-bound at 1.14x a copy's time (ncu: SM 84 %, DRAM 57 %), and 1.01x
// with these (SM 71 %, DRAM 81 %), measured through the earlier hand-written launcher; the
// generated one is not yet measured on a GPU. Elsewhere (the host) it is forward.
template <typename T>
SWISH_HOST_DEVICE void forward_16bit(T x, T beta, T& y) {
#if defined(__CUDA_ARCH__)
  y = __fdividef(x, 1.0f + __expf(-(beta * x)));
#else
  forward(x, beta, y);
#endif
}

// d/dx [x * s(beta x)] = s + beta * x * s * (1 - s), evaluated as autograd does:
// the Mul's two branches, then sigmoid_backward (grad * (1 - s) * s), then the scale by beta.
template <typename T>
SWISH_HOST_DEVICE void backward(T grad, T x, T beta, T& dx) {
  const T s = sigmoid(beta * x);
  const T through_mul = grad * s;
  const T through_sigmoid = (grad * x) * (T(1) - s) * s;
  dx = through_mul + through_sigmoid * beta;
}

// Contiguous spans for the CPU kernels: the callers split the work across their own thread pool
// (at::parallel_for, KernelContext_ParallelFor) and hand each thread one span. Sizes are int64.
namespace detail {

#define SWISH_DEFINE_SPANS(SUFFIX, ATTRIBUTES)                                                     \
  ATTRIBUTES inline void forward_span_##SUFFIX(const float* x, float* y, int64_t n, float beta) {  \
    for (int64_t i = 0; i < n; ++i) forward(x[i], beta, y[i]);                                     \
  }                                                                                                \
  ATTRIBUTES inline void backward_span_##SUFFIX(const float* grad, const float* x, float* dx,      \
                                                int64_t n, float beta) {                           \
    for (int64_t i = 0; i < n; ++i) backward(grad[i], x[i], beta, dx[i]);                          \
  }

SWISH_DEFINE_SPANS(baseline, )
#undef SWISH_DEFINE_SPANS

#if SWISH_X86_DISPATCH || SWISH_ARM_NEON
// The vector paths compute e^-(beta x) as 2^t with t = x * (-beta * log2(e)), folded into one
// product. A finite beta above FLT_MAX / log2(e) makes that factor infinite (and 0 * inf a NaN where
// beta x is 0): the scalar code handles such a beta.
inline bool factor_overflows(float beta) {
  return std::isinf(beta * 1.44269504088896341f) && !std::isinf(beta);
}

// 2^f on [0, 1): degree 5, fitted for relative error (9e-8; 1.5e-7 evaluated in float). All vector
// paths use it, so they give the same bits wherever 2^t is a normal float.
#define SWISH_EXP2_POLY(FMADD, SET1, p, f)            \
  p = SET1(1.8775727e-3f);                           \
  p = FMADD(p, f, SET1(8.9893444e-3f));              \
  p = FMADD(p, f, SET1(5.5826318e-2f));              \
  p = FMADD(p, f, SET1(2.4015361e-1f));              \
  p = FMADD(p, f, SET1(6.9315308e-1f));              \
  p = FMADD(p, f, SET1(9.9999994e-1f))
#endif

#if SWISH_X86_DISPATCH
// AVX2 + FMA spans with intrinsics (GCC's vectorisation of the scalar code was 2.3x slower and lost
// to F.silu and to ORT's QuickGelu): 8 floats a vector, 2^floor(t) built in the exponent bits.
#define SWISH_AVX2 MYOPS_TARGET_AVX2

// 1 + 2^t. t is clamped to [-127, 128] first: 2^128 becomes inf through the exponent bits and 2^-127
// becomes 0, as the true values round after the + 1; the constants go first so that vmaxps/vminps
// return a NaN t, which then stays NaN.
SWISH_AVX2 inline __m256 one_plus_exp2_8(__m256 t) {
  t = _mm256_min_ps(_mm256_set1_ps(128.0f), _mm256_max_ps(_mm256_set1_ps(-127.0f), t));
  const __m256 whole = _mm256_floor_ps(t);
  const __m256 f = _mm256_sub_ps(t, whole);
  __m256 p;
  SWISH_EXP2_POLY(_mm256_fmadd_ps, _mm256_set1_ps, p, f);
  const __m256i exponent = _mm256_add_epi32(_mm256_cvtps_epi32(whole), _mm256_set1_epi32(127));
  return _mm256_fmadd_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(exponent, 23)), _mm256_set1_ps(1.0f));
}

SWISH_AVX2 inline __m256 forward8(__m256 x, __m256 factor) {
  return _mm256_div_ps(x, one_plus_exp2_8(_mm256_mul_ps(x, factor)));
}

SWISH_AVX2 inline __m256 backward8(__m256 grad, __m256 x, __m256 beta, __m256 factor) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 s = _mm256_div_ps(one, one_plus_exp2_8(_mm256_mul_ps(x, factor)));
  const __m256 through_sigmoid =
      _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(grad, x), _mm256_sub_ps(one, s)), s);
  return _mm256_add_ps(_mm256_mul_ps(grad, s), _mm256_mul_ps(through_sigmoid, beta));
}

// Lanes below `remaining` on: the tail is a masked vector, so every element takes the same path.
SWISH_AVX2 inline __m256i tail_mask8(int64_t remaining) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(remaining)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

SWISH_AVX2 inline void forward_span_avx2(const float* x, float* y, int64_t n, float beta) {
  if (factor_overflows(beta)) return forward_span_baseline(x, y, n, beta);
  const __m256 factor = _mm256_set1_ps(-beta * 1.44269504088896341f);
  const int64_t full = n - n % 8;
  for (int64_t i = 0; i < full; i += 8) _mm256_storeu_ps(y + i, forward8(_mm256_loadu_ps(x + i), factor));
  if (full < n) {
    const __m256i m = tail_mask8(n - full);
    _mm256_maskstore_ps(y + full, m, forward8(_mm256_maskload_ps(x + full, m), factor));
  }
}

SWISH_AVX2 inline void backward_span_avx2(const float* grad, const float* x, float* dx, int64_t n,
                                          float beta) {
  if (factor_overflows(beta)) return backward_span_baseline(grad, x, dx, n, beta);
  const __m256 b = _mm256_set1_ps(beta);
  const __m256 factor = _mm256_set1_ps(-beta * 1.44269504088896341f);
  const int64_t full = n - n % 8;
  for (int64_t i = 0; i < full; i += 8) {
    _mm256_storeu_ps(dx + i, backward8(_mm256_loadu_ps(grad + i), _mm256_loadu_ps(x + i), b, factor));
  }
  if (full < n) {
    const __m256i m = tail_mask8(n - full);
    const __m256 g = _mm256_maskload_ps(grad + full, m);
    _mm256_maskstore_ps(dx + full, m, backward8(g, _mm256_maskload_ps(x + full, m), b, factor));
  }
}
#undef SWISH_AVX2
#endif

#if SWISH_X86_DISPATCH
// AVX-512 spans written with intrinsics: the same formulas as forward() and backward(), but GCC's
// vectorisation of the scalar exp spends ~25 instructions per 16 floats, mostly on clamps and
// selects, and the ORT custom op then lost to ORT's own QuickGelu. Here vscalefps applies the
// power of two and saturates to 0 or inf by itself, so no clamp is left; NaN flows through.
// The tail is a masked vector, so every element takes the same path however a caller splits the
// work: the extension (at::parallel_for) and the plugin (ParallelFor) stay bitwise equal.
#define SWISH_AVX512 MYOPS_TARGET_AVX512

// 1 + 2^t. The caller folds -beta * log2(e) into one constant, so e^-(beta x) = 2^t costs one
// product. 2^t = 2^floor(t) * 2^f with f = t - floor(t) in [0, 1): vreduceps gives f, a degree-5
// polynomial (fitted for relative error, 9e-8; 1.5e-7 evaluated in float) gives 2^f, and vscalefps
// applies 2^floor(t) from t itself. No clamp: t = +-inf gives f = 0 and a scaling to inf or 0, a
// huge finite t an integer, so f = 0 again and the scaling saturates, and a NaN t stays NaN. Against
// the Cody-Waite e^r of exp_f32 this drops the rounding, the two-step reduction and the clamps: ~30 %
// fewer cycles per vector, which moved the op from compute-bound to near the copy floor at L3 sizes.
// The cost is accuracy where e^-(beta x) is large, since t is rounded once and the error grows with
// |t|: about 6 ulp where |y| >= 0.1 (2-4 before), 4e-8 absolute below that, and up to 4e-6
// relative for outputs under 1e-8; tests hold 1.3e-6 relative plus 1e-6 absolute.
SWISH_AVX512 inline __m512 one_plus_exp2_16(__m512 t) {
  // NOTE: the maskz forms with an all-ones mask: GCC 12's unmasked ones start from an undefined
  // register and warn (-Wmaybe-uninitialized) in every file that includes this header.
  const __mmask16 all = 0xFFFF;
  const __m512 f = _mm512_maskz_reduce_ps(all, t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p;
  SWISH_EXP2_POLY(_mm512_fmadd_ps, _mm512_set1_ps, p, f);
  return _mm512_add_ps(_mm512_maskz_scalef_ps(all, p, t), _mm512_set1_ps(1.0f));
}

// -beta * log2(e): x times it is the exponent t of e^-(beta x) = 2^t.
SWISH_AVX512 inline __m512 exp2_factor(float beta) {
  return _mm512_set1_ps(-beta * 1.44269504088896341f);
}

// x / (1 + e^-(beta x)), as forward(): x = -inf gives -inf / inf = NaN, very negative x gives -0.
SWISH_AVX512 inline __m512 forward16(__m512 x, __m512 factor) {
  return _mm512_div_ps(x, one_plus_exp2_16(_mm512_mul_ps(x, factor)));
}

// backward() in the same order: s = sigmoid(beta x), grad * s + ((grad * x) * (1 - s) * s) * beta.
SWISH_AVX512 inline __m512 backward16(__m512 grad, __m512 x, __m512 beta, __m512 factor) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 s = _mm512_div_ps(one, one_plus_exp2_16(_mm512_mul_ps(x, factor)));
  const __m512 through_sigmoid =
      _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(grad, x), _mm512_sub_ps(one, s)), s);
  return _mm512_add_ps(_mm512_mul_ps(grad, s), _mm512_mul_ps(through_sigmoid, beta));
}

inline __mmask16 tail_mask(int64_t remaining) {
  return static_cast<__mmask16>((1u << remaining) - 1u);
}

// NOTE: 4K aliasing. A load is checked against older stores by the low 12 address bits only.
// When the output sits 32..256 bytes after the input modulo 4096 (numpy's buffers start at +16 in
// a page, ORT's arena handed out +64), each load seems to depend on a store just before it and a
// plain loop ran 25-40 % slower. There the loop loads 4 vectors ahead of its stores, which moves
// the clash 256 bytes further away.
inline bool loads_ahead(const void* in, const void* out) {
  const auto gap = (reinterpret_cast<uintptr_t>(out) - reinterpret_cast<uintptr_t>(in)) & 4095u;
  return gap >= 16 && gap < 288;
}

SWISH_AVX512 inline void forward_span_avx512(const float* x, float* y, int64_t n, float beta) {
  if (factor_overflows(beta)) return forward_span_baseline(x, y, n, beta);
  const __m512 factor = exp2_factor(beta);
  const int64_t full = n - n % 16;
  int64_t i = 0;
  if (loads_ahead(x, y) && full >= 128) {
    __m512 a0 = _mm512_loadu_ps(x), a1 = _mm512_loadu_ps(x + 16);
    __m512 a2 = _mm512_loadu_ps(x + 32), a3 = _mm512_loadu_ps(x + 48);
    for (; i + 128 <= full; i += 64) {
      const __m512 b0 = _mm512_loadu_ps(x + i + 64), b1 = _mm512_loadu_ps(x + i + 80);
      const __m512 b2 = _mm512_loadu_ps(x + i + 96), b3 = _mm512_loadu_ps(x + i + 112);
      _mm512_storeu_ps(y + i, forward16(a0, factor));
      _mm512_storeu_ps(y + i + 16, forward16(a1, factor));
      _mm512_storeu_ps(y + i + 32, forward16(a2, factor));
      _mm512_storeu_ps(y + i + 48, forward16(a3, factor));
      a0 = b0, a1 = b1, a2 = b2, a3 = b3;
    }
    // The last 4 loaded vectors (i .. i + 63) are stored by the plain loop below, reloaded.
  }
  for (; i < full; i += 16) _mm512_storeu_ps(y + i, forward16(_mm512_loadu_ps(x + i), factor));
  if (full < n) {
    const __mmask16 m = tail_mask(n - full);
    _mm512_mask_storeu_ps(y + full, m, forward16(_mm512_maskz_loadu_ps(m, x + full), factor));
  }
}

SWISH_AVX512 inline void backward_span_avx512(const float* grad, const float* x, float* dx,
                                              int64_t n, float beta) {
  if (factor_overflows(beta)) return backward_span_baseline(grad, x, dx, n, beta);
  const __m512 b = _mm512_set1_ps(beta);
  const __m512 factor = exp2_factor(beta);
  const int64_t full = n - n % 16;
  for (int64_t i = 0; i < full; i += 16) {
    _mm512_storeu_ps(dx + i,
                     backward16(_mm512_loadu_ps(grad + i), _mm512_loadu_ps(x + i), b, factor));
  }
  if (full < n) {
    const __mmask16 m = tail_mask(n - full);
    const __m512 g = _mm512_maskz_loadu_ps(m, grad + full);
    _mm512_mask_storeu_ps(dx + full, m, backward16(g, _mm512_maskz_loadu_ps(m, x + full), b, factor));
  }
}
#undef SWISH_AVX512
#endif

#if SWISH_ARM_NEON
// NEON spans: the AVX2 path's math, step for step and rounding for rounding, 4 floats a vector, so
// that aarch64 gives the bits x86 gives. Two differences need care:
// - x86 gives a NaN made from non-NaN operands (inf / inf, 0 * inf, inf - inf) the sign bit, ARM
//   does not; an input NaN goes through both unchanged. Forward works on -x and negates the result
//   (2 instructions a vector); backward ends in a sum, where that would flip the sign of a zero, so
//   it sets the sign of each NaN that neither x nor grad brought (6). Where two different NaNs meet
//   (x or grad and beta, x and grad), which comes out follows operand orders GCC picks freely, on
//   x86 too (the AVX2 loop and its tail differ): only forward, ending in x / d, keeps x's for sure.
// - GCC fuses backward8's last product and sum into one FMA on x86; it is written out here.

// Hides a negation from GCC, which would fold it away (it does not keep NaN signs); no instruction.
inline float32x4_t opaque(float32x4_t v) {
  __asm__("" : "+w"(v));
  return v;
}

inline float32x4_t fmadd4(float32x4_t a, float32x4_t b, float32x4_t c) { return vfmaq_f32(c, a, b); }

// one_plus_exp2_8 for 4 floats. fmax/fmin return a NaN operand as vmaxps/vminps do here. The
// exponent: whole * 2^23 converted in one instruction, plus 127 << 23 (a NaN converts to 0 here and
// to INT_MIN on x86: both give the bits of 1.0, times a NaN p).
inline float32x4_t one_plus_exp2_4(float32x4_t t) {
  t = vminq_f32(vdupq_n_f32(128.0f), vmaxq_f32(vdupq_n_f32(-127.0f), t));
  const float32x4_t whole = vrndmq_f32(t);
  const float32x4_t f = vsubq_f32(t, whole);
  float32x4_t p;
  SWISH_EXP2_POLY(fmadd4, vdupq_n_f32, p, f);
  const int32x4_t exponent = vaddq_s32(vcvtq_n_s32_f32(whole, 23), vdupq_n_s32(127 << 23));
  return vfmaq_f32(vdupq_n_f32(1.0f), p, vreinterpretq_f32_s32(exponent));
}

// forward8 as -((-x) / (1 + 2^t)), t = (beta log2(e)) * -x: the same t.
inline float32x4_t forward4(float32x4_t x, float32x4_t nfactor) {
  const float32x4_t nx = opaque(vnegq_f32(x));
  return vnegq_f32(opaque(vdivq_f32(nx, one_plus_exp2_4(vmulq_f32(nfactor, nx)))));
}

// backward8, then made_sign (the sign bit, or 0 for a NaN beta, whose NaN every output carries)
// on each NaN neither x nor grad brought.
inline float32x4_t backward4(float32x4_t grad, float32x4_t x, float32x4_t beta, float32x4_t factor,
                             uint32x4_t made_sign) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  const float32x4_t s = vdivq_f32(one, one_plus_exp2_4(vmulq_f32(factor, x)));
  const float32x4_t through_sigmoid = vmulq_f32(vmulq_f32(vsubq_f32(one, s), vmulq_f32(x, grad)), s);
  const float32x4_t dx = vfmaq_f32(vmulq_f32(s, grad), through_sigmoid, beta);
  const float32x4_t either = vmaxq_f32(x, grad);  // NaN where x or grad is
  const uint32x4_t made = vbicq_u32(vceqq_f32(either, either), vceqq_f32(dx, dx));
  return vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(dx), vandq_u32(made, made_sign)));
}

inline void forward_span_neon(const float* x, float* y, int64_t n, float beta) {
  if (factor_overflows(beta)) return forward_span_baseline(x, y, n, beta);
  const float32x4_t nfactor = vdupq_n_f32(beta * 1.44269504088896341f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + 4);
    vst1q_f32(y + i, forward4(a, nfactor));
    vst1q_f32(y + i + 4, forward4(b, nfactor));
  }
  if (i + 4 <= n) {
    vst1q_f32(y + i, forward4(vld1q_f32(x + i), nfactor));
    i += 4;
  }
  // The tail goes through a padded vector, so every element takes the same path.
  if (i < n) {
    float in[4] = {}, out[4];
    std::memcpy(in, x + i, (n - i) * sizeof(float));
    vst1q_f32(out, forward4(vld1q_f32(in), nfactor));
    std::memcpy(y + i, out, (n - i) * sizeof(float));
  }
}

inline void backward_span_neon(const float* grad, const float* x, float* dx, int64_t n, float beta) {
  if (factor_overflows(beta)) return backward_span_baseline(grad, x, dx, n, beta);
  const float32x4_t b = vdupq_n_f32(beta);
  const float32x4_t factor = vdupq_n_f32(-beta * 1.44269504088896341f);
  const uint32x4_t made_sign = vdupq_n_u32(std::isnan(beta) ? 0u : 0x80000000u);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const float32x4_t g0 = vld1q_f32(grad + i), g1 = vld1q_f32(grad + i + 4);
    const float32x4_t x0 = vld1q_f32(x + i), x1 = vld1q_f32(x + i + 4);
    vst1q_f32(dx + i, backward4(g0, x0, b, factor, made_sign));
    vst1q_f32(dx + i + 4, backward4(g1, x1, b, factor, made_sign));
  }
  if (i + 4 <= n) {
    vst1q_f32(dx + i, backward4(vld1q_f32(grad + i), vld1q_f32(x + i), b, factor, made_sign));
    i += 4;
  }
  if (i < n) {
    float g[4] = {}, in[4] = {}, out[4];
    std::memcpy(g, grad + i, (n - i) * sizeof(float));
    std::memcpy(in, x + i, (n - i) * sizeof(float));
    vst1q_f32(out, backward4(vld1q_f32(g), vld1q_f32(in), b, factor, made_sign));
    std::memcpy(dx + i, out, (n - i) * sizeof(float));
  }
}
#endif
#undef SWISH_EXP2_POLY

using cpu_isa::Isa;
using cpu_isa::isa;

}  // namespace detail

inline void forward_span(const float* x, float* y, int64_t n, float beta) {
#if SWISH_X86_DISPATCH
  switch (detail::isa()) {
    case detail::Isa::kAvx512: return detail::forward_span_avx512(x, y, n, beta);
    case detail::Isa::kAvx2: return detail::forward_span_avx2(x, y, n, beta);
    default: break;
  }
#elif SWISH_ARM_NEON
  if (detail::isa() == detail::Isa::kNeon) return detail::forward_span_neon(x, y, n, beta);
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
#elif SWISH_ARM_NEON
  if (detail::isa() == detail::Isa::kNeon) return detail::backward_span_neon(grad, x, dx, n, beta);
#endif
  detail::backward_span_baseline(grad, x, dx, n, beta);
}

// float64 exists for gradcheck only; plain libm is fine there.
inline void forward_span(const double* x, double* y, int64_t n, double beta) {
  for (int64_t i = 0; i < n; ++i) forward(x[i], beta, y[i]);
}

inline void backward_span(const double* grad, const double* x, double* dx, int64_t n,
                          double beta) {
  for (int64_t i = 0; i < n; ++i) backward(grad[i], x[i], beta, dx[i]);
}

}  // namespace swish

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC pop_options
#endif
