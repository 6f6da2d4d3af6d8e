// flashcute/sm80/kernel_fwd.hpp: the sm80 (mma.sync) forward attention kernel.
//
// One CTA computes a BLK_M x D tile of O for one (batch, head): it keeps its Q
// tile in shared memory (or, with FwdConfig::q_in_regs, each warp's rows in
// registers) and walks the visible K/V blocks from the last to the
// first, so the ragged and diagonal blocks (the only ones that need masking,
// with left windows' blocks at the far end) come first; with
// FwdConfig::mask_split the blocks in between run without mask code. K and V
// each have one shared-memory buffer, and the loads overlap
// the math: V[j] streams in during S = Q K[j]^T, and K[j-1] during the softmax
// and O += P V[j].
//
// The same kernel built from a FwdConfig with split_kv (sm80/launch_splitkv.hpp) is the KV-cache
// kernel: its CTA takes one of params.num_splits shares of the key blocks and writes a float32
// partial when there are several, K and V may be paged (gathered row by row through the block
// table), the key count comes from params.cache_seqlens, and K and V have kv_stages buffers
// each (step_kv).
#pragma once

#include <cute/tensor.hpp>

#include "flashcute/common/fragment.hpp"
#include "flashcute/common/mask.hpp"
#include "flashcute/common/merge.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/pdl.hpp"
#include "flashcute/common/seqlen.hpp"
#include "flashcute/common/softmax.hpp"
#include "flashcute/sm80/copy.hpp"
#include "flashcute/sm80/gemm.hpp"
#include "flashcute/sm80/traits.hpp"

// Lambdas in the kernel body must inline: a call would move the register tiles they
// touch to the stack.
#define FLASHCUTE_INLINE __attribute__((always_inline))

