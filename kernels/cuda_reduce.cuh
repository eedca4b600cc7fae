// Sums across a warp and a block, for the CUDA kernels that reduce a row in one block (the row-wise
// kind's generic kernels, RMSNorm's own).
#pragma once

namespace myops_cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread. `scratch`
// holds blockDim.x / 32 floats; the leading barrier lets a caller reuse it in a loop.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

}  // namespace myops_cuda
