// src/ext_kvcache.cpp: flash_attn_with_kvcache's entry points of flashcute._C, for DLPack arrays
// (fwd_kvcache: CuPy and any producer) and for descriptors (fwd_kvcache_raw: the torch op).
//
// The split-KV workspace is allocated by the caller's framework, on the caller's stream, through
// `workspace_alloc(n)`: a callable that returns a float32 array of n elements (torch's caching
// allocator, CuPy's pool). It is asked only when the plan splits the keys. Both return the number
// of key splits that ran.
#include "ext_common.hpp"

namespace flashcute_ext {

namespace {

// plan_fwd, the workspace, the launch. `attach(n)` gets the workspace for n float32s and attaches
// it to the plan (keeping it alive until the launch has been made).
template <class Attach>
int run_kvcache(flashcute::FwdArgs& args, int device, int64_t stream, bool check_stream_device, Attach&& attach) {
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
  args.kvcache->num_sms = flashcute::detail::device_sms(device);
  flashcute::FwdPlan plan;
  if (flashcute::Status st = flashcute::plan_fwd(args, plan); !st.ok()) raise_status(st);
  attach(plan);
  launch_on_device(plan, device, stream, check_stream_device);
  return plan.params.num_splits;
}

void attach_or_raise(flashcute::FwdPlan& plan, const flashcute::MutableTensorRef& workspace) {
  if (flashcute::Status st = flashcute::attach_workspace(plan, workspace); !st.ok()) raise_status(st);
}

nb::object call_alloc(nb::handle workspace_alloc, int64_t floats) {
  if (!given(workspace_alloc))
    value_error("workspace_alloc: this call splits the keys and needs a float32 workspace of " +
                std::to_string(floats) + " elements; pass a callable that allocates one, or num_splits=1");
  return nb::borrow(workspace_alloc)(floats);
}

}  // namespace

int fwd_kvcache(nb::handle q_obj, nb::handle k_cache_obj, nb::handle v_cache_obj, nb::handle out_obj,
                nb::handle lse_obj, nb::handle k_obj, nb::handle v_obj, nb::handle cache_seqlens_obj,
                nb::handle block_table_obj, nb::handle workspace_alloc, double softmax_scale, bool causal,
                int64_t window_left, int64_t window_right, double softcap, int64_t num_splits, int64_t stream) {
  const Input q = import_input("q", q_obj);
  const Input k_cache = import_input("k_cache", k_cache_obj);
  const Input v_cache = import_input("v_cache", v_cache_obj);
  const Output out = import_output("out", out_obj);
  std::optional<Input> k, v, cache_seqlens, block_table;
  std::optional<Output> lse;
  if (given(lse_obj)) lse = import_output("lse", lse_obj);
  if (given(k_obj)) k = import_input("k", k_obj);
  if (given(v_obj)) v = import_input("v", v_obj);
  if (given(cache_seqlens_obj)) cache_seqlens = import_input("cache_seqlens", cache_seqlens_obj);
  if (given(block_table_obj)) block_table = import_input("block_table", block_table_obj);

  flashcute::FwdArgs args;
  args.q = q.ref;
  args.k = k_cache.ref;
  args.v = v_cache.ref;
  args.out = out.ref;
  if (lse) args.lse = lse->ref;
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  flashcute::KvcacheArgs& kv = args.kvcache.emplace();
  if (k) kv.k_new = k->ref;
  if (v) kv.v_new = v->ref;
  if (cache_seqlens) kv.cache_seqlens = cache_seqlens->ref;
  if (block_table) kv.block_table = block_table->ref;
  kv.num_splits = num_splits;

  check_device("q", q.array, q.array);
  check_device("k_cache", k_cache.array, q.array);
  check_device("v_cache", v_cache.array, q.array);
  check_device("out", out.array, q.array);
  if (lse) check_device("lse", lse->array, q.array);
  if (k) check_device("k", k->array, q.array);
  if (v) check_device("v", v->array, q.array);
  if (cache_seqlens) check_device("cache_seqlens", cache_seqlens->array, q.array);
  if (block_table) check_device("block_table", block_table->array, q.array);

  nb::object ws_obj;
  std::optional<Output> ws;
  return run_kvcache(args, q.array.device_id(), stream, /*check_stream_device=*/true, [&](flashcute::FwdPlan& plan) {
    if (plan.workspace_floats == 0) return;
    ws_obj = call_alloc(workspace_alloc, plan.workspace_floats);
    ws = import_output("workspace", ws_obj);
    check_device("workspace", ws->array, q.array);
    attach_or_raise(plan, ws->ref);
  });
}

int fwd_kvcache_raw(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out, nb::handle lse, nb::handle k,
                    nb::handle v, nb::handle cache_seqlens, nb::handle block_table, nb::handle workspace_alloc,
                    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
                    int64_t num_splits, int device, int64_t stream, bool check_stream_device) {
  std::string labels[10];
  flashcute::FwdArgs args;
  args.q = ref_from_desc<flashcute::TensorRef>("q", q, labels[0]);
  args.k = ref_from_desc<flashcute::TensorRef>("k_cache", k_cache, labels[1]);
  args.v = ref_from_desc<flashcute::TensorRef>("v_cache", v_cache, labels[2]);
  args.out = ref_from_desc<flashcute::MutableTensorRef>("out", out, labels[3]);
  if (given(lse)) args.lse = ref_from_desc<flashcute::MutableTensorRef>("lse", lse, labels[4]);
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  flashcute::KvcacheArgs& kv = args.kvcache.emplace();
  if (given(k)) kv.k_new = ref_from_desc<flashcute::TensorRef>("k", k, labels[5]);
  if (given(v)) kv.v_new = ref_from_desc<flashcute::TensorRef>("v", v, labels[6]);
  if (given(cache_seqlens)) kv.cache_seqlens = ref_from_desc<flashcute::TensorRef>("cache_seqlens", cache_seqlens, labels[7]);
  if (given(block_table)) kv.block_table = ref_from_desc<flashcute::TensorRef>("block_table", block_table, labels[8]);
  kv.num_splits = num_splits;
  if (device < 0) value_error("device: expected a CUDA device index >= 0, got " + std::to_string(device));

  nb::object ws_obj;
  return run_kvcache(args, device, stream, check_stream_device, [&](flashcute::FwdPlan& plan) {
    if (plan.workspace_floats == 0) return;
    ws_obj = call_alloc(workspace_alloc, plan.workspace_floats);  // a descriptor, like the arrays'
    attach_or_raise(plan, ref_from_desc<flashcute::MutableTensorRef>("workspace", ws_obj, labels[9]));
  });
}

}  // namespace flashcute_ext
