// flashcute/sm90/mainloop_kvcache.hpp: the sm90a forward's K/V loads from a KV cache
// (FwdMainloop::load_cache_kv, FwdMode::kKvcache), contiguous or paged: whole blocks or page boxes
// by TMA, and the blocks the producer mends before the consumers read them. Included at the end of
// mainloop_fwd.hpp, which declares it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flashcute/sm90/mainloop_fwd.hpp"

namespace flashcute::sm90 {

template <class Traits>
CUTE_DEVICE void FwdMainloop<Traits>::load_cache_kv(int batch, int head_k, int seqlen_k, int n_block, KvState kv,
                                                    uint32_t& fix_phase) const {
  using namespace cute;
  constexpr int kBox = Traits::kBoxRows;
  constexpr int kBoxes = kBlockN / kBox;
  using TileBoxK = Shape<Int<kBox>, Int<kHeadDim>>;
  using TileBoxVt = Shape<Int<kHeadDim>, Int<kBox>>;
  const FwdParams& params = kp.params;
  const bool paged = params.block_table != nullptr;
  const int page_rows = paged ? 1 << params.page_size_log2 : params.seqlen_k;
  const int pages = paged ? params.num_pages : params.batch;
  const int* table = params.block_table + int64_t(batch) * params.block_table_batch_stride;  // read when paged
  const int n0 = n_block * kBlockN;
  auto bad_page = [&](int page) __attribute__((always_inline)) { return page < 0 || page >= pages; };
  Tensor mK = kp.tma_k.get_tma_tensor(make_shape(page_rows, params.head_dim, params.nheads_k, pages));   // (rows,d,Hk,pages)
  Tensor mVt = kp.tma_v.get_tma_tensor(make_shape(params.head_dim, page_rows, params.nheads_k, pages));  // (d,rows,Hk,pages)
  // The block holds cache rows past the keys (a paged cache's page, a contiguous cache short of
  // its capacity).
  const bool ragged = seqlen_k < n0 + kBlockN && (paged || seqlen_k < params.seqlen_k);
  // A block with no row past the keys, in boxes of kRows keys (each within a page) through
  // tma_k_ / tma_v_: false, loading nothing, where one of its pages is out of range.
  auto load_boxes = [&](auto rows, auto const& tma_k_, auto const& tma_v_) __attribute__((always_inline)) {
    constexpr int kRows = decltype(rows)::value;
    using TileK = Shape<Int<kRows>, Int<kHeadDim>>;
    using TileVt_ = Shape<Int<kHeadDim>, Int<kRows>>;
    // Every page first: independent loads, none behind a TMA instruction.
    int page[kBlockN / kRows];
    bool bad = false;
    CUTE_UNROLL
    for (int i = 0; i < kBlockN / kRows; ++i) {
      page[i] = paged ? table[(n0 + i * kRows) >> params.page_size_log2] : batch;
      bad = bad || bad_page(page[i]);
    }
    if (bad) return false;
    Tensor mKr = tma_k_.get_tma_tensor(shape(mK));    // (rows,d,Hk,pages)
    Tensor mVtr = tma_v_.get_tma_tensor(shape(mVt));  // (d,rows,Hk,pages)
    Tensor sK = smem_k()(_, _, kv.index());    // (BLK_N,D)
    Tensor sVt = smem_vt()(_, _, kv.index());  // (D,BLK_N)
    // K as soon as its buffer is free, then V (whose buffer the consumers release later).
    uint64_t& bar_k = k_pipe.producer_acquire(kv, Traits::kKvBytes);
    CUTE_UNROLL
    for (int i = 0; i < kBlockN / kRows; ++i) {
      const int key = n0 + i * kRows;
      Tensor gK = local_tile(mKr(_, _, head_k, page[i]), TileK{},
                             make_coord((paged ? key & (page_rows - 1) : key) / kRows, 0));  // (BOX,D)
      Tensor sKi = local_tile(sK, TileK{}, make_coord(i, 0));                               // (BOX,D)
      auto [tKg, tKs] = tma_partition(tma_k_, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sKi), group_modes<0, 2>(gK));
      copy(tma_k_.with(bar_k), tKg, tKs);
    }
    uint64_t& bar_v = v_pipe.producer_acquire(kv, Traits::kKvBytes);
    CUTE_UNROLL
    for (int i = 0; i < kBlockN / kRows; ++i) {
      const int key = n0 + i * kRows;
      Tensor gVt = local_tile(mVtr(_, _, head_k, page[i]), TileVt_{},
                              make_coord(0, (paged ? key & (page_rows - 1) : key) / kRows));  // (D,BOX)
      Tensor sVti = local_tile(sVt, TileVt_{}, make_coord(0, i));                            // (D,BOX)
      auto [tVg, tVs] = tma_partition(tma_v_, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sVti), group_modes<0, 2>(gVt));
      copy(tma_v_.with(bar_v), tVg, tVs);
    }
    return true;
  };
  if (!ragged) {
    bool loaded;
    if (!paged || page_rows % kBlockN == 0) {
      loaded = load_boxes(Int<kBlockN>{}, kp.tma_k, kp.tma_v);
    } else if constexpr (Traits::kMidBoxRows > 0) {
      loaded = page_rows >= Traits::kMidBoxRows ? load_boxes(Int<Traits::kMidBoxRows>{}, kp.tma_k_mid, kp.tma_v_mid)
                                                : load_boxes(Int<kBox>{}, kp.tma_k_box, kp.tma_v_box);
    } else {
      loaded = load_boxes(Int<kBox>{}, kp.tma_k_box, kp.tma_v_box);
    }
    if (loaded) return;
  }
  // Box i's page and its first row there; a box past the keys starts past the page (all zeros).
  auto box_at = [&](int i, int& page, int& row) __attribute__((always_inline)) {
    const int key = n0 + i * kBox;
    if (key >= seqlen_k) {
      page = 0, row = (page_rows + kBox - 1) / kBox * kBox;
    } else if (paged) {
      page = table[key >> params.page_size_log2], row = key & (page_rows - 1);
    } else {
      page = batch, row = key;
    }
  };
  bool bad = false;
  if (paged) {
    CUTE_UNROLL
    for (int i = 0; i < kBoxes; ++i) {
      int page, row;
      box_at(i, page, row);
      bad = bad || bad_page(page);
    }
  }
  const bool mend = (ragged && seqlen_k % kBox != 0) || bad;
  uint64_t* bar_k = &storage.k_bar.full[kv.index()];
  uint64_t* bar_v = &storage.v_bar.full[kv.index()];
  if (mend) {
    k_pipe.producer_wait(kv);
    v_pipe.producer_wait(kv);
    bar_k = bar_v = &storage.fix_bar;
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(bar_k, 2 * Traits::kKvBytes);
  } else {
    k_pipe.producer_acquire(kv, Traits::kKvBytes);
    v_pipe.producer_acquire(kv, Traits::kKvBytes);
  }
  Tensor sK = smem_k()(_, _, kv.index());    // (BLK_N,D)
  Tensor sVt = smem_vt()(_, _, kv.index());  // (D,BLK_N)
  Tensor mKb = kp.tma_k_box.get_tma_tensor(shape(mK));    // (rows,d,Hk,pages)
  Tensor mVtb = kp.tma_v_box.get_tma_tensor(shape(mVt));  // (d,rows,Hk,pages)
  CUTE_UNROLL
  for (int i = 0; i < kBoxes; ++i) {
    int page, row;
    box_at(i, page, row);
    if (bad_page(page)) page = -1;  // a coordinate TMA fills with zeros
    Tensor gK = local_tile(mKb(_, _, head_k, page), TileBoxK{}, make_coord(row / kBox, 0));     // (BOX,D)
    Tensor gVt = local_tile(mVtb(_, _, head_k, page), TileBoxVt{}, make_coord(0, row / kBox));  // (D,BOX)
    Tensor sKi = local_tile(sK, TileBoxK{}, make_coord(i, 0));     // (BOX,D)
    Tensor sVti = local_tile(sVt, TileBoxVt{}, make_coord(0, i));  // (D,BOX)
    auto [tKg, tKs] = tma_partition(kp.tma_k_box, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sKi), group_modes<0, 2>(gK));
    auto [tVg, tVs] = tma_partition(kp.tma_v_box, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sVti), group_modes<0, 2>(gVt));
    copy(kp.tma_k_box.with(*bar_k), tKg, tKs);
    copy(kp.tma_v_box.with(*bar_v), tVg, tVs);
  }
  if (!mend) return;
  cutlass::arch::ClusterTransactionBarrier::wait(bar_k, fix_phase);
  fix_phase ^= 1;
  // Rows [r0, r1) of the block become `bits` in K, and in V too where `v` (16 bytes at a time:
  // 8 elements of a row are contiguous in every swizzle).
  auto fill = [&](int r0, int r1, uint32_t bits, bool v) {
    const uint4 chunk = make_uint4(bits, bits, bits, bits);
    for (int r = r0; r < r1; ++r) {
      for (int c = 0; c < kHeadDim; c += 8) {
        *reinterpret_cast<uint4*>(raw_pointer_cast(&sK(r, c))) = chunk;
        if (v) *reinterpret_cast<uint4*>(raw_pointer_cast(&sVt(c, r))) = chunk;
      }
    }
  };
  if (bad) {
    for (int i = 0; i < kBoxes; ++i) {
      int page, row;
      box_at(i, page, row);
      if (bad_page(page)) fill(i * kBox, min(i * kBox + kBox, seqlen_k - n0), 0xffffffffu, false);  // NaN
    }
  }
  if (ragged) fill(seqlen_k - n0, min(kBlockN, (seqlen_k - n0 + kBox - 1) / kBox * kBox), 0u, true);
  cutlass::arch::fence_view_async_shared();  // the writes, before the consumers' wgmma reads
  k_pipe.producer_commit(kv);
  v_pipe.producer_commit(kv);
}

}  // namespace flashcute::sm90
