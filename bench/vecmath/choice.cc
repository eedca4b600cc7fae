// Which vector math the lab's CPU kernels build on, measured: Swish's float32 forward,
// y = x / (1 + e^-x), timed five ways on each x86 path this CPU runs (bench/vecmath/__main__.py
// builds and runs it):
//   hand             kernels/swish.h's hand-written intrinsics
//   highway-contrib  Google Highway's portable vectors with its contrib Exp
//   highway-lab      Highway's portable vectors with kernels/vec_math-inl.h's Exp
//   highway-fast     the same with vec_math-inl.h's ExpFast (Swish's own algorithm)
//   sleef            SLEEF's vector exp (Sleef_expf16_u10avx512f, Sleef_expf8_u10avx2) on intrinsics
//                    (built only where SLEEF is installed: MYOPS_VECMATH_SLEEF)
// Usage: choice N PASSES. Prints "path library min median max" (ns per element over 5 interleaved
// rounds, each the median of PASSES passes over N floats).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "swish.h"
#include "vec_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "choice_hwy-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "choice_hwy-inl.h"

#if MYOPS_VECMATH_SLEEF
#include <immintrin.h>
// sleef.h declares its per-ISA functions only where the whole file is compiled for that ISA; this file
// is compiled for the baseline with per-function targets, so the two it calls are declared here.
extern "C" __m512 Sleef_expf16_u10avx512f(__m512);
extern "C" __m256 Sleef_expf8_u10avx2(__m256);

MYOPS_TARGET_AVX512 static void sleef_avx512(const float* x, float* y, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 e = Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_setzero_ps(), v));
    _mm512_storeu_ps(y + i, _mm512_div_ps(v, _mm512_add_ps(one, e)));
  }
}

MYOPS_TARGET_AVX2 static void sleef_avx2(const float* x, float* y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 e = Sleef_expf8_u10avx2(_mm256_sub_ps(_mm256_setzero_ps(), v));
    _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, e)));
  }
}
#endif

using Span = void (*)(const float*, float*, int64_t);

static double median_ns_per_element(Span fn, const float* x, float* y, int64_t n, int passes) {
  std::vector<double> times;
  for (int p = 0; p < passes + 3; ++p) {  // 3 warm-up passes
    const auto start = std::chrono::steady_clock::now();
    fn(x, y, n);
    const auto stop = std::chrono::steady_clock::now();
    if (p >= 3) times.push_back(std::chrono::duration<double, std::nano>(stop - start).count() / n);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

static void hand_avx512(const float* x, float* y, int64_t n) { swish::detail::forward_span_avx512(x, y, n, 1.0f); }
static void hand_avx2(const float* x, float* y, int64_t n) { swish::detail::forward_span_avx2(x, y, n, 1.0f); }

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) / 16 * 16 : 8 * 512 * 768;  // whole vectors
  const int passes = argc > 2 ? std::atoi(argv[2]) : 30;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -8.0f + 16.0f * static_cast<float>((i * 2654435761u) % 65536) / 65536.0f;
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && vec_targets::highway_avx2_extras();
  struct Case { const char* path; const char* library; Span fn; bool runs; };
  const std::vector<Case> cases = {
      {"avx512", "hand", hand_avx512, avx512},
      {"avx512", "highway-contrib", vecmath_choice::N_AVX3::SwishContrib, avx512},
      {"avx512", "highway-lab", vecmath_choice::N_AVX3::SwishLab, avx512},
      {"avx512", "highway-fast", vecmath_choice::N_AVX3::SwishLabFast, avx512},
      {"avx2", "hand", hand_avx2, avx2},
      {"avx2", "highway-contrib", vecmath_choice::N_AVX2::SwishContrib, avx2},
      {"avx2", "highway-lab", vecmath_choice::N_AVX2::SwishLab, avx2},
      {"avx2", "highway-fast", vecmath_choice::N_AVX2::SwishLabFast, avx2},
#if MYOPS_VECMATH_SLEEF
      {"avx512", "sleef", sleef_avx512, avx512},
      {"avx2", "sleef", sleef_avx2, avx2},
#endif
  };
  // Interleaved rounds: every case once per round, so that drift of the machine hits all alike.
  std::vector<std::vector<double>> figures(cases.size());
  for (int round = 0; round < 5; ++round) {
    for (size_t c = 0; c < cases.size(); ++c) {
      if (cases[c].runs) figures[c].push_back(median_ns_per_element(cases[c].fn, x.data(), y.data(), n, passes));
    }
  }
  for (size_t c = 0; c < cases.size(); ++c) {
    if (!cases[c].runs) continue;
    std::sort(figures[c].begin(), figures[c].end());
    std::printf("%s %s %.4f %.4f %.4f\n", cases[c].path, cases[c].library, figures[c].front(),
                figures[c][figures[c].size() / 2], figures[c].back());
  }
  return 0;
}
