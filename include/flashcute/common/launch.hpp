// flashcute/common/launch.hpp: each kernel family's launch functions, and the host-side helpers
// their launchers share.
//
// The families define the launch functions (sm80/launch_*.hpp, sm90/launch_fwd.hpp), each
// compiled kernel is one explicit instantiation in its own generated translation unit
// (src/kernel.cu.in), and host/dispatch.hpp calls them: it needs the declarations below, not the
// definitions, so that a translation unit of the dispatch does not instantiate every kernel of
// the list. Header-only users get the definitions from flashcute/flashcute.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "flashcute/common/params.hpp"
#include "flashcute/common/status.hpp"
#include "flashcute/common/types.hpp"

namespace flashcute {

namespace sm80 {
template <DType kDType, int kHeadDim>
Status launch_fwd(const FwdParams& params, cudaStream_t stream);
template <DType kDType, int kHeadDim>
Status launch_bwd(const BwdParams& params, cudaStream_t stream);
// The forward's variant Variant::kSplitkv (sm80/launch_splitkv.hpp).
template <DType kDType, int kHeadDim>
Status launch_splitkv(const FwdParams& params, cudaStream_t stream);
// Its decode twins (sm80/config.hpp, decode_splitkv_config), for calls of at most kDecodeRows
// query rows, one for contiguous caches and one for paged ones: two more generated TUs for each
// compiled KV-cache kernel.
template <DType kDType, int kHeadDim>
Status launch_splitkv_decode(const FwdParams& params, cudaStream_t stream);
template <DType kDType, int kHeadDim>
Status launch_splitkv_decode_paged(const FwdParams& params, cudaStream_t stream);
// The KV-cache call's append and combine (sm80/kernel_kvcache.hpp), every dtype in one function
// each: instantiated (<0>) in src/kvcache.cu.
template <int kUnused>
Status launch_append_kv(const FwdParams& params, const AppendKvParams& append, cudaStream_t stream);
template <int kUnused>
Status launch_combine(const FwdParams& params, DType dtype, cudaStream_t stream);
// merge_attn_states (sm80/kernel_merge.hpp), every dtype in one function: instantiated (<0>) in
// src/merge.cu, a template only so that header-only users may define it in several TUs.
template <int kUnused>
Status launch_merge(const MergeParams& params, DType dtype, cudaStream_t stream);
}  // namespace sm80

// The Hopper kernels (sm90/launch_*.hpp): generated TUs compiled for sm_90a only.
namespace sm90 {
template <DType kDType, int kHeadDim>
Status launch_fwd(const FwdParams& params, cudaStream_t stream);
// The long-sequence tiles (sm90/config.hpp, long_fwd_config): one more generated TU for each
// compiled sm90 forward kernel whose head dim has them.
template <DType kDType, int kHeadDim>
Status launch_fwd_long(const FwdParams& params, cudaStream_t stream);
// The variable-length batch (cu_seqlens): one more generated TU for each compiled sm90 forward kernel.
template <DType kDType, int kHeadDim>
Status launch_fwd_varlen(const FwdParams& params, cudaStream_t stream);
// A KV cache (cache_seqlens, block_table): one more generated TU for each compiled sm90 forward
// kernel, where the build has the KV-cache kernels (FLASHCUTE_KVCACHE).
template <DType kDType, int kHeadDim>
Status launch_fwd_kvcache(const FwdParams& params, cudaStream_t stream);
// The Hopper backward (sm90/launch_bwd.hpp), where sm90::has_bwd_config(kHeadDim).
template <DType kDType, int kHeadDim>
Status launch_bwd(const BwdParams& params, cudaStream_t stream);
}  // namespace sm90

// What `ask(device)` says of `device` (the current one if < 0), asked once per device and kept in
// `cache` (each caller's own static array), so that a launch during CUDA-graph capture makes no
// extra CUDA call. `ask` returns a value >= 0, or < 0 when it cannot tell (then it is asked again
// next time); devices 64 and up are asked every time. -1 if the current device is unknown.
template <class Ask>
int once_per_device(std::atomic<int> (&cache)[64], int device, Ask&& ask) {
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) return -1;
  if (device < 0) return -1;
  if (device >= 64) return ask(device);
  if (const int known = cache[device].load(std::memory_order_acquire); known > 0) return known - 1;  // the value + 1
  const int value = ask(device);
  if (value >= 0) cache[device].store(value + 1, std::memory_order_release);
  return value;
}

// Lets kKernel use smem_bytes of dynamic shared memory (needed above 48 KB). A per-device
// function attribute, set once per device (once_per_device).
template <auto kKernel>
Status allow_smem(int smem_bytes) {
  if (smem_bytes <= 48 * 1024) return Status::success();
  static std::atomic<int> set[64] = {};
  int device = 0;
  FLASHCUTE_CUDA_CHECK(cudaGetDevice(&device));
  cudaError_t err = cudaSuccess;
  once_per_device(set, device, [&](int) {
    err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    return err == cudaSuccess ? 1 : -1;
  });
  FLASHCUTE_CUDA_CHECK(err);
  return Status::success();
}

// Attribute kAttr of `device` (the current one if < 0), asked once per device; -1 if it cannot be
// known.
template <cudaDeviceAttr kAttr>
int device_attribute(int device = -1) {
  static std::atomic<int> cached[64] = {};
  return once_per_device(cached, device, [](int d) {
    int value = 0;
    return cudaDeviceGetAttribute(&value, kAttr, d) == cudaSuccess ? value : -1;
  });
}

// The SM count of `device` (the current one if < 0); 0 if it cannot be known.
inline int device_sms(int device = -1) {
  const int sms = device_attribute<cudaDevAttrMultiProcessorCount>(device);
  return sms > 0 ? sms : 0;
}

}  // namespace flashcute
