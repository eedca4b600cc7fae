// CUDA execution provider kernels of the myops domain: each kernel file registers itself
// (MYOPS_REGISTER_OP(kCuda, ...), op_registry.h). Without CUDA in the build RegisterOps is a no-op,
// so the entry point needs no #ifdef.
#pragma once

#include "common.h"
#include "op_registry.h"

namespace myops {
namespace cuda {

#if defined(MYOPS_WITH_CUDA)
void RegisterOps(Ort::CustomOpDomain& domain);
#else
inline void RegisterOps(Ort::CustomOpDomain&) {}
#endif

}  // namespace cuda
}  // namespace myops
