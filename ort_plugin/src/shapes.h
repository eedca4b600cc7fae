// The input checks every op of a kind runs on both execution providers before touching memory; an
// error names the op, the node and the input.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace myops {

inline int64_t ElementCount(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

inline Ort::Status InputError(const char* op, const std::string& node, const std::string& what) {
  return Ort::Status((std::string("myops::") + op + " (node " + node + "): " + what).c_str(), ORT_INVALID_ARGUMENT);
}

// Elementwise: inputs 1 .. kIn-1 have X's shape (no broadcasting); *shape is X's.
template <size_t kIn>
Ort::Status ElementwiseShape(Ort::KernelContext& context, const char* op, const std::string& node,
                             std::vector<int64_t>* shape) {
  *shape = context.GetInput(0).GetTensorTypeAndShapeInfo().GetShape();
  for (size_t k = 1; k < kIn; ++k) {
    const std::vector<int64_t> other = context.GetInput(k).GetTensorTypeAndShapeInfo().GetShape();
    if (other != *shape) {
      return InputError(op, node, "input " + std::to_string(k) + " must have X's shape " + ShapeText(*shape) +
                                      " (elementwise, no broadcasting); got " + ShapeText(other));
    }
  }
  return Ort::Status{nullptr};
}

// Rowwise: X has a last axis of `cols` values; inputs 1 .. kFull-1 have X's shape, the rest (weights)
// are [cols]; *shape is X's.
template <size_t kIn, size_t kFull>
Ort::Status RowShape(Ort::KernelContext& context, const char* op, const std::array<const char*, kIn>& names,
                     const std::string& node, std::vector<int64_t>* shape) {
  *shape = context.GetInput(0).GetTensorTypeAndShapeInfo().GetShape();
  if (shape->empty()) {
    return InputError(op, node, std::string(names[0]) + " must have at least one dimension (it is normalised over the last)");
  }
  const int64_t cols = shape->back();
  for (size_t k = 1; k < kIn; ++k) {
    const std::vector<int64_t> got = context.GetInput(k).GetTensorTypeAndShapeInfo().GetShape();
    if (k < kFull && got != *shape) {
      return InputError(op, node, std::string(names[k]) + " must have " + names[0] + "'s shape " + ShapeText(*shape) +
                                      "; got " + ShapeText(got));
    }
    if (k >= kFull && (got.size() != 1 || got[0] != cols)) {
      return InputError(op, node, std::string(names[k]) + " must have shape [" + names[0] + ".shape[-1]] = [" +
                                      std::to_string(cols) + "]; got " + ShapeText(got));
    }
  }
  return Ort::Status{nullptr};
}

}  // namespace myops
