// Every CUDA kernel the plugin's files registered (op_registry.h), added to the myops domain.
#include "cuda/ops.h"

namespace myops {
namespace cuda {

void RegisterOps(Ort::CustomOpDomain& domain) { AddRegistered(Provider::kCuda, domain); }

}  // namespace cuda
}  // namespace myops
