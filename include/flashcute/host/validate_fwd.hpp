// flashcute/host/validate_fwd.hpp: the one validation of a forward call.
//
// plan_fwd() checks a call described by FwdArgs (arrays as TensorRefs, plus the options) and, if
// it is valid, turns it into the FwdParams a kernel reads and the KernelKey that runs it. It is
// the only place that knows the rules: the nanobind module, the XLA FFI handler and C++ callers
// all call it, and add only what is theirs to check (rank and dtype mapping of their own array
// type, the device an array lives on, the stream). Errors come back as a structured Status whose
// messages start with the argument's name. Needs only the CUDA runtime headers.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "flashcute/common/params.hpp"
#include "flashcute/common/status.hpp"
#include "flashcute/common/tensor.hpp"
#include "flashcute/common/types.hpp"
#include "flashcute/host/kernels.hpp"

// Returns the Status of `expr` from the enclosing function when it is an error.
#define FLASHCUTE_RETURN_IF_ERROR(expr)            \
  do {                                             \
    ::flashcute::Status flashcute_st_ = (expr);    \
    if (!flashcute_st_.ok()) return flashcute_st_; \
  } while (0)

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
// v_new are given. cache_seqlens and block_table are device memory, never read on the host: the
// kernels clamp what they hold into the cache (common/seqlen.hpp), and what cannot be checked
// without reading them (an entry past the capacity, a page number out of range) is clamped, not
// reported.
struct KvcacheArgs {
  std::optional<TensorRef> cache_seqlens;  // int32 (batch,): keys in each entry's cache; absent: all
  std::optional<TensorRef> block_table;    // int32 (batch, max_pages_per_seq): a paged cache
  std::optional<TensorRef> k_new;          // (batch, seqlen_new, nheads_k, head_dim), like q
  std::optional<TensorRef> v_new;          // like k_new
  int64_t num_splits = 0;                  // 0: chosen from the shapes and the SM count; 1: none
  std::optional<MutableTensorRef> workspace;  // float32, >= FwdPlan::workspace_floats (split-KV)
  int num_sms = 0;                         // the GPU's SM count for the choice; 0: the current device's
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

// What plan_fwd() makes of a valid call.
struct FwdPlan {
  KernelKey kernel{};  // the kernel that runs it
  FwdParams params{};
  bool empty = true;  // batch or seqlen_q is 0: nothing to launch
  // A KV-cache call: the append that runs before the attention, and the float32 workspace its
  // split-KV partials need (0: none); params.o_accum / lse_accum point into it.
  bool append = false;
  AppendKvParams append_params{};
  int64_t workspace_floats = 0;
  // This build has a Hopper (sm90) kernel for the call and TMA can read its arrays
  // (sm90_can_run): launch() runs that kernel instead on a compute capability 9.0 device.
  bool sm90 = false;
};

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
// TMA must read q, k and v (sm90_tma_can_read); the kernel reads a fixed-length batch (no varlen,
// no KV cache) with at least one key, and stores O in 4-byte pairs. Everything else runs on the
// sm80 kernel, which takes any layout plan_fwd accepts.
inline const char* sm90_can_run(const FwdParams& p) {
  if (p.cu_seqlens_q != nullptr) return "a variable-length batch";
  if (p.cache_seqlens != nullptr || p.block_table != nullptr || p.seqlen_new > 0) return "a KV-cache call";
  if (p.seqlen_k < 1) return "no keys";
  // The kernel numbers its tiles (128 query rows, one head) in 32 bits.
  if ((int64_t(p.seqlen_q) + 63) / 64 * p.nheads * p.batch > INT_MAX) return "more than 2^31 query tiles";
  if (const char* why = sm90_tma_can_read(p)) return why;
  if (p.o_row_stride % 2 != 0 || p.o_head_stride % 2 != 0 || p.o_batch_stride % 2 != 0)
    return "out: an odd stride (the kernel stores element pairs)";
  return nullptr;
}

namespace detail {

inline std::string tuple_str(const int64_t* v, int n) {
  std::string s = "(";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (n == 1 ? ",)" : ")");
}
inline std::string shape_str(const TensorRef& t) { return tuple_str(t.shape, t.rank); }
inline std::string strides_str(const TensorRef& t) { return tuple_str(t.stride, t.rank); }

inline std::string hex_ptr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

// The stride a kernel uses for dim i: the array's own, except for a dim of extent <= 1, whose
// stride never multiplies a non-zero index (some producers report arbitrary values there).
inline int64_t kstride(const TensorRef& t, int i) { return t.shape[i] <= 1 ? 0 : t.stride[i]; }

// True if two distinct index tuples of `t` can address the same element. Sufficient test for
// "no overlap": with the dims of extent > 1 sorted by stride, each stride must exceed the largest
// offset the smaller ones reach. Rejects only layouts that overlap or are exotically interleaved.
inline bool self_overlapping(const TensorRef& t) {
  if (t.numel() == 0) return false;
  int64_t stride[TensorRef::kMaxRank], extent[TensorRef::kMaxRank];
  int n = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] <= 1) continue;
    int j = n++;  // insertion sort by stride
    for (; j > 0 && stride[j - 1] > t.stride[i]; --j) stride[j] = stride[j - 1], extent[j] = extent[j - 1];
    stride[j] = t.stride[i];
    extent[j] = t.shape[i];
  }
  int64_t reach = 0;
  for (int i = 0; i < n; ++i) {
    if (stride[i] <= reach) return true;
    reach += stride[i] * (extent[i] - 1);
  }
  return false;
}