namespace flashcute::sm80 {

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinCtasPerSm)
    fwd_kernel(__grid_constant__ const FwdParams params) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  // The decode twin (Traits::kWarpSplit, a KV-cache call of at most kDecodeRows query rows):
  // every warp takes the tile's first 16 rows and its quarter of each key block, as if it were a
  // split of its own, and merge_warps merges the warps' results at the end. Rows stacked by warp
  // would leave three warps of four on rows that do not exist, each reading all of K and V.
  constexpr bool kWarpSplit = Traits::kWarpSplit;
  constexpr int kMmaN = kWarpSplit ? kBlockN / Traits::kNWarps : kBlockN;  // a warp's keys of a block
  using TileS = Shape<Int<kBlockM>, Int<kMmaN>>;  // the scores a warp's MMAs cover, rows by warp

  extern __shared__ __align__(128) char smem_buf[];

  // Heaviest causal tiles (largest m_block) go first, so the light ones fill the tail. The
  // KV-cache kernel's x is (split, m_block), splits outermost.
  const int m_blocks = Traits::kSplitKv ? int(gridDim.x) / params.num_splits : int(gridDim.x);
  const int split = Traits::kSplitKv ? int(blockIdx.x) / m_blocks : 0;
  const int m_block = m_blocks - 1 - (Traits::kSplitKv ? int(blockIdx.x) % m_blocks : int(blockIdx.x));
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int head_k = head / (params.nheads / params.nheads_k);
  const int tid = threadIdx.x;
  const FwdSeqlen seq(params, batch);  // this batch entry's extents and offsets
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.seqlen_q) return;  // varlen: this sequence is shorter than the grid's longest
  const int q_rows = seq.seqlen_q - m0;  // valid rows of this Q tile (may exceed kBlockM)

  // The key blocks any row of this tile can see: [n_block_min, n_block_max).
  const KeyMask mask{seq.seqlen_k, seq.seqlen_k - seq.seqlen_q, params.window_left, params.window_right};
  const int key_lo = max(0, mask.key_begin(m0));
  const int key_hi = mask.key_end(min(m0 + kBlockM, seq.seqlen_q) - 1);
  int n_block_min = key_lo / kBlockN;
  int n_block_max = key_hi > key_lo ? ceil_div(key_hi, kBlockN) : n_block_min;  // empty: O = 0, lse = -inf
  if constexpr (Traits::kSplitKv) {  // this split's share of the visible blocks (may be none)
    const int per_split = ceil_div(n_block_max - n_block_min, params.num_splits);
    const int first = n_block_min + split * per_split;
    n_block_max = min(n_block_max, first + per_split);
    n_block_min = min(first, n_block_max);
  }

  // Global memory, int64 offsets throughout.
  auto* q_ptr = static_cast<Element const*>(params.q) + seq.q_offset + head * params.q_head_stride;
  auto* k_ptr = static_cast<Element const*>(params.k) + seq.k_offset + head_k * params.k_head_stride;
  auto* v_ptr = static_cast<Element const*>(params.v) + seq.v_offset + head_k * params.v_head_stride;
  auto* o_ptr = static_cast<Element*>(params.o) + seq.o_offset + head * params.o_head_stride;
  Tensor mQ = make_tensor(make_gmem_ptr(q_ptr), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                          make_stride(params.q_row_stride, _1{}));  // (Sq,D)
  Tensor mK = make_tensor(make_gmem_ptr(k_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(params.k_row_stride, _1{}));  // (Sk,D)
  Tensor mV = make_tensor(make_gmem_ptr(v_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(params.v_row_stride, _1{}));  // (Sk,D)
  Tensor mO = make_tensor(make_gmem_ptr(o_ptr), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                          make_stride(params.o_row_stride, _1{}));  // (Sq,D)
  Tensor gQ = local_tile(mQ, TileQ{}, make_coord(m_block, 0));  // (BLK_M,D)
  Tensor gK = local_tile(mK, TileKV{}, make_coord(_, 0));       // (BLK_N,D,n_blocks)
  Tensor gV = local_tile(mV, TileKV{}, make_coord(_, 0));       // (BLK_N,D,n_blocks)
  Tensor gO = local_tile(mO, TileQ{}, make_coord(m_block, 0));  // (BLK_M,D)

  // Shared memory: Q | K | V; O reuses Q's buffer at the end.
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem_buf)), typename Traits::SmemLayoutQ{});  // (BLK_M,D)
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});                                // (BLK_N,D)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});                                // (BLK_N,D)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});                                          // (D,BLK_N)
  // The KV-cache kernel keeps kKvStages (K, V) pairs (Q | K0 | V0 | K1 | V1 | ...; block n uses
  // pair n % kKvStages): the next blocks' pairs stream in during this block's math, so that a CTA,
  // one to an SM, does not wait on one tile at a time (docs/perf-notes.md, decode).
  constexpr int kKvStages = Traits::kKvStages;
  const int64_t stage_elems = 2 * int64_t(size(sK));  // from a pair's K (or V) to the next pair's
  auto stage_of = [&](int n_block) { return kKvStages == 1 ? 0 : n_block % kKvStages; };  // n_block >= 0
  auto at_stage = [&](auto const& t, int stage) { return make_tensor(t.data() + stage * stage_elems, t.layout()); };
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});                                            // (BLK_M,D)

  // Global -> shared: cp.async partitions, plus (row, col) coordinates for predication.
  typename Traits::GmemTiledCopyQKV gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tid);
  Tensor tQgQ = gmem_thr_copy.partition_S(gQ);  // (CPY,CPY_M,CPY_K)
  Tensor tQsQ = gmem_thr_copy.partition_D(sQ);  // (CPY,CPY_M,CPY_K)
  Tensor tKgK = gmem_thr_copy.partition_S(gK);  // (CPY,CPY_N,CPY_K,n_blocks)
  Tensor tKsK = gmem_thr_copy.partition_D(sK);  // (CPY,CPY_N,CPY_K)
  Tensor tVgV = gmem_thr_copy.partition_S(gV);  // (CPY,CPY_N,CPY_K,n_blocks)
  Tensor tVsV = gmem_thr_copy.partition_D(sV);  // (CPY,CPY_N,CPY_K)
  Tensor cQ = make_identity_tensor(TileQ{});    // (BLK_M,D) -> (row,col)
  Tensor cKV = make_identity_tensor(TileKV{});  // (BLK_N,D) -> (row,col)
  Tensor tQcQ = gmem_thr_copy.partition_S(cQ);     // (CPY,CPY_M,CPY_K)
  Tensor tKVcKV = gmem_thr_copy.partition_S(cKV);  // (CPY,CPY_N,CPY_K)

  // K and V block loads. A paged cache (KV-cache kernel only) gathers each row from its page:
  // row r of block n is key n * kBlockN + r, on its page instead of r rows past the base. A row
  // on a page outside the cache is not read: its K row is NaN, so exactly the query rows that see
  // the key get NaN scores (the mask overwrites the others with -inf), and its V row is zero, so
  // P = 0 keeps the rows that do not see it finite.
  // The prologue's K loads look their rows' pages up in the block table, and the V load of the
  // same block, issued right after, reuses them from row_page. In the main loop step_kv has put
  // the block's slots in s_slots (one thread a page, read from the table during the step before):
  // for each page the block touches, the addresses of its first key there in K and in V (0: not
  // in the cache), so that a row's address is a shared-memory load and a multiply-add
  // (docs/perf-notes.md, decode). The paged decode twin (KvLayout::kPaged) finds the prologue's
  // rows through slots too, a slot region per block.
  constexpr KvLayout kLayout = Traits::kKvLayout;
  const bool paged = Traits::kSplitKv && (kLayout == KvLayout::kPaged ||
                                          (kLayout == KvLayout::kAny && params.block_table != nullptr));
  const PagedKv pages(params, batch);  // read only when paged
  int row_page[decltype(size<1>(tKVcKV))::value];  // the page of each row this thread loads
  // (kKvStages, kBlockN / 16, 2): the slots of kKvStages blocks, K's address then V's
  static_assert(Traits::kPageSlotsOffset % 8 == 0, "the page slots are 8-byte words");
  constexpr int kSlotWords = 2 * (kBlockN / 16);  // one block's slots: pages hold at least 16 keys
  uint64_t* s_slots = reinterpret_cast<uint64_t*>(smem_buf + Traits::kPageSlotsOffset);
  constexpr std::true_type kSlots{};     // a paged load finds its rows through s_slots (main loop)
  constexpr std::false_type kNoSlots{};  // ... through the block table (prologue), or not paged
  // The slots (K, V) of the page the table gave as `page`, for key0, the block's first key on it.
  auto slots_of = [&](int page, int key0) FLASHCUTE_INLINE {
    const auto slot = [&](Element const* base, int64_t page_stride, int64_t row_stride) {
      return pages.valid(page) ? reinterpret_cast<uint64_t>(base + pages.offset(page, key0, page_stride, row_stride))
                               : uint64_t{0};
    };
    return cute::make_tuple(slot(k_ptr, params.k_batch_stride, params.k_row_stride),
                            slot(v_ptr, params.v_batch_stride, params.v_row_stride));
  };
  auto load_kv = [&](auto& tXgX, auto& tXsX, Element const* base, int n_block, auto check_rows_tag, int max_rows,
                     int64_t page_stride, int64_t row_stride, auto is_k_tag, auto from_slots_tag,
                     int slot_region) FLASHCUTE_INLINE {
    constexpr bool kCheckRows = decltype(check_rows_tag)::value;
    [[maybe_unused]] constexpr bool kIsK = decltype(is_k_tag)::value;  // K: look the pages up, NaN-fill bad rows
    [[maybe_unused]] constexpr bool kFromSlots = decltype(from_slots_tag)::value;
    if constexpr (Traits::kSplitKv) {
      if (paged) {
        auto row_at = [&](int m, int r) {
          if constexpr (kFromSlots) {  // block row r is r rows past its slot's first key on the page
            const uint64_t first = s_slots[slot_region * kSlotWords + 2 * (r >> pages.log2) + (kIsK ? 0 : 1)];
            const uint64_t row = first + pages.on_page(r) * uint64_t(row_stride * sizeof(Element));
            return GatherRow<Element>{reinterpret_cast<Element const*>(row), first != 0};
          } else {
            const int key = n_block * kBlockN + r;
            if (kIsK) row_page[m] = pages.page_of(key);
            return GatherRow<Element>{base + pages.offset(row_page[m], key, page_stride, row_stride),
                                      pages.valid(row_page[m])};
          }
        };
        // Through the slots every row of the block has an address (a slot region holds all the
        // block's pages), so no row needs a branch.
        load_tile_gather<kCheckRows, kIsK, kFromSlots>(tXgX(_, _, _, 0), tXsX, tKVcKV, row_at, max_rows,
                                                       params.head_dim);
        return;
      }
    }
    load_tile<kCheckRows>(gmem_tiled_copy, tXgX(_, _, _, n_block), tXsX, tKVcKV, max_rows, params.head_dim);
  };
  auto load_k = [&](int n_block, auto check_rows_tag, int max_rows, auto from_slots_tag,
                    int slot_region = 0) FLASHCUTE_INLINE {
    auto tKsK_stage = at_stage(tKsK, stage_of(n_block));
    load_kv(tKgK, tKsK_stage, k_ptr, n_block, check_rows_tag, max_rows, params.k_batch_stride, params.k_row_stride,
            std::true_type{}, from_slots_tag, slot_region);
  };
  auto load_v = [&](int n_block, auto check_rows_tag, int max_rows, auto from_slots_tag,
                    int slot_region = 0) FLASHCUTE_INLINE {
    auto tVsV_stage = at_stage(tVsV, stage_of(n_block));
    load_kv(tVgV, tVsV_stage, v_ptr, n_block, check_rows_tag, max_rows, params.v_batch_stride, params.v_row_stride,
            std::false_type{}, from_slots_tag, slot_region);
  };

  // Tensor cores: register fragments and the ldmatrix views that fill them. thr_mma's rows are
  // stacked by warp (the epilogue's); the operands' are warp 0's in the decode twin.
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  const int warp = tid / 32;
  const int mma_tid = kWarpSplit ? tid % 32 : tid;
  const int warp_n0 = kWarpSplit ? warp * kMmaN : 0;  // the first key of this warp's part of a block
  auto warp_part = [&](auto const& t, auto tiler, auto coord) {  // this warp's keys of a K or V^T tile
    if constexpr (kWarpSplit) return local_tile(t, tiler, coord); else return t;
  };
  Tensor sK_mma = warp_part(sK, Shape<Int<kMmaN>, Int<kHeadDim>>{}, make_coord(warp, 0));    // (MMA_N keys,D)
  Tensor sVt_mma = warp_part(sVt, Shape<Int<kHeadDim>, Int<kMmaN>>{}, make_coord(0, warp));  // (D,MMA_N keys)
  auto thr_mma_op = tiled_mma.get_thread_slice(mma_tid);
  Tensor tSrQ = thr_mma_op.partition_fragment_A(sQ);        // (MMA,MMA_M,MMA_K)
  Tensor tSrK = thr_mma_op.partition_fragment_B(sK_mma);    // (MMA,MMA_N,MMA_K)
  Tensor tOrVt = thr_mma_op.partition_fragment_B(sVt_mma);  // (MMA,MMA_D,MMA_N)
  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_copy_q = smem_copy_q.get_thread_slice(mma_tid);
  auto smem_thr_copy_k = smem_copy_k.get_thread_slice(mma_tid);
  auto smem_thr_copy_v = smem_copy_v.get_thread_slice(mma_tid);
  Tensor tSsQ = smem_thr_copy_q.partition_S(sQ);          // (CPY,MMA_M,MMA_K)
  Tensor tSrQ_view = smem_thr_copy_q.retile_D(tSrQ);      // (CPY,MMA_M,MMA_K)
  Tensor tSsK = smem_thr_copy_k.partition_S(sK_mma);      // (CPY,MMA_N,MMA_K)
  Tensor tSrK_view = smem_thr_copy_k.retile_D(tSrK);      // (CPY,MMA_N,MMA_K)
  Tensor tOsVt = smem_thr_copy_v.partition_S(sVt_mma);    // (CPY,MMA_D,MMA_N)
  Tensor tOrVt_view = smem_thr_copy_v.retile_D(tOrVt);    // (CPY,MMA_D,MMA_N)

  Tensor acc_o = partition_fragment_C(tiled_mma, TileQ{});  // (MMA,MMA_M,MMA_D), fp32
  Tensor acc_o_rc = rowcol_view(acc_o);                     // ((2,MMA_M),(2,MMA_D))
  Tensor tScS = rowcol_view(thr_mma_op.partition_C(make_identity_tensor(TileS{})));  // ((2,MMA_M),(2,MMA_N)) -> (row,col)
  clear(acc_o);

  CUTE_STATIC_ASSERT_V(size<1>(tSrQ) == size<1>(acc_o));            // both cover this warp's rows
  CUTE_STATIC_ASSERT_V(size<2>(tSrQ) == Int<kHeadDim / 16>{});       // k16 slices of the head dim
  CUTE_STATIC_ASSERT_V(size<2>(tOrVt) == Int<kMmaN / 16>{});         // k16 slices of a warp's keys of a block

  // Prologue: Q and the last (possibly ragged) K block.
  if constexpr (kLayout == KvLayout::kPaged) {
    // The paged twin: the slots of the prologue's kKvStages blocks (region i for block
    // n_block_max - 1 - i), one thread a page, the table read before Q's copies are issued; then
    // the blocks' K and V in one loop, rows checked in each (only the first is ragged): a decode
    // CTA fetches this code cold, so one copy of the loads beats one a block (docs/perf-notes.md, decode).
    static_assert((kBlockN & (kBlockN - 1)) == 0, "paged key blocks are a power of two");
    constexpr int kLog2BlockN = int(cute::log_2(unsigned(kBlockN)));
    const int log2_pages_a_block = max(0, kLog2BlockN - pages.log2);  // pages hold at least 16 keys
    const int region = tid >> log2_pages_a_block;
    const int on_block = tid & ((1 << log2_pages_a_block) - 1);
    const bool fetch = region < kKvStages;
    int page = 0, key0 = 0;
    if (fetch) {  // this thread's page's first key in its block; the table index is clamped into the table
      key0 = max(n_block_max - 1 - region, 0) * kBlockN + (on_block << pages.log2);
      page = pages.page_of(key0);
    }
    load_tile<true>(gmem_tiled_copy, tQgQ, tQsQ, tQcQ, q_rows, params.head_dim);
    // Launched as the append's dependent (below); the block table is not the append's to write.
    wait_for_primary();
    if (fetch) {
      const auto slots = slots_of(page, key0);
      s_slots[region * kSlotWords + 2 * on_block] = cute::get<0>(slots);
      s_slots[region * kSlotWords + 2 * on_block + 1] = cute::get<1>(slots);
    }
    // The prologue's slots are stored for every thread.
    __syncthreads();
#pragma unroll 1
    for (int i = 0; i < kKvStages; ++i) {
      const int n_block = n_block_max - 1 - i;
      const int rows = min(kBlockN, seq.seqlen_k - n_block * kBlockN);
      if (n_block >= n_block_min) load_k(n_block, std::true_type{}, rows, kSlots, i);
      cp_async_fence();
      if (n_block >= n_block_min) load_v(n_block, std::true_type{}, rows, kSlots, i);
      cp_async_fence();
    }
  } else {
    load_tile<true>(gmem_tiled_copy, tQgQ, tQsQ, tQcQ, q_rows, params.head_dim);
    // After an append (sm80/kernel_kvcache.hpp) the KV-cache kernel is launched as its dependent
    // (launch_fwd.hpp): it reads K and V once the append has written them.
    if constexpr (Traits::kSplitKv) wait_for_primary();
    if constexpr (Traits::kQInRegs) cp_async_fence();  // Q in a group of its own
    if (n_block_max > n_block_min) {
      const int n0 = (n_block_max - 1) * kBlockN;
      load_k(n_block_max - 1, std::true_type{}, seq.seqlen_k - n0, kNoSlots);
    }
    cp_async_fence();
    if constexpr (Traits::kSplitKv) {
      // The KV-cache kernel keeps kKvStages (K, V) pairs in flight: the last block's V, then the
      // pairs before it, each tile a group of its own (step_kv counts them).
      if (n_block_max > n_block_min) {
        const int n0 = (n_block_max - 1) * kBlockN;
        load_v(n_block_max - 1, std::true_type{}, seq.seqlen_k - n0, kNoSlots);
      }
      cp_async_fence();
      CUTE_UNROLL
      for (int i = 1; i < kKvStages; ++i) {
        const int n_block = n_block_max - 1 - i;
        if (n_block >= n_block_min) load_k(n_block, std::false_type{}, kBlockN, kNoSlots);
        cp_async_fence();
        if (n_block >= n_block_min) load_v(n_block, std::false_type{}, kBlockN, kNoSlots);
        cp_async_fence();
      }
    }
  }
  if constexpr (Traits::kQInRegs) {
    cp_async_wait<1>();
    // Q has landed for every thread (K may still be in flight); each warp then reads its
    // own rows into registers, once.
    __syncthreads();
    copy(smem_copy_q, tSsQ, tSrQ_view);
  }

  // Softcap: scores = softcap * tanh(s * scale / softcap); the softmax then scales by softcap.
  const bool use_softcap = params.softcap > 0.f;
  const float softcap_prescale = use_softcap ? params.softmax_scale / params.softcap : 0.f;
  constexpr float kLog2e = 1.4426950408889634f;
  OnlineSoftmax<decltype(size<0>(acc_o_rc))::value> softmax((use_softcap ? params.softcap : params.softmax_scale) * kLog2e);

  // One main-loop step at key block n_block (the forward kernel's); kMasked: apply the mask where
  // the block needs it.
  auto step = [&](int n_block, auto masked_tag) FLASHCUTE_INLINE {
    constexpr bool kMasked = decltype(masked_tag)::value;
    const int n0 = n_block * kBlockN;
    Tensor acc_s = partition_fragment_C(tiled_mma, TileS{});  // (MMA,MMA_M,MMA_N), fp32
    clear(acc_s);

    cp_async_wait<0>();
    // K[n_block] (and, first time, Q) has landed for every thread; and every warp has
    // finished the previous P V, so sV is free to refill.
    __syncthreads();
    // Only the last block is ragged; Traits::kBranchFreeRefill row-predicates every block instead.
    if (Traits::kBranchFreeRefill || n0 + kBlockN > seq.seqlen_k) {
      load_v(n_block, std::true_type{}, seq.seqlen_k - n0, kNoSlots);
    } else {
      load_v(n_block, std::false_type{}, kBlockN, kNoSlots);
    }
    cp_async_fence();

    // S = Q K^T
    if constexpr (Traits::kQInRegs) {
      gemm_rs(tiled_mma, acc_s, tSrQ, tSrK, tSsK, tSrK_view, smem_copy_k);
    } else {
      gemm_ss(tiled_mma, acc_s, tSrQ, tSrK, tSsQ, tSsK, tSrQ_view, tSrK_view, smem_copy_q, smem_copy_k);
    }
    if (use_softcap) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) acc_s(i) = tanhf(acc_s(i) * softcap_prescale);
    }
    Tensor scores = rowcol_view(acc_s);  // ((2,MMA_M),(2,MMA_N))
    if constexpr (kMasked) {
      if (mask.tile_needs_mask(m0, kBlockM, n0, kBlockN)) mask.apply(scores, tScS, m0, n0);
    }

    cp_async_wait<0>();
    // V[n_block] has landed for every thread; and every warp has finished Q K^T, so
    // sK is free for the next block's keys.
    __syncthreads();
    // The next block's keys (never ragged: only the last block is, and it was loaded first).
    if constexpr (Traits::kBranchFreeRefill) {
      // After the final block this loads zero rows; nothing reads sK after that.
      load_k(max(n_block - 1, 0), std::true_type{}, n_block > n_block_min ? kBlockN : 0, kNoSlots);
    } else if (n_block > n_block_min) {
      load_k(n_block - 1, std::false_type{}, kBlockN, kNoSlots);
    }
    cp_async_fence();

    // P = exp(S - max), O = O * rescale + P V
    softmax.update(scores, acc_o_rc);
    Tensor rP = convert_fragment<Element>(acc_s);                    // (MMA,MMA_M,MMA_N)
    Tensor tOrP = make_tensor(rP.data(), acc_to_a_layout(rP.layout()));  // ((2,2,2),MMA_M,MMA_N/2)
    gemm_rs(tiled_mma, acc_o, tOrP, tOrVt, tOsVt, tOrVt_view, smem_copy_v);
  };

  // The KV-cache kernel's step: K and V in kKvStages buffer pairs (pair n % kKvStages); the
  // next blocks' pairs stream in during this block's math, and block n - kKvStages is issued as
  // soon as this block's pair is free. 2 * kKvStages tile groups are in flight at its start: K[n],
  // V[n], K[n-1], V[n-1], ...
  auto step_kv = [&](int n_block) FLASHCUTE_INLINE {
    const int n0 = n_block * kBlockN;
    const int stage = stage_of(n_block);
    const int n_next = n_block - kKvStages;  // the block this step's pair takes next
    Tensor acc_s = partition_fragment_C(tiled_mma, TileS{});  // (MMA,MMA_M,MMA_N), fp32
    clear(acc_s);
    // Paged: block n_next's slots, one thread a page, read from the table here and stored to
    // s_slots after Q K^T.
    const bool fetch_page = paged && n_next >= n_block_min && tid <= ((kBlockN - 1) >> pages.log2);
    const int next_page =
        fetch_page ? pages.table[min(pages.index_of(n_next * kBlockN) + tid, pages.max_pages - 1)] : 0;
    cp_async_wait<2 * kKvStages - 1>();
    // K[n_block] (and, first time, Q) has landed for every thread.
    __syncthreads();
    gemm_ss(tiled_mma, acc_s, tSrQ, tSrK, tSsQ, at_stage(tSsK, stage), tSrQ_view, tSrK_view, smem_copy_q,
            smem_copy_k);
    if (use_softcap) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) acc_s(i) = tanhf(acc_s(i) * softcap_prescale);
    }
    Tensor scores = rowcol_view(acc_s);  // ((2,MMA_M),(2,MMA_N))
    if (mask.tile_needs_mask(m0, kBlockM, n0, kBlockN)) mask.apply(scores, tScS, m0, n0 + warp_n0);
    // The fetched slots, once the table entry has had Q K^T's time to arrive. The loads of the
    // step before read the old slots before the barrier above.
    if (fetch_page) {
      // The block's first key on this thread's page.
      const auto slots = slots_of(next_page, n_next * kBlockN + (tid << pages.log2));
      s_slots[2 * tid] = cute::get<0>(slots);
      s_slots[2 * tid + 1] = cute::get<1>(slots);
    }
    cp_async_wait<2 * kKvStages - 2>();
    // V[n_block] has landed for every thread.
    __syncthreads();
    softmax.update(scores, acc_o_rc);
    Tensor rP = convert_fragment<Element>(acc_s);                        // (MMA,MMA_M,MMA_N)
    Tensor tOrP = make_tensor(rP.data(), acc_to_a_layout(rP.layout()));  // ((2,2,2),MMA_M,MMA_N/2)
    gemm_rs(tiled_mma, acc_o, tOrP, tOrVt, at_stage(tOsVt, stage), tOrVt_view, smem_copy_v);
    // Every warp is done with this stage's K and V: they take block n_next, whose slots are in
    // s_slots.
    __syncthreads();
    if (n_next >= n_block_min) load_k(n_next, std::false_type{}, kBlockN, kSlots);
    cp_async_fence();
    if (n_next >= n_block_min) load_v(n_next, std::false_type{}, kBlockN, kSlots);
    cp_async_fence();
  };

  // Main loop, last key block first.
  if constexpr (Traits::kSplitKv) {
    for (int n_block = n_block_max - 1; n_block >= n_block_min; --n_block) step_kv(n_block);
  } else if constexpr (!Traits::kMaskSplit) {
    for (int n_block = n_block_max - 1; n_block >= n_block_min; --n_block) step(n_block, std::true_type{});
  } else {
    // Blocks [n_full_min, n_full_max) are visible to every row of the tile: they run with no
    // mask code, so no branch for it sits between Q K^T and the softmax. The masked blocks
    // above them (ragged, diagonal) come first in the walk, those below (left window) last.
    const int n_full_max = max(n_block_min, min(n_block_max, mask.key_end(m0) / kBlockN));
    const int n_full_min =
        min(n_full_max, max(n_block_min, ceil_div(max(0, mask.key_begin(m0 + kBlockM - 1)), kBlockN)));
    int n_block = n_block_max - 1;
    for (; n_block >= n_full_max; --n_block) step(n_block, std::true_type{});
    for (; n_block >= n_full_min; --n_block) step(n_block, std::false_type{});
    for (; n_block >= n_block_min; --n_block) step(n_block, std::true_type{});
  }

  // The combine after a KV-cache kernel (sm80/kernel_kvcache.hpp) may start once every CTA is here;
  // it waits for this grid's end before reading. Not at the kernel's start: the combine's CTAs,
  // resident that early, slowed paged calls (docs/perf-notes.md, decode).
  if constexpr (Traits::kSplitKv) allow_dependents();

  // Epilogue: normalise, stage O through shared memory, store 16 B per thread.
  float lse[decltype(size<0>(acc_o_rc))::value];
  softmax.finalize(acc_o_rc, lse);
  if constexpr (kWarpSplit) {
    // merge_warps: warps 1-3 hand their rows 0-15 (normalised O and lse, in fragment order, the
    // same in every warp) to warp 0 through the free K/V buffers, and warp 0 merges them into its
    // own as the combine kernel merges splits: weights e^(lse_w - lse), NaN kept. Warp 0's rows
    // are the tile's rows; the epilogue reads the other warps' as rows 16-63, past the call's.
    constexpr int kWarps = Traits::kNWarps;
    constexpr int kFrag = decltype(size(acc_o))::value;
    constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
    constexpr int kPart = (kFrag + kRows) * 32;  // one warp's partial: O, then lse, lane fastest
    float* red = reinterpret_cast<float*>(smem_buf + size(sQ) * int(sizeof(Element)));  // (kWarps - 1) partials
    static_assert((kWarps - 1) * kPart * 4 <= 2 * kBlockN * kHeadDim * int(sizeof(Element)),
                  "the warps' partials must fit the first K/V pair");
    const int lane = tid % 32;
    cp_async_wait<0>();
    // Every warp is done with K and V, and no cp.async writes them any more.
    __syncthreads();
    if (warp > 0) {
      float* mine = red + (warp - 1) * kPart + lane;
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        CUTE_UNROLL
        for (int j = 0; j < size<1>(acc_o_rc); ++j) mine[int(acc_o_rc.layout()(i, j)) * 32] = acc_o_rc(i, j);
        mine[(kFrag + i) * 32] = lse[i];
      }
    }
    // The partials are in shared memory before warp 0 reads them.
    __syncthreads();
    if (warp == 0) {
      float weight[kRows][kWarps];  // e^(lse_w - lse) for warp w's part of row i
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        float lse_w[kWarps];
        lse_w[0] = lse[i];
        CUTE_UNROLL
        for (int w = 1; w < kWarps; ++w) lse_w[w] = red[(w - 1) * kPart + (kFrag + i) * 32 + lane];
        lse[i] = merge_lse(lse_w, weight[i]);
      }
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        CUTE_UNROLL
        for (int j = 0; j < size<1>(acc_o_rc); ++j) {
          const int f = int(acc_o_rc.layout()(i, j));  // where the other warps put it
          float o = weight[i][0] * acc_o_rc(i, j);
          CUTE_UNROLL
          for (int w = 1; w < kWarps; ++w) o += weight[i][w] * red[(w - 1) * kPart + f * 32 + lane];
          acc_o_rc(i, j) = o;
        }
      }
    }
  }

  if constexpr (Traits::kSplitKv) {
    if (params.num_splits > 1) {
      // A partial: this split's normalised O and its lse, in float32, straight from the
      // accumulators (decode tiles are a few rows: no staging). The combine kernel reads them.
      const int64_t row0 = ((int64_t(split) * params.batch + batch) * params.nheads + head) * params.seqlen_q;
      float* oacc_ptr = params.o_accum + row0 * params.head_dim;
      Tensor tOcO_mma = rowcol_view(thr_mma.partition_C(cQ));  // ((2,MMA_M),(2,MMA_D)) -> (row,col)
      CUTE_UNROLL
      for (int i = 0; i < size<0>(acc_o_rc); ++i) {
        const int row = m0 + get<0>(tOcO_mma(i, 0));
        if (row >= seq.seqlen_q) continue;
        CUTE_UNROLL
        for (int j = 0; j < size<1>(acc_o_rc); j += 2) {  // (j, j + 1): adjacent columns
          const int col = get<1>(tOcO_mma(i, j));
          if (col < params.head_dim)
            *reinterpret_cast<float2*>(oacc_ptr + int64_t(row) * params.head_dim + col) =
                make_float2(acc_o_rc(i, j), acc_o_rc(i, j + 1));
        }
        if (get<1>(tOcO_mma(0, 0)) == 0) params.lse_accum[row0 + row] = lse[i];  // one thread per row
      }
      return;
    }
  }
  Tensor rO = convert_fragment<Element>(acc_o);  // (MMA,MMA_M,MMA_D)

  auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_copy_o = smem_copy_o.get_thread_slice(tid);
  Tensor taccOrO = smem_thr_copy_o.retile_S(rO);   // (CPY,MMA_M,MMA_D)
  Tensor taccOsO = smem_thr_copy_o.partition_D(sO);  // (CPY,MMA_M,MMA_D)
  cp_async_wait<0>();
  // Every warp is done reading sQ (its last Q K^T) and no cp.async into shared
  // memory is pending, so Q's buffer can take O.
  __syncthreads();
  copy(smem_copy_o, taccOrO, taccOsO);
  // The whole O tile is in shared memory before threads read rows other warps wrote.
  __syncthreads();

  typename Traits::GmemTiledCopyO gmem_tiled_copy_o;
  auto gmem_thr_copy_o = gmem_tiled_copy_o.get_thread_slice(tid);
  Tensor tOsO = gmem_thr_copy_o.partition_S(sO);  // (CPY,CPY_M,CPY_K)
  Tensor tOgO = gmem_thr_copy_o.partition_D(gO);  // (CPY,CPY_M,CPY_K)
  Tensor tOcO = gmem_thr_copy_o.partition_D(cQ);  // (CPY,CPY_M,CPY_K) -> (row,col)
  Tensor tOrO = make_tensor<Element>(shape(tOgO));  // (CPY,CPY_M,CPY_K)
  copy(gmem_tiled_copy_o, tOsO, tOrO);
  store_tile(gmem_tiled_copy_o, tOrO, tOgO, tOcO, q_rows, params.head_dim);

  if (params.lse != nullptr) {
    Tensor tOcO_mma = rowcol_view(thr_mma.partition_C(cQ));  // ((2,MMA_M),(2,MMA_D)) -> (row,col)
    if (get<1>(tOcO_mma(0, 0)) == 0) {  // one thread of each row's quad writes
      float* lse_ptr = params.lse + seq.lse_offset + head * params.lse_head_stride;
      CUTE_UNROLL
      for (int i = 0; i < size<0>(tOcO_mma); ++i) {
        const int row = m0 + get<0>(tOcO_mma(i, 0));
        if (row < seq.seqlen_q) lse_ptr[row] = lse[i];
      }
    }
  }
}

}  // namespace flashcute::sm80

#undef FLASHCUTE_INLINE
