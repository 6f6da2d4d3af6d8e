// flashcute/sm90/kernel_fwd.hpp: the sm90a forward attention kernel (wgmma + TMA, warp-specialised).
//
// A CTA computes BLK_M x D tiles of O, each for one (batch, head): one tile, or, persistent, the
// tiles sm90/scheduler.hpp deals it (sm90/launch_fwd.hpp chooses). Warpgroup 0 is the producer: it
// gives most of its registers away (setmaxnreg) and one thread of its first warp issues the TMA
// loads, a tile's Q (into one of `q_stages` buffers), then its K and V block by block into
// `stages`-deep rings of shared-memory buffers, each guarded by a pair of mbarriers (full: the
// TMA's bytes have landed; empty: every consumer warp has finished reading). The other
// warpgroups are consumers, 64 query rows each:
// S = Q K^T with both operands read by wgmma from shared memory, the online softmax on the
// accumulator, then O += P V with P taken from registers; the S of the next block and the P V of
// this one are in flight together, so the softmax runs under the tensor cores. Blocks are walked
// from the last to the first, so the ragged and diagonal blocks, the ones that need a mask, come
// first, as in the sm80 kernel. TMA zero-fills rows and columns outside the arrays, so the loads
// need no predication. With two Q buffers the next tile's first S runs under this tile's
// epilogue, which stores O from the accumulators or, with `o_smem`, through shared memory.
//
// Built only for sm_90a (wgmma and setmaxnreg exist nowhere else); the body is empty on any
// other target, and the host dispatch never launches it there.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "flashcute/common/fragment.hpp"
#include "flashcute/common/mask.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/softmax.hpp"
#include "flashcute/common/store.hpp"
#include "flashcute/sm90/epilogue_fwd.hpp"
#include "flashcute/sm90/gmma.hpp"
#include "flashcute/sm90/pipeline.hpp"
#include "flashcute/sm90/scheduler.hpp"
#include "flashcute/sm90/traits.hpp"

#define FLASHCUTE_INLINE __attribute__((always_inline))