inline Status check_rank(const char* name, const TensorRef& t, int rank, const char* dims) {
  if (t.rank == rank) return Status::success();
  return Status::invalid_argument(name, std::to_string(rank) + " dims " + dims, std::to_string(t.rank));
}

// Head-dim contiguity, non-negative strides, and batch/row/head strides in whole 16-byte vectors
// (multiples of 8 halves): the kernels move Q/K/V/O with 16-byte cp.async and vector stores.
inline Status check_strides_4d(const char* name, const TensorRef& t) {
  if (t.numel() == 0) return Status::success();  // no element is addressed: strides are arbitrary
  if (t.shape[3] > 1 && t.stride[3] != 1)
    return Status::invalid_argument(name, "the last dim contiguous (stride 1)", "stride " + std::to_string(t.stride[3]),
                                    std::string(name) + ": the last dim must be contiguous (stride 1), got stride " +
                                        std::to_string(t.stride[3]) + " (strides " + strides_str(t) + ")");
  for (int i = 0; i < 3; ++i) {
    if (kstride(t, i) < 0)
      return Status::invalid_argument(name, "non-negative strides", "strides " + strides_str(t),
                                      std::string(name) + ": negative strides are not supported, got strides " +
                                          strides_str(t));
  }
  static const char* kNames[3] = {"batch", "row (seqlen)", "head"};
  for (int i = 0; i < 3; ++i) {
    if (kstride(t, i) % 8 != 0)
      return Status::invalid_argument(
          name, std::string("the ") + kNames[i] + " stride a multiple of 8 elements", std::to_string(t.stride[i]),
          std::string(name) + ": the " + kNames[i] + " stride must be a multiple of 8 elements (16 bytes), got " +
              std::to_string(t.stride[i]) + " (strides " + strides_str(t) + ")");
  }
  return Status::success();
}

inline Status check_no_overlap(const char* name, const TensorRef& t) {
  if (!self_overlapping(t)) return Status::success();
  return Status::invalid_argument(name, "strides that address each element once", "strides " + strides_str(t),
                                  std::string(name) + ": its strides " + strides_str(t) +
                                      " make distinct elements overlap; " + name + " must not alias itself");
}

