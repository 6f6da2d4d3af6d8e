// src/ops.hpp: flashcute._C's four operations (forward, backward, KV-cache forward, merge), each
// written once: which arrays it takes, under which names, into which Args field.
//
// An operation reads its arrays through an array source `S`, one per way arrays arrive:
//   DlpackArrays (ext_common.hpp)  DLPack arrays that nanobind imports (CuPy, any producer)
//   Descriptors  (ext_common.hpp)  (data_ptr, shape, strides, dtype) tuples: the torch fast path
//   XlaBuffers   (xla_ffi.cpp)     the buffers of an XLA FFI call (JAX)
// A source has two handle types, S::In (read) and S::Out (written), and
//   bool given(h)              whether an optional array was passed (None, nullptr: not)
//   TensorRef in(name, h)      the array as the core reads it (src/array_ref.hpp builds it)
//   MutableTensorRef out(name, h)
// The bindings add only what is theirs: the options as their call passes them, the device
// checks, the stream and how a failed Status is reported. Needs neither nanobind nor XLA.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "flashcute/host/api.hpp"

namespace flashcute_ext {

// A variable-length call's cu_seqlens pair (both absent: a fixed-length call).
template <class S>
flashcute::Status varlen_args(S& s, std::optional<flashcute::VarlenArgs>& varlen, typename S::In cu_q,
                              typename S::In cu_k, int64_t max_q, int64_t max_k) {
  if (s.given(cu_q) != s.given(cu_k)) {
    const char* missing = s.given(cu_q) ? "cu_seqlens_k" : "cu_seqlens_q";
    const char* only = s.given(cu_q) ? "cu_seqlens_q" : "cu_seqlens_k";
    return flashcute::Status::invalid_argument(
        missing, "both cu_seqlens_q and cu_seqlens_k", std::string("only ") + only,
        std::string(missing) + ": a variable-length call takes both cu_seqlens_q and cu_seqlens_k (int32 (batch + 1,) "
                               "arrays), got only " + only);
  }
  if (s.given(cu_q)) varlen = flashcute::VarlenArgs{s.in("cu_seqlens_q", cu_q), s.in("cu_seqlens_k", cu_k), max_q, max_k};
  return flashcute::Status::success();
}

// The forward: out (and lse, when given) from q, k, v.
template <class S>
flashcute::Status fwd_args(S& s, flashcute::FwdArgs& a, const flashcute::AttnOptions& options, typename S::In q,
                           typename S::In k, typename S::In v, typename S::Out out, typename S::Out lse,
                           typename S::In cu_q, typename S::In cu_k, int64_t max_q, int64_t max_k) {
  a.options() = options;
  a.q = s.in("q", q);
  a.k = s.in("k", k);
  a.v = s.in("v", v);
  a.out = s.out("out", out);
  if (s.given(lse)) a.lse = s.out("lse", lse);
  return varlen_args(s, a.varlen, cu_q, cu_k, max_q, max_k);
}

// The backward: dq, dk, dv (and D in the workspace) from dout and the forward's arrays.
template <class S>
flashcute::Status bwd_args(S& s, flashcute::BwdArgs& a, const flashcute::AttnOptions& options, bool deterministic,
                           typename S::In dout, typename S::In q, typename S::In k, typename S::In v,
                           typename S::In out, typename S::In lse, typename S::Out dq, typename S::Out dk,
                           typename S::Out dv, typename S::Out workspace, typename S::In cu_q, typename S::In cu_k,
                           int64_t max_q, int64_t max_k) {
  a.options() = options;
  a.deterministic = deterministic;
  a.dout = s.in("dout", dout);
  a.q = s.in("q", q);
  a.k = s.in("k", k);
  a.v = s.in("v", v);
  a.out = s.in("out", out);
  a.lse = s.in("lse", lse);
  a.dq = s.out("dq", dq);
  a.dk = s.out("dk", dk);
  a.dv = s.out("dv", dv);
  a.workspace = s.out("workspace", workspace);
  return varlen_args(s, a.varlen, cu_q, cu_k, max_q, max_k);
}

// The forward over a KV cache: k_cache and v_cache (written when k and v are appended).
template <class S>
flashcute::Status kvcache_args(S& s, flashcute::FwdArgs& a, const flashcute::AttnOptions& options, int64_t num_splits,
                               typename S::In q, typename S::In k_cache, typename S::In v_cache, typename S::Out out,
                               typename S::Out lse, typename S::In k, typename S::In v, typename S::In cache_seqlens,
                               typename S::In block_table) {
  a.options() = options;
  a.q = s.in("q", q);
  a.k = s.in("k_cache", k_cache);
  a.v = s.in("v_cache", v_cache);
  a.out = s.out("out", out);
  if (s.given(lse)) a.lse = s.out("lse", lse);
  flashcute::KvcacheArgs& kv = a.kvcache.emplace();
  if (s.given(k)) kv.k_new = s.in("k", k);
  if (s.given(v)) kv.v_new = s.in("v", v);
  if (s.given(cache_seqlens)) kv.cache_seqlens = s.in("cache_seqlens", cache_seqlens);
  if (s.given(block_table)) kv.block_table = s.in("block_table", block_table);
  kv.num_splits = num_splits;
  return flashcute::Status::success();
}

// merge_attn_states: out and lse from the two partial attentions.
template <class S>
flashcute::Status merge_args(S& s, flashcute::MergeArgs& a, typename S::In out_a, typename S::In lse_a,
                             typename S::In out_b, typename S::In lse_b, typename S::Out out, typename S::Out lse) {
  a.out_a = s.in("out_a", out_a);
  a.lse_a = s.in("lse_a", lse_a);
  a.out_b = s.in("out_b", out_b);
  a.lse_b = s.in("lse_b", lse_b);
  a.out = s.out("out", out);
  a.lse = s.out("lse", lse);
  return flashcute::Status::success();
}

}  // namespace flashcute_ext
