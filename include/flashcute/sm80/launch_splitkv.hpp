// flashcute/sm80/launch_splitkv.hpp: host-side launch of one sm80 KV-cache (split-KV) kernel.
//
// Defines sm80::launch_splitkv<dtype, head dim>, which common/launch.hpp declares; a generated
// translation unit instantiates one (see launch_fwd.hpp). The forward's variant Variant::kSplitkv:
// the same kernel as the forward, built from the KV-cache tile table (default_splitkv_config). The append before it and the combine
// after it are dtype-generic kernels of their own (sm80/kernel_kvcache.hpp); host/dispatch.hpp
// sequences the three.
#pragma once

#include "flashcute/sm80/launch_fwd.hpp"

namespace flashcute::sm80 {

// Preconditions: launch_fwd's, and 1 <= num_splits <= kMaxSplits with o_accum / lse_accum sized
// for them when num_splits > 1 (host::plan_fwd of a KV-cache call).
template <DType kDType, int kHeadDim>
Status launch_splitkv(const FwdParams& params, cudaStream_t stream) {
  static_assert(validate(default_splitkv_config(kHeadDim)) == nullptr, "no valid sm80 KV-cache config for this head dim");
  return launch_fwd_with<FwdTraits<kDType, default_splitkv_config(kHeadDim)>>(params, stream);
}

}  // namespace flashcute::sm80
