// flashcute/sm80/launch_splitkv.hpp: host-side launch of one sm80 KV-cache (split-KV) kernel.
//
// Defines sm80::launch_splitkv<dtype, head dim> and its decode twins launch_splitkv_decode
// (contiguous caches) and launch_splitkv_decode_paged, which common/launch.hpp declares; a
// generated translation unit instantiates one (see launch_fwd.hpp).
// The forward's variant Variant::kSplitkv: the same kernel as the forward, built from the KV-cache
// tile table (default_splitkv_config; decode_splitkv_config for calls of at most kDecodeRows query
// rows, which host/dispatch.hpp sends to the twin). The append before it and the combine after it
// are dtype-generic kernels of their own (sm80/kernel_kvcache.hpp); host/dispatch.hpp sequences
// the three.
#pragma once

#include <string>

#include "flashcute/sm80/launch_fwd.hpp"

namespace flashcute::sm80 {

// Preconditions: launch_fwd's, and 1 <= num_splits <= kMaxSplits with o_accum / lse_accum sized
// for them when num_splits > 1 (host::plan_fwd of a KV-cache call).
template <DType kDType, int kHeadDim>
Status launch_splitkv(const FwdParams& params, cudaStream_t stream) {
  static_assert(validate(default_splitkv_config(kHeadDim)) == nullptr, "no valid sm80 KV-cache config for this head dim");
  return launch_fwd_with<FwdTraits<kDType, default_splitkv_config(kHeadDim)>>(params, stream);
}

// The decode twins: the same preconditions, params.seqlen_q <= kDecodeRows (they compute the
// first 16 rows of their one Q tile only), and a contiguous cache (no params.block_table) or a
// paged one.
template <DType kDType, int kHeadDim, bool kPaged>
Status launch_splitkv_decode_for(const FwdParams& params, cudaStream_t stream) {
  constexpr FwdConfig kCfg = decode_splitkv_config(kHeadDim, kPaged);
  static_assert(validate(kCfg) == nullptr, "no valid sm80 decode config for this head dim");
  if (params.seqlen_q > kDecodeRows)
    return Status::invalid_argument("q", "at most " + std::to_string(kDecodeRows) + " query rows for the decode kernel",
                                    std::to_string(params.seqlen_q));
  if ((params.block_table != nullptr) != kPaged)
    return Status::invalid_argument("block_table", kPaged ? "a block table for the paged decode kernel"
                                                          : "none for the contiguous decode kernel",
                                    params.block_table ? "a block table" : "none");
  return launch_fwd_with<FwdTraits<kDType, kCfg>>(params, stream);
}

template <DType kDType, int kHeadDim>
Status launch_splitkv_decode(const FwdParams& params, cudaStream_t stream) {
  return launch_splitkv_decode_for<kDType, kHeadDim, false>(params, stream);
}

template <DType kDType, int kHeadDim>
Status launch_splitkv_decode_paged(const FwdParams& params, cudaStream_t stream) {
  return launch_splitkv_decode_for<kDType, kHeadDim, true>(params, stream);
}

}  // namespace flashcute::sm80
