// What the CPU and CUDA declarations of myops::Swish share: name, one input and one output of the
// same element type, the optional beta attribute, shape inference. Each execution provider's op
// derives from it and adds its provider name and its kernel.
#pragma once

#include "common.h"

namespace myops {

#define MYOPS_SWISH_NAME "Swish"
inline constexpr const char* kSwishName = MYOPS_SWISH_NAME;
inline constexpr float kDefaultBeta = 1.0f;

inline OrtStatus* ReadBeta(const OrtApi& api, const OrtKernelInfo* info, float* beta) {
  return ReadFloatAttribute(api, info, kSwishName, "beta", kDefaultBeta, beta);
}

template <typename TOp, typename TKernel, ONNXTensorElementDataType kType>
struct SwishOpBase : Ort::CustomOpBase<TOp, TKernel, /*WithStatus=*/true> {
  SwishOpBase() { this->InferOutputShapeFn = &SameTypeAndShapeAsInput; }

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    float beta = kDefaultBeta;
    if (OrtStatus* status = ReadBeta(api, info, &beta)) return status;
    *kernel = new TKernel{beta};
    return nullptr;
  }

  const char* GetName() const { return kSwishName; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return kType; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return kType; }
};

}  // namespace myops