inline Status check_data(const char* name, const TensorRef& t, unsigned alignment) {
  if (t.numel() == 0) return Status::success();  // never dereferenced
  if (t.data == nullptr)
    return Status::invalid_argument(name, "a data pointer", "null", std::string(name) + ": the data pointer is null");
  const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
  if (addr % alignment == 0) return Status::success();
  const std::string n = std::to_string(alignment);
  return Status::invalid_argument(name, "a " + n + "-byte aligned data pointer", hex_ptr(t.data),
                                  std::string(name) + ": the data pointer must be " + n +
                                      "-byte aligned (the kernel uses " + n + "-byte vector accesses), got " +
                                      hex_ptr(t.data) + " (" + std::to_string(addr % alignment) +
                                      " bytes past a boundary)");
}

inline Status check_int32(const char* arg, const char* what, int64_t v) {
  if (v <= INT_MAX) return Status::success();
  return Status::invalid_argument(arg, std::string(what) + " <= " + std::to_string(INT_MAX), std::to_string(v),
                                  std::string(what) + " " + std::to_string(v) + " exceeds the supported maximum " +
                                      std::to_string(INT_MAX));
}

// The launch grid is (query blocks, heads, batch): y and z take at most 65535.
inline Status check_grid(const char* what, int64_t v) {
  constexpr int64_t kMaxGridYZ = 65535;
  if (v <= kMaxGridYZ) return Status::success();
  return Status::invalid_argument("q", std::string(what) + " <= 65535", std::to_string(v),
                                  std::string("q: ") + what + " " + std::to_string(v) +
                                      " exceeds 65535, the most one launch grid takes");
}

inline std::string join_head_dims(const int* dims, int n, const char* sep) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? sep : "") + std::to_string(dims[i]);
  return s.empty() ? "none" : s;
}

inline Status dtype_not_compiled(DType dtype) {
  std::string have;
  for (DType d : {DType::kFloat16, DType::kBFloat16})
    if (dtype_compiled(d)) have += (have.empty() ? "" : ", ") + std::string(dtype_name(d));
  Status st = Status::invalid(
      StatusCode::kNotCompiled, "q", std::string(dtype_name(dtype)) + " kernels in this build",
      "a build without them",
      std::string("flashcute was built without ") + dtype_name(dtype) +
          " kernels: the build option FLASHCUTE_DTYPES left " + dtype_option(dtype) + " out (this build has: " +
          (have.empty() ? "none" : have) + "); rebuild with e.g. pip install . -C cmake.define.FLASHCUTE_DTYPES=fp16,bf16");
  return st;
}

inline Status head_dim_not_compiled(int64_t head_dim, DType dtype) {
  const int needed = catalog_head_dim(int(head_dim));
  int larger[16], compiled[16];
  int n_larger = 0, n_compiled = 0;
  for (int hd : kKernelHeadDims) {
    if (hd >= needed && n_larger < 16) larger[n_larger++] = hd;
    if (kernel_head_dim(hd, dtype) == hd && n_compiled < 16) compiled[n_compiled++] = hd;
  }
  int wanted[17];
  int n_wanted = 0;
  for (int hd : kKernelHeadDims)  // the compiled ones plus the one needed, ascending
    if (hd == needed || kernel_head_dim(hd, dtype) == hd) wanted[n_wanted++] = hd;
  return Status::invalid(
      StatusCode::kNotCompiled, "q", "a kernel head dim >= " + std::to_string(head_dim) + " in this build",
      "kernel head dims " + join_head_dims(compiled, n_compiled, ", "),
      "flashcute has no kernel for head dim " + std::to_string(head_dim) + " (" + dtype_name(dtype) +
          ") in this build: it runs on kernel head dim " + std::to_string(needed) + " (or a larger one: " +
          join_head_dims(larger, n_larger, ", ") +
          "), which the build option FLASHCUTE_HEAD_DIMS left out (this build has kernel head dims: " +
          join_head_dims(compiled, n_compiled, ", ") +
          "); rebuild with e.g. pip install . -C cmake.define.FLASHCUTE_HEAD_DIMS=" +
          join_head_dims(wanted, n_wanted, ","));
}

