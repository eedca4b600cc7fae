// Which CPU vector path the kernels take: detected once per process, capped by MYOPS_CPU_ISA.
// Shared by every op's CPU code (swish.h, rms_norm.h), so one variable steers them all and the
// "[myops] MYOPS_CPU_ISA=..." line is printed once. Header-only, no torch, no onnxruntime.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

// x86-64 with GCC: AVX-512 / AVX2+FMA clones picked at run time, baseline x86-64 otherwise.
// aarch64 with GCC: NEON is always there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define MYOPS_X86_DISPATCH 1
#else
#define MYOPS_X86_DISPATCH 0
#endif
#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__CUDACC__)
#define MYOPS_ARM_NEON 1
#else
#define MYOPS_ARM_NEON 0
#endif

#if MYOPS_X86_DISPATCH
// The target sets the vector clones of each kernel are compiled for.
#define MYOPS_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define MYOPS_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma")))
#endif

namespace cpu_isa {

enum class Isa { kBaseline, kAvx2, kAvx512, kNeon };

inline Isa detect() {
#if MYOPS_X86_DISPATCH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#elif MYOPS_ARM_NEON
  return Isa::kNeon;  // every aarch64 CPU has NEON
#endif
  return Isa::kBaseline;
}

// MYOPS_CPU_ISA=baseline|avx2|neon caps the choice (never raises it): how the tests run every path
// on one machine, and how a user compares them.
inline Isa capped() {
  const Isa detected = detect();
  const char* cap = std::getenv("MYOPS_CPU_ISA");
  if (cap == nullptr) return detected;
  const Isa wanted = std::strcmp(cap, "baseline") == 0 ? Isa::kBaseline
                     : std::strcmp(cap, "avx2") == 0   ? Isa::kAvx2
                     : std::strcmp(cap, "neon") == 0   ? Isa::kNeon
                                                       : Isa::kAvx512;
  // The other architecture's vector path (neon on x86, avx2 or avx512 on aarch64) caps nothing, as
  // an unknown name never did; the baseline caps everywhere.
  const bool foreign = (wanted == Isa::kNeon) != (detected == Isa::kNeon);
  const Isa taken = wanted == Isa::kBaseline ? wanted
                    : foreign               ? detected
                    : wanted < detected     ? wanted
                                            : detected;
  // Only when capped: which path runs, so a user (and the tests) can see the cap was honoured.
  static const char* const kNames[] = {"baseline", "avx2", "avx512", "neon"};
  std::fprintf(stderr, "[myops] MYOPS_CPU_ISA=%s: the CPU path is %s\n", cap,
               kNames[static_cast<int>(taken)]);
  return taken;
}

inline Isa isa() {
  static const Isa chosen = capped();
  return chosen;
}

}  // namespace cpu_isa
