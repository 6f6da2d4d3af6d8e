// flashcute/sm80/config.hpp: the static configuration of an sm80 (mma.sync) forward kernel.
//
// A kernel is fully described by one FwdConfig value, used directly as a template argument
// (C++20 structural type). validate() lists the rules every config must follow; a bad config fails
// to compile with the rule's message instead of producing a kernel that silently misbehaves.
// default_fwd_config() is the tile table: the config each kernel head dim is built with.
#pragma once

#include "flashcute/common/types.hpp"

namespace flashcute::sm80 {

// The caches a KV-cache kernel reads: either (params.block_table decides at run time), or one
// layout only, so that the kernel holds one kind of K/V load (the decode twins).
enum class KvLayout { kAny, kContiguous, kPaged };

struct FwdConfig {
  int head_dim;   // columns of Q/K/V tiles held in shared memory
  int block_m;    // query rows per CTA
  int block_n;    // key rows per main-loop step
  int num_warps;  // each warp owns block_m / num_warps query rows
  int min_ctas_per_sm = 1;  // __launch_bounds__ occupancy hint
  // Refill K/V without a branch around the load (predicated rows instead). Lets the
  // scheduler move the loads freely; costs registers, so it pays only where they are
  // not the limit (+3% at d 128, -7% at d 64 from spills; docs/perf-notes.md, sm80 forward).
  bool branch_free_refill = true;
  // Keep each warp's Q rows in registers for the whole main loop instead of re-reading them
  // from shared memory for every Q K^T: a third less ldmatrix traffic in Q K^T, for
  // head_dim / 2 registers per thread per 16-row MMA block, which fits only at small head dims.
  bool q_in_regs = false;
  // Run the key blocks that every row of the tile sees in full in a loop of their own, with
  // no mask code (and no branch for it), instead of one loop whose every step checks. A second
  // copy of the loop body: +1-2% where registers allow it, -3-4% at d 128 from spills.
  bool mask_split = false;
  // The KV-cache kernel (Variant::kSplitkv): a CTA takes its key blocks from one of
  // params.num_splits ranges and writes float32 partials when there are several; K and V may be
  // paged; each batch entry's key count comes from params.cache_seqlens.
  bool split_kv = false;
  // (K, V) tile pairs in flight: 1 (the forward kernel's single K and V buffers) or, for the
  // KV-cache kernel, 2 or more (block n uses pair n % kv_stages; step_kv).
  int kv_stages = 1;
  // The KV-cache kernel's decode twin, for calls of at most kDecodeRows query rows: every warp
  // takes those rows and a quarter of each key block, and the warps' partials are merged at the
  // end (instead of rows stacked by warp, three warps of four on rows that do not exist).
  bool warp_split = false;
  // The KV-cache kernel's caches. The decode twins are built once per layout: a decode CTA is
  // short and fetches its code cold, so the other layout's loads cost it time (docs/perf-notes.md,
  // decode, v39).
  KvLayout kv_layout = KvLayout::kAny;

