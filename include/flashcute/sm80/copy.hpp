// flashcute/sm80/copy.hpp: predicated global -> shared tile loads (cp.async).
//
// Tiles at the ragged end of a sequence, and head dims narrower than the
// kernel's, load only the valid 16 B chunks and zero the rest of the tile, so
// the GEMMs can run on whole tiles: zero Q/K columns add nothing to Q*K^T, and
// zero V rows add nothing to P*V (their P is 0 after masking, and 0 * 0 stays
// finite where 0 * garbage could be NaN).
#pragma once

#include <cute/tensor.hpp>

#include "flashcute/common/store.hpp"  // store_tile, for the epilogues beside these loads

namespace flashcute::sm80 {

// src/dst: (CPY,CPY_M,CPY_K) partitions of one tile; coord: the same partition of
// the tile's identity tensor, giving (row, col) within the tile. tiled_copy must
// use a zero-filling cp.async atom: a chunk whose predicate is false reads no
// global memory and writes 16 zero bytes, so there is no branch per chunk.
// kCheckRows: the tile may run past max_rows. Columns are always checked
// against max_cols (the head dim): one compare per chunk.
template <bool kCheckRows, class TiledCopy, class SrcTensor, class DstTensor, class CoordTensor>
CUTE_DEVICE void load_tile(TiledCopy const& tiled_copy, SrcTensor const& src, DstTensor&& dst, CoordTensor const& coord,
                           int max_rows, int max_cols) {
  CUTE_STATIC_ASSERT_V(cute::rank(src) == cute::Int<3>{});
  CUTE_STATIC_ASSERT_V(cute::size<1>(src) == cute::size<1>(dst));
  CUTE_STATIC_ASSERT_V(cute::size<2>(src) == cute::size<2>(dst));
  CUTE_UNROLL
  for (int m = 0; m < cute::size<1>(src); ++m) {
    const bool row_ok = !kCheckRows || cute::get<0>(coord(0, m, 0)) < max_rows;
    CUTE_UNROLL
    for (int k = 0; k < cute::size<2>(src); ++k) {
      const bool ok = row_ok && cute::get<1>(coord(0, m, k)) < max_cols;
      cute::copy(tiled_copy.with(ok), src(cute::_, m, k), dst(cute::_, m, k));
    }
  }
}

// Where load_tile_gather finds one row: the element offset to add to its page-free address, and
// whether it may be read at all (false: its page is not in the cache).
struct GatherRow {
  int64_t shift;
  bool ok;
};

// load_tile for a tile whose rows are not evenly spaced in memory (a paged KV cache). src is the
// partition of the tile as if its rows were contiguous from the page-free base; row_at(m, r)
// gives the GatherRow of the thread's m-th row (tile row r). Called once per row, only for the
// rows that are loaded. A row that may not be read issues no cp.async: kNanBad (a K tile) fills
// it with NaN, so every score that sees it is NaN; otherwise (a V tile) it is zero-filled.
template <bool kCheckRows, bool kNanBad, class TiledCopy, class SrcTensor, class DstTensor, class CoordTensor,
          class RowAt>
CUTE_DEVICE void load_tile_gather(TiledCopy const& tiled_copy, SrcTensor const& src, DstTensor&& dst,
                                  CoordTensor const& coord, RowAt const& row_at, int max_rows, int max_cols) {
  CUTE_STATIC_ASSERT_V(cute::rank(src) == cute::Int<3>{});
  CUTE_STATIC_ASSERT_V(cute::size<1>(src) == cute::size<1>(dst));
  CUTE_STATIC_ASSERT_V(cute::size<2>(src) == cute::size<2>(dst));
  static_assert(sizeof(typename std::decay_t<DstTensor>::value_type) == 2, "the NaN fill is for 16-bit types");
  constexpr uint64_t kNan = 0x7fff7fff7fff7fffull;  // 0x7fff: a quiet NaN in fp16 and in bf16
  CUTE_UNROLL
  for (int m = 0; m < cute::size<1>(src); ++m) {
    const int row = cute::get<0>(coord(0, m, 0));
    const bool row_in = !kCheckRows || row < max_rows;
    const GatherRow at = row_in ? row_at(m, row) : GatherRow{0, true};  // a row past the end is never looked up
    CUTE_UNROLL
    for (int k = 0; k < cute::size<2>(src); ++k) {
      if (kNanBad && !at.ok) {  // plain stores: the barrier before every read of the tile publishes them
        cute::fill(cute::recast<cute::uint128_t>(dst(cute::_, m, k)), cute::uint128_t(kNan, kNan));
        continue;
      }
      const bool ok = row_in && at.ok && cute::get<1>(coord(0, m, k)) < max_cols;
      auto chunk = src(cute::_, m, k);
      cute::copy(tiled_copy.with(ok), cute::make_tensor(chunk.data() + at.shift, chunk.layout()), dst(cute::_, m, k));
    }
  }
}

}  // namespace flashcute::sm80
