// How the CPU kernels of the plugin split one call over ORT's intra-op thread pool: fixed chunks of
// elements (elementwise) or of whole rows (rowwise), one ParallelFor task each. Every op of a kind,
// the Copy floor included, runs through the same code, so that the floor is timed with exactly the
// ops' threading and buffers.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common.h"
#include "shapes.h"

namespace myops {
namespace cpu {

// Elements per ParallelFor task: large enough to amortise the hand-off, small enough to balance.
inline constexpr int64_t kChunk = 32768;

template <size_t kIn>
using Inputs = std::array<const float*, kIn>;
template <size_t kOut>
using Outputs = std::array<float*, kOut>;

// Runs work(first, count) over [0, total) in tasks of `per_task`, on ORT's pool when there are several.
template <typename Work>
void RunTasks(Ort::KernelContext& context, int64_t total, int64_t per_task, const Work& work) {
  const auto tasks = static_cast<size_t>((total + per_task - 1) / per_task);
  if (tasks <= 1) {
    if (total > 0) work(0, total);
    return;
  }
  struct Job {
    const Work* work;
    int64_t total, per_task;
  } job{&work, total, per_task};
  context.ParallelFor(
      [](void* data, size_t task) {
        const auto* j = static_cast<const Job*>(data);
        const int64_t first = static_cast<int64_t>(task) * j->per_task;
        (*j->work)(first, std::min(j->per_task, j->total - first));
      },
      tasks, 0, &job);
}

// kIn inputs of X's shape (each checked against X before any memory is touched) and kOut outputs of
// that shape: span(inputs, outputs, count) on the same chunks of each.
template <size_t kIn, size_t kOut, typename Span>
Ort::Status RunElementwise(Ort::KernelContext& context, const char* op, const std::string& node, const Span& span) {
  std::vector<int64_t> shape;
  if (Ort::Status status = ElementwiseShape<kIn>(context, op, node, &shape); !status.IsOK()) return status;
  Inputs<kIn> in{};
  for (size_t k = 0; k < kIn; ++k) in[k] = context.GetInput(k).GetTensorData<float>();
  // NOTE: the output buffers belong to ORT; we only write into them.
  Outputs<kOut> out{};
  for (size_t k = 0; k < kOut; ++k) out[k] = context.GetOutput(k, shape).GetTensorMutableData<float>();
  RunTasks(context, ElementCount(shape), kChunk, [&](int64_t first, int64_t n) {
    Inputs<kIn> i = in;
    Outputs<kOut> o = out;
    for (auto& p : i) p += first;
    for (auto& p : o) p += first;
    span(i, o, n);
  });
  return Ort::Status{nullptr};
}

// A rowwise op: inputs [0, kFull) have X's shape, the rest are weights of shape [X.shape[-1]]; kOut
// outputs of X's shape; rows_fn(inputs, outputs, rows, cols) on chunks of whole rows (the weights whole).
template <size_t kIn, size_t kFull, size_t kOut, typename Rows>
Ort::Status RunRows(Ort::KernelContext& context, const char* op, const std::array<const char*, kIn>& names,
                    const std::string& node, const Rows& rows_fn) {
  std::vector<int64_t> shape;
  if (Ort::Status status = RowShape<kIn, kFull>(context, op, names, node, &shape); !status.IsOK()) return status;
  Inputs<kIn> in{};
  for (size_t k = 0; k < kIn; ++k) in[k] = context.GetInput(k).GetTensorData<float>();
  Outputs<kOut> out{};
  for (size_t k = 0; k < kOut; ++k) out[k] = context.GetOutput(k, shape).GetTensorMutableData<float>();
  const int64_t cols = shape.back();
  const int64_t rows = cols == 0 ? 0 : ElementCount(shape) / cols;
  const int64_t rows_per_task = std::max<int64_t>(1, kChunk / std::max<int64_t>(cols, 1));
  RunTasks(context, rows, rows_per_task, [&](int64_t first, int64_t n) {
    Inputs<kIn> i = in;
    Outputs<kOut> o = out;
    for (size_t k = 0; k < kFull; ++k) i[k] += first * cols;
    for (auto& p : o) p += first * cols;
    rows_fn(i, o, n, cols);
  });
  return Ort::Status{nullptr};
}

// A scaffolded op's hand-written kernel (lab/new_op_templates): kSpan(inputs, outputs, count).
using InputsSpanFn = void (*)(const float* const* inputs, float* const* outputs, int64_t count);

template <int kInputs, int kOutputs, InputsSpanFn kSpan>
Ort::Status RunInputSpans(Ort::KernelContext& context, const char* op, const std::string& node) {
  return RunElementwise<kInputs, kOutputs>(
      context, op, node,
      [](const Inputs<kInputs>& in, const Outputs<kOutputs>& out, int64_t count) { kSpan(in.data(), out.data(), count); });
}

}  // namespace cpu
}  // namespace myops
