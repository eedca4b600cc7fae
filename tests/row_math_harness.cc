// tests/test_row_math.py's harness: row_math::exp over a file of float32 values, in a plain loop as a
// row-wise op's kernels call it (compiled per CPU path by the test, which also reads GCC's report that
// the loop vectorised).
#include <cstdio>
#include <vector>

#include "row_math.h"

#pragma GCC push_options
#pragma GCC optimize("O3", "no-trapping-math")
__attribute__((noinline)) void exp_all(const float* x, float* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = row_math::exp(x[i]);  // EXP_LOOP
}
#pragma GCC pop_options

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 3;
  std::vector<float> x;
  float v;
  while (std::fread(&v, sizeof v, 1, in) == 1) x.push_back(v);
  std::fclose(in);
  std::vector<float> y(x.size());
  exp_all(x.data(), y.data(), static_cast<long>(x.size()));
  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out || std::fwrite(y.data(), sizeof(float), y.size(), out) != y.size()) return 4;
  return std::fclose(out) == 0 ? 0 : 5;
}
