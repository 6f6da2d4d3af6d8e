// flashcute/sm90/mainloop_bwd.hpp: the main loop of the sm90a backward, by role.
//
// - BwdMainloop::load (producer, one thread): the CTA's K and V once, then each step's Q and dO
//   into a `stages`-deep ring (pipeline.hpp), for every query head of the group and every query
//   block that sees the CTA's keys. TMA zero-fills rows and columns outside the arrays.
// - BwdMainloop::mma_wg (each MMA warpgroup): per step, S^T and dP^T, P^T and dS^T in registers,
//   dV += P^T dO from registers, dS into shared memory, dQ = dS K over both warpgroups' halves of
//   dS, dK += dS^T Q from registers, and dQ staged for the writer warp while dK runs, which adds it
//   into the fp32 accumulator in global memory. Each warpgroup computes half of dQ, or (dq_one_wg)
//   warpgroup 1 all of it, while 0 hands its half of dS over and goes on. dK and dV stay in
//   registers until the end.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flashcute/common/fragment.hpp"
#include "flashcute/common/mask.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/store.hpp"
#include "flashcute/sm90/gmma.hpp"
#include "flashcute/sm90/pipeline.hpp"
#include "flashcute/sm90/scheduler.hpp"
#include "flashcute/sm90/traits_bwd.hpp"

namespace flashcute::sm90 {

// dst[0, bytes) = src[0, bytes) by the TMA unit, counted on `bar` (one thread; 16-byte aligned).
CUTE_DEVICE void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t& bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   cute::cast_smem_ptr_to_uint(dst)),
               "l"(src), "r"(bytes), "r"(cute::cast_smem_ptr_to_uint(&bar))
               : "memory");
}

// dst[0, bytes) += src[0, bytes), fp32, by the TMA unit (one thread; commit and wait as for a
// TMA store: cute::tma_store_arrive / tma_store_wait).
CUTE_DEVICE void bulk_reduce_add(float* dst, const float* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
               "r"(cute::cast_smem_ptr_to_uint(src)), "r"(bytes)
               : "memory");
}

// Deterministic dQ (BwdKernelParams::dq_semaphore): a block's adds go in turn. wait_turn spins
// until the block's count says it is this CTA's turn; pass_turn waits for the add to land in
// global memory (wait_group, not wait_group.read, which only says the source was read) and
// counts it. The proxy fences order the async-proxy reduces with the generic-proxy counter.
// (count < turn, not !=: the same for valid inputs, where the count stops at each turn until it is
// taken, but a varlen batch whose cu_seqlens descend may place two sequences' blocks on one count,
// and then the wait must still end.)
CUTE_DEVICE void wait_turn(const int* sem, int turn) {
  int count;
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(count) : "l"(sem) : "memory");
  } while (count < turn);
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
CUTE_DEVICE void pass_turn(int* sem) {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(sem) : "memory");
}

// The (rows, d, heads, batch) extents of the TMA tensors of q and dout (keys: k and v). A varlen
// batch is one batch of all its rows; BwdBatch says where each sequence starts.
CUTE_HOST_DEVICE auto bwd_tma_shape(const BwdParams& p, bool keys) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int rows = keys ? (varlen ? p.total_k : p.seqlen_k) : (varlen ? p.total_q : p.seqlen_q);
  return cute::make_shape(rows, p.head_dim, keys ? p.nheads_k : p.nheads, varlen ? 1 : p.batch);
}

template <class Traits>
struct BwdMainloop {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr bool kRotate = Traits::kConfig.rotate;  // BwdTile::m_at
  static constexpr int kHeadDim = Traits::kHeadDim;
  using Pipeline = TmaPipeline<Traits::kStages>;
  using State = PipelineState<Traits::kStages>;
  using Storage = typename Traits::SharedStorage;

  const BwdKernelParams<Traits>& kp;
  Storage& storage;
  Pipeline qdo_pipe;

  CUTE_DEVICE BwdMainloop(const BwdKernelParams<Traits>& kp_, Storage& storage_)
      : kp(kp_), storage(storage_), qdo_pipe{storage_.qdo_bar} {}

