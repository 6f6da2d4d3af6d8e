// Host-only tests: the kernel list, the sm80 tile table, and the validations (plan_fwd, plan_bwd).
// Needs no GPU and launches nothing: every pointer is fake and never dereferenced.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "flashcute/host/api.hpp"
#include "flashcute/common/mask.hpp"
#include "flashcute/sm90/scheduler.hpp"

namespace {

using flashcute::DType;
using flashcute::FwdArgs;
using flashcute::FwdPlan;
using flashcute::Status;
using flashcute::StatusCode;
using flashcute::sm80::FwdConfig;

std::set<std::string> split(const char* csv) {
  std::set<std::string> out;
  std::stringstream ss(csv);
  for (std::string item; std::getline(ss, item, ',');) out.insert(item);
  return out;
}

// ---------------------------------------------------------------------------------------- tiles

TEST(TileTable, EveryCatalogHeadDimHasAValidConfig) {
  for (int hd : flashcute::kKernelHeadDims) {
    const FwdConfig cfg = flashcute::sm80::default_fwd_config(hd);
    EXPECT_EQ(cfg.head_dim, hd);
    const char* err = flashcute::sm80::validate(cfg);
    EXPECT_EQ(err, nullptr) << "head dim " << hd << ": " << err;
  }
}

TEST(TileTable, ValidateNamesTheBrokenRule) {
  struct Bad {
    FwdConfig cfg;
    const char* message;
  };
  const Bad cases[] = {
      {{.head_dim = 48, .block_m = 128, .block_n = 64, .num_warps = 4}, "head_dim must be a multiple of 32, at most 256"},
      {{.head_dim = 288, .block_m = 128, .block_n = 64, .num_warps = 4}, "head_dim must be a multiple of 32, at most 256"},
      {{.head_dim = 128, .block_m = 128, .block_n = 64, .num_warps = 2}, "num_warps must be 4 or 8"},
      {{.head_dim = 128, .block_m = 128, .block_n = 64, .num_warps = 16}, "num_warps must be 4 or 8"},
      {{.head_dim = 128, .block_m = 96, .block_n = 64, .num_warps = 4},
       "block_m must be a multiple of 16 * num_warps (one m16 MMA row block per warp)"},
      {{.head_dim = 128, .block_m = 64, .block_n = 64, .num_warps = 8},
       "block_m must be a multiple of 16 * num_warps (one m16 MMA row block per warp)"},
      {{.head_dim = 128, .block_m = 128, .block_n = 24, .num_warps = 4}, "block_n must be a multiple of 16, at least 32"},
      {{.head_dim = 128, .block_m = 128, .block_n = 16, .num_warps = 4}, "block_n must be a multiple of 16, at least 32"},
      {{.head_dim = 256, .block_m = 256, .block_n = 256, .num_warps = 8}, "tiles exceed the 227 KB shared-memory limit"},
      {{.head_dim = 128, .block_m = 128, .block_n = 48, .num_warps = 8},
       "block_n must be a multiple of the loader's rows per step"},
  };
  for (const Bad& bad : cases) {
    const char* err = flashcute::sm80::validate(bad.cfg);
    ASSERT_NE(err, nullptr) << bad.message;
    EXPECT_STREQ(err, bad.message);
  }
}

TEST(TileTable, Sm90EveryCatalogHeadDimHasAValidConfig) {
  for (int hd : flashcute::kKernelHeadDims) {
    const flashcute::sm90::FwdConfig cfg = flashcute::sm90::default_fwd_config(hd);
    EXPECT_EQ(cfg.head_dim, hd);
    const char* err = flashcute::sm90::validate(cfg);
    EXPECT_EQ(err, nullptr) << "head dim " << hd << ": " << err;
    EXPECT_LE(cfg.smem_bytes(), 227 * 1024) << "head dim " << hd;
  }
}

TEST(TileTable, Sm90LongSequenceConfigsAreValid) {
  int with_long = 0;
  for (int hd : flashcute::kKernelHeadDims) {
    if (!flashcute::sm90::has_long_fwd_config(hd)) continue;
    ++with_long;
    const flashcute::sm90::FwdConfig cfg = flashcute::sm90::long_fwd_config(hd);
    EXPECT_EQ(cfg.head_dim, hd);
    const char* err = flashcute::sm90::validate(cfg);
    EXPECT_EQ(err, nullptr) << "head dim " << hd << ": " << err;
  }
  EXPECT_EQ(with_long, 1);  // d 64 (192 x 128), as CMake's _flashcute_sm90_long_head_dims lists
  // d 64's first table: four consumer warpgroups of 64 rows, 640 threads at 96 registers a thread.
  constexpr flashcute::sm90::FwdConfig kD64 = flashcute::sm90::default_fwd_config(64);
  EXPECT_EQ(kD64.consumer_warpgroups(), 4);
  EXPECT_EQ(kD64.num_threads(), 640);
  EXPECT_EQ(kD64.launch_regs(), 96);
  EXPECT_LE(128 * (kD64.producer_regs + 4 * kD64.consumer_regs), kD64.launch_regs() * kD64.num_threads());
  EXPECT_EQ(flashcute::sm90::long_fwd_config(64).block_m, 192);
  EXPECT_FALSE(flashcute::sm90::has_long_fwd_config(128));
  EXPECT_FALSE(flashcute::sm90::has_long_fwd_config(0));
}

TEST(TileTable, Sm90LongTilesWhereTheyWereMeasuredFaster) {
  using flashcute::sm90::use_long_tiles;
  constexpr int kNone = -1, kSms = 132, kM = 192;
  // (seqlen_q, seqlen_k, heads x batch, window_left, window_right, SMs, block_m)
  EXPECT_FALSE(use_long_tiles(1024, 1024, 512, kNone, kNone, kSms, kM));  // no mask: equal at 1k
  EXPECT_TRUE(use_long_tiles(2048, 2048, 256, kNone, kNone, kSms, kM));   // +11% at 2k
  EXPECT_TRUE(use_long_tiles(16384, 16384, 32, kNone, kNone, kSms, kM));
  EXPECT_FALSE(use_long_tiles(2048, 1000, 256, kNone, kNone, kSms, kM));  // short keys
  EXPECT_FALSE(use_long_tiles(2048, 2048, 256, kNone, 0, kSms, kM));      // causal: from 4k only
  EXPECT_TRUE(use_long_tiles(4096, 4096, 128, kNone, 0, kSms, kM));
  EXPECT_TRUE(use_long_tiles(8192, 8192, 64, kNone, 0, kSms, kM));
  EXPECT_FALSE(use_long_tiles(16384, 16384, 64, 256, 0, kSms, kM));       // windows: never
  EXPECT_FALSE(use_long_tiles(16384, 16384, 64, kNone, 128, kSms, kM));
  // Too few tiles to give each SM two: 11 query tiles x 4 heads.
  EXPECT_FALSE(use_long_tiles(2048, 2048, 4, kNone, kNone, kSms, kM));
  EXPECT_TRUE(use_long_tiles(2048, 2048, 4, kNone, kNone, 16, kM));
  EXPECT_FALSE(use_long_tiles(16384, 16384, 64, kNone, kNone, kSms, 0));  // no long config
}

// Sets environment variable `name` to each text of `good` in turn, expecting `read` to accept it
// and give the paired value; then sets it to `bad`, stores what `read` says in `st`, and unsets it.
template <class T, std::size_t N, class Read>
void check_env_setting(const char* name, const std::pair<const char*, T> (&good)[N], const char* bad, Read read,
                       flashcute::Status& st) {
  T value;
  for (const auto& [text, expected] : good) {
    setenv(name, text, 1);
    ASSERT_TRUE(read(value).ok()) << text;
    EXPECT_EQ(value, expected) << text;
  }
  setenv(name, bad, 1);
  st = read(value);
  unsetenv(name);
}

TEST(TileTable, Sm90TilesSettingIsReadFromTheEnvironment) {
  using flashcute::Sm90Tiles;
  Sm90Tiles tiles;
  unsetenv("FLASHCUTE_SM90_TILES");
  ASSERT_TRUE(flashcute::sm90_tiles_setting(tiles).ok());
  EXPECT_EQ(tiles, Sm90Tiles::kAuto);
  const std::pair<const char*, Sm90Tiles> good[] = {
      {"", Sm90Tiles::kAuto}, {"auto", Sm90Tiles::kAuto}, {"base", Sm90Tiles::kBase}, {"long", Sm90Tiles::kLong}};
  flashcute::Status st;
  check_env_setting("FLASHCUTE_SM90_TILES", good, "wide", flashcute::sm90_tiles_setting, st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message.find("FLASHCUTE_SM90_TILES"), std::string::npos) << st.message;
  EXPECT_NE(st.message.find("auto, base or long"), std::string::npos) << st.message;
}

TEST(TileTable, ForwardPathSettingIsReadFromTheEnvironment) {
  using flashcute::ForwardPath;
  ForwardPath path;
  const std::pair<const char*, ForwardPath> good[] = {
      {"", ForwardPath::kAuto}, {"auto", ForwardPath::kAuto}, {"sm90", ForwardPath::kAuto}, {"sm80", ForwardPath::kSm80}};
  flashcute::Status st;
  check_env_setting("FLASHCUTE_FORWARD_PATH", good, "sm100", flashcute::forward_path_setting, st);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.arg, "FLASHCUTE_FORWARD_PATH");
  EXPECT_NE(st.message.find("auto, sm80 or sm90"), std::string::npos) << st.message;
  ASSERT_TRUE(flashcute::forward_path_setting(path).ok());  // unset
  EXPECT_EQ(path, ForwardPath::kAuto);
}

