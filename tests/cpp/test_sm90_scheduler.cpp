// Host-only tests of the sm90 tile scheduler: FastDivmod, every tile once, and the causal tail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "flashcute/common/mask.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/sm90/config.hpp"
#include "flashcute/sm90/scheduler.hpp"

namespace {

// ----------------------------------------------------------------------- sm90 tile scheduler

// The kernels divide with cutlass::FastDivmod, exact for dividends below 2^31: the ranges the
// scheduler's counts stay in (sm90_can_run).
TEST(Sm90Scheduler, FastDivmodIsExactBelow2To31) {
  using flashcute::sm90::FastDivmod;
  std::vector<int> ns;
  for (int n = 0; n < 4096; ++n) ns.push_back(n);
  uint64_t x = 88172645463325252ull;  // xorshift: dividends up to 2^31 - 1
  for (int i = 0; i < 4096; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ns.push_back(int(x % (1ull << 31)));
  }
  ns.push_back(int((1u << 31) - 1));
  for (int d : {1, 2, 3, 5, 7, 31, 64, 100, 127, 131, 132, 133, 255, 1000, 65537, 1 << 20, int((1u << 31) - 1)}) {
    const FastDivmod div(d);
    for (int n : ns) {
      int q, r;
      div(q, r, n);
      ASSERT_EQ(q, n / d) << n << " / " << d;
      ASSERT_EQ(r, n % d) << n << " % " << d;
    }
  }
}

using flashcute::sm90::TileSchedule;

namespace sched {

// Query tile x of a causal square problem: its key blocks, plus one, as launch_fwd_with counts.
double causal_cost(int x, int block_m, int block_n, int seqlen) {
  const flashcute::KeyMask causal{seqlen, 0, -1, 0};
  const flashcute::KeyMask::Blocks blocks = causal.key_blocks(x * block_m, block_m, seqlen, block_n);
  return double(blocks.last - blocks.first + 1);
}

// Walks every CTA with the kernel's own walker (TileScheduler, 64-row tiles, no mask); checks that
// each tile comes exactly once, with its (batch, head) and key blocks decoded, and returns the
// largest CTA's load.
template <class Cost>
double walk_all(const TileSchedule& s, Cost&& cost) {
  constexpr int kBlock = 64;
  flashcute::FwdParams p;
  p.seqlen_q = p.seqlen_k = int(s.m_blocks) * kBlock - 5;  // a ragged last tile
  p.nheads = s.heads_batch % 4 == 0 ? 4 : int(s.heads_batch);
  p.batch = int(s.heads_batch) / p.nheads;
  const flashcute::KeyMask keys{p.seqlen_k, 0, -1, -1};
  const flashcute::sm90::FastDivmod div_heads(p.nheads);
  std::vector<int> seen(size_t(s.m_blocks) * s.heads_batch, 0);
  double worst = 0;
  for (unsigned cta = 0; cta < s.ctas; ++cta) {
    const flashcute::sm90::TileScheduler<kBlock, kBlock> walk(s, p, div_heads, keys, cta, s.ctas);
    double load = 0;
    for (flashcute::sm90::WorkTile t = walk.first(); !walk.done(t); t = walk.next(t)) {
      EXPECT_TRUE(t.valid);
      EXPECT_LT(t.batch, p.batch);
      EXPECT_LT(t.head, p.nheads);
      EXPECT_GE(t.m_block, 0);
      EXPECT_LT(t.m_block, int(s.m_blocks));
      EXPECT_EQ(t.n_block_min, 0);
      EXPECT_EQ(t.n_block_max, int(s.m_blocks));
      if (t.batch >= p.batch || t.head >= p.nheads || t.m_block < 0 || t.m_block >= int(s.m_blocks)) return -1;
      ++seen[(size_t(t.batch) * p.nheads + t.head) * s.m_blocks + t.m_block];
      load += cost(t.m_block);
    }
    worst = std::max(worst, load);
  }
  for (size_t i = 0; i < seen.size(); ++i)
    EXPECT_EQ(seen[i], 1) << "tile " << i % s.m_blocks << " of (batch, head) " << i / s.m_blocks;
  return worst;
}

}  // namespace sched

TEST(Sm90Scheduler, EveryTileOnceWithAndWithoutATail) {
  using flashcute::sm90::make_tile_schedule;
  using flashcute::sm90::with_tail;
  auto unit = [](int) { return 1.0; };
  // (m_blocks, heads x batch, CTAs): odd and even tile counts, fewer units than CTAs, ragged rounds.
  const unsigned cases[][3] = {{8, 512, 132}, {16, 256, 132}, {43, 64, 132}, {7, 3, 132}, {1, 5, 4},
                               {2, 1, 132}, {9, 37, 10},   {13, 11, 7},   {5, 100, 16}, {86, 32, 132}};
  for (const auto& c : cases) {
    for (bool pair : {false, true}) {
      const TileSchedule none = make_tile_schedule(pair, c[0], c[1], c[2]);
      SCOPED_TRACE(::testing::Message() << "m_blocks " << c[0] << ", heads x batch " << c[1] << ", ctas " << c[2]
                                        << (pair ? ", pairs" : ""));
      sched::walk_all(none, unit);
      if (!pair) continue;
      const unsigned rounds = none.num_units / c[2];
      for (unsigned extra = 0; extra <= rounds && extra <= 3; ++extra) {
        const unsigned begin = (rounds - extra) * c[2];
        if (begin >= none.num_units) continue;
        SCOPED_TRACE(::testing::Message() << "tail from unit " << begin);
        const TileSchedule s = with_tail(none, begin);
        EXPECT_GT(s.tail_tiles, 0u);
        sched::walk_all(s, unit);
      }
    }
  }
}

// The varlen walk (TileScheduler<..., FwdMode::kVarlenMixed>::at_varlen): for random, empty, one-row, ragged
// and garbage (descending, out of range) cu_seqlens, every CTA's walk together gives each query
// tile of each (sequence, head) exactly once, as the sequence's lengths (clamped, capped at the
// maxima) have them, with the key blocks of the sequence's mask, and nothing else.
TEST(Sm90Scheduler, VarlenWalkGivesEveryTileOnce) {
  constexpr int kBlockM = 128, kBlockN = 80;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto rnd = [&](int n) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return int(x % uint64_t(n));
  };
  for (int trial = 0; trial < 60; ++trial) {
    const int batch = 1 + rnd(40), nheads = 1 + rnd(5);
    std::vector<int> cu_q{0}, cu_k{0};
    for (int b = 0; b < batch; ++b) {
      const int pick = rnd(4);
      cu_q.push_back(cu_q.back() + (pick == 0 ? 0 : pick == 1 ? 1 : rnd(2000)));
      cu_k.push_back(cu_k.back() + (rnd(5) == 0 ? 0 : rnd(2000)));
    }
    if (trial % 10 == 9) {  // garbage: descending and out-of-range entries
      cu_q[1 + rnd(batch)] = -7;
      cu_k[rnd(batch + 1)] = 1 << 30;
      cu_q[rnd(batch + 1)] = cu_q.back() + 500;
    }
    flashcute::FwdParams p;
    p.batch = batch, p.nheads = p.nheads_k = nheads;
    p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data();
    p.total_q = std::max(1, cu_q.back()), p.total_k = std::max(1, cu_k.back());
    p.seqlen_q = 1 + rnd(2000), p.seqlen_k = 1 + rnd(2000);  // maxima below some lengths: capped
    const bool causal = trial % 2 == 0;
    p.window_left = causal ? -1 : (trial % 3 == 0 ? 100 : -1);
    p.window_right = causal ? 0 : (trial % 3 == 0 ? 7 : -1);
    const flashcute::KeyMask keys{p.seqlen_k, p.seqlen_k - p.seqlen_q, p.window_left, p.window_right};
    const unsigned m_blocks = unsigned((p.seqlen_q + kBlockM - 1) / kBlockM);
    const unsigned ctas = 1 + unsigned(rnd(20));
    const TileSchedule s = flashcute::sm90::make_tile_schedule(causal, m_blocks, unsigned(batch * nheads), ctas);
    const flashcute::sm90::FastDivmod div_heads(nheads);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ", batch " << batch << ", ctas " << ctas);
    std::vector<int> seen(size_t(batch) * nheads * m_blocks, 0);
    for (unsigned cta = 0; cta < ctas; ++cta) {
      const flashcute::sm90::TileScheduler<kBlockM, kBlockN, flashcute::sm90::FwdMode::kVarlenMixed> walk(s, p, div_heads, keys, cta, ctas);
      int steps = 0;
      for (flashcute::sm90::WorkTile t = walk.first(); !walk.done(t); t = walk.next(t)) {
        ASSERT_LT(++steps, 1 << 20) << "the walk does not end";
        ASSERT_TRUE(t.valid);
        ASSERT_GE(t.batch, 0);
        ASSERT_LT(t.batch, batch);
        ASSERT_LT(t.head, nheads);
        const flashcute::VarlenRows seq = walk.rows(t.batch);
        EXPECT_EQ(t.q_start, seq.q_start);
        EXPECT_EQ(t.k_start, seq.k_start);
        EXPECT_EQ(t.seqlen_q, seq.seqlen_q);
        EXPECT_EQ(t.seqlen_k, seq.seqlen_k);
        EXPECT_LE(seq.seqlen_q, p.seqlen_q);
        EXPECT_LE(seq.q_start + seq.seqlen_q, p.total_q);
        ASSERT_GE(t.m_block, 0);
        ASSERT_LT(t.m_block * kBlockM, seq.seqlen_q);
        const flashcute::KeyMask sk{seq.seqlen_k, seq.seqlen_k - seq.seqlen_q, p.window_left, p.window_right};
        const flashcute::KeyMask::Blocks kb = sk.key_blocks(t.m_block * kBlockM, kBlockM, seq.seqlen_q, kBlockN);
        EXPECT_EQ(t.n_block_min, kb.first);
        EXPECT_EQ(t.n_block_max, kb.last);
        ++seen[(size_t(t.batch) * nheads + t.head) * m_blocks + t.m_block];
      }
    }
    flashcute::sm90::TileScheduler<kBlockM, kBlockN, flashcute::sm90::FwdMode::kVarlenMixed> any(s, p, div_heads, keys, 0, ctas);
    for (int b = 0; b < batch; ++b) {
      const int m = (any.rows(b).seqlen_q + kBlockM - 1) / kBlockM;
      for (int h = 0; h < nheads; ++h)
        for (int i = 0; i < int(m_blocks); ++i)
          EXPECT_EQ(seen[(size_t(b) * nheads + h) * m_blocks + i], i < m ? 1 : 0)
              << "sequence " << b << ", head " << h << ", query tile " << i;
    }
  }
}


