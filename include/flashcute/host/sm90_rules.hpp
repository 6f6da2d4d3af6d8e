// flashcute/host/sm90_rules.hpp: which calls the Hopper (sm90a) kernels can take, from the
// checked params alone: TMA's stride rules, and what each kernel family reads. The dispatch runs
// the sm80 kernels wherever these say why not.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "flashcute/common/launch.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/status.hpp"

namespace flashcute {

namespace detail {

// Which of `values` the environment variable `name` holds (unset or empty: the first, index 0),
// or an invalid-argument Status naming the variable and what it may be.
template <std::size_t N>
Status env_choice(const char* name, const char* const (&values)[N], const char* expected, std::size_t& index) {
  index = 0;
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return Status::success();
  for (std::size_t i = 0; i < N; ++i) {
    if (!std::strcmp(env, values[i])) {
      index = i;
      return Status::success();
    }
  }
  return Status::invalid_argument(name, expected, env);
}

}  // namespace detail

// The forward path: FLASHCUTE_FORWARD_PATH=sm80 keeps every forward on the mma.sync kernels;
// unset, "auto" or "sm90", a call the Hopper kernels can take runs on them on a compute
// capability 9.0 device. Read at every launch (getenv: no device call), so tests and benchmarks
// can switch it between calls; a KV-cache call reads it when it is planned (plan_fwd_kvcache).
enum class ForwardPath : uint8_t { kAuto, kSm80 };

inline Status forward_path_setting(ForwardPath& path) {
  static constexpr const char* kValues[] = {"auto", "sm90", "sm80"};  // sm90: the same as auto
  std::size_t index;
  const Status st = detail::env_choice("FLASHCUTE_FORWARD_PATH", kValues, "auto, sm80 or sm90", index);
  path = index == 2 ? ForwardPath::kSm80 : ForwardPath::kAuto;
  return st;
}

// Whether `device` (-1: the current one) has compute capability 9.0, the only GPUs sm_90a code
// runs on (cached per device, as every device_attribute).
inline bool device_is_sm90(int device = -1) {
  return device_attribute<cudaDevAttrComputeCapabilityMajor>(device) == 9 &&
         device_attribute<cudaDevAttrComputeCapabilityMinor>(device) == 0;
}

// Why TMA cannot read q, k and v with these params, or nullptr when it can: a descriptor needs
// every stride a multiple of 16 bytes, below 2^38 elements, and none 0 where its dim has more than
// one entry (the base addresses are 16-byte aligned already). A varlen batch is read as one batch
// of total_q / total_k rows.
inline const char* sm90_tma_can_read(const FwdParams& p) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  const int64_t batches = varlen ? 1 : p.batch;
  // Each array's (row, head, batch) strides, with their extents.
  auto check3 = [&](const char* odd, const char* broadcast, int64_t row, int64_t rows, int64_t head, int64_t heads,
                    int64_t batch) -> const char* {
    for (auto [stride, extent] : {std::pair{row, rows}, std::pair{head, heads}, std::pair{batch, batches}}) {
      if (stride < 0 || stride % 8 != 0) return odd;
      if ((stride == 0 && extent > 1) || stride >= (int64_t{1} << 38)) return broadcast;
    }
    return nullptr;
  };
  if (const char* why = check3("q: a stride that is not a multiple of 16 bytes",
                               "q: a broadcast (0) stride or one of 2^38 elements or more", p.q_row_stride, rows_q,
                               p.q_head_stride, p.nheads, p.q_batch_stride))
    return why;
  if (const char* why = check3("k: a stride that is not a multiple of 16 bytes",
                               "k: a broadcast (0) stride or one of 2^38 elements or more", p.k_row_stride, rows_k,
                               p.k_head_stride, p.nheads_k, p.k_batch_stride))
    return why;
  if (const char* why = check3("v: a stride that is not a multiple of 16 bytes",
                               "v: a broadcast (0) stride or one of 2^38 elements or more", p.v_row_stride, rows_k,
                               p.v_head_stride, p.nheads_k, p.v_batch_stride))
    return why;
  return nullptr;
}

