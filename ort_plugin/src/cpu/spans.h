// How the CPU kernels of the plugin split one elementwise call over ORT's intra-op thread pool:
// fixed chunks of elements, one ParallelFor task each. Swish and the Copy floor share it, so that
// the floor is timed with exactly the op's threading and buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace myops {
namespace cpu {

// Elements per ParallelFor task: large enough to amortise the hand-off, small enough to balance.
inline constexpr int64_t kChunk = 32768;

using SpanFn = void (*)(const float* x, float* y, int64_t count, float beta);

// Y = kSpan(X) elementwise into the output ORT allocates with X's shape. The span is a template
// argument so that each op's chunk loop calls its kernel directly, as a hand-written loop would.
template <SpanFn kSpan>
void RunSpans(Ort::KernelContext& context, float beta) {
  const Ort::ConstValue input = context.GetInput(0);
  const Ort::TensorTypeAndShapeInfo info = input.GetTensorTypeAndShapeInfo();
  Ort::UnownedValue output = context.GetOutput(0, info.GetShape());
  // NOTE: the output buffer belongs to ORT; we only write into it.
  struct Job {
    const float* x;
    float* y;
    int64_t n;
    float beta;
  } job{input.GetTensorData<float>(), output.GetTensorMutableData<float>(),
        static_cast<int64_t>(info.GetElementCount()), beta};
  const auto chunks = static_cast<size_t>((job.n + kChunk - 1) / kChunk);
  if (chunks <= 1) {
    kSpan(job.x, job.y, job.n, beta);
    return;
  }
  context.ParallelFor(
      [](void* data, size_t chunk) {
        const auto* j = static_cast<const Job*>(data);
        const int64_t begin = static_cast<int64_t>(chunk) * kChunk;
        const int64_t count = j->n - begin < kChunk ? j->n - begin : kChunk;
        kSpan(j->x + begin, j->y + begin, count, j->beta);
      },
      chunks, 0, &job);
}

// The same for an op of kInputs inputs that all have X's shape (a gated op's X and gate) and kOutputs
// outputs of that shape: each input is checked against X before any memory is touched (the error names
// the op and node), then kSpan(inputs, outputs, count) runs on the same chunks.
using InputsSpanFn = void (*)(const float* const* inputs, float* const* outputs, int64_t count);

template <int kInputs, int kOutputs, InputsSpanFn kSpan>
Ort::Status RunInputSpans(Ort::KernelContext& context, const char* op, const std::string& node) {
  const Ort::ConstValue x = context.GetInput(0);
  const Ort::TensorTypeAndShapeInfo info = x.GetTensorTypeAndShapeInfo();
  const std::vector<int64_t> shape = info.GetShape();
  struct Job {
    const float* in[kInputs];
    float* out[kOutputs];
    int64_t n;
  } job{};
  job.in[0] = x.GetTensorData<float>();
  for (int k = 1; k < kInputs; ++k) {
    const Ort::ConstValue other = context.GetInput(k);
    const std::vector<int64_t> other_shape = other.GetTensorTypeAndShapeInfo().GetShape();
    if (other_shape != shape) {
      return Ort::Status((std::string("myops::") + op + " (node " + node + "): input " + std::to_string(k) +
                          " must have X's shape " + ShapeText(shape) + " (elementwise, no broadcasting); got " +
                          ShapeText(other_shape))
                             .c_str(),
                         ORT_INVALID_ARGUMENT);
    }
    job.in[k] = other.GetTensorData<float>();
  }
  for (int k = 0; k < kOutputs; ++k) job.out[k] = context.GetOutput(k, shape).GetTensorMutableData<float>();
  job.n = static_cast<int64_t>(info.GetElementCount());
  const auto chunks = static_cast<size_t>((job.n + kChunk - 1) / kChunk);
  if (chunks <= 1) {
    kSpan(job.in, job.out, job.n);
    return Ort::Status{nullptr};
  }
  context.ParallelFor(
      [](void* data, size_t chunk) {
        const auto* j = static_cast<const Job*>(data);
        const int64_t begin = static_cast<int64_t>(chunk) * kChunk;
        const int64_t count = j->n - begin < kChunk ? j->n - begin : kChunk;
        const float* in[kInputs];
        float* out[kOutputs];
        for (int k = 0; k < kInputs; ++k) in[k] = j->in[k] + begin;
        for (int k = 0; k < kOutputs; ++k) out[k] = j->out[k] + begin;
        kSpan(in, out, count);
      },
      chunks, 0, &job);
  return Ort::Status{nullptr};
}

}  // namespace cpu
}  // namespace myops