TEST(Sm90Scheduler, TheTailEvensOutCausalRounds) {
  using flashcute::sm90::make_tile_schedule;
  using flashcute::sm90::plan_tile_schedule;
  constexpr unsigned kSms = 132;
  // FlashAttention's grid (16k tokens, 2048 hidden), causal: 2048 units of equal cost on 132 SMs
  // are 15.5 rounds, so without a tail every CTA waits for a 16th (3% more than the mean).
  struct Grid {
    int seqlen, head_dim, block_m, block_n;
  };
  for (const Grid& c : {Grid{2048, 64, 128, 128}, Grid{4096, 64, 128, 128}, Grid{8192, 64, 192, 128},
                        Grid{2048, 128, 128, 128}, Grid{4096, 128, 128, 128}, Grid{2048, 256, 128, 80},
                        Grid{8192, 256, 128, 80}}) {
    SCOPED_TRACE(::testing::Message() << "seqlen " << c.seqlen << ", d " << c.head_dim);
    const unsigned m_blocks = unsigned((c.seqlen + c.block_m - 1) / c.block_m);
    const unsigned heads_batch = unsigned((16384 / c.seqlen) * (2048 / c.head_dim));
    auto cost = [&](int x) { return sched::causal_cost(x, c.block_m, c.block_n, c.seqlen); };
    const TileSchedule none = make_tile_schedule(true, m_blocks, heads_batch, kSms);
    const TileSchedule plan = plan_tile_schedule(true, m_blocks, heads_batch, kSms, cost);
    double total = 0;
    for (unsigned x = 0; x < m_blocks; ++x) total += cost(int(x));
    const double mean = total * heads_batch / kSms;
    const double before = sched::walk_all(none, cost), after = sched::walk_all(plan, cost);
    EXPECT_GT(plan.tail_tiles, 0u);
    EXPECT_LT(after, before * 0.985) << "before " << before << ", after " << after << ", mean " << mean;
    EXPECT_LT(after, mean * 1.025) << "after " << after << ", mean " << mean;
    std::printf("seqlen %5d d %3d: the largest CTA %.3f x the mean, %.3f x without the tail\n", c.seqlen,
                c.head_dim, after / mean, after / before);
  }
  // Without a mask, where the units fill many rounds, or at fewer than 16 query tiles per (batch,
  // head) (1k at 128 rows: measured 0.3-1.7% slower with a tail), there is no tail.
  auto flat = [](int) { return 9.0; };
  EXPECT_EQ(plan_tile_schedule(false, 16, 512, kSms, flat).tail_tiles, 0u);
  EXPECT_EQ(plan_tile_schedule(true, 16, 256 * 32, kSms, flat).tail_tiles, 0u);
  EXPECT_EQ(plan_tile_schedule(true, 8, 512, kSms, flat).tail_tiles, 0u);
  // A whole number of rounds needs none either.
  EXPECT_EQ(plan_tile_schedule(true, 16, 66, kSms, [](int x) { return double(x + 2); }).tail_tiles, 0u);
}