// A cu_seqlens array: int32 (batch + 1,), contiguous, 4-byte aligned.
inline Status check_cu_seqlens(const char* name, const TensorRef& t) {
  const char* what = "int32 (batch + 1,) contiguous";
  if (t.dtype != DType::kInt32) return Status::invalid_type(name, what, t.dtype_str());
  if (t.rank != 1 || t.shape[0] < 1)
    return Status::invalid_argument(name, what, "shape " + shape_str(t),
                                    std::string(name) + ": expected " + what + ", got shape " + shape_str(t));
  if (t.shape[0] > 1 && t.stride[0] != 1)
    return Status::invalid_argument(name, what, "strides " + strides_str(t));
  return check_data(name, t, 4);
}

// `t` with a leading dim of extent 1: a (total, heads, dim) varlen array as the (batch = 1) array
// the fixed-length rules check.
template <class Ref>
Ref with_unit_batch(const Ref& t) {
  Ref r = t;
  if (t.rank >= TensorRef::kMaxRank) return r;
  r.rank = t.rank + 1;
  r.shape[0] = 1;
  r.stride[0] = t.rank > 0 ? t.shape[0] * t.stride[0] : 1;
  for (int i = 0; i < t.rank; ++i) r.shape[i + 1] = t.shape[i], r.stride[i + 1] = t.stride[i];
  return r;
}

inline double default_softmax_scale(int64_t head_dim) {
  return head_dim > 0 ? 1.0 / std::sqrt(double(head_dim)) : 1.0;
}

// The rules of the options alone, which need no array (bindings check them before the arrays:
// flashcute._C.check_options). An unset scale is checked where plan_fwd sets it from head_dim.
// Every value must survive the conversion to the kernels' float and int.
inline Status check_options(const AttnOptions& o) {
  if (o.softmax_scale) {
    const double scale = *o.softmax_scale;
    if (!std::isfinite(scale) || !(scale > 0.0) || !std::isfinite(float(scale)) || float(scale) == 0.f)
      return Status::invalid_argument("softmax_scale", "a finite number > 0", std::to_string(scale),
                                      "softmax_scale must be a finite number > 0, got " + std::to_string(scale));
  }
  if (!std::isfinite(o.softcap) || o.softcap < 0.0 || !std::isfinite(float(o.softcap)))
    return Status::invalid_argument("softcap", "a finite number >= 0", std::to_string(o.softcap),
                                    "softcap must be a finite number >= 0 (0 disables it), got " +
                                        std::to_string(o.softcap));
  if (o.window_left < -1)
    return Status::invalid_argument("window_left", ">= -1", std::to_string(o.window_left),
                                    "window_left must be >= -1 (-1: unbounded), got " + std::to_string(o.window_left));
  if (o.window_right < -1)
    return Status::invalid_argument("window_right", ">= -1", std::to_string(o.window_right),
                                    "window_right must be >= -1 (-1: unbounded), got " +
                                        std::to_string(o.window_right));
  return Status::success();
}

// The longest sequence lengths of a variable-length batch.
inline Status check_max_seqlens(int64_t max_seqlen_q, int64_t max_seqlen_k) {
  for (auto [name, v] : {std::pair<const char*, int64_t>{"max_seqlen_q", max_seqlen_q}, {"max_seqlen_k", max_seqlen_k}}) {
    if (v < 0 || v > INT_MAX)
      return Status::invalid_argument(name, ">= 0 and <= " + std::to_string(INT_MAX), std::to_string(v),
                                      std::string(name) + " must be >= 0 and <= " + std::to_string(INT_MAX) +
                                          ", got " + std::to_string(v));
  }
  return Status::success();
}

}  // namespace detail

inline Status plan_fwd(const FwdArgs& a, FwdPlan& plan);

namespace detail {
inline Status plan_fwd_kvcache(const FwdArgs& a, FwdPlan& plan);  // host/validate_kvcache.hpp
}

