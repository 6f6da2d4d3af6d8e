// flashcute/sm90/mask.hpp: what one consumer warpgroup of the sm90a forward sees of a tile.
//
// KeyMask (common/mask.hpp) says which keys a query row sees. WarpgroupMask answers the questions
// the mainloop asks of it for one consumer warpgroup's 64 rows: which key blocks a tile visits,
// which of them this warpgroup can skip, whether a block needs masking at all, and the causal
// diagonal's half blocks, where a warpgroup sees only the left or all of the left half of a block.
#pragma once

#include <cute/tensor.hpp>

#include "flashcute/common/mask.hpp"

namespace flashcute::sm90 {

template <class Traits>
struct WarpgroupMask {
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  // Blocks at the top of a tile that no row of this warpgroup sees go back unread. Not with
  // ping-pong, where both warpgroups must take as many turns (and where 128-key blocks and
  // seqlen_q = seqlen_k leave no block unseen anyway).
  static constexpr bool kSkipUnseen = !Traits::kConfig.pingpong;
  // A first block's right half may be left out where no row of the warpgroup sees it: the causal
  // diagonal of the first warpgroup, at 128-key blocks.
  static constexpr bool kHalfFirst = kBlockN == 128;

  KeyMask keys;
  int seqlen_q;
  int wg;  // the consumer warpgroup: rows [64 wg, 64 wg + 64) of a tile

  // The key blocks any row of the tile at query block m_block sees: [first, last).
  CUTE_DEVICE KeyMask::Blocks tile_blocks(int m_block) const {
    return keys.key_blocks(m_block * kBlockM, kBlockM, seqlen_q, kBlockN);
  }
  // One past the last key any row of this warpgroup sees, in the tile at row m0.
  CUTE_DEVICE int key_end(int m0) const { return keys.key_end(cute::min(m0 + 64 * wg + 63, seqlen_q - 1)); }
  // The first (highest) block this warpgroup computes of a tile with blocks [n_min, n_max): the
  // last, less those at the top it does not see (up to three for the first warpgroup of a
  // causal 256 x 64 tile, one at 128 x 80 and 128 x 96). At least n_min.
  CUTE_DEVICE int top_block(int m_block, int n_min, int n_max) const {
    int top = n_max - 1;
    if constexpr (kSkipUnseen) top = cute::max(n_min, cute::min(top, (key_end(m_block * kBlockM) + kBlockN - 1) / kBlockN - 1));
    return top;
  }
  // Whether no row of this warpgroup sees a key of block n_block's right half.
  CUTE_DEVICE bool right_half_unseen(int m0, int n_block) const {
    return key_end(m0) <= n_block * kBlockN + kBlockN / 2;
  }
  // Whether block n0 of the tile at m0 needs a mask. Asked of this warpgroup's 64 rows where a
  // tile has more than two warpgroups, most of which need none on most of the diagonal's blocks;
  // of the whole tile otherwise, which measured faster at d 256 causal 1k.
  CUTE_DEVICE bool needs_mask(int m0, int n0) const {
    if constexpr (Traits::kConsumerWarpgroups > 2) return keys.tile_needs_mask(m0 + 64 * wg, 64, n0, kBlockN);
    else return keys.tile_needs_mask(m0, kBlockM, n0, kBlockN);
  }
  // Sets the scores (a row/col view) of the block at key n0 that their rows do not see to -inf.
  template <class Scores, class Coords>
  CUTE_DEVICE void apply(Scores& scores, Coords const& coords, int m0, int n0) const {
    keys.apply(scores, coords, m0, n0);
  }
  // A tile's first block: where this warpgroup sees all of its left half (the causal diagonal,
  // second warpgroup), only the right half (scores_right, coords_half) is masked.
  template <class Scores, class Coords, class ScoresHalf, class CoordsHalf>
  CUTE_DEVICE void apply_first(Scores& scores, Coords const& coords, ScoresHalf& scores_right,
                               CoordsHalf const& coords_half, int m0, int n0) const {
    if (!keys.tile_needs_mask(m0 + 64 * wg, 64, n0, kBlockN / 2)) keys.apply(scores_right, coords_half, m0, n0 + kBlockN / 2);
    else keys.apply(scores, coords, m0, n0);
  }
};

}  // namespace flashcute::sm90
