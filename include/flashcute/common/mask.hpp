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

  // The query rows that see key `key`: [query_begin, query_end), clamped to [0, seqlen_q). The
  // inverse of key_begin/key_end, for kernels that walk the queries of a key block.
  CUTE_HOST_DEVICE int query_begin(int key) const {
    return window_right >= 0 ? cute::max(0, key - offset - window_right) : 0;
  }
  CUTE_HOST_DEVICE int query_end(int key, int seqlen_q) const {
    return window_left >= 0 ? cute::min(seqlen_q, key - offset + window_left + 1) : seqlen_q;
  }

  // The key blocks of block_n keys that any of the query rows [m0, min(m0 + bm, seqlen_q)) sees:
  // [first, last), first == last where none does.
  struct Blocks {
    int first, last;
  };
  CUTE_HOST_DEVICE Blocks key_blocks(int m0, int bm, int seqlen_q, int block_n) const {
    const int key_lo = cute::max(0, key_begin(m0));
    const int key_hi = key_end(cute::min(m0 + bm, seqlen_q) - 1);
    const int first = key_lo / block_n;
    return {first, key_hi > key_lo ? (key_hi + block_n - 1) / block_n : first};
  }

  // True unless every (row, key) of the tile rows [m0, m0+bm) x keys [n0, n0+bn) is visible.
  CUTE_HOST_DEVICE bool tile_needs_mask(int m0, int bm, int n0, int bn) const {
    return n0 + bn > key_end(m0) || n0 < key_begin(m0 + bm - 1);
  }

  // Sets invisible scores to -inf. scores: ((2,MMA_M),(2,MMA_N)) row/col view of the
  // S accumulator; coords: the same view of the tile's identity tensor.
  template <class Scores, class Coords>
  CUTE_DEVICE void apply(Scores& scores, Coords const& coords, int m0, int n0, float fill = -INFINITY) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size<0>(scores); ++i) {
      const int row = m0 + cute::get<0>(coords(i, 0));
      const int begin = key_begin(row);
      const int end = key_end(row);
      CUTE_UNROLL
      for (int j = 0; j < cute::size<1>(scores); ++j) {
        const int key = n0 + cute::get<1>(coords(0, j));
        if (key < begin || key >= end) scores(i, j) = fill;
      }
    }
  }

  // The same for a transposed tile, rows keys [n0, ...) and columns queries [m0, ...): sets the
  // elements whose query does not see their key to `fill`.
  template <class Scores, class Coords>
  CUTE_DEVICE void apply_transposed(Scores& scores, Coords const& coords, int n0, int m0, float fill) const {
    CUTE_UNROLL
    for (int j = 0; j < cute::size<1>(scores); ++j) {
      const int query = m0 + cute::get<1>(coords(0, j));
      const int begin = key_begin(query);
      const int end = key_end(query);
      CUTE_UNROLL
      for (int i = 0; i < cute::size<0>(scores); ++i) {
        const int key = n0 + cute::get<0>(coords(i, 0));
        if (key < begin || key >= end) scores(i, j) = fill;
      }
    }
  }
};

}  // namespace flashcute
