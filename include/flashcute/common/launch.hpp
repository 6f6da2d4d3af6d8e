// flashcute/common/launch.hpp: host-side helpers every kernel family's launcher shares.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "flashcute/common/status.hpp"

namespace flashcute {

// Lets kKernel use smem_bytes of dynamic shared memory (needed above 48 KB). A per-device
// function attribute: it is set once per device, so that a launch made while a stream is being
// captured into a CUDA graph (after the usual warm-up) is the only CUDA call.
template <auto kKernel>
Status allow_smem(int smem_bytes) {
  if (smem_bytes <= 48 * 1024) return Status::success();
  static std::atomic<uint64_t> set_on_devices{0};
  int device = 0;
  FLASHCUTE_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit == 0 || !(set_on_devices.load(std::memory_order_relaxed) & bit)) {
    FLASHCUTE_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    set_on_devices.fetch_or(bit, std::memory_order_relaxed);
  }
  return Status::success();
}

// Attribute kAttr of `device` (the current one if < 0), asked once per device, so that a launch
// during CUDA-graph capture makes no extra CUDA call; -1 if it cannot be known.
template <cudaDeviceAttr kAttr>
int device_attribute(int device = -1) {
  static std::atomic<int> cached[64] = {};  // the value + 1; 0: not asked yet
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) return -1;
  if (device < 0) return -1;
  if (device < 64 && cached[device].load(std::memory_order_relaxed) > 0) return cached[device].load() - 1;
  int value = 0;
  if (cudaDeviceGetAttribute(&value, kAttr, device) != cudaSuccess) return -1;
  if (device < 64) cached[device].store(value + 1);
  return value;
}

// The SM count of `device` (the current one if < 0); 0 if it cannot be known.
inline int device_sms(int device = -1) {
  const int sms = device_attribute<cudaDevAttrMultiProcessorCount>(device);
  return sms > 0 ? sms : 0;
}

}  // namespace flashcute
