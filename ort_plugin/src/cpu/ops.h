// CPU execution provider kernels of the myops domain: one Register function per op file, all
// called from register_ops.cc.
#pragma once

#include "common.h"

namespace myops {
namespace cpu {

void RegisterOps(Ort::CustomOpDomain& domain);

void RegisterSwish(Ort::CustomOpDomain& domain);
void RegisterRMSNorm(Ort::CustomOpDomain& domain);
void RegisterCopy(Ort::CustomOpDomain& domain);  // the benchmark's copy floor inside the plugin

}  // namespace cpu
}  // namespace myops
