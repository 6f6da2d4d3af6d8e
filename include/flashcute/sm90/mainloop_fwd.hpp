// flashcute/sm90/mainloop_fwd.hpp: the sm90a forward mainloop: the producer's TMA loads (load)
// and a consumer warpgroup's GEMMs and online softmax (the mma_* steps).
//
// Loads: one thread of the producer warpgroup walks the same tiles as the consumers and issues,
// per tile, its Q (into one of kQStages buffers) and then its K and V blocks, from the last key
// block to the first, into kStages-deep rings (TmaPipeline). TMA zero-fills rows and columns
// outside the arrays, so no load needs predication.
//
// GEMMs: S = Q K^T with both operands read by wgmma from shared memory, the online softmax on the
// accumulator, then O += P V with P taken from registers. The S of the next block and the P V of
// this one are in flight together, so the softmax runs under the tensor cores. Blocks are walked
// from the last to the first, so the ragged and diagonal blocks, the ones that need a mask, come
// first. With two Q buffers the kernel issues the next tile's first S behind this tile's last
// P V (mma_next_first_s) and runs the epilogue under it.
//
// Each wgmma is waited for on the path that issued it (ptxas serialises every wgmma of the kernel
// if one is still in flight where two paths join), and every branch around a wgmma or its wait is
// the same for a warpgroup's four warps.
#pragma once

#include <utility>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flashcute/common/fragment.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/softmax.hpp"
#include "flashcute/sm90/gmma.hpp"
#include "flashcute/sm90/mask.hpp"
#include "flashcute/sm90/pipeline.hpp"
#include "flashcute/sm90/scheduler.hpp"
#include "flashcute/sm90/traits.hpp"

#define FLASHCUTE_INLINE __attribute__((always_inline))

namespace flashcute::sm90 {

// A tile as the mainloop walks it: the scheduler's work plus the key blocks its rows see,
// [n_block_min, n_block_max) (none: O = 0, lse = -inf).
struct FwdTile {
  bool valid;
  int m_block, head, batch, n_block_min, n_block_max;
  CUTE_DEVICE bool has_blocks() const { return n_block_max > n_block_min; }
};

template <class Traits>
struct FwdPipelines {
  TmaPipeline<Traits::kQStages> q;
  TmaPipeline<Traits::kStages> k, v;
  CUTE_DEVICE explicit FwdPipelines(typename Traits::SharedStorage& storage)
      : q{storage.q_bar}, k{storage.k_bar}, v{storage.v_bar} {}
  // By one thread before the CTA's first sync: every consumer warp releases each buffer once.
  CUTE_DEVICE static void init(typename Traits::SharedStorage& storage) {
    TmaPipeline<Traits::kQStages>::init(storage.q_bar, Traits::kConsumerWarpgroups * 4);
    TmaPipeline<Traits::kStages>::init(storage.k_bar, Traits::kConsumerWarpgroups * 4);
    TmaPipeline<Traits::kStages>::init(storage.v_bar, Traits::kConsumerWarpgroups * 4);
  }
};

template <class Traits>
CUTE_DEVICE FwdTile decode_tile(TileWalk::Work w, WarpgroupMask<Traits> const& mask) {
  const KeyMask::Blocks blocks = mask.tile_blocks(w.m_block);
  return {w.valid, w.m_block, w.head, w.batch, blocks.first, blocks.last};
}

// The producer: one thread issues every load of this CTA's tiles.
template <class Traits>
CUTE_DEVICE void load_fwd(FwdKernelParams<Traits> const& kp, typename Traits::SharedStorage& storage,
                          FwdPipelines<Traits> const& pipes, TileWalk const& walk, WarpgroupMask<Traits> const& mask) {
  using namespace cute;
  using TileQ = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>;
  using TileKV = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>;
  using TileVt = Shape<Int<Traits::kHeadDim>, Int<Traits::kBlockN>>;
  FwdParams const& params = kp.params;
  const int group = params.nheads / params.nheads_k;  // query heads per KV head
  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});    // (BLK_M,D,QPIPE)
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});    // (BLK_N,D,PIPE)
  Tensor sVt = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutVt{});  // (D,BLK_N,PIPE)
  Tensor mQ = kp.tma_q.get_tma_tensor(make_shape(params.seqlen_q, params.head_dim, params.nheads, params.batch));
  Tensor mK = kp.tma_k.get_tma_tensor(make_shape(params.seqlen_k, params.head_dim, params.nheads_k, params.batch));
  Tensor mVt = kp.tma_v.get_tma_tensor(make_shape(params.head_dim, params.seqlen_k, params.nheads_k, params.batch));
  PipelineState<Traits::kStages> kv;
  PipelineState<Traits::kQStages> q;
  for (TileWalk::Position p = walk.first(); !walk.done(p); walk.next(p)) {
    const FwdTile tile = decode_tile(walk.at(p), mask);
    if (!tile.valid || !tile.has_blocks()) continue;
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
    // The Q buffer is free once every consumer warp has run its last Q K^T of the tile before.
    copy(kp.tma_q.with(pipes.q.producer_acquire(q, Traits::kQBytes)), tQgQ, tQsQ(_, q.index()));
    ++q;
    for (int n_block = tile.n_block_max - 1; n_block >= tile.n_block_min; --n_block, ++kv) {
      copy(kp.tma_k.with(pipes.k.producer_acquire(kv, Traits::kKvBytes)), tKgK(_, n_block), tKsK(_, kv.index()));
      copy(kp.tma_v.with(pipes.v.producer_acquire(kv, Traits::kKvBytes)), tVgV(_, n_block), tVsV(_, kv.index()));
    }
  }
}

