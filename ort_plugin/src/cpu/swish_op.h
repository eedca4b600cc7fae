// CPU execution provider kernels of the myops domain.
#pragma once

#include "common.h"

namespace myops {
namespace cpu {

void RegisterOps(Ort::CustomOpDomain& domain);

}  // namespace cpu
}  // namespace myops
