// flashcute/sm90/mainloop_bwd_split.hpp: the MMA role of the sm90a backward at d 192 and 256
// (BwdTraitsSplitD), where dK and dV are split by head-dim columns between the warpgroups.
//
// The producer is BwdMainloop::load. Per step, each MMA warpgroup computes its keys' S and dP
// (not transposed), P and dS, and writes them to shared memory; after one barrier every warpgroup
// reads all of them for its columns of dV^T += dO^T P, dQ = dS K and dK^T += Q^T dS. dQ is added
// into the fp32 accumulator straight from registers (red.global.add.v2.f32) in the chunk order
// the postprocess reads: there is no room for a staging buffer and no writer warp. Deterministic:
// the adds go in turn, and a producer warp counts them (release_dq).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flashcute/common/fragment.hpp"
#include "flashcute/common/mask.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/store.hpp"
#include "flashcute/sm90/gmma.hpp"
#include "flashcute/sm90/mainloop_bwd.hpp"
#include "flashcute/sm90/pipeline.hpp"
#include "flashcute/sm90/scheduler.hpp"
#include "flashcute/sm90/traits_bwd.hpp"

namespace flashcute::sm90 {

// dst[0, 2) += (a, b) in global memory, one vector reduction (sm_90).
CUTE_DEVICE void red_add_f32x2(float* dst, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(a), "f"(b) : "memory");
}

template <class Traits>
struct BwdMainloopSplitD : BwdMainloop<Traits> {
  using Base = BwdMainloop<Traits>;
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kWgs = Traits::kMmaWarpgroups;
  static_assert(!Traits::kConfig.rotate, "split-D walks are not rotated (BwdConfig::rotate)");
  using State = typename Base::State;
  using Base::kp;
  using Base::qdo_pipe;
  using Base::smem;
  using Base::storage;

  CUTE_DEVICE BwdMainloopSplitD(const BwdKernelParams<Traits>& kp_, typename Base::Storage& storage_)
      : Base(kp_, storage_) {}

