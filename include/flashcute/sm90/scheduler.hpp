// flashcute/sm90/scheduler.hpp: the persistent tile scheduler of the sm90a forward kernel, and
// the backward's walk (BwdTile, at the end).
//
// A tile is BLK_M query rows of one (batch, head), `hb` = batch * nheads + head. The work comes in
// units: one tile, or, for causal masks (`pair_tiles`), query tiles p and m_blocks - 1 - p of one
// head, whose key blocks add up to about the same count for every p. Units run in the order the
// sm80 kernel's grid runs its tiles (for each (batch, head), from the last, heaviest query tile
// to the first), so the CTAs at work at one time share K and V in L2: CTA c takes units c,
// c + ctas, c + 2 ctas, ...
//
// Units of equal cost still leave the last round ragged: 2048 causal units on 132 SMs are 15.5
// rounds, and every SM waits for the 68 that take a 16th (3% of the whole). So with pair_tiles the
// last units, from `tail_begin` (a whole number of rounds), form a tail walked tile by tile: its
// tiles, heaviest first (the last query tile of every (batch, head) in it, then the one before it,
// ...), dealt to the CTAs in rounds that alternate direction (0, 1, ..., ctas - 1, then back), so
// that who takes a heavy tile in one round takes a light one in the next. The host chooses the
// tail (plan_tile_schedule) by simulating that deal, and takes none below 16 query tiles per
// (batch, head), where it measured slower (-0.3..-1.7% at 1k); the kernel and the host tests walk
// it with the same functions below.
//
// Everything here is 32-bit (sm90_can_run keeps the unit count below 2^31): a 64-bit division is
// a long software routine, and every CTA decodes its first tile before its first load.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cute/config.hpp>
#include <cutlass/fast_math.h>

#include "flashcute/common/mask.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/seqlen.hpp"
#include "flashcute/sm90/config.hpp"

namespace flashcute::sm90 {

// Fast division: cutlass::FastDivmod, a multiply-high and a shift with the multiplier worked out
// on the host, exact for dividends below 2^31. Every tile's decode divides by runtime counts, and
// a 32-bit division is a subroutine of some twenty instructions and registers the consumers do
// not have to spare.
using cutlass::FastDivmod;

// One launch's walk, decided on the host (plan_tile_schedule) and passed in the kernel's
// parameters. A CTA walks positions (u, j) from (cta, 0) while u < end (TileScheduler): before
// the tail, u is a unit and j its tile; in the tail, u = tail_begin + t * ctas + cta for the CTA's
// t-th round, and j = 0. A position may hold no tile (`valid` false): the second tile of the
// middle pair of an odd count (its first), or a tail round's slot past the last tile.
struct TileSchedule {
  bool pair_tiles = false;   // causal: a unit is query tiles p and m_blocks - 1 - p
  unsigned m_blocks = 0;     // query tiles per (batch, head)
  unsigned heads_batch = 0;  // (batch, head) pairs
  unsigned ctas = 0;         // the grid
  unsigned unit_m = 0;       // units per (batch, head)
  unsigned num_units = 0;
  unsigned tail_begin = 0;   // units walked round-robin before the tail (a multiple of ctas)
  unsigned tail_tiles = 0;   // tiles of the tail (0: none, and tail_begin is the unit count)
  unsigned end = 0;          // one past every CTA's last position
  // The tail's units are the pairs p >= tail_p0 of (batch, head) tail_b0 (its query tiles [p0,
  // m_blocks - 1 - p0]) and all units of the tail_full (F) pairs after it.
  unsigned tail_b0 = 0, tail_p0 = 0, tail_full = 0;
  FastDivmod div_ctas, div_full, div_full1;  // by ctas, F and F + 1
  FastDivmod div_unit_m;                     // by unit_m (unit_tile's decode)

  struct Tile {
    bool valid;
    int m_block;
    unsigned hb;  // batch * nheads + head
  };

  CUTE_HOST_DEVICE bool in_tail(unsigned u) const { return tail_tiles > 0 && u >= tail_begin; }

