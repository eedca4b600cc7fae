// The CPU kernels of every op of a kind: float32, the op's loops (Decl::Forward: kernels/elementwise_cpu.h
// over its math's one-element functions, or its math header's own forward_span or forward_rows) on ORT's
// intra-op thread pool (cpu/spans.h).
#pragma once

#include <string>

#include "cpu/ops.h"
#include "cpu/spans.h"
#include "declared_op.h"

namespace myops {
namespace cpu {

template <class Decl>
struct RunElementwiseKind {
  Ort::Status operator()(Ort::KernelContext& context, const AttributeValues<Decl>& values, const std::string& node) const {
    return RunElementwise<Decl::kInputs, Decl::kOutputs>(
        context, Decl::kName, node,
        [&values](const auto& in, const auto& out, int64_t count) { typename Decl::Forward{}(in, out, count, values); });
  }
};

template <class Decl>
struct RunRowwiseKind {
  Ort::Status operator()(Ort::KernelContext& context, const AttributeValues<Decl>& values, const std::string& node) const {
    return RunRows<Decl::kInputs, Decl::kFullInputs, Decl::kOutputs>(
        context, Decl::kName, Decl::kInputNames, node,
        [&values](const auto& in, const auto& out, int64_t rows, int64_t cols) {
          typename Decl::Forward{}(in, out, rows, cols, values);
        });
  }
};

template <class Decl>
using ElementwiseKernel = DeclaredKernel<Decl, RunElementwiseKind<Decl>>;
template <class Decl>
using RowwiseKernel = DeclaredKernel<Decl, RunRowwiseKind<Decl>>;

template <class Decl, template <class> class Kernel>
struct DeclaredOp : DeclaredOpBase<DeclaredOp<Decl, Kernel>, Decl, Kernel<Decl>, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT> {
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
};

}  // namespace cpu
}  // namespace myops