// One consumer warpgroup's side of the mainloop: its 64 query rows of each tile. The kernel calls
// the steps in this order per tile: mma_first_block (unless the previous tile issued it early),
// mma_blocks, mma_last_pv; then either mma_next_first_s, the epilogue and mma_next_first_probs, or
// mma_last_wait and the epilogue.
template <class Traits>
struct FwdConsumer {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kStages = Traits::kStages;
  static constexpr int kQStages = Traits::kQStages;
  static constexpr bool kPingpong = Traits::kConfig.pingpong;
  using Mask = WarpgroupMask<Traits>;
  using TileQ = cute::Shape<cute::Int<kBlockM>, cute::Int<Traits::kHeadDim>>;
  using TileS = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>;
  using TileSHalf = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN / 2>>;
  using TiledMmaQK = typename Traits::TiledMmaQK;
  using TiledMmaPV = typename Traits::TiledMmaPV;
  using TiledMmaQKHalf = typename Traits::TiledMmaQKHalf;
  using ThrQK = decltype(TiledMmaQK{}.get_thread_slice(0));
  using ThrPV = decltype(TiledMmaPV{}.get_thread_slice(0));
  using SQ = decltype(cute::make_tensor(cute::make_smem_ptr(static_cast<Element*>(nullptr)), typename Traits::SmemLayoutQ{}));
  using SK = decltype(cute::make_tensor(cute::make_smem_ptr(static_cast<Element*>(nullptr)), typename Traits::SmemLayoutK{}));
  using SVt = decltype(cute::make_tensor(cute::make_smem_ptr(static_cast<Element*>(nullptr)), typename Traits::SmemLayoutVt{}));
  using AccS = decltype(cute::partition_fragment_C(TiledMmaQK{}, TileS{}));
  using AccO = decltype(cute::partition_fragment_C(TiledMmaPV{}, TileQ{}));
  static constexpr int kRows = decltype(cute::size<0>(gmma_rowcol_layout(AccO{}.layout())))::value;

