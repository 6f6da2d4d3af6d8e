// flashcute's XLA FFI handler: the forward as a typed XLA custom call, for JAX.
//
// XLA hands the handler its buffers (contiguous, row-major) and the CUDA stream of the
// computation. The handler reads the buffers through src/ops.hpp's operations (the same code as
// the Python entry points), runs the library's one validation (plan_*) and launches on that stream: no allocation, no synchronisation, no host access to
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

#include "array_ref.hpp"
#include "flashcute/host/api.hpp"
#include "ops.hpp"
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

// XlaBuffers: the array source (src/ops.hpp) of an XLA call's buffers, row-major and contiguous.
struct XlaBuffers {
  using In = const ffi::AnyBuffer*;
  using Out = ffi::Result<ffi::AnyBuffer>*;
  static bool given(const void* buffer) { return buffer != nullptr; }
  flashcute::TensorRef in(const char*, In b) { return ref<flashcute::TensorRef>(*b); }
  flashcute::MutableTensorRef out(const char*, Out b) { return ref<flashcute::MutableTensorRef>(**b); }

  template <class Ref>
  static Ref ref(const ffi::AnyBuffer& b) {
    const auto dims = b.dimensions();
    return flashcute_ext::array_ref<Ref>(b.untyped_data(), to_dtype(b.element_type()),
                                         "a dtype flashcute does not take", int(dims.size()), dims.begin());
  }
};

ffi::Error to_ffi_error(const flashcute::Status& st) {
  if (st.ok()) return ffi::Error::Success();
  const ffi::ErrorCode code = st.code == flashcute::StatusCode::kCudaError     ? ffi::ErrorCode::kInternal
                              : st.code == flashcute::StatusCode::kNotCompiled ? ffi::ErrorCode::kUnimplemented
                                                                               : ffi::ErrorCode::kInvalidArgument;
  return ffi::Error(code, "flashcute: " + st.message);
}

flashcute::AttnOptions options(float softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                               float softcap) {
  flashcute::AttnOptions o;
  o.set_options(softmax_scale, causal, window_left, window_right, softcap);
  return o;
}

// src/ops.hpp's operation, then plan_* and the launch on XLA's stream.
template <class Args, class Plan, class MakeArgs>
ffi::Error run(cudaStream_t stream, MakeArgs&& make_args, flashcute::Status (*plan_call)(const Args&, Plan&)) {
  XlaBuffers s;
  Args args;
  flashcute::Status st = make_args(s, args);
  Plan plan;
  if (st.ok()) st = plan_call(args, plan);
  if (st.ok()) st = flashcute::launch(plan, stream);
  return to_ffi_error(st);
}

ffi::Error fwd_impl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                    ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, float softmax_scale, bool causal,
                    int64_t window_left, int64_t window_right, float softcap) {
  return run(stream, [&](XlaBuffers& s, flashcute::FwdArgs& a) {
    return flashcute_ext::fwd_args(s, a, options(softmax_scale, causal, window_left, window_right, softcap), &q, &k,
                                   &v, &out, &lse, nullptr, nullptr, 0, 0);
  }, &flashcute::plan_fwd);
}

ffi::Error bwd_impl(cudaStream_t stream, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                    ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::Result<ffi::AnyBuffer> dq,
                    ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                    ffi::Result<ffi::AnyBuffer> workspace, float softmax_scale, bool causal, int64_t window_left,
                    int64_t window_right, float softcap, bool deterministic, bool partial_keys) {
  return run(stream, [&](XlaBuffers& s, flashcute::BwdArgs& a) {
    a.partial_keys = partial_keys;
    return flashcute_ext::bwd_args(s, a, options(softmax_scale, causal, window_left, window_right, softcap), deterministic,
                                   &dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv, &workspace, nullptr, nullptr, 0, 0);
  }, &flashcute::plan_bwd);
}

// Variable-length batches (flash_attn_varlen_func): the same calls with cu_seqlens_q and
// cu_seqlens_k (int32 (batch + 1,) device buffers, never read on the host) and the longest lengths.
ffi::Error varlen_fwd_impl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::AnyBuffer cu_q, ffi::AnyBuffer cu_k, ffi::Result<ffi::AnyBuffer> out,
                           ffi::Result<ffi::AnyBuffer> lse, float softmax_scale, bool causal, int64_t window_left,
                           int64_t window_right, float softcap, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  return run(stream, [&](XlaBuffers& s, flashcute::FwdArgs& a) {
    return flashcute_ext::fwd_args(s, a, options(softmax_scale, causal, window_left, window_right, softcap), &q, &k,
                                   &v, &out, &lse, &cu_q, &cu_k, max_seqlen_q, max_seqlen_k);
  }, &flashcute::plan_fwd);
}

