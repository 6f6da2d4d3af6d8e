// flashcute/sm90/kernel_fwd.hpp: the sm90a forward attention kernel (wgmma + TMA, warp-specialised).
//
// A CTA computes BLK_M x D tiles of O, each for one (batch, head): one tile, or, persistent, the
// tiles the scheduler deals it (scheduler.hpp; launch_fwd.hpp chooses). The kernel only wires the
// roles together:
// - warpgroup 0, the producer, gives most of its registers away and one thread issues every TMA
//   load (FwdMainloop::load, mainloop_fwd.hpp), but a KV cache's V, which a second thread loads;
// - the other warpgroups, the consumers, 64 query rows each, run the GEMMs and the softmax
//   (FwdMma), masked by FwdMask (mask.hpp), then store O and the lse (FwdEpilogue,
//   epilogue_fwd.hpp).
// Blocks are walked from the last to the first, so the ragged and diagonal blocks, the ones that
// need a mask, come first, as in the sm80 kernel. The varlen kernel (Traits::kVarlen) is the same
// with each tile's sequence read from cu_seqlens (TileScheduler::at, WorkTile).
//
// Built only for sm_90a (wgmma and setmaxnreg exist nowhere else); the body is empty on any
// other target, and the host dispatch never launches it there.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "flashcute/common/mask.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/sm90/epilogue_fwd.hpp"
#include "flashcute/sm90/mainloop_fwd.hpp"
#include "flashcute/sm90/mask.hpp"
#include "flashcute/sm90/scheduler.hpp"
#include "flashcute/sm90/traits.hpp"

namespace flashcute::sm90 {

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) fwd_kernel(__grid_constant__ const FwdKernelParams<Traits> kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Mainloop = FwdMainloop<Traits>;
  static_assert(Traits::kNThreads == 128 * (1 + Traits::kConsumerWarpgroups), "one producer warpgroup");
  static_assert(Traits::kQStages == 1 || Traits::kQStages == 2, "one or two Q buffers");
  extern __shared__ __align__(1024) char smem_buf[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem_buf);
  const FwdParams& params = kp.params;
  const KeyMask keys{params.seqlen_k, params.seqlen_k - params.seqlen_q, params.window_left, params.window_right};
  const TileScheduler<Traits::kBlockM, Traits::kBlockN, Traits::kFwdMode> scheduler(kp.schedule, params, kp.div_heads,
                                                                                    keys, blockIdx.x, gridDim.x);

  if (threadIdx.x == 0) Mainloop::init_barriers(storage);
  cutlass::arch::fence_barrier_init();
  __syncthreads();  // the barriers are initialised before any thread waits on or arrives at them
  const Mainloop mainloop(kp, storage);
  const int warp_group = cutlass::canonical_warp_group_idx();

  if (warp_group == 0) {
    // Producer. Registers go to the consumers; one thread issues every load, but a KV cache's V
    // (warp 1's thread: its paged blocks are many TMA boxes).
    cutlass::arch::warpgroup_reg_dealloc<Traits::kConfig.producer_regs>();
    const int warp = cutlass::canonical_warp_idx_sync();
    if (warp > (Traits::kKvcache ? 1 : 0) || !cute::elect_one_sync()) return;
    typename Mainloop::QState q;
    typename Mainloop::KvState kv;
    uint32_t fix_phase = 0;
    if constexpr (Traits::kFwdMode == FwdMode::kVarlenMixed) {  // a walk that decodes as it steps (at_varlen)
      for (WorkTile tile = scheduler.first(); !scheduler.done(tile); tile = scheduler.next(tile))
        if (tile.has_keys()) mainloop.load(tile, tile.sequence(), q, kv, fix_phase);
    } else {
      for (WorkTile pos = scheduler.start(); !scheduler.done(pos); scheduler.step(pos)) {
        const WorkTile tile = scheduler.at(pos.u, pos.j);
        if (!tile.valid || !tile.has_keys()) continue;
        if constexpr (Traits::kKvcache) {
          if (warp == 1) {
            mainloop.load_cache_v(tile, tile.sequence(), kv, fix_phase);
            continue;
          }
        }
        mainloop.load(tile, tile.sequence(), q, kv, fix_phase);
      }
    }
    return;
  }

  // Consumers: 64 query rows per warpgroup.
  cutlass::arch::warpgroup_reg_alloc<Traits::kConfig.consumer_regs>();
  const int mma_tid = int(threadIdx.x) - 128;
  const FwdMask<Traits> mask{keys, params.seqlen_q, warp_group - 1};
  const FwdEpilogue<Traits> epilogue{storage, params, warp_group - 1, mma_tid};
  FwdMma<Traits>{mainloop, mask, mma_tid}.run(scheduler, epilogue);
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace flashcute::sm90
