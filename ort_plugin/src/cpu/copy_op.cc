// myops::Copy: Y = X (float32), split over ORT's thread pool exactly as myops::Swish is (cpu/spans.h)
// and written into the same arena-allocated output. The benchmark times it as the floor of what an
// elementwise op of this plugin can cost: ORT's Identity is not that floor, since it runs outside
// the plugin's threading and buffer path.
#include "cpu/ops.h"

#include <cstdint>
#include <cstring>

#include "cpu/spans.h"

namespace myops {
namespace cpu {
namespace {

#define MYOPS_COPY_NAME "Copy"
MYOPS_BUILD_INFO(kCopyInfo, "myops-op: domain=" MYOPS_DOMAIN " op=" MYOPS_COPY_NAME
                            " since=1 provider=CPUExecutionProvider types=float32");

void CopySpan(const float* x, float* y, int64_t count, float /*beta*/) {
  std::memcpy(y, x, static_cast<size_t>(count) * sizeof(float));
}

struct CopyKernel {
  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) const {
    return GuardStatus([&] {
      Ort::KernelContext context{raw_context};
      RunSpans<&CopySpan>(context, 0.0f);
      return Ort::Status{nullptr};
    });
  }
};

struct CopyOp : Ort::CustomOpBase<CopyOp, CopyKernel, /*WithStatus=*/true> {
  CopyOp() { InferOutputShapeFn = &SameTypeAndShapeAsInput; }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo*, void** kernel) const {
    *kernel = new CopyKernel{};
    return nullptr;
  }

  const char* GetName() const { return MYOPS_COPY_NAME; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

void RegisterCopy(Ort::CustomOpDomain& domain) {
  static const CopyOp copy_op;
  domain.Add(&copy_op);
}

MYOPS_REGISTER_OP(kCpu, RegisterCopy);

}  // namespace
}  // namespace cpu
}  // namespace myops
