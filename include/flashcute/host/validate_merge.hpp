// flashcute/host/validate_merge.hpp: the one validation of a merge_attn_states call.
//
// plan_merge() checks MergeArgs and, if valid, makes the MergeParams the merge kernel reads
// (sm80/kernel_merge.hpp). Needs only the CUDA runtime headers.
#pragma once

#include <string>

#include "flashcute/host/validate_fwd.hpp"

namespace flashcute {

// Two partial attentions of the same queries over disjoint key sets, and where their merge goes.
// out_a, out_b, out: (batch, seqlen, nheads, head_dim), or varlen (total, nheads, head_dim);
// float16, bfloat16 or float32, all one dtype; the last dim contiguous. lse_a, lse_b, lse:
// float32 (batch, nheads, seqlen), or (nheads, total); -inf marks a row that saw no key. out may
// be out_a or out_b itself (an in-place merge), and lse likewise.
struct MergeArgs {
  TensorRef out_a;
  TensorRef lse_a;
  TensorRef out_b;
  TensorRef lse_b;
  MutableTensorRef out;
  MutableTensorRef lse;
};

struct MergePlan {
  DType dtype = DType::kFloat32;
  MergeParams params{};
  bool empty = true;  // no element to merge
};

inline Status plan_merge(const MergeArgs& a, MergePlan& plan) {
  using namespace detail;
  const TensorRef& oa = a.out_a;
  if (oa.rank != 3 && oa.rank != 4)
    return Status::invalid_argument("out_a", "4 dims (batch, seqlen, nheads, headdim) or 3 (total, nheads, headdim)",
                                    std::to_string(oa.rank));
  if (oa.dtype != DType::kFloat16 && oa.dtype != DType::kBFloat16 && oa.dtype != DType::kFloat32)
    return Status::invalid_type("out_a", "a float16, bfloat16 or float32 array", oa.dtype_str());
  const bool varlen = oa.rank == 3;
  const int64_t batch = varlen ? 1 : oa.shape[0], seqlen = oa.shape[varlen ? 0 : 1];
  const int64_t nheads = oa.shape[varlen ? 1 : 2], head_dim = oa.shape[varlen ? 2 : 3];
  const std::string like_a = std::string(dtype_name(oa.dtype)) + " like out_a";
  for (auto [name, t] : {std::pair<const char*, const TensorRef*>{"out_b", &a.out_b}, {"out", &a.out}}) {
    if (t->dtype != oa.dtype) return Status::invalid_type(name, like_a, t->dtype_str());
    bool same = t->rank == oa.rank;
    for (int i = 0; same && i < oa.rank; ++i) same = t->shape[i] == oa.shape[i];
    if (!same) return Status::invalid_argument(name, "shape " + shape_str(oa) + " like out_a", shape_str(*t));
  }
  const int64_t lse_shape[3] = {batch, nheads, seqlen};
  const std::string lse_what = varlen ? "float32 (nheads, total) = " + tuple_str(lse_shape + 1, 2)
                                      : "float32 (batch, nheads, seqlen) = " + tuple_str(lse_shape, 3);
  for (auto [name, t] : {std::pair<const char*, const TensorRef*>{"lse_a", &a.lse_a}, {"lse_b", &a.lse_b},
                         {"lse", &a.lse}}) {
    if (t->dtype != DType::kFloat32) return Status::invalid_type(name, lse_what, std::string("dtype ") + t->dtype_str());
    bool same = t->rank == (varlen ? 2 : 3);
    for (int i = 0; same && i < t->rank; ++i) same = t->shape[i] == lse_shape[i + (varlen ? 1 : 0)];
    if (!same) return Status::invalid_argument(name, lse_what, "shape " + shape_str(*t));
  }
  FLASHCUTE_RETURN_IF_ERROR(check_int32("out_a", "batch", batch));
  FLASHCUTE_RETURN_IF_ERROR(check_int32("out_a", "seqlen", seqlen));
  FLASHCUTE_RETURN_IF_ERROR(check_int32("out_a", "nheads", nheads));
  FLASHCUTE_RETURN_IF_ERROR(check_int32("out_a", "headdim", head_dim));

  // Strides: the head dim contiguous, the others non-negative; out must not alias itself.
  for (auto [name, t] : {std::pair<const char*, const TensorRef*>{"out_a", &a.out_a}, {"out_b", &a.out_b},
                         {"out", &a.out}, {"lse_a", &a.lse_a}, {"lse_b", &a.lse_b}, {"lse", &a.lse}}) {
    if (t->numel() == 0) continue;
    const int last = t->rank - 1;
    if (t->shape[last] > 1 && t->stride[last] != 1)
      return Status::invalid_argument(name, "the last dim contiguous (stride 1)", "strides " + strides_str(*t));
    for (int i = 0; i < last; ++i)
      if (kstride(*t, i) < 0)
        return Status::invalid_argument(name, "non-negative strides", "strides " + strides_str(*t));
    FLASHCUTE_RETURN_IF_ERROR(check_data(name, *t, t->dtype == DType::kFloat32 ? 4 : 2));
  }
  FLASHCUTE_RETURN_IF_ERROR(check_no_overlap("out", a.out));
  FLASHCUTE_RETURN_IF_ERROR(check_no_overlap("lse", a.lse));

  plan = MergePlan{};
  plan.dtype = oa.dtype;
  MergeParams& p = plan.params;
  p.out_a = a.out_a.data;
  p.out_b = a.out_b.data;
  p.out = a.out.mutable_data();
  p.lse_a = static_cast<const float*>(a.lse_a.data);
  p.lse_b = static_cast<const float*>(a.lse_b.data);
  p.lse = static_cast<float*>(a.lse.mutable_data());
  // The strides of the first three dims: (batch, row, head) of an output, (batch, head, row) of
  // an lse; a varlen array has no batch dim (stride 0).
  auto outer_strides = [&](const TensorRef& t, int64_t* s) {
    s[0] = varlen ? 0 : kstride(t, 0);
    s[1] = kstride(t, varlen ? 0 : 1);
    s[2] = kstride(t, varlen ? 1 : 2);
  };
  outer_strides(a.out_a, p.a_stride);
  outer_strides(a.out_b, p.b_stride);
  outer_strides(a.out, p.out_stride);
  outer_strides(a.lse_a, p.lse_a_stride);
  outer_strides(a.lse_b, p.lse_b_stride);
  outer_strides(a.lse, p.lse_stride);
  p.batch = int(batch);
  p.seqlen = int(seqlen);
  p.nheads = int(nheads);
  p.head_dim = int(head_dim);
  plan.empty = int64_t(batch) * seqlen * nheads == 0;
  return Status::success();
}

}  // namespace flashcute
