// src/ext_raw.cpp: the entry points of flashcute._C that take (data_ptr, shape, strides, dtype name)
// descriptors: the torch binding's eager fast path and its ops, with no DLPack export.
#include "ext_common.hpp"

namespace flashcute_ext {

// Arrays whose framework already checked that they live on one CUDA device, `device`; `stream`
// is that framework's current stream of the device (or one the caller named, checked when
// check_stream_device). No DLPack export: the descriptors are built in Python from the arrays'
// own attributes, which costs less per call.
void fwd_raw(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, double softmax_scale,
             bool causal, int64_t window_left, int64_t window_right, double softcap, int device, int64_t stream,
             bool check_stream_device, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
             int64_t max_seqlen_k) {
  std::string labels[7];
  flashcute::FwdArgs args;
  args.q = ref_from_desc<flashcute::TensorRef>("q", q, labels[0]);
  args.k = ref_from_desc<flashcute::TensorRef>("k", k, labels[1]);
  args.v = ref_from_desc<flashcute::TensorRef>("v", v, labels[2]);
  args.out = ref_from_desc<flashcute::MutableTensorRef>("out", out, labels[3]);
  if (lse.is_valid() && !lse.is_none()) args.lse = ref_from_desc<flashcute::MutableTensorRef>("lse", lse, labels[4]);
  args.varlen = varlen_from_desc(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, labels + 5);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
  if (device < 0) value_error("device: expected a CUDA device index >= 0, got " + std::to_string(device));
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  flashcute::FwdPlan plan;
  if (flashcute::Status st = flashcute::plan_fwd(args, plan); !st.ok()) raise_status(st);
  if (!plan.empty) launch_on_device(plan, device, stream, check_stream_device);
}


void bwd_raw(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle dq,
             nb::handle dk, nb::handle dv, nb::handle workspace, double softmax_scale, bool causal,
             int64_t window_left, int64_t window_right, double softcap, bool deterministic, int device,
             int64_t stream, bool check_stream_device, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
             int64_t max_seqlen_q, int64_t max_seqlen_k) {
  std::string labels[12];
  flashcute::BwdArgs args;
  args.dout = ref_from_desc<flashcute::TensorRef>("dout", dout, labels[0]);
  args.q = ref_from_desc<flashcute::TensorRef>("q", q, labels[1]);
  args.k = ref_from_desc<flashcute::TensorRef>("k", k, labels[2]);
  args.v = ref_from_desc<flashcute::TensorRef>("v", v, labels[3]);
  args.out = ref_from_desc<flashcute::TensorRef>("out", out, labels[4]);
  args.lse = ref_from_desc<flashcute::TensorRef>("lse", lse, labels[5]);
  args.dq = ref_from_desc<flashcute::MutableTensorRef>("dq", dq, labels[6]);
  args.dk = ref_from_desc<flashcute::MutableTensorRef>("dk", dk, labels[7]);
  args.dv = ref_from_desc<flashcute::MutableTensorRef>("dv", dv, labels[8]);
  args.workspace = ref_from_desc<flashcute::MutableTensorRef>("workspace", workspace, labels[9]);
  args.varlen = varlen_from_desc(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, labels + 10);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
  if (device < 0) value_error("device: expected a CUDA device index >= 0, got " + std::to_string(device));
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  args.deterministic = deterministic;
  flashcute::BwdPlan plan;
  if (flashcute::Status st = flashcute::plan_bwd(args, plan); !st.ok()) raise_status(st);
  if (!plan.empty) launch_on_device(plan, device, stream, check_stream_device);
}


void merge_raw(nb::handle out_a, nb::handle lse_a, nb::handle out_b, nb::handle lse_b, nb::handle out, nb::handle lse,
               int device, int64_t stream, bool check_stream_device) {
  std::string labels[6];
  flashcute::MergeArgs args;
  args.out_a = ref_from_desc<flashcute::TensorRef>("out_a", out_a, labels[0]);
  args.lse_a = ref_from_desc<flashcute::TensorRef>("lse_a", lse_a, labels[1]);
  args.out_b = ref_from_desc<flashcute::TensorRef>("out_b", out_b, labels[2]);
  args.lse_b = ref_from_desc<flashcute::TensorRef>("lse_b", lse_b, labels[3]);
  args.out = ref_from_desc<flashcute::MutableTensorRef>("out", out, labels[4]);
  args.lse = ref_from_desc<flashcute::MutableTensorRef>("lse", lse, labels[5]);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
  if (device < 0) value_error("device: expected a CUDA device index >= 0, got " + std::to_string(device));
  flashcute::MergePlan plan;
  if (flashcute::Status st = flashcute::plan_merge(args, plan); !st.ok()) raise_status(st);
  if (!plan.empty) launch_on_device(plan, device, stream, check_stream_device);
}

}  // namespace flashcute_ext
