// How the CPU kernels of the plugin split one elementwise call over ORT's intra-op thread pool:
// fixed chunks of elements, one ParallelFor task each. Swish and the Copy floor share it, so that
// the floor is timed with exactly the op's threading and buffers.
#pragma once

#include <cstdint>

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

}  // namespace cpu
}  // namespace myops