  // The unit at position u before the tail. With a tail, round i's units go to the CTAs rotated
  // by i: pairs of tiles cost the same only up to a key block (block_n need not divide block_m),
  // and without the rotation CTA c would take a unit of the same pair p in every round where
  // unit_m divides ctas (d 256 at 1k: pairs of 17 and 18 blocks, and a CTA took 18 in each of
  // its rounds). The rounds' units stay the same, and so do the heads in flight at one time.
  CUTE_HOST_DEVICE unsigned unit_at(unsigned u) const {
    if (tail_tiles == 0) return u;
    const unsigned i = unsigned(div_ctas.div(int(u)));  // the round
    const unsigned r = u - i * ctas + i;                 // the CTA, plus the round
    return i * ctas + unsigned(div_ctas.rem(int(r)));
  }

  // Tile j of unit u. Static, with the counts as arguments: the kernel passes its own copies,
  // computed from the problem's shape (reading them from the parameters here instead made ptxas
  // spill at d 256, whose consumers have no register to spare). div_unit_m divides by unit_m: a
  // multiply-high where a division is a chain of some twenty dependent instructions, which the
  // consumers run at every tile boundary; read from the parameters, it costs d 256 one more
  // spilled value, reloaded at tile boundaries only (measured at d 256, docs/perf-notes.md).
  CUTE_HOST_DEVICE static Tile unit_tile(unsigned u, unsigned j, unsigned m_blocks, FastDivmod div_unit_m) {
    Tile tile;
    int hb, p;
    div_unit_m(hb, p, int(u));
    const unsigned last = m_blocks - 1 - unsigned(p);
    tile.hb = unsigned(hb);
    tile.m_block = int(j == 0 ? last : unsigned(p));
    tile.valid = j == 0 || unsigned(p) != last;
    return tile;
  }

  // The tile at tail position u of CTA cta: round t deals tail tiles [t ctas, (t + 1) ctas),
  // forwards in even rounds and backwards in odd ones.
  CUTE_HOST_DEVICE Tile tail_at(unsigned u, unsigned cta) const {
    const unsigned v = u - tail_begin;  // t * ctas + cta
    const unsigned k = (div_ctas.div(int(v)) & 1) ? v + ctas - 1 - 2 * cta : v;
    Tile tile{k < tail_tiles, 0, 0};
    if (tile.valid) tail_tile(k, tile);
    return tile;
  }

  // Tile k of the tail, heaviest first: query tile x from m_blocks - 1 down to 0, and for each x
  // the (batch, head) pairs that have it, in order.
  CUTE_HOST_DEVICE void tail_tile(unsigned k, Tile& tile) const {
    const unsigned top = tail_p0 * tail_full;  // x in (m - 1 - p0, m - 1]: F tiles each
    const unsigned mid = (m_blocks - 2 * tail_p0) * (tail_full + 1);  // x in [p0, m - 1 - p0]: b0's too
    if (k >= top && k < top + mid) {
      const unsigned r = k - top, i = unsigned(div_full1.div(int(r)));
      tile.m_block = int(m_blocks - 1 - tail_p0 - i);
      tile.hb = tail_b0 + r - i * (tail_full + 1);
    } else {  // x above or below that range: F tiles each (reached only where F > 0)
      const unsigned r = k < top ? k : k - mid, i = unsigned(div_full.div(int(r)));
      tile.m_block = int(k < top ? m_blocks - 1 - i : m_blocks - 1 - i - (m_blocks - 2 * tail_p0));
      tile.hb = tail_b0 + 1 + r - i * tail_full;
    }
  }
};

// A tile as the kernel works on it: its position in the walk, its (m_block, head, batch), and the
// key blocks any of its rows sees, [n_block_min, n_block_max) (none: O = 0, lse = -inf). The
// tiles of a varlen or KV-cache kernel also carry their lengths (TileScheduler::rows), decoded
// with the tile (read again where used instead, at the epilogue, d 256 spilled).
struct WorkTile {
  unsigned u, j;  // the walk's position (TileSchedule)
  bool valid;     // whether the position holds a tile
  int m_block, head, batch, n_block_min, n_block_max;
  int q_start = 0, k_start = 0, seqlen_q = 0, seqlen_k = 0;  // varlen and KV cache only
  CUTE_HOST_DEVICE bool has_keys() const { return n_block_max > n_block_min; }
  CUTE_HOST_DEVICE VarlenRows sequence() const { return {q_start, k_start, seqlen_q, seqlen_k}; }
};

// The walk of one CTA (cta of ctas: blockIdx.x of gridDim.x in the kernel), its tiles in order,
// each decoded once. Producer and consumers walk the same tiles and count their key blocks the
// same way; the host tests walk every CTA with it.
// 32-bit arithmetic (sm90_can_run keeps the unit count below 2^31): a 64-bit division is a long
// software routine, and every CTA decodes its first tile before its first load. The walk ends at
// a position (u >= end), not at a flag: ptxas then proves every loop over the tiles warp-uniform.
template <int kBlockM, int kBlockN, FwdMode kMode = FwdMode::kFixed>
struct TileScheduler {
  const TileSchedule& walk;
  const FwdParams& params;
  const FastDivmod& div_heads;  // by params.nheads
  const KeyMask& keys;
  unsigned cta, ctas;
  // The counts unit_tile takes, computed here from the problem's shape: read from the walk instead,
  // they (and the bound, read as walk.end alone) made ptxas spill at d 256.
  unsigned m_blocks, unit_m, end;

