// Host-only tests of the tile tables: the sm80 and sm90 forward configs, the long-tile choice,
// and the settings read from the environment.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <utility>

#include "flashcute/host/api.hpp"
#include "host_util.hpp"

namespace {

using namespace fctest;  // NOLINT: the test helpers
using flashcute::sm80::FwdConfig;

// ---------------------------------------------------------------------------------------- tiles

TEST(TileTable, EveryCatalogHeadDimHasAValidConfig) {
  for (int hd : flashcute::kKernelHeadDims) {
    const FwdConfig cfg = flashcute::sm80::default_fwd_config(hd);
    EXPECT_EQ(cfg.head_dim, hd);
    const char* err = flashcute::sm80::validate(cfg);
    EXPECT_EQ(err, nullptr) << "head dim " << hd << ": " << err;
  }
}

TEST(TileTable, EveryCatalogHeadDimHasAValidSplitKvConfig) {
  for (int hd : flashcute::kKernelHeadDims) {
    const FwdConfig cfg = flashcute::sm80::default_splitkv_config(hd);
    EXPECT_EQ(cfg.head_dim, hd);
    EXPECT_TRUE(cfg.split_kv);
    EXPECT_GE(cfg.kv_stages, 2) << "head dim " << hd;
    const char* err = flashcute::sm80::validate(cfg);
    EXPECT_EQ(err, nullptr) << "head dim " << hd << ": " << err;
  }
}

TEST(TileTable, EveryCatalogHeadDimHasValidDecodeConfigs) {
  using flashcute::sm80::KvLayout;
  for (int hd : flashcute::kKernelHeadDims) {
    for (bool paged : {false, true}) {
      const FwdConfig cfg = flashcute::sm80::decode_splitkv_config(hd, paged);
      FwdConfig plain = cfg;
      plain.warp_split = false;
      EXPECT_TRUE(cfg.warp_split) << "head dim " << hd;
      EXPECT_EQ(cfg.kv_layout, paged ? KvLayout::kPaged : KvLayout::kContiguous) << "head dim " << hd;
      EXPECT_EQ(plain.smem_bytes(), flashcute::sm80::default_splitkv_config(hd).smem_bytes()) << "head dim " << hd;
      const char* err = flashcute::sm80::validate(cfg);
      EXPECT_EQ(err, nullptr) << "head dim " << hd << ": " << err;
    }
  }
}

TEST(TileTable, KvLayoutNeedsTheKvCacheKernel) {
  FwdConfig cfg = flashcute::sm80::default_fwd_config(128);
  cfg.kv_layout = flashcute::sm80::KvLayout::kPaged;
  ASSERT_NE(flashcute::sm80::validate(cfg), nullptr);
  EXPECT_NE(std::string(flashcute::sm80::validate(cfg)).find("kv_layout"), std::string::npos);
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
      {{.head_dim = 256, .block_m = 64, .block_n = 64, .num_warps = 4, .split_kv = true, .kv_stages = 4},
       "tiles exceed the 227 KB shared-memory limit"},
      {{.head_dim = 128, .block_m = 64, .block_n = 128, .num_warps = 4, .split_kv = true},
       "kv_stages must be 1, or at least 2 for the KV-cache kernel (split_kv)"},
      {{.head_dim = 128, .block_m = 64, .block_n = 128, .num_warps = 4, .kv_stages = 2},
       "kv_stages must be 1, or at least 2 for the KV-cache kernel (split_kv)"},
      {{.head_dim = 128, .block_m = 128, .block_n = 48, .num_warps = 8},
       "block_n must be a multiple of the loader's rows per step"},
      {{.head_dim = 128, .block_m = 64, .block_n = 128, .num_warps = 4, .warp_split = true},
       "warp_split needs split_kv, 4 warps and block_n a multiple of 64 (a warp's quarter in k16 steps)"},
      {{.head_dim = 128, .block_m = 64, .block_n = 96, .num_warps = 4, .split_kv = true, .kv_stages = 2,
        .warp_split = true},
       "warp_split needs split_kv, 4 warps and block_n a multiple of 64 (a warp's quarter in k16 steps)"},
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

}  // namespace
