// flashcute/sm80/kernel_bwd.hpp: the sm80 (mma.sync) backward attention kernels.
//
// With P = softmax(S) recomputed from the forward's lse, and D = rowsum(dO * O):
//   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ = dS K * scale,   dK = dS^T Q * scale
// (softcap multiplies dS by its tanh's derivative, 1 - t^2). Three kernels:
//   bwd_dsum_kernel  D for every query row (eight threads a row; exact where a row sees few keys,
//                    common/dsum.hpp);
//   bwd_dkdv_kernel  one CTA per key block (and head-dim part) of one KV head: keeps dK and dV in
//                    registers while it walks the query blocks of every query head of its group,
//                    computing S^T = K Q^T and dP^T = V dO^T directly in the transposed
//                    orientation, so P^T and dS^T are already the A operands of dV and dK;
//   bwd_dq_kernel    one CTA per query block: walks its key blocks like the forward does and
//                    accumulates dQ in registers.
// Every output element is written by exactly one CTA: no atomics, no zero-fill pass, and the same
// bits on every run. The price is S and dP computed twice (docs/perf-notes.md, sm80 backward).
#pragma once

#include <cute/tensor.hpp>

#include "flashcute/common/dsum.hpp"
#include "flashcute/common/fragment.hpp"
#include "flashcute/common/mask.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/seqlen.hpp"
#include "flashcute/common/softmax.hpp"
#include "flashcute/sm80/copy.hpp"
#include "flashcute/sm80/gemm.hpp"
#include "flashcute/sm80/traits_bwd.hpp"

#define FLASHCUTE_INLINE __attribute__((always_inline))

namespace flashcute::sm80 {

namespace bwd_detail {

constexpr float kLog2e = 1.4426950408889634f;

// The exponent base of row `lse`'s probabilities, in log2 units. A row that saw no key has
// lse = -inf; +inf makes its every probability exp2(x - inf) = 0 instead of NaN.
CUTE_DEVICE float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// The score scale of the exponent (log2 units) and of the softcap's tanh argument.
struct ScoreScale {
  bool softcap;
  float exp_scale;  // multiplies the score (or, with softcap, its tanh) inside exp2
  float prescale;   // softcap: the tanh argument's scale, softmax_scale / softcap

  CUTE_DEVICE explicit ScoreScale(const FwdParams& p)
      : softcap(p.softcap > 0.f),
        exp_scale((p.softcap > 0.f ? p.softcap : p.softmax_scale) * kLog2e),
        prescale(p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f) {}
};

// P and dS, in place, from the raw scores and dP of one tile (both accumulators of the same
// MMA, so element i of each is the same (row, col)): acc_s becomes P, acc_dp becomes dS (scaled
// by 1 - tanh^2 under softcap; softmax_scale is applied to dQ/dK at the end). lse2(i) and dsum(i)
// give element i's row statistics.
template <class AccS, class AccDp, class Lse2, class Dsum>
CUTE_DEVICE void probs_and_dscores(AccS& acc_s, AccDp& acc_dp, ScoreScale const& sc, Lse2&& lse2, Dsum&& dsum) {
  CUTE_UNROLL
  for (int i = 0; i < cute::size(acc_s); ++i) {
    float s = acc_s(i);
    float grad = 1.f;
    if (sc.softcap) {
      s = tanhf(s * sc.prescale);
      grad = 1.f - s * s;
    }
    const float p = exp2f(s * sc.exp_scale - lse2(i));
    acc_s(i) = p;
    acc_dp(i) = p * (acc_dp(i) - dsum(i)) * grad;
  }
}

// Scales an fp32 accumulator, converts it to Element, stages it in shared memory and stores the
// rows < max_rows and columns < max_cols of it to global memory with 16-byte vector stores.
// The caller has made sure that nothing else uses sOut (a __syncthreads after its last read).
template <class Element, class TiledMma, class SmemCopyAtom, class GmemTiledCopy, class Acc, class SmemOut, class GOut>
CUTE_DEVICE void store_acc(Acc& acc, float scale, TiledMma const& tiled_mma, SmemOut& sOut, GOut& gOut, int tid,
                           int max_rows, int max_cols) {
  using namespace cute;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) acc(i) *= scale;
  Tensor rOut = convert_fragment<Element>(acc);  // (MMA,MMA_M,MMA_N)
  auto smem_copy = make_tiled_copy_C(SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy = smem_copy.get_thread_slice(tid);
  Tensor tArA = smem_thr_copy.retile_S(rOut);    // (CPY,MMA_M,MMA_N)
  Tensor tAsA = smem_thr_copy.partition_D(sOut);  // (CPY,MMA_M,MMA_N)
  copy(smem_copy, tArA, tAsA);
  // The whole tile is in shared memory before threads read rows other warps wrote.
  __syncthreads();
  GmemTiledCopy gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tid);
  Tensor tOsO = gmem_thr_copy.partition_S(sOut);  // (CPY,CPY_M,CPY_N)
  Tensor tOgO = gmem_thr_copy.partition_D(gOut);  // (CPY,CPY_M,CPY_N)
  Tensor tOcO = gmem_thr_copy.partition_D(make_identity_tensor(make_shape(size<0>(sOut), size<1>(sOut))));  // -> (row,col)
  Tensor tOrO = make_tensor<Element>(shape(tOgO));
  copy(gmem_tiled_copy, tOsO, tOrO);
  store_tile(gmem_tiled_copy, tOrO, tOgO, tOcO, max_rows, max_cols);
}

}  // namespace bwd_detail