  CUTE_HOST_DEVICE TileScheduler(const TileSchedule& walk_, const FwdParams& params_, const FastDivmod& div_heads_,
                                 const KeyMask& keys_, unsigned cta_, unsigned ctas_)
      : walk(walk_), params(params_), div_heads(div_heads_), keys(keys_), cta(cta_), ctas(ctas_) {
    m_blocks = unsigned(cute::ceil_div(params.seqlen_q, kBlockM));
    unit_m = walk.pair_tiles ? (m_blocks + 1) / 2 : m_blocks;  // units per (head, batch)
    end = walk.tail_tiles > 0 ? walk.end : unit_m * unsigned(params.nheads) * unsigned(params.batch);
  }

  // The walk over the units of the sequences that exist (FwdMode::kVarlenMixed, at_varlen).
  static constexpr bool kUnits = kMode == FwdMode::kVarlenMixed;

  // kUnits: past the last sequence (at_varlen's cursor ran out).
  CUTE_HOST_DEVICE bool done(const WorkTile& tile) const {
    if constexpr (kUnits) return tile.batch >= params.batch;
    else return tile.u >= end;
  }

  // The consumers' walk (and kUnits' producer's): this CTA's first tile (done() where a tail round
  // deals it none), then the tile after each, skipping positions that hold none (done() past the
  // last).
  CUTE_HOST_DEVICE WorkTile first() const {
    WorkTile tile = start();
    if constexpr (kUnits) {
      tile = at_varlen(tile.u, 0, 0);
      if (!done(tile) && !tile.valid) tile = next(tile);
    } else if (!done(tile)) {
      tile = at(tile.u, 0);
      if (!tile.valid) tile = next(tile);
    }
    return tile;
  }
  CUTE_HOST_DEVICE WorkTile next(const WorkTile& tile) const {
    WorkTile n = tile;
    do {
      step(n);
      if constexpr (kUnits) {
        n = at_varlen(n.u, n.j, n.batch);
        if (done(n)) break;
      } else {
        if (done(n)) break;
        n = at(n.u, n.j);
      }
    } while (!n.valid);
    return n;
  }

