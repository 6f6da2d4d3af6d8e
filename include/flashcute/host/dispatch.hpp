// flashcute/host/dispatch.hpp: from a FwdPlan's KernelKey to the one compiled kernel that runs it.
//
// The switch is generated from the list itself (kCompiledKernels in flashcute/build_config.hpp):
// one comparison per compiled kernel, each calling that kernel's launch function, so a kernel the
// build left out is never referenced. Needs only the CUDA runtime headers.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>
#include <utility>

#include "flashcute/common/status.hpp"
#include "flashcute/host/kernels.hpp"
#include "flashcute/host/validate_bwd.hpp"
#include "flashcute/host/validate_fwd.hpp"

namespace flashcute {

namespace detail {

// Params is FwdParams or BwdParams: the direction of the kernels it selects.
template <class Params>
inline constexpr Direction kDirectionOf = std::is_same_v<Params, BwdParams> ? Direction::kBwd : Direction::kFwd;

template <KernelKey kKey, class Params>
Status launch_kernel(const Params& params, cudaStream_t stream) {
  static_assert(kKey.direction == kDirectionOf<Params>);
  if constexpr (kKey.direction == Direction::kFwd) return sm80::launch_fwd<kKey.dtype, kKey.head_dim>(params, stream);
  else return sm80::launch_bwd<kKey.dtype, kKey.head_dim>(params, stream);
}

template <class Params, std::size_t... I>
Status launch_listed(const KernelKey& key, const Params& params, cudaStream_t stream, std::index_sequence<I...>) {
  Status status;
  // Only the kernels of Params' direction are referenced: an if constexpr per list entry.
  auto try_one = [&](auto index) {
    constexpr KernelKey kKey = kCompiledKernels[decltype(index)::value];
    if constexpr (kKey.direction == kDirectionOf<Params>) {
      if (kKey == key) {
        status = launch_kernel<kKey>(params, stream);
        return true;
      }
    }
    return false;
  };
  const bool found = (try_one(std::integral_constant<std::size_t, I>{}) || ...);
  if (!found)  // plan_fwd only picks compiled kernels: a plan made by hand can get here
    return Status::invalid(StatusCode::kNotCompiled, "q", "a compiled kernel", "none",
                           "flashcute: no kernel for this dtype and head dim was compiled into this build");
  return status;
}

}  // namespace detail

// Launches a plan from plan_fwd() or plan_bwd() on `stream`. Never synchronises; an empty plan
// launches nothing.
template <class Plan>
Status launch(const Plan& plan, cudaStream_t stream) {
  if (plan.empty) return Status::success();
  Status st = detail::launch_listed(plan.kernel, plan.params, stream, std::make_index_sequence<kNumCompiledKernels>{});
  if (st.cuda_error == cudaErrorNoKernelImageForDevice || st.cuda_error == cudaErrorInvalidDeviceFunction)
    st.message += std::string("; this build has kernels for compute capabilities ") + kBuildCudaArchs +
                  " (build option FLASHCUTE_CUDA_ARCHS): rebuild it for this GPU";
  return st;
}

}  // namespace flashcute
