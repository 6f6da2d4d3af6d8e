// flashcute/sm90/mainloop_fwd.hpp: the main loop of the sm90a forward kernel, by role.
//
// - FwdMainloop: the TMA rings of Q, K and V (pipeline.hpp) and the producer's load(): a tile's Q
//   into one of `q_stages` buffers, then its K and V blocks, from the last to the first, into
//   `stages`-deep rings. TMA zero-fills rows and columns outside the arrays, so no load needs a
//   predicate.
// - FwdMma: one consumer warpgroup's 64 rows of each tile: S = Q K^T with both operands read by
//   wgmma from shared memory, the online softmax on the accumulator, then O += P V with P taken
//   from registers. The S of the next block and the P V of this one are in flight together, so
//   the softmax runs under the tensor cores. With two Q buffers the next tile's first S runs
//   under this tile's epilogue.
//
// Each wgmma is waited for on the path that issued it: ptxas serialises every wgmma of the kernel
// if one is still in flight where two paths join. Every wgmma wait is reached by the four warps of
// a warpgroup at the same instruction (none sits behind a branch on a warp's own vote).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flashcute/common/fragment.hpp"
#include "flashcute/common/mask.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/softmax.hpp"
#include "flashcute/sm90/gmma.hpp"
#include "flashcute/sm90/mask.hpp"
#include "flashcute/sm90/pipeline.hpp"
#include "flashcute/sm90/scheduler.hpp"
#include "flashcute/sm90/traits.hpp"

namespace flashcute::sm90 {

// The row extents of the TMA tensors of q and of k and v, and their batch extent: a varlen batch
// is one batch of total_q / total_k rows.
struct FwdTmaExtents {
  int rows_q, rows_k, batches;
};
template <bool kVarlen>
CUTE_HOST_DEVICE FwdTmaExtents fwd_tma_extents(const FwdParams& p) {
  if constexpr (kVarlen) return {p.total_q, p.total_k, 1};
  else return {p.seqlen_q, p.seqlen_k, p.batch};
}

template <class Traits>
struct FwdMainloop {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  using TileQ = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>;
  using TileKV = cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using TileVt = cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>;
  // Every consumer warp releases each buffer once.
  using QPipeline = TmaPipeline<Traits::kQStages>;
  using KvPipeline = TmaPipeline<Traits::kStages>;
  using QState = PipelineState<Traits::kQStages>;
  using KvState = PipelineState<Traits::kStages>;
  using Storage = typename Traits::SharedStorage;

  const FwdKernelParams<Traits>& kp;
  Storage& storage;
  QPipeline q_pipe;
  KvPipeline k_pipe, v_pipe;

  CUTE_DEVICE FwdMainloop(const FwdKernelParams<Traits>& kp_, Storage& storage_)
      : kp(kp_), storage(storage_), q_pipe{storage_.q_bar}, k_pipe{storage_.k_bar}, v_pipe{storage_.v_bar} {}

  // By one thread, before any other thread waits on or arrives at the barriers (then a fence and
  // a CTA barrier).
  CUTE_DEVICE static void init_barriers(Storage& storage) {
    QPipeline::init(storage.q_bar, Traits::kConsumerWarpgroups * 4);
    KvPipeline::init(storage.k_bar, Traits::kConsumerWarpgroups * 4);
    KvPipeline::init(storage.v_bar, Traits::kConsumerWarpgroups * 4);
    if constexpr (Traits::kKvcache) {
      cutlass::arch::ClusterTransactionBarrier::init(&storage.fix_bar.k, 1);
      cutlass::arch::ClusterTransactionBarrier::init(&storage.fix_bar.v, 1);
    }
  }

