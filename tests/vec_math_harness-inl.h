// The per-target half of tests/vec_math_harness.cc (foreach_target.h includes it once per target).
#if defined(VEC_MATH_HARNESS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef VEC_MATH_HARNESS_INL_H_
#undef VEC_MATH_HARNESS_INL_H_
#else
#define VEC_MATH_HARNESS_INL_H_
#endif

#include <cstdint>
#include <cstdio>

#include <hwy/highway.h>

#include "vec_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace harness {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace vm = vec_math::HWY_NAMESPACE;

// Whole vectors, then one lane at a time: both shapes of the code an op's kernels run.
template <class Fn>
HWY_INLINE void Apply(const float* x, float* y, int64_t n, Fn fn) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(fn(d, hn::LoadU(d, x + i)), d, y + i);
  const hn::CappedTag<float, 1> d1;
  for (; i < n; ++i) hn::StoreU(fn(d1, hn::LoadU(d1, x + i)), d1, y + i);
}

// Which of Highway's targets this copy was compiled for: the test checks the dispatch picked the one
// the path names (a dispatch that always took the baseline would otherwise still pass).
inline void Target(const float*, float*, int64_t) { std::fprintf(stderr, "highway=%s\n", hwy::TargetName(HWY_TARGET)); }

inline void Exp(const float* x, float* y, int64_t n) {
  Apply(x, y, n, [](auto d, auto v) { return vm::Exp(d, v); });
}

inline void ExpFast(const float* x, float* y, int64_t n) {
  Apply(x, y, n, [](auto d, auto v) { return vm::ExpFast(d, v); });
}

inline void Sigmoid(const float* x, float* y, int64_t n) {
  Apply(x, y, n, [](auto d, auto v) { return vm::Sigmoid(d, v); });
}

}  // namespace HWY_NAMESPACE
}  // namespace harness
HWY_AFTER_NAMESPACE();

#endif  // VEC_MATH_HARNESS_INL_H_ toggle