  CUTE_DEVICE static void init_barriers(Storage& storage) {
    Pipeline::init(storage.qdo_bar, Traits::kMmaThreads);  // each MMA thread releases (consumer_release_thread)
    cutlass::arch::ClusterTransactionBarrier::init(&storage.kv_full, 1);
    if constexpr (Traits::kPersistent) {
      for (int i = 0; i < 2; ++i) {
        cutlass::arch::ClusterBarrier::init(&storage.tile_full[i], 1);
        cutlass::arch::ClusterBarrier::init(&storage.tile_empty[i], 32 + Traits::kMmaThreads);
      }
      cutlass::arch::ClusterBarrier::init(&storage.kv_empty, Traits::kMmaThreads);
    }
    if constexpr (requires { storage.dq_added; }) {  // split_d
      for (int i = 0; i < 2; ++i) {
        cutlass::arch::ClusterBarrier::init(&storage.dq_added[i], Traits::kMmaThreads);
        cutlass::arch::ClusterBarrier::init(&storage.dq_released[i], 1);
      }
    }
  }

  CUTE_DEVICE auto smem(Element* p, auto layout) const { return cute::make_tensor(cute::make_smem_ptr(p), layout); }

  // The workspace row (lse, D, dQ accumulator) of query row 0 of query head `head` in the tile.
  CUTE_DEVICE int64_t head_rows(const BwdTile& tile, int head) const {
    return tile.seq.rows + int64_t(head) * kp.padded_rows;
  }
  // Deterministic: query block m's dQ add count (one per 64 workspace rows); nullptr otherwise.
  CUTE_DEVICE int* dq_count(int64_t rows, int m) const {
    return kp.dq_semaphore == nullptr ? nullptr : kp.dq_semaphore + (rows + int64_t(m) * kBlockM) / 64;
  }

  // persistent: the tile ring. The producer publishes its i-th tile index (gridDim.x or more: none
  // left); the writer warp and the MMA warps read it in turn.
  CUTE_DEVICE void publish_tile(int i, int t) const {
    const int slot = i & 1;
    if (i >= 2) cutlass::arch::ClusterBarrier::wait(&storage.tile_empty[slot], ((i >> 1) - 1) & 1);
    storage.tile_slot[slot] = t;
    cutlass::arch::ClusterBarrier::arrive(&storage.tile_full[slot]);
  }
  CUTE_DEVICE int read_tile(int i) const {
    const int slot = i & 1;
    cutlass::arch::ClusterBarrier::wait(&storage.tile_full[slot], (i >> 1) & 1);
    const int t = storage.tile_slot[slot];
    cutlass::arch::ClusterBarrier::arrive(&storage.tile_empty[slot]);
    return t;
  }