  CUTE_DEVICE auto smem_q() const {  // (BLK_M,D,QPIPE)
    return cute::make_tensor(cute::make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
  }
  CUTE_DEVICE auto smem_k() const {  // (BLK_N,D,PIPE)
    return cute::make_tensor(cute::make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
  }
  CUTE_DEVICE auto smem_vt() const {  // (D,BLK_N,PIPE)
    return cute::make_tensor(cute::make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutVt{});
  }

  // Producer, one thread: a tile's Q (load q), then its K and V blocks from the top (load kv); a
  // KV cache's V blocks come from a second thread (load_cache_v).
  // The Q buffer is free once every consumer warp has run its last Q K^T of the tile that used it
  // before; a K/V stage once every consumer warp has read its block kStages before.
  // seq: a varlen or KV-cache tile's lengths (TileScheduler::rows; unused otherwise). fix_phase:
  // the phase of the thread's KV-cache fix barrier (load_cache_block).
  CUTE_DEVICE void load(const WorkTile& tile, const VarlenRows& seq, QState& q, KvState& kv, uint32_t& fix_phase) const {
    using namespace cute;
    const FwdParams& params = kp.params;
    const int head_k = tile.head / (params.nheads / params.nheads_k);
    const FwdTmaExtents ext = fwd_tma_extents<Traits::kVarlen>(params);
    Tensor mQ = kp.tma_q.get_tma_tensor(make_shape(ext.rows_q, params.head_dim, params.nheads, ext.batches));  // (Sq,d,H,B)
    // This tile's (batch, head); varlen: its sequence's rows of the one batch. Rows past a sequence
    // are the next one's (zero past the array): the mask hides its keys, its queries' O is not stored.
    Tensor mQ_bh = mQ(_, _, tile.head, Traits::kVarlen ? 0 : tile.batch);    // (Sq,d)
    auto from = [&](auto const& m, auto const& start) {
      if constexpr (Traits::kVarlen) return domain_offset(start, m);
      else return m;
    };
    Tensor gQ = local_tile(from(mQ_bh, make_coord(seq.q_start, _0{})), TileQ{}, make_coord(tile.m_block, 0));  // (BLK_M,D)
    auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(smem_q()),
                                      group_modes<0, 2>(gQ));  // (TMA), (TMA,QPIPE)
    copy(kp.tma_q.with(q_pipe.producer_acquire(q, Traits::kQBytes)), tQgQ, tQsQ(_, q.index()));
    ++q;
    if constexpr (Traits::kKvcache) {
      for (int n_block = tile.n_block_max - 1; n_block >= tile.n_block_min; --n_block, ++kv)
        load_cache_block<false>(tile.batch, head_k, seq.seqlen_k, n_block, kv, fix_phase);
    } else {
      Tensor mK = kp.tma_k.get_tma_tensor(make_shape(ext.rows_k, params.head_dim, params.nheads_k, ext.batches));  // (Sk,d,Hk,B)
      Tensor mVt = kp.tma_v.get_tma_tensor(make_shape(params.head_dim, ext.rows_k, params.nheads_k, ext.batches));  // (d,Sk,Hk,B)
      Tensor mK_bh = mK(_, _, head_k, Traits::kVarlen ? 0 : tile.batch);       // (Sk,d)
      Tensor mVt_bh = mVt(_, _, head_k, Traits::kVarlen ? 0 : tile.batch);     // (d,Sk)
      Tensor gK = local_tile(from(mK_bh, make_coord(seq.k_start, _0{})), TileKV{}, make_coord(_, 0));     // (BLK_N,D,n)
      Tensor gVt = local_tile(from(mVt_bh, make_coord(_0{}, seq.k_start)), TileVt{}, make_coord(0, _));  // (D,BLK_N,n)
      auto [tKgK, tKsK] = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(smem_k()),
                                        group_modes<0, 2>(gK));  // (TMA,n), (TMA,PIPE)
      auto [tVgV, tVsV] = tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(smem_vt()),
                                        group_modes<0, 2>(gVt));  // (TMA,n), (TMA,PIPE)
      for (int n_block = tile.n_block_max - 1; n_block >= tile.n_block_min; --n_block, ++kv) {
        copy(kp.tma_k.with(k_pipe.producer_acquire(kv, Traits::kKvBytes)), tKgK(_, n_block), tKsK(_, kv.index()));
        copy(kp.tma_v.with(v_pipe.producer_acquire(kv, Traits::kKvBytes)), tVgV(_, n_block), tVsV(_, kv.index()));
      }
    }
  }

