// Shared by every kernel file of the plugin: the ORT C++ API set up for manual init (the entry
// point initialises it from the OrtApiBase ORT passes in), the domain name, and error plumbing.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#define MYOPS_EXPORT __attribute__((visibility("default")))
#define MYOPS_STRINGIFY_(x) #x
#define MYOPS_STRINGIFY(x) MYOPS_STRINGIFY_(x)

// What a build registers, kept as plain strings in the library so that `doctor` can read them from
// the file without loading it (ort_plugin/library_info.py parses "myops-op:" and "myops-plugin:").
#define MYOPS_BUILD_INFO(name, text) [[gnu::used]] constexpr char name[] = text

namespace myops {

// Case-sensitive: an ONNX node must say exactly this domain (and its op's name, which each op's
// header defines) to reach our kernels. A macro as well as a constant: the build-info strings are
// assembled at compile time.
#define MYOPS_DOMAIN "myops"
inline constexpr const char* kDomain = MYOPS_DOMAIN;

// Runs `body` (returning Ort::Status) and turns any exception into an OrtStatus*, so that
// nothing is thrown across ORT's C boundary.
template <typename Body>
OrtStatus* GuardStatus(Body&& body) noexcept {
  try {
    return body().release();
  } catch (const Ort::Exception& e) {
    return Ort::Status(e.what(), e.GetOrtErrorCode()).release();
  } catch (const std::exception& e) {
    return Ort::Status(e.what(), ORT_FAIL).release();
  }
}

// The optional float attribute `name` of node type `op`; absent means `fallback`, any other
// failure (e.g. the attribute given as an int) is an error that names the node and the attribute.
inline OrtStatus* ReadFloatAttribute(const OrtApi& api, const OrtKernelInfo* info, const char* op, const char* name,
                                     float fallback, float* value) {
  Ort::ConstKernelInfo kernel_info{info};
  *value = fallback;
  OrtStatus* status = api.KernelInfoGetAttribute_float(info, name, value);
  if (status == nullptr) return nullptr;
  const std::string message = api.GetErrorMessage(status);
  api.ReleaseStatus(status);
  if (message.find("No attribute") != std::string::npos || message.find("not found") != std::string::npos) {
    *value = fallback;
    return nullptr;
  }
  return Ort::Status((std::string("myops::") + op + " (node " + kernel_info.GetNodeName() + "): attribute '" + name +
                      "' must be a float; ORT said: " + message)
                         .c_str(),
                     ORT_INVALID_ARGUMENT)
      .release();
}

// Shape inference for elementwise ops: every output gets X's element type and shape, symbolic dims included,
// so shapes stay known downstream. NOTE: Ort::ShapeInferContext::SetOutputShape of the 1.21 headers
// marks symbolic dims as -2, which newer runtimes reject; handing ORT back its own description of X
// works with every version. The info belongs to the context: it is not released here.
// An input of unknown rank also reads as zero dims; passing that on would declare the outputs scalars,
// so zero dims leave their shapes unset (a true scalar only loses a shape it did not need). The
// context does not say how many outputs the node has: the op does (GetOutputTypeCount; every output
// is required, so the node has them all).
inline OrtStatusPtr ORT_API_CALL SameTypeAndShapeAsInput(const OrtCustomOp* op, OrtShapeInferContext* context) {
  const OrtApi& api = Ort::GetApi();
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* status = api.ShapeInferContext_GetInputTypeShape(context, 0, &info)) return status;
  size_t rank = 0;
  if (OrtStatus* status = api.GetDimensionsCount(info, &rank)) return status;
  if (rank == 0) return nullptr;
  const size_t outputs = op->GetOutputTypeCount(op);
  for (size_t k = 0; k < outputs; ++k) {
    if (OrtStatus* status = api.ShapeInferContext_SetOutputTypeShape(context, k, info)) return status;
  }
  return nullptr;
}

// "[8, 512, 768]": a tensor's shape in an error message.
inline std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace myops
