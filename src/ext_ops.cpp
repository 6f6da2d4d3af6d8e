// src/ext_ops.cpp: flashcute._C's operations, one entry point each, for both array sources of the
// Python side (ext_common.hpp): DLPack arrays (device < 0: CuPy, any producer; devices checked
// after the validation) and descriptors on CUDA device `device` (the torch binding). Each entry
// is src/ops.hpp's operation, plan_* (the validation), and the launch.
#include "ext_common.hpp"

namespace flashcute_ext {

void fwd(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle options, int64_t stream,
         int device, bool check_stream_device, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
         int64_t max_seqlen_k) {
  with_source(device, check_stream_device, [&](auto& s) {
    flashcute::FwdArgs args;
    check_ok(fwd_args(s, args, options_from(options), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                      max_seqlen_k));
    check_stream(stream);
    flashcute::FwdPlan plan;
    check_ok(flashcute::plan_fwd(args, plan));
    launch_checked(s, plan, stream);
  });
}

void bwd(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle dq,
         nb::handle dk, nb::handle dv, nb::handle workspace, nb::handle options, bool deterministic, int64_t stream,
         int device, bool check_stream_device, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
         int64_t max_seqlen_k, bool partial_keys) {
  with_source(device, check_stream_device, [&](auto& s) {
    flashcute::BwdArgs args;
    check_ok(bwd_args(s, args, options_from(options), deterministic, dout, q, k, v, out, lse, dq, dk, dv, workspace,
                      cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k));
    args.partial_keys = partial_keys;
    check_stream(stream);
    flashcute::BwdPlan plan;
    check_ok(flashcute::plan_bwd(args, plan));
    launch_checked(s, plan, stream);
  });
}

void merge(nb::handle out_a, nb::handle lse_a, nb::handle out_b, nb::handle lse_b, nb::handle out, nb::handle lse,
           int64_t stream, int device, bool check_stream_device) {
  with_source(device, check_stream_device, [&](auto& s) {
    flashcute::MergeArgs args;
    check_ok(merge_args(s, args, out_a, lse_a, out_b, lse_b, out, lse));
    check_stream(stream);
    flashcute::MergePlan plan;
    check_ok(flashcute::plan_merge(args, plan));
    launch_checked(s, plan, stream);
  });
}

// The split-KV workspace is allocated by the caller's framework, on the caller's stream, through
// `workspace_alloc(n)`: a callable that returns a float32 array (or, for descriptors, its
// descriptor) of n elements (torch's caching allocator, CuPy's pool). It is asked only when the
// plan splits the keys. Returns the number of key splits that ran.
int fwd_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out, nb::handle lse, nb::handle k,
                nb::handle v, nb::handle cache_seqlens, nb::handle block_table, nb::handle workspace_alloc,
                nb::handle options, int64_t num_splits, int64_t stream, int device, bool check_stream_device) {
  return with_source(device, check_stream_device, [&](auto& s) {
    flashcute::FwdArgs args;
    check_ok(kvcache_args(s, args, options_from(options), num_splits, q, k_cache, v_cache, out, lse, k, v,
                          cache_seqlens, block_table));
    check_stream(stream);
    args.kvcache->num_sms = flashcute::detail::device_sms(s.device());
    args.kvcache->device = s.device();
    flashcute::FwdPlan plan;
    check_ok(flashcute::plan_fwd(args, plan));
    s.check_devices();
    nb::object workspace;  // alive until the launch has been made
    if (plan.workspace_floats > 0) {
      if (!DlpackArrays::given(workspace_alloc))
        value_error("workspace_alloc: this call splits the keys and needs a float32 workspace of " +
                    std::to_string(plan.workspace_floats) + " elements; pass a callable that allocates one, or "
                    "num_splits=1");
      workspace = nb::borrow(workspace_alloc)(plan.workspace_floats);
      check_ok(flashcute::attach_workspace(plan, s.out("workspace", workspace)));
    }
    launch_checked(s, plan, stream);
    return plan.params.num_splits;
  });
}

// The validation of fwd() alone, for arrays as a tracer (torch.compile's fake tensors, jax.jit)
// sees them: descriptors whose strides may be None (contiguous) and whose data pointer is a
// stand-in; out is made like q. Raises what fwd would; launches nothing.
void check_fwd(nb::handle q, nb::handle k, nb::handle v, nb::handle options, nb::handle cu_seqlens_q,
               nb::handle cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  Descriptors s(0, false);
  flashcute::FwdArgs args;
  check_ok(fwd_args(s, args, options_from(options), q, k, v, q, nb::none(), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k));
  flashcute::FwdPlan plan;
  check_ok(flashcute::plan_fwd(args, plan));
}

// The rules of the plain arguments alone (plan_*'s own), which the Python API checks before it
// looks at the arrays.
void check_options(nb::handle options, int64_t num_splits, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  check_ok(flashcute::detail::check_options(options_from(options)));
  check_ok(flashcute::detail::check_num_splits(num_splits));
  check_ok(flashcute::detail::check_max_seqlens(max_seqlen_q, max_seqlen_k));
}

}  // namespace flashcute_ext