TEST(TileTable, Sm90OStagedThroughVInPasses) {
  using flashcute::sm90::default_fwd_config;
  // d 256 on 128 x 80 tiles: a 40 KB V buffer holds two 16 KB regions of 64 rows x 128 columns.
  EXPECT_TRUE(default_fwd_config(256).o_via_v);
  EXPECT_EQ(default_fwd_config(256).o_pass_cols(), 128);
  // d 192 on 128 x 96 tiles: 36 KB, three passes of 64 columns (96 is no multiple of 64).
  EXPECT_TRUE(default_fwd_config(192).o_via_v);
  EXPECT_EQ(default_fwd_config(192).o_pass_cols(), 64);
  for (int hd : {32, 64, 96, 128}) EXPECT_FALSE(default_fwd_config(hd).o_via_v) << hd;  // they have an O buffer
}

// ----------------------------------------------------------------------- sm90 tile scheduler

TEST(Sm90Scheduler, FastDivIsExact) {
  using flashcute::sm90::FastDiv;
  std::vector<unsigned> ns;
  for (unsigned n = 0; n < 4096; ++n) ns.push_back(n);
  uint64_t x = 88172645463325252ull;  // xorshift: dividends up to 2^31 - 1
  for (int i = 0; i < 4096; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ns.push_back(unsigned(x % (1ull << 31)));
  }
  ns.push_back((1u << 31) - 1);
  for (unsigned d : {1u, 2u, 3u, 5u, 7u, 31u, 64u, 100u, 127u, 131u, 132u, 133u, 255u, 1000u, 65537u, 1u << 20,
                     (1u << 31) - 1}) {
    const FastDiv div(d);
    for (unsigned n : ns) ASSERT_EQ(div(n), n / d) << n << " / " << d;
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

// Walks every CTA as the kernel does; checks that each tile comes exactly once, and returns the
// largest CTA's load.
template <class Cost>
double walk_all(const TileSchedule& s, Cost&& cost) {
  std::vector<int> seen(size_t(s.m_blocks) * s.heads_batch, 0);
  double worst = 0;
  for (unsigned cta = 0; cta < s.ctas; ++cta) {
    double load = 0;
    for (unsigned u = cta, j = 0; u < s.end; s.next(u, j)) {
      const TileSchedule::Tile t = s.at(u, j, cta);
      if (!t.valid) continue;
      EXPECT_LT(t.hb, s.heads_batch);
      EXPECT_GE(t.m_block, 0);
      EXPECT_LT(t.m_block, int(s.m_blocks));
      if (t.hb >= s.heads_batch || t.m_block < 0 || t.m_block >= int(s.m_blocks)) return -1;
      ++seen[size_t(t.hb) * s.m_blocks + t.m_block];
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

TEST(Sm90Scheduler, TheTailEvensOutCausalRounds) {
  using flashcute::sm90::make_tile_schedule;
  using flashcute::sm90::plan_tile_schedule;
  constexpr unsigned kSms = 132;
  // FlashAttention's grid (16k tokens, 2048 hidden), causal: 2048 units of equal cost on 132 SMs
  // are 15.5 rounds, so without a tail every CTA waits for a 16th (3% more than the mean).
  struct Case {
    int seqlen, head_dim, block_m, block_n;
  };
  for (const Case& c : {Case{2048, 64, 128, 128}, Case{4096, 64, 128, 128}, Case{8192, 64, 192, 128},
                        Case{2048, 128, 128, 128}, Case{4096, 128, 128, 128}, Case{2048, 256, 128, 80},
                        Case{8192, 256, 128, 80}}) {
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

TEST(TileTable, Sm90ValidateNamesTheBrokenRule) {
  using flashcute::sm90::FwdConfig;
  struct Bad {
    FwdConfig cfg;
    const char* message;
  };
  const Bad cases[] = {
      {{.head_dim = 48, .block_m = 128, .block_n = 128}, "head_dim must be a multiple of 32, at most 256"},
      {{.head_dim = 128, .block_m = 64, .block_n = 128}, "block_m must be 128, 192 or 256 (2, 3 or 4 consumer warpgroups)"},
      {{.head_dim = 128, .block_m = 320, .block_n = 128}, "block_m must be 128, 192 or 256 (2, 3 or 4 consumer warpgroups)"},
      {{.head_dim = 128, .block_m = 128, .block_n = 72},
       "block_n must be a multiple of 16 in [16, 256] (the N of one wgmma and a TMA box)"},
      {{.head_dim = 128, .block_m = 128, .block_n = 128, .stages = 1},
       "stages must be >= 2: the producer loads one block while the consumers use another"},
      {{.head_dim = 128, .block_m = 128, .block_n = 128, .q_stages = 3}, "q_stages must be 1 or 2"},
      {{.head_dim = 256, .block_m = 128, .block_n = 128}, "tiles exceed the 227 KB shared-memory limit"},
      {{.head_dim = 256, .block_m = 128, .block_n = 64, .q_stages = 2}, "tiles exceed the 227 KB shared-memory limit"},
      {{.head_dim = 256, .block_m = 128, .block_n = 80, .o_smem = true}, "tiles exceed the 227 KB shared-memory limit"},
      {{.head_dim = 64, .block_m = 192, .block_n = 64, .producer_regs = 24, .consumer_regs = 240},
       "the warpgroups' registers exceed what the CTA is launched with (launch_regs() x num_threads())"},
      // 32 + 2 x 240 fills the 64K register file, but a 384-thread CTA is launched with 168 a
      // thread (64512): the consumers' setmaxnreg would wait forever (a hang seen on the H100).
      {{.head_dim = 64, .block_m = 128, .block_n = 64, .producer_regs = 32, .consumer_regs = 240},
       "the warpgroups' registers exceed what the CTA is launched with (launch_regs() x num_threads())"},
      {{.head_dim = 64, .block_m = 128, .block_n = 64, .producer_regs = 20}, "register counts must be multiples of 8 in [24, 256]"},
      // Four consumer warpgroups: 640 threads are launched with 96 registers a thread (61440), so
      // 24 + 4 x 120 (64512) does not fit, where 24 + 4 x 112 (60416) does.
      {{.head_dim = 64, .block_m = 256, .block_n = 64, .consumer_regs = 120},
       "the warpgroups' registers exceed what the CTA is launched with (launch_regs() x num_threads())"},
      {{.head_dim = 128, .block_m = 128, .block_n = 128, .o_smem = true, .o_via_v = true},
       "o_via_v needs one Q buffer, no O buffer, and a V buffer that holds 64 rows x 64 columns of O per consumer warpgroup"},
      {{.head_dim = 256, .block_m = 128, .block_n = 16, .o_via_v = true},
       "o_via_v needs one Q buffer, no O buffer, and a V buffer that holds 64 rows x 64 columns of O per consumer warpgroup"},
  };
  for (const Bad& bad : cases) {
    const char* err = flashcute::sm90::validate(bad.cfg);
    ASSERT_NE(err, nullptr) << bad.message;
    EXPECT_STREQ(err, bad.message);
  }
}

// ---------------------------------------------------------------------------------------- the list

TEST(KernelList, IsTheProductOfTheBuildOptions) {
  // CMake wrote both the options and the list into build_config.hpp: they must agree.
  const std::set<std::string> dims = split(flashcute::kBuildHeadDims), dtypes = split(flashcute::kBuildDtypes);
  std::set<std::string> listed;
  int backward = 0, splitkv = 0, sm90 = 0;
  const bool sm90a = split(flashcute::kBuildCudaArchs).count("90a") > 0;
  for (const flashcute::KernelKey& k : flashcute::kCompiledKernels) {
    if (k.arch == flashcute::Arch::kSm90) {  // the Hopper forward: one per (dtype, head dim), with 90a
      EXPECT_TRUE(sm90a);
      EXPECT_EQ(k.direction, flashcute::Direction::kFwd);
      EXPECT_EQ(k.variant, flashcute::Variant::kPlain);
      EXPECT_TRUE(dims.count(std::to_string(k.head_dim))) << k.head_dim;
      EXPECT_TRUE(dtypes.count(flashcute::dtype_option(k.dtype))) << flashcute::dtype_name(k.dtype);
      ++sm90;
      continue;
    }
    EXPECT_EQ(k.arch, flashcute::Arch::kSm80);
    EXPECT_TRUE(k.variant == flashcute::Variant::kPlain || k.direction == flashcute::Direction::kFwd);
    EXPECT_TRUE(dims.count(std::to_string(k.head_dim))) << k.head_dim;
    EXPECT_TRUE(dtypes.count(flashcute::dtype_option(k.dtype))) << flashcute::dtype_name(k.dtype);
    listed.insert(std::string(flashcute::kernel_kind_name(k)) + "/" + flashcute::dtype_option(k.dtype) + "/" +
                  std::to_string(k.head_dim));
    backward += k.direction == flashcute::Direction::kBwd;
    splitkv += k.variant == flashcute::Variant::kSplitkv;
  }
  // Every (dtype, head dim) has a forward, and either all or none has a backward
  // (FLASHCUTE_BACKWARD) and a KV-cache kernel (FLASHCUTE_KVCACHE).
  const size_t per_direction = dims.size() * dtypes.size();
  EXPECT_TRUE(backward == 0 || size_t(backward) == per_direction) << backward;
  EXPECT_TRUE(splitkv == 0 || size_t(splitkv) == per_direction) << splitkv;
  EXPECT_EQ(std::string(flashcute::kBuildBackward) == "ON", backward > 0);
  EXPECT_EQ(std::string(flashcute::kBuildKvcache) == "ON", splitkv > 0);
  EXPECT_EQ(size_t(sm90), sm90a ? per_direction : 0);
  EXPECT_EQ(listed.size(), per_direction + size_t(backward) + size_t(splitkv));
  EXPECT_EQ(flashcute::kNumCompiledKernels, per_direction + size_t(backward) + size_t(splitkv) + size_t(sm90));
}

TEST(KernelList, HeadDimDispatch) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (int d = 8; d <= 256; d += 8) {
      int expected = 0;  // the smallest compiled kernel head dim >= d
      for (const flashcute::KernelKey& k : flashcute::kCompiledKernels)
        if (k.dtype == dtype && k.head_dim >= d && (expected == 0 || k.head_dim < expected)) expected = k.head_dim;
      EXPECT_EQ(flashcute::kernel_head_dim(d, dtype), expected) << d;
    }
  }
  EXPECT_EQ(flashcute::kernel_head_dim(264), 0);
  EXPECT_EQ(flashcute::catalog_head_dim(32), 32);
  EXPECT_EQ(flashcute::catalog_head_dim(40), 64);
  EXPECT_EQ(flashcute::catalog_head_dim(136), 192);
  EXPECT_EQ(flashcute::catalog_head_dim(200), 256);
  EXPECT_EQ(flashcute::catalog_head_dim(264), 0);
}

// ---------------------------------------------------------------------------------------- plan_fwd

const void* fake(std::uintptr_t addr) { return reinterpret_cast<const void*>(addr); }
void* fake_mut(std::uintptr_t addr) { return reinterpret_cast<void*>(addr); }

// The dtype and head dim this build can run, so that valid calls plan.
DType built_dtype() { return flashcute::dtype_compiled(DType::kBFloat16) ? DType::kBFloat16 : DType::kFloat16; }
int built_head_dim() { return flashcute::kCompiledKernels[0].head_dim; }

// A valid call: contiguous (batch, seqlen, heads, head_dim) arrays, GQA 4:1, with lse.
FwdArgs good_args(int d = built_head_dim()) {
  const DType dt = built_dtype();
  FwdArgs a;
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {2, 100, 8, d});
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {2, 120, 2, d});
  a.v = flashcute::tensor_ref(fake(0x300000), dt, {2, 120, 2, d});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {2, 100, 8, d});
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x500000), DType::kFloat32, {2, 8, 100});
  return a;
}

