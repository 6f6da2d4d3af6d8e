// flashcute/sm90/config.hpp: the static configuration of an sm90a (wgmma + TMA) forward kernel.
//
// One FwdConfig value describes a kernel; validate() lists the rules it must follow, and
// default_fwd_config() is the tile table each kernel head dim is built with. The CTA is one
// producer warpgroup (its first warp issues the TMA loads) and block_m / 64 consumer warpgroups,
// each computing 64 query rows with wgmma.
#pragma once

#include <cstdint>

#include "flashcute/common/types.hpp"

namespace flashcute::sm90 {

// What a kernel reads, besides its config (FwdTraits, traits.hpp):
// - kFixed: a fixed-length batch;
// - kVarlen: a variable-length batch (cu_seqlens): each tile reads its sequence's rows and lengths
//   (WorkTile), the TMA tensors are one batch of total_q / total_k rows; the walk is the
//   fixed-length one over the longest sequence's tiles (sequences of equal length);
// - kVarlenMixed: the same batch, walked over the units of the sequences that exist
//   (TileScheduler::at_varlen; sequences of different lengths);
// - kKvcache: a KV cache, contiguous or paged: each tile reads its entry's key count
//   (cache_seqlens), and K and V come in boxes of kBoxRows keys, each from its page
//   (FwdMainloop::load_cache_block).
enum class FwdMode : uint8_t { kFixed, kVarlen, kVarlenMixed, kKvcache };

struct FwdConfig {
  int head_dim;    // columns of the Q/K/V tiles in shared memory
  int block_m;     // query rows per CTA: 64 per consumer warpgroup
  int block_n;     // keys per main-loop step (the N of Q K^T, the K of P V)
  int stages = 2;  // K and V shared-memory buffers each: the producer runs this far ahead
  // Q buffers. With 2, the producer loads the next tile's Q while this one's is still read, so the
  // consumers issue the next tile's first Q K^T right behind this tile's last P V and store O
  // while it runs (the epilogue under the tensor cores); with 1, the epilogue comes first.
  int q_stages = 1;
  // O staged through shared memory (stmatrix in, 16 bytes a thread out) instead of stored from
  // the accumulators in 4-byte pairs: 4x fewer global store instructions.
  bool o_smem = false;
  // Where there is no room for an O buffer (d 192, 256): O staged through the last key block's V
  // buffer instead, in passes of o_pass_cols() columns, and stored 16 bytes a thread: whole
  // 32-byte sectors, where 4-byte pairs from the accumulators write each sector in two halves.
  // The V buffer is released to the producer after the epilogue, not before.
  bool o_via_v = false;
  // Registers per thread after setmaxnreg: the producer gives up what the consumers take.
  int producer_regs = 24;
  int consumer_regs = 240;
  // The consumer warpgroups take turns to issue their GEMMs (two named barriers), so that one's
  // softmax runs while the other's GEMMs hold the tensor cores (FlashAttention-3's ping-pong).
  bool pingpong = false;