// Why the sm90 (TMA + wgmma) forward cannot take a call with these params, or nullptr when it can:
// TMA must read q, k and v (sm90_tma_can_read); the kernel reads a fixed-length or varlen batch
// (no KV cache) with at least one key, and stores O in 4-byte pairs. Everything else runs on the
// sm80 kernel, which takes any layout plan_fwd accepts.
inline const char* sm90_can_run(const FwdParams& p) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (p.cache_seqlens != nullptr || p.block_table != nullptr || p.seqlen_new > 0) return "a KV-cache call";
  if (p.seqlen_k < 1 || (varlen && p.total_k < 1)) return "no keys";
  if (varlen && p.total_q < 1) return "no queries";
  // The kernel numbers its tiles (128 query rows, one head) in 32 bits.
  if ((int64_t(p.seqlen_q) + 63) / 64 * p.nheads * p.batch > INT_MAX) return "more than 2^31 query tiles";
  if (const char* why = sm90_tma_can_read(p)) return why;
  if (p.o_row_stride % 2 != 0 || p.o_head_stride % 2 != 0 || p.o_batch_stride % 2 != 0)
    return "out: an odd stride (the kernel stores element pairs)";
  return nullptr;
}

// Why the sm90 forward cannot take a KV-cache call with these params (plan_fwd_kvcache's, before
// the split-KV choice), or nullptr when it can: 64 query rows or more (fewer, decode among them,
// run on the split-KV kernels), and what sm90_can_run asks of a fixed-length call whose K and V
// are the caches' pages (a contiguous cache's page being a batch entry), with a page stride
// where there are several pages.
inline const char* sm90_kvcache_can_run(const FwdParams& p) {
  if (p.seqlen_q < 64) return "fewer than 64 query rows";
  if (p.cu_seqlens_q != nullptr) return "a varlen batch";
  FwdParams view = p;
  view.cache_seqlens = nullptr, view.block_table = nullptr, view.seqlen_new = 0;
  if (p.block_table != nullptr) {
    if (p.num_pages > 1 && (p.k_batch_stride == 0 || p.v_batch_stride == 0)) return "k_cache: a broadcast page stride";
    view.seqlen_k = 1 << p.page_size_log2;
  }
  return sm90_can_run(view);
}

// Why the sm90 backward cannot take a call with these params, or nullptr when it can: TMA must
// read q, k, v and dout (sm90_tma_can_read), dq, dk and dv are stored 16 bytes a row at a time, a
// fixed-length or varlen batch (no KV cache) with at least one query and one key, and the grid's y
// (KV heads) and z (batch) dims below 2^16. (plan_bwd already asks 16-byte strides of every array.)
inline const char* sm90_bwd_can_run(const BwdParams& p) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (p.cache_seqlens != nullptr || p.block_table != nullptr || p.seqlen_new > 0) return "a KV-cache call";
  if (p.seqlen_q < 1 || (varlen && p.total_q < 1)) return "no queries";
  if (p.seqlen_k < 1 || (varlen && p.total_k < 1)) return "no keys";
  if (p.nheads_k > 65535 || p.batch > 65535) return "2^16 KV heads or batch entries";
  if (const char* why = sm90_tma_can_read(p)) return why;
  for (int64_t s : {p.do_row_stride, p.do_head_stride, p.do_batch_stride, p.dq_row_stride, p.dq_head_stride,
                    p.dq_batch_stride})
    if (s < 0 || s % 8 != 0 || s >= (int64_t{1} << 38)) return "dout or dq: a stride that is not a multiple of 16 bytes";
  for (int64_t s : {p.dk_row_stride, p.dk_head_stride, p.dk_batch_stride, p.dv_row_stride, p.dv_head_stride,
                    p.dv_batch_stride})
    if (s % 8 != 0) return "dk or dv: a stride that is not a multiple of 16 bytes (the kernel stores 16 bytes)";
  return nullptr;
}

}  // namespace flashcute
