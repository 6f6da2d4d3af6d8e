// flashcute/api.hpp: the host entry point, run_fwd().
//
// This header needs only the CUDA runtime headers: it validates FwdParams,
// normalises the mask options and dispatches to launch_fwd<dtype, head dim>,
// whose definitions live in launch.hpp. Include <flashcute/flashcute.hpp> to get
// both (header-only use), or link the prebuilt instantiations and include only
// this header (what flashcute's own Python module does).
//
// Which instantiations exist is controlled by FLASHCUTE_ENABLE_HDIM<d> and
// FLASHCUTE_ENABLE_{FP16,BF16} (all default to 1). A head dim without its own
// kernel runs on the smallest enabled kernel head dim above it.
#pragma once

#include <cstdint>

#include "flashcute/config.hpp"
#include "flashcute/params.hpp"
#include "flashcute/status.hpp"

#ifndef FLASHCUTE_ENABLE_HDIM32
#define FLASHCUTE_ENABLE_HDIM32 1
#endif
#ifndef FLASHCUTE_ENABLE_HDIM64
#define FLASHCUTE_ENABLE_HDIM64 1
#endif
#ifndef FLASHCUTE_ENABLE_HDIM96
#define FLASHCUTE_ENABLE_HDIM96 1
#endif
#ifndef FLASHCUTE_ENABLE_HDIM128
#define FLASHCUTE_ENABLE_HDIM128 1
#endif
#ifndef FLASHCUTE_ENABLE_HDIM192
#define FLASHCUTE_ENABLE_HDIM192 1
#endif
#ifndef FLASHCUTE_ENABLE_HDIM256
#define FLASHCUTE_ENABLE_HDIM256 1
#endif
#ifndef FLASHCUTE_ENABLE_FP16
#define FLASHCUTE_ENABLE_FP16 1
#endif
#ifndef FLASHCUTE_ENABLE_BF16
#define FLASHCUTE_ENABLE_BF16 1
#endif

