// Fast float32 math in Google Highway's portable vectors, for the CPU kernels of any op (a scaffolded
// op's <op>_vec-inl.h includes it). Highway's own hwy/contrib/math/math-inl.h has the rest (Log1p,
// Tanh, Sin, ...), accurate to a few ulp but slower: its Exp made Swish's forward 2.1x slower than
// the exp below, SLEEF 3.5.1's 1.9x (bench/vecmath, docs/your-op.md).
// Included once per CPU target by foreach_target.h: the guard is Highway's per-target toggle.
#if defined(MYOPS_VEC_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MYOPS_VEC_MATH_INL_H_
#undef MYOPS_VEC_MATH_INL_H_
#else
#define MYOPS_VEC_MATH_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace vec_math {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// p * 2^whole, whole an integer in [-127, 128] held as a float: 2^whole built in the exponent bits by
// adding 2^23 + 127 (exact: the low bits of the sum are whole + 127) rather than by a float-to-int
// conversion, which Highway guards against overflow with more instructions. 2^128 is +inf, 2^-127
// is 0 (the true value is subnormal).
template <class D, class V>
HWY_INLINE V ScaleByPow2(D d, V p, V whole) {
  const hn::RebindToSigned<D> di;
  const V biased = hn::Add(whole, hn::Set(d, 8388608.0f + 127.0f));
  return hn::Mul(p, hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, biased))));
}

// 2^f for f in about [0, 1): the degree-5 minimax polynomial of kernels/swish.h's hand-written kernels.
template <class D, class V>
HWY_INLINE V Pow2Fraction(D d, V f) {
  V p = hn::Set(d, 1.8775727e-3f);
  p = hn::MulAdd(p, f, hn::Set(d, 8.9893444e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5826318e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4015361e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9315308e-1f));
  return hn::MulAdd(p, f, hn::Set(d, 9.9999994e-1f));
}

// y, or x where x is NaN: the clamps below are Min and Max of a bound and x, which x86's vector
// instructions answer with their second operand, x, when it is NaN (so NaN goes through and nothing is
// needed); elsewhere (the scalar baseline, NEON) they may answer with the bound.
template <class D, class V>
HWY_INLINE V KeepNaN(D d, V x, V y) {
  (void)d;
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  (void)x;
  return y;
#else
  return hn::IfThenElse(hn::IsNaN(x), x, y);
#endif
}

// 2^t: +inf from 128 up, 0 below -126 (where 2^t is subnormal), NaN stays NaN.
template <class D, class V>
HWY_INLINE V Exp2(D d, V t) {
  const V clamped = hn::Min(hn::Set(d, 128.0f), hn::Max(hn::Set(d, -127.0f), t));
  const V whole = hn::Floor(clamped);
  return KeepNaN(d, t, ScaleByPow2(d, Pow2Fraction(d, hn::Sub(clamped, whole)), whole));
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// 2^t on AVX-512, as kernels/swish.h's hand-written path: vreduceps gives the fraction and vscalefps
// applies 2^floor(t), saturating by itself (inf above 128, NaN stays NaN), so the clamps, the floor
// and the exponent arithmetic above go: bench.vecmath measured ExpFast's Swish 1.27x the hand path in
// L2 with them (Highway has no op for either instruction). Lanes where 2^t would be subnormal are
// zeroed as above. vreduceps rounds t - floor(t) differently from the subtraction above for small
// negative t, so results may differ from the template (other CPU paths) by 1 ulp; the 512-bit form and
// the 128-bit one (the one-lane tail of an array) are the same instructions, so on this path an element
// gives the same bits in a full vector or at an array's end, however the work is split (a 256-bit
// vector would take the template: no kernel uses one). At t = 128 exactly it gives the largest float
// where the template gives inf (2^128 is just past it).
#define MYOPS_EXP2_AVX512(VEC, PREFIX, MASK)                                                         \
  const MASK all = static_cast<MASK>(~0u); /* maskz forms: GCC 12's unmasked ones warn */              \
  const MASK normal = PREFIX##_cmp_ps_mask(t.raw, PREFIX##_set1_ps(-126.0f), _CMP_NLT_UQ); /* NaN kept */ \
  const VEC f{PREFIX##_maskz_reduce_ps(all, t.raw, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};       \
  return VEC{PREFIX##_maskz_scalef_ps(normal, Pow2Fraction(d, f).raw, t.raw)};

template <size_t N, int kPow2>
HWY_INLINE hn::Vec512<float> Exp2(hn::Simd<float, N, kPow2> d, hn::Vec512<float> t) {
  using V = hn::Vec512<float>;
  MYOPS_EXP2_AVX512(V, _mm512, __mmask16)
}

template <size_t N, int kPow2>
HWY_INLINE hn::Vec128<float, N> Exp2(hn::Simd<float, N, kPow2> d, hn::Vec128<float, N> t) {
  using V = hn::Vec128<float, N>;  // (a name: the comma would split the macro's arguments)
  MYOPS_EXP2_AVX512(V, _mm, __mmask8)
}
#undef MYOPS_EXP2_AVX512
#endif

// e^x: +inf above about 88.72, 0 below about -88.03 (where e^x is subnormal), NaN stays NaN. Cody-Waite
// reduction, x = n ln2 + r with ln2 in two parts (n * kLn2Hi is exact), so that the fraction is as
// accurate as r at both ends of the range (2^(x log2 e) directly was 4e-6 relative off there).
template <class D, class V>
HWY_INLINE V Exp(D d, V x) {
  const V log2e = hn::Set(d, 1.44269504088896341f);
  const V xc = hn::Min(hn::Set(d, 88.8f), hn::Max(hn::Set(d, -88.03f), x));
  const V whole = hn::Floor(hn::Max(hn::Set(d, -127.0f), hn::Mul(xc, log2e)));
  const V r = hn::NegMulAdd(whole, hn::Set(d, -2.12194440e-4f), hn::NegMulAdd(whole, hn::Set(d, 0.693359375f), xc));
  return KeepNaN(d, x, ScaleByPow2(d, Pow2Fraction(d, hn::Mul(r, log2e)), whole));
}

// e^x as 2^(x log2 e) in one product: Swish's own exp, about 30 % faster than Exp but up to 4e-6
// relative off near the ends of the range (the product's rounding, magnified by |x|), which is plenty
// where e^x goes into 1 + e^x or a ratio of such sums (sigmoid, tanh, softplus-like ops).
template <class D, class V>
HWY_INLINE V ExpFast(D d, V x) {
  return Exp2(d, hn::Mul(x, hn::Set(d, 1.44269504088896341f)));
}

// 1 / (1 + e^-x): exactly 0 for very negative x (e^-x is +inf), 1 for large x.
template <class D, class V>
HWY_INLINE V Sigmoid(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, Exp(d, hn::Neg(x))));
}

}  // namespace HWY_NAMESPACE
}  // namespace vec_math
HWY_AFTER_NAMESPACE();

#endif  // MYOPS_VEC_MATH_INL_H_ toggle