// good_args() with q, k, v as views of one packed (batch, seqlen, 3, heads, d) array, no lse.
FwdArgs packed_qkv_args() {
  const int d = built_head_dim();
  const DType dt = built_dtype();
  FwdArgs a = good_args();
  const int64_t row = 3 * 8 * d;
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {2, 100, 8, d}, {100 * row, row, d, 1});
  a.k = flashcute::tensor_ref(fake(0x100000 + 2 * 8 * d), dt, {2, 100, 8, d}, {100 * row, row, d, 1});
  a.v = flashcute::tensor_ref(fake(0x100000 + 2 * 16 * d), dt, {2, 100, 8, d}, {100 * row, row, d, 1});
  a.lse.reset();
  return a;
}

Status plan(const FwdArgs& a, FwdPlan* out = nullptr) {
  FwdPlan p;
  Status st = flashcute::plan_fwd(a, p);
  if (out) *out = p;
  return st;
}

// Expects `st` to be an error of `code` about `arg` whose message contains `fragment`.
void expect_error(const Status& st, StatusCode code, const char* arg, const std::string& fragment) {
  EXPECT_EQ(st.code, code) << st.message;
  EXPECT_EQ(st.arg, arg) << st.message;
  EXPECT_NE(st.message.find(fragment), std::string::npos) << "message: " << st.message << "\nexpected: " << fragment;
  EXPECT_FALSE(st.expected.empty());
  EXPECT_FALSE(st.got.empty());
}

