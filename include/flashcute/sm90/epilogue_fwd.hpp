// flashcute/sm90/epilogue_fwd.hpp: the sm90a forward kernel's epilogue: one consumer warpgroup's
// 64 rows of a tile finalised (O normalised, the lse), O converted and stored in the three ways
// the configs choose, and the lse stored.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flashcute/common/fragment.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/softmax.hpp"
#include "flashcute/common/store.hpp"
#include "flashcute/sm90/config.hpp"
#include "flashcute/sm90/gmma.hpp"
#include "flashcute/sm90/pipeline.hpp"
#include "flashcute/sm90/scheduler.hpp"

namespace flashcute::sm90 {

// The query rows of a tile's (batch, head): varlen, its sequence's.
template <bool kVarlen>
CUTE_DEVICE int tile_seqlen_q(FwdParams const& params, VarlenRows const& seq) {
  return kVarlen ? seq.seqlen_q : params.seqlen_q;
}

// Stores warpgroup wg's rows of the tile at query row m0: rO, the converted O accumulator
// ((2,2,D/8),MMA_M,MMA_D), whose (row, col) coordinates are tOcO_rc ((2,MMA_M),(2,D/8,MMA_D)), into
// o_tile (the tile's (batch, head) in params.o), whose rows from its seqlen_q on are not stored
// (varlen: seq's).
// mma_tid: the thread's index among the consumers.
// - With o_smem, the warpgroup stages its 64 rows in shared memory with stmatrix and stores them
//   16 bytes a thread.
// - With o_via_v and v_stage >= 0, it stages them in passes through V buffer v_stage, that of the
//   tile's last key block (d 192, 256: no room for an O buffer).
// - Otherwise each thread stores its column pairs straight to global memory: its columns are its
//   first one plus compile-time offsets, so each 4-byte store takes one row pointer and an
//   immediate offset, and the column test is only needed where the user's head dim is narrower
//   than the kernel's.
template <class Traits, class TiledMmaPV, class FragO, class CoordsO>
CUTE_DEVICE void store_o(typename Traits::SharedStorage& storage, TiledMmaPV const& mma_pv, FragO const& rO,
                         CoordsO const& tOcO_rc, typename Traits::Element* o_tile, FwdParams const& params,
                         VarlenRows const& seq, int m0, int wg, int mma_tid, int v_stage) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  if constexpr (Traits::kConfig.o_smem) {
    Tensor sO = make_tensor(make_smem_ptr(storage.o.data()), typename Traits::SmemLayoutO{});  // (BLK_M,D)
    auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, mma_pv);
    auto smem_thr_copy_o = smem_copy_o.get_thread_slice(mma_tid);
    Tensor taccOrO = smem_thr_copy_o.retile_S(rO);     // (CPY,MMA_M,MMA_D)
    Tensor taccOsO = smem_thr_copy_o.partition_D(sO);  // (CPY,CPY_M,CPY_D)
    // Every thread of this warpgroup has read its rows of the previous tile's O.
    cutlass::arch::NamedBarrier::sync(128, NamedBarriers::kWarpgroup + wg);
    copy(smem_copy_o, taccOrO, taccOsO);
    // The rows are all written before threads read rows that other warps wrote.
    cutlass::arch::NamedBarrier::sync(128, NamedBarriers::kWarpgroup + wg);
    using TileO = Shape<Int<64>, Int<kHeadDim>>;
    const int row0 = m0 + 64 * wg;
    Tensor gO = make_tensor(make_gmem_ptr(o_tile + int64_t(row0) * params.o_row_stride), TileO{},
                            make_stride(params.o_row_stride, _1{}));  // (64,D)
    Tensor sO_wg = local_tile(sO, TileO{}, make_coord(wg, 0));        // (64,D)
    typename Traits::GmemTiledCopyO gmem_copy_o;
    auto gmem_thr_copy_o = gmem_copy_o.get_thread_slice(mma_tid % 128);
    Tensor tOsO = gmem_thr_copy_o.partition_S(sO_wg);                            // (CPY,CPY_M,CPY_D)
    Tensor tOgO = gmem_thr_copy_o.partition_D(gO);                               // (CPY,CPY_M,CPY_D)
    Tensor tOcO_wg = gmem_thr_copy_o.partition_D(make_identity_tensor(TileO{}));  // (CPY,CPY_M,CPY_D) -> (row,col)
    Tensor tOrO = make_tensor<Element>(shape(tOgO));                             // (CPY,CPY_M,CPY_D)
    copy(gmem_copy_o, tOsO, tOrO);
    store_tile(gmem_copy_o, tOrO, tOgO, tOcO_wg, tile_seqlen_q<Traits::kVarlen>(params, seq) - row0, params.head_dim);
  } else {
    bool staged = false;
    if constexpr (Traits::kConfig.o_via_v) {
      if (v_stage >= 0) {
        // O through the V buffer of the tile's last key block, in passes of kPassCols columns:
        // each thread writes its column pairs into its warpgroup's region (16-byte chunks XOR-
        // swizzled by row: the 8 rows of a warp's store hit 32 different banks), then reads back
        // 16 bytes at a time, a warp two whole rows of the pass, and stores them.
        constexpr int kPassCols = Traits::kConfig.o_pass_cols();
        constexpr int kChunks = kPassCols / 8;  // 16-byte chunks in a staged row
        constexpr int kRegion = FwdConfig::o_region_bytes(kPassCols) / 2;  // elements, 1024-byte aligned
        static_assert(kPassCols % 64 == 0 && kHeadDim % kPassCols == 0);
        static_assert(decltype(cosize(take<0, 2>(typename Traits::SmemLayoutVt{})))::value == kHeadDim * kBlockN);
        Tensor rO_rc = make_tensor(rO.data(), gmma_rowcol_layout(rO.layout()));  // ((2,MMA_M),(2,D/8,MMA_D))
        Element* region = storage.v.data() + v_stage * (kHeadDim * kBlockN) + wg * kRegion;
        const int wg_tid = mma_tid % 128;
        // Both warpgroups' last P V have read this V buffer: only now may either overwrite it.
        cutlass::arch::NamedBarrier::sync(256, NamedBarriers::kVBufferFree);
        CUTE_UNROLL
        for (int pass = 0; pass < kHeadDim / kPassCols; ++pass) {
          // Every thread of this warpgroup has read the previous pass back.
          if (pass > 0) cutlass::arch::NamedBarrier::sync(128, NamedBarriers::kWarpgroup + wg);
          CUTE_UNROLL
          for (int r = 0; r < size<0>(rO_rc); ++r) {
            const int row = get<0>(tOcO_rc(r, 0)) - 64 * wg;  // in [0, 64)
            CUTE_UNROLL
            for (int jj = 0; jj < kChunks; ++jj) {
              const int c = 2 * (pass * kChunks + jj);  // columns c, c + 1 of the accumulator's row view
              const int col = get<1>(tOcO_rc(r, c)) - pass * kPassCols;
              Element pair[2] = {rO_rc(r, c), rO_rc(r, c + 1)};
              *reinterpret_cast<uint32_t*>(region + row * kPassCols + ((col >> 3) ^ (row & 7)) * 8 + (col & 7)) =
                  *reinterpret_cast<uint32_t*>(pair);
            }
          }
          // The pass is written before threads read rows that other warps wrote.
          cutlass::arch::NamedBarrier::sync(128, NamedBarriers::kWarpgroup + wg);
          CUTE_UNROLL
          for (int it = 0; it < 64 * kChunks / 128; ++it) {
            const int idx = it * 128 + wg_tid;
            const int row = idx / kChunks, chunk = idx % kChunks;
            const uint4 chunk_data =
                *reinterpret_cast<const uint4*>(region + row * kPassCols + (chunk ^ (row & 7)) * 8);
            const int o_row = m0 + 64 * wg + row, o_col = pass * kPassCols + chunk * 8;
            if (o_row < tile_seqlen_q<Traits::kVarlen>(params, seq) && o_col < params.head_dim)
              *reinterpret_cast<uint4*>(o_tile + int64_t(o_row) * params.o_row_stride + o_col) = chunk_data;
          }
        }
        staged = true;
      }
    }
    if (!staged) {
      Tensor rO_rc = make_tensor(rO.data(), gmma_rowcol_layout(rO.layout()));  // ((2,MMA_M),(2,D/8,MMA_D))
      const int col0 = get<1>(tOcO_rc(0, 0));
      Element* o_ptr = o_tile + col0;
      auto store_rows = [&](auto check_cols) __attribute__((always_inline)) {
        CUTE_UNROLL
        for (int r = 0; r < size<0>(rO_rc); ++r) {
          const int row = m0 + get<0>(tOcO_rc(r, 0));
          if (row >= tile_seqlen_q<Traits::kVarlen>(params, seq)) continue;
          Element* o_row = o_ptr + int64_t(row) * params.o_row_stride;
          CUTE_UNROLL
          for (int c = 0; c < size<1>(rO_rc); c += 2) {  // (c, c + 1): adjacent columns, one 4-byte store
            const int dc = get<1>(tOcO_rc(r, c)) - col0;
            if (!decltype(check_cols)::value || col0 + dc < params.head_dim) {
              Element pair[2] = {rO_rc(r, c), rO_rc(r, c + 1)};
              *reinterpret_cast<uint32_t*>(o_row + dc) = *reinterpret_cast<uint32_t*>(pair);
            }
          }
        }
      };
      if (params.head_dim == kHeadDim) store_rows(cute::false_type{});
      else store_rows(cute::true_type{});
    }
  }
}

