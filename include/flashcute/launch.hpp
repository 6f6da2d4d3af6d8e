// flashcute/launch.hpp: host-side launch of one forward instantiation.
//
// Deliberately independent of api.hpp: a translation unit that explicitly
// instantiates one launch_fwd must not see run_fwd, whose dispatch would
// implicitly instantiate every other kernel too.
#pragma once

#include <cuda_runtime_api.h>

#include "flashcute/config.hpp"
#include "flashcute/kernel_fwd.hpp"
#include "flashcute/params.hpp"
#include "flashcute/status.hpp"

namespace flashcute {

// Launches the forward kernel built from any FwdTraits (tuning tools use this
// with non-default configs). Preconditions as for launch_fwd.
template <class Traits>
Status launch_fwd_with(const FwdParams& params, cudaStream_t stream) {
  if (params.head_dim > Traits::kHeadDim) return Status::invalid("head_dim exceeds this kernel's head dim");
  if (params.nheads > 65535 || params.batch > 65535) return Status::invalid("nheads and batch must be <= 65535");

  constexpr int kSmem = Traits::kSmemBytes;
  auto kernel = &fwd_kernel<Traits>;
  if constexpr (kSmem > 48 * 1024) {
    // Per-device function attribute; cheap enough to set on every launch.
    FLASHCUTE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  }
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.nheads, params.batch);
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
  FLASHCUTE_CUDA_CHECK(cudaGetLastError());
  return Status::success();
}

// The instantiation run_fwd dispatches to: the default config of kHeadDim.
template <DType kDType, int kHeadDim>
Status launch_fwd(const FwdParams& params, cudaStream_t stream) {
  return launch_fwd_with<FwdTraits<kDType, default_fwd_config(kHeadDim)>>(params, stream);
}

}  // namespace flashcute
