// The CPU rows of a row-wise op whose math is kernels/<op>.h's per-element functions (accumulate, merge,
// finish, forward, accumulate_grad, backward, weight_grads): plain loops over whole rows that GCC
// vectorises, compiled for AVX-512, AVX2 and the baseline and chosen by cpu_isa.h (MYOPS_CPU_ISA caps
// it); NEON is aarch64's baseline, float64 (gradcheck) the plain loops. Callers split the rows over
// their own thread pool.
//
// Op is the struct opspec/codegen writes from the declaration: the op's types (Sums, GradSums, Row,
// Channel, Attributes), kWeights, kNormalize, and load/add/values over one column of the weights. The
// math's functions are found by argument-dependent lookup: each takes one of the op's own types.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu_isa.h"

// At O3 without trapping math (kernels/elementwise_cpu.h says why); the generated sources compile the
// math header with the same options, which GCC requires for inlining it here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O3", "no-trapping-math", "no-thread-jumps")
#endif

namespace rowwise_cpu {

// The weights' pointers, by value: held in registers, where a store through one cannot change another.
template <typename S, int kWeights>
struct Weights {
  S* p[kWeights];
};

// Partial sums kept apart: several vector chains at once, and a fixed order of addition.
inline constexpr int kLanes = 64;

// The lanes' gradient sums added pairwise, as a tree.
template <typename T>
inline T fold(T* lanes) {
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) lanes[k] += lanes[k + width];
  }
  return lanes[0];
}

// The lanes' row sums merged pairwise by the op's merge(), as a tree: lane k holds elements k, k + kLanes, ...
template <typename Op, typename T>
inline typename Op::template Sums<T> fold_merge(T* a, T* b) {
  using Sums = typename Op::template Sums<T>;
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) {
      Sums s{a[k], b[k]};
      merge(s, Sums{a[k + width], b[k + width]});
      a[k] = s.a, b[k] = s.b;
    }
  }
  return {a[0], b[0]};
}

struct Same {
  template <typename V>
  V operator()(V v) const { return v; }
};

template <typename Op, typename T>
using Row = typename Op::template Row<T>;
template <typename Op, typename T>
using Ptrs = Weights<const T, Op::kWeights>;

template <typename Op, typename T>
inline Row<Op, T> row_of(const T* x, Ptrs<Op, T> w, int64_t cols, const typename Op::Attributes& at) {
  using Sums = typename Op::template Sums<T>;
  T a[kLanes], b[kLanes];
  for (int k = 0; k < kLanes; ++k) a[k] = Sums{}.a, b[k] = Sums{}.b;
  int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      Sums s{a[k], b[k]};
      accumulate(s, x[j + k], Op::template load<T>(w.p, j + k, Same{}), at);
      a[k] = s.a, b[k] = s.b;
    }
  }
  // The tail, fewer than kLanes elements, into the first lanes (a count GCC can vectorise over).
  const int tail = static_cast<int>(cols - j);
  for (int k = 0; k < tail; ++k) {
    Sums s{a[k], b[k]};
    accumulate(s, x[j + k], Op::template load<T>(w.p, j + k, Same{}), at);
    a[k] = s.a, b[k] = s.b;
  }
  return finish(fold_merge<Op>(a, b), cols, at);
}

// kNormalize: the row's sum of forward()'s values, in lanes folded as the gradient sums are; kStore also
// writes each value to y.
template <bool kStore, typename Op, typename T>
inline T output_sum(const T* x, Ptrs<Op, T> w, const Row<Op, T>& row, T* y, int64_t cols,
                    const typename Op::Attributes& at) {
  T lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const T v = forward(x[j + k], row, Op::template load<T>(w.p, j + k, Same{}), at);
      if constexpr (kStore) y[j + k] = v;
      lanes[k] += v;
    }
  }
  const int tail = static_cast<int>(cols - j);
  for (int k = 0; k < tail; ++k) {
    const T v = forward(x[j + k], row, Op::template load<T>(w.p, j + k, Same{}), at);
    if constexpr (kStore) y[j + k] = v;
    lanes[k] += v;
  }
  return fold(lanes);
}

template <typename Op, typename T>
inline void forward_row(const T* x, Ptrs<Op, T> w, T* y, int64_t cols, const typename Op::Attributes& at) {
  const Row<Op, T> row = row_of<Op>(x, w, cols, at);
  if constexpr (Op::kNormalize) {
    const T inv = T(1) / output_sum<true, Op>(x, w, row, y, cols, at);
    for (int64_t j = 0; j < cols; ++j) y[j] *= inv;
  } else {
    for (int64_t j = 0; j < cols; ++j) y[j] = forward(x[j], row, Op::template load<T>(w.p, j, Same{}), at);
  }
}

// The Row the backward's functions see: row_of's, and with kNormalize the sum of the row's outputs.
template <typename Op, typename T>
inline Row<Op, T> backward_row_of(const T* x, Ptrs<Op, T> w, int64_t cols, const typename Op::Attributes& at) {
  const Row<Op, T> row = row_of<Op>(x, w, cols, at);
  if constexpr (Op::kNormalize) {
    return with_output_sum(row, output_sum<false, Op>(x, w, row, static_cast<T*>(nullptr), cols, at));
  }
  return row;
}

