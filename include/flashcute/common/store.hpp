// flashcute/common/store.hpp: a predicated registers -> global tile store.
//
// The epilogues of both kernel families stage a tile of O (or dQ/dK/dV) so that each thread
// holds whole 16-byte chunks, then store only the chunks inside the arrays: ragged rows at the
// end of a sequence, and columns past a head dim narrower than the kernel's.
#pragma once

#include <cute/tensor.hpp>

namespace flashcute {

// src/dst: (CPY,CPY_M,CPY_K) partitions of one tile; coord: the same partition of the tile's
// identity tensor, giving (row, col) within the tile. Stores only the valid rows and columns.
template <class TiledCopy, class SrcTensor, class DstTensor, class CoordTensor>
CUTE_DEVICE void store_tile(TiledCopy const& tiled_copy, SrcTensor const& src, DstTensor&& dst, CoordTensor const& coord,
                            int max_rows, int max_cols) {
  CUTE_UNROLL
  for (int m = 0; m < cute::size<1>(src); ++m) {
    if (cute::get<0>(coord(0, m, 0)) < max_rows) {
      CUTE_UNROLL
      for (int k = 0; k < cute::size<2>(src); ++k) {
        if (cute::get<1>(coord(0, m, k)) < max_cols) {
          cute::copy(tiled_copy, src(cute::_, m, k), dst(cute::_, m, k));
        }
      }
    }
  }
}

}  // namespace flashcute
