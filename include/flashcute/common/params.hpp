// flashcute/common/params.hpp: the plain parameter block a forward kernel reads.
//
// Everything a launch needs, with strides in elements and 64-bit, so that any strided view (for
// example q, k and v sliced out of one packed qkv tensor) works without a copy. Only the last
// (head-dim) stride is 1. host/validate_fwd.hpp fills it from checked arguments; a kernel may
// assume everything it promises (see plan_fwd).
#pragma once

#include <cstdint>

namespace flashcute {

struct FwdParams {
  // Inputs: q (batch, seqlen_q, nheads, head_dim); k, v (batch, seqlen_k, nheads_k, head_dim).
  // k and v may be null when seqlen_k == 0: no key is ever read.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  // Output: o has q's shape and dtype.
  void* o = nullptr;
  // Optional: float32 (batch, nheads, seqlen_q) natural-log logsumexp; nullptr skips it.
  float* lse = nullptr;

  // Strides, in elements. The head-dim stride is 1 for all four tensors.
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  // lse is (batch, nheads, seqlen_q) with unit row stride.
  int64_t lse_batch_stride = 0, lse_head_stride = 0;

  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int nheads = 0;
  int nheads_k = 0;
  int head_dim = 0;  // the user's head dim: <= the kernel's, a multiple of 8

  float softmax_scale = 0.f;  // usually 1/sqrt(head_dim)
  float softcap = 0.f;        // > 0: scores = softcap * tanh(scores / softcap)

  // The mask, FlashAttention-2 semantics, aligned to the bottom-right corner:
  // query i sees key j iff  i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right.
  // -1 is unbounded on that side. Causal is window_right = 0 (plan_fwd folds it in).
  int window_left = -1;
  int window_right = -1;

  // Variable-length batch (FlashAttention-2's varlen), when cu_seqlens_q is set (then
  // cu_seqlens_k is too). Sequence b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of
  // q and o, which hold total_q rows (their batch stride is unused), and its keys the rows
  // [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v (total_k rows). batch is then the number of
  // sequences and seqlen_q / seqlen_k the largest lengths, which size the grid; lse is
  // (nheads, total_q), its sequence b at offset cu_seqlens_q[b]. The arrays live on the device
  // and are never read on the host: the kernels clamp each entry to [0, total] and each end to
  // >= its start (common/seqlen.hpp), so no value in them makes a kernel touch memory outside
  // the arrays.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  int total_q = 0;
  int total_k = 0;

  // A KV cache (flash_attn_with_kvcache; the splitkv kernels only). seqlen_k is then the cache's
  // capacity per batch entry, and entry b attends to its first
  //   min(cache_seqlens[b] + seqlen_new, seqlen_k)
  // keys (cache_seqlens null: all seqlen_k). cache_seqlens lives on the device and is read only
  // there; a negative entry counts as 0.
  const int* cache_seqlens = nullptr;
  int seqlen_new = 0;  // keys appended at cache_seqlens[b] before attending (the append kernel)
  // Paged: k and v are (num_pages, page_size, nheads_k, head_dim), k/v_batch_stride step between
  // pages, and key j of entry b is row j % page_size of page block_table[b][j / page_size]. A key
  // on an entry outside [0, num_pages) is never read or written, so a kernel never leaves the
  // cache: the query rows that see it get NaN out and lse. Entries past the keys in use are not read.
  const int* block_table = nullptr;
  int64_t block_table_batch_stride = 0;
  int max_pages_per_seq = 0;  // block_table's second dim
  int num_pages = 0;
  int page_size_log2 = 0;     // page_size = 1 << page_size_log2

  // Split-KV: num_splits CTAs share the keys of one query tile, each writing its own normalised
  // partial and lse in float32 to o_accum (num_splits, batch, nheads, seqlen_q, head_dim) and
  // lse_accum (num_splits, batch, nheads, seqlen_q), both contiguous; the combine kernel merges
  // them into o and lse by the lse. num_splits == 1 writes o and lse directly.
  int num_splits = 1;
  float* o_accum = nullptr;
  float* lse_accum = nullptr;
};

// Appends k_new / v_new (batch, seqlen_new, nheads_k, head_dim) to a KV cache at cache_seqlens[b]
// (FwdParams describes the cache), in place. Rows that would land at or past the capacity
// seqlen_k are dropped.
struct AppendKvParams {
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t kn_batch_stride = 0, kn_row_stride = 0, kn_head_stride = 0;
  int64_t vn_batch_stride = 0, vn_row_stride = 0, vn_head_stride = 0;
};

// The backward pass reads the forward's arrays (o and lse are inputs here) and dout, and writes
// dq (like q) and dk, dv (like k and v: GQA groups are summed). dsum is the workspace
// D = rowsum(dout * o): float32 (batch, nheads, seqlen_q), contiguous; host/validate_bwd.hpp
// sizes it (bwd_workspace_floats).
struct BwdParams : FwdParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dsum = nullptr;
  // The same bits on every run. The sm80 kernels always give them; the sm90 ones then order their
  // dQ adds (sm90/mainloop_bwd.hpp, wait_turn).
  bool deterministic = false;
  // k and v are part of the keys that o and lse cover (ring attention): every row's D is
  // rowsum(dout * o), never the exact D over k's keys (common/dsum.hpp), which would miss the rest.
  bool partial_keys = false;

  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
};

}  // namespace flashcute

namespace flashcute {

// merge_attn_states: two partial attentions over disjoint key sets, (out_a, lse_a) and
// (out_b, lse_b), into the attention over their union: out = (e^lse_a out_a + e^lse_b out_b) /
// (e^lse_a + e^lse_b), lse = log(e^lse_a + e^lse_b), computed around max(lse_a, lse_b). The
// arrays are (batch, seqlen, nheads, head_dim) with lse (batch, nheads, seqlen); a varlen
// (total, nheads, head_dim) array is batch 1. host/validate_merge.hpp fills it.
struct MergeParams {
  const void* out_a = nullptr;
  const void* out_b = nullptr;
  void* out = nullptr;
  const float* lse_a = nullptr;
  const float* lse_b = nullptr;
  float* lse = nullptr;

  // Strides in elements: (batch, row, head) of the three outputs (head-dim stride 1), and
  // (batch, head, row) of the three lse arrays.
  int64_t a_stride[3] = {}, b_stride[3] = {}, out_stride[3] = {};
  int64_t lse_a_stride[3] = {}, lse_b_stride[3] = {}, lse_stride[3] = {};

  int batch = 0;
  int seqlen = 0;
  int nheads = 0;
  int head_dim = 0;
};

}  // namespace flashcute
