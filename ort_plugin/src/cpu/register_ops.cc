// Every CPU kernel the plugin's files registered (op_registry.h), added to the myops domain.
#include "cpu/ops.h"

namespace myops {
namespace cpu {

void RegisterOps(Ort::CustomOpDomain& domain) { AddRegistered(Provider::kCpu, domain); }

}  // namespace cpu
}  // namespace myops
