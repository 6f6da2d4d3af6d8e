// flashcute/sm90/mainloop_kvcache.hpp: the sm90a forward's K/V loads from a KV cache
// (FwdMainloop::load_cache_block, FwdMode::kKvcache), contiguous or paged: whole blocks or page
// boxes by TMA, and the blocks the producer mends before the consumers read them. K and V come from
// two producer threads (warps 0 and 1), one operand each. Included at the end of mainloop_fwd.hpp,
// which declares it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flashcute/sm90/mainloop_fwd.hpp"

namespace flashcute::sm90 {

template <class Traits>
template <bool kV>
CUTE_DEVICE void FwdMainloop<Traits>::load_cache_block(int batch, int head_k, int seqlen_k, int n_block, KvState kv,
                                                       uint32_t& fix_phase) const {
  using namespace cute;
  constexpr int kBox = Traits::kBoxRows;
  constexpr int kBoxes = kBlockN / kBox;
  const FwdParams& params = kp.params;
  const KvPipeline& pipe = kV ? v_pipe : k_pipe;
  const bool paged = params.block_table != nullptr;
  const int page_rows = paged ? 1 << params.page_size_log2 : params.seqlen_k;
  const int pages = paged ? params.num_pages : params.batch;
  const int* table = params.block_table + int64_t(batch) * params.block_table_batch_stride;  // read when paged
  const int n0 = n_block * kBlockN;
  auto bad_page = [&](int page) __attribute__((always_inline)) { return page < 0 || page >= pages; };
  // This thread's operand of a (K, V) pair of TMA descriptors.
  auto ours = [](auto const& k, auto const& v) -> auto const& {
    if constexpr (kV) return v;
    else return k;
  };
  const auto shape_k = make_shape(page_rows, params.head_dim, params.nheads_k, pages);   // (rows,d,Hk,pages)
  const auto shape_vt = make_shape(params.head_dim, page_rows, params.nheads_k, pages);  // (d,rows,Hk,pages)
  // Keys [i kRows, (i + 1) kRows) of the buffer from rows [row, row + kRows) of `page` through tma
  // (a descriptor for boxes of kRows keys), signalling bar.
  auto load_box = [&](auto rows, auto const& tma, uint64_t& bar, int i, int page, int row)
                      __attribute__((always_inline)) {
    constexpr int kRows = decltype(rows)::value;
    if constexpr (kV) {
      using TileBox = Shape<Int<kHeadDim>, Int<kRows>>;
      Tensor gVt = local_tile(tma.get_tma_tensor(shape_vt)(_, _, head_k, page), TileBox{},
                              make_coord(0, row / kRows));                                     // (D,BOX)
      Tensor sVt = local_tile(smem_vt()(_, _, kv.index()), TileBox{}, make_coord(0, i));       // (D,BOX)
      auto [tg, ts] = tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sVt), group_modes<0, 2>(gVt));
      copy(tma.with(bar), tg, ts);
    } else {
      using TileBox = Shape<Int<kRows>, Int<kHeadDim>>;
      Tensor gK = local_tile(tma.get_tma_tensor(shape_k)(_, _, head_k, page), TileBox{},
                             make_coord(row / kRows, 0));                                      // (BOX,D)
      Tensor sK = local_tile(smem_k()(_, _, kv.index()), TileBox{}, make_coord(i, 0));         // (BOX,D)
      auto [tg, ts] = tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      copy(tma.with(bar), tg, ts);
    }
  };
  // The block holds cache rows past the keys (a paged cache's page, a contiguous cache short of
  // its capacity).
  const bool ragged = seqlen_k < n0 + kBlockN && (paged || seqlen_k < params.seqlen_k);
  // A block with no row past the keys, in boxes of kRows keys (each within a page): false, loading
  // nothing, where one of its pages is out of range.
  auto load_boxes = [&](auto rows, auto const& tma_k_, auto const& tma_v_) __attribute__((always_inline)) {
    constexpr int kRows = decltype(rows)::value;
    // Every page first: independent loads, none behind a TMA instruction.
    int page[kBlockN / kRows];
    bool bad = false;
    CUTE_UNROLL
    for (int i = 0; i < kBlockN / kRows; ++i) {
      page[i] = paged ? table[(n0 + i * kRows) >> params.page_size_log2] : batch;
      bad = bad || bad_page(page[i]);
    }
    if (bad) return false;
    uint64_t& bar = pipe.producer_acquire(kv, Traits::kKvBytes);
    CUTE_UNROLL
    for (int i = 0; i < kBlockN / kRows; ++i) {
      const int key = n0 + i * kRows;
      load_box(rows, ours(tma_k_, tma_v_), bar, i, page[i], paged ? key & (page_rows - 1) : key);
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
  // Only K is mended for a page out of range: V's rows there stay TMA's zeros.
  bool bad = false;
  if (!kV && paged) {
    CUTE_UNROLL
    for (int i = 0; i < kBoxes; ++i) {
      int page, row;
      box_at(i, page, row);
      bad = bad || bad_page(page);
    }
  }
  const bool mend = (ragged && seqlen_k % kBox != 0) || bad;
  uint64_t* bar = &(kV ? storage.v_bar : storage.k_bar).full[kv.index()];
  uint64_t* fix_bar = kV ? &storage.fix_bar.v : &storage.fix_bar.k;
  if (mend) {
    pipe.producer_wait(kv);
    bar = fix_bar;
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(bar, Traits::kKvBytes);
  } else {
    pipe.producer_acquire(kv, Traits::kKvBytes);
  }
  CUTE_UNROLL
  for (int i = 0; i < kBoxes; ++i) {
    int page, row;
    box_at(i, page, row);
    if (bad_page(page)) page = -1;  // a coordinate TMA fills with zeros
    load_box(Int<kBox>{}, ours(kp.tma_k_box, kp.tma_v_box), *bar, i, page, row);
  }
  if (!mend) return;
  cutlass::arch::ClusterTransactionBarrier::wait(bar, fix_phase);
  fix_phase ^= 1;
  // Rows [r0, r1) of the block become `bits` (16 bytes at a time: 8 elements of a row are
  // contiguous in every swizzle).
  Tensor sK = smem_k()(_, _, kv.index());    // (BLK_N,D)
  Tensor sVt = smem_vt()(_, _, kv.index());  // (D,BLK_N)
  auto fill = [&](int r0, int r1, uint32_t bits) {
    const uint4 chunk = make_uint4(bits, bits, bits, bits);
    for (int r = r0; r < r1; ++r) {
      for (int c = 0; c < kHeadDim; c += 8) {
        if constexpr (kV) *reinterpret_cast<uint4*>(raw_pointer_cast(&sVt(c, r))) = chunk;
        else *reinterpret_cast<uint4*>(raw_pointer_cast(&sK(r, c))) = chunk;
      }
    }
  };
  if (bad) {
    for (int i = 0; i < kBoxes; ++i) {
      int page, row;
      box_at(i, page, row);
      if (bad_page(page)) fill(i * kBox, min(i * kBox + kBox, seqlen_k - n0), 0xffffffffu);  // NaN
    }
  }
  if (ragged) fill(seqlen_k - n0, min(kBlockN, (seqlen_k - n0 + kBox - 1) / kBox * kBox), 0u);
  cutlass::arch::fence_view_async_shared();  // the writes, before the consumers' wgmma reads
  pipe.producer_commit(kv);
}

}  // namespace flashcute::sm90