TEST(PlanFwd, AcceptsAValidCall) {
  FwdPlan p;
  ASSERT_TRUE(plan(good_args(), &p).ok()) << plan(good_args()).message;
  EXPECT_FALSE(p.empty);
  EXPECT_EQ(p.kernel.head_dim, built_head_dim());
  EXPECT_EQ(p.kernel.dtype, built_dtype());
  const int d = built_head_dim();
  EXPECT_EQ(p.params.q_row_stride, 8 * d);
  EXPECT_EQ(p.params.q_batch_stride, 100 * 8 * d);
  EXPECT_EQ(p.params.k_head_stride, d);
  EXPECT_EQ(p.params.lse_batch_stride, 800);
  EXPECT_EQ(p.params.lse_head_stride, 100);
  EXPECT_EQ(p.params.nheads, 8);
  EXPECT_EQ(p.params.nheads_k, 2);
  EXPECT_FLOAT_EQ(p.params.softmax_scale, float(1.0 / std::sqrt(double(d))));
  EXPECT_EQ(p.params.window_left, -1);
  EXPECT_EQ(p.params.window_right, -1);
}

TEST(PlanFwd, NormalisesTheMask) {
  FwdArgs a = good_args();  // seqlen_q 100, seqlen_k 120
  a.causal = true;
  FwdPlan p;
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.window_right, 0);
  a = good_args();
  a.window_left = 120;            // >= seqlen_k: every key is in reach on the left
  a.window_right = 1LL << 40;     // beyond int: unbounded
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.window_left, -1);
  EXPECT_EQ(p.params.window_right, -1);
  a.window_left = 5;
  a.window_right = 98;  // < seqlen_q - 1: kept
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.window_left, 5);
  EXPECT_EQ(p.params.window_right, 98);
}

TEST(PlanFwd, StridedViewsAndSizeOneDims) {
  const int d = built_head_dim();
  const DType dt = built_dtype();
  FwdArgs a = packed_qkv_args();
  const int64_t row = 3 * 8 * d;
  FwdPlan p;
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_EQ(p.params.k_row_stride, row);
  EXPECT_EQ(p.params.lse, nullptr);
  // A stride that only ever multiplies index 0 is ignored (and zeroed): batch 1, seqlen 1, 1 head.
  a = good_args();
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {1, 1, 1, d}, {3, 5, 7, 1});
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {1, 1, 1, d}, {3, 5, 7, 1});
  a.v = a.k;
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {1, 1, 1, d}, {13, 11, 9, 1});
  a.lse.reset();
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_EQ(p.params.q_batch_stride, 0);
  EXPECT_EQ(p.params.o_row_stride, 0);
}

// Which calls the sm90 (TMA) kernels may take: plan.sm90 is set only where this build has one and
// TMA can read the arrays; launch() then uses it on a compute capability 9.0 device.
TEST(PlanFwd, Sm90TakesWhatTmaCanRead) {
  const int d = built_head_dim();
  const DType dt = built_dtype();
  bool sm90_built = false;
  for (const flashcute::KernelKey& key : flashcute::kCompiledKernels)
    sm90_built = sm90_built || (key.arch == flashcute::Arch::kSm90 && key.dtype == dt && key.head_dim == d);
  FwdPlan p;
  ASSERT_TRUE(plan(good_args(), &p).ok());
  EXPECT_EQ(p.kernel.arch, flashcute::Arch::kSm80);  // the plan names the portable kernel
  EXPECT_EQ(flashcute::sm90_can_run(p.params), nullptr);
  EXPECT_EQ(p.sm90, sm90_built);
  // The packed-qkv views: strides 3 * heads * d, multiples of 16 bytes.
  FwdArgs a = packed_qkv_args();
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(flashcute::sm90_can_run(p.params), nullptr);
  // k broadcast over the batch (batch stride 0, as .expand makes it): TMA needs a real stride, so
  // the sm80 kernel runs it.
  a = good_args();
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {2, 120, 2, d}, {0, 2 * d, d, 1});
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_STREQ(flashcute::sm90_can_run(p.params), "k: a broadcast (0) stride or one of 2^38 elements or more");
  EXPECT_FALSE(p.sm90);
  // The same for v's heads.
  a = good_args();
  a.v = flashcute::tensor_ref(fake(0x300000), dt, {2, 120, 2, d}, {120 * d, d, 0, 1});
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_STREQ(flashcute::sm90_can_run(p.params), "v: a broadcast (0) stride or one of 2^38 elements or more");
  EXPECT_FALSE(p.sm90);
  // Strides plan_fwd would refuse (not multiples of 8 elements) are refused here too, for params
  // made by hand.
  flashcute::FwdParams odd = p.params;
  odd.q_row_stride = 8 * d + 4;
  EXPECT_STREQ(flashcute::sm90_can_run(odd), "q: a stride that is not a multiple of 16 bytes");
  // Size-one dims (stride zeroed by the plan) are fine.
  a = good_args();
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {1, 1, 8, d});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {1, 1, 8, d});
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {1, 120, 2, d});
  a.v = flashcute::tensor_ref(fake(0x300000), dt, {1, 120, 2, d});
  a.lse.reset();
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_EQ(flashcute::sm90_can_run(p.params), nullptr);
  // No keys: the sm80 kernel writes the zeros.
  flashcute::FwdParams none = p.params;
  none.seqlen_k = 0;
  EXPECT_STREQ(flashcute::sm90_can_run(none), "no keys");
}

