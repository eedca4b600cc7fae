// CUDA execution provider kernels of the myops domain. Without CUDA in the build RegisterOps is a
// no-op, so the entry point needs no #ifdef.
#pragma once

#include "common.h"

namespace myops {
namespace cuda {

#if defined(MYOPS_WITH_CUDA)
void RegisterOps(Ort::CustomOpDomain& domain);

void RegisterSwish(Ort::CustomOpDomain& domain);
void RegisterRMSNorm(Ort::CustomOpDomain& domain);
#else
inline void RegisterOps(Ort::CustomOpDomain&) {}
#endif

}  // namespace cuda
}  // namespace myops
