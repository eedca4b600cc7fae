// tests/test_vec_math.py's harness: kernels/vec_math-inl.h's Exp and Sigmoid over a file of float32,
// on the CPU path MYOPS_CPU_ISA leaves (through MYOPS_VEC_DISPATCH, as an op's kernels call them).
// Usage: vec_math_harness IN OUT_EXP OUT_SIGMOID OUT_EXP_FAST (raw float32 files).
#include <cstdint>
#include <cstdio>
#include <vector>

#include "vec_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vec_math_harness-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "vec_math_harness-inl.h"

static std::vector<float> read_floats(const char* path) {
  std::vector<float> values;
  if (FILE* f = std::fopen(path, "rb")) {
    float v;
    while (std::fread(&v, sizeof v, 1, f) == 1) values.push_back(v);
    std::fclose(f);
  }
  return values;
}

static bool write_floats(const char* path, const std::vector<float>& values) {
  FILE* f = std::fopen(path, "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(values.data(), sizeof(float), values.size(), f) == values.size();
  return std::fclose(f) == 0 && ok;
}

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  const std::vector<float> x = read_floats(argv[1]);
  std::vector<float> e(x.size()), s(x.size()), f(x.size());
  const int64_t n = static_cast<int64_t>(x.size());
  MYOPS_VEC_DISPATCH(harness, Target)(nullptr, nullptr, 0);
  MYOPS_VEC_DISPATCH(harness, Exp)(x.data(), e.data(), n);
  MYOPS_VEC_DISPATCH(harness, Sigmoid)(x.data(), s.data(), n);
  MYOPS_VEC_DISPATCH(harness, ExpFast)(x.data(), f.data(), n);
  return write_floats(argv[2], e) && write_floats(argv[3], s) && write_floats(argv[4], f) ? 0 : 1;
}
