// What every op of a kind shares on both execution providers, from its declaration (the `Decl` struct
// opspec/codegen writes from opspec/<op>.py): name, inputs and outputs of one element type, the float
// attributes read with their defaults, shape inference. Each provider's kernels (cpu/declared_ops.h,
// cuda/declared_ops.h) add the computation.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "common.h"

namespace myops {

// Decl: kName, kInputs, kFullInputs, kOutputs, kInputNames, kAttributeNames, kAttributeDefaults.
template <class Decl>
using AttributeValues = std::array<float, Decl::kAttributeNames.size()>;

// The kernel ORT keeps per node: only the node's attributes and name, no per-call state. Run is the op's
// kind on a provider: Run{}(context, attributes, node) -> Ort::Status.
template <class Decl, class Run>
struct DeclaredKernel {
  AttributeValues<Decl> attributes;
  std::string node;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) const {
    return GuardStatus([&] {
      Ort::KernelContext context{raw_context};
      return Run{}(context, attributes, node);
    });
  }
};

template <typename TOp, class Decl, typename TKernel, ONNXTensorElementDataType kType>
struct DeclaredOpBase : Ort::CustomOpBase<TOp, TKernel, /*WithStatus=*/true> {
  DeclaredOpBase() { this->InferOutputShapeFn = &SameTypeAndShapeAsInput; }

  // Guarded: the node's name, the strings and the kernel's allocation may throw, and nothing may cross ORT's C API.
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    return GuardStatus([&]() -> Ort::Status {
      AttributeValues<Decl> values{};
      for (size_t k = 0; k < values.size(); ++k) {
        if (OrtStatus* status = ReadFloatAttribute(api, info, Decl::kName, Decl::kAttributeNames[k],
                                                   Decl::kAttributeDefaults[k], &values[k])) {
          return Ort::Status{status};
        }
      }
      *kernel = new TKernel{values, Ort::ConstKernelInfo{info}.GetNodeName()};
      return Ort::Status{nullptr};
    });
  }

  const char* GetName() const { return Decl::kName; }
  size_t GetInputTypeCount() const { return Decl::kInputs; }
  ONNXTensorElementDataType GetInputType(size_t) const { return kType; }
  size_t GetOutputTypeCount() const { return Decl::kOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return kType; }
};

}  // namespace myops
