// src/ext_dlpack.cpp: the entry points of flashcute._C that take DLPack arrays (CuPy and any other
// producer; nanobind imports them), and the validation alone for tracers (check_fwd).
#include "ext_common.hpp"

namespace flashcute_ext {

// ---------------------------------------------------------------------------
// fwd
// ---------------------------------------------------------------------------

void fwd(nb::handle q_obj, nb::handle k_obj, nb::handle v_obj, nb::handle out_obj, nb::handle lse_obj,
         double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
         int64_t stream, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
         int64_t max_seqlen_k) {
  // 1. Import. Nothing here touches the device.
  const Input q = import_input("q", q_obj);
  const Input k = import_input("k", k_obj);
  const Input v = import_input("v", v_obj);
  const Output out = import_output("out", out_obj);
  std::optional<Output> lse;
  if (lse_obj.is_valid() && !lse_obj.is_none()) lse = import_output("lse", lse_obj);
  const VarlenInputs varlen(cu_seqlens_q, cu_seqlens_k);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));

  // 2. The library's validation.
  flashcute::FwdArgs args;
  args.q = q.ref;
  args.k = k.ref;
  args.v = v.ref;
  args.out = out.ref;
  if (lse) args.lse = lse->ref;
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  args.varlen = varlen.args(max_seqlen_q, max_seqlen_k);
  flashcute::FwdPlan plan;
  if (flashcute::Status st = flashcute::plan_fwd(args, plan); !st.ok()) raise_status(st);

  // 3. Devices, last.
  check_device("q", q.array, q.array);
  check_device("k", k.array, q.array);
  check_device("v", v.array, q.array);
  check_device("out", out.array, q.array);
  if (lse) check_device("lse", lse->array, q.array);
  varlen.check_devices(q.array);
  if (plan.empty) return;

  // 4. Launch.
  launch_on_device(plan, q.array.device_id(), stream, /*check_stream_device=*/true);
}


// ---------------------------------------------------------------------------
// bwd, bwd_raw: the backward pass (DLPack arrays / plain descriptors)
// ---------------------------------------------------------------------------

void bwd(nb::handle dout_obj, nb::handle q_obj, nb::handle k_obj, nb::handle v_obj, nb::handle out_obj,
         nb::handle lse_obj, nb::handle dq_obj, nb::handle dk_obj, nb::handle dv_obj, nb::handle workspace_obj,
         double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
         bool deterministic, int64_t stream, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
         int64_t max_seqlen_q, int64_t max_seqlen_k) {
  const Input dout = import_input("dout", dout_obj);
  const Input q = import_input("q", q_obj);
  const Input k = import_input("k", k_obj);
  const Input v = import_input("v", v_obj);
  const Input out = import_input("out", out_obj);
  const Input lse = import_input("lse", lse_obj);
  const Output dq = import_output("dq", dq_obj);
  const Output dk = import_output("dk", dk_obj);
  const Output dv = import_output("dv", dv_obj);
  const Output workspace = import_output("workspace", workspace_obj);
  const VarlenInputs varlen(cu_seqlens_q, cu_seqlens_k);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));

  flashcute::BwdArgs args;
  args.dout = dout.ref;
  args.q = q.ref;
  args.k = k.ref;
  args.v = v.ref;
  args.out = out.ref;
  args.lse = lse.ref;
  args.dq = dq.ref;
  args.dk = dk.ref;
  args.dv = dv.ref;
  args.workspace = workspace.ref;
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  args.deterministic = deterministic;
  args.varlen = varlen.args(max_seqlen_q, max_seqlen_k);
  flashcute::BwdPlan plan;
  if (flashcute::Status st = flashcute::plan_bwd(args, plan); !st.ok()) raise_status(st);

  varlen.check_devices(q.array);
  check_device("dout", dout.array, q.array);
  check_device("q", q.array, q.array);
  check_device("k", k.array, q.array);
  check_device("v", v.array, q.array);
  check_device("out", out.array, q.array);
  check_device("lse", lse.array, q.array);
  check_device("dq", dq.array, q.array);
  check_device("dk", dk.array, q.array);
  check_device("dv", dv.array, q.array);
  check_device("workspace", workspace.array, q.array);
  if (plan.empty) return;
  launch_on_device(plan, q.array.device_id(), stream, /*check_stream_device=*/true);
}


// ---------------------------------------------------------------------------
// merge, merge_raw: merge_attn_states (DLPack arrays / plain descriptors)
// ---------------------------------------------------------------------------