  // The MMA warpgroups (mma_tid in [0, kMmaThreads)): the whole tile, then dK and dV stored.
  CUTE_DEVICE void mma(const BwdTile& tile, const KeyMask& keys, int mma_tid) const {
    using namespace cute;
    using cutlass::arch::NamedBarrier;
    const BwdParams& p = kp.params;
    const int group = p.nheads / p.nheads_k;
    const int n0 = tile.n_block * kBlockN;
    const int wg = mma_tid / 128;
    Tensor sK = smem(storage.k.data(), typename Traits::SmemLayoutK{});        // (BLK_N,D)
    Tensor sKt = smem(storage.k.data(), typename Traits::SmemLayoutKt{});      // (D,BLK_N)
    Tensor sV = smem(storage.v.data(), typename Traits::SmemLayoutK{});        // (BLK_N,D)
    Tensor sQ = smem(storage.q.data(), typename Traits::SmemLayoutQ{});        // (BLK_M,D,PIPE)
    Tensor sQt = smem(storage.q.data(), typename Traits::SmemLayoutQt{});      // (D,BLK_M,PIPE)
    Tensor sdO = smem(storage.dout.data(), typename Traits::SmemLayoutQ{});    // (BLK_M,D,PIPE)
    Tensor sdOt = smem(storage.dout.data(), typename Traits::SmemLayoutQt{});  // (D,BLK_M,PIPE)
    Tensor sP = smem(storage.p.data(), typename Traits::SmemLayoutPdS{});      // (BLK_M,BLK_N,2)
    Tensor sPt = smem(storage.p.data(), typename Traits::SmemLayoutPdSt{});    // (BLK_N,BLK_M,2)
    Tensor sdS = smem(storage.ds.data(), typename Traits::SmemLayoutPdS{});    // (BLK_M,BLK_N,2)
    Tensor sdSt = smem(storage.ds.data(), typename Traits::SmemLayoutPdSt{});  // (BLK_N,BLK_M,2)

    using TileS = Shape<Int<kBlockM>, Int<kBlockN>>;
    typename Traits::TiledMmaSdP mma_sdp;
    auto thr_sdp = mma_sdp.get_thread_slice(mma_tid);
    Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);    // (MMA,MMA_M,MMA_K,PIPE) smem descriptors
    Tensor tSrdO = thr_sdp.partition_fragment_A(sdO);  // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tSrK = thr_sdp.partition_fragment_B(sK);    // (MMA,MMA_N,MMA_K)
    Tensor tSrV = thr_sdp.partition_fragment_B(sV);    // (MMA,MMA_N,MMA_K)
    Tensor acc_s = partition_fragment_C(mma_sdp, TileS{});   // ((2,2,KEYS_WG/8),1,1) fp32: S, then P
    Tensor acc_dp = partition_fragment_C(mma_sdp, TileS{});  // ((2,2,KEYS_WG/8),1,1) fp32: dP, then dS
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(TileS{}));  // ((2,2,KEYS_WG/8),1,1) -> (query,key)
    Tensor s_rc = make_tensor(acc_s.data(), gmma_rowcol_layout(acc_s.layout()));  // ((2,1),(2,KEYS_WG/8,1)) queries x keys
    Tensor dp_rc = make_tensor(acc_dp.data(), gmma_rowcol_layout(acc_dp.layout()));
    Tensor c_rc = make_tensor(tScS.data(), gmma_rowcol_layout(tScS.layout()));
    constexpr int kRows = decltype(size<0>(s_rc))::value;  // this thread's queries per step
    Tensor rP = make_fragment_like<Element>(acc_s);
    Tensor rdS = make_fragment_like<Element>(acc_dp);
    auto pds_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
    auto pds_thr_copy = pds_copy.get_thread_slice(mma_tid);
    Tensor tPrP = pds_thr_copy.retile_S(rP);       // (CPY,CPY_M,CPY_N)
    Tensor tPrdS = pds_thr_copy.retile_S(rdS);     // (CPY,CPY_M,CPY_N)
    Tensor tPsP = pds_thr_copy.partition_D(sP);    // (CPY,CPY_M,CPY_N,2)
    Tensor tPsdS = pds_thr_copy.partition_D(sdS);  // (CPY,CPY_M,CPY_N,2)

    typename Traits::TiledMmaKV mma_kv;
    auto thr_kv = mma_kv.get_thread_slice(mma_tid);
    Tensor tKVrdOt = thr_kv.partition_fragment_A(sdOt);  // (MMA,MMA_D,MMA_K,PIPE)
    Tensor tKVrQt = thr_kv.partition_fragment_A(sQt);    // (MMA,MMA_D,MMA_K,PIPE)
    Tensor tKVrPt = thr_kv.partition_fragment_B(sPt);    // (MMA,MMA_N,MMA_K,2)
    Tensor tKVrdSt = thr_kv.partition_fragment_B(sdSt);  // (MMA,MMA_N,MMA_K,2)
    Tensor acc_dv = partition_fragment_C(mma_kv, Shape<Int<kHeadDim>, Int<kBlockN>>{});  // ((2,2,BLK_N/8),MMA_D,1): dV^T
    Tensor acc_dk = partition_fragment_C(mma_kv, Shape<Int<kHeadDim>, Int<kBlockN>>{});  // dK^T

    typename Traits::TiledMmaDQ mma_dq;
    auto thr_dq = mma_dq.get_thread_slice(mma_tid);
    Tensor tQrdS = thr_dq.partition_fragment_A(sdS);  // (MMA,MMA_M,MMA_K,2)
    Tensor tQrKt = thr_dq.partition_fragment_B(sKt);  // (MMA,MMA_D,MMA_K)
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // ((2,2,COLS_WG/8),1,1)

    clear(acc_dv);
    clear(acc_dk);
    constexpr float kLog2e = 1.4426950408889634f;
    const bool softcap = p.softcap > 0.f;
    const float exp_scale = (softcap ? p.softcap : p.softmax_scale) * kLog2e;
    const float prescale = softcap ? p.softmax_scale / p.softcap : 0.f;
    const float inv_exp_scale = 1.f / exp_scale;
    cutlass::arch::ClusterTransactionBarrier::wait(&storage.kv_full, 0);
    State st;
    int step = 0;  // the CTA's steps, for add_dq
    int buf = 0;
    for (int g = 0; g < group; ++g) {
      const int64_t rows = Base::head_rows(tile, tile.head_k * group + g);
      for (int m = tile.m_first; m < tile.m_last; ++m, ++st, buf ^= 1) {
        const int m0 = m * kBlockM;
        qdo_pipe.consumer_wait(st);
        const float* lse2 = storage.lse2.data() + st.index() * kBlockM;
        const float* dpsum = storage.dpsum.data() + st.index() * kBlockM;
        wgmma_gemm<true, false>(mma_sdp, tSrQ(_, _, _, st.index()), tSrK, acc_s);
        wgmma_gemm<true, false>(mma_sdp, tSrdO(_, _, _, st.index()), tSrV, acc_dp);
        warpgroup_wait<1>();  // S is done
        if (softcap) {
          CUTE_UNROLL
          for (int i = 0; i < size(acc_s); ++i) acc_s(i) = tanhf(acc_s(i) * prescale);
        }
        const int wg_n0 = n0 + Traits::kKeysWg * wg;
        if (keys.tile_needs_mask(m0, kBlockM, wg_n0, Traits::kKeysWg) || n0 + kBlockN > tile.seq.seqlen_k)
          keys.apply(s_rc, c_rc, m0, n0, -INFINITY);
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          const float lse = lse2[get<0>(c_rc(i, 0))];
          CUTE_UNROLL
          for (int j = 0; j < size<1>(s_rc); ++j) s_rc(i, j) = exp2f(s_rc(i, j) * exp_scale - lse);
        }
        warpgroup_wait<0>();  // dP is done
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          const float d = dpsum[get<0>(c_rc(i, 0))];
          CUTE_UNROLL
          for (int j = 0; j < size<1>(dp_rc); ++j) dp_rc(i, j) = s_rc(i, j) * (dp_rc(i, j) - d);
        }
        if (softcap) {  // as BwdMainloop::mma: the clamp keeps masked entries at 0
          CUTE_UNROLL
          for (int i = 0; i < kRows; ++i) {
            const float lse = lse2[get<0>(c_rc(i, 0))];
            CUTE_UNROLL
            for (int j = 0; j < size<1>(dp_rc); ++j) {
              const float t = (__log2f(s_rc(i, j)) + lse) * inv_exp_scale;
              dp_rc(i, j) *= fmaxf(1.f - t * t, 0.f);
            }
          }
        }
        convert_fragment_into(acc_s, rP);
        convert_fragment_into(acc_dp, rdS);
        // P and dS of this warpgroup's keys into shared memory; every warpgroup reads all keys.
        copy(pds_copy, tPrP, tPsP(_, _, _, buf));
        copy(pds_copy, tPrdS, tPsdS(_, _, _, buf));
        cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma (async proxy)
        NamedBarrier::sync(Traits::kMmaThreads, NamedBarriers::kBwdDsReady);
        wgmma_gemm<false, false>(mma_kv, tKVrdOt(_, _, _, st.index()), tKVrPt(_, _, _, buf), acc_dv);
        wgmma_gemm<true, false>(mma_dq, tQrdS(_, _, _, buf), tQrKt, acc_dq);
        wgmma_gemm<false, false>(mma_kv, tKVrQt(_, _, _, st.index()), tKVrdSt(_, _, _, buf), acc_dk);
        warpgroup_wait<1>();  // dV and dQ are done; dK runs on meanwhile
        add_dq(acc_dq, rows, m, bwd_dq_turn<kBlockM, kBlockN>(keys, tile, m), step++, mma_tid);
        warpgroup_wait<0>();  // dK is done: the step's Q and dO are free
        // (the P and dS stores' proxy fence ordered the stage's lse and D reads before its refill)
        qdo_pipe.consumer_release_thread(st);
      }
    }
    store_dkv(tile, mma_kv, mma_tid, acc_dk, acc_dv);
  }

  // A step's dQ (unscaled) into the accumulator of query block m, in BwdTraits::kDqChunk order.
  // Deterministic: in the block's turn (bwd_dq_turn); the adds are handed to the release warp
  // (release_dq), which counts them once they have landed, so the MMA warps do not wait for that.
  // `step` counts the CTA's steps from 0.
  template <class Acc>
  CUTE_DEVICE void add_dq(const Acc& acc_dq, int64_t rows, int m, int turn, int step, int mma_tid) const {
    using cutlass::arch::NamedBarrier;
    int* sem = Base::dq_count(rows, m);
    const int slot = step % 2;
    if (sem != nullptr) {
      if (mma_tid == 0) {
        // The release warp has taken this slot's last hand-over (two steps ago), so the barrier
        // cannot run a phase ahead of it.
        if (step >= 2) cutlass::arch::ClusterBarrier::wait(&storage.dq_released[slot], (step / 2 - 1) % 2);
        wait_turn(sem, turn);
      }
      NamedBarrier::sync(Traits::kMmaThreads, NamedBarriers::kBwdDqTurn);
    }
    float* dq = kp.dq_accum + (rows + int64_t(m) * kBlockM) * kHeadDim + mma_tid / 128 * Traits::kDqChunk +
                2 * (mma_tid % 128);
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc_dq); i += 2) red_add_f32x2(dq + i / 2 * 256, acc_dq(i), acc_dq(i + 1));
    if (sem != nullptr) cutlass::arch::ClusterBarrier::arrive(&storage.dq_added[slot]);
  }

  // Deterministic: one lane of a producer warp follows the MMA warps' steps and, once every MMA
  // thread has made its adds of a step (dq_added), counts them (red.release.gpu: cumulative, so the
  // next key block sees all the CTA's adds before it adds its own).
  CUTE_DEVICE void release_dq(const BwdTile& tile) const {
    if (kp.dq_semaphore == nullptr) return;
    const int group = kp.params.nheads / kp.params.nheads_k;
    int step = 0;
    for (int g = 0; g < group; ++g) {
      const int64_t rows = Base::head_rows(tile, tile.head_k * group + g);
      for (int m = tile.m_first; m < tile.m_last; ++m, ++step) {
        const int slot = step % 2;
        cutlass::arch::ClusterBarrier::wait(&storage.dq_added[slot], (step / 2) % 2);
        int* sem = Base::dq_count(rows, m);
        asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(sem) : "memory");
        cutlass::arch::ClusterBarrier::arrive(&storage.dq_released[slot]);
      }
    }
  }

  // dK (scaled by softmax_scale) and dV through the K and V buffers: transposing stmatrix from the
  // dK^T and dV^T accumulators, then each warpgroup stores BLK_N / kWgs rows, 16 bytes a thread.
  template <class TiledMma, class Acc>
  CUTE_DEVICE void store_dkv(const BwdTile& tile, const TiledMma& mma_kv, int mma_tid, Acc& acc_dk, Acc& acc_dv) const {
    using namespace cute;
    using cutlass::arch::NamedBarrier;
    const BwdParams& p = kp.params;
    const int wg = mma_tid / 128;
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.softmax_scale;
    Tensor rdK = make_fragment_like<Element>(acc_dk);  // ((2,2,BLK_N/8),MMA_D,1)
    Tensor rdV = make_fragment_like<Element>(acc_dv);
    convert_fragment_into(acc_dk, rdK);
    convert_fragment_into(acc_dv, rdV);
    Tensor sK = smem(storage.k.data(), typename Traits::SmemLayoutK{});    // (BLK_N,D)
    Tensor sKt = smem(storage.k.data(), typename Traits::SmemLayoutKt{});  // (D,BLK_N)
    Tensor sV = smem(storage.v.data(), typename Traits::SmemLayoutK{});    // (BLK_N,D)
    Tensor sVt = smem(storage.v.data(), typename Traits::SmemLayoutKt{});  // (D,BLK_N)
    auto smem_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomKV{}, mma_kv);
    auto smem_thr_copy = smem_copy.get_thread_slice(mma_tid);
    // Every warpgroup's last GEMMs have read K and V (each reads rows and columns of all).
    NamedBarrier::sync(Traits::kMmaThreads, NamedBarriers::kBwdDsReady);
    copy(smem_copy, smem_thr_copy.retile_S(rdK), smem_thr_copy.partition_D(sKt));
    copy(smem_copy, smem_thr_copy.retile_S(rdV), smem_thr_copy.partition_D(sVt));
    NamedBarrier::sync(Traits::kMmaThreads, NamedBarriers::kBwdDsReady);  // each row has every warpgroup's columns
    constexpr int kRowsWg = kBlockN / kWgs;
    using TileKV = Shape<Int<kRowsWg>, Int<kHeadDim>>;
    const int row0 = tile.n_block * kBlockN + kRowsWg * wg;
    typename Traits::GmemTiledCopyKV gmem_copy;
    auto gmem_thr_copy = gmem_copy.get_thread_slice(mma_tid % 128);
    Tensor tKVcKV = gmem_thr_copy.partition_D(make_identity_tensor(TileKV{}));  // (CPY,CPY_M,CPY_D) -> (row,col)
    auto store = [&](auto const& s_tile, void* base, int64_t batch_stride, int64_t row_stride,
                     int64_t head_stride) {
      Element* g = static_cast<Element*>(base) + tile.batch * batch_stride + tile.head_k * head_stride +
                   int64_t(tile.seq.k_start + row0) * row_stride;
      Tensor gKV = make_tensor(make_gmem_ptr(g), TileKV{}, make_stride(row_stride, _1{}));  // (ROWS_WG,D)
      Tensor tKVsKV = gmem_thr_copy.partition_S(local_tile(s_tile, TileKV{}, make_coord(wg, 0)));  // (CPY,CPY_M,CPY_D)
      Tensor tKVgKV = gmem_thr_copy.partition_D(gKV);                                              // (CPY,CPY_M,CPY_D)
      Tensor tKVrKV = make_tensor<Element>(shape(tKVgKV));
      copy(gmem_copy, tKVsKV, tKVrKV);
      store_tile(gmem_copy, tKVrKV, tKVgKV, tKVcKV, tile.seq.seqlen_k - row0, p.head_dim);
    };
    store(sK, p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
    store(sV, p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  }
};

}  // namespace flashcute::sm90
