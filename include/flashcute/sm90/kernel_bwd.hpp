// flashcute/sm90/kernel_bwd.hpp: the three kernels of the sm90a backward.
//
// 1. bwd_preprocess_kernel: per query row, D (rowsum(dO o O), or exact where the row sees few
//    keys: common/dsum.hpp) and the lse in log2 units (+inf where no key is seen, and on the
//    padding rows, so that P = 0 there), and the row's dQ accumulator zeroed (deterministic: and
//    its block's dQ add count).
// 2. bwd_kernel: one CTA per (key block, KV head, batch), warp-specialised: warpgroup 0's first
//    thread loads (BwdMainloop::load) and its second warp adds each step's dQ into the accumulator
//    (write_dq), warpgroups 1-2 compute (BwdMainloop::mma_wg) and store dK, dV. At d 192 and 256 the
//    MMA warpgroups (BwdMainloopSplitD::mma, two or three) add dQ themselves.
// 3. bwd_postprocess_kernel: dQ = softmax_scale * accumulator, from the fragment order the main
//    kernel adds it in, converted and stored through shared memory.
// The main kernel and the postprocess are launched as dependents of the kernel before them
// (common/pdl.hpp): each becomes resident as the one before drains and waits for it to finish.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "flashcute/common/dsum.hpp"
#include "flashcute/common/mask.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/pdl.hpp"
#include "flashcute/sm90/mainloop_bwd.hpp"
#include "flashcute/sm90/mainloop_bwd_split.hpp"
#include "flashcute/sm90/traits_bwd.hpp"