  // Producer, one thread: the CTA's tile.
  CUTE_DEVICE void load(const BwdTile& tile) const { load(tile, nullptr, 0); }
  // persistent: the CTA's j-th tile (from 0), once the MMA warps are done with the K and V of tile
  // j - 1; the Q/dO stages continue from *carried (the tile before's) and are left there.
  CUTE_DEVICE void load(const BwdTile& tile, State* carried, int j) const {
    using namespace cute;
    const BwdParams& p = kp.params;
    const int group = p.nheads / p.nheads_k;
    Tensor mQ = kp.tma_q.get_tma_tensor(bwd_tma_shape(p, false));   // (Sq,d,H,B); varlen (total_q,d,H,1)
    Tensor mdO = kp.tma_do.get_tma_tensor(bwd_tma_shape(p, false));  // (Sq,d,H,B)
    Tensor mK = kp.tma_k.get_tma_tensor(bwd_tma_shape(p, true));     // (Sk,d,Hk,B); varlen (total_k,d,Hk,1)
    Tensor mV = kp.tma_v.get_tma_tensor(bwd_tma_shape(p, true));     // (Sk,d,Hk,B)
    using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
    using TileK = Shape<Int<kBlockN>, Int<kHeadDim>>;
    // This batch entry's rows: from row q_start / k_start of one varlen batch. Rows past an entry
    // are the next entry's (zero past the array): its padding rows' lse (+inf) gives them P = 0,
    // and the mask hides keys past seqlen_k.
    const BwdBatch& seq = tile.seq;
    auto keys_of = [&](const auto& m) {  // (Sk,d) of this entry and KV head
      return domain_offset(make_coord(seq.k_start, _0{}), m(_, _, tile.head_k, seq.tma_batch));
    };
    Tensor gK = local_tile(keys_of(mK), TileK{}, make_coord(tile.n_block, 0));  // (BLK_N,D)
    Tensor gV = local_tile(keys_of(mV), TileK{}, make_coord(tile.n_block, 0));  // (BLK_N,D)
    Tensor sK = smem(storage.k.data(), typename Traits::SmemLayoutK{});                                // (BLK_N,D)
    Tensor sV = smem(storage.v.data(), typename Traits::SmemLayoutK{});                                // (BLK_N,D)
    Tensor sQ = smem(storage.q.data(), typename Traits::SmemLayoutQ{});                                // (BLK_M,D,PIPE)
    Tensor sdO = smem(storage.dout.data(), typename Traits::SmemLayoutQ{});                            // (BLK_M,D,PIPE)
    auto [tKgK, tKsK] = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    if constexpr (Traits::kPersistent) {
      if (j > 0) cutlass::arch::ClusterBarrier::wait(&storage.kv_empty, (j - 1) & 1);
    }
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&storage.kv_full, 2 * Traits::kKBytes);
    copy(kp.tma_k.with(storage.kv_full), tKgK, tKsK);
    copy(kp.tma_v.with(storage.kv_full), tVgV, tVsV);
    State st = carried != nullptr ? *carried : State{};
    for (int g = 0; g < group; ++g) {
      const int head = tile.head_k * group + g;
      auto queries_of = [&](const auto& m) {  // (Sq,d) of this entry and head
        return domain_offset(make_coord(seq.q_start, _0{}), m(_, _, head, seq.tma_batch));
      };
      Tensor gQ = local_tile(queries_of(mQ), TileQ{}, make_coord(_, 0));    // (BLK_M,D,m)
      Tensor gdO = local_tile(queries_of(mdO), TileQ{}, make_coord(_, 0));  // (BLK_M,D,m)
      auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto [tOgO, tOsO] =
          tma_partition(kp.tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
      const int64_t rows = head_rows(tile, head);
      // Two loops: the unrotated one kept token for token as it was. Every other form of it that was
      // tried (one PTX register more or less) changed ptxas's allocation of the whole d 128 kernel,
      // and those builds measured 2% slower (perf-notes, b28).
      if constexpr (kRotate) {
        for (int m_step = tile.m_first; m_step < tile.m_last; ++m_step, ++st) {
          const int m = tile.m_at<true>(m_step);
          uint64_t& full = qdo_pipe.producer_acquire(st, 2 * Traits::kQBytes + 2 * Traits::kRowBytes);
          copy(kp.tma_q.with(full), tQgQ(_, m), tQsQ(_, st.index()));
          copy(kp.tma_do.with(full), tOgO(_, m), tOsO(_, st.index()));
          bulk_load(storage.lse2.data() + st.index() * kBlockM, kp.lse2 + rows + m * kBlockM, Traits::kRowBytes,
                    full);
          bulk_load(storage.dpsum.data() + st.index() * kBlockM, kp.dpsum + rows + m * kBlockM, Traits::kRowBytes,
                    full);
        }
      } else {
        for (int m = tile.m_first; m < tile.m_last; ++m, ++st) {
          uint64_t& full = qdo_pipe.producer_acquire(st, 2 * Traits::kQBytes + 2 * Traits::kRowBytes);
          copy(kp.tma_q.with(full), tQgQ(_, m), tQsQ(_, st.index()));
          copy(kp.tma_do.with(full), tOgO(_, m), tOsO(_, st.index()));
          bulk_load(storage.lse2.data() + st.index() * kBlockM, kp.lse2 + rows + m * kBlockM, Traits::kRowBytes,
                    full);
          bulk_load(storage.dpsum.data() + st.index() * kBlockM, kp.dpsum + rows + m * kBlockM, Traits::kRowBytes,
                    full);
        }
      }
    }
    if (carried != nullptr) *carried = st;
  }