// D for every (batch, head, query row): four threads a row, 64 rows a CTA; D = rowsum(dO * O),
// or exact where the row sees few keys (common/dsum.hpp). Grid (ceil(seqlen_q / 64), nheads, batch),
// 256 threads.
template <class Element>
__global__ void __launch_bounds__(256) bwd_dsum_kernel(__grid_constant__ const BwdParams params) {
  constexpr int kGroup = 4;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int m0 = int(blockIdx.x) * 64;
  const int i = int(threadIdx.x) / kGroup, part = int(threadIdx.x) % kGroup;
  const int row = m0 + i;
  const BwdSeqlen seq(params, batch);
  const bool valid = row < seq.seqlen_q;  // the others join the block-wide steps only
  const int r = valid ? row : 0;
  // 16-byte loads: the row and head strides are multiples of 8 elements (plan_bwd).
  const int head_k = head / (params.nheads / params.nheads_k);
  const KeyMask mask{seq.seqlen_k, seq.seqlen_k - seq.seqlen_q, params.window_left, params.window_right};
  const int key_begin = cute::max(0, mask.key_begin(r)), key_end = cute::max(key_begin, mask.key_end(r));
  const bool exact = valid && !params.partial_keys && key_end - key_begin <= kExactDsumKeys;
  const float lse = valid ? params.lse[seq.lse_offset + head * params.lse_head_stride + row] : -INFINITY;
  auto q_at = [&](int q_row) {
    return static_cast<Element const*>(params.q) + seq.q_offset + head * params.q_head_stride + q_row * params.q_row_stride;
  };
  auto do_at = [&](int q_row) {
    return static_cast<Element const*>(params.dout) + seq.do_offset + head * params.do_head_stride +
           q_row * params.do_row_stride;
  };
  const float d_o = row_dot<kGroup, 256>(
      static_cast<Element const*>(params.o) + seq.o_offset + head * params.o_head_stride + r * params.o_row_stride,
      do_at(r), valid && !exact ? params.head_dim : 0, part);
  using Exact = ExactDsum<Element>;
  __shared__ typename Exact::Storage exact_smem;
  const typename Exact::Args args{q_at(m0),
                                  do_at(m0),
                                  static_cast<Element const*>(params.k) + seq.k_offset + head_k * params.k_head_stride,
                                  static_cast<Element const*>(params.v) + seq.v_offset + head_k * params.v_head_stride,
                                  params.q_row_stride,
                                  params.do_row_stride,
                                  params.k_row_stride,
                                  params.v_row_stride,
                                  seq.seqlen_q - m0,
                                  params.head_dim};
  const float d = Exact::dsum(d_o, exact, i, part, key_begin, key_end, lse, args, params, exact_smem);
  if (!valid) return;
  if (part == 0) params.dsum[seq.dsum_offset + int64_t(head) * seq.dsum_head_stride + row] = d;
}

