// The plugin's only exported symbol (see exports.map). ORT calls it once per SessionOptions
// that loads this library; each execution provider folder adds its kernels to the domain.
#include <exception>
#include <string>

#include "common.h"
#include "cpu/ops.h"
#include "cuda/ops.h"

#if !defined(MYOPS_CUDA_ARCHITECTURES)
#define MYOPS_CUDA_ARCHITECTURES "none"
#endif

namespace {
MYOPS_BUILD_INFO(kPluginInfo, "myops-plugin: api=" MYOPS_STRINGIFY(ORT_API_VERSION)
                              " cuda_archs=" MYOPS_CUDA_ARCHITECTURES);
}  // namespace

extern "C" MYOPS_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                  const OrtApiBase* api_base) {
  // NOTE: built against the pinned headers' ORT_API_VERSION. ORT's C API only grows, so every newer
  // runtime serves this version; an older one answers null and we say which runtime is needed.
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    const std::string message = std::string("myops plugin: built for the ONNX Runtime C API version ") +
                                std::to_string(ORT_API_VERSION) + " (onnxruntime >= 1." +
                                std::to_string(ORT_API_VERSION) + ") but this onnxruntime is " +
                                api_base->GetVersionString() +
                                ". Upgrade onnxruntime or rebuild the plugin against its headers.";
    return api_base->GetApi(1)->CreateStatus(ORT_FAIL, message.c_str());
  }
  Ort::InitApi(api);
  return myops::GuardStatus([&] {
    // Domain and ops live in function-local statics for the life of the process: ORT keeps raw
    // pointers to them in every session created from these options.
    static Ort::CustomOpDomain& domain = [] () -> Ort::CustomOpDomain& {
      static Ort::CustomOpDomain d{myops::kDomain};
      myops::cpu::RegisterOps(d);
      myops::cuda::RegisterOps(d);
      return d;
    }();
    Ort::UnownedSessionOptions(options).Add(static_cast<OrtCustomOpDomain*>(domain));
    return Ort::Status{nullptr};
  });
}