namespace flashcute::sm90 {

// One block of 64 query rows of the preprocess (bwd_preprocess_kernel), of batch entry `seq`.
// kExact: the block may hold rows that take the exact D; without it, every row takes dO . O.
template <class Element, int kHeadDim, bool kExact>
CUTE_DEVICE void bwd_preprocess_block(const BwdParams& p, const BwdBatch& seq, int m_block, int head, int batch,
                                      float* dpsum, float* lse2, float* dq_accum, int* dq_semaphore,
                                      int64_t padded_rows) {
  constexpr int kGroup = 4;
  const int m0 = m_block * 64;
  if (m0 >= bwd_padded_rows(seq.seqlen_q)) return;  // varlen: past this entry's query blocks
  const int i = int(threadIdx.x) / kGroup, part = int(threadIdx.x) % kGroup;
  const int row = m0 + i;
  const bool valid = row < seq.seqlen_q;
  const int r = valid ? row : 0;  // padding rows read nothing, but keep their pointers in bounds
  const float lse =
      valid ? p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + seq.q_start + row] : -INFINITY;
  const KeyMask mask = seq.mask(p);
  const int key_begin = cute::max(0, mask.key_begin(r)), key_end = cute::max(key_begin, mask.key_end(r));
  const bool exact = kExact && valid && !p.partial_keys && key_end - key_begin <= kExactDsumKeys;
  const int head_k = head / (p.nheads / p.nheads_k);
  // Row i of this batch entry (varlen: its batch strides are 0 and its rows start at q/k_start).
  auto at = [&](const void* base, int64_t batch_stride, int64_t row_stride, int64_t head_stride, int h, int at_row) {
    return static_cast<const Element*>(base) + batch * batch_stride + int64_t(at_row) * row_stride + h * head_stride;
  };
  const int qi = seq.q_start + r;
  const float d_o = row_dot<kGroup, kHeadDim>(at(p.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride, head, qi),
                                              at(p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, head, qi),
                                              valid && !exact ? p.head_dim : 0, part);
  float d = d_o;
  if constexpr (kExact) {
    using Exact = ExactDsum<Element>;
    __shared__ typename Exact::Storage exact_smem;
    const int q0 = seq.q_start + m0;
    const typename Exact::Args args{at(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, head, q0),
                                    at(p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, head, q0),
                                    at(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, head_k, seq.k_start),
                                    at(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, head_k, seq.k_start),
                                    p.q_row_stride,
                                    p.do_row_stride,
                                    p.k_row_stride,
                                    p.v_row_stride,
                                    seq.seqlen_q - m0,
                                    p.head_dim};
    d = Exact::dsum(d_o, exact, i, part, key_begin, key_end, lse, args, p, exact_smem);
  }
  const int64_t rows = seq.rows + int64_t(head) * padded_rows;  // workspace row of this head's row 0
  if (part == 0) {
    constexpr float kLog2e = 1.4426950408889634f;
    dpsum[rows + row] = d;
    lse2[rows + row] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
  if (dq_semaphore != nullptr && threadIdx.x == 0) dq_semaphore[(rows + m0) / 64] = 0;
  float4* acc = reinterpret_cast<float4*>(dq_accum + (rows + m0) * kHeadDim);
  for (int j = int(threadIdx.x); j < 64 * kHeadDim / 4; j += 256) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// Grid (the blocks of `blocks`, nheads, batch), 256 threads: four threads a row; two CTAs an SM
// at least (the exact pass would take 158 registers at d 128 otherwise). Without kExact (no row of
// its blocks takes the exact D) it needs 40 registers at d 64, and six CTAs fit an SM; on a varlen
// batch it then leaves each entry's exact-D blocks to bwd_preprocess_exact_kernel.
template <class Element, int kHeadDim, bool kExact>
__global__ void __launch_bounds__(256, 2) bwd_preprocess_kernel(const BwdParams p, BwdPreBlocks blocks, float* dpsum,
                                                             float* lse2, float* dq_accum, int* dq_semaphore,
                                                             int* tile_counter, int64_t padded_rows) {
  // Two copies of the block: in the fixed-length one the entry's lengths and offsets fold to the
  // params (one copy for both took d 64's causal preprocess from 0.17 to 0.27 ms).
  allow_dependents();  // the main kernel's CTAs wait for the whole grid (wait_for_primary)
  // The persistent main kernel's tile counter (BwdKernelParams::tile_counter).
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0) *tile_counter = 0;
  const int head = int(blockIdx.y), batch = int(blockIdx.z), m_block = blocks.block(int(blockIdx.x));
  if (p.cu_seqlens_q == nullptr) {
    bwd_preprocess_block<Element, kHeadDim, kExact>(p, BwdBatch(p, batch, padded_rows), m_block, head, batch, dpsum,
                                                    lse2, dq_accum, dq_semaphore, padded_rows);
  } else {
    const BwdBatch seq(p, batch, padded_rows);
    if constexpr (!kExact) {
      const BwdExactBlocks exact = bwd_exact_blocks(seq.seqlen_q, seq.mask(p), p.partial_keys,
                                                    int(bwd_padded_rows(seq.seqlen_q) / 64), kExactDsumKeys);
      if (m_block < exact.pre || m_block >= exact.post) return;
    }
    bwd_preprocess_block<Element, kHeadDim, kExact>(p, seq, m_block, head, batch, dpsum, lse2, dq_accum,
                                                    dq_semaphore, padded_rows);
  }
}

// A varlen batch's exact-D blocks, beside bwd_preprocess_kernel<false> (which skips them): each of
// a few CTAs an SM takes (batch entry, head) pairs in turn and runs that entry's blocks that
// bwd_exact_blocks names, so a batch with few such blocks costs few CTAs. Launched only where no
// entry has more than three (bwd_varlen_few_exact_blocks): a pair's blocks run one after another.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(256, 2) bwd_preprocess_exact_kernel(const BwdParams p, float* dpsum, float* lse2,
                                                                      float* dq_accum, int* dq_semaphore,
                                                                      int64_t padded_rows) {
  allow_dependents();
  for (int w = int(blockIdx.x); w < p.batch * p.nheads; w += int(gridDim.x)) {
    const int batch = w / p.nheads, head = w % p.nheads;
    const BwdBatch seq(p, batch, padded_rows);
    const int blocks = int(bwd_padded_rows(seq.seqlen_q) / 64);
    const BwdExactBlocks exact = bwd_exact_blocks(seq.seqlen_q, seq.mask(p), p.partial_keys, blocks, kExactDsumKeys);
    const BwdPreBlocks runs{exact.pre, exact.post};  // [0, pre), then [post, blocks)
    for (int j = 0; j < exact.pre + blocks - exact.post; ++j) {
      bwd_preprocess_block<Element, kHeadDim, true>(p, seq, runs.block(j), head, batch, dpsum, lse2, dq_accum,
                                                    dq_semaphore, padded_rows);
      __syncthreads();  // the next block's exact pass reuses the shared memory
    }
  }
}

