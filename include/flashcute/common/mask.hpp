// flashcute/common/mask.hpp: which keys each query row may see.
//
// FlashAttention-2 semantics, aligned to the bottom-right corner: with
// offset = seqlen_k - seqlen_q, query row i sees key j iff
//   i + offset - window_left <= j <= i + offset + window_right   and   j < seqlen_k,
// where a negative window bound is unbounded. Causal is window_right == 0.
#pragma once

#include <cute/tensor.hpp>

namespace flashcute {

struct KeyMask {
  int seqlen_k;
  int offset;        // seqlen_k - seqlen_q
  int window_left;   // < 0: unbounded
  int window_right;  // < 0: unbounded

  // First visible key of query row `row` (may be negative: clamp before use).
  CUTE_HOST_DEVICE int key_begin(int row) const { return window_left >= 0 ? row + offset - window_left : 0; }
  // One past the last visible key of query row `row`.
  CUTE_HOST_DEVICE int key_end(int row) const {
    return window_right >= 0 ? cute::min(seqlen_k, row + offset + window_right + 1) : seqlen_k;
  }

  // True unless every (row, key) of the tile rows [m0, m0+bm) x keys [n0, n0+bn) is visible.
  CUTE_HOST_DEVICE bool tile_needs_mask(int m0, int bm, int n0, int bn) const {
    return n0 + bn > key_end(m0) || n0 < key_begin(m0 + bm - 1);
  }

  // Sets invisible scores to -inf. scores: ((2,MMA_M),(2,MMA_N)) row/col view of the
  // S accumulator; coords: the same view of the tile's identity tensor.
  template <class Scores, class Coords>
  CUTE_DEVICE void apply(Scores& scores, Coords const& coords, int m0, int n0) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size<0>(scores); ++i) {
      const int row = m0 + cute::get<0>(coords(i, 0));
      const int begin = key_begin(row);
      const int end = key_end(row);
      CUTE_UNROLL
      for (int j = 0; j < cute::size<1>(scores); ++j) {
        const int key = n0 + cute::get<1>(coords(0, j));
        if (key < begin || key >= end) scores(i, j) = -INFINITY;
      }
    }
  }
};

}  // namespace flashcute