  // The dQ writer, one warp: each step's dQ, in two halves (traits_bwd.hpp) that MMA warpgroup h
  // stages in shared memory (dq_one_wg: warpgroup 1 both), from there into the global accumulator
  // by a bulk reduce each. Each half has its own full/empty barrier pair, so half 0 is added while
  // half 1 is still computed or staged.
  CUTE_DEVICE void write_dq(const BwdTile& tile, const KeyMask& keys) const {
    const bool leader = cute::elect_one_sync();
    write_dq_begin();
    write_dq(tile, keys, leader);
    write_dq_end(leader);
  }
  CUTE_DEVICE void write_dq_begin() const {
    using cutlass::arch::NamedBarrier;
    for (int h = 0; h < 2; ++h) NamedBarrier::arrive(128 + 32, NamedBarriers::kBwdDqEmpty + h);  // start empty
  }
  CUTE_DEVICE void write_dq_end(bool leader) const {  // every add landed before the CTA exits
    if (leader) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  CUTE_DEVICE void write_dq(const BwdTile& tile, const KeyMask& keys, bool leader) const {
    using cutlass::arch::NamedBarrier;
    const BwdParams& p = kp.params;
    const int group = p.nheads / p.nheads_k;
    constexpr int kThreads = 128 + 32;
    constexpr int kHalf = Traits::kDqChunk / 2;
    constexpr uint32_t kBytes = kHalf * sizeof(float);
    static_assert(kBlockM % 64 == 0, "the workspace has one dQ add count per 64 rows (config.hpp)");
    for (int g = 0; g < group; ++g) {
      const int64_t rows = head_rows(tile, tile.head_k * group + g);
      float* dq_accum = kp.dq_accum + rows * kHeadDim;
      for (int m = tile.m_first; m < tile.m_last; ++m) {
        int* sem = dq_count(rows, tile.m_at<kRotate>(m));
        for (int h = 0; h < 2; ++h) {
          NamedBarrier::sync(kThreads, NamedBarriers::kBwdDqFull + h);
          if (leader) {
            if (sem && h == 0) wait_turn(sem, bwd_dq_turn<kBlockM, kBlockN>(keys, tile, tile.m_at<kRotate>(m)));
            bulk_reduce_add(dq_accum + int64_t(tile.m_at<kRotate>(m)) * kBlockM * kHeadDim + h * kHalf,
                            storage.dq.data() + h * kHalf, kBytes);
            cute::tma_store_arrive();
          }
        }
        // A half's buffer is free once its add has read it (deterministic: once it has landed).
        if (leader) {
          if (sem)
            pass_turn(sem);
          else
            cute::tma_store_wait<1>();
        }
        __syncwarp();
        NamedBarrier::arrive(kThreads, NamedBarriers::kBwdDqEmpty + 0);
        if (leader) cute::tma_store_wait<0>();
        __syncwarp();
        NamedBarrier::arrive(kThreads, NamedBarriers::kBwdDqEmpty + 1);
      }
    }
  }

  // An MMA warpgroup (mma_tid in [0, 256)): the whole tile, then dK and dV stored. Each computes
  // its half of dQ (both run kWg = 0), or with dq_one_wg warpgroup kWg = 1 both halves and 0 none.
  template <int kWg>
  CUTE_DEVICE void mma_wg(const BwdTile& tile, const KeyMask& keys, int mma_tid) const {
    State st;
    int ds_buf = 0;
    mma_wg<kWg>(tile, keys, mma_tid, st, ds_buf, 0);
  }
  // The writer's last arrivals on the halves this warpgroup staged; dq_one_wg, warpgroup 0:
  // warpgroup 1's last arrivals (its dQ has read all of K).
  template <int kWg>
  CUTE_DEVICE void mma_end(int mma_tid) const {
    using cutlass::arch::NamedBarrier;
    constexpr int kDqThreads = 128 + 32;
    if constexpr (!Traits::kDqOneWg) {
      NamedBarrier::sync(kDqThreads, NamedBarriers::kBwdDqEmpty + mma_tid / 128);
    } else if constexpr (kWg == 1) {
      for (int h = 0; h < 2; ++h) NamedBarrier::sync(kDqThreads, NamedBarriers::kBwdDqEmpty + h);
    } else {
      for (int b = 0; b < 2; ++b) NamedBarrier::sync(Traits::kMmaThreads, NamedBarriers::kBwdDsFree + b);
    }
  }
  template <int kWg>
  CUTE_DEVICE void mma_wg(const BwdTile& tile, const KeyMask& keys, int mma_tid, State& st, int& ds_buf, int j) const {
    using namespace cute;
    const BwdParams& p = kp.params;
    const int group = p.nheads / p.nheads_k;
    const int n0 = tile.n_block * kBlockN;
    const int wg = Traits::kDqOneWg ? kWg : mma_tid / 128;
    constexpr bool kOneWay = Traits::kDqOneWg;
    Tensor sK = smem(storage.k.data(), typename Traits::SmemLayoutK{});      // (BLK_N,D)
    Tensor sKt = smem(storage.k.data(), typename Traits::SmemLayoutKt{});    // (D,BLK_N)
    Tensor sV = smem(storage.v.data(), typename Traits::SmemLayoutK{});      // (BLK_N,D)
    Tensor sQ = smem(storage.q.data(), typename Traits::SmemLayoutQ{});      // (BLK_M,D,PIPE)
    Tensor sQt = smem(storage.q.data(), typename Traits::SmemLayoutQt{});    // (D,BLK_M,PIPE)
    Tensor sdO = smem(storage.dout.data(), typename Traits::SmemLayoutQ{});  // (BLK_M,D,PIPE)
    Tensor sdOt = smem(storage.dout.data(), typename Traits::SmemLayoutQt{});  // (D,BLK_M,PIPE)
    Tensor sdS = smem(storage.ds.data(), typename Traits::SmemLayoutDS{});     // (BLK_M,BLK_N,2)
    Tensor sdSt = smem(storage.ds.data(), typename Traits::SmemLayoutDSt{});   // (BLK_N,BLK_M,2)

    using TileSt = Shape<Int<kBlockN>, Int<kBlockM>>;
    typename Traits::TiledMmaSdP mma_sdp;
    auto thr_sdp = mma_sdp.get_thread_slice(mma_tid);
    Tensor tSrK = thr_sdp.partition_fragment_A(sK);     // (MMA,MMA_N,MMA_K) smem descriptors
    Tensor tSrV = thr_sdp.partition_fragment_A(sV);     // (MMA,MMA_N,MMA_K)
    Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);     // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);   // (MMA,MMA_M,MMA_K,PIPE)
    Tensor acc_s = partition_fragment_C(mma_sdp, TileSt{});   // ((2,2,M/8),1,1) fp32: S^T, then P^T
    Tensor acc_dp = partition_fragment_C(mma_sdp, TileSt{});  // ((2,2,M/8),1,1) fp32: dP^T, then dS^T
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(TileSt{}));  // ((2,2,M/8),1,1) -> (key,query)
    Tensor s_rc = make_tensor(acc_s.data(), gmma_rowcol_layout(acc_s.layout()));    // ((2,1),(2,M/8,1)) keys x queries
    Tensor dp_rc = make_tensor(acc_dp.data(), gmma_rowcol_layout(acc_dp.layout()));
    Tensor c_rc = make_tensor(tScS.data(), gmma_rowcol_layout(tScS.layout()));
    constexpr int kCols = decltype(size<1>(s_rc))::value;  // this thread's queries per step