// A main kernel CTA's start: its barriers initialised, then resident while the preprocess drains
// (every global access after it comes after the preprocess's end). The postprocess's CTAs may start
// once all of these have, on the SMs the last ones leave.
template <class Mainloop, class Storage>
CUTE_DEVICE void bwd_kernel_start(Storage& storage) {
  if (threadIdx.x == 0) Mainloop::init_barriers(storage);
  cutlass::arch::fence_barrier_init();
  __syncthreads();
  wait_for_primary();
  allow_dependents();
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) bwd_kernel(__grid_constant__ const BwdKernelParams<Traits> kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Mainloop = std::conditional_t<Traits::kSplitD, BwdMainloopSplitD<Traits>, BwdMainloop<Traits>>;
  static_assert(Traits::kNThreads == 128 * (1 + Traits::kMmaWarpgroups), "one producer warpgroup");
  extern __shared__ __align__(1024) char smem_buf[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem_buf);
  const BwdParams& p = kp.params;
  // Each role derives the tile after its register reconfiguration: held across it, a varlen
  // entry's fields would be spilled for the 24-register producer warps.
  const int n_block = bwd_n_block(p, int(blockIdx.x), int(gridDim.x));
  auto this_tile = [&] {
    return bwd_tile<Traits::kBlockM, Traits::kBlockN>(p, n_block, int(blockIdx.y), int(blockIdx.z), kp.padded_rows,
                                                      Traits::kConfig.rotate && kp.dq_rotate);
  };
  if (n_block * Traits::kBlockN >= BwdBatch(p, int(blockIdx.z), kp.padded_rows).seqlen_k)
    return;  // varlen: past this entry's keys
  bwd_kernel_start<Mainloop>(storage);
  const Mainloop mainloop(kp, storage);
  if (cutlass::canonical_warp_group_idx() == 0) {
    // Warp 0 loads (one thread), warp 1 writes dQ (split_d: counts the deterministic adds); the
    // others have nothing to do.
    cutlass::arch::warpgroup_reg_dealloc<Traits::kConfig.producer_regs>();
    const int warp = cutlass::canonical_warp_idx_sync();
    if (warp == 1) {
      const BwdTile tile = this_tile();
      if constexpr (Traits::kSplitD) {  // the MMA warps add dQ; deterministic: this warp counts the adds
        if (cute::elect_one_sync()) mainloop.release_dq(tile);
      } else {
        mainloop.write_dq(tile, tile.seq.mask(p));
      }
    }
    if (warp != 0 || !cute::elect_one_sync()) return;
    mainloop.load(this_tile());
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Traits::kConfig.mma_regs>();
  const BwdTile tile = this_tile();
  if constexpr (Traits::kSplitD)
    mainloop.mma(tile, tile.seq.mask(p), int(threadIdx.x) - 128);
  else if (!Traits::kDqOneWg || cutlass::canonical_warp_group_idx() == 1)  // dq_one_wg: a role an instance
    mainloop.template mma_wg<0>(tile, tile.seq.mask(p), int(threadIdx.x) - 128);
  else
    mainloop.template mma_wg<1>(tile, tile.seq.mask(p), int(threadIdx.x) - 128);
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// The main kernel, persistent (BwdConfig::persistent; two-way dQ, not split_d): gridDim.x CTAs,
// one an SM, take the tiles in the order of bwd_kernel's grid (key block fastest): the first at
// blockIdx.x, then from kp.tile_counter. Warp 0's thread loads and hands each tile index to the
// writer warp and the MMA warps through a two-slot ring; a tile's K and V load once the MMA warps
// are done with the previous tile's, while those stage its dK and dV in the dS buffers and store
// them (store_dkv).
template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_kernel_persistent(__grid_constant__ const BwdKernelParams<Traits> kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Mainloop = BwdMainloop<Traits>;
  // Two-way dQ only: persistent with dq_one_wg (d 64) measured 4-6% slower (perf-notes, b33).
  static_assert(Traits::kPersistent);
  extern __shared__ __align__(1024) char smem_buf[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem_buf);
  const BwdParams& p = kp.params;
  bwd_kernel_start<Mainloop>(storage);
  const Mainloop mainloop(kp, storage);
  const int n_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  const int tiles = n_blocks * p.nheads_k * p.batch;
  // Tile t's BwdTile (without keys where a varlen entry has none there: BwdTile::has_keys).
  auto tile_of = [&](int t) {
    const int block = t % n_blocks, head_k = t / n_blocks % p.nheads_k, batch = t / n_blocks / p.nheads_k;
    return bwd_tile<Traits::kBlockM, Traits::kBlockN>(p, bwd_n_block(p, block, n_blocks), head_k, batch,
                                                      kp.padded_rows, false);
  };
  if (cutlass::canonical_warp_group_idx() == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kConfig.producer_regs>();
    const int warp = cutlass::canonical_warp_idx_sync();
    if (warp == 1) {
      const bool leader = cute::elect_one_sync();
      mainloop.write_dq_begin();
      for (int i = 0;; ++i) {
        const int t = mainloop.read_tile(i);
        if (t >= tiles) break;
        const BwdTile tile = tile_of(t);
        if (tile.has_keys(Traits::kBlockN)) mainloop.write_dq(tile, tile.seq.mask(p), leader);
      }
      mainloop.write_dq_end(leader);
    }
    if (warp != 0 || !cute::elect_one_sync()) return;
    typename Mainloop::State st;
    int t = int(blockIdx.x), j = 0;
    for (int i = 0;; ++i) {
      mainloop.publish_tile(i, t);
      if (t >= tiles) break;
      const BwdTile tile = tile_of(t);
      if (tile.has_keys(Traits::kBlockN)) mainloop.load(tile, &st, j++);
      t = int(gridDim.x) + atomicAdd(kp.tile_counter, 1);
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Traits::kConfig.mma_regs>();
  const int mma_tid = int(threadIdx.x) - 128;
  // In a lambda, as measured (b33): written out in the kernel's body, the same code compiled to
  // another register allocation of the MMA warps (122 SASS differences).
  auto run = [&] {
    typename Mainloop::State st;
    int ds_buf = 0, j = 0;
    for (int i = 0;; ++i) {
      const int t = mainloop.read_tile(i);
      if (t >= tiles) break;
      const BwdTile tile = tile_of(t);
      if (tile.has_keys(Traits::kBlockN))
        mainloop.template mma_wg<0>(tile, tile.seq.mask(p), mma_tid, st, ds_buf, j++);
    }
    mainloop.template mma_end<0>(mma_tid);
  };
  run();
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// Grid (padded rows / BLK_M, nheads, batch), one thread per MMA thread of the main kernel: thread
// t reads values that thread t % kDqThreads of TiledMmaDQ added (coalesced, BwdTraits::kDqChunk
// order; where fewer threads computed dQ, every kParts-th pair), scales and converts them into a
// shared-memory tile where its fragment puts them, and the block stores the tile in 16-byte pieces
// of rows.
template <class Traits>
__global__ void __launch_bounds__(Traits::kMmaThreads) bwd_postprocess_kernel(const BwdParams p, const float* dq_accum,
                                                                             int64_t padded_rows) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kHeadDim = Traits::kHeadDim, kThreads = Traits::kMmaThreads;
  constexpr int kDqThreads = Traits::kDqThreads, kParts = kThreads / kDqThreads;
  static_assert(kThreads % kDqThreads == 0);
  constexpr int kPitch = kHeadDim + 8;  // a tile row in shared memory: 16 bytes of skew against bank conflicts
  __shared__ __align__(16) Element tile[kBlockM * kPitch];
  wait_for_primary();  // the main kernel's adds
  const int m0 = int(blockIdx.x) * kBlockM, head = int(blockIdx.y), batch = int(blockIdx.z);
  const BwdBatch seq(p, batch, padded_rows);
  if (m0 >= seq.seqlen_q) return;  // varlen: past this entry's queries
  const int t = int(threadIdx.x) % kDqThreads, part = int(threadIdx.x) / kDqThreads;
  typename Traits::TiledMmaDQ mma_dq;
  Tensor tQcQ = mma_dq.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  const float2* acc = reinterpret_cast<const float2*>(dq_accum + (seq.rows + int64_t(head) * padded_rows + m0) * kHeadDim +
                                                     t / 128 * Traits::kDqChunk) + t % 128;
  const float s = p.softmax_scale;
  CUTE_UNROLL
  for (int i = 0; i < size(tQcQ); i += 2) {
    if (kParts > 1 && i / 2 % kParts != part) continue;
    const float2 x = acc[i / 2 * 128];
    Element pair[2] = {Element(x.x * s), Element(x.y * s)};
    *reinterpret_cast<uint32_t*>(&tile[get<0>(tQcQ(i)) * kPitch + get<1>(tQcQ(i))]) =
        *reinterpret_cast<const uint32_t*>(pair);
  }
  __syncthreads();
  Element* dq = static_cast<Element*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
                int64_t(seq.q_start) * p.dq_row_stride;
  constexpr int kVecs = kHeadDim / 8;  // 16-byte pieces a row
  CUTE_UNROLL
  for (int v = int(threadIdx.x); v < kBlockM * kVecs; v += kThreads) {
    const int r = v / kVecs, c = v % kVecs * 8;
    if (m0 + r < seq.seqlen_q && c < p.head_dim)
      *reinterpret_cast<uint4*>(dq + (m0 + r) * p.dq_row_stride + c) =
          *reinterpret_cast<const uint4*>(&tile[r * kPitch + c]);
  }
}

}  // namespace flashcute::sm90