// dK and dV of one key block (and, with d_split > 1, of columns [kPart * KV_COLS, ...)) of one
// KV head. Grid (ceil(seqlen_k / BLK_N), nheads_k, batch).
template <class Traits, int kPart>
__global__ void __launch_bounds__(Traits::kKvThreads) bwd_dkdv_kernel(__grid_constant__ const BwdParams params) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kKvBlockM;
  constexpr int kBlockN = Traits::kKvBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kCols = Traits::kKvCols;
  constexpr int kThreads = Traits::kKvThreads;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileSt = Shape<Int<kBlockN>, Int<kBlockM>>;   // S^T: keys x queries
  using TileOut = Shape<Int<kBlockN>, Int<kCols>>;    // this CTA's part of dK / dV
  static_assert(kPart < Traits::kDSplit);

  extern __shared__ __align__(128) char smem_buf[];

  const int n_block = blockIdx.x;  // causal: the first key blocks see the most queries, and start first
  const int head_k = blockIdx.y;
  const int batch = blockIdx.z;
  const int tid = threadIdx.x;
  const int group = params.nheads / params.nheads_k;
  const BwdSeqlen seq(params, batch);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.seqlen_k) return;  // varlen: this sequence is shorter than the grid's longest
  const int k_rows = seq.seqlen_k - n0;  // valid keys of this block (may exceed kBlockN)

  // The query blocks that see any key of this block: [m_block_min, m_block_max).
  const KeyMask mask{seq.seqlen_k, seq.seqlen_k - seq.seqlen_q, params.window_left, params.window_right};
  const int q_lo = mask.query_begin(n0);
  const int q_hi = mask.query_end(min(n0 + kBlockN, seq.seqlen_k) - 1, seq.seqlen_q);
  const int m_block_min = q_lo / kBlockM;
  const int m_block_max = q_hi > q_lo ? ceil_div(q_hi, kBlockM) : m_block_min;
  const int num_m = m_block_max - m_block_min;
  const int num_steps = group * num_m;  // (query head of the group, query block) pairs

  // Global memory.
  auto* k_ptr = static_cast<Element const*>(params.k) + seq.k_offset + head_k * params.k_head_stride;
  auto* v_ptr = static_cast<Element const*>(params.v) + seq.v_offset + head_k * params.v_head_stride;
  auto* dk_ptr = static_cast<Element*>(params.dk) + seq.dk_offset + head_k * params.dk_head_stride;
  auto* dv_ptr = static_cast<Element*>(params.dv) + seq.dv_offset + head_k * params.dv_head_stride;
  Tensor mK = make_tensor(make_gmem_ptr(k_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(params.k_row_stride, _1{}));  // (Sk,D)
  Tensor mV = make_tensor(make_gmem_ptr(v_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(params.v_row_stride, _1{}));  // (Sk,D)
  Tensor mdK = make_tensor(make_gmem_ptr(dk_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                           make_stride(params.dk_row_stride, _1{}));  // (Sk,D)
  Tensor mdV = make_tensor(make_gmem_ptr(dv_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                           make_stride(params.dv_row_stride, _1{}));  // (Sk,D)
  Tensor gK = local_tile(mK, TileKV{}, make_coord(n_block, 0));                  // (BLK_N,D)
  Tensor gV = local_tile(mV, TileKV{}, make_coord(n_block, 0));                  // (BLK_N,D)
  Tensor gdK = local_tile(mdK, TileOut{}, make_coord(n_block, Int<kPart>{}));   // (BLK_N,KV_COLS)
  Tensor gdV = local_tile(mdV, TileOut{}, make_coord(n_block, Int<kPart>{}));   // (BLK_N,KV_COLS)

  // Shared memory: K | V | Q[2] | dO[2] | lse[2] | dsum[2].
  using LayoutKV = typename Traits::template SmemLayoutRows<kBlockN>;
  using LayoutQ = typename Traits::template SmemLayoutRows<kBlockM>;
  using LayoutQt = typename Traits::template SmemLayoutRowsT<kBlockM>;
  constexpr int kQElems = kBlockM * kHeadDim;
  auto* smem = reinterpret_cast<Element*>(smem_buf);
  Tensor sK = make_tensor(make_smem_ptr(smem), LayoutKV{});                  // (BLK_N,D)
  Tensor sV = make_tensor(sK.data() + size(sK), LayoutKV{});                 // (BLK_N,D)
  Element* sQ_base = smem + 2 * kBlockN * kHeadDim;                          // 2 x (BLK_M,D)
  Element* sdO_base = sQ_base + 2 * kQElems;                                 // 2 x (BLK_M,D)
  float* sLse = reinterpret_cast<float*>(sdO_base + 2 * kQElems);           // 2 x BLK_M
  float* sDsum = sLse + 2 * kBlockM;                                         // 2 x BLK_M
  auto sQ = [&](int stage) { return make_tensor(make_smem_ptr(sQ_base + stage * kQElems), LayoutQ{}); };    // (BLK_M,D)
  auto sdO = [&](int stage) { return make_tensor(make_smem_ptr(sdO_base + stage * kQElems), LayoutQ{}); };  // (BLK_M,D)
  // This CTA's columns of Q^T and dO^T: the B operands of dK and dV.
  auto sQt_part = [&](int stage) {
    return local_tile(make_tensor(make_smem_ptr(sQ_base + stage * kQElems), LayoutQt{}),
                      Shape<Int<kCols>, Int<kBlockM>>{}, make_coord(Int<kPart>{}, _0{}));  // (KV_COLS,BLK_M)
  };
  auto sdOt_part = [&](int stage) {
    return local_tile(make_tensor(make_smem_ptr(sdO_base + stage * kQElems), LayoutQt{}),
                      Shape<Int<kCols>, Int<kBlockM>>{}, make_coord(Int<kPart>{}, _0{}));  // (KV_COLS,BLK_M)
  };

  // Global -> shared.
  typename Traits::template GmemTiledCopyLoad<kThreads> gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tid);
  Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(TileKV{}));  // (CPY,CPY_N,CPY_K) -> (row,col)
  Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(TileQ{}));     // (CPY,CPY_M,CPY_K) -> (row,col)

  // Loads step `step`'s Q and dO tiles, and its rows' lse and D, into stage `stage`.
  auto load_step = [&](int step, int stage) FLASHCUTE_INLINE {
    const int head = head_k * group + step / num_m;
    const int m_block = m_block_min + step % num_m;
    const int m0 = m_block * kBlockM;
    auto* q_ptr = static_cast<Element const*>(params.q) + seq.q_offset + head * params.q_head_stride;
    auto* do_ptr = static_cast<Element const*>(params.dout) + seq.do_offset + head * params.do_head_stride;
    Tensor gQ = local_tile(make_tensor(make_gmem_ptr(q_ptr), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                                       make_stride(params.q_row_stride, _1{})),
                           TileQ{}, make_coord(m_block, 0));  // (BLK_M,D)
    Tensor gdO = local_tile(make_tensor(make_gmem_ptr(do_ptr), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                                        make_stride(params.do_row_stride, _1{})),
                            TileQ{}, make_coord(m_block, 0));  // (BLK_M,D)
    load_tile<true>(gmem_tiled_copy, gmem_thr_copy.partition_S(gQ), gmem_thr_copy.partition_D(sQ(stage)), tQcQ,
                    seq.seqlen_q - m0, params.head_dim);
    load_tile<true>(gmem_tiled_copy, gmem_thr_copy.partition_S(gdO), gmem_thr_copy.partition_D(sdO(stage)), tQcQ,
                    seq.seqlen_q - m0, params.head_dim);
    // Rows past seqlen_q read as 0: their Q and dO rows are 0 too, so they add nothing.
    if (tid < kBlockM) {
      const int row = min(m0 + tid, seq.seqlen_q - 1);
      const bool ok = m0 + tid < seq.seqlen_q;
      float const* lse_row = params.lse + seq.lse_offset + head * params.lse_head_stride + row;
      float const* dsum_row = params.dsum + seq.dsum_offset + int64_t(head) * seq.dsum_head_stride + row;
      SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>::copy(*reinterpret_cast<uint32_t const*>(lse_row),
                                                       *reinterpret_cast<uint32_t*>(sLse + stage * kBlockM + tid), ok);
      SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>::copy(*reinterpret_cast<uint32_t const*>(dsum_row),
                                                       *reinterpret_cast<uint32_t*>(sDsum + stage * kBlockM + tid), ok);
    }
  };

  // Tensor cores. S^T = K Q^T and dP^T = V dO^T: A = K or V (BLK_N,D), B = Q or dO (BLK_M,D).
  // dV += P^T dO and dK += dS^T Q: A = P^T or dS^T from registers, B = dO^T or Q^T (KV_COLS,BLK_M).
  typename Traits::TiledMmaKv tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  auto smem_copy_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_bt = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_copy_a = smem_copy_a.get_thread_slice(tid);
  auto smem_thr_copy_b = smem_copy_b.get_thread_slice(tid);
  auto smem_thr_copy_bt = smem_copy_bt.get_thread_slice(tid);
  Tensor tSrK = thr_mma.partition_fragment_A(sK);              // (MMA,MMA_N,MMA_K)
  Tensor tSrQ = thr_mma.partition_fragment_B(sQ(0));           // (MMA,MMA_M,MMA_K)
  Tensor tdVrdOt = thr_mma.partition_fragment_B(sdOt_part(0));  // (MMA,MMA_COLS,MMA_M)
  Tensor tSsK = smem_thr_copy_a.partition_S(sK);               // (CPY,MMA_N,MMA_K)
  Tensor tSsV = smem_thr_copy_a.partition_S(sV);               // (CPY,MMA_N,MMA_K)
  Tensor tSrK_view = smem_thr_copy_a.retile_D(tSrK);           // (CPY,MMA_N,MMA_K)
  Tensor tSrQ_view = smem_thr_copy_b.retile_D(tSrQ);           // (CPY,MMA_M,MMA_K)
  Tensor tdVrdOt_view = smem_thr_copy_bt.retile_D(tdVrdOt);    // (CPY,MMA_COLS,MMA_M)

  Tensor acc_dk = partition_fragment_C(tiled_mma, TileOut{});  // (MMA,MMA_N,MMA_COLS), fp32
  Tensor acc_dv = partition_fragment_C(tiled_mma, TileOut{});  // (MMA,MMA_N,MMA_COLS), fp32
  Tensor tScS = rowcol_view(thr_mma.partition_C(make_identity_tensor(TileSt{})));  // ((2,MMA_N),(2,MMA_M)) -> (key,query)
  clear(acc_dk);
  clear(acc_dv);

  CUTE_STATIC_ASSERT_V(size<1>(tSrK) == Int<1>{});               // one m16 row block per warp
  CUTE_STATIC_ASSERT_V(size<2>(tSrK) == Int<kHeadDim / 16>{});   // k16 slices of the head dim
  CUTE_STATIC_ASSERT_V(size<2>(tdVrdOt) == Int<kBlockM / 16>{});  // k16 slices of a query block

  // Prologue: K, V and the first step's tiles, in one group.
  load_tile<true>(gmem_tiled_copy, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK), tKVcKV, k_rows,
                  params.head_dim);
  load_tile<true>(gmem_tiled_copy, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV), tKVcKV, k_rows,
                  params.head_dim);
  if (num_steps > 0) load_step(0, 0);
  cp_async_fence();

  const bwd_detail::ScoreScale sc(params);
  for (int step = 0; step < num_steps; ++step) {
    const int stage = step & 1;
    const int m0 = (m_block_min + step % num_m) * kBlockM;
    if (step + 1 < num_steps) {
      // The next step's tiles stream in during this step's math (its buffer was last read in
      // step - 1, which every thread finished: the __syncthreads at the end of that step).
      load_step(step + 1, stage ^ 1);
      cp_async_fence();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    // This step's tiles (and, first time, K and V) have landed for every thread.
    __syncthreads();

    // S^T = K Q^T, dP^T = V dO^T
    Tensor acc_s = partition_fragment_C(tiled_mma, TileSt{});   // (MMA,MMA_N,MMA_M), fp32
    Tensor acc_dp = partition_fragment_C(tiled_mma, TileSt{});  // (MMA,MMA_N,MMA_M), fp32
    clear(acc_s);
    clear(acc_dp);
    gemm_ss(tiled_mma, acc_s, tSrK, tSrQ, tSsK, smem_thr_copy_b.partition_S(sQ(stage)), tSrK_view, tSrQ_view,
            smem_copy_a, smem_copy_b);
    gemm_ss(tiled_mma, acc_dp, tSrK, tSrQ, tSsV, smem_thr_copy_b.partition_S(sdO(stage)), tSrK_view, tSrQ_view,
            smem_copy_a, smem_copy_b);

    // P^T and dS^T; each column (a query) has its own lse and D.
    Tensor s_rc = rowcol_view(acc_s);    // ((2,MMA_N),(2,MMA_M))
    Tensor dp_rc = rowcol_view(acc_dp);  // ((2,MMA_N),(2,MMA_M))
    float const* lse_s = sLse + stage * kBlockM;
    float const* dsum_s = sDsum + stage * kBlockM;
    auto col_of = [&](int i) { return get<1>(tScS(i % size<0>(s_rc), i / size<0>(s_rc))); };
    bwd_detail::probs_and_dscores(
        s_rc, dp_rc, sc, [&](int i) { return bwd_detail::lse_log2(lse_s[col_of(i)]); },
        [&](int i) { return dsum_s[col_of(i)]; });
    if (mask.tile_needs_mask(m0, kBlockM, n0, kBlockN)) {
      mask.apply_transposed(s_rc, tScS, n0, m0, 0.f);
      mask.apply_transposed(dp_rc, tScS, n0, m0, 0.f);
    }

    // dV += P^T dO, dK += dS^T Q
    Tensor rP = convert_fragment<Element>(acc_s);                         // (MMA,MMA_N,MMA_M)
    Tensor tdVrP = make_tensor(rP.data(), acc_to_a_layout(rP.layout()));  // ((2,2,2),MMA_N,MMA_M/2)
    gemm_rs(tiled_mma, acc_dv, tdVrP, tdVrdOt, smem_thr_copy_bt.partition_S(sdOt_part(stage)), tdVrdOt_view,
            smem_copy_bt);
    Tensor rdS = convert_fragment<Element>(acc_dp);                          // (MMA,MMA_N,MMA_M)
    Tensor tdKrdS = make_tensor(rdS.data(), acc_to_a_layout(rdS.layout()));  // ((2,2,2),MMA_N,MMA_M/2)
    gemm_rs(tiled_mma, acc_dk, tdKrdS, tdVrdOt, smem_thr_copy_bt.partition_S(sQt_part(stage)), tdVrdOt_view,
            smem_copy_bt);
    // Every warp is done with this stage's tiles before the next step refills them.
    __syncthreads();
  }

  // Epilogue: dK (times softmax_scale) and dV through the K and V buffers.
  cp_async_wait<0>();
  // No cp.async is pending and every warp is done reading sK and sV.
  __syncthreads();
  Tensor sdK = make_tensor(sK.data(), typename Traits::SmemLayoutKvOut{});  // (BLK_N,KV_COLS)
  Tensor sdV = make_tensor(sV.data(), typename Traits::SmemLayoutKvOut{});  // (BLK_N,KV_COLS)
  using StoreCopy = typename Traits::template GmemTiledCopyStore<kThreads, kCols>;
  const int cols = params.head_dim - kPart * kCols;
  bwd_detail::store_acc<Element, decltype(tiled_mma), typename Traits::SmemCopyAtomStore, StoreCopy>(
      acc_dk, params.softmax_scale, tiled_mma, sdK, gdK, tid, k_rows, cols);
  bwd_detail::store_acc<Element, decltype(tiled_mma), typename Traits::SmemCopyAtomStore, StoreCopy>(
      acc_dv, 1.f, tiled_mma, sdV, gdV, tid, k_rows, cols);
}

