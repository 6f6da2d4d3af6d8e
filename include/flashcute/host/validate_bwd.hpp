// flashcute/host/validate_bwd.hpp: the one validation of a backward call.
//
// plan_bwd() checks a call described by BwdArgs and, if it is valid, makes the BwdParams the
// kernels read and the KernelKey that runs them. The forward's arrays (q, k, v, out, lse) follow
// the forward's rules, checked by plan_fwd itself; this adds dout, dq, dk, dv and the workspace.
#pragma once

#include <string>
#include <tuple>

#include "flashcute/host/validate_fwd.hpp"

namespace flashcute {

// A backward call: given the forward's q, k, v, out and lse, and dout = dL/dout, computes
// dq, dk and dv (GQA: dk and dv summed over each group of query heads).
struct BwdArgs : AttnOptions {  // the forward's options, exactly
  TensorRef dout;  // like q: (batch, seqlen_q, nheads, head_dim)
  TensorRef q;
  TensorRef k;
  TensorRef v;
  TensorRef out;  // the forward's output
  TensorRef lse;  // the forward's lse: float32 (batch, nheads, seqlen_q), unit stride in seqlen_q
  MutableTensorRef dq;  // like q
  MutableTensorRef dk;  // like k
  MutableTensorRef dv;  // like v
  // float32, at least bwd_workspace_floats() elements, 16-byte aligned: D = rowsum(dout * out).
  MutableTensorRef workspace;
  // Same bits on every run: the sm80 backward always is (sm80/kernel_bwd.hpp); the sm90 one then
  // orders its dQ adds.
  bool deterministic = false;
  // k and v hold part of the keys that out and lse were computed over (context parallelism: each
  // rank's backward over one K/V block with the merged out and lse). D is then rowsum(dout * out)
  // for every row; otherwise rows that see few keys get the exact D over k's keys (common/dsum.hpp).
  bool partial_keys = false;
  // Set: a variable-length batch (VarlenArgs): every array has no batch dim, lse is
  // (nheads, total_q), and the workspace holds bwd_workspace_floats(1, nheads, total_q) (the sm90
  // backward: bwd_varlen_workspace_floats, host/dispatch.hpp).
  std::optional<VarlenArgs> varlen;
};

// The float32 workspace a backward call of these shapes needs on the sm80 kernels:
// batch * nheads * seqlen_q.
inline int64_t bwd_workspace_floats(int64_t batch, int64_t nheads, int64_t seqlen_q) {
  return batch * nheads * seqlen_q;
}

struct BwdPlan {
  KernelKey kernel{};
  BwdParams params{};
  bool empty = true;  // nothing to compute: batch 0, or seqlen_q and seqlen_k both 0
  // The sm90 kernel that can take this call (sm90_bwd_can_run, compiled, and a workspace of
  // sm90::bwd_workspace_floats), arch kSm80 where none can: launch() runs it on a compute
  // capability 9.0 device when the backward path setting allows.
  KernelKey sm90_kernel{};
};

namespace detail {

inline Status check_like(const char* name, const TensorRef& t, const TensorRef& ref, const char* ref_name) {
  if (t.rank != 4)
    return Status::invalid_argument(name, std::string("4 dims like ") + ref_name, std::to_string(t.rank));
  if (t.dtype != ref.dtype)
    return Status::invalid_type(name, std::string(dtype_name(ref.dtype)) + " like " + ref_name, t.dtype_str());
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] != ref.shape[i])
      return Status::invalid_argument(name, "shape " + shape_str(ref) + " like " + ref_name, shape_str(t));
  }
  FLASHCUTE_RETURN_IF_ERROR(check_strides_4d(name, t));
  return check_data(name, t, 16);
}

}  // namespace detail

