// flashcute's XLA FFI handler: the forward as a typed XLA custom call, for JAX.
//
// XLA hands the handler its buffers (contiguous, row-major) and the CUDA stream of the
// computation. The handler describes the buffers as TensorRefs, runs the library's one validation
// (plan_fwd) and launches on that stream: no allocation, no synchronisation, no host access to
// device data, so XLA may record it into a command buffer (CUDA graph). Errors come back as
// ffi::Error, never as exceptions. python/flashcute/_jax.py registers it ("flashcute_fwd",
// platform "CUDA") and calls it with jax.ffi.ffi_call.
//
// Built into flashcute._C when CMake finds XLA's FFI headers (cmake/FlashcuteXlaFfi.cmake);
// jaxlib ships them (jax.ffi.include_dir()). Nothing of JAX is linked.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashcute/host/api.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

flashcute::DType to_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F16: return flashcute::DType::kFloat16;
    case ffi::DataType::BF16: return flashcute::DType::kBFloat16;
    case ffi::DataType::F32: return flashcute::DType::kFloat32;
    case ffi::DataType::S32: return flashcute::DType::kInt32;
    default: return flashcute::DType::kOther;
  }
}

// An XLA buffer: row-major, contiguous.
template <class Ref>
Ref describe(const ffi::AnyBuffer& buffer) {
  Ref r;
  r.data = buffer.untyped_data();
  r.dtype = to_dtype(buffer.element_type());
  r.dtype_label = "a dtype flashcute does not take";
  const auto dims = buffer.dimensions();
  r.rank = int(dims.size());
  int64_t stride = 1;
  for (int i = std::min(r.rank, flashcute::TensorRef::kMaxRank) - 1; i >= 0; --i) {
    r.shape[i] = dims[size_t(i)];
    r.stride[i] = stride;
    stride *= dims[size_t(i)] > 1 ? dims[size_t(i)] : 1;
  }
  return r;
}

ffi::Error to_ffi_error(const flashcute::Status& st) {
  if (st.ok()) return ffi::Error::Success();
  const ffi::ErrorCode code = st.code == flashcute::StatusCode::kCudaError     ? ffi::ErrorCode::kInternal
                              : st.code == flashcute::StatusCode::kNotCompiled ? ffi::ErrorCode::kUnimplemented
                                                                               : ffi::ErrorCode::kInvalidArgument;
  return ffi::Error(code, "flashcute: " + st.message);
}

// The forward of a fixed-length or (varlen set) variable-length call.
ffi::Error run_fwd_call(cudaStream_t stream, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                        const ffi::AnyBuffer& v, ffi::Result<ffi::AnyBuffer>& out, ffi::Result<ffi::AnyBuffer>& lse,
                        float softmax_scale, bool causal, int64_t window_left, int64_t window_right, float softcap,
                        std::optional<flashcute::VarlenArgs> varlen) {
  flashcute::FwdArgs args;
  args.q = describe<flashcute::TensorRef>(q);
  args.k = describe<flashcute::TensorRef>(k);
  args.v = describe<flashcute::TensorRef>(v);
  args.out = describe<flashcute::MutableTensorRef>(*out);
  args.lse = describe<flashcute::MutableTensorRef>(*lse);
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  args.varlen = varlen;
  flashcute::FwdPlan plan;
  flashcute::Status st = flashcute::plan_fwd(args, plan);
  if (st.ok()) st = flashcute::launch(plan, stream);
  return to_ffi_error(st);
}

// The backward of a fixed-length or (varlen set) variable-length call.
ffi::Error run_bwd_call(cudaStream_t stream, const ffi::AnyBuffer& dout, const ffi::AnyBuffer& q,
                        const ffi::AnyBuffer& k, const ffi::AnyBuffer& v, const ffi::AnyBuffer& out,
                        const ffi::AnyBuffer& lse, ffi::Result<ffi::AnyBuffer>& dq, ffi::Result<ffi::AnyBuffer>& dk,
                        ffi::Result<ffi::AnyBuffer>& dv, ffi::Result<ffi::AnyBuffer>& workspace, float softmax_scale,
                        bool causal, int64_t window_left, int64_t window_right, float softcap,
                        std::optional<flashcute::VarlenArgs> varlen) {
  flashcute::BwdArgs args;
  args.dout = describe<flashcute::TensorRef>(dout);
  args.q = describe<flashcute::TensorRef>(q);
  args.k = describe<flashcute::TensorRef>(k);
  args.v = describe<flashcute::TensorRef>(v);
  args.out = describe<flashcute::TensorRef>(out);
  args.lse = describe<flashcute::TensorRef>(lse);
  args.dq = describe<flashcute::MutableTensorRef>(*dq);
  args.dk = describe<flashcute::MutableTensorRef>(*dk);
  args.dv = describe<flashcute::MutableTensorRef>(*dv);
  args.workspace = describe<flashcute::MutableTensorRef>(*workspace);
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  args.varlen = varlen;
  flashcute::BwdPlan plan;
  flashcute::Status st = flashcute::plan_bwd(args, plan);
  if (st.ok()) st = flashcute::launch(plan, stream);
  return to_ffi_error(st);
}

ffi::Error fwd_impl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                    ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, float softmax_scale, bool causal,
                    int64_t window_left, int64_t window_right, float softcap) {
  return run_fwd_call(stream, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
                      std::nullopt);
}

