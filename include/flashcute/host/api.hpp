// flashcute/host/api.hpp: the C++ entry point.
//
//   flashcute::FwdArgs args;
//   args.q = flashcute::tensor_ref(q_ptr, flashcute::DType::kBFloat16, {batch, seqlen_q, nheads, head_dim});
//   ...                                        // k, v, out (mutable_tensor_ref), options
//   flashcute::Status st = flashcute::run_fwd(args, stream);
//
// run_fwd = plan_fwd (the validation, host/validate_fwd.hpp) + launch (host/dispatch.hpp). It
// never synchronises and never aborts; every problem comes back as a Status. A zero batch or
// seqlen_q launches nothing; seqlen_k == 0 writes out = 0 and lse = -inf (no key is visible).
//
// Needs only the CUDA runtime headers: the kernels themselves are either linked in (flashcute's
// own build, the flashcute_kernels library) or instantiated by including flashcute/flashcute.hpp.
#pragma once

#include "flashcute/host/dispatch.hpp"
#include "flashcute/host/validate_bwd.hpp"
#include "flashcute/host/validate_fwd.hpp"
#include "flashcute/host/validate_merge.hpp"

namespace flashcute {

inline Status run_fwd(const FwdArgs& args, cudaStream_t stream) {
  FwdPlan plan;
  Status st = plan_fwd(args, plan);
  if (!st.ok()) return st;
  return launch(plan, stream);
}

// The backward: dq, dk and dv from dout and the forward's q, k, v, out and lse (host/validate_bwd.hpp
// lists the arrays; args.workspace holds bwd_workspace_floats(batch, nheads, seqlen_q, head_dim,
// dtype) float32s for the fastest path, host/dispatch.hpp). Same rules as run_fwd.
inline Status run_bwd(const BwdArgs& args, cudaStream_t stream) {
  BwdPlan plan;
  Status st = plan_bwd(args, plan);
  if (!st.ok()) return st;
  return launch(plan, stream);
}

// merge_attn_states: two partial attentions over disjoint key sets merged by their lse
// (host/validate_merge.hpp lists the arrays). Same rules as run_fwd.
inline Status launch(const MergePlan& plan, cudaStream_t stream) {
  if (plan.empty) return Status::success();
  return sm80::launch_merge<0>(plan.params, plan.dtype, stream);
}

inline Status run_merge(const MergeArgs& args, cudaStream_t stream) {
  MergePlan plan;
  Status st = plan_merge(args, plan);
  if (!st.ok()) return st;
  return launch(plan, stream);
}

}  // namespace flashcute