  FwdPipelines<Traits> const& pipes;
  Mask const& mask;
  const int wg;       // the consumer warpgroup
  const int mma_tid;  // the thread's index among the consumers
  TiledMmaQK mma_qk;
  TiledMmaPV mma_pv;
  ThrQK thr_qk;
  ThrPV thr_pv;
  decltype(std::declval<ThrQK&>().partition_fragment_A(std::declval<SQ&>())) tSrQ;   // (MMA,MMA_M,MMA_K,QPIPE) smem descriptors
  decltype(std::declval<ThrQK&>().partition_fragment_B(std::declval<SK&>())) tSrK;   // (MMA,MMA_N,MMA_K,PIPE)
  decltype(std::declval<ThrPV&>().partition_fragment_B(std::declval<SVt&>())) tOrV;  // (MMA,MMA_D,MMA_N,PIPE)
  AccO acc_o;                                          // ((2,2,D/8),MMA_M,MMA_D), fp32
  AccS acc_s;                                          // ((2,2,N/8),MMA_M,MMA_N), fp32
  decltype(cute::make_fragment_like<Element>(AccS{})) rP;  // ((2,2,N/8),MMA_M,MMA_N): P for the next P V
  float rescale[kRows];
  OnlineSoftmax<kRows> softmax;
  const bool use_softcap;
  const float softcap_prescale;
  const float scale_log2;
  // K/V blocks this warpgroup has consumed, and Q loads (the producer counts them the same way).
  PipelineState<kStages> kv;
  PipelineState<kQStages> q;
  int q_stage = 0;  // the Q buffer of the tile being computed
  int n_top = 0;    // the first block this warpgroup computes in the tile (Mask::top_block)

  CUTE_DEVICE FwdConsumer(typename Traits::SharedStorage& storage, FwdParams const& params,
                          FwdPipelines<Traits> const& pipes_, Mask const& mask_, int mma_tid_)
      : pipes(pipes_), mask(mask_), wg(mask_.wg), mma_tid(mma_tid_), thr_qk(mma_qk.get_thread_slice(mma_tid_)),
        thr_pv(mma_pv.get_thread_slice(mma_tid_)),
        tSrQ(thr_qk.partition_fragment_A(cute::make_tensor(cute::make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{}))),
        tSrK(thr_qk.partition_fragment_B(cute::make_tensor(cute::make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{}))),
        tOrV(thr_pv.partition_fragment_B(cute::make_tensor(cute::make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutVt{}))),
        softmax(0.f), use_softcap(params.softcap > 0.f),
        softcap_prescale(params.softcap > 0.f ? params.softmax_scale / params.softcap : 0.f),
        scale_log2((params.softcap > 0.f ? params.softcap : params.softmax_scale) * 1.4426950408889634f) {
    using namespace cute;
    CUTE_STATIC_ASSERT_V(size<1>(acc_o) == _1{});                           // one 64-row atom per warpgroup
    CUTE_STATIC_ASSERT_V(size<2>(tSrQ) == Int<Traits::kHeadDim / 16>{});  // k16 slices of the head dim
    CUTE_STATIC_ASSERT_V(size<2>(tOrV) == Int<kBlockN / 16>{});           // k16 slices of a key block
    softmax = OnlineSoftmax<kRows>(scale_log2);
    // Warpgroup 1 lets warpgroup 0 take the first turn.
    if (wg == 1) pass_turn();
  }

  // Ping-pong: warpgroup wg issues its GEMMs once the other has issued its own.
  CUTE_DEVICE void my_turn() const {
    if constexpr (kPingpong) cutlass::arch::NamedBarrier::sync(256, NamedBarriers::kTurn + wg);
  }
  CUTE_DEVICE void pass_turn() const {
    if constexpr (kPingpong) cutlass::arch::NamedBarrier::arrive(256, NamedBarriers::kTurn + 1 - wg);
  }
  // At the kernel's end: warpgroup 1 passed the turn once more than warpgroup 0 took it (its
  // first pass, before any GEMM); take it, so that no arrival is left pending on the barrier.
  CUTE_DEVICE void finish() const {
    if (wg == 0) my_turn();
  }