ffi::Error bwd_impl(cudaStream_t stream, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                    ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::Result<ffi::AnyBuffer> dq,
                    ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                    ffi::Result<ffi::AnyBuffer> workspace, float softmax_scale, bool causal, int64_t window_left,
                    int64_t window_right, float softcap) {
  return run_bwd_call(stream, dout, q, k, v, out, lse, dq, dk, dv, workspace, softmax_scale, causal, window_left,
                      window_right, softcap, std::nullopt);
}

// Variable-length batches (flash_attn_varlen_func): the same calls with cu_seqlens_q and
// cu_seqlens_k (int32 (batch + 1,) device buffers, never read on the host) and the longest lengths.
flashcute::VarlenArgs varlen_args(const ffi::AnyBuffer& cu_q, const ffi::AnyBuffer& cu_k, int64_t max_q,
                                  int64_t max_k) {
  return flashcute::VarlenArgs{describe<flashcute::TensorRef>(cu_q), describe<flashcute::TensorRef>(cu_k), max_q,
                               max_k};
}

ffi::Error varlen_fwd_impl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::AnyBuffer cu_q, ffi::AnyBuffer cu_k, ffi::Result<ffi::AnyBuffer> out,
                           ffi::Result<ffi::AnyBuffer> lse, float softmax_scale, bool causal, int64_t window_left,
                           int64_t window_right, float softcap, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  return run_fwd_call(stream, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
                      varlen_args(cu_q, cu_k, max_seqlen_q, max_seqlen_k));
}

ffi::Error varlen_bwd_impl(cudaStream_t stream, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                           ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer cu_q,
                           ffi::AnyBuffer cu_k, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                           ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> workspace, float softmax_scale,
                           bool causal, int64_t window_left, int64_t window_right, float softcap,
                           int64_t max_seqlen_q, int64_t max_seqlen_k) {
  return run_bwd_call(stream, dout, q, k, v, out, lse, dq, dk, dv, workspace, softmax_scale, causal, window_left,
                      window_right, softcap, varlen_args(cu_q, cu_k, max_seqlen_q, max_seqlen_k));
}

ffi::Error merge_impl(cudaStream_t stream, ffi::AnyBuffer out_a, ffi::AnyBuffer lse_a, ffi::AnyBuffer out_b,
                      ffi::AnyBuffer lse_b, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse) {
  flashcute::MergeArgs args;
  args.out_a = describe<flashcute::TensorRef>(out_a);
  args.lse_a = describe<flashcute::TensorRef>(lse_a);
  args.out_b = describe<flashcute::TensorRef>(out_b);
  args.lse_b = describe<flashcute::TensorRef>(lse_b);
  args.out = describe<flashcute::MutableTensorRef>(*out);
  args.lse = describe<flashcute::MutableTensorRef>(*lse);
  return to_ffi_error(flashcute::run_merge(args, stream));
}

}  // namespace

// The attention options: the same attributes, in the same order, in every attention handler.
template <class Binding>
auto with_options(Binding binding) {
  return std::move(binding)
      .template Attr<float>("softmax_scale")
      .template Attr<bool>("causal")
      .template Attr<int64_t>("window_left")
      .template Attr<int64_t>("window_right")
      .template Attr<float>("softcap");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcute_xla_merge, merge_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // out_a
                                  .Arg<ffi::AnyBuffer>()  // lse_a
                                  .Arg<ffi::AnyBuffer>()  // out_b
                                  .Arg<ffi::AnyBuffer>()  // lse_b
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>(),  // lse
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcute_xla_varlen_fwd, varlen_fwd_impl,
                              with_options(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // q (total_q, nheads, headdim)
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens_q
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens_k
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>())  // lse (nheads, total_q)
                                  .Attr<int64_t>("max_seqlen_q")
                                  .Attr<int64_t>("max_seqlen_k"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcute_xla_varlen_bwd, varlen_bwd_impl,
                              with_options(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // dout
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // out
                                  .Arg<ffi::AnyBuffer>()  // lse
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens_q
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens_k
                                  .Ret<ffi::AnyBuffer>()  // dq
                                  .Ret<ffi::AnyBuffer>()  // dk
                                  .Ret<ffi::AnyBuffer>()  // dv
                                  .Ret<ffi::AnyBuffer>())  // workspace
                                  .Attr<int64_t>("max_seqlen_q")
                                  .Attr<int64_t>("max_seqlen_k"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcute_xla_bwd, bwd_impl,
                              with_options(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // dout
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // out
                                  .Arg<ffi::AnyBuffer>()  // lse
                                  .Ret<ffi::AnyBuffer>()  // dq
                                  .Ret<ffi::AnyBuffer>()  // dk
                                  .Ret<ffi::AnyBuffer>()  // dv
                                  .Ret<ffi::AnyBuffer>()),  // workspace (float32, D = rowsum(dout * out))
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcute_xla_fwd, fwd_impl,
                              with_options(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()),  // lse
                              {ffi::Traits::kCmdBufferCompatible});

std::vector<std::pair<const char*, void*>> flashcute_xla_ffi_handlers() {
  return {{"flashcute_fwd", reinterpret_cast<void*>(flashcute_xla_fwd)},
          {"flashcute_bwd", reinterpret_cast<void*>(flashcute_xla_bwd)},
          {"flashcute_varlen_fwd", reinterpret_cast<void*>(flashcute_xla_varlen_fwd)},
          {"flashcute_varlen_bwd", reinterpret_cast<void*>(flashcute_xla_varlen_bwd)},
          {"flashcute_merge", reinterpret_cast<void*>(flashcute_xla_merge)}};
}