TEST(PlanFwd, EmptyProblems) {
  FwdArgs a = good_args();
  const int d = built_head_dim();
  // No keys: valid, and k/v may be null.
  a.k = flashcute::tensor_ref(nullptr, built_dtype(), {2, 0, 2, d});
  a.v = a.k;
  FwdPlan p;
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_FALSE(p.empty);
  EXPECT_EQ(p.params.seqlen_k, 0);
  // No queries: nothing to launch, null pointers fine.
  a = good_args();
  a.q = flashcute::tensor_ref(nullptr, built_dtype(), {2, 0, 8, d});
  a.out = flashcute::mutable_tensor_ref(nullptr, built_dtype(), {2, 0, 8, d});
  a.lse = flashcute::mutable_tensor_ref(nullptr, DType::kFloat32, {2, 8, 0});
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_TRUE(p.empty);
}

TEST(PlanFwd, RejectsRanksAndDtypes) {
  FwdArgs a = good_args();
  a.q.rank = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "q: expected 4 dims (batch, seqlen_q, nheads, headdim), got 3");
  a = good_args();
  a.out.rank = 5;
  expect_error(plan(a), StatusCode::kInvalidArgument, "out", "out: expected 4 dims");
  a = good_args();
  a.q.dtype = a.k.dtype = a.v.dtype = a.out.dtype = DType::kOther;
  a.q.dtype_label = "int8";
  expect_error(plan(a), StatusCode::kInvalidType, "q", "q: expected a float16 or bfloat16 array, got int8");
  a = good_args();
  a.v.dtype = DType::kFloat32;
  expect_error(plan(a), StatusCode::kInvalidType, "v",
               std::string("v: expected ") + flashcute::dtype_name(built_dtype()) + " like q, got float32");
  a = good_args();
  a.lse->dtype = built_dtype();
  expect_error(plan(a), StatusCode::kInvalidType, "lse", "lse: expected float32 (batch, nheads, seqlen_q) = (2, 8, 100)");
}

TEST(PlanFwd, RejectsShapes) {
  const int d = built_head_dim();
  const DType dt = built_dtype();
  FwdArgs a = good_args();
  a.k.shape[0] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "k: batch 3 does not match q's batch 2");
  a = good_args();
  a.v.shape[1] = 7;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v", "seqlen_k differs: 7 vs 120");
  a = good_args();
  a.k.shape[2] = a.v.shape[2] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "nheads (8) must be a multiple of nheads_k (3)");
  a = good_args();
  a.q.shape[3] = a.k.shape[3] = a.v.shape[3] = a.out.shape[3] = 12;
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "headdim must be a multiple of 8 and <= 256, got 12");
  a = good_args();
  a.out.shape[1] = 99;
  expect_error(plan(a), StatusCode::kInvalidArgument, "out", "out: expected shape (2, 100, 8, ");
  a = good_args();
  a.lse->shape[2] = 99;
  expect_error(plan(a), StatusCode::kInvalidArgument, "lse", "got shape (2, 8, 99)");
  // The launch grid takes at most 65535 heads and batch entries.
  a = good_args();
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {70000, 1, 8, d});
  a.k = a.v = flashcute::tensor_ref(fake(0x200000), dt, {70000, 1, 2, d});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {70000, 1, 8, d});
  a.lse.reset();
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "q: batch 70000 exceeds 65535");
  a = good_args();
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {1, 1, 1LL << 31, d});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {1, 1, 1LL << 31, d});
  a.k = a.v = flashcute::tensor_ref(fake(0x200000), dt, {1, 1, 1, d});
  a.lse.reset();
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "nheads 2147483648 exceeds the supported maximum");
}

TEST(PlanFwd, RejectsStridesAndPointers) {
  const int d = built_head_dim();
  const DType dt = built_dtype();
  FwdArgs a = good_args();
  a.k.stride[3] = 2;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "k: the last dim must be contiguous (stride 1), got stride 2");
  a = good_args();
  a.v.stride[1] += 4;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v",
               "v: the row (seqlen) stride must be a multiple of 8 elements (16 bytes)");
  a = good_args();
  a.q.stride[0] = -a.q.stride[0];
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "q: negative strides are not supported");
  a = good_args();
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {2, 100, 8, d}, {100 * d, d, 0, 1});
  expect_error(plan(a), StatusCode::kInvalidArgument, "out", "make distinct elements overlap");
  a = good_args();
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x500000), DType::kFloat32, {2, 8, 100}, {1600, 200, 2});
  expect_error(plan(a), StatusCode::kInvalidArgument, "lse", "contiguous in seqlen_q (stride 1)");
  a = good_args();
  a.k.data = fake(0x200008);
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "k: the data pointer must be 16-byte aligned");
  a = good_args();
  a.v.data = nullptr;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v", "v: the data pointer is null");
  a = good_args();
  a.lse->data = fake(0x500002);
  expect_error(plan(a), StatusCode::kInvalidArgument, "lse", "lse: the data pointer must be 4-byte aligned");
}

TEST(PlanFwd, RejectsScalars) {
  for (double scale : {0.0, -1.0, double(NAN), double(INFINITY), 1e300, 1e-60}) {
    FwdArgs a = good_args();
    a.softmax_scale = scale;
    expect_error(plan(a), StatusCode::kInvalidArgument, "softmax_scale", "softmax_scale must be a finite number > 0");
  }
  for (double cap : {-1.0, double(NAN), double(INFINITY)}) {
    FwdArgs a = good_args();
    a.softcap = cap;
    expect_error(plan(a), StatusCode::kInvalidArgument, "softcap", "softcap must be a finite number >= 0");
  }
  FwdArgs a = good_args();
  a.window_left = -2;
  expect_error(plan(a), StatusCode::kInvalidArgument, "window_left", "window_left must be >= -1 (-1: unbounded), got -2");
  a = good_args();
  a.window_right = -3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "window_right", "window_right must be >= -1");
}

// The options alone follow the same rules (the Python API asks them first), and the backward
// takes the forward's options as they are: one AttnOptions in both.
TEST(PlanFwd, OptionsAreOneStructWithOneSetOfRules) {
  flashcute::AttnOptions o;
  EXPECT_TRUE(flashcute::detail::check_options(o).ok());
  o.window_left = -2;
  expect_error(flashcute::detail::check_options(o), StatusCode::kInvalidArgument, "window_left",
               "window_left must be >= -1 (-1: unbounded), got -2");
  o = {};
  o.softmax_scale = 1e300;  // finite as a double, not as the kernels' float
  expect_error(flashcute::detail::check_options(o), StatusCode::kInvalidArgument, "softmax_scale",
               "softmax_scale must be a finite number > 0");
  expect_error(flashcute::detail::check_num_splits(129), StatusCode::kInvalidArgument, "num_splits",
               "num_splits: expected 0 (automatic) to 128, got 129");
  expect_error(flashcute::detail::check_max_seqlens(0, -1), StatusCode::kInvalidArgument, "max_seqlen_k",
               "max_seqlen_k must be >= 0");

  flashcute::BwdArgs b;
  b.options() = good_args().options();
  b.softcap = -1.0;  // the forward's rules, checked by plan_fwd for the backward
  flashcute::FwdArgs f = good_args();
  f.options() = b.options();
  expect_error(plan(f), StatusCode::kInvalidArgument, "softcap", "softcap must be a finite number >= 0");
}

