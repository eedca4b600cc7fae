// The Highway half of bench/vecmath/choice.cc: Swish's float32 forward on Highway's contrib Exp and on
// the lab's vm::Exp and vm::ExpFast (kernels/vec_math-inl.h). foreach_target.h includes it once per CPU target.
#if defined(VECMATH_CHOICE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef VECMATH_CHOICE_INL_H_
#undef VECMATH_CHOICE_INL_H_
#else
#define VECMATH_CHOICE_INL_H_
#endif

#include <cstdint>

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "vec_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace vecmath_choice {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace vm = vec_math::HWY_NAMESPACE;

enum class ExpOf { kContrib, kLab, kLabFast };

// x / (1 + e^-x) over whole vectors (the spans timed are whole vectors long).
template <ExpOf kExp>
HWY_NOINLINE void SwishForward(const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> d;
  const auto one = hn::Set(d, 1.0f);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    const auto e = kExp == ExpOf::kContrib ? hn::Exp(d, hn::Neg(v))
                   : kExp == ExpOf::kLab   ? vm::Exp(d, hn::Neg(v))
                                           : vm::ExpFast(d, hn::Neg(v));
    hn::StoreU(hn::Div(v, hn::Add(one, e)), d, y + i);
  }
}

void SwishContrib(const float* x, float* y, int64_t n) { SwishForward<ExpOf::kContrib>(x, y, n); }
void SwishLab(const float* x, float* y, int64_t n) { SwishForward<ExpOf::kLab>(x, y, n); }
void SwishLabFast(const float* x, float* y, int64_t n) { SwishForward<ExpOf::kLabFast>(x, y, n); }

}  // namespace HWY_NAMESPACE
}  // namespace vecmath_choice
HWY_AFTER_NAMESPACE();

#endif  // VECMATH_CHOICE_INL_H_ toggle
