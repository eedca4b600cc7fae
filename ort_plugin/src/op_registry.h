// Kernel files register themselves: each ends with MYOPS_REGISTER_OP(provider, its Register function),
// and the provider folder's register_ops.cc adds whatever was registered to the domain. A new op
// adds its files and edits no list (the build collects sources by glob).
#pragma once

#include <vector>

#include "common.h"

namespace myops {

enum class Provider { kCpu, kCuda };
using RegisterFunction = void (*)(Ort::CustomOpDomain&);

// The functions registered for a provider, in the order their files' static initialisers ran
// (link order: the build sorts the sources). A function-local static, so that it exists before
// any file's initialiser appends to it.
inline std::vector<RegisterFunction>& Registered(Provider provider) {
  static std::vector<RegisterFunction> cpu, cuda;
  return provider == Provider::kCpu ? cpu : cuda;
}

struct Registration {
  Registration(Provider provider, RegisterFunction function) { Registered(provider).push_back(function); }
};

inline void AddRegistered(Provider provider, Ort::CustomOpDomain& domain) {
  for (RegisterFunction function : Registered(provider)) function(domain);
}

}  // namespace myops

#define MYOPS_REGISTER_OP(provider, function) \
  static const ::myops::Registration function##_registration { ::myops::Provider::provider, &function }