TEST(PlanFwd, ReportsWhatTheBuildLeftOut) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    if (flashcute::dtype_compiled(dt)) continue;
    FwdArgs a = good_args();
    a.q.dtype = a.k.dtype = a.v.dtype = a.out.dtype = dt;
    const Status st = plan(a);
    EXPECT_EQ(st.code, StatusCode::kNotCompiled);
    EXPECT_NE(st.message.find("FLASHCUTE_DTYPES"), std::string::npos) << st.message;
  }
  for (int d = 8; d <= 256; d += 8) {
    if (flashcute::kernel_head_dim(d, built_dtype()) != 0) continue;
    const Status st = plan(good_args(d));
    EXPECT_EQ(st.code, StatusCode::kNotCompiled) << d;
    EXPECT_NE(st.message.find("head dim " + std::to_string(d)), std::string::npos) << st.message;
    EXPECT_NE(st.message.find("FLASHCUTE_HEAD_DIMS"), std::string::npos) << st.message;
  }
}

// run_fwd must return before touching CUDA unless it launches: the stream is garbage, so any
// runtime call would fail or crash.
cudaStream_t bogus_stream() { return reinterpret_cast<cudaStream_t>(std::uintptr_t{0xdead0}); }

TEST(RunFwd, ValidatesBeforeTouchingCuda) {
  FwdArgs a = good_args();
  a.q.shape[0] = a.k.shape[0] = a.v.shape[0] = a.out.shape[0] = a.lse->shape[0] = 0;
  EXPECT_TRUE(flashcute::run_fwd(a, bogus_stream()).ok());
  a = good_args();
  a.softcap = -1.0;
  EXPECT_EQ(flashcute::run_fwd(a, bogus_stream()).code, StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------- plan_bwd

// A valid backward call of good_args()' shapes.
flashcute::BwdArgs good_bwd_args() {
  const FwdArgs f = good_args();
  flashcute::BwdArgs a;
  a.dout = flashcute::tensor_ref(fake(0x600000), f.q.dtype, {2, 100, 8, f.q.shape[3]});
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.out = f.out;
  a.lse = *f.lse;
  a.dq = flashcute::mutable_tensor_ref(fake_mut(0x700000), f.q.dtype, {2, 100, 8, f.q.shape[3]});
  a.dk = flashcute::mutable_tensor_ref(fake_mut(0x800000), f.q.dtype, {2, 120, 2, f.q.shape[3]});
  a.dv = flashcute::mutable_tensor_ref(fake_mut(0x900000), f.q.dtype, {2, 120, 2, f.q.shape[3]});
  a.workspace = flashcute::mutable_tensor_ref(fake_mut(0xa00000), DType::kFloat32,
                                              {flashcute::bwd_workspace_floats(2, 8, 100)});
  return a;
}

TEST(PlanBwd, AcceptsAValidCall) {
  flashcute::BwdPlan p;
  const Status st = flashcute::plan_bwd(good_bwd_args(), p);
  const bool built = flashcute::kernel_head_dim(built_head_dim(), built_dtype(), flashcute::Direction::kBwd) != 0;
  if (!built) {  // a build with FLASHCUTE_BACKWARD=OFF says so
    EXPECT_EQ(st.code, StatusCode::kNotCompiled) << st.message;
    return;
  }
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(p.kernel.direction, flashcute::Direction::kBwd);
  EXPECT_FALSE(p.empty);
  EXPECT_EQ(p.params.dq, fake_mut(0x700000));
  EXPECT_EQ(p.params.do_row_stride, 8 * built_head_dim());
  EXPECT_EQ(p.params.dk_row_stride, 2 * built_head_dim());
}

TEST(PlanBwd, RejectsEachNewArgumentByName) {
  flashcute::BwdPlan p;
  flashcute::BwdArgs a = good_bwd_args();
  a.dout.shape[1] = 99;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidArgument, "dout", "like q");
  a = good_bwd_args();
  a.dk.shape[2] = 4;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidArgument, "dk", "like k");
  a = good_bwd_args();
  a.dv.dtype = DType::kFloat32;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidType, "dv", "like v");
  a = good_bwd_args();
  a.dq.stride[3] = 2;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidArgument, "dq", "contiguous");
  a = good_bwd_args();
  a.workspace.shape[0] -= 1;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidArgument, "workspace", "at least 1600");
  a = good_bwd_args();
  a.lse.shape[2] = 7;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidArgument, "lse", "float32 (batch, nheads, seqlen_q)");
}

TEST(RunBwd, ValidatesBeforeTouchingCuda) {
  flashcute::BwdArgs a = good_bwd_args();
  a.softcap = -1.0;
  EXPECT_EQ(flashcute::run_bwd(a, bogus_stream()).code, StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------- varlen

// A valid variable-length call: three sequences packed into 100 query rows and 120 key rows.
FwdArgs good_varlen_args() {
  const DType dt = built_dtype();
  const int d = built_head_dim();
  FwdArgs a;
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {100, 8, d});
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {120, 2, d});
  a.v = flashcute::tensor_ref(fake(0x300000), dt, {120, 2, d});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {100, 8, d});
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x500000), DType::kFloat32, {8, 100});
  a.varlen = flashcute::VarlenArgs{flashcute::tensor_ref(fake(0xb00000), DType::kInt32, {4}),
                                   flashcute::tensor_ref(fake(0xc00000), DType::kInt32, {4}), 60, 70};
  return a;
}

TEST(PlanFwdVarlen, PlansTheSequencesOnTheDevice) {
  FwdPlan p;
  ASSERT_TRUE(plan(good_varlen_args(), &p).ok());
  const flashcute::FwdParams& q = p.params;
  EXPECT_EQ(q.batch, 3);
  EXPECT_EQ(q.seqlen_q, 60);  // the longest sequences size the grid
  EXPECT_EQ(q.seqlen_k, 70);
  EXPECT_EQ(q.total_q, 100);
  EXPECT_EQ(q.total_k, 120);
  EXPECT_EQ(q.cu_seqlens_q, static_cast<const int*>(fake(0xb00000)));
  EXPECT_EQ(q.cu_seqlens_k, static_cast<const int*>(fake(0xc00000)));
  EXPECT_EQ(q.q_batch_stride, 0);
  EXPECT_EQ(q.q_row_stride, 8 * built_head_dim());
  EXPECT_EQ(q.lse_head_stride, 100);  // lse (nheads, total_q)
  EXPECT_FALSE(p.empty);
  // The sm90 kernels take fixed-length batches only: a varlen call stays on the sm80 ones.
  EXPECT_FALSE(p.sm90);
  EXPECT_STREQ(flashcute::sm90_can_run(q), "a variable-length batch");
  // Window bounds are normalised against the packed totals, which bound every sequence.
  FwdArgs a = good_varlen_args();
  a.window_left = 119;
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.window_left, 119);
  a.window_left = 120;
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.window_left, -1);
  a = good_varlen_args();
  a.varlen->max_seqlen_q = 0;
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_TRUE(p.empty);
}

