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

// load_tile for a tile whose rows are not evenly spaced in memory (a paged KV cache). src is the
// partition of the tile as if its rows were contiguous from the page-free base; row_shift(m, r)
// gives, for the thread's m-th row (tile row r), the element offset to add to that address to
// reach the row's real place. Called once per row, only for the rows that are loaded.
template <bool kCheckRows, class TiledCopy, class SrcTensor, class DstTensor, class CoordTensor, class RowShift>
CUTE_DEVICE void load_tile_gather(TiledCopy const& tiled_copy, SrcTensor const& src, DstTensor&& dst,
                                  CoordTensor const& coord, RowShift const& row_shift, int max_rows, int max_cols) {
  CUTE_STATIC_ASSERT_V(cute::rank(src) == cute::Int<3>{});
  CUTE_STATIC_ASSERT_V(cute::size<1>(src) == cute::size<1>(dst));
  CUTE_STATIC_ASSERT_V(cute::size<2>(src) == cute::size<2>(dst));
  CUTE_UNROLL
  for (int m = 0; m < cute::size<1>(src); ++m) {
    const int row = cute::get<0>(coord(0, m, 0));
    const bool row_ok = !kCheckRows || row < max_rows;
    const int64_t shift = row_ok ? row_shift(m, row) : 0;  // a row past the end is never looked up
    CUTE_UNROLL
    for (int k = 0; k < cute::size<2>(src); ++k) {
      const bool ok = row_ok && cute::get<1>(coord(0, m, k)) < max_cols;
      auto chunk = src(cute::_, m, k);
      cute::copy(tiled_copy.with(ok), cute::make_tensor(chunk.data() + shift, chunk.layout()), dst(cute::_, m, k));
    }
  }
}

}  // namespace flashcute::sm80