// A small linear congruential generator: next(n) is in [0, n).
struct Lcg {
  uint32_t state;
  int operator()(int n) {
    state = state * 1664525u + 1013904223u;
    return int((state >> 8) % uint32_t(n));
  }
};

}  // namespace

// The backward: key block n visits query block m (bwd_tile) exactly when n is one of m's key
// blocks (KeyMask::key_blocks), and its dQ turn there counts the blocks before it (in the turn
// order: descending with a right bound) that visit m, so the deterministic mode's turns are
// 0, 1, 2, ... with no gap (a gap would hang the kernel), and the blocks are launched in that
// order (a block waiting for one launched after it could hang the kernel too).
template <int kM, int kN>
void check_backward_tiles_and_dq_turns() {
  Lcg next{12345u};
  for (int trial = 0; trial < 400; ++trial) {
    flashcute::BwdParams p;
    p.seqlen_q = 1 + next(700), p.seqlen_k = 1 + next(700);
    const int kind = next(4);  // none, causal, window, left-only window
    p.window_left = kind >= 2 ? next(300) : -1;
    p.window_right = kind == 1 ? 0 : kind == 2 ? next(300) : -1;
    const flashcute::KeyMask keys{p.seqlen_k, p.seqlen_k - p.seqlen_q, p.window_left, p.window_right};
    const int n_blocks = (p.seqlen_k + kN - 1) / kN, m_blocks = (p.seqlen_q + kM - 1) / kM;
    const bool descending = p.window_right >= 0;
    for (int m = 0; m < m_blocks; ++m) {
      int turn = 0, last_launched = -1;
      const auto kb = keys.key_blocks(m * kM, kM, p.seqlen_q, kN);
      for (int i = 0; i < n_blocks; ++i) {
        const int n = descending ? n_blocks - 1 - i : i;
        const auto t = flashcute::sm90::bwd_tile<kM, kN>(p, n, 0, 0, flashcute::sm90::bwd_padded_rows(p.seqlen_q));
        const bool visits = m >= t.m_first && m < t.m_last;
        ASSERT_EQ(visits, n >= kb.first && n < kb.last)
            << "sq " << p.seqlen_q << " sk " << p.seqlen_k << " window " << p.window_left << "," << p.window_right
            << " m " << m << " n " << n;
        if (visits) {
          EXPECT_EQ((flashcute::sm90::bwd_dq_turn<kM, kN>(keys, t, m)), turn++);
          // Deterministic calls launch the key blocks in turn order (bwd_n_block): a CTA waits
          // only for CTAs launched before it.
          p.deterministic = true;
          const int launched = flashcute::sm90::bwd_n_block(p, n, n_blocks);  // the CTA's blockIdx.x
          EXPECT_EQ(flashcute::sm90::bwd_n_block(p, launched, n_blocks), n);
          EXPECT_GT(launched, last_launched) << "m " << m << " n " << n;
          last_launched = launched;
          p.deterministic = false;
        }
      }
    }
  }
}