  // The second producer thread of a KV-cache kernel: the tile's V blocks, as load() walks its K
  // blocks. K and V from two threads: a block of 16-key pages is 16 TMA instructions each.
  CUTE_DEVICE void load_cache_v(const WorkTile& tile, const VarlenRows& seq, KvState& kv, uint32_t& fix_phase) const {
    const int head_k = tile.head / (kp.params.nheads / kp.params.nheads_k);
    for (int n_block = tile.n_block_max - 1; n_block >= tile.n_block_min; --n_block, ++kv)
      load_cache_block<true>(tile.batch, head_k, seq.seqlen_k, n_block, kv, fix_phase);
  }

  // A KV cache's key block n_block of entry `batch`, KV head head_k, into stage kv: its V (kV) or
  // its K. A block that holds no cache row past the entry's keys is one TMA box where it lies in one
  // page (a contiguous cache's entry is one page), as in the fixed-length kernel, else boxes of
  // kMidBoxRows keys (pages that large) or kBoxRows keys, each from its page (block_table). A block
  // with rows past the keys comes in kBoxRows boxes; those at or past the keys read past the page,
  // which TMA fills with zeros.
  // Two kinds of box need mending before the consumers may read the block: one that holds the
  // entry's last key and rows past it (the cache holds anything there: a NaN would survive P = 0 in
  // P V), whose rows past the keys become zeros; and one whose page is outside [0, num_pages), read
  // as zeros by TMA, whose K rows become NaN: every query row that sees one of its keys gets a NaN
  // score, so NaN in O and the lse, and the rows the mask hides them from are untouched (V stays
  // zero). Such a block's TMA loads signal the loading thread's own barrier; it mends the buffer,
  // then releases it to the consumers.
  // (Defined in mainloop_kvcache.hpp.)
  template <bool kV>
  CUTE_DEVICE void load_cache_block(int batch, int head_k, int seqlen_k, int n_block, KvState kv,
                                    uint32_t& fix_phase) const;
};

// The consumers' side of the main loop: one warpgroup's 64 query rows of every tile the CTA walks,
// from the scheduler's first tile to its last, each finished by epilogue.store.
//
// run() keeps the consumer's state (accumulators, softmax, ring positions) as locals and its steps
// as lambdas over them: the same steps as member functions over the same state made ptxas spill
// at d 64 (256 x 64 tiles: 4/12 -> 16/32 bytes) and cost 2% there (docs/perf-notes.md, v74).
// The tile loop is here, not in the kernel, because tiles overlap: with two Q buffers the next
// tile's first S is issued behind this tile's last P V, and runs under its epilogue.
template <class Traits>
struct FwdMma {
  const FwdMainloop<Traits>& mainloop;
  const FwdMask<Traits>& mask;
  int mma_tid;  // the thread's index among the consumers

