// flashcute/status.hpp: error reporting for the host API. Nothing in flashcute aborts;
// every entry point returns a Status.
#pragma once

#include <cuda_runtime_api.h>

namespace flashcute {

enum class StatusCode : int {
  kSuccess = 0,
  kInvalidArgument,   // a shape, stride, pointer or option is out of range
  kNotCompiled,       // this dtype x head dim was left out of the build
  kCudaError,         // a CUDA runtime call or a launch failed: see cuda_error
};

struct Status {
  StatusCode code = StatusCode::kSuccess;
  cudaError_t cuda_error = cudaSuccess;
  const char* message = "";  // static string, never freed

  constexpr bool ok() const { return code == StatusCode::kSuccess; }
  static constexpr Status success() { return {}; }
  static constexpr Status invalid(const char* msg) { return {StatusCode::kInvalidArgument, cudaSuccess, msg}; }
  static constexpr Status not_compiled(const char* msg) { return {StatusCode::kNotCompiled, cudaSuccess, msg}; }
  static Status cuda(cudaError_t err, const char* where) { return {StatusCode::kCudaError, err, where}; }
};

// Evaluates a CUDA runtime call and returns a Status from the enclosing function on failure.
#define FLASHCUTE_CUDA_CHECK(expr)                                     \
  do {                                                                 \
    cudaError_t flashcute_err_ = (expr);                               \
    if (flashcute_err_ != cudaSuccess) {                               \
      return ::flashcute::Status::cuda(flashcute_err_, #expr);         \
    }                                                                  \
  } while (0)

}  // namespace flashcute