namespace detail {

// plan_fwd of a variable-length batch: its own arrays and ranks checked here, everything else by
// the fixed-length rules on a batch-1 view of the packed arrays, whose plan then learns the
// sequences.
inline Status plan_fwd_varlen(const FwdArgs& a, FwdPlan& plan) {
  const VarlenArgs& vl = *a.varlen;
  FLASHCUTE_RETURN_IF_ERROR(check_cu_seqlens("cu_seqlens_q", vl.cu_seqlens_q));
  FLASHCUTE_RETURN_IF_ERROR(check_cu_seqlens("cu_seqlens_k", vl.cu_seqlens_k));
  if (vl.cu_seqlens_k.shape[0] != vl.cu_seqlens_q.shape[0])
    return Status::invalid_argument("cu_seqlens_k", "shape " + shape_str(vl.cu_seqlens_q) + " like cu_seqlens_q",
                                    shape_str(vl.cu_seqlens_k),
                                    "cu_seqlens_k: shape " + shape_str(vl.cu_seqlens_k) +
                                        " does not match cu_seqlens_q's " + shape_str(vl.cu_seqlens_q) +
                                        " (both are (batch + 1,))");
  FLASHCUTE_RETURN_IF_ERROR(check_max_seqlens(vl.max_seqlen_q, vl.max_seqlen_k));
  FLASHCUTE_RETURN_IF_ERROR(check_rank("q", a.q, 3, "(total_q, nheads, headdim)"));
  FLASHCUTE_RETURN_IF_ERROR(check_rank("k", a.k, 3, "(total_k, nheads_k, headdim)"));
  FLASHCUTE_RETURN_IF_ERROR(check_rank("v", a.v, 3, "(total_k, nheads_k, headdim) like k"));
  FLASHCUTE_RETURN_IF_ERROR(check_rank("out", a.out, 3, "(total_q, nheads, headdim) like q"));
  if (a.k.shape[2] != a.q.shape[2])
    return Status::invalid_argument("k", "headdim " + std::to_string(a.q.shape[2]) + " like q",
                                    std::to_string(a.k.shape[2]),
                                    "k: headdim " + std::to_string(a.k.shape[2]) + " does not match q's headdim " +
                                        std::to_string(a.q.shape[2]) + " (k is " + shape_str(a.k) + ", q is " +
                                        shape_str(a.q) + ")");
  for (int i = 0; i < 3; ++i) {
    if (a.v.shape[i] != a.k.shape[i]) return Status::invalid_argument("v", "shape " + shape_str(a.k) + " like k", shape_str(a.v));
    if (a.out.shape[i] != a.q.shape[i])
      return Status::invalid_argument("out", "shape " + shape_str(a.q) + " like q", shape_str(a.out));
  }
  if (a.lse) {
    const TensorRef& lse = *a.lse;
    const int64_t expected[2] = {a.q.shape[1], a.q.shape[0]};
    const std::string what = "float32 (nheads, total_q) = " + tuple_str(expected, 2) + " contiguous in total_q";
    if (lse.dtype != DType::kFloat32) return Status::invalid_type("lse", what, std::string("dtype ") + lse.dtype_str());
    if (lse.rank != 2 || lse.shape[0] != expected[0] || lse.shape[1] != expected[1])
      return Status::invalid_argument("lse", what, "shape " + shape_str(lse));
  }
  FLASHCUTE_RETURN_IF_ERROR(check_int32("q", "total_q", a.q.shape[0]));
  FLASHCUTE_RETURN_IF_ERROR(check_int32("k", "total_k", a.k.shape[0]));
  const int64_t batch = vl.cu_seqlens_q.shape[0] - 1;
  if (batch > 65535)
    return Status::invalid_argument("cu_seqlens_q", "at most 65536 entries (batch <= 65535)",
                                    std::to_string(batch + 1) + " entries");

  FwdArgs fixed = a;
  fixed.varlen.reset();
  fixed.q = with_unit_batch(a.q);
  fixed.k = with_unit_batch(a.k);
  fixed.v = with_unit_batch(a.v);
  fixed.out = with_unit_batch(a.out);
  if (a.lse) fixed.lse = with_unit_batch(*a.lse);
  FLASHCUTE_RETURN_IF_ERROR(plan_fwd(fixed, plan));  // its window bounds are normalised by the totals

  FwdParams& p = plan.params;
  p.total_q = int(a.q.shape[0]);
  p.total_k = int(a.k.shape[0]);
  p.cu_seqlens_q = static_cast<const int*>(vl.cu_seqlens_q.data);
  p.cu_seqlens_k = static_cast<const int*>(vl.cu_seqlens_k.data);
  p.batch = int(batch);
  p.seqlen_q = int(vl.max_seqlen_q);
  p.seqlen_k = int(vl.max_seqlen_k);
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = p.lse_batch_stride = 0;
  plan.empty = batch == 0 || vl.max_seqlen_q == 0 || p.total_q == 0;
  plan.sm90 = false;  // the sm90 kernels take fixed-length batches only (sm90_can_run)
  return Status::success();
}

}  // namespace detail