namespace flashcute::sm90 {

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) fwd_kernel(__grid_constant__ const FwdKernelParams<Traits> kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kQStages = Traits::kQStages;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileVt = Shape<Int<kHeadDim>, Int<kBlockN>>;
  using TileS = Shape<Int<kBlockM>, Int<kBlockN>>;
  const FwdParams& params = kp.params;

  extern __shared__ __align__(1024) char smem_buf[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem_buf);

  // The work (sm90/scheduler.hpp): tiles of (m_block, head, batch), in units of one tile or, for
  // causal masks, two; CTA c walks one unit of every round of gridDim.x units, then its share of
  // the tail, the last units dealt tile by tile, heaviest first. The launch makes one CTA per SM
  // where the units cost the same (no mask; causal pairs), else one per unit (windows), for the
  // hardware to balance.
  // 32-bit arithmetic (sm90_can_run keeps the unit count below 2^31): a 64-bit division is a long
  // software routine, and every CTA decodes its first unit before its first load.
  const TileSchedule& walk = kp.schedule;
  const unsigned m_blocks = ceil_div(params.seqlen_q, kBlockM);
  const unsigned unit_m = walk.pair_tiles ? (m_blocks + 1) / 2 : m_blocks;  // units per (head, batch)
  const unsigned num_units = unit_m * unsigned(params.nheads) * unsigned(params.batch);
  // (Read as walk.end alone, the bound made ptxas spill at d 256, whose consumers have no
  // register to spare; with the count computed here as before the tail existed, it does not.)
  const unsigned work_end = walk.tail_tiles > 0 ? walk.end : num_units;
  struct Tile {
    bool valid;  // false: a position of the walk that holds no tile (TileSchedule)
    int m_block, head, batch, n_block_min, n_block_max;
  };
  const KeyMask mask{params.seqlen_k, params.seqlen_k - params.seqlen_q, params.window_left, params.window_right};
  auto tile_at = [&](unsigned u, unsigned j) FLASHCUTE_INLINE {
    const TileSchedule::Tile w =
        walk.in_tail(u) ? walk.tail_at(u, blockIdx.x)
                        : TileSchedule::unit_tile(walk.unit_at(u), j, m_blocks, unit_m, walk.div_unit_m);
    Tile tile;
    tile.valid = w.valid;
    tile.m_block = w.m_block;
    const unsigned batch = kp.div_heads(w.hb);
    tile.head = int(w.hb - batch * unsigned(params.nheads));
    tile.batch = int(batch);
    // The key blocks any row of the tile can see: [n_block_min, n_block_max); none: O = 0, lse = -inf.
    const KeyMask::Blocks blocks = mask.key_blocks(tile.m_block * kBlockM, kBlockM, params.seqlen_q, kBlockN);
    tile.n_block_min = blocks.first;
    tile.n_block_max = blocks.last;
    return tile;
  };
  auto next_tile = [&](unsigned& u, unsigned& j) FLASHCUTE_INLINE {
    if (walk.in_tail(u) || ++j == (walk.pair_tiles ? 2u : 1u)) j = 0, u += gridDim.x;
  };
  const int group = params.nheads / params.nheads_k;  // query heads per KV head

  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});    // (BLK_M,D,QPIPE)
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});    // (BLK_N,D,PIPE)
  Tensor sVt = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutVt{});  // (D,BLK_N,PIPE)

  const int warp_group = cutlass::canonical_warp_group_idx();
  const int warp = cutlass::canonical_warp_idx_sync();
  // The TMA rings of Q, K and V: every consumer warp releases each buffer once.
  using QPipeline = TmaPipeline<kQStages>;
  using KvPipeline = TmaPipeline<kStages>;
  using KvState = PipelineState<kStages>;
  using QState = PipelineState<kQStages>;
  if (threadIdx.x == 0) {
    QPipeline::init(storage.q_bar, Traits::kConsumerWarpgroups * 4);
    KvPipeline::init(storage.k_bar, Traits::kConsumerWarpgroups * 4);
    KvPipeline::init(storage.v_bar, Traits::kConsumerWarpgroups * 4);
  }
  const QPipeline q_pipe{storage.q_bar};
  const KvPipeline k_pipe{storage.k_bar}, v_pipe{storage.v_bar};
  cutlass::arch::fence_barrier_init();
  // The barriers are initialised before any thread waits on or arrives at them.
  __syncthreads();

  // Both sides walk the same tiles and blocks and count them the same way: `kv` counts the K/V
  // blocks across tiles, `q` the tiles that load a Q (PipelineState: buffer and phase).

  if (warp_group == 0) {
    // Producer. Registers go to the consumers; one thread issues every load.
    cutlass::arch::warpgroup_reg_dealloc<Traits::kConfig.producer_regs>();
    if (warp != 0 || !cute::elect_one_sync()) return;
    Tensor mQ = kp.tma_q.get_tma_tensor(make_shape(params.seqlen_q, params.head_dim, params.nheads, params.batch));
    Tensor mK = kp.tma_k.get_tma_tensor(make_shape(params.seqlen_k, params.head_dim, params.nheads_k, params.batch));
    Tensor mVt = kp.tma_v.get_tma_tensor(make_shape(params.head_dim, params.seqlen_k, params.nheads_k, params.batch));
    KvState kv;
    QState q;
    for (unsigned u = blockIdx.x, j = 0; u < work_end; next_tile(u, j)) {
      const Tile tile = tile_at(u, j);
      if (!tile.valid || tile.n_block_max <= tile.n_block_min) continue;
      const int head_k = tile.head / group;
      Tensor gQ = local_tile(mQ(_, _, tile.head, tile.batch), TileQ{}, make_coord(tile.m_block, 0));  // (BLK_M,D)
      Tensor gK = local_tile(mK(_, _, head_k, tile.batch), TileKV{}, make_coord(_, 0));              // (BLK_N,D,n)
      Tensor gVt = local_tile(mVt(_, _, head_k, tile.batch), TileVt{}, make_coord(0, _));            // (D,BLK_N,n)
      auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(gQ));  // (TMA), (TMA,QPIPE)
      auto [tKgK, tKsK] = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                        group_modes<0, 2>(gK));  // (TMA,n), (TMA,PIPE)
      auto [tVgV, tVsV] = tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sVt),
                                        group_modes<0, 2>(gVt));  // (TMA,n), (TMA,PIPE)

      // The Q buffer is free once every consumer warp has run its last Q K^T of the tile that
      // used it before; a K/V stage once every consumer warp has read its block kStages before.
      copy(kp.tma_q.with(q_pipe.producer_acquire(q, Traits::kQBytes)), tQgQ, tQsQ(_, q.index()));
      ++q;
      for (int n_block = tile.n_block_max - 1; n_block >= tile.n_block_min; --n_block, ++kv) {
        copy(kp.tma_k.with(k_pipe.producer_acquire(kv, Traits::kKvBytes)), tKgK(_, n_block), tKsK(_, kv.index()));
        copy(kp.tma_v.with(v_pipe.producer_acquire(kv, Traits::kKvBytes)), tVgV(_, n_block), tVsV(_, kv.index()));
      }
    }
    return;
  }

  // Consumers: 64 query rows per warpgroup.
  cutlass::arch::warpgroup_reg_alloc<Traits::kConfig.consumer_regs>();
  const int mma_tid = int(threadIdx.x) - 128;
  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(mma_tid);
  auto thr_pv = mma_pv.get_thread_slice(mma_tid);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA,MMA_M,MMA_K,QPIPE) smem descriptors
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA,MMA_N,MMA_K,PIPE)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA,MMA_D,MMA_N,PIPE)
  Tensor acc_o = partition_fragment_C(mma_pv, TileQ{});  // ((2,2,D/8),MMA_M,MMA_D), fp32
  Tensor acc_o_rc = make_tensor(acc_o.data(), gmma_rowcol_layout(acc_o.layout()));  // ((2,MMA_M),(2,D/8,MMA_D))
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(TileS{}));                  // ((2,2,N/8),MMA_M,MMA_N) -> (row,col)
  Tensor tScS_rc = make_tensor(tScS.data(), gmma_rowcol_layout(tScS.layout()));    // ((2,MMA_M),(2,N/8,MMA_N))
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(TileQ{}));                  // ((2,2,D/8),MMA_M,MMA_D) -> (row,col)
  Tensor tOcO_rc = make_tensor(tOcO.data(), gmma_rowcol_layout(tOcO.layout()));    // ((2,MMA_M),(2,D/8,MMA_D))

  CUTE_STATIC_ASSERT_V(size<1>(acc_o) == _1{});                  // one 64-row atom per warpgroup
  CUTE_STATIC_ASSERT_V(size<2>(tSrQ) == Int<kHeadDim / 16>{});   // k16 slices of the head dim
  CUTE_STATIC_ASSERT_V(size<2>(tOrV) == Int<kBlockN / 16>{});    // k16 slices of a key block

  const bool use_softcap = params.softcap > 0.f;
  const float softcap_prescale = use_softcap ? params.softmax_scale / params.softcap : 0.f;
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = (use_softcap ? params.softcap : params.softmax_scale) * kLog2e;
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;

  // Ping-pong: consumer warpgroup wg may issue its GEMMs once the other has issued its own
  // (named barrier wg: 128 threads wait, the other's 128 arrive); warpgroup 0 goes first.
  const int wg = warp_group - 1;
  constexpr bool kPingpong = Traits::kConfig.pingpong;
  auto my_turn = [&] {
    if constexpr (kPingpong) cutlass::arch::NamedBarrier::sync(256, NamedBarriers::kTurn + wg);
  };
  auto pass_turn = [&] {
    if constexpr (kPingpong) cutlass::arch::NamedBarrier::arrive(256, NamedBarriers::kTurn + 1 - wg);
  };
  if (wg == 1) pass_turn();


  // S and P live across main-loop steps: while the tensor cores compute the next block's S and
  // this block's P V, the softmax of the next block waits only for its S.
  Tensor acc_s = partition_fragment_C(mma_qk, TileS{});                            // ((2,2,N/8),MMA_M,MMA_N), fp32
  Tensor scores = make_tensor(acc_s.data(), gmma_rowcol_layout(acc_s.layout()));  // ((2,MMA_M),(2,N/8,MMA_N))
  Tensor rP = make_fragment_like<Element>(acc_s);                                 // ((2,2,N/8),MMA_M,MMA_N)
  Tensor tOrP = make_tensor(rP.data(), gmma_acc_to_a_layout(rP.layout()));        // ((2,2,2),MMA_M,(N/16,MMA_N))
  float rescale[kRows];

  // `q` counts the Q loads this warpgroup has used, as the producer counts them. With two Q
  // buffers the next tile's first S is issued behind this tile's last P V, and its probabilities
  // computed after this tile's epilogue (`first_done`), so the tensor cores run it while O is
  // normalised and stored. Each wgmma is waited for on the path that issued it: ptxas serialises
  // every wgmma of the kernel if one is still in flight where two paths join.
  KvState kv;
  QState q;
  int q_stage = 0;          // the Q buffer of the tile being computed
  bool first_done = false;  // its first block's probabilities are in rP already
  OnlineSoftmax<kRows> softmax(scale_log2);
  // Each tile is decoded once (multiply-highs: FastDiv), after the tile before it has run its
  // main loop and issued its last P V, where the next tile's first S needs it.
  unsigned u = blockIdx.x, j = 0;
  Tile tile;
  unsigned next_u, next_j;
  Tile next;
  // The first valid position after (u, j), or next_u >= work_end.
  auto find_next = [&]() FLASHCUTE_INLINE {
    next_u = u, next_j = j;
    do {
      next_tile(next_u, next_j);
      if (next_u >= work_end) break;
      next = tile_at(next_u, next_j);
    } while (!next.valid);
  };
  int n_top = 0;  // the first block this warpgroup computes in `tile` (wg_top)
  // The first position holds no tile where a tail round deals this CTA none.
  if (u < work_end) {
    tile = tile_at(u, j);
    if (!tile.valid) find_next(), u = next_u, j = next_j, tile = next;
  }
  // Softcap an S accumulator, or the part of one that acc views (a no-op without a softcap).
  auto apply_softcap = [&](auto& acc) FLASHCUTE_INLINE {
    if (use_softcap) {
      CUTE_UNROLL
      for (int j = 0; j < size(acc); ++j) acc(j) = tanhf(acc(j) * softcap_prescale);
    }
  };
  // Softcap, mask and exponentiate the scores (acc_s) of block n_block of the tile at row tile_m0,
  // and say how much O must shrink (rescale[]): FlashAttention-4's lazy rescale, a row's maximum
  // moves only when it grows by more than 2^8 (+1.4-6.7% at d 256). Returns false where no row of
  // this warp moved its maximum, so that O need not be touched.
  // mask_block(tile_m0, n0) masks the scores where they need a mask at all (mask_whole: all of
  // them). That is asked of this warpgroup's 64 rows where a tile has more than two warpgroups,
  // most of whom need no mask on most of the diagonal's blocks; of the whole tile otherwise, which
  // measured faster at d 256 causal 1k (docs/perf-notes.md, sm90 forward).
  auto scores_to_probs = [&](int tile_m0, int n_block, auto const& mask_block) FLASHCUTE_INLINE {
    const int n0 = n_block * kBlockN;
    apply_softcap(acc_s);
    const bool needs_mask = Traits::kConsumerWarpgroups > 2 ? mask.tile_needs_mask(tile_m0 + 64 * wg, 64, n0, kBlockN)
                                                            : mask.tile_needs_mask(tile_m0, kBlockM, n0, kBlockN);
    if (needs_mask) mask_block(tile_m0, n0);
    return __any_sync(0xffffffff, softmax.rescale_scores_lazy(scores, rescale));
  };
  auto mask_whole = [&](int tile_m0, int n0) FLASHCUTE_INLINE { mask.apply(scores, tScS_rc, tile_m0, n0); };

  // Wait for the Q of load `q` and the K of block `kv`.
  auto wait_q_k = [&]() FLASHCUTE_INLINE {
    q_pipe.consumer_wait(q);
    k_pipe.consumer_wait(kv);
  };
  // Issue S = Q K^T (Q: one buffer's descriptors, K: the stage of `kv`), or O += P V of the
  // block before `kv`. Not waited for: each caller waits on its own path.
  auto issue_s = [&](auto const& tSrQ_q) FLASHCUTE_INLINE {
    wgmma_gemm<true, false>(mma_qk, tSrQ_q, tSrK(_, _, _, kv.index()), acc_s);
  };
  auto issue_pv = [&]() FLASHCUTE_INLINE {
    wgmma_gemm<false, true>(mma_pv, tOrP, tOrV(_, _, _, (kv - 1).index()), acc_o);
  };
  // The left half of the S accumulator and of its coordinates (the same registers), for a block
  // whose right half no row of this warpgroup sees: the causal diagonal block of the first
  // warpgroup, at 128-key blocks (+6.8% at d 64 causal 1k).
  constexpr bool kHalfFirst = kBlockN == 128;
  using TileSHalf = Shape<Int<kBlockM>, Int<kBlockN / 2>>;
  typename Traits::TiledMmaQKHalf mma_qk_half;
  auto thr_qk_half = mma_qk_half.get_thread_slice(mma_tid);
  // acc_s's first half, ((2,2,N/16),MMA_M,MMA_N), fp32, and its row/col view ((2,MMA_M),(2,N/16,MMA_N))
  Tensor acc_s_half = make_tensor(acc_s.data(), partition_fragment_C(mma_qk_half, TileSHalf{}).layout());
  Tensor scores_half = make_tensor(acc_s.data(), gmma_rowcol_layout(acc_s_half.layout()));
  // Their coordinates: ((2,2,N/16),MMA_M,MMA_N) -> (row,col), and the row/col view of them
  Tensor tScS_half = thr_qk_half.partition_C(make_identity_tensor(TileSHalf{}));
  Tensor tScS_half_rc = make_tensor(tScS_half.data(), gmma_rowcol_layout(tScS_half.layout()));
  constexpr int kHalf = decltype(size(acc_s_half))::value;  // acc_s's registers of each half
  CUTE_STATIC_ASSERT_V(Int<kHalf * 2>{} == size(acc_s));
  // One past the last key any row of this warpgroup sees, in the tile at tile_m0.
  auto wg_key_end = [&](int tile_m0) FLASHCUTE_INLINE {
    return mask.key_end(min(tile_m0 + 64 * wg + 63, params.seqlen_q - 1));
  };
  // Whether no row of this warpgroup in the tile at tile_m0 sees a key of block n_block's right half.
  auto right_half_unseen = [&](int tile_m0, int n_block) FLASHCUTE_INLINE {
    return wg_key_end(tile_m0) <= n_block * kBlockN + kBlockN / 2;
  };
  // The first (highest) key block this warpgroup computes in tile t: the tile's last visible block,
  // less those at the top that no row of this warpgroup sees (the causal diagonal's blocks right
  // of its rows: up to three for the first warpgroup of a 256 x 64 tile, one for the first of a
  // 128 x 80 or 128 x 96 tile; +1-5% at d 192 causal). At least the tile's first block. Not with
  // ping-pong (d 96, 128), where both warpgroups must take as many turns, and where 128-key blocks
  // and seqlen_q = seqlen_k leave no block unseen anyway: there every skip compiles away.
  constexpr bool kSkipUnseen = !kPingpong;
  auto wg_top = [&](const Tile& t) FLASHCUTE_INLINE {
    int top = t.n_block_max - 1;
    if constexpr (kSkipUnseen) top = max(t.n_block_min, min(top, ceil_div(wg_key_end(t.m_block * kBlockM), kBlockN) - 1));
    return top;
  };
  // Hands the K (or V) of block `s` back to the producer unread, once it has arrived: released
  // before, this warpgroup's arrival would count toward the stage's previous block.
  // The mask of a tile's first block: where this warpgroup sees all of the block's left half (the
  // causal diagonal, second warpgroup), only the right half is masked (+1.2% at d 64 causal 1k).
  auto mask_first = [&](int tile_m0, int n0) FLASHCUTE_INLINE {
    const int row0 = tile_m0 + 64 * wg;
    if (!mask.tile_needs_mask(row0, 64, n0, kBlockN / 2)) {
      Tensor scores_right = make_tensor(acc_s.data() + kHalf, scores_half.layout());  // ((2,MMA_M),(2,N/16,MMA_N))
      mask.apply(scores_right, tScS_half_rc, tile_m0, n0 + kBlockN / 2);
    } else {
      mask.apply(scores, tScS_rc, tile_m0, n0);
    }
  };
  // A tile's first block, once its S has completed: the K stage is free, the probabilities go to
  // rP (O is still zero: nothing to rescale), and the block is counted. Where this warpgroup sees
  // none of the block's right half, only the left half is masked and exponentiated, and P's right
  // half is zero (P V still runs over the whole block); otherwise mask_first masks it.
  auto first_probs = [&](int tile_m0, int n_block) FLASHCUTE_INLINE {
    k_pipe.consumer_release(kv);
    if constexpr (kHalfFirst) {
      if (right_half_unseen(tile_m0, n_block)) {
        apply_softcap(acc_s_half);
        mask.apply(scores_half, tScS_half_rc, tile_m0, n_block * kBlockN);
        softmax.rescale_scores_lazy(scores_half, rescale);
        Tensor rP_half = make_tensor(rP.data(), make_layout(Int<kHalf>{}));
        convert_fragment_into(make_tensor(acc_s.data(), make_layout(Int<kHalf>{})), rP_half);
        CUTE_UNROLL
        for (int j = kHalf; j < size(rP); ++j) rP(j) = Element(0.f);
      } else {
        scores_to_probs(tile_m0, n_block, mask_first);
        convert_fragment_into(acc_s, rP);
      }
    } else {
      scores_to_probs(tile_m0, n_block, mask_whole);
      convert_fragment_into(acc_s, rP);
    }
    ++kv;
  };
  while (u < work_end) {
    const int m0 = tile.m_block * kBlockM;
    clear(acc_o);
    if (!first_done) softmax = OnlineSoftmax<kRows>(scale_log2);

    // Epilogue: normalise, store O (store_o), then the lse.
    // v_stage: the V buffer O may be staged in (config o_via_v), or -1 for none.
    auto epilogue = [&](int v_stage) FLASHCUTE_INLINE {
      float lse[kRows];
      softmax.finalize(acc_o_rc, lse);
      Tensor rO = convert_fragment<Element>(acc_o);  // ((2,2,D/8),MMA_M,MMA_D)
      auto* o_tile =
          static_cast<Element*>(params.o) + tile.batch * params.o_batch_stride + tile.head * params.o_head_stride;
      store_o<Traits>(storage, mma_pv, rO, tOcO_rc, o_tile, params, m0, wg, mma_tid, v_stage);
      if (params.lse != nullptr && get<1>(tOcO_rc(0, 0)) == 0) {  // one thread of each row's quad
        float* lse_ptr = params.lse + tile.batch * params.lse_batch_stride + tile.head * params.lse_head_stride;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const int row = m0 + get<0>(tOcO_rc(r, 0));
          if (row < params.seqlen_q) lse_ptr[row] = lse[r];
        }
      }
    };

    // The first (last, possibly ragged) block this warpgroup computes: where the tile's first
    // probabilities are in rP already, the early path below chose it.
    if constexpr (kSkipUnseen) {
      if (!first_done) n_top = wg_top(tile);
    } else {
      n_top = tile.n_block_max - 1;
    }
    if (tile.n_block_max > tile.n_block_min) {
      // The first block: S, then its probabilities; O is still zero.
      if (!first_done) {
        // The blocks above it go back to the producer unread.
        if constexpr (kSkipUnseen) {
          for (int n = tile.n_block_max - 1; n > n_top; --n, ++kv) k_pipe.consumer_skip(kv), v_pipe.consumer_skip(kv);
        }
        q_stage = q.index();
        wait_q_k();
        my_turn();
        issue_s(tSrQ(_, _, _, q_stage));
        pass_turn();
        ++q;
        warpgroup_wait<0>();
        first_probs(m0, n_top);
      }
      Tensor tSrQ_tile = tSrQ(_, _, _, q_stage);  // (MMA,MMA_M,MMA_K)

      // At each step, S of block n_block and O += P V of the block before it, both in flight at
      // once; the softmax of S runs while P V still computes. That P V completes at the top of the
      // next step (or after the last), where O is rescaled if a row of this warp moved its
      // maximum, the V buffer goes back and the new P is written. The wait sits behind the loop's
      // branch: there it is one instruction for all four warps of the warpgroup (a branch on the
      // warp's own vote would split them), and ptxas, which moves a wgmma wait to the top of its
      // basic block, cannot move it above the softmax.
      bool shrink = false;
      for (int n_block = n_top - 1; n_block >= tile.n_block_min; --n_block, ++kv) {
        if (n_block < n_top - 1) {
          warpgroup_wait<0>();  // the last step's P V is done: O may be rescaled, P rewritten
          if (shrink) softmax.rescale_o(acc_o_rc, rescale);
          v_pipe.consumer_release(kv - 2);
          convert_fragment_into(acc_s, rP);
        }
        k_pipe.consumer_wait(kv);
        v_pipe.consumer_wait(kv - 1);
        my_turn();
        issue_s(tSrQ_tile);
        issue_pv();
        pass_turn();
        warpgroup_wait<1>();  // S is done (P V, committed after it, may still run)
        k_pipe.consumer_release(kv);
        // The tile's last Q K^T is done: the producer may load a later tile's Q into this buffer
        // while this warpgroup still runs the last softmax and P V.
        if (n_block == tile.n_block_min) q_pipe.consumer_release(q_stage);
        shrink = scores_to_probs(m0, n_block, mask_whole);
      }
      if (n_top > tile.n_block_min) {
        warpgroup_wait<0>();
        if (shrink) softmax.rescale_o(acc_o_rc, rescale);
        v_pipe.consumer_release(kv - 2);
        convert_fragment_into(acc_s, rP);
      }
      if (n_top == tile.n_block_min) q_pipe.consumer_release(q_stage);  // (no loop step ran)
      v_pipe.consumer_wait(kv - 1);
      // The last P V goes first: it needs nothing of the next tile, so the tensor cores run it
      // while the next tile is decoded (+2-3% at d 64 1k, +1-2% at d 128 1k).
      my_turn();
      issue_pv();
      // With two Q buffers, the next tile's first S goes behind the last P V. (With one, its Q
      // load starts only now, after the last Q K^T, and waiting for it costs more than the
      // epilogue it would hide: -6.7% at d 256 1k.)
      find_next();
      bool early = false;
      if constexpr (kQStages == 2) early = next_u < work_end && next.n_block_max > next.n_block_min;
      if (early) {
        // Its Q is in the other buffer; only the next S needs the next tile's Q and K, and acc_s
        // is free once P is converted. The next tile's blocks this warpgroup does not see go back
        // first, their K now and their V once this tile's last V is released: at most
        // kStages - 1 of them, since the load of the K after them waits for that release (the
        // producer loads K and V in turn), and the next S waits for that K. Any more are computed
        // (and masked) as before.
        const KvState last = kv - 1;
        if constexpr (kSkipUnseen) {
          n_top = max(wg_top(next), next.n_block_max - kStages);
          for (int n = next.n_block_max - 1; n > n_top; --n, ++kv) k_pipe.consumer_skip(kv);
        } else {
          n_top = next.n_block_max - 1;
        }
        const int next_q_stage = q.index();
        wait_q_k();
        issue_s(tSrQ(_, _, _, next_q_stage));
        pass_turn();
        ++q;
        warpgroup_wait<1>();  // the last P V is done; the next tile's S runs on under the epilogue
        v_pipe.consumer_release(last);
        if constexpr (kSkipUnseen) {
          for (KvState s = last + 1; s.count < kv.count; ++s) v_pipe.consumer_skip(s);
        }
        epilogue(-1);
        softmax = OnlineSoftmax<kRows>(scale_log2);
        warpgroup_wait<0>();
        first_probs(next.m_block * kBlockM, n_top);
        q_stage = next_q_stage;
        first_done = true;
      } else {
        pass_turn();
        warpgroup_wait<0>();
        if constexpr (Traits::kConfig.o_via_v) {
          epilogue((kv - 1).index());  // O staged in the last block's V buffer, which it then frees
          // This thread's shared-memory writes and reads (generic proxy) are ordered before the
          // TMA load (async proxy) that refills the buffer once the producer sees the release.
          cutlass::arch::fence_view_async_shared();
          v_pipe.consumer_release(kv - 1);
        } else {
          v_pipe.consumer_release(kv - 1);
          epilogue(-1);
        }
        first_done = false;
      }
    } else {
      epilogue(-1);  // no key visible: O = 0, lse = -inf
      first_done = false;
      find_next();
    }
    u = next_u, j = next_j;
    tile = next;
  }
  // Warpgroup 1 passed the turn once more than warpgroup 0 took it (its first pass, before any
  // GEMM): take it, so that no arrival is left pending on the barrier.
  if (wg == 0) my_turn();
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace flashcute::sm90

#undef FLASHCUTE_INLINE