// The epilogue of one consumer warpgroup (wg; mma_tid: the thread's index among the consumers).
template <class Traits>
struct FwdEpilogue {
  using TileQ = cute::Shape<cute::Int<Traits::kBlockM>, cute::Int<Traits::kHeadDim>>;
  using ThrPV = decltype(typename Traits::TiledMmaPV{}.get_thread_slice(0));
  using CoordsO = decltype(std::declval<ThrPV&>().partition_C(cute::make_identity_tensor(TileQ{})));

  typename Traits::SharedStorage& storage;
  const FwdParams& params;
  int wg, mma_tid;
  CoordsO tOcO;  // ((2,2,D/8),MMA_M,MMA_D) -> (row,col): the (row, col) of each accumulator element

  CUTE_DEVICE FwdEpilogue(typename Traits::SharedStorage& storage_, const FwdParams& params_, int wg_, int mma_tid_)
      : storage(storage_),
        params(params_),
        wg(wg_),
        mma_tid(mma_tid_),
        tOcO(typename Traits::TiledMmaPV{}.get_thread_slice(mma_tid_).partition_C(cute::make_identity_tensor(TileQ{}))) {}

  // Finalises the softmax of the tile's rows (softmax.finalize: O normalised, lse), stores O and
  // the lse. acc_o: the P V accumulator ((2,2,D/8),MMA_M,MMA_D), fp32. v_stage: the V buffer O may
  // be staged in (config o_via_v), or -1 for none. seq: a varlen tile's sequence
  // (TileScheduler::rows; unused otherwise).
  template <int kRows, class AccO>
  CUTE_DEVICE void store(const WorkTile& tile, const VarlenRows& seq, OnlineSoftmax<kRows>& softmax, AccO& acc_o,
                         int v_stage) const {
    using namespace cute;
    using Element = typename Traits::Element;
    typename Traits::TiledMmaPV mma_pv;
    Tensor acc_o_rc = make_tensor(acc_o.data(), gmma_rowcol_layout(acc_o.layout()));  // ((2,MMA_M),(2,D/8,MMA_D))
    Tensor tOcO_rc = make_tensor(tOcO.data(), gmma_rowcol_layout(tOcO.layout()));      // ((2,MMA_M),(2,D/8,MMA_D))
    const int m0 = tile.m_block * Traits::kBlockM;
    float lse[kRows];
    softmax.finalize(acc_o_rc, lse);
    Tensor rO = convert_fragment<Element>(acc_o);  // ((2,2,D/8),MMA_M,MMA_D)
    // Where the tile's (batch, head) starts in o and lse: varlen, its sequence's rows of the one
    // batch (lse is (nheads, total_q)).
    const int64_t o_offset =
        Traits::kVarlen ? int64_t(seq.q_start) * params.o_row_stride : tile.batch * params.o_batch_stride;
    auto* o_tile = static_cast<Element*>(params.o) + o_offset + tile.head * params.o_head_stride;
    store_o<Traits>(storage, mma_pv, rO, tOcO_rc, o_tile, params, seq, m0, wg, mma_tid, v_stage);
    if (params.lse != nullptr && get<1>(tOcO_rc(0, 0)) == 0) {  // one thread of each row's quad
      const int64_t lse_offset = Traits::kVarlen ? int64_t(seq.q_start) : tile.batch * params.lse_batch_stride;
      float* lse_ptr = params.lse + lse_offset + tile.head * params.lse_head_stride;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = m0 + get<0>(tOcO_rc(r, 0));
        if (row < tile_seqlen_q<Traits::kVarlen>(params, seq)) lse_ptr[row] = lse[r];
      }
    }
  }
};

}  // namespace flashcute::sm90
