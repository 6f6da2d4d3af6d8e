// flashcute/common/status.hpp: what every host entry point returns. Nothing in flashcute aborts
// or throws; every problem comes back as a Status.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

namespace flashcute {

enum class StatusCode : int {
  kSuccess = 0,
  kInvalidType,      // an array has the wrong element type                   (Python: TypeError)
  kInvalidArgument,  // a shape, stride, alignment, pointer or value is wrong  (Python: ValueError)
  kNotCompiled,      // the build left out the kernel this call needs          (Python: NotImplementedError)
  kCudaError,        // a CUDA runtime call or a launch failed: see cuda_error (Python: RuntimeError)
};

// An error is structured: `arg` names the argument ("k", "softmax_scale", ...), `expected` says
// what was expected and `got` what was given. `message` is the sentence a user reads; it starts
// with the argument's name.
struct Status {
  StatusCode code = StatusCode::kSuccess;
  cudaError_t cuda_error = cudaSuccess;
  std::string arg;
  std::string expected;
  std::string got;
  std::string message;

  bool ok() const { return code == StatusCode::kSuccess; }

  static Status success() { return {}; }

  // message defaults to "<arg>: expected <expected>, got <got>".
  static Status invalid(StatusCode code, std::string arg, std::string expected, std::string got,
                        std::string message = {}) {
    Status st;
    st.code = code;
    if (message.empty()) message = arg + ": expected " + expected + ", got " + got;
    st.arg = std::move(arg);
    st.expected = std::move(expected);
    st.got = std::move(got);
    st.message = std::move(message);
    return st;
  }
  static Status invalid_argument(std::string arg, std::string expected, std::string got, std::string message = {}) {
    return invalid(StatusCode::kInvalidArgument, std::move(arg), std::move(expected), std::move(got),
                   std::move(message));
  }
  static Status invalid_type(std::string arg, std::string expected, std::string got, std::string message = {}) {
    return invalid(StatusCode::kInvalidType, std::move(arg), std::move(expected), std::move(got), std::move(message));
  }
  static Status cuda(cudaError_t err, const char* where) {
    Status st;
    st.code = StatusCode::kCudaError;
    st.cuda_error = err;
    st.message = std::string("CUDA error in ") + where + ": " + cudaGetErrorName(err) + " (" +
                 cudaGetErrorString(err) + ")";
    return st;
  }
};

}  // namespace flashcute

// Evaluates a CUDA runtime call and returns a Status from the enclosing function on failure.
#define FLASHCUTE_CUDA_CHECK(expr)                                     \
  do {                                                                 \
    cudaError_t flashcute_err_ = (expr);                               \
    if (flashcute_err_ != cudaSuccess) {                               \
      return ::flashcute::Status::cuda(flashcute_err_, #expr);         \
    }                                                                  \
  } while (0)