// dQ of one query block of one head. Grid (ceil(seqlen_q / BLK_M), nheads, batch).
template <class Traits>
__global__ void __launch_bounds__(Traits::kQThreads) bwd_dq_kernel(__grid_constant__ const BwdParams params) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kQBlockM;
  constexpr int kBlockN = Traits::kQBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kThreads = Traits::kQThreads;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileS = Shape<Int<kBlockM>, Int<kBlockN>>;

  extern __shared__ __align__(128) char smem_buf[];

  // Heaviest causal tiles (largest m_block) go first, so the light ones fill the tail.
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int head_k = head / (params.nheads / params.nheads_k);
  const int tid = threadIdx.x;
  const BwdSeqlen seq(params, batch);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.seqlen_q) return;  // varlen: this sequence is shorter than the grid's longest
  const int q_rows = seq.seqlen_q - m0;

  const KeyMask mask{seq.seqlen_k, seq.seqlen_k - seq.seqlen_q, params.window_left, params.window_right};
  const int key_lo = max(0, mask.key_begin(m0));
  const int key_hi = mask.key_end(min(m0 + kBlockM, seq.seqlen_q) - 1);
  const int n_block_min = key_lo / kBlockN;
  const int n_block_max = key_hi > key_lo ? ceil_div(key_hi, kBlockN) : n_block_min;

  auto* q_ptr = static_cast<Element const*>(params.q) + seq.q_offset + head * params.q_head_stride;
  auto* do_ptr = static_cast<Element const*>(params.dout) + seq.do_offset + head * params.do_head_stride;
  auto* k_ptr = static_cast<Element const*>(params.k) + seq.k_offset + head_k * params.k_head_stride;
  auto* v_ptr = static_cast<Element const*>(params.v) + seq.v_offset + head_k * params.v_head_stride;
  auto* dq_ptr = static_cast<Element*>(params.dq) + seq.dq_offset + head * params.dq_head_stride;
  auto rows = [](auto* ptr, int n, int64_t row_stride) {
    return make_tensor(make_gmem_ptr(ptr), make_shape(n, Int<kHeadDim>{}), make_stride(row_stride, _1{}));
  };
  Tensor gQ = local_tile(rows(q_ptr, seq.seqlen_q, params.q_row_stride), TileQ{}, make_coord(m_block, 0));    // (BLK_M,D)
  Tensor gdO = local_tile(rows(do_ptr, seq.seqlen_q, params.do_row_stride), TileQ{}, make_coord(m_block, 0));  // (BLK_M,D)
  Tensor gdQ = local_tile(rows(dq_ptr, seq.seqlen_q, params.dq_row_stride), TileQ{}, make_coord(m_block, 0));  // (BLK_M,D)
  Tensor gK = local_tile(rows(k_ptr, seq.seqlen_k, params.k_row_stride), TileKV{}, make_coord(_, 0));  // (BLK_N,D,n_blocks)
  Tensor gV = local_tile(rows(v_ptr, seq.seqlen_k, params.v_row_stride), TileKV{}, make_coord(_, 0));  // (BLK_N,D,n_blocks)

  // Shared memory: Q | dO | K[2] | V[2]; dQ reuses Q's buffer at the end.
  using LayoutQ = typename Traits::template SmemLayoutRows<kBlockM>;
  using LayoutKV = typename Traits::template SmemLayoutRows<kBlockN>;
  using LayoutKt = typename Traits::template SmemLayoutRowsT<kBlockN>;
  constexpr int kKVElems = kBlockN * kHeadDim;
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem_buf)), LayoutQ{});  // (BLK_M,D)
  Tensor sdO = make_tensor(sQ.data() + size(sQ), LayoutQ{});                                // (BLK_M,D)
  Element* sK_base = raw_pointer_cast(sdO.data()) + size(sdO);                            // 2 x (BLK_N,D)
  Element* sV_base = sK_base + 2 * kKVElems;                                              // 2 x (BLK_N,D)
  auto sK = [&](int stage) { return make_tensor(make_smem_ptr(sK_base + stage * kKVElems), LayoutKV{}); };   // (BLK_N,D)
  auto sV = [&](int stage) { return make_tensor(make_smem_ptr(sV_base + stage * kKVElems), LayoutKV{}); };   // (BLK_N,D)
  auto sKt = [&](int stage) { return make_tensor(make_smem_ptr(sK_base + stage * kKVElems), LayoutKt{}); };  // (D,BLK_N)

  typename Traits::template GmemTiledCopyLoad<kThreads> gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tid);
  Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(TileQ{}));     // (CPY,CPY_M,CPY_K) -> (row,col)
  Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(TileKV{}));  // (CPY,CPY_N,CPY_K) -> (row,col)
  Tensor tKgK = gmem_thr_copy.partition_S(gK);                                // (CPY,CPY_N,CPY_K,n_blocks)
  Tensor tVgV = gmem_thr_copy.partition_S(gV);                                // (CPY,CPY_N,CPY_K,n_blocks)
  auto load_kv = [&](int n_block, int stage) FLASHCUTE_INLINE {
    const int n_rows = seq.seqlen_k - n_block * kBlockN;
    load_tile<true>(gmem_tiled_copy, tKgK(_, _, _, n_block), gmem_thr_copy.partition_D(sK(stage)), tKVcKV, n_rows,
                    params.head_dim);
    load_tile<true>(gmem_tiled_copy, tVgV(_, _, _, n_block), gmem_thr_copy.partition_D(sV(stage)), tKVcKV, n_rows,
                    params.head_dim);
  };

  // S = Q K^T and dP = dO V^T: A = Q or dO (BLK_M,D), B = K or V (BLK_N,D). dQ += dS K: A = dS
  // from registers, B = K^T (D,BLK_N).
  typename Traits::TiledMmaQ tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  auto smem_copy_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_bt = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_copy_a = smem_copy_a.get_thread_slice(tid);
  auto smem_thr_copy_b = smem_copy_b.get_thread_slice(tid);
  auto smem_thr_copy_bt = smem_copy_bt.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);       // (MMA,MMA_M,MMA_K)
  Tensor tSrK = thr_mma.partition_fragment_B(sK(0));    // (MMA,MMA_N,MMA_K)
  Tensor tdQrKt = thr_mma.partition_fragment_B(sKt(0));  // (MMA,MMA_D,MMA_N)
  Tensor tSsQ = smem_thr_copy_a.partition_S(sQ);        // (CPY,MMA_M,MMA_K)
  Tensor tSsdO = smem_thr_copy_a.partition_S(sdO);      // (CPY,MMA_M,MMA_K)
  Tensor tSrQ_view = smem_thr_copy_a.retile_D(tSrQ);    // (CPY,MMA_M,MMA_K)
  Tensor tSrK_view = smem_thr_copy_b.retile_D(tSrK);    // (CPY,MMA_N,MMA_K)
  Tensor tdQrKt_view = smem_thr_copy_bt.retile_D(tdQrKt);  // (CPY,MMA_D,MMA_N)

  Tensor acc_dq = partition_fragment_C(tiled_mma, TileQ{});  // (MMA,MMA_M,MMA_D), fp32
  Tensor tScS = rowcol_view(thr_mma.partition_C(make_identity_tensor(TileS{})));  // ((2,MMA_M),(2,MMA_N)) -> (row,col)
  clear(acc_dq);

  CUTE_STATIC_ASSERT_V(size<1>(tSrQ) == Int<1>{});               // one m16 row block per warp
  CUTE_STATIC_ASSERT_V(size<2>(tSrQ) == Int<kHeadDim / 16>{});   // k16 slices of the head dim
  CUTE_STATIC_ASSERT_V(size<2>(tdQrKt) == Int<kBlockN / 16>{});  // k16 slices of a key block

  // Each thread's rows: their lse (log2 units) and D. Rows past seqlen_q get lse +inf (P = 0).
  constexpr int kRows = decltype(size<0>(tScS))::value;
  float row_lse2[kRows], row_dsum[kRows];
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const int row = m0 + get<0>(tScS(i, 0));
    const bool ok = row < seq.seqlen_q;
    row_lse2[i] = ok ? bwd_detail::lse_log2(params.lse[seq.lse_offset + head * params.lse_head_stride + row]) : INFINITY;
    row_dsum[i] = ok ? params.dsum[seq.dsum_offset + int64_t(head) * seq.dsum_head_stride + row] : 0.f;
  }

  // Prologue: Q, dO and the last (possibly ragged) key block, in one group.
  load_tile<true>(gmem_tiled_copy, gmem_thr_copy.partition_S(gQ), gmem_thr_copy.partition_D(sQ), tQcQ, q_rows,
                  params.head_dim);
  load_tile<true>(gmem_tiled_copy, gmem_thr_copy.partition_S(gdO), gmem_thr_copy.partition_D(sdO), tQcQ, q_rows,
                  params.head_dim);
  if (n_block_max > n_block_min) load_kv(n_block_max - 1, 0);
  cp_async_fence();

  const bwd_detail::ScoreScale sc(params);
  for (int n_block = n_block_max - 1, stage = 0; n_block >= n_block_min; --n_block, stage ^= 1) {
    const int n0 = n_block * kBlockN;
    if (n_block > n_block_min) {
      // The next key block streams in during this one's math (its buffer was last read in the
      // previous step, which every thread finished: the __syncthreads at the end of it).
      load_kv(n_block - 1, stage ^ 1);
      cp_async_fence();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    // This block's K and V (and, first time, Q and dO) have landed for every thread.
    __syncthreads();

    Tensor acc_s = partition_fragment_C(tiled_mma, TileS{});   // (MMA,MMA_M,MMA_N), fp32
    Tensor acc_dp = partition_fragment_C(tiled_mma, TileS{});  // (MMA,MMA_M,MMA_N), fp32
    clear(acc_s);
    clear(acc_dp);
    gemm_ss(tiled_mma, acc_s, tSrQ, tSrK, tSsQ, smem_thr_copy_b.partition_S(sK(stage)), tSrQ_view, tSrK_view,
            smem_copy_a, smem_copy_b);
    gemm_ss(tiled_mma, acc_dp, tSrQ, tSrK, tSsdO, smem_thr_copy_b.partition_S(sV(stage)), tSrQ_view, tSrK_view,
            smem_copy_a, smem_copy_b);

    Tensor s_rc = rowcol_view(acc_s);    // ((2,MMA_M),(2,MMA_N))
    Tensor dp_rc = rowcol_view(acc_dp);  // ((2,MMA_M),(2,MMA_N))
    constexpr int kR = decltype(size<0>(s_rc))::value;
    bwd_detail::probs_and_dscores(s_rc, dp_rc, sc, [&](int i) { return row_lse2[i % kR]; },
                                  [&](int i) { return row_dsum[i % kR]; });
    if (mask.tile_needs_mask(m0, kBlockM, n0, kBlockN)) mask.apply(dp_rc, tScS, m0, n0, 0.f);

    // dQ += dS K
    Tensor rdS = convert_fragment<Element>(acc_dp);                          // (MMA,MMA_M,MMA_N)
    Tensor tdQrdS = make_tensor(rdS.data(), acc_to_a_layout(rdS.layout()));  // ((2,2,2),MMA_M,MMA_N/2)
    gemm_rs(tiled_mma, acc_dq, tdQrdS, tdQrKt, smem_thr_copy_bt.partition_S(sKt(stage)), tdQrKt_view, smem_copy_bt);
    // Every warp is done with this stage's K and V before the next step refills them.
    __syncthreads();
  }

  cp_async_wait<0>();
  // No cp.async is pending and every warp is done reading sQ.
  __syncthreads();
  using StoreCopy = typename Traits::template GmemTiledCopyStore<kThreads, kHeadDim>;
  bwd_detail::store_acc<Element, decltype(tiled_mma), typename Traits::SmemCopyAtomStore, StoreCopy>(
      acc_dq, params.softmax_scale, tiled_mma, sQ, gdQ, tid, q_rows, params.head_dim);
}

}  // namespace flashcute::sm80

#undef FLASHCUTE_INLINE
