// flashcute/sm80/launch_fwd.hpp: host-side launch of one sm80 forward kernel.
//
// Defines sm80::launch_fwd<dtype, head dim>, which common/launch.hpp declares. A generated
// translation unit includes only this header and instantiates one of them: it must not see the
// dispatch (host/dispatch.hpp), which would instantiate every other kernel of the list too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashcute/common/launch.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/pdl.hpp"
#include "flashcute/common/status.hpp"
#include "flashcute/sm80/config.hpp"
#include "flashcute/sm80/kernel_fwd.hpp"

namespace flashcute::sm80 {

// Launches the forward kernel built from any FwdTraits (tuning tools use this with non-default
// configs). Preconditions: what host::plan_fwd guarantees (valid params, 1 <= batch and nheads
// <= 65535, seqlen_q >= 1) and head_dim <= Traits::kHeadDim; for a KV-cache kernel with
// params.seqlen_new > 0, that the kernel before it on the stream is the append (launch_append_kv):
// it starts before that kernel ends and reads Q, cache_seqlens and the block table before waiting.
template <class Traits>
Status launch_fwd_with(const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmem = Traits::kSmemBytes;
  constexpr auto kernel = &fwd_kernel<Traits>;
  if (Status st = allow_smem<kernel>(kSmem); !st.ok()) return st;
  const int m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const dim3 grid(m_blocks * (Traits::kSplitKv ? params.num_splits : 1), params.nheads, params.batch);
  if constexpr (Traits::kSplitKv) {
    // Right after the append of new keys (host/dispatch.hpp): its dependent (common/pdl.hpp).
    if (params.seqlen_new > 0) {
      const cudaError_t err = launch_dependent<kernel>(grid, dim3(Traits::kNThreads), kSmem, stream, params);
      if (err != cudaSuccess) (void)cudaGetLastError();
      return err == cudaSuccess ? Status::success() : Status::cuda(err, "fwd_kernel (after the append)");
    }
  }
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
  FLASHCUTE_CUDA_CHECK(cudaGetLastError());
  return Status::success();
}

// The kernel of the list (flashcute/build_config.hpp): the tile table's config for kHeadDim.
template <DType kDType, int kHeadDim>
Status launch_fwd(const FwdParams& params, cudaStream_t stream) {
  static_assert(validate(default_fwd_config(kHeadDim)) == nullptr, "no valid sm80 config for this head dim");
  return launch_fwd_with<FwdTraits<kDType, default_fwd_config(kHeadDim)>>(params, stream);
}

}  // namespace flashcute::sm80
