// CPU execution provider kernels of the myops domain: each kernel file registers itself
// (MYOPS_REGISTER_OP(kCpu, ...), op_registry.h); RegisterOps adds them all to the domain.
#pragma once

#include "common.h"
#include "op_registry.h"

namespace myops {
namespace cpu {

void RegisterOps(Ort::CustomOpDomain& domain);

}  // namespace cpu
}  // namespace myops
