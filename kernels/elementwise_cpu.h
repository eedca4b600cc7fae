// The CPU loops of an elementwise op whose math is one element's function (kernels/<op>.h's forward and
// backward, called through the functor opspec/codegen writes): a plain loop that GCC vectorises,
// compiled for AVX-512, AVX2 and the baseline and chosen by cpu_isa.h (MYOPS_CPU_ISA caps it); NEON is
// aarch64's baseline. float64 (gradcheck) runs the plain loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu_isa.h"

// At O3 without trapping math: what lets GCC vectorise a loop holding selects and divisions. Without
// jump threading: it copies the code between two selects on one condition (Mish's x < 20 before and
// after its exp) into each branch, and the vector loop then computes the exp twice (the Mish example
// at 1.58x the copy floor against 1.29x; tests/test_declared_ops.py counts the exp's polynomial in the
// AVX-512 loop). The functor's math is inlined into these loops
// (flatten) and compiled with their options and target; the generated sources set the same options
// around the math header, which GCC requires for inlining.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O3", "no-trapping-math", "no-thread-jumps")
#endif

namespace elementwise_cpu {

// f(in, out) per element: in holds one value of each input, out receives one of each output. Every
// element is independent of the others (an output may be an input's buffer), hence ivdep.
template <size_t kIn, size_t kOut, typename T, typename F>
inline void loop(const F& f, const T* const (&in)[kIn], T* const (&out)[kOut], int64_t n) {
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#endif
  for (int64_t i = 0; i < n; ++i) {
    T a[kIn];
    T b[kOut];
    for (size_t k = 0; k < kIn; ++k) a[k] = in[k][i];
    f(a, b);
    for (size_t k = 0; k < kOut; ++k) out[k][i] = b[k];
  }
}

#define MYOPS_ELEMENTWISE_LOOP(SUFFIX, ATTRIBUTES)                                                            \
  template <size_t kIn, size_t kOut, typename F>                                                              \
  ATTRIBUTES __attribute__((flatten)) void loop_##SUFFIX(const F& f, const float* const (&in)[kIn],           \
                                                          float* const (&out)[kOut], int64_t n) {             \
    loop(f, in, out, n);                                                                                      \
  }

MYOPS_ELEMENTWISE_LOOP(baseline, )
#if MYOPS_X86_DISPATCH
MYOPS_ELEMENTWISE_LOOP(avx2, MYOPS_TARGET_AVX2)
MYOPS_ELEMENTWISE_LOOP(avx512, MYOPS_TARGET_AVX512)
#endif
#undef MYOPS_ELEMENTWISE_LOOP

// f over n elements of kIn inputs and kOut outputs, given as indexable pointers (the adapters' arrays).
template <size_t kIn, size_t kOut, typename F, typename In, typename Out>
inline void map(const F& f, const In& in, const Out& out, int64_t n) {
  using T = std::remove_cv_t<std::remove_pointer_t<std::decay_t<decltype(out[0])>>>;
  const T* p[kIn];
  T* q[kOut];
  for (size_t k = 0; k < kIn; ++k) p[k] = in[k];
  for (size_t k = 0; k < kOut; ++k) q[k] = out[k];
  if constexpr (std::is_same_v<T, float>) {
#if MYOPS_X86_DISPATCH
    switch (cpu_isa::isa()) {
      case cpu_isa::Isa::kAvx512: return loop_avx512(f, p, q, n);
      case cpu_isa::Isa::kAvx2: return loop_avx2(f, p, q, n);
      default: break;
    }
#endif
    loop_baseline(f, p, q, n);
  } else {
    loop(f, p, q, n);
  }
}

}  // namespace elementwise_cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
