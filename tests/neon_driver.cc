// Runs kernels/swish.h's public spans (forward_span, backward_span: the path cpu_isa::detect() and
// MYOPS_CPU_ISA pick) over the cases in a file, for tests/test_neon.py. Built natively for x86-64
// and cross-compiled for aarch64, so both machines' paths see the same inputs.
//
// Input: records of (float beta, int64 n, float x[n], float grad[n]).
// Output: per record, y[n] then dx[n]. Stdout: the path taken, "isa=<name>".
#include <cstdio>
#include <vector>

#include "swish.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CASES OUT\n", argv[0]);
    return 2;
  }
  std::FILE* in = std::fopen(argv[1], "rb");
  std::FILE* out = std::fopen(argv[2], "wb");
  if (in == nullptr || out == nullptr) {
    std::perror("fopen");
    return 2;
  }
  static const char* const kNames[] = {"baseline", "avx2", "avx512", "neon"};
  std::printf("isa=%s\n", kNames[static_cast<int>(swish::detail::isa())]);
  float beta;
  int64_t n;
  while (std::fread(&beta, sizeof beta, 1, in) == 1) {
    if (std::fread(&n, sizeof n, 1, in) != 1 || n < 0) return 3;
    std::vector<float> x(n), grad(n), y(n), dx(n);
    if (std::fread(x.data(), sizeof(float), n, in) != static_cast<size_t>(n)) return 3;
    if (std::fread(grad.data(), sizeof(float), n, in) != static_cast<size_t>(n)) return 3;
    swish::forward_span(x.data(), y.data(), n, beta);
    swish::backward_span(grad.data(), x.data(), dx.data(), n, beta);
    std::fwrite(y.data(), sizeof(float), n, out);
    std::fwrite(dx.data(), sizeof(float), n, out);
  }
  return std::fclose(out) == 0 ? 0 : 1;
}