// Rotated walks (deterministic calls without a mask): each key block visits each of its query
// blocks once, and its dQ turn at query block m is its rank among the blocks that visit m, ordered
// by the step at which they reach it (then by key block): turns 0, 1, 2, ... with no gap, and each
// block waits only for adds made at an earlier step or, between blocks that reach m at the same
// step, by a lower key block. Masked calls ignore `rotate`.
template <int kM, int kN>
void check_rotated_dq_turns() {
  Lcg next{4321u};
  for (int trial = 0; trial < 300; ++trial) {
    flashcute::BwdParams p;
    p.seqlen_q = 1 + next(trial < 150 ? 700 : 5000), p.seqlen_k = 1 + next(trial < 150 ? 700 : 5000);
    p.deterministic = true;
    const flashcute::KeyMask keys{p.seqlen_k, p.seqlen_k - p.seqlen_q, -1, -1};
    const int n_blocks = (p.seqlen_k + kN - 1) / kN, m_blocks = (p.seqlen_q + kM - 1) / kM;
    std::vector<std::vector<std::pair<int, int>>> visits(m_blocks);  // per m: (step, n)
    for (int n = 0; n < n_blocks; ++n) {
      const auto t = flashcute::sm90::bwd_tile<kM, kN>(p, n, 0, 0, flashcute::sm90::bwd_padded_rows(p.seqlen_q), true);
      ASSERT_EQ(t.m_first, 0);
      ASSERT_EQ(t.m_last, m_blocks);
      ASSERT_EQ(t.n_blocks, n_blocks);
      std::vector<int> seen(m_blocks, 0);
      for (int i = 0; i < t.steps(); ++i) {
        const int m = t.template m_at<true>(t.m_first + i);
        ASSERT_TRUE(m >= 0 && m < m_blocks) << "n " << n << " step " << i;
        ++seen[m];
        visits[m].emplace_back(i, n);
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), m_blocks) << "n " << n;
    }
    for (int m = 0; m < m_blocks; ++m) {
      std::sort(visits[m].begin(), visits[m].end());
      for (int rank = 0; rank < int(visits[m].size()); ++rank) {
        const int n = visits[m][rank].second;
        const auto t = flashcute::sm90::bwd_tile<kM, kN>(p, n, 0, 0, flashcute::sm90::bwd_padded_rows(p.seqlen_q), true);
        EXPECT_EQ((flashcute::sm90::bwd_dq_turn<kM, kN>(keys, t, m)), rank)
            << "sq " << p.seqlen_q << " sk " << p.seqlen_k << " m " << m << " n " << n;
      }
    }
    // With a mask the walk is not rotated.
    p.window_right = 0;
    const auto t = flashcute::sm90::bwd_tile<kM, kN>(p, n_blocks - 1, 0, 0, flashcute::sm90::bwd_padded_rows(p.seqlen_q), true);
    EXPECT_EQ(t.n_blocks, 0);
    EXPECT_EQ(t.m_shift, 0);
  }
}

