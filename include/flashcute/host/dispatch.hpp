// flashcute/host/dispatch.hpp: from a FwdPlan's KernelKey to the one compiled kernel that runs it.
//
// The switch is generated from the list itself (kCompiledKernels in flashcute/build_config.hpp):
// one comparison per compiled kernel, each calling that kernel's launch function, so a kernel the
// build left out is never referenced. Needs only the CUDA runtime headers.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "flashcute/common/status.hpp"
#include "flashcute/host/kernels.hpp"
#include "flashcute/host/validate_fwd.hpp"

namespace flashcute {

namespace detail {

template <KernelKey kKey>
Status launch_kernel(const FwdParams& params, cudaStream_t stream) {
  static_assert(kKey.direction == Direction::kFwd);
  if constexpr (kKey.arch == Arch::kSm80) return sm80::launch_fwd<kKey.dtype, kKey.head_dim>(params, stream);
}

template <std::size_t... I>
Status launch_listed(const KernelKey& key, const FwdParams& params, cudaStream_t stream, std::index_sequence<I...>) {
  Status status;
  const bool found = ((kCompiledKernels[I].direction == Direction::kFwd && kCompiledKernels[I] == key &&
                       (status = launch_kernel<kCompiledKernels[I]>(params, stream), true)) ||
                      ...);
  if (!found)  // plan_fwd only picks compiled kernels: a plan made by hand can get here
    return Status::invalid(StatusCode::kNotCompiled, "q", "a compiled kernel", "none",
                           "flashcute: no kernel for this dtype and head dim was compiled into this build");
  return status;
}

}  // namespace detail

// Launches a plan from plan_fwd() on `stream`. Never synchronises; an empty plan launches nothing.
inline Status launch(const FwdPlan& plan, cudaStream_t stream) {
  if (plan.empty) return Status::success();
  Status st = detail::launch_listed(plan.kernel, plan.params, stream, std::make_index_sequence<kNumCompiledKernels>{});
  if (st.cuda_error == cudaErrorNoKernelImageForDevice || st.cuda_error == cudaErrorInvalidDeviceFunction)
    st.message += std::string("; this build has kernels for compute capabilities ") + kBuildCudaArchs +
                  " (build option FLASHCUTE_CUDA_ARCHS): rebuild it for this GPU";
  return st;
}

}  // namespace flashcute