  // The views of the accumulators the softmax and the epilogue read.
  CUTE_DEVICE auto scores() { return cute::make_tensor(acc_s.data(), gmma_rowcol_layout(acc_s.layout())); }  // ((2,MMA_M),(2,N/8,MMA_N))
  CUTE_DEVICE auto acc_o_rc() { return cute::make_tensor(acc_o.data(), gmma_rowcol_layout(acc_o.layout())); }  // ((2,MMA_M),(2,D/8,MMA_D))
  CUTE_DEVICE auto coords_s() const {  // ((2,MMA_M),(2,N/8,MMA_N)) -> (row,col)
    auto c = thr_qk.partition_C(cute::make_identity_tensor(TileS{}));
    return cute::make_tensor(c.data(), gmma_rowcol_layout(c.layout()));
  }
  CUTE_DEVICE auto coords_o() const {  // ((2,MMA_M),(2,D/8,MMA_D)) -> (row,col)
    auto c = thr_pv.partition_C(cute::make_identity_tensor(TileQ{}));
    return cute::make_tensor(c.data(), gmma_rowcol_layout(c.layout()));
  }

  // Softcap an S accumulator, or the part of one that acc views (a no-op without a softcap).
  template <class Acc>
  CUTE_DEVICE void apply_softcap(Acc& acc) const {
    if (use_softcap) {
      CUTE_UNROLL
      for (int j = 0; j < cute::size(acc); ++j) acc(j) = tanhf(acc(j) * softcap_prescale);
    }
  }
  // Issue S = Q K^T (Q: buffer qs; K: the stage of kv), or O += P V of the block before kv. Not
  // waited for: each caller waits on its own path.
  CUTE_DEVICE void issue_s(int qs) { wgmma_gemm<true, false>(mma_qk, tSrQ(cute::_, cute::_, cute::_, qs), tSrK(cute::_, cute::_, cute::_, kv.index()), acc_s); }
  CUTE_DEVICE void issue_pv() {
    auto tOrP = cute::make_tensor(rP.data(), gmma_acc_to_a_layout(rP.layout()));  // ((2,2,2),MMA_M,(N/16,MMA_N))
    wgmma_gemm<false, true>(mma_pv, tOrP, tOrV(cute::_, cute::_, cute::_, (kv - 1).index()), acc_o);
  }
  CUTE_DEVICE void wait_q_k(int qs) {
    pipes.q.consumer_wait(q);
    pipes.k.consumer_wait(kv);
  }

  // Softcap, mask and exponentiate the scores of block n_block of the tile at row m0, and say
  // how much O must shrink (rescale[]): FlashAttention-4's lazy rescale, a row's maximum moves
  // only when it grows by more than 2^8. Returns false where none of this thread's rows moved its
  // maximum.
  template <class MaskBlock>
  CUTE_DEVICE bool scores_to_probs(int m0, int n_block, MaskBlock const& mask_block) {
    const int n0 = n_block * kBlockN;
    apply_softcap(acc_s);
    if (mask.needs_mask(m0, n0)) mask_block(m0, n0);
    auto s = scores();
    return softmax.rescale_scores_lazy(s, rescale);
  }

