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
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "flashcute/common/params.hpp"
#include "flashcute/common/status.hpp"
#include "flashcute/common/tensor.hpp"
#include "flashcute/common/types.hpp"
#include "flashcute/host/args.hpp"
#include "flashcute/host/checks.hpp"
#include "flashcute/host/kernels.hpp"
#include "flashcute/host/sm90_rules.hpp"

namespace flashcute {

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
  plan.sm90 = plan.sm90 && sm90_can_run(p) == nullptr;  // (the batch-1 view's verdict, then the varlen rules)
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