TEST(PlanFwdVarlen, RejectsEachArgumentByName) {
  FwdArgs a = good_varlen_args();
  a.varlen->cu_seqlens_q.dtype = DType::kFloat32;
  expect_error(plan(a), StatusCode::kInvalidType, "cu_seqlens_q", "int32 (batch + 1,)");
  a = good_varlen_args();
  a.varlen->cu_seqlens_k.shape[0] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "cu_seqlens_k", "does not match cu_seqlens_q's (4,)");
  a = good_varlen_args();
  a.varlen->cu_seqlens_q.stride[0] = 2;
  expect_error(plan(a), StatusCode::kInvalidArgument, "cu_seqlens_q", "contiguous");
  a = good_varlen_args();
  a.varlen->max_seqlen_k = -1;
  expect_error(plan(a), StatusCode::kInvalidArgument, "max_seqlen_k", ">= 0");
  a = good_varlen_args();
  a.q = good_args().q;  // 4 dims
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "(total_q, nheads, headdim)");
  a = good_varlen_args();
  a.v.shape[0] = 119;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v", "like k");
  a = good_varlen_args();
  a.lse->shape[1] = 99;
  expect_error(plan(a), StatusCode::kInvalidArgument, "lse", "float32 (nheads, total_q) = (8, 100)");
  a = good_varlen_args();
  a.k.stride[0] = 2 * built_head_dim() + 1;  // a row stride that is not 16-byte vectors: the fixed-length rules
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "multiple of 8");
}

// ---------------------------------------------------------------------------------------- merge

flashcute::MergeArgs good_merge_args() {
  flashcute::MergeArgs a;
  a.out_a = flashcute::tensor_ref(fake(0x100000), DType::kBFloat16, {2, 30, 4, 64});
  a.lse_a = flashcute::tensor_ref(fake(0x200000), DType::kFloat32, {2, 4, 30});
  a.out_b = flashcute::tensor_ref(fake(0x300000), DType::kBFloat16, {2, 30, 4, 64});
  a.lse_b = flashcute::tensor_ref(fake(0x400000), DType::kFloat32, {2, 4, 30});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x500000), DType::kBFloat16, {2, 30, 4, 64});
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x600000), DType::kFloat32, {2, 4, 30});
  return a;
}

TEST(PlanMerge, AcceptsFixedAndVarlenShapes) {
  flashcute::MergePlan p;
  ASSERT_TRUE(flashcute::plan_merge(good_merge_args(), p).ok());
  EXPECT_EQ(p.params.batch, 2);
  EXPECT_EQ(p.params.seqlen, 30);
  EXPECT_EQ(p.params.a_stride[1], 4 * 64);   // (batch, row, head) of out_a
  EXPECT_EQ(p.params.lse_stride[1], 30);     // (batch, head, row) of lse
  flashcute::MergeArgs a;
  a.out_a = flashcute::tensor_ref(fake(0x100000), DType::kFloat32, {50, 4, 64});
  a.lse_a = flashcute::tensor_ref(fake(0x200000), DType::kFloat32, {4, 50});
  a.out_b = a.out_a;
  a.lse_b = a.lse_a;
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x100000), DType::kFloat32, {50, 4, 64});  // in place
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x200000), DType::kFloat32, {4, 50});
  ASSERT_TRUE(flashcute::plan_merge(a, p).ok());
  EXPECT_EQ(p.params.batch, 1);
  EXPECT_EQ(p.params.seqlen, 50);
  EXPECT_EQ(p.params.lse_stride[1], 50);
}

TEST(PlanMerge, RejectsEachArgumentByName) {
  flashcute::MergePlan p;
  flashcute::MergeArgs a = good_merge_args();
  a.out_b.shape[3] = 32;
  expect_error(flashcute::plan_merge(a, p), StatusCode::kInvalidArgument, "out_b", "like out_a");
  a = good_merge_args();
  a.out.dtype = DType::kFloat16;
  expect_error(flashcute::plan_merge(a, p), StatusCode::kInvalidType, "out", "bfloat16 like out_a");
  a = good_merge_args();
  a.lse_b.shape[2] = 29;
  expect_error(flashcute::plan_merge(a, p), StatusCode::kInvalidArgument, "lse_b", "(batch, nheads, seqlen) = (2, 4, 30)");
  a = good_merge_args();
  a.out_a.dtype = DType::kInt32;
  expect_error(flashcute::plan_merge(a, p), StatusCode::kInvalidType, "out_a", "float16, bfloat16 or float32");
  a = good_merge_args();
  a.out_a.stride[3] = 2;
  expect_error(flashcute::plan_merge(a, p), StatusCode::kInvalidArgument, "out_a", "contiguous");
  EXPECT_EQ(flashcute::run_merge(a, bogus_stream()).code, StatusCode::kInvalidArgument);  // before any CUDA call
}

// ---------------------------------------------------------------------------------------- KV cache

// A decode step: one query per sequence, GQA 4:1, over a contiguous cache of 1000 keys.
FwdArgs good_kvcache_args() {
  const DType dt = built_dtype();
  const int d = built_head_dim();
  FwdArgs a;
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {4, 1, 8, d});
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {4, 1000, 2, d});
  a.v = flashcute::tensor_ref(fake(0x300000), dt, {4, 1000, 2, d});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {4, 1, 8, d});
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x500000), DType::kFloat32, {4, 8, 1});
  flashcute::KvcacheArgs& kv = a.kvcache.emplace();
  kv.cache_seqlens = flashcute::tensor_ref(fake(0xb00000), DType::kInt32, {4});
  kv.num_sms = 132;
  return a;
}

// The same step over a paged cache: 50 pages of 64 keys, 16 pages per sequence, appending 3 keys.
FwdArgs good_paged_args() {
  FwdArgs a = good_kvcache_args();
  const int d = built_head_dim();
  a.k = flashcute::tensor_ref(fake(0x200000), a.q.dtype, {50, 64, 2, d});
  a.v = flashcute::tensor_ref(fake(0x300000), a.q.dtype, {50, 64, 2, d});
  a.kvcache->block_table = flashcute::tensor_ref(fake(0xc00000), DType::kInt32, {4, 16});
  a.kvcache->k_new = flashcute::tensor_ref(fake(0xd00000), a.q.dtype, {4, 3, 2, d});
  a.kvcache->v_new = flashcute::tensor_ref(fake(0xe00000), a.q.dtype, {4, 3, 2, d});
  return a;
}

