// Math for the row-wise ops' functions (a scaffolded `--kind rowwise` op's kernels/<op>.h), which run
// inside plain loops that GCC vectorises: a call to libm's expf is opaque to it and keeps such a loop
// scalar, so exp here is inline and branch-free. On CUDA it is the device's expf.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

// The options of the row-wise headers that include it: GCC inlines a function only into callers
// compiled with the same ones.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC push_options
#pragma GCC optimize("O3", "no-trapping-math")
#endif

#if defined(__CUDACC__)
#define MYOPS_ROW_MATH_HD __host__ __device__ __forceinline__
#else
#define MYOPS_ROW_MATH_HD inline
#endif

namespace row_math {

#if !defined(__CUDA_ARCH__)
// 2^whole * p for an integer-valued `whole` in [-127, 128]: the exponent bits built from whole + 127
// (2^23 added as a float puts them in the low bits, no float-to-int conversion); 128 gives +inf,
// -127 gives 0, and outside that range the bits mean nothing (exp() replaces them). The same method,
// and the same degree-5 polynomial of 2^f on [0, 1), as the earlier Highway form's Exp2 (docs/your-op.md).
inline float exp2_split(float whole, float fraction) {
  float p = 1.8775727e-3f;
  p = p * fraction + 8.9893444e-3f;
  p = p * fraction + 5.5826318e-2f;
  p = p * fraction + 2.4015361e-1f;
  p = p * fraction + 6.9315308e-1f;
  p = p * fraction + 9.9999994e-1f;
  const float biased = whole + (8388608.0f + 127.0f);
  uint32_t bits;
  std::memcpy(&bits, &biased, sizeof bits);
  bits <<= 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
#endif

// e^x in float32: relative error under 3e-7 + |x| log2(e) 2^-24 (x log2(e) rounds once: about 4e-6 at
// |x| = 88, 3e-7 near 0; exp(0) is 0.99999994), +inf above about 88.7, 0 below about -87.3 (no
// subnormal results), NaN stays NaN (tests/test_row_math.py). kernels/swish.h's exp_f32 is closer (about
// 1 ulp) but gives e^-87.3 rather than 0 far below, where a softmax's masked columns need 0.
MYOPS_ROW_MATH_HD float exp(float x) {
#if defined(__CUDA_ARCH__)
  return ::expf(x);
#else
  const float t = x * 1.44269504f;  // log2(e)
  // floor(t) by adding and taking away 1.5 * 2^23 (which rounds to the nearest integer), then a select:
  // x86-64's baseline has no vector floor, so a call to floorf would keep its loop scalar.
  const float nearest = (t + 12582912.0f) - 12582912.0f;
  const float whole = nearest > t ? nearest - 1.0f : nearest;
  const float power = exp2_split(whole, t - whole);
  // The ends chosen last, on the result (the same values as clamping t to [-127, 128] first, whose two
  // selects before the polynomial made GCC compute it twice in a vector loop). A NaN t fails both tests
  // and stays NaN.
  const float low = t < -127.0f ? 0.0f : power;
  return t > 128.0f ? __builtin_inff() : low;
#endif
}

// float64 (gradcheck only): the library's.
MYOPS_ROW_MATH_HD double exp(double x) { return ::exp(x); }

}  // namespace row_math

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC pop_options
#endif
