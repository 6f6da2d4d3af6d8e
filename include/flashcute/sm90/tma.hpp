// flashcute/sm90/tma.hpp: what the sm90a launchers share to build TMA descriptors on the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashcute/common/status.hpp"

namespace flashcute::sm90 {

// Whether the driver has cuTensorMapEncodeTiled (CUDA 12.0 and later: every driver that runs
// sm_90a code does), looked up once. CuTe's encoder only prints (and asserts without NDEBUG) when
// the encoding fails; sm90_can_run has already checked every other condition it can fail on.
inline Status tma_encoder_available() {
  static const cudaError_t status = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return err != cudaSuccess ? err : (found == cudaDriverEntryPointSuccess ? cudaSuccess : cudaErrorNotSupported);
  }();
  if (status == cudaSuccess) return Status::success();
  return Status::cuda(status, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled): the sm90 kernels' TMA "
                              "descriptors need a CUDA 12 driver");
}

// A TMA descriptor needs a valid stride for every dim, also for one of extent 1, where the
// params hold 0 (it never multiplies a non-zero index): any multiple of 16 bytes does.
inline int64_t tma_stride(int64_t stride) { return stride != 0 ? stride : 8; }

}  // namespace flashcute::sm90
