// flashcute/host/validate_kvcache.hpp: the validation of a forward call over a KV cache.
//
// plan_fwd() hands a call with FwdArgs::kvcache here. Its own arrays (the caches, the page table,
// the cache lengths, the new keys and values, the workspace) are checked here; everything else by
// the fixed-length rules of plan_fwd, on a view of the cache as (batch, capacity, nheads_k,
// head_dim). Then the plan learns what the KV-cache kernels need: the cache lengths, the pages,
// the append, the number of key splits (chosen from the SM count when the call leaves it to us),
// and, for one query row per KV group, the queries of the group packed as the rows of one tile.
// Included by validate_fwd.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <string>

#include "flashcute/common/launch.hpp"
#include "flashcute/host/validate_fwd.hpp"
#include "flashcute/sm80/config.hpp"

namespace flashcute {

// The most key splits a call may ask for (the combine kernel's limit, sm80::kMaxSplits).
inline constexpr int kMaxNumSplits = 128;

// Points a KV-cache plan's split-KV partials into `workspace`: float32, contiguous, at least
// plan.workspace_floats elements, 16-byte aligned. A plan without splits needs none.
inline Status attach_workspace(FwdPlan& plan, const MutableTensorRef& workspace) {
  using namespace detail;
  if (plan.workspace_floats == 0) return Status::success();
  const std::string what = "float32, contiguous, >= " + std::to_string(plan.workspace_floats) + " elements";
  if (workspace.dtype != DType::kFloat32)
    return Status::invalid_type("workspace", what, std::string("dtype ") + workspace.dtype_str());
  if (workspace.numel() < plan.workspace_floats || self_overlapping(workspace))
    return Status::invalid_argument("workspace", what, "shape " + shape_str(workspace));
  for (int i = 0; i + 1 < workspace.rank; ++i) {
    if (workspace.shape[i] > 1 && workspace.stride[i] != workspace.stride[i + 1] * workspace.shape[i + 1])
      return Status::invalid_argument("workspace", what, "strides " + strides_str(workspace));
  }
  if (workspace.rank > 0 && workspace.shape[workspace.rank - 1] > 1 && workspace.stride[workspace.rank - 1] != 1)
    return Status::invalid_argument("workspace", what, "strides " + strides_str(workspace));
  FLASHCUTE_RETURN_IF_ERROR(check_data("workspace", workspace, 16));
  FwdParams& p = plan.params;
  float* base = static_cast<float*>(workspace.mutable_data());
  const int64_t o_floats = int64_t(p.num_splits) * p.batch * p.nheads * p.seqlen_q * p.head_dim;
  p.o_accum = base;
  p.lse_accum = base + o_floats;  // o_floats is a multiple of 8 (head_dim is): still 16-byte aligned
  return Status::success();
}

namespace detail {

using ::flashcute::device_sms;  // common/launch.hpp

// How many ways to split the keys of each (query tile, head, batch entry): the fewest that keep
// every SM streaming keys. The model: `ctas` CTAs of n_blocks key blocks on `slots` SMs; s splits
// take ceil(ctas * s / slots) waves of ceil(n_blocks / s) blocks, plus about a block's worth of
// fixed cost per split (prologue, partial store, combine). The smallest s with the least modelled
// time wins. One CTA per SM, not the two that fit: measured on the H100, one CTA per SM already
// streams at copy speed, and every split beyond that cost 2-8% (docs/perf-notes.md, decode).
constexpr int choose_num_splits(int64_t ctas, int64_t n_blocks, int64_t slots) {
  if (ctas <= 0 || n_blocks <= 1 || slots <= 0) return 1;
  const int64_t max_splits = n_blocks < kMaxNumSplits ? n_blocks : kMaxNumSplits;
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t waves = (ctas * s + slots - 1) / slots;
    const int64_t cost = waves * ((n_blocks + s - 1) / s + (s > 1 ? 1 : 0));
    if (cost < best_cost) best_cost = cost, best = int(s);
  }
  return best;
}

// The key splits a call asks for: 0 (chosen) or 1 to kMaxNumSplits.
inline Status check_num_splits(int64_t num_splits) {
  if (num_splits >= 0 && num_splits <= kMaxNumSplits) return Status::success();
  return Status::invalid_argument("num_splits", "0 (automatic) to " + std::to_string(kMaxNumSplits),
                                  std::to_string(num_splits));
}

inline Status check_int32_array(const char* name, const TensorRef& t, int rank, const int64_t* shape,
                                const char* dims) {
  const std::string what = std::string("int32 ") + dims + " = " + tuple_str(shape, rank) + ", contiguous";
  if (t.dtype != DType::kInt32) return Status::invalid_type(name, what, std::string("dtype ") + t.dtype_str());
  bool same = t.rank == rank;
  for (int i = 0; same && i < rank; ++i) same = t.shape[i] == shape[i];
  if (!same)
    return Status::invalid_argument(name, what, "shape " + shape_str(t),
                                    std::string(name) + ": expected " + what + ", got shape " + shape_str(t));
  if (t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1)
    return Status::invalid_argument(name, what, "strides " + strides_str(t),
                                    std::string(name) + ": the last dim must be contiguous (stride 1), got strides " +
                                        strides_str(t));
  if (rank == 2 && kstride(t, 0) < 0)
    return Status::invalid_argument(name, "non-negative strides", "strides " + strides_str(t));
  return check_data(name, t, 4);
}

// A Status from the fixed-length rules, with the caches named as the caller named them.
inline Status as_cache_error(Status st) {
  for (auto [from, to] : {std::pair<const char*, const char*>{"k", "k_cache"}, {"v", "v_cache"}}) {
    if (st.arg != from) continue;
    st.arg = to;
    if (st.message.rfind(std::string(from) + ":", 0) == 0) st.message = std::string(to) + st.message.substr(1);
  }
  return st;
}

inline Status plan_fwd_kvcache(const FwdArgs& a, FwdPlan& plan) {
  const KvcacheArgs& kv = *a.kvcache;
  const TensorRef &q = a.q, &k = a.k, &v = a.v;
  FLASHCUTE_RETURN_IF_ERROR(check_rank("q", q, 4, "(batch, seqlen_q, nheads, headdim)"));
  FLASHCUTE_RETURN_IF_ERROR(check_rank("k_cache", k, 4, "(batch, seqlen_cache, nheads_k, headdim) or paged (num_blocks, page_size, nheads_k, headdim)"));
  FLASHCUTE_RETURN_IF_ERROR(check_rank("v_cache", v, 4, "like k_cache"));
  for (int i = 0; i < 4; ++i) {
    if (v.shape[i] != k.shape[i])
      return Status::invalid_argument("v_cache", "shape " + shape_str(k) + " like k_cache", shape_str(v));
  }
  const int64_t batch = q.shape[0];

  // The cache as the fixed-length rules see it: (batch, capacity, nheads_k, headdim).
  FwdArgs fixed = a;
  fixed.kvcache.reset();
  int64_t capacity = k.shape[1];
  int page_log2 = 0;
  if (kv.block_table) {
    const TensorRef& bt = *kv.block_table;
    const int64_t want[2] = {batch, bt.rank == 2 ? bt.shape[1] : 1};
    FLASHCUTE_RETURN_IF_ERROR(check_int32_array("block_table", bt, 2, want, "(batch, max_num_blocks_per_seq)"));
    const int64_t page_size = k.shape[1];
    while (page_log2 < 30 && (int64_t{1} << page_log2) < page_size) ++page_log2;
    if (page_size < 16 || (int64_t{1} << page_log2) != page_size)
      return Status::invalid_argument(
          "k_cache", "a page size (dim 1 of a paged cache) that is a power of two >= 16", std::to_string(page_size),
          "k_cache: page size " + std::to_string(page_size) +
              " is not supported: the paged kernels take a power of two >= 16 (16, 32, 64, 128, 256, ...)");
    if (bt.shape[1] < 1 && batch > 0)
      return Status::invalid_argument("block_table", "at least one block per sequence", shape_str(bt));
    if (k.shape[0] < 1)
      return Status::invalid_argument("k_cache", "at least one block", shape_str(k));
    capacity = bt.shape[1] * page_size;
    FLASHCUTE_RETURN_IF_ERROR(check_int32("block_table", "cache capacity", capacity));
    FLASHCUTE_RETURN_IF_ERROR(check_int32("k_cache", "num_blocks", k.shape[0]));
    // The caches as the fixed-length rules see them, (batch, capacity, ...) with batch stride 0:
    // each row finds its page. Their own strides (the page stride too) are checked first.
    for (TensorRef* view : {&fixed.k, &fixed.v}) {
      FLASHCUTE_RETURN_IF_ERROR(as_cache_error(check_strides_4d(view == &fixed.k ? "k" : "v", *view)));
      view->shape[0] = batch;
      view->shape[1] = capacity;
      view->stride[0] = 0;
    }
  }
  FLASHCUTE_RETURN_IF_ERROR(as_cache_error(plan_fwd(fixed, plan)));
  plan.sm90 = false;  // (the fixed-length rules' verdict: the KV-cache call chooses below)
  FwdParams& p = plan.params;
  const int64_t nheads_k = k.shape[2];

  if (kv.cache_seqlens) {
    const int64_t want[1] = {batch};
    FLASHCUTE_RETURN_IF_ERROR(check_int32_array("cache_seqlens", *kv.cache_seqlens, 1, want, "(batch,)"));
    p.cache_seqlens = static_cast<const int*>(kv.cache_seqlens->data);
  }
  if (kv.k_new.has_value() != kv.v_new.has_value())
    return Status::invalid_argument(kv.k_new ? "v" : "k", "given together with " + std::string(kv.k_new ? "k" : "v"),
                                    "None",
                                    std::string(kv.k_new ? "v" : "k") +
                                        ": k and v (the new keys and values) must be given together, got None");
  if (kv.k_new) {
    if (!kv.cache_seqlens)
      return Status::invalid_argument("cache_seqlens", "an int32 (batch,) array when k and v are appended", "None",
                                      "cache_seqlens: required when k and v are given (it says where to append them)");
    const TensorRef &kn = *kv.k_new, &vn = *kv.v_new;
    for (auto [name, t] : {std::pair<const char*, const TensorRef*>{"k", &kn}, {"v", &vn}}) {
      FLASHCUTE_RETURN_IF_ERROR(check_rank(name, *t, 4, "(batch, seqlen_new, nheads_k, headdim)"));
      if (t->dtype != q.dtype)
        return Status::invalid_type(name, std::string(dtype_name(q.dtype)) + " like q", t->dtype_str());
      const int64_t want[4] = {batch, kn.shape[1], nheads_k, q.shape[3]};
      for (int i = 0; i < 4; ++i) {
        if (t->shape[i] != want[i])
          return Status::invalid_argument(name, "shape (batch, seqlen_new, nheads_k, headdim) = " + tuple_str(want, 4),
                                          shape_str(*t));
      }
      FLASHCUTE_RETURN_IF_ERROR(check_strides_4d(name, *t));
      FLASHCUTE_RETURN_IF_ERROR(check_data(name, *t, 16));
    }
    if (kn.shape[1] > capacity)
      return Status::invalid_argument("k", "seqlen_new <= the cache's capacity " + std::to_string(capacity),
                                      std::to_string(kn.shape[1]),
                                      "k: " + std::to_string(kn.shape[1]) + " new keys overflow a cache of " +
                                          std::to_string(capacity) + " per sequence");
    p.seqlen_new = int(kn.shape[1]);
    plan.append = p.seqlen_new > 0 && batch > 0;
    AppendKvParams& ap = plan.append_params;
    ap.k_new = kn.data, ap.v_new = vn.data;
    ap.kn_batch_stride = kstride(kn, 0), ap.kn_row_stride = kstride(kn, 1), ap.kn_head_stride = kstride(kn, 2);
    ap.vn_batch_stride = kstride(vn, 0), ap.vn_row_stride = kstride(vn, 1), ap.vn_head_stride = kstride(vn, 2);
  }
  if (kv.block_table) {
    const TensorRef& bt = *kv.block_table;
    p.block_table = static_cast<const int*>(bt.data);
    p.block_table_batch_stride = kstride(bt, 0);
    p.max_pages_per_seq = int(bt.shape[1]);
    p.num_pages = int(k.shape[0]);
    p.page_size_log2 = page_log2;
    p.k_batch_stride = kstride(k, 0);  // between pages
    p.v_batch_stride = kstride(v, 0);
  }

  // One query row per KV group and no window: the group's query heads become the rows of one
  // tile (FlashAttention-2's swap), so each K/V byte is read once per group instead of once per
  // query head. Only strides change: row g of KV head h is query head h * groups + g.
  const int groups = p.nheads / p.nheads_k;
  const bool lse_packable = a.lse == std::nullopt || p.lse_head_stride == 1 || p.nheads == 1;
  if (p.seqlen_q == 1 && groups > 1 && p.window_left < 0 && p.window_right < 0 && lse_packable) {
    p.seqlen_q = groups;
    p.nheads = p.nheads_k;
    p.q_row_stride = p.q_head_stride, p.q_head_stride *= groups;
    p.o_row_stride = p.o_head_stride, p.o_head_stride *= groups;
    p.lse_head_stride = groups;  // (batch, nheads, 1) with unit head stride: rows of a group are adjacent
  }

  // The Hopper kernels take 64 query rows and more on a compute capability 9.0 device, unless
  // FLASHCUTE_FORWARD_PATH=sm80: one pass over the keys, no split, no workspace (num_splits is a
  // hint of the split-KV kernels only).
  FLASHCUTE_RETURN_IF_ERROR(check_num_splits(kv.num_splits));
  const int sm90_hd = kernel_head_dim(p.head_dim, q.dtype, Direction::kFwd, Arch::kSm90);
  if (kvcache_compiled() && sm90_hd > 0 && sm90_kvcache_can_run(p) == nullptr) {
    ForwardPath path;
    FLASHCUTE_RETURN_IF_ERROR(forward_path_setting(path));
    if (path == ForwardPath::kAuto && device_is_sm90(kv.device)) {
      plan.kernel = KernelKey{Arch::kSm90, Direction::kFwd, q.dtype, sm90_hd, Variant::kPlain};
      p.num_splits = 1;
      plan.workspace_floats = 0;
      return Status::success();
    }
  }

  // Split-KV.
  plan.kernel.variant = Variant::kSplitkv;
  const int kernel_hd = kernel_head_dim(p.head_dim, q.dtype, Direction::kFwd, Arch::kSm80, Variant::kSplitkv);
  if (kernel_hd == 0)
    return Status::invalid(StatusCode::kNotCompiled, "k_cache", "KV-cache kernels in this build", "none",
                           "flashcute was built without KV-cache kernels for this dtype and head dim (build option "
                           "FLASHCUTE_KVCACHE, or FLASHCUTE_HEAD_DIMS / FLASHCUTE_DTYPES)");
  plan.kernel.head_dim = kernel_hd;
  const sm80::FwdConfig cfg = sm80::default_splitkv_config(kernel_hd);
  const int64_t n_blocks = (capacity + cfg.block_n - 1) / cfg.block_n;
  const int64_t ctas = int64_t(p.batch) * p.nheads * ((p.seqlen_q + cfg.block_m - 1) / cfg.block_m);
  int num_splits = int(kv.num_splits);
  if (num_splits == 0) {
    const int sms = kv.num_sms > 0 ? kv.num_sms : device_sms();
    num_splits = choose_num_splits(ctas, n_blocks, sms > 0 ? sms : 1);
  }
  if (int64_t(num_splits) * ((p.seqlen_q + cfg.block_m - 1) / cfg.block_m) > INT_MAX)
    return Status::invalid_argument("num_splits", "fewer splits for this seqlen_q", std::to_string(num_splits));
  p.num_splits = num_splits;
  plan.workspace_floats =
      num_splits > 1 ? int64_t(num_splits) * p.batch * p.nheads * p.seqlen_q * (int64_t(p.head_dim) + 1) : 0;
  if (plan.workspace_floats > 0 && kv.workspace) FLASHCUTE_RETURN_IF_ERROR(attach_workspace(plan, *kv.workspace));
  return Status::success();
}

}  // namespace detail

}  // namespace flashcute