void merge(nb::handle out_a_obj, nb::handle lse_a_obj, nb::handle out_b_obj, nb::handle lse_b_obj, nb::handle out_obj,
           nb::handle lse_obj, int64_t stream) {
  const Input out_a = import_input("out_a", out_a_obj);
  const Input lse_a = import_input("lse_a", lse_a_obj);
  const Input out_b = import_input("out_b", out_b_obj);
  const Input lse_b = import_input("lse_b", lse_b_obj);
  const Output out = import_output("out", out_obj);
  const Output lse = import_output("lse", lse_obj);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
  flashcute::MergeArgs args{out_a.ref, lse_a.ref, out_b.ref, lse_b.ref, out.ref, lse.ref};
  flashcute::MergePlan plan;
  if (flashcute::Status st = flashcute::plan_merge(args, plan); !st.ok()) raise_status(st);
  check_device("out_a", out_a.array, out_a.array);
  check_device("lse_a", lse_a.array, out_a.array);
  check_device("out_b", out_b.array, out_a.array);
  check_device("lse_b", lse_b.array, out_a.array);
  check_device("out", out.array, out_a.array);
  check_device("lse", lse.array, out_a.array);
  if (plan.empty) return;
  launch_on_device(plan, out_a.array.device_id(), stream, /*check_stream_device=*/true);
}


// The validation alone, for contiguous arrays of the given shapes and dtype names, as a tracer
// (torch.compile's fake tensors, jax.jit) sees them: raises what fwd would, launches nothing.
void check_fwd(std::vector<int64_t> q_shape, std::vector<int64_t> k_shape, std::vector<int64_t> v_shape,
               std::string q_dtype, std::string k_dtype, std::string v_dtype, double softmax_scale, bool causal,
               int64_t window_left, int64_t window_right, double softcap,
               std::optional<std::vector<int64_t>> cu_seqlens_q_shape, std::optional<std::vector<int64_t>> cu_seqlens_k_shape,
               std::string cu_seqlens_q_dtype, std::string cu_seqlens_k_dtype, int64_t max_seqlen_q,
               int64_t max_seqlen_k) {
  // Never dereferenced: 256-byte aligned stand-ins for the buffers a framework will allocate.
  auto contiguous = [](const void* data, const std::vector<int64_t>& shape, const std::string& dtype) {
    flashcute::TensorRef r;
    r.data = data;
    r.rank = int(shape.size());
    int64_t stride = 1;
    for (int i = std::min(r.rank, flashcute::TensorRef::kMaxRank) - 1; i >= 0; --i) {
      r.shape[i] = shape[size_t(i)];
      r.stride[i] = stride;
      stride *= std::max<int64_t>(shape[size_t(i)], 1);
    }
    r.dtype = dtype_from_name(dtype);
    return r;
  };
  const void* fake = reinterpret_cast<const void*>(std::uintptr_t{256});
  flashcute::FwdArgs args;
  args.q = contiguous(fake, q_shape, q_dtype);
  args.q.dtype_label = q_dtype.c_str();
  args.k = contiguous(fake, k_shape, k_dtype);
  args.k.dtype_label = k_dtype.c_str();
  args.v = contiguous(fake, v_shape, v_dtype);
  args.v.dtype_label = v_dtype.c_str();
  static_cast<flashcute::TensorRef&>(args.out) = contiguous(fake, q_shape, q_dtype);  // made like q
  args.out.dtype_label = q_dtype.c_str();
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  if (cu_seqlens_q_shape.has_value() != cu_seqlens_k_shape.has_value())
    value_error("cu_seqlens_k: a variable-length call takes both cu_seqlens_q and cu_seqlens_k");
  if (cu_seqlens_q_shape) {
    flashcute::VarlenArgs vl{contiguous(fake, *cu_seqlens_q_shape, cu_seqlens_q_dtype),
                             contiguous(fake, *cu_seqlens_k_shape, cu_seqlens_k_dtype), max_seqlen_q, max_seqlen_k};
    vl.cu_seqlens_q.dtype_label = cu_seqlens_q_dtype.c_str();
    vl.cu_seqlens_k.dtype_label = cu_seqlens_k_dtype.c_str();
    args.varlen = vl;
  }
  flashcute::FwdPlan plan;
  if (flashcute::Status st = flashcute::plan_fwd(args, plan); !st.ok()) raise_status(st);
}

}  // namespace flashcute_ext