TEST(Sm90Scheduler, BackwardRotatedDqTurns) {
  check_rotated_dq_turns<64, 128>();
  check_rotated_dq_turns<128, 128>();
  check_rotated_dq_turns<64, 96>();  // d 192
  check_rotated_dq_turns<64, 64>();  // d 256
}

TEST(Sm90Scheduler, BackwardTilesAndDqTurnsAgree) {
  check_backward_tiles_and_dq_turns<64, 128>();   // the tile table's d 128
  check_backward_tiles_and_dq_turns<128, 128>();  // d 64
}

// A varlen batch's workspace rows (BwdBatch): each sequence's 128-row blocks lie inside the
// workspace's run of bwd_varlen_padded_rows and, when cu_seqlens ascend, share no row with another
// sequence's; with any other cu_seqlens (clamped) they still stay inside. Lengths are capped at
// the call's maxima.
TEST(Sm90Scheduler, BackwardVarlenRowsAreDisjointAndInside) {
  Lcg next{777u};
  for (int trial = 0; trial < 300; ++trial) {
    const int batch = 1 + next(20);
    const bool garbage = trial % 3 == 2;
    std::vector<int> cu_q(batch + 1), cu_k(batch + 1);
    for (int b = 1; b <= batch; ++b) {
      cu_q[b] = garbage ? next(3000) - 500 : cu_q[b - 1] + (next(4) == 0 ? 0 : next(700));
      cu_k[b] = garbage ? next(3000) - 500 : cu_k[b - 1] + next(700);
    }
    flashcute::BwdParams p;
    p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data();
    p.total_q = garbage ? 1 + next(2000) : cu_q[batch], p.total_k = garbage ? 1 + next(2000) : cu_k[batch];
    p.batch = batch, p.nheads = 3, p.nheads_k = 1;
    p.seqlen_q = 1 + next(800), p.seqlen_k = 1 + next(800);  // the maxima (may cut a sequence)
    const int64_t padded = flashcute::sm90::bwd_varlen_padded_rows(p.total_q, batch);
    std::vector<int> owner(size_t(padded), -1);
    for (int b = 0; b < batch; ++b) {
      const flashcute::sm90::BwdBatch seq(p, b, padded);
      ASSERT_LE(seq.seqlen_q, p.seqlen_q);
      ASSERT_LE(seq.seqlen_k, p.seqlen_k);
      ASSERT_EQ(seq.tma_batch, 0);
      ASSERT_EQ(seq.rows % 128, 0);
      ASSERT_LE(seq.q_start + seq.seqlen_q, p.total_q);
      ASSERT_LE(seq.k_start + seq.seqlen_k, p.total_k);
      const int64_t end = seq.rows + flashcute::sm90::bwd_padded_rows(seq.seqlen_q);
      ASSERT_LE(end, padded) << "trial " << trial << " b " << b;
      if (garbage) continue;
      for (int64_t r = seq.rows; r < end; ++r) {
        ASSERT_EQ(owner[size_t(r)], -1) << "trial " << trial << ": row " << r << " of sequences " << owner[r] << ", " << b;
        owner[size_t(r)] = b;
      }
    }
  }
}

