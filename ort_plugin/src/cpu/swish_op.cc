// myops::Swish on CPUExecutionProvider: float32, vectorised (kernels/swish.h), split into chunks
// on ORT's own intra-op thread pool. The kernel keeps only the node's beta: no per-call state.
#include "cpu/swish_op.h"

#include <cstdint>

#include "swish.h"
#include "swish_op_base.h"

namespace myops {
namespace cpu {
namespace {

// Elements per ParallelFor task: large enough to amortise the hand-off, small enough to balance.
constexpr int64_t kChunk = 32768;

MYOPS_BUILD_INFO(kOpInfo, "myops-op: domain=" MYOPS_DOMAIN " op=" MYOPS_SWISH_NAME
                          " since=1 provider=CPUExecutionProvider types=float32");

struct ForwardJob {
  const float* x;
  float* y;
  int64_t n;
  float beta;
};

void RunChunk(void* data, size_t chunk) {
  const auto* job = static_cast<const ForwardJob*>(data);
  const int64_t begin = static_cast<int64_t>(chunk) * kChunk;
  const int64_t count = job->n - begin < kChunk ? job->n - begin : kChunk;
  swish::forward_span(job->x + begin, job->y + begin, count, job->beta);
}

struct SwishKernel {
  float beta;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) const {
    return GuardStatus([&] {
      Ort::KernelContext context{raw_context};
      const Ort::ConstValue input = context.GetInput(0);
      const Ort::TensorTypeAndShapeInfo info = input.GetTensorTypeAndShapeInfo();
      const auto shape = info.GetShape();
      Ort::UnownedValue output = context.GetOutput(0, shape);
      // NOTE: the output buffer belongs to ORT; we only write into it.
      ForwardJob job{input.GetTensorData<float>(), output.GetTensorMutableData<float>(),
                     static_cast<int64_t>(info.GetElementCount()), beta};
      const auto chunks = static_cast<size_t>((job.n + kChunk - 1) / kChunk);
      if (chunks <= 1) {
        swish::forward_span(job.x, job.y, job.n, job.beta);
      } else {
        context.ParallelFor(&RunChunk, chunks, 0, &job);
      }
      return Ort::Status{nullptr};
    });
  }
};

struct SwishOp : SwishOpBase<SwishOp, SwishKernel, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT> {
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
};

}  // namespace

void RegisterOps(Ort::CustomOpDomain& domain) {
  static const SwishOp swish_op;
  domain.Add(&swish_op);
}

}  // namespace cpu
}  // namespace myops
