// flashcute/sm80/launch_bwd.hpp: host-side launch of one sm80 backward pass (three kernels).
//
// Defines sm80::launch_bwd<dtype, head dim>, which common/launch.hpp declares; a generated
// translation unit instantiates one (see launch_fwd.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "flashcute/common/launch.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/status.hpp"
#include "flashcute/sm80/config_bwd.hpp"
#include "flashcute/sm80/kernel_bwd.hpp"

namespace flashcute::sm80 {

namespace detail {

template <class Traits, int... kParts>
Status launch_dkdv_parts(const BwdParams& params, cudaStream_t stream, std::integer_sequence<int, kParts...>) {
  constexpr int kSmem = Traits::kKvSmemBytes;
  const dim3 grid((params.seqlen_k + Traits::kKvBlockN - 1) / Traits::kKvBlockN, params.nheads_k, params.batch);
  Status st;
  // One launch per head-dim part: each is its own kernel, with the part's columns known statically.
  const bool ok = ([&] {
    constexpr auto kernel = &bwd_dkdv_kernel<Traits, kParts>;
    st = allow_smem<kernel>(kSmem);
    if (!st.ok()) return false;
    kernel<<<grid, Traits::kKvThreads, kSmem, stream>>>(params);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) st = Status::cuda(err, "bwd_dkdv_kernel<<<...>>>");
    return err == cudaSuccess;
  }() && ...);
  return ok ? Status::success() : st;
}

}  // namespace detail

// Launches the backward built from any BwdTraits. Preconditions: what host::plan_bwd guarantees
// (valid params, batch and heads <= 65535, seqlen_q >= 1 or seqlen_k >= 1) and head_dim <= Traits::kHeadDim.
template <class Traits>
Status launch_bwd_with(const BwdParams& params, cudaStream_t stream) {
  using Element = typename Traits::Element;
  if (params.seqlen_q > 0) {
    const dim3 grid((params.seqlen_q + 63) / 64, params.nheads, params.batch);
    bwd_dsum_kernel<Element><<<grid, 256, 0, stream>>>(params);
    FLASHCUTE_CUDA_CHECK(cudaGetLastError());
  }
  if (params.seqlen_k > 0) {
    Status st = detail::launch_dkdv_parts<Traits>(params, stream, std::make_integer_sequence<int, Traits::kDSplit>{});
    if (!st.ok()) return st;
  }
  if (params.seqlen_q > 0) {
    constexpr int kSmem = Traits::kQSmemBytes;
    constexpr auto kernel = &bwd_dq_kernel<Traits>;
    if (Status st = allow_smem<kernel>(kSmem); !st.ok()) return st;
    const dim3 grid((params.seqlen_q + Traits::kQBlockM - 1) / Traits::kQBlockM, params.nheads, params.batch);
    kernel<<<grid, Traits::kQThreads, kSmem, stream>>>(params);
    FLASHCUTE_CUDA_CHECK(cudaGetLastError());
  }
  return Status::success();
}

// The backward of the list (flashcute/build_config.hpp): the tile table's config for kHeadDim.
template <DType kDType, int kHeadDim>
Status launch_bwd(const BwdParams& params, cudaStream_t stream) {
  static_assert(validate_bwd(default_bwd_config(kHeadDim)) == nullptr, "no valid sm80 backward config for this head dim");
  return launch_bwd_with<BwdTraits<kDType, default_bwd_config(kHeadDim)>>(params, stream);
}

}  // namespace flashcute::sm80
