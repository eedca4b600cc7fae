// Every CPU kernel of the plugin, added to the myops domain: a new op adds one line here.
#include "cpu/ops.h"

namespace myops {
namespace cpu {

void RegisterOps(Ort::CustomOpDomain& domain) {
  RegisterSwish(domain);
  RegisterCopy(domain);
  RegisterRMSNorm(domain);
}

}  // namespace cpu
}  // namespace myops