// dx of one row, and its share of each weight's gradient added into dw.p[k][cols].
template <typename Op, typename T>
inline void backward_row(const T* grad, const T* x, Ptrs<Op, T> w, T* dx, Weights<T, Op::kWeights> dw, int64_t cols,
                         const typename Op::Attributes& at) {
  using GradSums = typename Op::template GradSums<T>;
  const Row<Op, T> row = backward_row_of<Op>(x, w, cols, at);
  T a[kLanes] = {}, b[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      GradSums s{a[k], b[k]};
      accumulate_grad(s, grad[j + k], x[j + k], row, Op::template load<T>(w.p, j + k, Same{}), at);
      a[k] = s.a, b[k] = s.b;
    }
  }
  const int tail = static_cast<int>(cols - j);
  for (int k = 0; k < tail; ++k) {
    GradSums s{a[k], b[k]};
    accumulate_grad(s, grad[j + k], x[j + k], row, Op::template load<T>(w.p, j + k, Same{}), at);
    a[k] = s.a, b[k] = s.b;
  }
  const GradSums gs{fold(a), fold(b)};
  // Each column touches only its own elements, and dx and dw are buffers of their own: without ivdep
  // GCC counts too many pairs of pointers to check at run time and leaves this loop scalar.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#endif
  for (int64_t c = 0; c < cols; ++c) {
    const auto channel = Op::template load<T>(w.p, c, Same{});
    dx[c] = backward(grad[c], x[c], row, gs, channel, cols, at);
    Op::add(dw.p, c, weight_grads(grad[c], x[c], row, gs, channel, at));
  }
}

template <typename Op, typename T>
inline void forward_rows_plain(const T* x, Ptrs<Op, T> w, T* y, int64_t rows, int64_t cols,
                               const typename Op::Attributes& at) {
  for (int64_t r = 0; r < rows; ++r) forward_row<Op>(x + r * cols, w, y + r * cols, cols, at);
}

template <typename Op, typename T>
inline void backward_rows_plain(const T* grad, const T* x, Ptrs<Op, T> w, T* dx, Weights<T, Op::kWeights> dw,
                                int64_t rows, int64_t cols, const typename Op::Attributes& at) {
  for (int64_t r = 0; r < rows; ++r) backward_row<Op>(grad + r * cols, x + r * cols, w, dx + r * cols, dw, cols, at);
}

// flatten: the row templates and the op's math are inlined into each clone and compiled for its target.
#define MYOPS_ROWWISE_CLONES(SUFFIX, ATTRIBUTES)                                                               \
  template <typename Op>                                                                                      \
  ATTRIBUTES __attribute__((flatten)) void forward_rows_##SUFFIX(const float* x, Ptrs<Op, float> w, float* y,  \
                                                                 int64_t rows, int64_t cols,                 \
                                                                 const typename Op::Attributes& at) {        \
    forward_rows_plain<Op>(x, w, y, rows, cols, at);                                                          \
  }                                                                                                           \
  template <typename Op>                                                                                      \
  ATTRIBUTES __attribute__((flatten)) void backward_rows_##SUFFIX(                                            \
      const float* grad, const float* x, Ptrs<Op, float> w, float* dx, Weights<float, Op::kWeights> dw,       \
      int64_t rows, int64_t cols, const typename Op::Attributes& at) {                                       \
    backward_rows_plain<Op>(grad, x, w, dx, dw, rows, cols, at);                                              \
  }

MYOPS_ROWWISE_CLONES(baseline, )
#if MYOPS_X86_DISPATCH
MYOPS_ROWWISE_CLONES(avx2, MYOPS_TARGET_AVX2)
MYOPS_ROWWISE_CLONES(avx512, MYOPS_TARGET_AVX512)
#endif
#undef MYOPS_ROWWISE_CLONES

// y[rows, cols] from x[rows, cols] and the weights w.p[k][cols].
template <typename Op, typename T>
inline void forward_rows(const T* x, Ptrs<Op, T> w, T* y, int64_t rows, int64_t cols, const typename Op::Attributes& at) {
  if constexpr (std::is_same_v<T, float>) {
#if MYOPS_X86_DISPATCH
    switch (cpu_isa::isa()) {
      case cpu_isa::Isa::kAvx512: return forward_rows_avx512<Op>(x, w, y, rows, cols, at);
      case cpu_isa::Isa::kAvx2: return forward_rows_avx2<Op>(x, w, y, rows, cols, at);
      default: break;
    }
#endif
    forward_rows_baseline<Op>(x, w, y, rows, cols, at);
  } else {
    forward_rows_plain<Op>(x, w, y, rows, cols, at);
  }
}

// dx[rows, cols], and dw.p[k][cols] += these rows' share of each weight's gradient (the caller zeroes dw
// and adds the blocks' shares in a fixed order, so the result does not depend on thread timing).
template <typename Op, typename T>
inline void backward_rows(const T* grad, const T* x, Ptrs<Op, T> w, T* dx, Weights<T, Op::kWeights> dw, int64_t rows,
                          int64_t cols, const typename Op::Attributes& at) {
  if constexpr (std::is_same_v<T, float>) {
#if MYOPS_X86_DISPATCH
    switch (cpu_isa::isa()) {
      case cpu_isa::Isa::kAvx512: return backward_rows_avx512<Op>(grad, x, w, dx, dw, rows, cols, at);
      case cpu_isa::Isa::kAvx2: return backward_rows_avx2<Op>(grad, x, w, dx, dw, rows, cols, at);
      default: break;
    }
#endif
    backward_rows_baseline<Op>(grad, x, w, dx, dw, rows, cols, at);
  } else {
    backward_rows_plain<Op>(grad, x, w, dx, dw, rows, cols, at);
  }
}

}  // namespace rowwise_cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