  // The producer's walk, position by position, each decoded by at() (valid or not): one decode in
  // the loop, where the producer has few registers.
  CUTE_HOST_DEVICE WorkTile start() const {
    WorkTile tile;
    tile.u = cta, tile.j = 0;
    return tile;
  }
  CUTE_HOST_DEVICE void step(WorkTile& tile) const {
    if (walk.in_tail(tile.u) || ++tile.j == (walk.pair_tiles ? 2u : 1u)) tile.j = 0, tile.u += ctas;
  }
  CUTE_HOST_DEVICE WorkTile at(unsigned u, unsigned j) const {
    const TileSchedule::Tile w =
        walk.in_tail(u) ? walk.tail_at(u, cta) : TileSchedule::unit_tile(walk.unit_at(u), j, m_blocks, walk.div_unit_m);
    WorkTile tile;
    tile.u = u, tile.j = j;
    tile.valid = w.valid;
    tile.m_block = w.m_block;
    div_heads(tile.batch, tile.head, int(w.hb));
    KeyMask::Blocks blocks;
    if constexpr (kMode != FwdMode::kFixed) {
      // The walk covers the longest sequence's query tiles; a shorter one's last ones hold none.
      const VarlenRows seq = rows(tile.batch);
      tile.q_start = seq.q_start, tile.k_start = seq.k_start, tile.seqlen_q = seq.seqlen_q, tile.seqlen_k = seq.seqlen_k;
      tile.valid = tile.valid && tile.m_block * kBlockM < seq.seqlen_q;
      blocks = sequence_keys(seq).key_blocks(tile.m_block * kBlockM, kBlockM, seq.seqlen_q, kBlockN);
    } else {
      blocks = keys.key_blocks(tile.m_block * kBlockM, kBlockM, params.seqlen_q, kBlockN);
    }
    tile.n_block_min = blocks.first;
    tile.n_block_max = blocks.last;
    return tile;
  }

  // kUnits: the units (a query tile, or a causal pair of one sequence's tiles p and m - 1 - p) of
  // the sequences that exist, in order (sequence, head, p), dealt round-robin as above: no position
  // is empty but a pair's missing second tile, whatever the lengths. The position is (sequence b,
  // unit u of it), u counted from the sequence's first unit, and found from the CTA's previous
  // tile's, which only moves forward: a CTA reads each sequence's lengths once on the way.
  CUTE_HOST_DEVICE WorkTile at_varlen(unsigned u, unsigned j, int b) const {
    WorkTile tile;
    tile.j = j;
    tile.valid = false;
    VarlenRows seq{};
    unsigned m = 0, unit_m_b = 0;  // the sequence's query tiles and units per head
    for (;; ++b) {
      if (b >= params.batch) {  // past the last unit: done()
        tile.u = u, tile.batch = params.batch;
        tile.m_block = tile.head = tile.n_block_min = tile.n_block_max = 0;
        return tile;
      }
      seq = rows(b);
      m = unsigned(cute::ceil_div(seq.seqlen_q, kBlockM));
      unit_m_b = walk.pair_tiles ? (m + 1) / 2 : m;
      const unsigned units = unit_m_b * unsigned(params.nheads);
      if (u < units) break;
      u -= units;
    }
    const unsigned head = u / unit_m_b, p = u - head * unit_m_b;
    tile.u = u, tile.batch = b, tile.head = int(head);
    if (walk.pair_tiles) {
      tile.m_block = int(j == 0 ? m - 1 - p : p);
      tile.valid = j == 0 || p != m - 1 - p;
    } else {
      tile.m_block = int(p);
      tile.valid = true;
    }
    tile.q_start = seq.q_start, tile.k_start = seq.k_start, tile.seqlen_q = seq.seqlen_q, tile.seqlen_k = seq.seqlen_k;
    const KeyMask::Blocks blocks = sequence_keys(seq).key_blocks(tile.m_block * kBlockM, kBlockM, seq.seqlen_q, kBlockN);
    tile.n_block_min = blocks.first;
    tile.n_block_max = blocks.last;
    return tile;
  }