  // A tile's first block, once its S has completed: the K stage is free, the probabilities go to
  // rP (O is still zero: nothing to rescale), and the block is counted. Where this warpgroup sees
  // none of the block's right half, only the left half is masked and exponentiated, and P's right
  // half is zero (P V still runs over the whole block); otherwise only what needs it is masked.
  CUTE_DEVICE void first_probs(int m0, int n_block) {
    using namespace cute;
    pipes.k.consumer_release(kv);
    auto tScS_rc = coords_s();
    if constexpr (Mask::kHalfFirst) {
      TiledMmaQKHalf mma_qk_half;
      auto thr_qk_half = mma_qk_half.get_thread_slice(mma_tid);
      // acc_s's left half, ((2,2,N/16),MMA_M,MMA_N), its row/col view ((2,MMA_M),(2,N/16,MMA_N)),
      // and their coordinates (the same registers: the accumulator's 8-column groups run left to right).
      Tensor acc_s_half = make_tensor(acc_s.data(), partition_fragment_C(mma_qk_half, TileSHalf{}).layout());
      Tensor scores_half = make_tensor(acc_s.data(), gmma_rowcol_layout(acc_s_half.layout()));
      Tensor tScS_half = thr_qk_half.partition_C(make_identity_tensor(TileSHalf{}));
      Tensor tScS_half_rc = make_tensor(tScS_half.data(), gmma_rowcol_layout(tScS_half.layout()));
      constexpr int kHalf = decltype(size(acc_s_half))::value;  // acc_s's registers of each half
      CUTE_STATIC_ASSERT_V(Int<kHalf * 2>{} == size(acc_s));
      if (mask.right_half_unseen(m0, n_block)) {
        apply_softcap(acc_s_half);
        mask.apply(scores_half, tScS_half_rc, m0, n_block * kBlockN);
        softmax.rescale_scores_lazy(scores_half, rescale);
        Tensor rP_half = make_tensor(rP.data(), make_layout(Int<kHalf>{}));
        convert_fragment_into(make_tensor(acc_s.data(), make_layout(Int<kHalf>{})), rP_half);
        CUTE_UNROLL
        for (int j = kHalf; j < size(rP); ++j) rP(j) = Element(0.f);
      } else {
        Tensor scores_right = make_tensor(acc_s.data() + kHalf, scores_half.layout());  // ((2,MMA_M),(2,N/16,MMA_N))
        auto s = scores();
        scores_to_probs(m0, n_block, [&](int m0_, int n0) FLASHCUTE_INLINE {
          mask.apply_first(s, tScS_rc, scores_right, tScS_half_rc, m0_, n0);
        });
        convert_fragment_into(acc_s, rP);
      }
    } else {
      auto s = scores();
      scores_to_probs(m0, n_block, [&](int m0_, int n0) FLASHCUTE_INLINE { mask.apply(s, tScS_rc, m0_, n0); });
      convert_fragment_into(acc_s, rP);
    }
    ++kv;
  }

  // A new tile: O cleared, and the softmax too unless its first block ran early.
  CUTE_DEVICE void begin_tile(FwdTile const& tile, bool first_done) {
    cute::clear(acc_o);
    if (!first_done) {
      softmax = OnlineSoftmax<kRows>(scale_log2);
      n_top = mask.top_block(tile.m_block, tile.n_block_min, tile.n_block_max);
    }
  }

  // The tile's first block: the blocks above it go back unread, then S and its probabilities.
  CUTE_DEVICE void mma_first_block(FwdTile const& tile) {
    if constexpr (Mask::kSkipUnseen) {
      for (int n = tile.n_block_max - 1; n > n_top; --n, ++kv) pipes.k.consumer_skip(kv), pipes.v.consumer_skip(kv);
    }
    q_stage = q.index();
    wait_q_k(q_stage);
    my_turn();
    issue_s(q_stage);
    pass_turn();
    ++q;
    cute::warpgroup_wait<0>();
    first_probs(tile.m_block * kBlockM, n_top);
  }