    typename Traits::TiledMmaKV mma_kv;
    auto thr_kv = mma_kv.get_thread_slice(mma_tid);
    Tensor tKVrdOt = thr_kv.partition_fragment_B(sdOt);  // (MMA,MMA_D,MMA_K,PIPE)
    Tensor tKVrQt = thr_kv.partition_fragment_B(sQt);    // (MMA,MMA_D,MMA_K,PIPE)
    Tensor acc_dv = partition_fragment_C(mma_kv, Shape<Int<kBlockN>, Int<kHeadDim>>{});  // ((2,2,D/8),1,1)
    Tensor acc_dk = partition_fragment_C(mma_kv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    Tensor rP = make_fragment_like<Element>(acc_s);
    Tensor rdS = make_fragment_like<Element>(acc_dp);
    Tensor tKVrP = make_tensor(rP.data(), gmma_acc_to_a_layout(rP.layout()));     // A operand view
    Tensor tKVrdS = make_tensor(rdS.data(), gmma_acc_to_a_layout(rdS.layout()));
    // dS^T into the queries-contiguous dS buffer by stmatrix: an accumulator row (a key) is a
    // stmatrix row of 8 contiguous queries.
    auto ds_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomKV{}, mma_sdp);
    auto ds_thr_copy = ds_copy.get_thread_slice(mma_tid);
    Tensor tdSrdS = ds_thr_copy.retile_S(rdS);      // (CPY,CPY_N,CPY_M)
    Tensor tdSsdS = ds_thr_copy.partition_D(sdSt);  // (CPY,CPY_N,CPY_M,2)