  // Varlen: sequence b's rows and lengths, capped at the call's maxima (which size the walk). KV
  // cache: entry b's queries and its keys (cache_keys), from row 0 of its batch entry.
  CUTE_HOST_DEVICE VarlenRows rows(int b) const {
    if constexpr (kMode == FwdMode::kKvcache) return VarlenRows{0, 0, params.seqlen_q, cache_keys(params, b)};
    VarlenRows r = varlen_rows(params.cu_seqlens_q, params.cu_seqlens_k, params.total_q, params.total_k, b);
    r.seqlen_q = cute::min(r.seqlen_q, params.seqlen_q);
    r.seqlen_k = cute::min(r.seqlen_k, params.seqlen_k);
    return r;
  }
  // The keys a varlen sequence's rows see: the call's window, the sequence's lengths.
  CUTE_HOST_DEVICE KeyMask sequence_keys(const VarlenRows& seq) const {
    return KeyMask{seq.seqlen_k, seq.seqlen_k - seq.seqlen_q, keys.window_left, keys.window_right};
  }
};

// The walk without a tail: every unit round-robin on `ctas` CTAs.
inline TileSchedule make_tile_schedule(bool pair_tiles, unsigned m_blocks, unsigned heads_batch, unsigned ctas) {
  TileSchedule s;
  s.pair_tiles = pair_tiles;
  s.m_blocks = m_blocks;
  s.heads_batch = heads_batch;
  s.ctas = ctas;
  s.unit_m = pair_tiles ? (m_blocks + 1) / 2 : m_blocks;
  s.num_units = s.unit_m * heads_batch;
  s.tail_begin = s.num_units;
  s.end = s.num_units;
  s.div_ctas = FastDivmod(int(ctas > 0 ? ctas : 1));
  s.div_unit_m = FastDivmod(int(s.unit_m > 0 ? s.unit_m : 1));
  return s;
}

// The same walk with the tail from unit tail_begin (pair_tiles; a multiple of ctas below the
// unit count).
inline TileSchedule with_tail(TileSchedule s, unsigned tail_begin) {
  s.tail_begin = tail_begin;
  s.tail_b0 = tail_begin / s.unit_m;
  s.tail_p0 = tail_begin - s.tail_b0 * s.unit_m;
  s.tail_full = s.heads_batch - s.tail_b0 - 1;
  s.tail_tiles = s.m_blocks * (s.heads_batch - s.tail_b0) - 2 * s.tail_p0;
  s.end = tail_begin + (s.tail_tiles + s.ctas - 1) / s.ctas * s.ctas;
  s.div_full = FastDivmod(int(s.tail_full > 0 ? s.tail_full : 1));
  s.div_full1 = FastDivmod(int(s.tail_full + 1));
  return s;
}

// The schedule of one launch on `ctas` CTAs. cost(m_block): what a query tile costs, in any unit
// (the launch uses its key blocks plus one for the tile's fixed cost). Without pair_tiles, with
// fewer than kMinTiles query tiles per (batch, head), or where the units fill more than kMaxRounds
// rounds (a ragged last round then costs under 2%), there is no tail. Otherwise the host
// simulates the deal for tails of the last ragged round plus 0, 1 or 2 whole rounds and keeps the
// one that ends soonest, or none if none ends sooner than without. The rounds before the tail are
// counted at the mean unit cost: with their rotation, about equal loads on every CTA.
template <class Cost>
TileSchedule plan_tile_schedule(bool pair_tiles, unsigned m_blocks, unsigned heads_batch, unsigned ctas,
                                Cost&& cost) {
  const TileSchedule none = make_tile_schedule(pair_tiles, m_blocks, heads_batch, ctas);
  const unsigned num_units = none.num_units;
  constexpr unsigned kMaxRounds = 64;
  // Short causal calls keep the pairs: at 8 query tiles per (batch, head) (1k at 128 rows) the
  // tail measured -0.3..-1.7% where the model promised gains, at 16 and more +1-6% (causal 2k-8k).
  constexpr unsigned kMinTiles = 16;
  if (!pair_tiles || ctas == 0 || num_units == 0 || num_units > kMaxRounds * ctas || m_blocks < kMinTiles)
    return none;
  std::vector<double> tile_cost(m_blocks);
  double head_cost = 0;  // one (batch, head): all its query tiles
  for (unsigned x = 0; x < m_blocks; ++x) head_cost += tile_cost[x] = cost(int(x));
  const double unit_cost = head_cost / none.unit_m;
  const unsigned rounds = num_units / ctas;
  double best = double((num_units + ctas - 1) / ctas) * unit_cost;  // no tail
  TileSchedule chosen = none;
  std::vector<double> load(ctas);
  for (unsigned extra = 0; extra <= 2 && extra <= rounds; ++extra) {
    const unsigned tail_begin = (rounds - extra) * ctas;
    if (tail_begin >= num_units) continue;
    const TileSchedule s = with_tail(none, tail_begin);
    // The deal, in the order of TileSchedule::tail_tile: x from the last query tile down, as many
    // tiles of each as the tail's (batch, head) pairs have.
    std::fill(load.begin(), load.end(), 0.0);
    unsigned slot = 0, round = 0;
    for (unsigned x = m_blocks; x-- > 0;) {
      const unsigned count = s.tail_full + (x >= s.tail_p0 && x <= m_blocks - 1 - s.tail_p0 ? 1 : 0);
      for (unsigned n = 0; n < count; ++n) {
        load[(round & 1) ? ctas - 1 - slot : slot] += tile_cost[x];
        if (++slot == ctas) slot = 0, ++round;
      }
    }
    const double span = double(rounds - extra) * unit_cost + *std::max_element(load.begin(), load.end());
    if (span < best * 0.999) best = span, chosen = s;  // a tie keeps fewer heads in flight (L2)
  }
  return chosen;
}

// The backward's view of one batch entry: its lengths, where its rows start in the arrays, and
// where they start in the workspace (D, lse and the dQ accumulator, `padded_rows` a head:
// bwd_padded_rows, or bwd_varlen_padded_rows for a varlen batch). A varlen entry's lengths come
// from cu_seqlens (clamped: common/seqlen.hpp), capped at the call's maxima, which size the grids;
// its workspace rows start at (q_start + 128 batch) rounded down to 128, so that no two entries'
// 128-row blocks share a row when cu_seqlens ascend (and none leaves the workspace when not).
struct BwdBatch {
  int seqlen_q, seqlen_k;
  int q_start = 0, k_start = 0;  // varlen: the entry's first row of q, dout, dq and of k, v
  int tma_batch;                 // the batch coordinate of the TMA tensors (varlen: 0, one batch)
  int64_t rows;                  // workspace row of query row 0, head 0; head h adds h * padded_rows

