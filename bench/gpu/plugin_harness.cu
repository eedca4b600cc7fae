// The ORT plugin's CUDA launch path without ONNX Runtime, for GPU hosts that have no
// onnxruntime-gpu: the same call ort_plugin/src/cuda/swish_op.cc makes (swish::cuda::forward on a
// device buffer and a non-default stream, float32 or float16), compiled from the same
// kernels/swish_cuda.cu with the plugin's flags. bench/gpu_check.py builds it, runs it and compares
// its output with the CPU kernel.
//
//   plugin_harness f32|f16 OFFSET IN OUT BETA [BETA ...]
//
// IN: n raw elements of the dtype. OUT: n elements per BETA, one block after another.
// OFFSET: the device input and output start that many elements past an aligned allocation
// (1 takes the kernel's unaligned path, 0 its vector path).
// Exit status: 0 done, 1 CUDA or file error, 2 usage error; the reason goes to stderr.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "swish_cuda.h"

namespace {

int usage(const char* why) {
  std::fprintf(stderr, "plugin_harness: %s\nusage: plugin_harness f32|f16 OFFSET IN OUT BETA [BETA ...]\n", why);
  return 2;
}

int cuda_failed(const char* what, cudaError_t err) {
  std::fprintf(stderr, "plugin_harness: %s: %s (%s)\n", what, cudaGetErrorName(err), cudaGetErrorString(err));
  return 1;
}

bool read_file(const char* path, std::vector<unsigned char>* bytes) {
  FILE* file = std::fopen(path, "rb");
  if (file == nullptr) return false;
  unsigned char chunk[1 << 16];
  size_t got = 0;
  while ((got = std::fread(chunk, 1, sizeof(chunk), file)) > 0) bytes->insert(bytes->end(), chunk, chunk + got);
  const bool ok = std::ferror(file) == 0;
  std::fclose(file);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) return usage("too few arguments");
  const std::string dtype_name = argv[1];
  if (dtype_name != "f32" && dtype_name != "f16") return usage("dtype must be f32 or f16");
  const swish::cuda::DType dtype = dtype_name == "f16" ? swish::cuda::DType::kFloat16 : swish::cuda::DType::kFloat32;
  const size_t elem = dtype_name == "f16" ? 2 : 4;
  char* end = nullptr;
  const long offset = std::strtol(argv[2], &end, 10);
  if (*end != '\0' || offset < 0 || offset > 64) return usage("OFFSET must be an integer in 0..64");
  std::vector<float> betas;
  for (int i = 5; i < argc; ++i) {
    betas.push_back(std::strtof(argv[i], &end));
    if (*end != '\0') return usage("BETA must be a number");
  }

  // Input first, CUDA after: argument and file errors are reported even where there is no GPU.
  std::vector<unsigned char> input;
  if (!read_file(argv[3], &input)) {
    std::fprintf(stderr, "plugin_harness: cannot read %s\n", argv[3]);
    return 1;
  }
  if (input.size() % elem != 0) return usage("IN's size is not a whole number of elements");
  const size_t n = input.size() / elem;
  const size_t bytes = n * elem;
  const size_t shift = static_cast<size_t>(offset) * elem;

  cudaError_t err = cudaSuccess;
  unsigned char* base_in = nullptr;
  unsigned char* base_out = nullptr;
  // NOTE: ORT's compute stream is a created stream, not the legacy default one; a kernel that
  // ignored the stream argument would race with the memset and copies below (NaN or stale output).
  cudaStream_t stream = nullptr;
  if ((err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) return cuda_failed("cudaStreamCreate", err);
  if ((err = cudaMalloc(&base_in, bytes + shift + 1)) != cudaSuccess) return cuda_failed("cudaMalloc(in)", err);
  if ((err = cudaMalloc(&base_out, bytes + shift + 1)) != cudaSuccess) return cuda_failed("cudaMalloc(out)", err);
  unsigned char* in = base_in + shift;
  unsigned char* out = base_out + shift;
  if ((err = cudaMemcpyAsync(in, input.data(), bytes, cudaMemcpyHostToDevice, stream)) != cudaSuccess) {
    return cuda_failed("cudaMemcpy(in)", err);
  }

  FILE* result_file = std::fopen(argv[4], "wb");
  if (result_file == nullptr) {
    std::fprintf(stderr, "plugin_harness: cannot write %s\n", argv[4]);
    return 1;
  }
  std::vector<unsigned char> result(bytes);
  for (const float beta : betas) {
    // All-ones bytes are NaN in both dtypes: an element the kernel never writes cannot pass.
    if ((err = cudaMemsetAsync(out, 0xFF, bytes, stream)) != cudaSuccess) return cuda_failed("cudaMemset", err);
    if ((err = swish::cuda::forward(in, out, static_cast<int64_t>(n), beta, dtype, stream)) != cudaSuccess) {
      return cuda_failed("swish::cuda::forward", err);
    }
    if ((err = cudaMemcpyAsync(result.data(), out, bytes, cudaMemcpyDeviceToHost, stream)) != cudaSuccess) {
      return cuda_failed("cudaMemcpy(out)", err);
    }
    if ((err = cudaStreamSynchronize(stream)) != cudaSuccess) return cuda_failed("kernel execution", err);
    if (bytes > 0 && std::fwrite(result.data(), 1, bytes, result_file) != bytes) {
      std::fprintf(stderr, "plugin_harness: short write to %s\n", argv[4]);
      return 1;
    }
  }
  if (std::fclose(result_file) != 0) {
    std::fprintf(stderr, "plugin_harness: cannot close %s\n", argv[4]);
    return 1;
  }
  cudaFree(base_in);
  cudaFree(base_out);
  cudaStreamDestroy(stream);
  return 0;
}