    // dQ's half h (traits_bwd.hpp), issued from the dS buffer `buf`.
    typename Traits::TiledMmaDQ mma_dq;
    auto thr_dq = mma_dq.get_thread_slice(mma_tid % 128);
    using TileDq = Shape<_64, _64>;
    Tensor acc_dq = partition_fragment_C(mma_dq, TileDq{});  // ((2,2,8),1,1) fp32
    auto issue_dq = [&](int h, int buf) {
      constexpr bool kByRows = Traits::kDqHalvesByRows;
      Tensor sdS_h = local_tile(sdS(_, _, buf), Shape<_64, Int<kBlockN>>{}, make_coord(kByRows ? h : 0, 0));  // (64,BLK_N)
      Tensor sKt_h = local_tile(sKt, Shape<_64, Int<kBlockN>>{}, make_coord(kByRows ? 0 : h, 0));            // (64,BLK_N)
      wgmma_gemm<true, false>(mma_dq, thr_dq.partition_fragment_A(sdS_h), thr_dq.partition_fragment_B(sKt_h), acc_dq);
    };
    // Half h of dQ (unscaled) to shared memory, for the writer warp.
    auto stage_dq = [&](int h) {
      float2* dq_smem = reinterpret_cast<float2*>(storage.dq.data()) + (16 * h) * 128 + mma_tid % 128;
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); i += 2) dq_smem[i / 2 * 128] = make_float2(acc_dq(i), acc_dq(i + 1));
    };
    static_assert(decltype(size(acc_dq))::value == 32, "a half is 16 value pairs a thread");
    using cutlass::arch::NamedBarrier;
    constexpr int kDqThreads = 128 + 32;  // a warpgroup and the writer warp
    constexpr int kMma = Traits::kMmaThreads;
    // dq_one_wg, dS buffer b: warpgroup 1 starts it free (0 waits for it before writing its half).
    if constexpr (kOneWay && kWg == 1) {
      for (int b = 0; b < 2; ++b) NamedBarrier::arrive(kMma, NamedBarriers::kBwdDsFree + b);
    }

    clear(acc_dv);
    clear(acc_dk);
    constexpr float kLog2e = 1.4426950408889634f;
    // Softcap: P = exp2(tanh(S prescale) exp_scale - lse), and dS takes tanh's derivative 1 - t^2,
    // with t recovered from P (no fragment held for it): t = (log2 P + lse) / exp_scale.
    const bool softcap = p.softcap > 0.f;
    const float exp_scale = (softcap ? p.softcap : p.softmax_scale) * kLog2e;
    const float prescale = softcap ? p.softmax_scale / p.softcap : 0.f;
    const float inv_exp_scale = 1.f / exp_scale;
    cutlass::arch::ClusterTransactionBarrier::wait(&storage.kv_full, j & 1);
    for (int g = 0; g < group; ++g) {
      for (int m = tile.m_first; m < tile.m_last; ++m, ++st, ds_buf ^= 1) {
        const int m0 = m * kBlockM;  // the unrotated step's: rotated walks have no mask, which then ignores rows
        qdo_pipe.consumer_wait(st);
        // The step's rows' lse and D, read where they are used (not held across the GEMMs).
        const float* lse2 = storage.lse2.data() + st.index() * kBlockM;
        const float* dpsum = storage.dpsum.data() + st.index() * kBlockM;
        wgmma_gemm<true, false>(mma_sdp, tSrK, tSrQ(_, _, _, st.index()), acc_s);
        wgmma_gemm<true, false>(mma_sdp, tSrV, tSrdO(_, _, _, st.index()), acc_dp);
        warpgroup_wait<1>();  // S^T is done
        if (softcap) {
          CUTE_UNROLL
          for (int i = 0; i < size(acc_s); ++i) acc_s(i) = tanhf(acc_s(i) * prescale);
        }
        // P^T = exp2(S^T exp_scale - lse log2(e)), zero where the query does not see the key.
        if (keys.tile_needs_mask(m0, kBlockM, n0 + 64 * wg, 64) || n0 + kBlockN > tile.seq.seqlen_k)
          keys.apply_transposed(s_rc, c_rc, n0, m0, -INFINITY);
        CUTE_UNROLL
        for (int i = 0; i < size<0>(s_rc); ++i) {
          CUTE_UNROLL
          for (int j = 0; j < kCols; ++j) s_rc(i, j) = exp2f(s_rc(i, j) * exp_scale - lse2[get<1>(c_rc(0, j))]);
        }
        warpgroup_wait<0>();  // dP^T is done
        CUTE_UNROLL
        for (int i = 0; i < size<0>(dp_rc); ++i) {
          CUTE_UNROLL
          for (int j = 0; j < kCols; ++j) dp_rc(i, j) = s_rc(i, j) * (dp_rc(i, j) - dpsum[get<1>(c_rc(0, j))]);
        }
        if (softcap) {  // P = 0 (masked) gives t = -inf or NaN: the clamp keeps 0 * derivative at 0
          CUTE_UNROLL
          for (int i = 0; i < size<0>(dp_rc); ++i) {
            CUTE_UNROLL
            for (int j = 0; j < kCols; ++j) {
              const float t = (__log2f(s_rc(i, j)) + lse2[get<1>(c_rc(0, j))]) * inv_exp_scale;
              dp_rc(i, j) *= fmaxf(1.f - t * t, 0.f);
            }
          }
        }
        convert_fragment_into(acc_s, rP);
        convert_fragment_into(acc_dp, rdS);
        wgmma_gemm<false, true>(mma_kv, tKVrP, tKVrdOt(_, _, _, st.index()), acc_dv);
        // dS into shared memory (queries contiguous), for dQ = dS K, which needs both warpgroups' keys.
        if constexpr (kOneWay && kWg == 0) NamedBarrier::sync(kMma, NamedBarriers::kBwdDsFree + ds_buf);
        copy(ds_copy, tdSrdS, tdSsdS(_, _, _, ds_buf));
        cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma (async proxy)
        // Half h of dQ to shared memory, for the writer warp (fenced: read by the bulk reduce).
        auto hand_over_dq = [&](int h) {
          NamedBarrier::sync(kDqThreads, NamedBarriers::kBwdDqEmpty + h);
          stage_dq(h);
          cutlass::arch::fence_view_async_shared();
          NamedBarrier::arrive(kDqThreads, NamedBarriers::kBwdDqFull + h);
        };
        if constexpr (!kOneWay) {  // both warpgroups' halves of dS, then each its half of dQ
          NamedBarrier::sync(kMma, NamedBarriers::kBwdDsReady + ds_buf);
          issue_dq(wg, ds_buf);
          wgmma_gemm<false, true>(mma_kv, tKVrdS, tKVrQt(_, _, _, st.index()), acc_dk);
          warpgroup_wait<1>();  // dV and dQ are done (batches complete in order); dK runs on meanwhile
          hand_over_dq(wg);
          warpgroup_wait<0>();
        } else if constexpr (kWg == 1) {  // both halves of dQ, one accumulator at a time
          NamedBarrier::sync(kMma, NamedBarriers::kBwdDsReady + ds_buf);
          issue_dq(0, ds_buf);
          wgmma_gemm<false, true>(mma_kv, tKVrdS, tKVrQt(_, _, _, st.index()), acc_dk);
          warpgroup_wait<1>();
          hand_over_dq(0);
          issue_dq(1, ds_buf);
          warpgroup_wait<0>();
          NamedBarrier::arrive(kMma, NamedBarriers::kBwdDsFree + ds_buf);  // dQ has read the dS buffer
          hand_over_dq(1);
        } else {  // hands its half of dS over and goes on
          NamedBarrier::arrive(kMma, NamedBarriers::kBwdDsReady + ds_buf);
          wgmma_gemm<false, true>(mma_kv, tKVrdS, tKVrQt(_, _, _, st.index()), acc_dk);
          warpgroup_wait<0>();
        }
        // dK is done: the step's Q and dO are free.
        // The stage's lse and D were last read before the dS stores' proxy fence, which orders
        // those generic-proxy reads before the bulk copy that refills the stage after this release.
        qdo_pipe.consumer_release_thread(st);
      }
    }
    if constexpr (Traits::kPersistent)  // every wgmma of this warpgroup that reads K or V is done
      cutlass::arch::ClusterBarrier::arrive(&storage.kv_empty);  // the next tile's may load
    else
      mma_end<kWg>(mma_tid);
    store_dkv(tile, mma_kv, mma_tid, acc_dk, acc_dv);
  }

  // dK (scaled by softmax_scale) and dV: stmatrix from the accumulators into shared memory, then
  // each warpgroup stores its 64 rows 16 bytes a thread. A CTA a tile stages them in the K and V
  // buffers, which the last step no longer reads; persistent, in the dS buffers (free once every
  // dQ of the tile has read them), so that the next tile's K and V may load meanwhile.
  template <class TiledMma, class Acc>
  CUTE_DEVICE void store_dkv(const BwdTile& tile, const TiledMma& mma_kv, int mma_tid, Acc& acc_dk, Acc& acc_dv) const {
    using namespace cute;
    using cutlass::arch::NamedBarrier;
    const BwdParams& p = kp.params;
    const int wg = mma_tid / 128;
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.softmax_scale;
    Tensor rdK = make_fragment_like<Element>(acc_dk);  // ((2,2,D/8),1,1)
    Tensor rdV = make_fragment_like<Element>(acc_dv);
    convert_fragment_into(acc_dk, rdK);
    convert_fragment_into(acc_dv, rdV);
    auto smem_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomKV{}, mma_kv);
    auto smem_thr_copy = smem_copy.get_thread_slice(mma_tid);
    auto stage = [&](const auto& rX, auto const& s_tile) {
      copy(smem_copy, smem_thr_copy.retile_S(rX), smem_thr_copy.partition_D(s_tile));
    };
    using TileKV = Shape<_64, Int<kHeadDim>>;
    const int row0 = tile.n_block * kBlockN + 64 * wg;
    typename Traits::GmemTiledCopyKV gmem_copy;
    auto gmem_thr_copy = gmem_copy.get_thread_slice(mma_tid % 128);
    Tensor tKVcKV = gmem_thr_copy.partition_D(make_identity_tensor(TileKV{}));  // (CPY,CPY_M,CPY_D) -> (row,col)
    auto store = [&](auto const& s_tile, void* base, int64_t batch_stride, int64_t row_stride,
                     int64_t head_stride) {
      Element* g = static_cast<Element*>(base) + tile.batch * batch_stride + tile.head_k * head_stride +
                   int64_t(tile.seq.k_start + row0) * row_stride;
      Tensor gKV = make_tensor(make_gmem_ptr(g), TileKV{}, make_stride(row_stride, _1{}));  // (64,D)
      Tensor tKVsKV = gmem_thr_copy.partition_S(local_tile(s_tile, TileKV{}, make_coord(wg, 0)));  // (CPY,CPY_M,CPY_D)
      Tensor tKVgKV = gmem_thr_copy.partition_D(gKV);                                              // (CPY,CPY_M,CPY_D)
      Tensor tKVrKV = make_tensor<Element>(shape(tKVgKV));
      copy(gmem_copy, tKVsKV, tKVrKV);
      store_tile(gmem_copy, tKVrKV, tKVgKV, tKVcKV, tile.seq.seqlen_k - row0, p.head_dim);
    };
    auto store_dk = [&](auto const& s_tile) {
      store(s_tile, p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
    };
    auto store_dv = [&](auto const& s_tile) {
      store(s_tile, p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
    };
    if constexpr (Traits::kPersistent) {
      static_assert(cute::cosize_v<typename Traits::SmemLayoutDS> >= cute::cosize_v<typename Traits::SmemLayoutK>,
                    "dK, then dV, staged in the dS buffers");
      Tensor sS = smem(storage.ds.data(), typename Traits::SmemLayoutK{});  // (BLK_N,D)
      // Both warpgroups are past the tile's last dQ = dS K, which reads both halves of dS.
      NamedBarrier::sync(Traits::kMmaThreads, NamedBarriers::kBwdDsReady);
      stage(rdK, sS);
      // Then a warpgroup's own rows, on ids the other warpgroup's 256-thread syncs do not use.
      NamedBarrier::sync(128, NamedBarriers::kBwdEpilogueV + wg);
      store_dk(sS);
      NamedBarrier::sync(128, NamedBarriers::kBwdEpilogueV + wg);  // this warpgroup's rows read out
      stage(rdV, sS);
      NamedBarrier::sync(128, NamedBarriers::kBwdEpilogueV + wg);
      store_dv(sS);
      // The other warpgroup's next dS stores may overwrite these rows only once they are read out.
      NamedBarrier::sync(Traits::kMmaThreads, NamedBarriers::kBwdDsReady);
    } else if constexpr (!Traits::kDqOneWg) {
      Tensor sK = smem(storage.k.data(), typename Traits::SmemLayoutK{});  // (BLK_N,D)
      Tensor sV = smem(storage.v.data(), typename Traits::SmemLayoutK{});  // (BLK_N,D)
      // dV first: V's rows are each warpgroup's own, while K's are read by both warpgroups' last
      // dQ = dS K, which the other may still run. A warpgroup's rows are all written before its
      // threads read rows that its other warps wrote.
      stage(rdV, sV);
      NamedBarrier::sync(128, NamedBarriers::kBwdEpilogueV + wg);
      store_dv(sV);
      NamedBarrier::sync(Traits::kMmaThreads, NamedBarriers::kBwdDsReady);
      stage(rdK, sK);
      NamedBarrier::sync(128, NamedBarriers::kBwdEpilogue + wg);  // (kBwdDsReady's ids, free by now)
      store_dk(sK);
    } else {  // both warpgroups have left the main loop (mma_wg's last waits)
      Tensor sK = smem(storage.k.data(), typename Traits::SmemLayoutK{});  // (BLK_N,D)
      Tensor sV = smem(storage.v.data(), typename Traits::SmemLayoutK{});  // (BLK_N,D)
      stage(rdK, sK);
      stage(rdV, sV);
      NamedBarrier::sync(128, NamedBarriers::kBwdEpilogue + wg);
      store_dk(sK);
      store_dv(sV);
    }
  }
};

}  // namespace flashcute::sm90
