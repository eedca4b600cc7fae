// The ORT plugin's CUDA launch path without ONNX Runtime, for GPU hosts that have no
// onnxruntime-gpu: the same call the plugin's Swish kernel makes (swish::cuda::forward on a device
// buffer and a non-default stream, float32 or float16), compiled from the same launchers, written by
// opspec/codegen, with the plugin's flags. bench/gpu/plugin.py builds and runs it;
// tests/test_plugin_cuda.py compares its output with the float64 reference there, and
// bench.gpu_check times it against a copy.
//
//   plugin_harness f32|f16 OFFSET IN OUT BETA [BETA ...]
//   plugin_harness time f32|f16 N REPS
//
// IN: n raw elements of the dtype. OUT: n elements per BETA, one block after another.
// OFFSET: the device input and output start that many elements past an aligned allocation
// (1 takes the kernel's unaligned path, 0 its vector path).
// time: the device time of the kernel on N elements against a device-to-device copy of the same
// bytes, each as REPS launches back to back between one event pair (launches from C++ are a few
// microseconds, so the stream never runs dry on a tensor beyond L2), the two alternating batch by
// batch, median of 11 batches each, on values across -8..8; one line
// `forward_ms=F copy_ms=C` per launch.
// Exit status: 0 done, 1 CUDA or file error, 2 usage error; the reason goes to stderr.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness_launchers.h"  // bench/gpu/plugin.py writes it

namespace {

int usage(const char* why) {
  std::fprintf(stderr,
               "plugin_harness: %s\nusage: plugin_harness f32|f16 OFFSET IN OUT BETA [BETA ...]\n"
               "       plugin_harness time f32|f16 N REPS\n", why);
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

// Milliseconds per launch of `first` and of `second`, REPS launches between one event pair, the two
// alternating batch by batch (so that a clock ramping up or down weighs on both alike); the median
// of 11 batches each, after one batch of each to warm up.
template <typename First, typename Second>
cudaError_t median_ms_alternating(First first, Second second, int reps, cudaStream_t stream, float* first_ms,
                                  float* second_ms) {
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
  cudaError_t err = cudaSuccess;
  if ((err = cudaEventCreate(&start)) != cudaSuccess || (err = cudaEventCreate(&end)) != cudaSuccess) return err;
  std::vector<float> per_launch[2];
  for (int batch = 0; batch < 12; ++batch) {
    for (int which = 0; which < 2; ++which) {
      if ((err = cudaEventRecord(start, stream)) != cudaSuccess) return err;
      for (int r = 0; r < reps; ++r) {
        if ((err = which == 0 ? first() : second()) != cudaSuccess) return err;
      }
      if ((err = cudaEventRecord(end, stream)) != cudaSuccess) return err;
      if ((err = cudaEventSynchronize(end)) != cudaSuccess) return err;
      float elapsed = 0;
      if ((err = cudaEventElapsedTime(&elapsed, start, end)) != cudaSuccess) return err;
      if (batch > 0) per_launch[which].push_back(elapsed / reps);
    }
  }
  for (auto& times : per_launch) std::sort(times.begin(), times.end());
  *first_ms = per_launch[0][per_launch[0].size() / 2];
  *second_ms = per_launch[1][per_launch[1].size() / 2];
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return cudaSuccess;
}

int time_kernel(int argc, char** argv) {
  if (argc != 5) return usage("time takes f32|f16 N REPS");
  const std::string dtype_name = argv[2];
  if (dtype_name != "f32" && dtype_name != "f16") return usage("dtype must be f32 or f16");
  char* end = nullptr;
  const long long n = std::strtoll(argv[3], &end, 10);
  if (*end != '\0' || n <= 0) return usage("N must be a positive integer");
  const long reps = std::strtol(argv[4], &end, 10);
  if (*end != '\0' || reps <= 0 || reps > 1000) return usage("REPS must be an integer in 1..1000");
  const myops_cuda::DType dtype = dtype_name == "f16" ? myops_cuda::DType::kFloat16 : myops_cuda::DType::kFloat32;
  const size_t bytes = static_cast<size_t>(n) * (dtype_name == "f16" ? 2 : 4);
  cudaStream_t stream = nullptr;
  void* in = nullptr;
  void* out = nullptr;
  cudaError_t err = cudaSuccess;
  if ((err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) return cuda_failed("cudaStreamCreate", err);
  if ((err = cudaMalloc(&in, bytes)) != cudaSuccess) return cuda_failed("cudaMalloc(in)", err);
  if ((err = cudaMalloc(&out, bytes)) != cudaSuccess) return cuda_failed("cudaMalloc(out)", err);
  {
    // Values across the activation's range (-8..8), not zeros: the kernel's time must not depend on a
    // constant input.
    std::vector<unsigned char> host(bytes);
    for (long long i = 0; i < n; ++i) {
      const float v = static_cast<float>((i * 2654435761LL) % 16001) / 1000.0f - 8.0f;
      if (dtype_name == "f16") {
        const __half h = __float2half_rn(v);
        std::memcpy(host.data() + i * 2, &h, 2);
      } else {
        std::memcpy(host.data() + i * 4, &v, 4);
      }
    }
    if ((err = cudaMemcpy(in, host.data(), bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
      return cuda_failed("cudaMemcpy(in)", err);
    }
  }
  float forward_ms = 0;
  float copy_ms = 0;
  err = median_ms_alternating([&] { return swish::cuda::forward(in, out, n, 1.0f, dtype, stream); },
                              [&] { return cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, stream); },
                              static_cast<int>(reps), stream, &forward_ms, &copy_ms);
  if (err != cudaSuccess) return cuda_failed("timing swish::cuda::forward against cudaMemcpyAsync", err);
  std::printf("forward_ms=%.6f copy_ms=%.6f\n", forward_ms, copy_ms);
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "time") return time_kernel(argc, argv);
  if (argc < 6) return usage("too few arguments");
  const std::string dtype_name = argv[1];
  if (dtype_name != "f32" && dtype_name != "f16") return usage("dtype must be f32 or f16");
  const myops_cuda::DType dtype = dtype_name == "f16" ? myops_cuda::DType::kFloat16 : myops_cuda::DType::kFloat32;
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