  constexpr int consumer_warpgroups() const { return block_m / 64; }
  // Columns of O one pass of the o_via_v epilogue stages: each consumer warpgroup writes its 64
  // rows into its own 1024-byte-aligned region of one V buffer. The widest of d, d/2, d/3, d/4
  // that is a multiple of 64 (whole 8-chunk groups for the 16-byte XOR swizzle) and fits; 0: none.
  constexpr int o_pass_cols() const {
    for (int parts = 1; parts <= 4; ++parts) {
      if (head_dim % parts != 0 || (head_dim / parts) % 64 != 0) continue;
      if (consumer_warpgroups() * o_region_bytes(head_dim / parts) <= block_n * head_dim * 2) return head_dim / parts;
    }
    return 0;
  }
  // One consumer warpgroup's region of a pass of `cols` columns: 64 rows of 2-byte elements,
  // rounded up to 1024 bytes.
  static constexpr int o_region_bytes(int cols) { return (64 * cols * 2 + 1023) / 1024 * 1024; }
  constexpr int num_threads() const { return 128 * (consumer_warpgroups() + 1); }
  // Registers per thread the kernel is compiled and launched with: __launch_bounds__(num_threads(),
  // 1) gives each thread 64K / num_threads(), rounded down to the allocation unit of 8, at most 255.
  constexpr int launch_regs() const {
    const int regs = 65536 / num_threads() / 8 * 8;
    return regs < 248 ? regs : 248;
  }
  // `q_stages` Q tiles, `stages` K and V tiles, the O tile if staged, 2-byte elements, plus the barriers.
  constexpr int smem_bytes() const {
    return ((q_stages + (o_smem ? 1 : 0)) * block_m + 2 * stages * block_n) * head_dim * 2 + 1024;
  }
};

// nullptr when cfg is valid, otherwise the first rule it breaks.
constexpr const char* validate(FwdConfig cfg) {
  if (cfg.head_dim % 32 != 0 || cfg.head_dim > kMaxHeadDim) return "head_dim must be a multiple of 32, at most 256";
  if (cfg.block_m != 128 && cfg.block_m != 192 && cfg.block_m != 256)
    return "block_m must be 128, 192 or 256 (2, 3 or 4 consumer warpgroups)";
  if (cfg.block_n % 16 != 0 || cfg.block_n < 16 || cfg.block_n > 256)
    return "block_n must be a multiple of 16 in [16, 256] (the N of one wgmma and a TMA box)";
  if (cfg.stages < 2) return "stages must be >= 2: the producer loads one block while the consumers use another";
  if (cfg.q_stages != 1 && cfg.q_stages != 2) return "q_stages must be 1 or 2";
  if (cfg.smem_bytes() > 227 * 1024) return "tiles exceed the 227 KB shared-memory limit";
  // setmaxnreg: multiples of 8 in [24, 256], and the CTA's total within the 64K register file.
  if (cfg.producer_regs % 8 != 0 || cfg.consumer_regs % 8 != 0 || cfg.producer_regs < 24 || cfg.consumer_regs > 256)
    return "register counts must be multiples of 8 in [24, 256]";
  // setmaxnreg moves registers only within what the CTA was launched with: num_threads() times
  // the per-thread count of __launch_bounds__(num_threads(), 1), 64K / num_threads() rounded down
  // to a multiple of 8 (168 for 384 threads). A warpgroup that asks for more waits forever.
  if (128 * (cfg.producer_regs + cfg.consumer_warpgroups() * cfg.consumer_regs) > cfg.launch_regs() * cfg.num_threads())
    return "the warpgroups' registers exceed what the CTA is launched with (launch_regs() x num_threads())";
  if (cfg.pingpong && cfg.consumer_warpgroups() != 2) return "pingpong takes turns between exactly 2 consumer warpgroups";
  if (cfg.o_via_v && (cfg.o_smem || cfg.q_stages != 1 || cfg.o_pass_cols() == 0))
    return "o_via_v needs one Q buffer, no O buffer, and a V buffer that holds 64 rows x 64 columns of O per consumer warpgroup";
  return nullptr;
}

// The tile table. Two consumer warpgroups of 64 rows each; the longest key block whose K and V
// double buffers fit beside Q, as FlashAttention-3 chose for these head dims (see perf-notes).
// Up to d 128 a second Q buffer fits too, and puts each tile's epilogue under the next tile's
// first Q K^T (up to +5.5% at 512-2k), and so does an O buffer for 16-byte stores (+7.6% at d 128
// 1k). d 64 instead takes four consumer warpgroups on 256 x 64 tiles, half as many tiles for the
// same work (a tile boundary, not a key block, is where d 64 lost to cuDNN; +7-9% at d 64 1k), at
// the most registers 640 threads allow them (4 x 112 + 24 within 96 a thread), with six K/V stages
// so that the warpgroups of a causal tile, which skip different numbers of its top blocks, need
// not wait for each other at its boundaries (+1.4% at causal 1k). docs/perf-notes.md, sm90 forward.
constexpr FwdConfig default_fwd_config(int head_dim) {
  switch (head_dim) {
    // Ping-pong at d 96 and 128, not at d 64: +1-5% at d 128, -1-5% at d 64 (same-machine A/B).
    case 32: return {.head_dim = 32, .block_m = 128, .block_n = 128, .q_stages = 2, .o_smem = true};
    case 64:
      return {.head_dim = 64, .block_m = 256, .block_n = 64, .stages = 6, .q_stages = 2, .o_smem = true,
              .consumer_regs = 112};
    case 96: return {.head_dim = 96, .block_m = 128, .block_n = 128, .q_stages = 2, .o_smem = true, .pingpong = true};
    case 128: return {.head_dim = 128, .block_m = 128, .block_n = 128, .q_stages = 2, .o_smem = true, .pingpong = true};
    case 192: return {.head_dim = 192, .block_m = 128, .block_n = 96, .o_via_v = true};
    // 80 keys, not 64: the Q K^T wgmma reads a fifth fewer shared-memory bytes per flop (+4.5-9%).
    case 256: return {.head_dim = 256, .block_m = 128, .block_n = 80, .o_via_v = true};
    default: return {.head_dim = 0, .block_m = 0, .block_n = 0};
  }
}

// The second tile table: a config for long sequences, where a head dim has one ({.head_dim = 0}
// elsewhere), built as a kernel of its own beside the first (src/kernel.cu.in; CMake's list of
// these head dims, _flashcute_sm90_long_head_dims, must match). d 64 on 192 x 128 tiles, three
// consumer warpgroups: more query rows share each K and V block, and three warpgroups' softmax
// and GEMMs interleave (against 128 x 128: +9-15% from 2k keys without a mask, but -15% at causal
// 1k; against the 256 x 64 tiles: equal at 2k-4k, +3-5% from 8k, without a mask).
constexpr FwdConfig long_fwd_config(int head_dim) {
  switch (head_dim) {
    case 64:
      return {.head_dim = 64, .block_m = 192, .block_n = 128, .q_stages = 2, .o_smem = true, .consumer_regs = 160};
    default: return {.head_dim = 0, .block_m = 0, .block_n = 0};
  }
}
// The KV-cache kernel's config: the first table's, with the producer's registers raised to 32
// where the consumers leave them (its page lookups and box loop spill in 24).
constexpr FwdConfig kvcache_fwd_config(int head_dim) {
  FwdConfig cfg = default_fwd_config(head_dim);
  FwdConfig more = cfg;
  more.producer_regs = 32;
  return validate(more) == nullptr ? more : cfg;
}

constexpr bool has_long_fwd_config(int head_dim) { return head_dim > 0 && long_fwd_config(head_dim).head_dim == head_dim; }

// Whether a call takes the long-sequence tiles where its head dim has them (FLASHCUTE_SM90_TILES
// unset or "auto"). A same-machine A/B (d 64, 192 x 128 against 128 x 128,
// seqlen_q = seqlen_k): without a mask equal at 1k and +9-15% from 2k; causal -15% at 1k, -9% at
// 2k, -3% at 4k and +2-4% from 8k, where the diagonal's masked blocks and the ragged last tile
// weigh less; once the softmax ran under the P V (which the 192-row tiles gained most from),
// +3.5% at causal 4k, so causal calls take them from 4k. Windows were not measured and keep
// the first table. `units` counts the long config's tiles (query tiles x heads x batch): each
// SM's persistent CTA should get two or more, or the larger tiles only leave SMs idle.
constexpr bool use_long_tiles(int64_t seqlen_q, int64_t seqlen_k, int64_t heads_batch, int window_left,
                              int window_right, int sms, int long_block_m) {
  const bool no_mask = window_left < 0 && window_right < 0;
  const bool causal = window_left < 0 && window_right == 0;
  if (!no_mask && !causal) return false;
  const int64_t min_len = causal ? 4096 : 2048;
  if (seqlen_q < min_len || seqlen_k < min_len || long_block_m <= 0) return false;
  const int64_t units = (seqlen_q + long_block_m - 1) / long_block_m * heads_batch;
  return sms <= 0 || units >= 2 * int64_t(sms);
}

// The backward (traits_bwd.hpp): a CTA owns block_n keys of one (batch, KV head) and walks the
// block_m-row query blocks that see them. Up to d 128 each MMA warpgroup owns 64 of the keys; above
// (split_d), dK and dV do not fit in registers that way, and each warpgroup owns head_dim /
// mma_wgs columns of dK, dV and dQ for all the keys, and block_n / mma_wgs keys of S and dP.
struct BwdConfig {
  int head_dim;     // columns of every tile in shared memory
  int block_m;      // query rows per step (the N of S^T, the K of dV and dK)
  int block_n;      // keys per CTA
  int stages = 2;   // Q and dO buffers each: the producer runs this far ahead
  int producer_regs = 24;
  int mma_regs = 240;
  bool split_d = false;  // the MMA warpgroups split dK, dV and dQ by head-dim columns
  int mma_wgs = 2;       // MMA warpgroups: block_n / 64 unless split_d
  // Not split_d: MMA warpgroup 1 computes all of dQ, so that dS goes from warpgroup 0 to 1 only
  // and 0 never waits for 1's half (traits_bwd.hpp); else each computes half.
  bool dq_one_wg = false;
  // Deterministic calls without a mask may walk the query blocks rotated (scheduler.hpp, BwdTile).
  // Kept at d 64 only: at d 128 it gained nothing (perf-notes, b28).
  bool rotate = false;
  // The main kernel persistent: one CTA an SM takes (key block, KV head, batch) tiles in order from
  // a counter, and loads a tile's K, V and Q/dO while the tile before stores dK and dV. Not with
  // dq_one_wg or split_d (d 64 measured 4-6% slower persistent: perf-notes, b33).
  bool persistent = false;
  constexpr int mma_warpgroups() const { return mma_wgs; }
  constexpr int num_threads() const { return 128 * (mma_warpgroups() + 1); }
};

// The tile table of the sm90 backward; head_dim 0: none for this head dim. d 192 and 256 take
// FlashAttention-3's 64-row steps with dK and dV split by columns: three warpgroups of 64 columns
// at d 192 (96 keys), two of 128 at d 256 (64 keys, so that two Q and dO stages fit).
constexpr BwdConfig default_bwd_config(int head_dim) {
  if (head_dim == 64) return {.head_dim = 64, .block_m = 128, .block_n = 128, .dq_one_wg = true, .rotate = true};
  if (head_dim == 128) return {.head_dim = 128, .block_m = 64, .block_n = 128, .persistent = true};
  if (head_dim == 192)
    return {.head_dim = 192, .block_m = 64, .block_n = 96, .producer_regs = 32, .mma_regs = 160, .split_d = true,
            .mma_wgs = 3};
  if (head_dim == 256) return {.head_dim = 256, .block_m = 64, .block_n = 64, .split_d = true};
  return {0, 0, 0};
}
constexpr bool has_bwd_config(int head_dim) { return default_bwd_config(head_dim).head_dim == head_dim; }

// A backward call's query rows rounded to 128, whole blocks of every block_m in the table: the
// workspace's row count per head.
constexpr int64_t bwd_padded_rows(int64_t seqlen_q) { return (seqlen_q + 127) / 128 * 128; }
// Over `rows` workspace rows (all heads), the add counts and the tile counter start these many
// floats after the dQ accumulator.
constexpr int64_t bwd_dq_counts_offset(int64_t rows, int kernel_head_dim) { return rows * kernel_head_dim; }
constexpr int64_t bwd_tile_counter_offset(int64_t rows, int kernel_head_dim) {
  return bwd_dq_counts_offset(rows, kernel_head_dim) + rows / 64;
}
// The float32 workspace of an sm90 backward: D = rowsum(dO o O) and the lse in log2 units, one
// per padded query row and head, then the dQ accumulator (padded rows x kernel head dim), then
// the deterministic mode's add counts (int32, one per 64 padded rows and head), then the persistent
// main kernel's tile counter (int32).
constexpr int64_t bwd_workspace_floats(int64_t batch, int64_t nheads, int64_t seqlen_q, int kernel_head_dim) {
  const int64_t rows = batch * nheads * bwd_padded_rows(seqlen_q);
  return rows == 0 ? 0 : 2 * rows + bwd_tile_counter_offset(rows, kernel_head_dim) + 1;
}
// A varlen batch of `batch` sequences and total_q queries: the same arrays, one run of rows a head
// in which sequence b starts at (cu_seqlens_q[b] + 128 b) rounded down to 128 (BwdBatch).
constexpr int64_t bwd_varlen_padded_rows(int64_t total_q, int64_t batch) {
  return bwd_padded_rows(total_q) + 128 * batch;
}
constexpr int64_t bwd_varlen_workspace_floats(int64_t batch, int64_t nheads, int64_t total_q, int kernel_head_dim) {
  return bwd_workspace_floats(1, nheads, bwd_varlen_padded_rows(total_q, batch), kernel_head_dim);
}

}  // namespace flashcute::sm90
