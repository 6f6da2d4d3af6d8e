// flashcute/sm90/kernel_fwd.hpp: the sm90a forward attention kernel (wgmma + TMA, warp-specialised).
//
// The kernel only wires the roles together:
// - the scheduler (scheduler.hpp, TileWalk): which tiles of (m_block, head, batch) this persistent
//   CTA computes, in which order;
// - the mask (mask.hpp, WarpgroupMask): which key blocks each consumer warpgroup's rows see;
// - the mainloop (mainloop_fwd.hpp): the producer's TMA loads (load_fwd) and each consumer
//   warpgroup's GEMMs and softmax (FwdConsumer), over the TMA pipelines of pipeline.hpp;
// - the epilogue (epilogue_fwd.hpp, FwdEpilogue): O normalised and stored, and the lse.
// Warpgroup 0 is the producer (it gives most of its registers away); the others are consumers of
// 64 query rows each. With two Q buffers, a consumer issues the next tile's first S behind this
// tile's last P V and runs the epilogue under it.
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
#include "flashcute/sm90/pipeline.hpp"
#include "flashcute/sm90/scheduler.hpp"
#include "flashcute/sm90/traits.hpp"

namespace flashcute::sm90 {

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) fwd_kernel(__grid_constant__ const FwdKernelParams<Traits> kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(Traits::kConsumerWarpgroups >= 2 && Traits::kNThreads == 128 * (Traits::kConsumerWarpgroups + 1));
  const FwdParams& params = kp.params;
  extern __shared__ __align__(1024) char smem_buf[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem_buf);

  if (threadIdx.x == 0) FwdPipelines<Traits>::init(storage);
  cutlass::arch::fence_barrier_init();
  // The barriers are initialised before any thread waits on or arrives at them.
  __syncthreads();

  const int warp_group = cutlass::canonical_warp_group_idx();
  const FwdPipelines<Traits> pipes(storage);
  const TileWalk walk(kp.schedule, kp.div_heads, params.seqlen_q, Traits::kBlockM, params.nheads, params.batch);
  const WarpgroupMask<Traits> mask{
      KeyMask{params.seqlen_k, params.seqlen_k - params.seqlen_q, params.window_left, params.window_right},
      params.seqlen_q, warp_group - 1};

  if (warp_group == 0) {
    // Producer: registers go to the consumers; one thread issues every load.
    cutlass::arch::warpgroup_reg_dealloc<Traits::kConfig.producer_regs>();
    if (cutlass::canonical_warp_idx_sync() == 0 && cute::elect_one_sync()) load_fwd(kp, storage, pipes, walk, mask);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Traits::kConfig.consumer_regs>();
  const int mma_tid = int(threadIdx.x) - 128;
  FwdConsumer<Traits> mainloop(storage, params, pipes, mask, mma_tid);
  const FwdEpilogue<Traits> epilogue{params, storage, mask.wg, mma_tid};
  auto o_rc = mainloop.acc_o_rc();
  const auto tOcO_rc = mainloop.coords_o();
  auto store = [&](FwdTile const& t, int v_stage) __attribute__((always_inline)) {
    epilogue.store(mainloop.softmax, mainloop.mma_pv, mainloop.acc_o, o_rc, tOcO_rc, t.m_block, t.head, t.batch, v_stage);
  };

  // The first tile, and after each the next valid one: each is decoded once, after the tile
  // before it has issued its last P V, where the next tile's first S needs it.
  TileWalk::Position pos = walk.first(), next_pos;
  FwdTile tile{}, next{};
  auto find_next = [&]() __attribute__((always_inline)) {
    next_pos = pos;
    do {
      walk.next(next_pos);
      if (walk.done(next_pos)) break;
      next = decode_tile(walk.at(next_pos), mask);
    } while (!next.valid);
  };
  // The first position holds no tile where a tail round deals this CTA none.
  if (!walk.done(pos)) {
    tile = decode_tile(walk.at(pos), mask);
    if (!tile.valid) find_next(), pos = next_pos, tile = next;
  }
  bool first_done = false;  // the tile's first block ran early, under the previous epilogue
  while (!walk.done(pos)) {
    mainloop.begin_tile(tile, first_done);
    if (!tile.has_blocks()) {
      store(tile, -1);  // no key visible: O = 0, lse = -inf
      first_done = false;
      find_next();
    } else {
      if (!first_done) mainloop.mma_first_block(tile);
      mainloop.mma_blocks(tile);
      mainloop.mma_last_pv();
      find_next();
      if (FwdConsumer<Traits>::can_start_early(!walk.done(next_pos), next)) {
        mainloop.mma_next_first_s(next);
        store(tile, -1);
        mainloop.mma_next_first_probs(next);
        first_done = true;
      } else {
        const int v_stage = mainloop.mma_last_wait();
        if constexpr (Traits::kConfig.o_via_v) {
          store(tile, v_stage);  // O staged in the last block's V buffer, which it then frees
          // This thread's shared-memory writes and reads (generic proxy) are ordered before the
          // TMA load (async proxy) that refills the buffer once the producer sees the release.
          cutlass::arch::fence_view_async_shared();
          mainloop.release_last_v();
        } else {
          mainloop.release_last_v();
          store(tile, -1);
        }
        first_done = false;
      }
    }
    pos = next_pos;
    tile = next;
  }
  mainloop.finish();
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace flashcute::sm90