// The preprocess kernel's rule, row by row: whether 64-row block b of seqlen_q rows holds a row
// that sees at most exact_keys keys.
bool block_has_exact_row(const flashcute::KeyMask& mask, int seqlen_q, int b, int exact_keys) {
  for (int r = b * 64; r < std::min(seqlen_q, b * 64 + 64); ++r) {
    const int begin = std::max(0, mask.key_begin(r)), end = std::max(begin, mask.key_end(r));
    if (end - begin <= exact_keys) return true;
  }
  return false;
}

// The preprocess runs the blocks bwd_exact_blocks leaves out on a kernel without the exact-D pass:
// none of them may hold a row that sees at most 64 keys (the kernel's test, row by row), and the
// real blocks it keeps must all hold one. Causal, windows, seqlen_q above and below seqlen_k.
TEST(Sm90Scheduler, BackwardExactBlocksHoldEveryExactRow) {
  constexpr int kExactKeys = 64;
  int checked = 0;
  for (int sq : {1, 17, 64, 65, 113, 128, 300, 1000, 1024})
    for (int sk : {1, 2, 63, 64, 65, 200, 1000, 1024})
      for (auto [wl, wr] : {std::pair{-1, -1}, {-1, 0}, {16, 100}, {31, 31}, {32, 32}, {0, 0}, {100, -1}, {-1, 70},
                            {500, 0}})
        for (bool partial : {false, true}) {
          flashcute::BwdParams p;
          p.seqlen_q = sq, p.seqlen_k = sk, p.window_left = wl, p.window_right = wr, p.partial_keys = partial;
          const int blocks = int(flashcute::sm90::bwd_padded_rows(sq) / 64);
          const auto [pre, post] = flashcute::sm90::bwd_exact_blocks(p, blocks, kExactKeys);
          ASSERT_LE(0, pre);
          ASSERT_LE(pre, post);
          ASSERT_LE(post, blocks);
          const flashcute::KeyMask mask{sk, sk - sq, wl, wr};
          for (int b = 0; b < blocks; ++b) {
            const bool has_exact = !partial && block_has_exact_row(mask, sq, b, kExactKeys);
            const bool on_exact = b < pre || b >= post;
            const bool real = b * 64 < sq;
            ASSERT_EQ(has_exact, on_exact && real)
                << "sq " << sq << " sk " << sk << " window (" << wl << ", " << wr << ") partial " << partial
                << " block " << b << " of " << blocks << ": pre " << pre << " post " << post;
            ++checked;
          }
        }
  EXPECT_GT(checked, 1000);
}