  constexpr int num_threads() const { return num_warps * 32; }
  // Shared memory row atom: 64 halves (128 B) when the head dim allows, else 32 (64 B).
  constexpr int smem_atom_cols() const { return head_dim % 64 == 0 ? 64 : 32; }
  // Dynamic shared memory: the Q tile, kv_stages K and V tiles, then for the KV-cache kernel
  // kv_stages key blocks' page slots (pages hold at least 16 keys; a K and a V address each, 16
  // bytes) from page_slots_offset() on.
  constexpr int page_slots_offset(int element_bytes = 2) const {
    return (block_m + 2 * kv_stages * block_n) * head_dim * element_bytes;
  }
  constexpr int smem_bytes(int element_bytes = 2) const {
    return page_slots_offset(element_bytes) + (split_kv ? kv_stages * (block_n / 16) * 16 : 0);
  }
};

// Returns nullptr when cfg is valid, otherwise the first violated rule.
constexpr const char* validate(FwdConfig cfg) {
  if (cfg.head_dim % 32 != 0 || cfg.head_dim > kMaxHeadDim) return "head_dim must be a multiple of 32, at most 256";
  if (cfg.num_warps != 4 && cfg.num_warps != 8) return "num_warps must be 4 or 8";
  if (cfg.block_m % (16 * cfg.num_warps) != 0) return "block_m must be a multiple of 16 * num_warps (one m16 MMA row block per warp)";
  if (cfg.block_n % 16 != 0 || cfg.block_n < 32) return "block_n must be a multiple of 16, at least 32";
  if (cfg.split_kv ? cfg.kv_stages < 2 : cfg.kv_stages != 1)
    return "kv_stages must be 1, or at least 2 for the KV-cache kernel (split_kv)";
  if (cfg.warp_split && (!cfg.split_kv || cfg.num_warps != 4 || cfg.block_n % 64 != 0))
    return "warp_split needs split_kv, 4 warps and block_n a multiple of 64 (a warp's quarter in k16 steps)";
  if (cfg.kv_layout != KvLayout::kAny && !cfg.split_kv)
    return "kv_layout applies to the KV-cache kernel (split_kv) only";
  if (cfg.smem_bytes() > 227 * 1024) return "tiles exceed the 227 KB shared-memory limit";
  // The cp.async loader moves 16 B per thread per step; one step must cover whole rows.
  if ((cfg.num_threads() * 8) % cfg.smem_atom_cols() != 0) return "loader threads must tile a shared-memory row atom";
  if (cfg.block_n % (cfg.num_threads() * 8 / cfg.smem_atom_cols()) != 0) return "block_n must be a multiple of the loader's rows per step";
  if (cfg.block_m % (cfg.num_threads() * 8 / cfg.smem_atom_cols()) != 0) return "block_m must be a multiple of the loader's rows per step";
  return nullptr;
}

// The tile table: the config each kernel head dim is built with. 0 head_dim: no config.
constexpr FwdConfig default_fwd_config(int head_dim) {
  switch (head_dim) {
    // Q in registers: a third less ldmatrix traffic in Q K^T, measured +2-3% at d 32 and 64.
    case 32: return {.head_dim = 32, .block_m = 128, .block_n = 128, .num_warps = 4, .branch_free_refill = false,
                     .q_in_regs = true};
    // 128 x 64: ties 128 x 128 with no spills; Q in registers (+2-3%); split loop (+1.5-2%).
    case 64: return {.head_dim = 64, .block_m = 128, .block_n = 64, .num_warps = 4, .q_in_regs = true,
                     .mask_split = true};
    case 96: return {.head_dim = 96, .block_m = 128, .block_n = 64, .num_warps = 4};
    case 128: return {.head_dim = 128, .block_m = 128, .block_n = 64, .num_warps = 4};
    // 2 CTAs/SM; beats (128, 64, 8) up to 4k on the H200 once the loads are branch-free;
    // split loop (+1%). docs/perf-notes.md, sm80 forward, has the measurements.
    case 192: return {.head_dim = 192, .block_m = 64, .block_n = 64, .num_warps = 4, .mask_split = true};
    case 256: return {.head_dim = 256, .block_m = 64, .block_n = 64, .num_warps = 4, .mask_split = true};
    default: return {.head_dim = 0, .block_m = 0, .block_n = 0, .num_warps = 0};
  }
}

// The KV-cache (split-KV) kernels' tile table. Decoding has few query rows per (batch, KV
// head), so the tiles are short in M (64 rows, 16 per warp) and long in N: each CTA streams
// more key bytes per unit of tensor-core work. One CTA an SM (choose_num_splits counts on it).
// Key blocks of 256 at d 32, 128 up to d 128 (at d 64, 256 left a batch-1 split one block, and
// 128 measured faster there and on paged caches), 64 above.
constexpr FwdConfig default_splitkv_config(int head_dim) {
  FwdConfig cfg = default_fwd_config(head_dim);
  if (cfg.head_dim == 0) return cfg;
  cfg.block_m = 64;
  cfg.block_n = head_dim <= 32 ? 256 : (head_dim <= 128 ? 128 : 64);
  cfg.num_warps = 4;
  cfg.min_ctas_per_sm = 1;
  cfg.branch_free_refill = false;
  cfg.q_in_regs = false;
  cfg.mask_split = false;
  cfg.split_kv = true;
  // Two (K, V) pairs in flight; three measured slower (docs/perf-notes.md, decode).
  cfg.kv_stages = 2;
  return cfg;
}

// The decode twin (warp_split) takes calls of at most this many query rows (after the GQA
// packing of validate_kvcache.hpp): one m16 MMA row block.
inline constexpr int kDecodeRows = 16;
// Its tiles: the KV-cache kernel's. A kernel of its own, not a runtime branch of that one: with
// both loops in one kernel the decode loop sat past the other in the code, and each short-lived
// CTA stalled on instruction fetches (docs/perf-notes.md, decode). For the same reason one twin
// reads contiguous caches and another paged ones.
constexpr FwdConfig decode_splitkv_config(int head_dim, bool paged) {
  FwdConfig cfg = default_splitkv_config(head_dim);
  cfg.warp_split = cfg.head_dim != 0;
  cfg.kv_layout = cfg.head_dim == 0 ? KvLayout::kAny : (paged ? KvLayout::kPaged : KvLayout::kContiguous);
  return cfg;
}

}  // namespace flashcute::sm80