namespace flashcute {

// One explicit instantiation per (dtype, kernel head dim); defined in launch.hpp.
// Preconditions (checked by run_fwd): params are valid, head_dim <= kHeadDim,
// seqlens and batch are positive.
template <DType kDType, int kHeadDim>
Status launch_fwd(const FwdParams& params, cudaStream_t stream);

constexpr bool head_dim_compiled(int kernel_head_dim) {
  switch (kernel_head_dim) {
    case 32: return FLASHCUTE_ENABLE_HDIM32;
    case 64: return FLASHCUTE_ENABLE_HDIM64;
    case 96: return FLASHCUTE_ENABLE_HDIM96;
    case 128: return FLASHCUTE_ENABLE_HDIM128;
    case 192: return FLASHCUTE_ENABLE_HDIM192;
    case 256: return FLASHCUTE_ENABLE_HDIM256;
    default: return false;
  }
}

constexpr bool dtype_compiled(DType dtype) {
  return dtype == DType::kFloat16 ? FLASHCUTE_ENABLE_FP16 : FLASHCUTE_ENABLE_BF16;
}

// The kernel head dim that run_fwd would use for head_dim, or 0 if none is compiled.
constexpr int dispatch_head_dim(int head_dim) {
  for (int hd : kKernelHeadDims) {
    if (head_dim <= hd && head_dim_compiled(hd)) return hd;
  }
  return 0;
}

namespace detail {

template <DType kDType>
Status dispatch_fwd(const FwdParams& p, int kernel_head_dim, cudaStream_t stream) {
  switch (kernel_head_dim) {
#if FLASHCUTE_ENABLE_HDIM32
    case 32: return launch_fwd<kDType, 32>(p, stream);
#endif
#if FLASHCUTE_ENABLE_HDIM64
    case 64: return launch_fwd<kDType, 64>(p, stream);
#endif
#if FLASHCUTE_ENABLE_HDIM96
    case 96: return launch_fwd<kDType, 96>(p, stream);
#endif
#if FLASHCUTE_ENABLE_HDIM128
    case 128: return launch_fwd<kDType, 128>(p, stream);
#endif
#if FLASHCUTE_ENABLE_HDIM192
    case 192: return launch_fwd<kDType, 192>(p, stream);
#endif
#if FLASHCUTE_ENABLE_HDIM256
    case 256: return launch_fwd<kDType, 256>(p, stream);
#endif
    default: return Status::not_compiled("no kernel for this head dim was compiled into this build");
  }
}

inline bool aligned16(const void* ptr) { return (reinterpret_cast<std::uintptr_t>(ptr) & 15u) == 0; }

inline bool strides_ok(int64_t b, int64_t r, int64_t h) { return b % 8 == 0 && r % 8 == 0 && h % 8 == 0; }

}  // namespace detail

// Checks params without launching. Returns the first problem found.
inline Status check_fwd_params(const FwdParams& p) {
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0) return Status::invalid("batch and seqlens must be >= 0");
  if (p.nheads <= 0 || p.nheads_k <= 0) return Status::invalid("nheads and nheads_k must be > 0");
  if (p.nheads % p.nheads_k != 0) return Status::invalid("nheads must be a multiple of nheads_k");
  if (p.head_dim <= 0 || p.head_dim % 8 != 0 || p.head_dim > kMaxHeadDim)
    return Status::invalid("head_dim must be a multiple of 8 in [8, 256]");
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return Status::invalid("dtype must be float16 or bfloat16");
  if (!(p.softmax_scale > 0.f) || p.softmax_scale == __builtin_huge_valf()) return Status::invalid("softmax_scale must be finite and > 0");
  if (p.softcap < 0.f) return Status::invalid("softcap must be >= 0");
  if (p.batch == 0 || p.seqlen_q == 0) return Status::success();  // nothing to compute
  if (!p.q || !p.k || !p.v || !p.o) return Status::invalid("q, k, v and o must be non-null");
  if (!detail::aligned16(p.q) || !detail::aligned16(p.k) || !detail::aligned16(p.v) || !detail::aligned16(p.o))
    return Status::invalid("q, k, v and o must be 16-byte aligned");
  if (!detail::strides_ok(p.q_batch_stride, p.q_row_stride, p.q_head_stride) ||
      !detail::strides_ok(p.k_batch_stride, p.k_row_stride, p.k_head_stride) ||
      !detail::strides_ok(p.v_batch_stride, p.v_row_stride, p.v_head_stride) ||
      !detail::strides_ok(p.o_batch_stride, p.o_row_stride, p.o_head_stride))
    return Status::invalid("batch, row and head strides must be multiples of 8 elements (16 bytes)");
  return Status::success();
}

// Runs the forward pass on `stream`. Never synchronises and never aborts.
// A zero batch or seqlen_q launches nothing. seqlen_k == 0 writes zeros to o and
// -inf to lse (no key is visible to any query).
inline Status run_fwd(const FwdParams& params, cudaStream_t stream) {
  Status st = check_fwd_params(params);
  if (!st.ok()) return st;
  if (params.batch == 0 || params.seqlen_q == 0) return Status::success();
  if (!dtype_compiled(params.dtype)) return Status::not_compiled("this dtype was not compiled into this build");
  const int kernel_hd = dispatch_head_dim(params.head_dim);
  if (kernel_hd == 0) return Status::not_compiled("no kernel head dim >= head_dim was compiled into this build");

  FwdParams p = params;
  // Causal is a window with no right context. A bound that lets every query
  // row see every key is the same as no bound: left >= seqlen_k (even the last
  // row's lower limit is then below key 0) and right >= seqlen_q - 1 (even row
  // 0's upper limit is then at the last key). Normalising keeps the kernel's int
  // arithmetic far from overflow for huge user bounds.
  if (p.causal) p.window_right = 0;
  if (p.window_left >= p.seqlen_k) p.window_left = -1;
  if (p.window_right >= p.seqlen_q - 1) p.window_right = -1;

  if (p.dtype == DType::kFloat16) {
#if FLASHCUTE_ENABLE_FP16
    return detail::dispatch_fwd<DType::kFloat16>(p, kernel_hd, stream);
#endif
  } else {
#if FLASHCUTE_ENABLE_BF16
    return detail::dispatch_fwd<DType::kBFloat16>(p, kernel_hd, stream);
#endif
  }
  return Status::not_compiled("this dtype was not compiled into this build");
}

}  // namespace flashcute
