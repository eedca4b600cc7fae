// What the CPU and CUDA declarations of myops::RMSNorm share: name, inputs X and scale of one
// element type, output Y with X's type and shape, the optional epsilon attribute, and the check
// of scale's shape that both kernels run before touching memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace myops {

#define MYOPS_RMS_NORM_NAME "RMSNorm"
inline constexpr const char* kRMSNormName = MYOPS_RMS_NORM_NAME;
inline constexpr float kDefaultEpsilon = 1e-6f;

// X's shape and the split into rows of `cols` values; an error status when X is a scalar or scale
// is not [X.shape[-1]].
struct RowShape {
  std::vector<int64_t> shape;
  int64_t rows = 0;
  int64_t cols = 0;
};

inline Ort::Status ReadRowShape(const Ort::ConstValue& x, const Ort::ConstValue& scale, const std::string& node,
                                RowShape* out) {
  const auto prefix = std::string("myops::" MYOPS_RMS_NORM_NAME " (node ") + node + "): ";
  out->shape = x.GetTensorTypeAndShapeInfo().GetShape();
  if (out->shape.empty()) {
    return Ort::Status((prefix + "X must have at least one dimension (it is normalised over the last)").c_str(),
                       ORT_INVALID_ARGUMENT);
  }
  out->cols = out->shape.back();
  const std::vector<int64_t> scale_shape = scale.GetTensorTypeAndShapeInfo().GetShape();
  if (scale_shape.size() != 1 || scale_shape[0] != out->cols) {
    std::string got = "[";
    for (size_t i = 0; i < scale_shape.size(); ++i) got += (i ? ", " : "") + std::to_string(scale_shape[i]);
    return Ort::Status((prefix + "scale must have shape [X.shape[-1]] = [" + std::to_string(out->cols) + "]; got " +
                        got + "]")
                           .c_str(),
                       ORT_INVALID_ARGUMENT);
  }
  const auto count = static_cast<int64_t>(x.GetTensorTypeAndShapeInfo().GetElementCount());
  out->rows = out->cols == 0 ? 0 : count / out->cols;
  return Ort::Status{nullptr};
}

template <typename TOp, typename TKernel, ONNXTensorElementDataType kType>
struct RMSNormOpBase : Ort::CustomOpBase<TOp, TKernel, /*WithStatus=*/true> {
  RMSNormOpBase() { this->InferOutputShapeFn = &SameTypeAndShapeAsInput; }

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    float epsilon = kDefaultEpsilon;
    if (OrtStatus* status = ReadFloatAttribute(api, info, kRMSNormName, "epsilon", kDefaultEpsilon, &epsilon)) {
      return status;
    }
    *kernel = new TKernel{epsilon, Ort::ConstKernelInfo{info}.GetNodeName()};
    return nullptr;
  }

  const char* GetName() const { return kRMSNormName; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t) const { return kType; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return kType; }
};

}  // namespace myops