  template <class Scheduler, class Epilogue>
  CUTE_DEVICE void run(const Scheduler& scheduler, const Epilogue& epilogue) const {
    using namespace cute;
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kStages = Traits::kStages;
    constexpr int kQStages = Traits::kQStages;
    using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
    using TileS = Shape<Int<kBlockM>, Int<kBlockN>>;
    using KvState = typename FwdMainloop<Traits>::KvState;
    using QState = typename FwdMainloop<Traits>::QState;
    const FwdParams& params = mainloop.kp.params;
    auto const& q_pipe = mainloop.q_pipe;
    auto const& k_pipe = mainloop.k_pipe;
    auto const& v_pipe = mainloop.v_pipe;
    FwdMask<Traits> tile_mask = mask;  // varlen, KV cache: set to each tile's lengths (set_sequence)
    // A varlen or KV-cache tile's lengths (the mask's; a varlen tile's rows for the epilogue).
    auto sequence = [&](const WorkTile& t) __attribute__((always_inline)) {
      if constexpr (Traits::kTileLengths) return t.sequence();
      else return VarlenRows{};
    };
    const KeyMask& keys = tile_mask.keys;

    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(mma_tid);
    auto thr_pv = mma_pv.get_thread_slice(mma_tid);
    Tensor tSrQ = thr_qk.partition_fragment_A(mainloop.smem_q());   // (MMA,MMA_M,MMA_K,QPIPE) smem descriptors
    Tensor tSrK = thr_qk.partition_fragment_B(mainloop.smem_k());   // (MMA,MMA_N,MMA_K,PIPE)
    Tensor tOrV = thr_pv.partition_fragment_B(mainloop.smem_vt());  // (MMA,MMA_D,MMA_N,PIPE)
    Tensor acc_o = partition_fragment_C(mma_pv, TileQ{});           // ((2,2,D/8),MMA_M,MMA_D), fp32
    Tensor acc_o_rc = make_tensor(acc_o.data(), gmma_rowcol_layout(acc_o.layout()));  // ((2,MMA_M),(2,D/8,MMA_D))
    Tensor tScS = thr_qk.partition_C(make_identity_tensor(TileS{}));                  // ((2,2,N/8),MMA_M,MMA_N) -> (row,col)
    Tensor tScS_rc = make_tensor(tScS.data(), gmma_rowcol_layout(tScS.layout()));    // ((2,MMA_M),(2,N/8,MMA_N))
    CUTE_STATIC_ASSERT_V(size<1>(acc_o) == _1{});                 // one 64-row atom per warpgroup
    CUTE_STATIC_ASSERT_V(size<2>(tSrQ) == Int<kHeadDim / 16>{});  // k16 slices of the head dim
    CUTE_STATIC_ASSERT_V(size<2>(tOrV) == Int<kBlockN / 16>{});   // k16 slices of a key block

    const bool use_softcap = params.softcap > 0.f;
    const float softcap_prescale = use_softcap ? params.softmax_scale / params.softcap : 0.f;
    constexpr float kLog2e = 1.4426950408889634f;
    const float scale_log2 = (use_softcap ? params.softcap : params.softmax_scale) * kLog2e;
    constexpr int kRows = decltype(size<0>(acc_o_rc))::value;

    // Ping-pong (d 96, 128): the two warpgroups issue their GEMMs in turns.
    constexpr bool kPingpong = Traits::kConfig.pingpong;
    const WarpgroupTurns<kPingpong> turns{tile_mask.wg};
    turns.start();

    // S and P live across main-loop steps: while the tensor cores compute the next block's S and
    // this block's P V, the softmax of the next block waits only for its S.
    Tensor acc_s = partition_fragment_C(mma_qk, TileS{});                            // ((2,2,N/8),MMA_M,MMA_N), fp32
    Tensor scores = make_tensor(acc_s.data(), gmma_rowcol_layout(acc_s.layout()));  // ((2,MMA_M),(2,N/8,MMA_N))
    Tensor rP = make_fragment_like<Element>(acc_s);                                 // ((2,2,N/8),MMA_M,MMA_N)
    Tensor tOrP = make_tensor(rP.data(), gmma_acc_to_a_layout(rP.layout()));        // ((2,2,2),MMA_M,(N/16,MMA_N))
    float rescale[kRows];  // how much each row of O must shrink

    // `q` counts the Q loads this warpgroup has used, `kv` the K/V blocks, as the producer counts
    // them. Each wgmma is waited for on the path that issued it: ptxas serialises every wgmma of
    // the kernel if one is still in flight where two paths join.
    KvState kv;
    QState q;
    int q_stage = 0;          // the Q buffer of the tile being computed
    bool first_done = false;  // its first block's probabilities are in rP already (the early path)
    OnlineSoftmax<kRows> softmax(scale_log2);
    // Each tile is decoded once, after the tile before it has run its main loop and issued its
    // last P V, where the next tile's first S needs it.
    WorkTile tile = scheduler.first();
    WorkTile next;
    int n_top = 0;  // the first block this warpgroup computes in `tile` (tile_mask.top_block)

    // Softcap an S accumulator, or the part of one that acc views (a no-op without a softcap).
    auto apply_softcap = [&](auto& acc) __attribute__((always_inline)) {
      if (use_softcap) {
        CUTE_UNROLL
        for (int j = 0; j < size(acc); ++j) acc(j) = tanhf(acc(j) * softcap_prescale);
      }
    };
    // Softcap, mask and exponentiate the scores (acc_s) of block n_block of the tile at row
    // tile_m0, and say how much O must shrink (rescale[]): FlashAttention-4's lazy rescale, a
    // row's maximum moves only when it grows by more than 2^8 (+1.4-6.7% at d 256). Returns false
    // where no row of this warp moved its maximum, so that O need not be touched. mask_block masks
    // the scores where tile_mask.needs_mask says they need one.
    auto scores_to_probs = [&](int tile_m0, int n_block, auto const& mask_block) __attribute__((always_inline)) {
      const int n0 = n_block * kBlockN;
      apply_softcap(acc_s);
      if (tile_mask.needs_mask(tile_m0, n0)) mask_block(tile_m0, n0);
      return __any_sync(0xffffffff, softmax.rescale_scores_lazy(scores, rescale));
    };
    auto mask_whole = [&](int tile_m0, int n0) __attribute__((always_inline)) {
      keys.apply(scores, tScS_rc, tile_m0, n0);
    };

    // Wait for the Q of load `q` and the K of block `kv`.
    auto wait_q_k = [&]() __attribute__((always_inline)) {
      q_pipe.consumer_wait(q);
      k_pipe.consumer_wait(kv);
    };
    // Issue S = Q K^T (Q: one buffer's descriptors, K: the stage of `kv`), or O += P V of the
    // block before `kv`. Not waited for: each caller waits on its own path.
    auto issue_s = [&](auto const& tSrQ_q) __attribute__((always_inline)) {
      wgmma_gemm<true, false>(mma_qk, tSrQ_q, tSrK(_, _, _, kv.index()), acc_s);
    };
    auto issue_pv = [&]() __attribute__((always_inline)) {
      wgmma_gemm<false, true>(mma_pv, tOrP, tOrV(_, _, _, (kv - 1).index()), acc_o);
    };

    // The left half of the S accumulator and of its coordinates (the same registers), for a block
    // whose right half no row of this warpgroup sees (FwdMask::kHalfFirst).
    constexpr bool kHalfFirst = FwdMask<Traits>::kHalfFirst;
    constexpr bool kSkipUnseen = FwdMask<Traits>::kSkipUnseen;
    using TileSHalf = Shape<Int<kBlockM>, Int<kBlockN / 2>>;
    typename Traits::TiledMmaQKHalf mma_qk_half;
    auto thr_qk_half = mma_qk_half.get_thread_slice(mma_tid);
    Tensor acc_s_half = make_tensor(acc_s.data(), partition_fragment_C(mma_qk_half, TileSHalf{}).layout());  // ((2,2,N/16),MMA_M,MMA_N)
    Tensor scores_half = make_tensor(acc_s.data(), gmma_rowcol_layout(acc_s_half.layout()));  // ((2,MMA_M),(2,N/16,MMA_N))
    Tensor tScS_half = thr_qk_half.partition_C(make_identity_tensor(TileSHalf{}));            // ((2,2,N/16),MMA_M,MMA_N) -> (row,col)
    Tensor tScS_half_rc = make_tensor(tScS_half.data(), gmma_rowcol_layout(tScS_half.layout()));  // ((2,MMA_M),(2,N/16,MMA_N))
    constexpr int kHalf = decltype(size(acc_s_half))::value;  // acc_s's registers of each half
    CUTE_STATIC_ASSERT_V(Int<kHalf * 2>{} == size(acc_s));
    // The mask of a tile's first block (FwdMask::apply_first).
    auto mask_first = [&](int tile_m0, int n0) __attribute__((always_inline)) {
      Tensor scores_right = make_tensor(acc_s.data() + kHalf, scores_half.layout());  // ((2,MMA_M),(2,N/16,MMA_N))
      tile_mask.apply_first(scores, tScS_rc, scores_right, tScS_half_rc, tile_m0, n0);
    };
    // A tile's first block, once its S has completed: the K stage is free, the probabilities go to
    // rP (O is still zero: nothing to rescale), and the block is counted. Where this warpgroup sees
    // none of the block's right half, only the left half is masked and exponentiated, and P's
    // right half is zero (P V still runs over the whole block); otherwise mask_first masks it.
    auto first_probs = [&](int tile_m0, int n_block) __attribute__((always_inline)) {
      k_pipe.consumer_release(kv);
      if constexpr (kHalfFirst) {
        if (tile_mask.right_half_unseen(tile_m0, n_block)) {
          apply_softcap(acc_s_half);
          keys.apply(scores_half, tScS_half_rc, tile_m0, n_block * kBlockN);
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

    while (!scheduler.done(tile)) {
      const int m0 = tile.m_block * kBlockM;
      clear(acc_o);
      if (!first_done) softmax = OnlineSoftmax<kRows>(scale_log2);
      if constexpr (Traits::kTileLengths) {
        if (!first_done) tile_mask.set_sequence(sequence(tile));  // (the early path set it for its tile)
      }
      // The first (last, possibly ragged) block this warpgroup computes: where the tile's first
      // probabilities are in rP already, the early path below chose it.
      if constexpr (kSkipUnseen) {
        if (!first_done) n_top = tile_mask.top_block(tile);
      } else {
        n_top = tile.n_block_max - 1;
      }
      if (tile.has_keys()) {
        // The first block: S, then its probabilities; O is still zero.
        if (!first_done) {
          // The blocks above it go back to the producer unread.
          if constexpr (kSkipUnseen) {
            for (int n = tile.n_block_max - 1; n > n_top; --n, ++kv) k_pipe.consumer_skip(kv), v_pipe.consumer_skip(kv);
          }
          q_stage = q.index();
          wait_q_k();
          turns.wait();
          issue_s(tSrQ(_, _, _, q_stage));
          turns.pass();
          ++q;
          warpgroup_wait<0>();
          first_probs(m0, n_top);
        }
        Tensor tSrQ_tile = tSrQ(_, _, _, q_stage);  // (MMA,MMA_M,MMA_K)

        // At each step, S of block n_block and O += P V of the block before it, both in flight at
        // once; the softmax of S runs while P V still computes. That P V completes at the top of
        // the next step (or after the last), where O is rescaled if a row of this warp moved its
        // maximum, the V buffer goes back and the new P is written. The wait sits behind the
        // loop's branch: there it is one instruction for all four warps of the warpgroup (a branch
        // on the warp's own vote would split them), and ptxas, which moves a wgmma wait to the top
        // of its basic block, cannot move it above the softmax.
        bool shrink = false;
        auto finish_pv = [&]() __attribute__((always_inline)) {
          warpgroup_wait<0>();  // the last step's P V is done: O may be rescaled, P rewritten
          if (shrink) softmax.rescale_o(acc_o_rc, rescale);
          v_pipe.consumer_release(kv - 2);
          convert_fragment_into(acc_s, rP);
        };
        auto step = [&](int n_block) __attribute__((always_inline)) {
          k_pipe.consumer_wait(kv);
          v_pipe.consumer_wait(kv - 1);
          turns.wait();
          issue_s(tSrQ_tile);
          issue_pv();
          turns.pass();
          warpgroup_wait<1>();  // S is done (P V, committed after it, may still run)
          k_pipe.consumer_release(kv);
          // The tile's last Q K^T is done: the producer may load a later tile's Q into this buffer
          // while this warpgroup still runs the last softmax and P V.
          if (n_block == tile.n_block_min) q_pipe.consumer_release(q_stage);
          shrink = scores_to_probs(m0, n_block, mask_whole);
        };
        if constexpr (kPingpong) {
          // The first step peeled, so that the loop body opens with finish_pv unconditionally
          // (+3% at d 128 causal 16k); without ping-pong the peeled copy costs 10-17% at d 64.
          if (n_top - 1 >= tile.n_block_min) {
            step(n_top - 1);
            ++kv;
            for (int n_block = n_top - 2; n_block >= tile.n_block_min; --n_block, ++kv) {
              finish_pv();
              step(n_block);
            }
          }
        } else {
          for (int n_block = n_top - 1; n_block >= tile.n_block_min; --n_block, ++kv) {
            if (n_block < n_top - 1) finish_pv();
            step(n_block);
          }
        }
        if (n_top > tile.n_block_min) finish_pv();
        if (n_top == tile.n_block_min) q_pipe.consumer_release(q_stage);  // (no loop step ran)
        v_pipe.consumer_wait(kv - 1);
        // The last P V goes first: it needs nothing of the next tile, so the tensor cores run it
        // while the next tile is decoded (+2-3% at d 64 1k, +1-2% at d 128 1k).
        turns.wait();
        issue_pv();
        // With two Q buffers, the next tile's first S goes behind the last P V. (With one, its Q
        // load starts only now, after the last Q K^T, and waiting for it costs more than the
        // epilogue it would hide: -6.7% at d 256 1k.)
        next = scheduler.next(tile);
        bool early = false;
        if constexpr (kQStages == 2) early = !scheduler.done(next) && next.has_keys();
        if (early) {
          if constexpr (Traits::kTileLengths) tile_mask.set_sequence(sequence(next));
          // Its Q is in the other buffer; only the next S needs the next tile's Q and K, and acc_s
          // is free once P is converted. The next tile's blocks this warpgroup does not see go
          // back first, their K now and their V once this tile's last V is released: at most
          // kStages - 1 of them, since the load of the K after them waits for that release (the
          // producer loads K and V in turn), and the next S waits for that K. Any more are
          // computed (and masked) as before.
          const KvState last = kv - 1;
          if constexpr (kSkipUnseen) {
            n_top = max(tile_mask.top_block(next), next.n_block_max - kStages);
            for (int n = next.n_block_max - 1; n > n_top; --n, ++kv) k_pipe.consumer_skip(kv);
          } else {
            n_top = next.n_block_max - 1;
          }
          const int next_q_stage = q.index();
          wait_q_k();
          issue_s(tSrQ(_, _, _, next_q_stage));
          turns.pass();
          ++q;
          warpgroup_wait<1>();  // the last P V is done; the next tile's S runs on under the epilogue
          v_pipe.consumer_release(last);
          if constexpr (kSkipUnseen) {
            for (KvState s = last + 1; s.count < kv.count; ++s) v_pipe.consumer_skip(s);
          }
          epilogue.store(tile, sequence(tile), softmax, acc_o, -1);
          softmax = OnlineSoftmax<kRows>(scale_log2);
          warpgroup_wait<0>();
          first_probs(next.m_block * kBlockM, n_top);
          q_stage = next_q_stage;
          first_done = true;
        } else {
          turns.pass();
          warpgroup_wait<0>();
          if constexpr (Traits::kConfig.o_via_v) {
            epilogue.store(tile, sequence(tile), softmax, acc_o, (kv - 1).index());  // O staged in the last V buffer
            // This thread's shared-memory writes and reads (generic proxy) are ordered before the
            // TMA load (async proxy) that refills the buffer once the producer sees the release.
            cutlass::arch::fence_view_async_shared();
            v_pipe.consumer_release(kv - 1);
          } else {
            v_pipe.consumer_release(kv - 1);
            epilogue.store(tile, sequence(tile), softmax, acc_o, -1);
          }
          first_done = false;
        }
      } else {
        epilogue.store(tile, sequence(tile), softmax, acc_o, -1);  // no key visible: O = 0, lse = -inf
        first_done = false;
        next = scheduler.next(tile);
      }
      tile = next;
    }
    turns.finish();
  }
};

}  // namespace flashcute::sm90

#include "flashcute/sm90/mainloop_kvcache.hpp"  // FwdMainloop::load_cache_block