// bwd_varlen_few_exact_blocks: where it lets a varlen batch's exact-D blocks run one (entry, head)
// pair a CTA, every entry length has at most three such blocks (the kernel's row-by-row rule);
// where it refuses (a narrow window), a long entry has many.
TEST(Sm90Scheduler, BackwardVarlenFewExactBlocksWhereAllowed) {
  constexpr int kExactKeys = 64;
  static const int cu[2] = {0, 0};  // never read: the rule looks at the pointers
  auto exact_blocks = [](int len, int wl, int wr) {
    const flashcute::KeyMask mask{len, 0, wl, wr};
    int count = 0;
    for (int b = 0; b * 64 < len; ++b) count += block_has_exact_row(mask, len, b, kExactKeys);
    return count;
  };
  int allowed = 0, refused = 0;
  for (auto [wl, wr] : {std::pair{-1, -1}, {-1, 0}, {0, -1}, {16, 100}, {31, 31}, {32, 31}, {32, 32}, {0, 0},
                        {63, 0}, {64, 0}, {100, -1}, {-1, 70}, {500, 0}, {5, 5}})
    for (int len : {1, 17, 63, 64, 65, 113, 127, 128, 129, 300, 1000, 1024, 4000}) {
      flashcute::BwdParams p;
      p.cu_seqlens_q = p.cu_seqlens_k = cu;
      p.total_q = p.total_k = 5000;
      p.seqlen_q = p.seqlen_k = 4000;
      p.window_left = wl, p.window_right = wr;
      if (flashcute::sm90::bwd_varlen_few_exact_blocks(p, kExactKeys)) {
        EXPECT_LE(exact_blocks(len, wl, wr), 3) << "window (" << wl << ", " << wr << ") length " << len;
        ++allowed;
      } else {
        EXPECT_TRUE(wl >= 0 && wr >= 0 && wl + wr + 1 <= kExactKeys) << "window (" << wl << ", " << wr << ")";
        if (len == 4000) {
          EXPECT_GT(exact_blocks(len, wl, wr), 3);
        }
        ++refused;
      }
      // Anything that could make an entry's query and key lengths differ is refused.
      flashcute::BwdParams q = p;
      static const int other[2] = {0, 0};
      q.cu_seqlens_k = other;
      EXPECT_FALSE(flashcute::sm90::bwd_varlen_few_exact_blocks(q, kExactKeys));
      q = p, q.total_k = 4999;
      EXPECT_FALSE(flashcute::sm90::bwd_varlen_few_exact_blocks(q, kExactKeys));
      q = p, q.seqlen_k = 3999;
      EXPECT_FALSE(flashcute::sm90::bwd_varlen_few_exact_blocks(q, kExactKeys));
      q = p, q.cu_seqlens_q = q.cu_seqlens_k = nullptr;
      EXPECT_FALSE(flashcute::sm90::bwd_varlen_few_exact_blocks(q, kExactKeys));
    }
  EXPECT_GT(allowed, 100);
  EXPECT_GT(refused, 20);
}
