// Every CUDA kernel of the plugin, added to the myops domain: a new op adds one line here.
#include "cuda/ops.h"

namespace myops {
namespace cuda {

void RegisterOps(Ort::CustomOpDomain& domain) {
  RegisterSwish(domain);
  RegisterRMSNorm(domain);
}

}  // namespace cuda
}  // namespace myops
