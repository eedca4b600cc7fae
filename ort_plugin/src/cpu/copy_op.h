// myops::Copy on CPUExecutionProvider: the benchmark's copy floor inside the plugin.
#pragma once

#include "common.h"

namespace myops {
namespace cpu {

void RegisterCopy(Ort::CustomOpDomain& domain);

}  // namespace cpu
}  // namespace myops
