// flashcute/host/checks.hpp: the argument checks the plan_* functions share (ranks, strides,
// overlap, alignment, 32-bit limits, what the build compiled, the options), each returning a
// Status that names the argument, what was expected and what came.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "flashcute/common/status.hpp"
#include "flashcute/common/tensor.hpp"
#include "flashcute/common/types.hpp"
#include "flashcute/host/args.hpp"
#include "flashcute/host/kernels.hpp"

// Returns the Status of `expr` from the enclosing function when it is an error.
#define FLASHCUTE_RETURN_IF_ERROR(expr)            \
  do {                                             \
    ::flashcute::Status flashcute_st_ = (expr);    \
    if (!flashcute_st_.ok()) return flashcute_st_; \
  } while (0)

namespace flashcute {

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

}  // namespace flashcute
