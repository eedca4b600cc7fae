// The storage type of a CUDA kernel's tensors, one enum for every op's host launchers (the math is
// float32 whatever the storage).
#pragma once

namespace myops_cuda {

enum class DType { kFloat32, kFloat16, kBFloat16 };

}  // namespace myops_cuda