  CUTE_HOST_DEVICE BwdBatch(const BwdParams& p, int batch, int64_t padded_rows)
      : seqlen_q(p.seqlen_q), seqlen_k(p.seqlen_k), tma_batch(batch) {
    if (p.cu_seqlens_q == nullptr) {
      rows = int64_t(batch) * p.nheads * padded_rows;
      return;
    }
    const FwdSeqlen s(p, batch);
    seqlen_q = cute::min(s.seqlen_q, p.seqlen_q);
    seqlen_k = cute::min(s.seqlen_k, p.seqlen_k);
    q_start = s.q_start;
    k_start = s.k_start;
    tma_batch = 0;
    rows = (int64_t(q_start) + 128 * int64_t(batch)) / 128 * 128;
  }
  CUTE_HOST_DEVICE KeyMask mask(const BwdParams& p) const {
    return KeyMask{seqlen_k, seqlen_k - seqlen_q, p.window_left, p.window_right};
  }
};

// Which 64-row blocks a launch of the preprocess covers: its block x is block x below `pre`,
// block next + x - pre from there (BwdPreBlocks::all(): every block, x itself).
struct BwdPreBlocks {
  int pre, next;
  static constexpr BwdPreBlocks all() { return {1 << 30, 0}; }
  CUTE_HOST_DEVICE int block(int x) const { return x < pre ? x : next + (x - pre); }
};

// The preprocess's 64-row blocks (`blocks` of them, the padded rows) of a batch entry of seqlen_q
// query rows under `mask` that must run the exact D (common/dsum.hpp), those with a row that sees
// at most exact_keys keys: [0, pre) and [post, blocks). A row's visible key count rises, stays,
// then falls along the rows, so such blocks are a leading and a trailing run of the real ones, and
// a block's fewest keys are at its first or last row. Padding blocks join the trailing run, if
// any. partial_keys: no row takes the exact D. The host splits a fixed-length call's launches by
// it; a varlen batch's kernels compute it per entry.
struct BwdExactBlocks {
  int pre, post;
};
CUTE_HOST_DEVICE BwdExactBlocks bwd_exact_blocks(int seqlen_q, const KeyMask& mask, bool partial_keys, int blocks,
                                                 int exact_keys) {
  if (partial_keys) return {0, blocks};
  auto keys = [&](int r) { return cute::max(0, mask.key_end(r) - cute::max(0, mask.key_begin(r))); };
  auto exact = [&](int b) {
    const int first = b * 64, last = cute::min(first + 63, seqlen_q - 1);
    return cute::min(keys(first), keys(last)) <= exact_keys;
  };
  const int real = cute::min(blocks, (seqlen_q + 63) / 64);
  int pre = 0, post = real;
  while (pre < real && exact(pre)) ++pre;
  while (post > pre && exact(post - 1)) --post;
  return {pre, post == real ? blocks : post};
}
inline BwdExactBlocks bwd_exact_blocks(const BwdParams& p, int blocks, int exact_keys) {
  const KeyMask mask{p.seqlen_k, p.seqlen_k - p.seqlen_q, p.window_left, p.window_right};
  return bwd_exact_blocks(p.seqlen_q, mask, p.partial_keys, blocks, exact_keys);
}

// Whether every entry of a varlen batch has few exact-D blocks (at most one leading and two
// trailing), so that bwd_preprocess_exact_kernel may run an (entry, head) pair's in one CTA. The
// host can prove it only for self-attention: one cu_seqlens array for queries and keys, equal
// totals and maxima (each entry's query and key lengths are then equal), and no window that sees
// at most exact_keys keys. Then a row sees few keys only where its window rises from key 0 (the
// first 64 rows) or falls to the entry's last key (the last 64 rows). Otherwise an entry with
// many more queries than keys, or a narrow window, could put every block of a long entry on one CTA.
inline bool bwd_varlen_few_exact_blocks(const BwdParams& p, int exact_keys) {
  const bool narrow_window =
      p.window_left >= 0 && p.window_right >= 0 && int64_t(p.window_left) + p.window_right + 1 <= exact_keys;
  return p.cu_seqlens_q != nullptr && p.cu_seqlens_q == p.cu_seqlens_k && p.total_q == p.total_k &&
         p.seqlen_q == p.seqlen_k && !narrow_window;
}

// The backward: one CTA per (key block, KV head, batch) walks the query blocks [m_first, m_last)
// whose rows see its keys (the mask's band: KeyMask::query_begin/query_end), for each query head
// of the group. A key block past the entry's keys (varlen) has none. A rotated walk (bwd_tile's
// `rotate`, without a mask only) starts key block n of the entry's N at query block n * M / N of
// the M and wraps, so that the blocks reach a query block at different steps: a deterministic dQ
// add then waits for one made a step or more earlier, not for the one the block before it makes
// at the same step (which delays block n by n adds at its first step: perf-notes, b28).
struct BwdTile {
  int n_block, head_k, batch;
  int m_first, m_last;
  BwdBatch seq;
  int m_shift = 0;   // rotated: the walk starts n_block * M / N query blocks after m_first
  int n_blocks = 0;  // rotated: N, the entry's key blocks; 0: not rotated
  CUTE_HOST_DEVICE int steps() const { return m_last - m_first; }
  // Whether the entry has keys in this block (varlen: not past its keys).
  CUTE_HOST_DEVICE bool has_keys(int block_n) const { return n_block * block_n < seq.seqlen_k; }
  // The query block of the walk's step m_step, counted from m_first (the block an unrotated walk
  // visits then). kRotatable: the config walks rotated where asked (BwdConfig::rotate); if not,
  // the compiler sees that the walk is unrotated.
  template <bool kRotatable>
  CUTE_HOST_DEVICE int m_at(int m_step) const {
    if constexpr (kRotatable) {
      const int m = m_step + m_shift;
      return m < m_last ? m : m - steps();
    } else {
      return m_step;
    }
  }
};

// Where key block n of N starts a rotated walk over M query blocks (relative to m_first).
CUTE_HOST_DEVICE int bwd_rotated_start(int M, int N, int n) { return int(int64_t(n) * M / N); }

template <int kBlockM, int kBlockN>
CUTE_HOST_DEVICE BwdTile bwd_tile(const BwdParams& p, int n_block, int head_k, int batch, int64_t padded_rows,
                                  bool rotate = false) {
  BwdTile t{n_block, head_k, batch, 0, 0, BwdBatch(p, batch, padded_rows)};
  const KeyMask keys = t.seq.mask(p);
  const int key_lo = n_block * kBlockN;
  if (key_lo >= t.seq.seqlen_k) return t;
  const int key_hi = cute::min(key_lo + kBlockN, t.seq.seqlen_k) - 1;  // the block's last key
  const int q_lo = keys.query_begin(key_lo);
  const int q_hi = keys.query_end(key_hi, t.seq.seqlen_q);
  if (q_hi > q_lo) t.m_first = q_lo / kBlockM, t.m_last = (q_hi + kBlockM - 1) / kBlockM;
  // (the unrotated tile computed as before: another form of this changed the d 128 kernel's code)
  if (rotate && p.window_left < 0 && p.window_right < 0 && q_hi > q_lo) {  // every block walks all M
    t.n_blocks = (t.seq.seqlen_k + kBlockN - 1) / kBlockN;
    t.m_shift = bwd_rotated_start(t.steps(), t.n_blocks, n_block);
  }
  return t;
}

// The key block of the CTA at blockIdx.x in a grid of `blocks`. A deterministic call's CTAs wait
// for the key blocks before them in bwd_dq_turn's order, so they are launched in that order: key
// block 0 first, or with a right bound the last first. A CTA then only waits for CTAs launched
// before it, which run or have run: otherwise, when a (batch, KV head)'s key blocks outnumber the
// CTAs the GPU holds at once, the resident ones could all wait for one that is not and hang.
// Rotated walks wait in both directions, so the host takes them only where an entry's key blocks
// fit on half the GPU's SMs at once (launch_bwd_with).
CUTE_HOST_DEVICE int bwd_n_block(const BwdParams& p, int block, int blocks) {
  return p.deterministic && p.window_right >= 0 ? blocks - 1 - block : block;
}

// A rotated walk's dQ turn at query block m (relative to m_first) of key block n of N over M:
// the blocks that start fewer steps before m reach it first, and blocks that start at the same
// query block (N > M) go in key order.
CUTE_HOST_DEVICE int bwd_rotated_turn(int M, int N, int n, int m) {
  // how many of the N blocks start at query block x or before: those with n' * M < (x + 1) * N
  auto starts_upto = [&](int x) { return int(cute::min(int64_t(N), ((int64_t(x) + 1) * N + M - 1) / M)); };
  const int s = bwd_rotated_start(M, N, n);
  const int d = m >= s ? m - s : m - s + M;  // n reaches m at its step d
  const int a = m - d + 1;                    // those starting in [a, m], cyclically, reach it sooner
  const int sooner = a >= 0 ? starts_upto(m) - starts_upto(a - 1) : starts_upto(m) + N - starts_upto(a + M - 1);
  return sooner + n - starts_upto(s - 1);
}

// Deterministic dQ: the key blocks that add into query block m take turns, and this is key block
// tile.n_block's (0 for the first). They are KeyMask::key_blocks(m), the blocks whose bwd_tile holds m
// (the host tests check that the two agree), in the order they reach m: with a right bound
// (causal, windows) a later key block starts at a later query block and reaches m in fewer steps,
// so the last goes first; without one every block starts at query block 0, first goes first,
// unless the walks are rotated (bwd_rotated_turn).
template <int kBlockM, int kBlockN>
CUTE_HOST_DEVICE int bwd_dq_turn(const KeyMask& keys, const BwdTile& tile, int m) {
  if (tile.n_blocks > 0) return bwd_rotated_turn(tile.steps(), tile.n_blocks, tile.n_block, m - tile.m_first);
  const KeyMask::Blocks kb = keys.key_blocks(m * kBlockM, kBlockM, tile.seq.seqlen_q, kBlockN);
  return keys.window_right >= 0 ? kb.last - 1 - tile.n_block : tile.n_block - kb.first;
}

}  // namespace flashcute::sm90