TEST(PlanKvcache, PacksTheGroupAndSplitsTheKeys) {
  if (!flashcute::kvcache_compiled()) GTEST_SKIP() << "the KV-cache kernels are not in this build (FLASHCUTE_KVCACHE=OFF)";
  const int d = built_head_dim();
  FwdPlan p;
  ASSERT_TRUE(plan(good_kvcache_args(), &p).ok());
  const flashcute::FwdParams& q = p.params;
  EXPECT_EQ(p.kernel.direction, flashcute::Direction::kFwd);
  EXPECT_EQ(p.kernel.variant, flashcute::Variant::kSplitkv);
  EXPECT_EQ(q.seqlen_q, 4);  // the 4 query heads of a KV head are the rows of one tile
  EXPECT_EQ(q.nheads, 2);
  EXPECT_EQ(q.q_row_stride, d);
  EXPECT_EQ(q.q_head_stride, 4 * d);
  EXPECT_EQ(q.lse_head_stride, 4);
  EXPECT_EQ(q.seqlen_k, 1000);
  EXPECT_EQ(q.cache_seqlens, static_cast<const int*>(fake(0xb00000)));
  EXPECT_FALSE(p.append);
  // 8 CTAs on 132 SMs: the keys are split, and the workspace holds every split's partial.
  EXPECT_GT(q.num_splits, 1);
  EXPECT_EQ(p.workspace_floats, int64_t(q.num_splits) * 4 * 2 * 4 * (d + 1));
  EXPECT_EQ(q.o_accum, nullptr);
  FwdArgs a = good_kvcache_args();
  a.kvcache->num_splits = 1;
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.num_splits, 1);
  EXPECT_EQ(p.workspace_floats, 0);
  a.window_left = 10;  // a window aligns per query row: no packing
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.seqlen_q, 1);
  EXPECT_EQ(p.params.nheads, 8);
}

TEST(PlanKvcache, RefusedWhenTheKernelsAreLeftOut) {
  if (flashcute::kvcache_compiled()) GTEST_SKIP() << "this build has the KV-cache kernels";
  FwdPlan p;
  const flashcute::Status st = plan(good_kvcache_args(), &p);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code, flashcute::StatusCode::kNotCompiled);
  EXPECT_EQ(st.arg, "k_cache");
}

TEST(PlanKvcache, ChoosesSplitsToFillTheGpu) {
  using flashcute::detail::choose_num_splits;
  EXPECT_EQ(choose_num_splits(512, 32, 132), 1);   // enough CTAs already
  EXPECT_EQ(choose_num_splits(128, 32, 132), 1);   // one wave
  EXPECT_EQ(choose_num_splits(8, 32, 132), 16);    // 128 CTAs of 2 blocks: one wave
  EXPECT_EQ(choose_num_splits(8, 512, 132), 16);   // 17 would take a second wave
  EXPECT_EQ(choose_num_splits(8, 1, 132), 1);      // one key block cannot be split
  EXPECT_LE(choose_num_splits(1, 100000, 132), flashcute::kMaxNumSplits);
}

TEST(PlanKvcache, PagedCacheAndAppend) {
  if (!flashcute::kvcache_compiled()) GTEST_SKIP() << "the KV-cache kernels are not in this build (FLASHCUTE_KVCACHE=OFF)";
  const int d = built_head_dim();
  FwdPlan p;
  ASSERT_TRUE(plan(good_paged_args(), &p).ok());
  const flashcute::FwdParams& q = p.params;
  EXPECT_FALSE(p.sm90);  // the KV-cache kernels are the sm80 family's
  EXPECT_EQ(q.seqlen_k, 16 * 64);  // the capacity: pages per sequence times the page size
  EXPECT_EQ(q.page_size_log2, 6);
  EXPECT_EQ(q.num_pages, 50);
  EXPECT_EQ(q.max_pages_per_seq, 16);
  EXPECT_EQ(q.k_batch_stride, 64 * 2 * d);  // between pages
  EXPECT_EQ(q.block_table_batch_stride, 16);
  EXPECT_TRUE(p.append);
  EXPECT_EQ(q.seqlen_new, 3);
  EXPECT_EQ(p.append_params.kn_row_stride, 2 * d);
  auto ws = flashcute::mutable_tensor_ref(fake_mut(0x900000), DType::kFloat32, {p.workspace_floats});
  ASSERT_TRUE(flashcute::attach_workspace(p, ws).ok());
  EXPECT_EQ(p.params.o_accum, static_cast<float*>(fake_mut(0x900000)));
  ws.shape[0] = p.workspace_floats - 1;
  expect_error(flashcute::attach_workspace(p, ws), StatusCode::kInvalidArgument, "workspace", "float32, contiguous");
}

TEST(PlanKvcache, RejectsEachArgumentByName) {
  if (!flashcute::kvcache_compiled()) GTEST_SKIP() << "the KV-cache kernels are not in this build (FLASHCUTE_KVCACHE=OFF)";
  FwdArgs a = good_paged_args();
  a.k.shape[1] = a.v.shape[1] = 48;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k_cache", "power of two >= 16");
  a = good_paged_args();
  a.kvcache->block_table->dtype = DType::kFloat32;
  expect_error(plan(a), StatusCode::kInvalidType, "block_table", "int32 (batch, max_num_blocks_per_seq)");
  a = good_paged_args();
  a.kvcache->block_table->shape[0] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "block_table", "(4, 16)");
  a = good_paged_args();
  a.kvcache->cache_seqlens->shape[0] = 5;
  expect_error(plan(a), StatusCode::kInvalidArgument, "cache_seqlens", "int32 (batch,) = (4,)");
  a = good_paged_args();
  a.kvcache->cache_seqlens.reset();
  expect_error(plan(a), StatusCode::kInvalidArgument, "cache_seqlens", "required when k and v are given");
  a = good_paged_args();
  a.kvcache->k_new->shape[1] = a.kvcache->v_new->shape[1] = 16 * 64 + 1;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "overflow a cache of 1024");
  a = good_paged_args();
  a.kvcache->v_new.reset();
  expect_error(plan(a), StatusCode::kInvalidArgument, "v", "v: k and v (the new keys and values) must be given together");
  a = good_paged_args();
  a.kvcache->v_new->shape[2] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v", "(batch, seqlen_new, nheads_k, headdim)");
  a = good_paged_args();
  a.kvcache->num_splits = 129;
  expect_error(plan(a), StatusCode::kInvalidArgument, "num_splits", "0 (automatic) to 128");
  a = good_kvcache_args();
  a.k.shape[0] = a.v.shape[0] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k_cache", "batch 3 does not match q's batch 4");
  a = good_kvcache_args();
  a.v.shape[1] = 999;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v_cache", "like k_cache");
  // A plan that splits the keys and has no workspace attached is refused before any CUDA call.
  EXPECT_EQ(flashcute::run_fwd(good_kvcache_args(), bogus_stream()).arg, "workspace");
}

}  // namespace
