// flashcute/host/args.hpp: the arguments of an attention call as every binding hands them to
// plan_fwd / plan_bwd (host/validate_fwd.hpp, host/validate_bwd.hpp): arrays as TensorRefs, and the
// options shared by every call (AttnOptions, whose rules are detail::check_options in
// host/checks.hpp).
#pragma once

#include <cstdint>
#include <optional>

#include "flashcute/common/tensor.hpp"

namespace flashcute {

// A variable-length batch, as FlashAttention-2's varlen functions take it: the sequences are
// packed along one row dim, q / out (total_q, nheads, head_dim), k / v (total_k, nheads_k,
// head_dim), and lse (nheads, total_q). The cu_seqlens arrays are device memory and are never
// read on the host (so a call can be captured in a CUDA graph); the kernels clamp their entries
// into the arrays (common/seqlen.hpp). As in FlashAttention-2, max_seqlen_q / max_seqlen_k must
// be at least every sequence's length: they size the grid, and rows past them are not computed.
struct VarlenArgs {
  TensorRef cu_seqlens_q;    // int32 (batch + 1,): sequence b's queries are rows [cu[b], cu[b + 1])
  TensorRef cu_seqlens_k;    // int32 (batch + 1,): its keys, rows of k and v
  int64_t max_seqlen_q = 0;  // the longest sequence's query count
  int64_t max_seqlen_k = 0;  // the longest sequence's key count
};

// A call over a KV cache, as FlashAttention-2's flash_attn_with_kvcache takes it. FwdArgs' k and
// v are then the caches: (batch, seqlen_cache, nheads_k, head_dim), or paged (num_pages,
// page_size, nheads_k, head_dim) with a block_table. They are written in place when k_new and
// v_new are given. cache_seqlens and block_table are device memory, never read on the host, so
// what cannot be checked without reading them is handled on the device (common/seqlen.hpp): a
// length past the capacity is clamped; a key on a page outside [0, num_pages) is never read or
// written, and the query rows that see it get NaN (out and lse). Table entries past a sequence's
// length are never read.
struct KvcacheArgs {
  std::optional<TensorRef> cache_seqlens;  // int32 (batch,): keys in each entry's cache; absent: all
  std::optional<TensorRef> block_table;    // int32 (batch, max_pages_per_seq): a paged cache
  std::optional<TensorRef> k_new;          // (batch, seqlen_new, nheads_k, head_dim), like q
  std::optional<TensorRef> v_new;          // like k_new
  int64_t num_splits = 0;                  // 0: chosen from the shapes and the SM count; 1: none
  std::optional<MutableTensorRef> workspace;  // float32, >= FwdPlan::workspace_floats (split-KV)
  int num_sms = 0;                         // the GPU's SM count for the choice; 0: the current device's
  int device = -1;                         // the GPU it runs on, for the sm90 choice; -1: the current one
};

// The options of an attention call, shared by the forward, the backward and the KV-cache call
// (FwdArgs and BwdArgs are AttnOptions): every binding fills them once and they reach plan_*
// unchanged. detail::check_options holds their rules.
struct AttnOptions {
  std::optional<double> softmax_scale;  // default 1/sqrt(head_dim)
  bool causal = false;                  // bottom-right aligned, as FlashAttention-2
  int64_t window_left = -1;             // -1: unbounded
  int64_t window_right = -1;            // -1: unbounded; causal makes it 0
  double softcap = 0.0;                 // > 0: scores = softcap * tanh(scores / softcap)

  AttnOptions& options() { return *this; }
  const AttnOptions& options() const { return *this; }
  // The options at once, in the order every binding receives them.
  void set_options(std::optional<double> scale, bool is_causal, int64_t left, int64_t right, double cap) {
    softmax_scale = scale;
    causal = is_causal;
    window_left = left;
    window_right = right;
    softcap = cap;
  }
};

// A forward call: out = softmax(q k^T * softmax_scale, masked) v, and optionally its logsumexp.
struct FwdArgs : AttnOptions {
  TensorRef q;  // (batch, seqlen_q, nheads, head_dim), float16 or bfloat16
  TensorRef k;  // (batch, seqlen_k, nheads_k, head_dim), like q; nheads a multiple of nheads_k
  TensorRef v;  // like k
  MutableTensorRef out;                 // like q
  std::optional<MutableTensorRef> lse;  // float32 (batch, nheads, seqlen_q), unit stride in seqlen_q
  // Set: a variable-length batch; q, k, v and out have no batch dim and lse is (nheads, total_q).
  std::optional<VarlenArgs> varlen;
  // Set: a call over a KV cache (k and v are the caches); see KvcacheArgs.
  std::optional<KvcacheArgs> kvcache;
};

}  // namespace flashcute