// Checks a forward call and, when it is valid, fills `plan`. The checks run in a fixed order
// (ranks and dtypes, shapes, strides, alignment, scalars, then what this build compiled), and the
// first failure is returned.
inline Status plan_fwd(const FwdArgs& a, FwdPlan& plan) {
  using namespace detail;
  if (a.varlen && a.kvcache)
    return Status::invalid_argument("cu_seqlens_q", "no variable-length batch with a KV cache", "cu_seqlens_q",
                                    "cu_seqlens_q: a KV-cache call takes a fixed-length batch");
  if (a.varlen) return plan_fwd_varlen(a, plan);
  if (a.kvcache) return plan_fwd_kvcache(a, plan);
  const TensorRef &q = a.q, &k = a.k, &v = a.v, &out = a.out;

  // 1. Ranks and dtypes.
  FLASHCUTE_RETURN_IF_ERROR(check_rank("q", q, 4, "(batch, seqlen_q, nheads, headdim)"));
  if (q.dtype != DType::kFloat16 && q.dtype != DType::kBFloat16)
    return Status::invalid_type("q", "a float16 or bfloat16 array", q.dtype_str());
  auto like_q = [&] { return std::string(dtype_name(q.dtype)) + " like q"; };
  FLASHCUTE_RETURN_IF_ERROR(check_rank("k", k, 4, "(batch, seqlen_k, nheads_k, headdim)"));
  if (k.dtype != q.dtype) return Status::invalid_type("k", like_q(), k.dtype_str());
  FLASHCUTE_RETURN_IF_ERROR(check_rank("v", v, 4, "(batch, seqlen_k, nheads_k, headdim)"));
  if (v.dtype != q.dtype) return Status::invalid_type("v", like_q(), v.dtype_str());
  FLASHCUTE_RETURN_IF_ERROR(check_rank("out", out, 4, "(batch, seqlen_q, nheads, headdim) like q"));
  if (out.dtype != q.dtype) return Status::invalid_type("out", like_q(), out.dtype_str());

  // 2. Shapes. (Messages are built only on the error paths: a valid call allocates nothing.)
  const int64_t batch = q.shape[0], seqlen_q = q.shape[1], nheads = q.shape[2], head_dim = q.shape[3];
  const int64_t seqlen_k = k.shape[1], nheads_k = k.shape[2];
  auto k_and_q = [&] { return " (k is " + shape_str(k) + ", q is " + shape_str(q) + ")"; };
  if (k.shape[0] != batch)
    return Status::invalid_argument("k", "batch " + std::to_string(batch) + " like q", std::to_string(k.shape[0]),
                                    "k: batch " + std::to_string(k.shape[0]) + " does not match q's batch " +
                                        std::to_string(batch) + k_and_q());
  if (k.shape[3] != head_dim)
    return Status::invalid_argument("k", "headdim " + std::to_string(head_dim) + " like q", std::to_string(k.shape[3]),
                                    "k: headdim " + std::to_string(k.shape[3]) + " does not match q's headdim " +
                                        std::to_string(head_dim) + k_and_q());
  static const char* kKDims[4] = {"batch", "seqlen_k", "nheads_k", "headdim"};
  for (int i = 0; i < 4; ++i) {
    if (v.shape[i] != k.shape[i])
      return Status::invalid_argument("v", "shape " + shape_str(k) + " like k",
                                      shape_str(v) + " (" + kKDims[i] + " differs: " + std::to_string(v.shape[i]) +
                                          " vs " + std::to_string(k.shape[i]) + ")");
  }
  if (nheads < 1)
    return Status::invalid_argument("q", "nheads >= 1", std::to_string(nheads),
                                    "q: nheads must be >= 1, got " + std::to_string(nheads));
  if (nheads_k < 1)
    return Status::invalid_argument("k", "nheads_k >= 1", std::to_string(nheads_k),
                                    "k: nheads_k must be >= 1, got " + std::to_string(nheads_k));
  if (nheads % nheads_k != 0)
    return Status::invalid_argument("k", "nheads_k dividing nheads (" + std::to_string(nheads) + ")",
                                    std::to_string(nheads_k),
                                    "nheads (" + std::to_string(nheads) + ") must be a multiple of nheads_k (" +
                                        std::to_string(nheads_k) + ")");
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > kMaxHeadDim)
    return Status::invalid_argument("q", "headdim a multiple of 8 and <= 256", std::to_string(head_dim),
                                    "headdim must be a multiple of 8 and <= " + std::to_string(kMaxHeadDim) +
                                        ", got " + std::to_string(head_dim));
  for (int i = 0; i < 4; ++i) {
    if (out.shape[i] != q.shape[i])
      return Status::invalid_argument("out", "shape " + shape_str(q) + " like q", shape_str(out));
  }
  if (a.lse) {
    const TensorRef& lse = *a.lse;
    const int64_t expected[3] = {batch, nheads, seqlen_q};
    auto what = [&] { return "float32 (batch, nheads, seqlen_q) = " + tuple_str(expected, 3) + " contiguous in seqlen_q"; };
    if (lse.dtype != DType::kFloat32)
      return Status::invalid_type("lse", what(), std::string("dtype ") + lse.dtype_str());
    if (lse.rank != 3 || lse.shape[0] != batch || lse.shape[1] != nheads || lse.shape[2] != seqlen_q)
      return Status::invalid_argument("lse", what(), "shape " + shape_str(lse));
  }
  FLASHCUTE_RETURN_IF_ERROR(check_int32("q", "batch", batch));
  FLASHCUTE_RETURN_IF_ERROR(check_int32("q", "seqlen_q", seqlen_q));
  FLASHCUTE_RETURN_IF_ERROR(check_int32("k", "seqlen_k", seqlen_k));
  FLASHCUTE_RETURN_IF_ERROR(check_int32("q", "nheads", nheads));
  FLASHCUTE_RETURN_IF_ERROR(check_grid("batch", batch));
  FLASHCUTE_RETURN_IF_ERROR(check_grid("nheads", nheads));

  // 3. Strides.
  FLASHCUTE_RETURN_IF_ERROR(check_strides_4d("q", q));
  FLASHCUTE_RETURN_IF_ERROR(check_strides_4d("k", k));
  FLASHCUTE_RETURN_IF_ERROR(check_strides_4d("v", v));
  FLASHCUTE_RETURN_IF_ERROR(check_strides_4d("out", out));
  FLASHCUTE_RETURN_IF_ERROR(check_no_overlap("out", out));
  if (a.lse && a.lse->numel() > 0) {  // an empty lse addresses nothing: its strides are arbitrary
    const TensorRef& lse = *a.lse;
    if (lse.shape[2] > 1 && lse.stride[2] != 1)
      return Status::invalid_argument(
          "lse", "float32 (batch, nheads, seqlen_q) contiguous in seqlen_q (stride 1)", "strides " + strides_str(lse));
    if (kstride(lse, 0) < 0 || kstride(lse, 1) < 0)
      return Status::invalid_argument("lse", "non-negative strides", "strides " + strides_str(lse),
                                      "lse: negative strides are not supported, got strides " + strides_str(lse));
    FLASHCUTE_RETURN_IF_ERROR(check_no_overlap("lse", lse));
  }

  // 4. Data pointers: present, and aligned for the kernels' vector accesses.
  FLASHCUTE_RETURN_IF_ERROR(check_data("q", q, 16));
  FLASHCUTE_RETURN_IF_ERROR(check_data("k", k, 16));
  FLASHCUTE_RETURN_IF_ERROR(check_data("v", v, 16));
  FLASHCUTE_RETURN_IF_ERROR(check_data("out", out, 16));
  if (a.lse) FLASHCUTE_RETURN_IF_ERROR(check_data("lse", *a.lse, 4));

  // 5. Scalars.
  FLASHCUTE_RETURN_IF_ERROR(check_options(a));
  const double scale = a.softmax_scale ? *a.softmax_scale : default_softmax_scale(head_dim);

  // 6. What this build compiled.
  if (!dtype_compiled(q.dtype)) return dtype_not_compiled(q.dtype);
  const int kernel_hd = kernel_head_dim(int(head_dim), q.dtype);
  if (kernel_hd == 0) return head_dim_not_compiled(head_dim, q.dtype);

  // The plan. Causal is a window with no right context. A bound that lets every query row see
  // every key is the same as no bound: left >= seqlen_k (even the last row's lower limit is below
  // key 0) and right >= seqlen_q - 1 (even row 0's upper limit is at the last key). Normalising
  // keeps the kernels' int arithmetic far from overflow for huge user bounds.
  int64_t left = a.window_left, right = a.causal ? 0 : a.window_right;
  if (left >= seqlen_k) left = -1;
  if (right >= seqlen_q - 1) right = -1;

  plan = FwdPlan{};
  plan.kernel = KernelKey{Arch::kSm80, Direction::kFwd, q.dtype, kernel_hd};
  plan.empty = batch == 0 || seqlen_q == 0;
  FwdParams& p = plan.params;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = a.out.mutable_data();
  p.lse = a.lse ? static_cast<float*>(a.lse->mutable_data()) : nullptr;
  p.q_batch_stride = kstride(q, 0), p.q_row_stride = kstride(q, 1), p.q_head_stride = kstride(q, 2);
  p.k_batch_stride = kstride(k, 0), p.k_row_stride = kstride(k, 1), p.k_head_stride = kstride(k, 2);
  p.v_batch_stride = kstride(v, 0), p.v_row_stride = kstride(v, 1), p.v_head_stride = kstride(v, 2);
  p.o_batch_stride = kstride(out, 0), p.o_row_stride = kstride(out, 1), p.o_head_stride = kstride(out, 2);
  if (a.lse) p.lse_batch_stride = kstride(*a.lse, 0), p.lse_head_stride = kstride(*a.lse, 1);
  p.batch = int(batch);
  p.seqlen_q = int(seqlen_q);
  p.seqlen_k = int(seqlen_k);
  p.nheads = int(nheads);
  p.nheads_k = int(nheads_k);
  p.head_dim = int(head_dim);
  p.softmax_scale = float(scale);
  p.softcap = float(a.softcap);
  p.window_left = int(left);
  p.window_right = int(right);
  plan.sm90 = kernel_head_dim(int(head_dim), q.dtype, Direction::kFwd, Arch::kSm90) == kernel_hd &&
              sm90_can_run(p) == nullptr;
  return Status::success();
}

}  // namespace flashcute

#include "flashcute/host/validate_kvcache.hpp"  // detail::plan_fwd_kvcache
