// flashcute/sm90/mask.hpp: the mask of one consumer warpgroup of the sm90a forward kernel.
//
// KeyMask (common/mask.hpp) says which keys a query row sees; FwdMask says what that means for
// one warpgroup's 64 rows of a BLK_M x BLK_N tile: the key blocks it computes, which of them need
// a mask, and the causal diagonal's special cases (blocks no row of it sees, a first block of which
// it sees only the left half, or all of the left half). One type for every mask (causal, sliding
// windows, ragged seqlen_k): the bounds are runtime values, so one kernel per head dim serves them.
// A varlen kernel's consumers reset the lengths at each tile (set_sequence).
#pragma once

#include <cute/tensor.hpp>

#include "flashcute/common/mask.hpp"
#include "flashcute/sm90/scheduler.hpp"

namespace flashcute::sm90 {

template <class Traits>
struct FwdMask {
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  // Blocks right of this warpgroup's rows on the causal diagonal are skipped (up to three for the
  // first warpgroup of a 256 x 64 tile, one for the first of a 128 x 80 or 128 x 96 tile; +1-5% at
  // d 192 causal). Not with ping-pong (d 96, 128), where both warpgroups must take as many turns,
  // and where 128-key blocks and seqlen_q = seqlen_k leave no block unseen anyway.
  static constexpr bool kSkipUnseen = !Traits::kConfig.pingpong;
  // At 128-key blocks, a first block whose right half this warpgroup does not see is computed as
  // its left half (+6.8% at d 64 causal 1k).
  static constexpr bool kHalfFirst = kBlockN == 128;

  KeyMask keys;
  int seqlen_q;
  int wg;  // the consumer warpgroup: rows [64 wg, 64 wg + 64) of a tile

  // A varlen tile's mask: its sequence's lengths (the window stays the call's).
  CUTE_DEVICE void set_sequence(const VarlenRows& seq) {
    keys.seqlen_k = seq.seqlen_k;
    keys.offset = seq.seqlen_k - seq.seqlen_q;
    seqlen_q = seq.seqlen_q;
  }

  // One past the last key any row of this warpgroup sees, in the tile at row tile_m0.
  CUTE_DEVICE int key_end(int tile_m0) const { return keys.key_end(cute::min(tile_m0 + 64 * wg + 63, seqlen_q - 1)); }

  // Whether no row of this warpgroup in the tile at tile_m0 sees a key of block n_block's right half.
  CUTE_DEVICE bool right_half_unseen(int tile_m0, int n_block) const {
    return key_end(tile_m0) <= n_block * kBlockN + kBlockN / 2;
  }

  // The first (highest) key block this warpgroup computes in a tile: the tile's last visible block,
  // less those at the top that no row of this warpgroup sees. At least the tile's first block.
  CUTE_DEVICE int top_block(const WorkTile& t) const {
    int top = t.n_block_max - 1;
    if constexpr (kSkipUnseen)
      top = cute::max(t.n_block_min, cute::min(top, (key_end(t.m_block * kBlockM) + kBlockN - 1) / kBlockN - 1));
    return top;
  }

  // Whether block n0's scores need a mask at all: asked of this warpgroup's 64 rows where a tile
  // has more than two warpgroups, most of whom need no mask on most of the diagonal's blocks; of
  // the whole tile otherwise, which measured faster at d 256 causal 1k.
  CUTE_DEVICE bool needs_mask(int tile_m0, int n0) const {
    return Traits::kConsumerWarpgroups > 2 ? keys.tile_needs_mask(tile_m0 + 64 * wg, 64, n0, kBlockN)
                                           : keys.tile_needs_mask(tile_m0, kBlockM, n0, kBlockN);
  }

  // The mask of a tile's first block: where this warpgroup sees all of the block's left half (the
  // causal diagonal, second warpgroup), only the right half is masked (+1.2% at d 64 causal 1k).
  // scores_right, coords_half: the right half's row/col view and the coordinates of a half block.
  template <class Scores, class Coords, class ScoresHalf, class CoordsHalf>
  CUTE_DEVICE void apply_first(Scores& scores, Coords const& coords, ScoresHalf& scores_right,
                               CoordsHalf const& coords_half, int tile_m0, int n0) const {
    if (!keys.tile_needs_mask(tile_m0 + 64 * wg, 64, n0, kBlockN / 2)) {
      keys.apply(scores_right, coords_half, tile_m0, n0 + kBlockN / 2);
    } else {
      keys.apply(scores, coords, tile_m0, n0);
    }
  }
};

}  // namespace flashcute::sm90
