// Google Highway for the CPU kernels of the ops that build on it (a scaffolded op's <op>_vec-inl.h):
// which of Highway's targets are compiled, and which one runs. Header-only use of Highway (no libhwy):
// the target is the one cpu_isa.h picked (MYOPS_CPU_ISA caps it), so one variable steers every op,
// the hand-written ones and these alike. Include before <hwy/foreach_target.h>; lab/highway.py
// resolves the headers (Highway 1.0.3).
#pragma once

#include "cpu_isa.h"

// One compiled copy per path cpu_isa.h names, nothing more (the SSE levels and SVE are not paths
// of the lab): x86-64 gets AVX3 (AVX-512), AVX2 and
// the baseline, aarch64 NEON and the baseline.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_DL | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#define HWY_COMPILE_ALL_ATTAINABLE 1

#include <hwy/detect_targets.h>

namespace vec_targets {

// Highway's AVX2 target also uses BMI2, F16C, AES and CLMUL (its target string in
// hwy/ops/set_macros-inl.h): a CPU with AVX2 and FMA but without them gets the baseline.
inline bool highway_avx2_extras() {
#if MYOPS_X86_DISPATCH
  return __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("aes") &&
         __builtin_cpu_supports("pclmul");
#else
  return false;
#endif
}

template <typename Fn>
Fn pick(Fn avx512, Fn avx2, Fn neon, Fn baseline) {
  switch (cpu_isa::isa()) {
    case cpu_isa::Isa::kAvx512:
      return avx512 != nullptr && highway_avx2_extras() ? avx512 : baseline;
    case cpu_isa::Isa::kAvx2:
      return avx2 != nullptr && highway_avx2_extras() ? avx2 : baseline;
    case cpu_isa::Isa::kNeon:
      return neon != nullptr ? neon : baseline;
    default:
      return baseline;
  }
}

}  // namespace vec_targets

// The baseline's namespace: EMU128, or SCALAR where Highway deems EMU128 broken (GCC before 12.3).
#if HWY_BROKEN_EMU128
#define MYOPS_VEC_BASELINE N_SCALAR
#else
#define MYOPS_VEC_BASELINE N_EMU128
#endif

// The function FN of namespace NS (written in Highway ops inside HWY_NAMESPACE) on the CPU path this
// process runs: MYOPS_VEC_DISPATCH(mish::vec, Forward)(x, y, n).
#if HWY_ARCH_X86_64 && MYOPS_X86_DISPATCH
#define MYOPS_VEC_DISPATCH(NS, FN) \
  ::vec_targets::pick(&NS::N_AVX3::FN, &NS::N_AVX2::FN, decltype(&NS::MYOPS_VEC_BASELINE::FN){}, &NS::MYOPS_VEC_BASELINE::FN)
#elif HWY_ARCH_ARM_A64 && MYOPS_ARM_NEON
#define MYOPS_VEC_DISPATCH(NS, FN) \
  ::vec_targets::pick(decltype(&NS::MYOPS_VEC_BASELINE::FN){}, decltype(&NS::MYOPS_VEC_BASELINE::FN){}, &NS::N_NEON::FN, &NS::MYOPS_VEC_BASELINE::FN)
#else
#define MYOPS_VEC_DISPATCH(NS, FN) (&NS::HWY_NAMESPACE::FN)
#endif