inline Status plan_bwd(const BwdArgs& a, BwdPlan& plan) {
  using namespace detail;
  // The forward's arrays, by the forward's rules (out is only read here).
  FwdArgs f;
  f.q = a.q;
  f.k = a.k;
  f.v = a.v;
  static_cast<TensorRef&>(f.out) = a.out;
  static_cast<TensorRef&>(f.lse.emplace()) = a.lse;
  f.options() = a.options();
  f.varlen = a.varlen;
  FwdPlan fwd;
  FLASHCUTE_RETURN_IF_ERROR(plan_fwd(f, fwd));

  // A varlen call's arrays are checked as the batch-1 views that plan_fwd checked q, k, v through.
  auto view = [&](const auto& t) { return a.varlen ? with_unit_batch(t) : t; };
  if (a.varlen) {
    FLASHCUTE_RETURN_IF_ERROR(check_rank("dout", a.dout, 3, "(total_q, nheads, headdim) like q"));
    FLASHCUTE_RETURN_IF_ERROR(check_rank("dq", a.dq, 3, "(total_q, nheads, headdim) like q"));
    FLASHCUTE_RETURN_IF_ERROR(check_rank("dk", a.dk, 3, "(total_k, nheads_k, headdim) like k"));
    FLASHCUTE_RETURN_IF_ERROR(check_rank("dv", a.dv, 3, "(total_k, nheads_k, headdim) like v"));
    const std::tuple<const char*, const TensorRef&, const TensorRef&, const char*> like[4] = {
        {"dout", a.dout, a.q, "q"}, {"dq", a.dq, a.q, "q"}, {"dk", a.dk, a.k, "k"}, {"dv", a.dv, a.v, "v"}};
    for (const auto& [name, t, ref, ref_name] : like) {
      for (int i = 0; i < 3; ++i)
        if (t.shape[i] != ref.shape[i])
          return Status::invalid_argument(name, "shape " + shape_str(ref) + " like " + ref_name, shape_str(t));
    }
  }
  const TensorRef dout = view(a.dout), q = view(a.q), k = view(a.k), v = view(a.v);
  const MutableTensorRef dq = view(a.dq), dk = view(a.dk), dv = view(a.dv);
  FLASHCUTE_RETURN_IF_ERROR(check_like("dout", dout, q, "q"));
  FLASHCUTE_RETURN_IF_ERROR(check_like("dq", dq, q, "q"));
  FLASHCUTE_RETURN_IF_ERROR(check_like("dk", dk, k, "k"));
  FLASHCUTE_RETURN_IF_ERROR(check_like("dv", dv, v, "v"));
  FLASHCUTE_RETURN_IF_ERROR(check_no_overlap("dq", dq));
  FLASHCUTE_RETURN_IF_ERROR(check_no_overlap("dk", dk));
  FLASHCUTE_RETURN_IF_ERROR(check_no_overlap("dv", dv));

  const FwdParams& p = fwd.params;
  const int64_t need = a.varlen ? bwd_workspace_floats(1, p.nheads, p.total_q)
                                : bwd_workspace_floats(p.batch, p.nheads, p.seqlen_q);
  if (a.workspace.dtype != DType::kFloat32 || a.workspace.numel() < need)
    return Status::invalid_argument("workspace", "float32 with at least " + std::to_string(need) + " elements",
                                    std::string(a.workspace.dtype_str()) + " with " +
                                        std::to_string(a.workspace.numel()));
  if (need > 0) FLASHCUTE_RETURN_IF_ERROR(check_data("workspace", a.workspace, 16));

  const int kernel_hd = kernel_head_dim(p.head_dim, a.q.dtype, Direction::kBwd);
  if (kernel_hd == 0)
    return Status::invalid(StatusCode::kNotCompiled, "q", "a backward kernel for this dtype and head dim",
                           "a build without one",
                           std::string("flashcute has no backward kernel for head dim ") + std::to_string(p.head_dim) +
                               " (" + dtype_name(a.q.dtype) +
                               ") in this build: build with -C cmake.define.FLASHCUTE_BACKWARD=ON and the head dim "
                               "and dtype in FLASHCUTE_HEAD_DIMS / FLASHCUTE_DTYPES");

  plan = BwdPlan{};
  plan.kernel = KernelKey{Arch::kSm80, Direction::kBwd, a.q.dtype, kernel_hd};
  plan.empty = p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0) ||
               (a.varlen && p.total_q == 0 && p.total_k == 0);
  BwdParams& b = plan.params;
  static_cast<FwdParams&>(b) = p;
  b.dout = a.dout.data;
  b.dq = a.dq.mutable_data();
  b.dk = a.dk.mutable_data();
  b.dv = a.dv.mutable_data();
  b.dsum = static_cast<float*>(a.workspace.mutable_data());
  b.deterministic = a.deterministic;
  b.partial_keys = a.partial_keys;
  b.do_batch_stride = kstride(dout, 0), b.do_row_stride = kstride(dout, 1), b.do_head_stride = kstride(dout, 2);
  b.dq_batch_stride = kstride(dq, 0), b.dq_row_stride = kstride(dq, 1), b.dq_head_stride = kstride(dq, 2);
  b.dk_batch_stride = kstride(dk, 0), b.dk_row_stride = kstride(dk, 1), b.dk_head_stride = kstride(dk, 2);
  b.dv_batch_stride = kstride(dv, 0), b.dv_row_stride = kstride(dv, 1), b.dv_head_stride = kstride(dv, 2);
  if (a.varlen) b.do_batch_stride = b.dq_batch_stride = b.dk_batch_stride = b.dv_batch_stride = 0;
  const int sm90_hd = kernel_head_dim(p.head_dim, a.q.dtype, Direction::kBwd, Arch::kSm90);
  // (The workspace's 16-byte alignment is checked above.)
  const int64_t sm90_need = a.varlen ? sm90::bwd_varlen_workspace_floats(p.batch, p.nheads, p.total_q, sm90_hd)
                                     : sm90::bwd_workspace_floats(p.batch, p.nheads, p.seqlen_q, sm90_hd);
  if (sm90_hd > 0 && sm90_bwd_can_run(b) == nullptr && a.workspace.numel() >= sm90_need)
    plan.sm90_kernel = KernelKey{Arch::kSm90, Direction::kBwd, a.q.dtype, sm90_hd};
  return Status::success();
}

}  // namespace flashcute