ffi::Error varlen_bwd_impl(cudaStream_t stream, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                           ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer cu_q,
                           ffi::AnyBuffer cu_k, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                           ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> workspace, float softmax_scale,
                           bool causal, int64_t window_left, int64_t window_right, float softcap,
                           int64_t max_seqlen_q, int64_t max_seqlen_k, bool deterministic) {
  return run(stream, [&](XlaBuffers& s, flashcute::BwdArgs& a) {
    return flashcute_ext::bwd_args(s, a, options(softmax_scale, causal, window_left, window_right, softcap), deterministic,
                                   &dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv, &workspace, &cu_q, &cu_k,
                                   max_seqlen_q, max_seqlen_k);
  }, &flashcute::plan_bwd);
}

ffi::Error merge_impl(cudaStream_t stream, ffi::AnyBuffer out_a, ffi::AnyBuffer lse_a, ffi::AnyBuffer out_b,
                      ffi::AnyBuffer lse_b, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse) {
  return run(stream, [&](XlaBuffers& s, flashcute::MergeArgs& a) {
    return flashcute_ext::merge_args(s, a, &out_a, &lse_a, &out_b, &lse_b, &out, &lse);
  }, &flashcute::plan_merge);
}

}  // namespace

// Adds kArgs buffer arguments, then kRets (>= 1) buffer results, to a binding. (Binding's move
// constructor is private: each step returns the binding that Arg/Ret makes, never a named one.)
template <int kArgs, int kRets, class Binding>
auto add_buffers(Binding&& binding) {
  static_assert(kRets >= 1);
  if constexpr (kArgs > 0)
    return add_buffers<kArgs - 1, kRets>(std::move(binding).template Arg<ffi::AnyBuffer>());
  else if constexpr (kRets > 1)
    return add_buffers<0, kRets - 1>(std::move(binding).template Ret<ffi::AnyBuffer>());
  else
    return std::move(binding).template Ret<ffi::AnyBuffer>();
}

// A handler's binding: XLA's stream, then kArgs buffer arguments and kRets buffer results, in the
// order of the *_impl function's parameters.
template <int kArgs, int kRets>
auto buffers() {
  return add_buffers<kArgs, kRets>(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>());
}

// The attention options: the same attributes, in the same order, in every attention handler.
template <class Binding>
auto with_options(Binding&& binding) {
  return std::move(binding)
      .template Attr<float>("softmax_scale")
      .template Attr<bool>("causal")
      .template Attr<int64_t>("window_left")
      .template Attr<int64_t>("window_right")
      .template Attr<float>("softcap");
}

// Variable-length calls add the longest lengths after the options.
template <class Binding>
auto with_varlen_options(Binding&& binding) {
  return with_options(std::move(binding)).template Attr<int64_t>("max_seqlen_q").template Attr<int64_t>("max_seqlen_k");
}

// q, k, v -> out, lse
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcute_xla_fwd, fwd_impl, with_options(buffers<3, 2>()),
                              {ffi::Traits::kCmdBufferCompatible});
// dout, q, k, v, out, lse -> dq, dk, dv, workspace (float32, D = rowsum(dout * out)); the options,
// then deterministic and partial_keys (ring attention: k, v are part of the keys out and lse cover)
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcute_xla_bwd, bwd_impl,
                              with_options(buffers<6, 4>()).Attr<bool>("deterministic").Attr<bool>("partial_keys"),
                              {ffi::Traits::kCmdBufferCompatible});
// q (total_q, nheads, headdim), k, v, cu_seqlens_q, cu_seqlens_k -> out, lse (nheads, total_q)
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcute_xla_varlen_fwd, varlen_fwd_impl, with_varlen_options(buffers<5, 2>()),
                              {ffi::Traits::kCmdBufferCompatible});
// dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k -> dq, dk, dv, workspace
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcute_xla_varlen_bwd, varlen_bwd_impl,
                              with_varlen_options(buffers<8, 4>()).Attr<bool>("deterministic"),
                              {ffi::Traits::kCmdBufferCompatible});
// out_a, lse_a, out_b, lse_b -> out, lse
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcute_xla_merge, merge_impl, (buffers<4, 2>()), {ffi::Traits::kCmdBufferCompatible});

std::vector<std::pair<const char*, void*>> flashcute_xla_ffi_handlers() {
  return {{"flashcute_fwd", reinterpret_cast<void*>(flashcute_xla_fwd)},
          {"flashcute_bwd", reinterpret_cast<void*>(flashcute_xla_bwd)},
          {"flashcute_varlen_fwd", reinterpret_cast<void*>(flashcute_xla_varlen_fwd)},
          {"flashcute_varlen_bwd", reinterpret_cast<void*>(flashcute_xla_varlen_bwd)},
          {"flashcute_merge", reinterpret_cast<void*>(flashcute_xla_merge)}};
}
