// myops::Swish on CPUExecutionProvider: float32, vectorised (kernels/swish.h), split into chunks
// on ORT's own intra-op thread pool. The kernel keeps only the node's beta: no per-call state.
#include "cpu/ops.h"

#include "cpu/spans.h"
#include "swish.h"
#include "swish_op_base.h"

namespace myops {
namespace cpu {
namespace {

MYOPS_BUILD_INFO(kOpInfo, "myops-op: domain=" MYOPS_DOMAIN " op=" MYOPS_SWISH_NAME
                          " since=1 provider=CPUExecutionProvider types=float32");

struct SwishKernel {
  float beta;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) const {
    return GuardStatus([&] {
      Ort::KernelContext context{raw_context};
      RunSpans<&swish::forward_span>(context, beta);
      return Ort::Status{nullptr};
    });
  }
};

struct SwishOp : SwishOpBase<SwishOp, SwishKernel, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT> {
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
};

void RegisterSwish(Ort::CustomOpDomain& domain) {
  static const SwishOp swish_op;
  domain.Add(&swish_op);
}

MYOPS_REGISTER_OP(kCpu, RegisterSwish);

}  // namespace
}  // namespace cpu
}  // namespace myops
