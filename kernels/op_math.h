// What an op's math header (kernels/<op>.h) builds on: MYOPS_HD marks its one-element functions for the
// CPU and CUDA alike, and row_math's exp is the one to call in them (libm's would keep the CPU loops
// scalar; on CUDA it is the device's expf).
#pragma once

#include "row_math.h"

#if defined(__CUDACC__)
#define MYOPS_HD __host__ __device__ __forceinline__
#else
#define MYOPS_HD inline
#endif
