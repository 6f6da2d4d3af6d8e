// flashcute/common/pdl.hpp: programmatic dependent launch (compute capability 9.0 on).
//
// A kernel launched with launch_dependent() may become resident while the kernel before it in the
// stream (its primary) still runs: once every CTA of the primary has called allow_dependents() or
// exited. Its wait_for_primary() returns when the primary has finished and its writes are visible,
// so nothing before it may read what the primary writes or write what the primary reads. The
// overlap hides the dependent's launch: the KV-cache call's attention after its append, and the
// combine after the attention (a microsecond or more each of a batch-1 decode). Where the GPU or
// the kernel's code is older than sm_90, the launch is an ordinary one and both calls are no-ops.
// CUDA-graph capture records the dependency as a programmatic edge.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "flashcute/common/launch.hpp"

namespace flashcute {

// In the primary: its dependent's CTAs may start once every CTA of the primary has called this (or
// exited). Resident early, they wait on the SMs: a long primary calls it near the end of its work.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// In the dependent: waits until the primary grid has completed and its memory is visible.
__device__ __forceinline__ void wait_for_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether kKernel, as loaded on the current device, was compiled from sm_90 or newer code (so that
// its wait_for_primary() is a real wait) on a GPU of compute capability 9.0 or newer. Asked once
// per device (once_per_device).
template <auto kKernel>
bool dependent_launch_ok() {
  static std::atomic<int> cached[64] = {};
  return once_per_device(cached, -1, [](int device) {
           cudaFuncAttributes attr{};
           int major = 0;
           return int(cudaFuncGetAttributes(&attr, kKernel) == cudaSuccess && attr.ptxVersion >= 90 &&
                      attr.binaryVersion >= 90 &&
                      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                      major >= 9);
         }) > 0;
}

// Launches kKernel(args...) on `stream`, as a dependent of the kernel before it where
// dependent_launch_ok(); the kernel must call wait_for_primary() before touching the primary's data.
template <auto kKernel, class... Args>
cudaError_t launch_dependent(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent_launch_ok<kKernel>() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kKernel, args...);
}

}  // namespace flashcute