  // The rest of the tile's blocks: at each step S of block n_block and O += P V of the block
  // before it, both in flight; the softmax of S runs while P V still computes.
  CUTE_DEVICE void mma_blocks(FwdTile const& tile) {
    const int m0 = tile.m_block * kBlockM;
    auto s = scores();
    auto tScS_rc = coords_s();
    auto o_rc = acc_o_rc();
    for (int n_block = n_top - 1; n_block >= tile.n_block_min; --n_block, ++kv) {
      pipes.k.consumer_wait(kv);
      pipes.v.consumer_wait(kv - 1);
      my_turn();
      issue_s(q_stage);
      issue_pv();
      pass_turn();
      cute::warpgroup_wait<1>();  // S is done (P V, committed after it, may still run)
      pipes.k.consumer_release(kv);
      // The tile's last Q K^T is done: the producer may load a later tile's Q into this buffer
      // while this warpgroup still runs the last softmax and P V.
      if (n_block == tile.n_block_min) pipes.q.consumer_release(q - 1);
      // Whether any row of the warpgroup moved its maximum: O need not be touched where none did.
      // The warpgroup's answer, not the warp's, so that its four warps take the same side of the
      // branch below and reach the same wgmma wait.
      const bool shrink = warpgroup_any(
          scores_to_probs(m0, n_block, [&](int m0_, int n0) FLASHCUTE_INLINE { mask.apply(s, tScS_rc, m0_, n0); }), wg);
      // The wait for P V on both sides of the branch: ptxas moves a wgmma wait to the top of its
      // basic block, which would put it above the whole softmax.
      if (shrink) {
        cute::warpgroup_wait<0>();  // P V is done: O may be rescaled, and P's registers rewritten
        softmax.rescale_o(o_rc, rescale);
      } else {
        cute::warpgroup_wait<0>();
      }
      pipes.v.consumer_release(kv - 1);
      convert_fragment_into(acc_s, rP);
    }
    if (n_top == tile.n_block_min) pipes.q.consumer_release(q - 1);  // (no loop step ran)
  }

  // The tile's last P V, issued first: it needs nothing of the next tile, so the tensor cores run
  // it while the next tile is decoded. The turn stays taken.
  CUTE_DEVICE void mma_last_pv() {
    pipes.v.consumer_wait(kv - 1);
    my_turn();
    issue_pv();
  }

  // Whether the next tile's first S can go behind this tile's last P V: with two Q buffers its Q
  // is in the other one. (With one, its Q load starts only after the last Q K^T, and waiting for
  // it costs more than the epilogue it would hide.)
  CUTE_DEVICE static bool can_start_early(bool has_next, FwdTile const& next) {
    if constexpr (kQStages == 2) return has_next && next.has_blocks();
    return false;
  }

  // The next tile's first S, behind the last P V; then waits for that P V. The next tile's blocks
  // this warpgroup does not see go back first, their K now and their V once this tile's last V is
  // released: at most kStages - 1 of them, since the load of the K after them waits for that
  // release (the producer loads K and V in turn), and the next S waits for that K. Any more are
  // computed (and masked) as usual.
  CUTE_DEVICE void mma_next_first_s(FwdTile const& next) {
    const PipelineState<kStages> last = kv - 1;
    if constexpr (Mask::kSkipUnseen) {
      n_top = cute::max(mask.top_block(next.m_block, next.n_block_min, next.n_block_max), next.n_block_max - kStages);
      for (int n = next.n_block_max - 1; n > n_top; --n, ++kv) pipes.k.consumer_skip(kv);
    } else {
      n_top = next.n_block_max - 1;
    }
    const int next_q_stage = q.index();
    wait_q_k(next_q_stage);
    issue_s(next_q_stage);
    pass_turn();
    ++q;
    cute::warpgroup_wait<1>();  // the last P V is done; the next tile's S runs on under the epilogue
    pipes.v.consumer_release(last);
    if constexpr (Mask::kSkipUnseen) {
      for (PipelineState<kStages> s = last + 1; s.count < kv.count; ++s) pipes.v.consumer_skip(s);
    }
    q_stage = next_q_stage;
  }

  // After the epilogue: the next tile's first S has completed; its probabilities.
  CUTE_DEVICE void mma_next_first_probs(FwdTile const& next) {
    softmax = OnlineSoftmax<kRows>(scale_log2);
    cute::warpgroup_wait<0>();
    first_probs(next.m_block * kBlockM, n_top);
  }

  // Without an early S: the turn passes and the last P V completes. Returns the last block's V
  // stage, which the caller releases (release_v) after or before its epilogue.
  CUTE_DEVICE int mma_last_wait() {
    pass_turn();
    cute::warpgroup_wait<0>();
    return (kv - 1).index();
  }
  CUTE_DEVICE void release_last_v() { pipes.v.consumer_release(kv - 1); }
};

}  // namespace flashcute::sm90

#undef FLASHCUTE_INLINE
