// flashcute/sm80/config_bwd.hpp: the static configuration of the sm80 (mma.sync) backward kernels.
//
// The backward runs as three kernels (sm80/kernel_bwd.hpp): a preprocess that computes
// D = rowsum(dout * out), a key-block kernel that computes dk and dv, and a query-block kernel
// that computes dq. Neither writes what another CTA writes, so the result needs no atomics and is
// the same bits on every run (docs/perf-notes.md, sm80 backward, has the reasoning and the cost).
// One BwdConfig describes both main kernels; validate_bwd() lists its rules and
// default_bwd_config() is the tile table.
#pragma once

#include "flashcute/common/types.hpp"

namespace flashcute::sm80 {

struct BwdConfig {
  int head_dim;  // columns of the Q/K/V/dO tiles in shared memory

  // dk/dv kernel: each warp owns 16 keys, so a CTA owns 16 * kv_warps keys and walks the
  // query blocks (kv_block_m rows) of every query head of its KV group. Its dk and dv
  // accumulators hold head_dim / d_split columns; d_split > 1 runs that many CTAs per key
  // block, each for its share of the columns (the score GEMMs are then computed by each).
  int kv_warps;
  int kv_block_m;
  int d_split = 1;

  // dq kernel: each warp owns 16 queries, so a CTA owns 16 * q_warps of them and walks the
  // key blocks (q_block_n keys) they see.
  int q_warps;
  int q_block_n;

  constexpr int kv_block_n() const { return 16 * kv_warps; }
  constexpr int q_block_m() const { return 16 * q_warps; }
  constexpr int kv_cols() const { return head_dim / d_split; }
  // Shared memory row atom: 64 halves (128 B) when the column count allows, else 32 (64 B).
  static constexpr int atom_cols(int cols) { return cols % 64 == 0 ? 64 : 32; }
  // dk/dv kernel: K and V once, Q and dO in two stages (the next query block loads during
  // this one's math).
  constexpr int kv_smem_bytes() const { return (2 * kv_block_n() + 4 * kv_block_m) * head_dim * 2; }
  // dq kernel: Q and dO once, K and V in two stages.
  constexpr int q_smem_bytes() const { return (2 * q_block_m() + 4 * q_block_n) * head_dim * 2; }
};

// Returns nullptr when cfg is valid, otherwise the first violated rule.
constexpr const char* validate_bwd(BwdConfig cfg) {
  if (cfg.head_dim % 32 != 0 || cfg.head_dim > kMaxHeadDim) return "head_dim must be a multiple of 32, at most 256";
  if (cfg.kv_warps != 4 && cfg.kv_warps != 8) return "kv_warps must be 4 or 8";
  if (cfg.q_warps != 4 && cfg.q_warps != 8) return "q_warps must be 4 or 8";
  if (cfg.d_split < 1 || cfg.head_dim % (32 * cfg.d_split) != 0)
    return "d_split must divide head_dim into multiples of 32";
  if (cfg.kv_block_m % 32 != 0 || cfg.kv_block_m < 32) return "kv_block_m must be a multiple of 32";
  if (cfg.q_block_n % 32 != 0 || cfg.q_block_n < 32) return "q_block_n must be a multiple of 32";
  if (cfg.kv_smem_bytes() > 227 * 1024 || cfg.q_smem_bytes() > 227 * 1024)
    return "tiles exceed the 227 KB shared-memory limit";
  // The cp.async loader moves 16 B per thread per step and must cover whole row atoms.
  for (int threads : {32 * cfg.kv_warps, 32 * cfg.q_warps}) {
    const int rows_per_step = threads * 8 / BwdConfig::atom_cols(cfg.head_dim);
    if (rows_per_step == 0) return "loader threads must tile a shared-memory row atom";
    if (cfg.kv_block_m % rows_per_step != 0 || cfg.q_block_n % rows_per_step != 0 ||
        cfg.kv_block_n() % rows_per_step != 0 || cfg.q_block_m() % rows_per_step != 0)
      return "tile rows must be a multiple of the loader's rows per step";
  }
  return nullptr;
}

// The tile table: the config each kernel head dim's backward is built with. 0 head_dim: none.
// Per-thread accumulators: dk + dv hold 2 * 16 * kv_cols / 32 = kv_cols floats; the score tiles
// of the dk/dv kernel 2 * kv_block_m / 2; the dq kernel's dq head_dim / 2 and its score tiles
// q_block_n. They must stay well under 255 registers.
constexpr BwdConfig default_bwd_config(int head_dim) {
  switch (head_dim) {
    case 32: return {.head_dim = 32, .kv_warps = 8, .kv_block_m = 64, .q_warps = 4, .q_block_n = 128};
    // 4 dk/dv warps: two or more CTAs per SM, the backward 7-13% faster than with 8.
    case 64: return {.head_dim = 64, .kv_warps = 4, .kv_block_m = 64, .q_warps = 4, .q_block_n = 128};
    case 96: return {.head_dim = 96, .kv_warps = 8, .kv_block_m = 64, .q_warps = 4, .q_block_n = 64};
    // 4 dk/dv warps (64 keys, 96 KB): two CTAs per SM, 10% less dk/dv time than 8 (H100, 16k).
    case 128: return {.head_dim = 128, .kv_warps = 4, .kv_block_m = 64, .q_warps = 4, .q_block_n = 64};
    // d_split 3, not 2: a 96-column part would straddle the 64-column shared-memory row atoms.
    case 192: return {.head_dim = 192, .kv_warps = 4, .kv_block_m = 64, .d_split = 3, .q_warps = 4, .q_block_n = 64};
    // dq: 8 warps (128 queries) over 32-key blocks, 4-10% less dq time than 4 warps over 64.
    case 256: return {.head_dim = 256, .kv_warps = 4, .kv_block_m = 64, .d_split = 2, .q_warps = 8, .q_block_n = 32};
    default: return {.head_dim = 0, .kv_warps = 0, .kv_block_m = 0, .q_warps = 0, .q_block_n = 0};
  }
}

}  // namespace flashcute::sm80
