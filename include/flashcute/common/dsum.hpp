// flashcute/common/dsum.hpp: D = rowsum(dO * O), the backward's per-row statistic, for the
// preprocess kernels of both families.
//
// dS = P * (dP - D) needs D = sum_j P_ij dP_ij. The usual shortcut D = dO . O reads O rounded to
// the input dtype, and its rounding error shifts every dS of the row by the same amount. Where a
// row sees many keys, O is an average and that shift is small next to the gradients' own rounding;
// where it sees a few, it is not: bf16, seqlen_q 113, seqlen_k 2, causal, window (16, 100) gave dQ
// and dK about 5x the naive bf16 error (issue 30). Rows that see at most kExactDsumKeys keys
// therefore take D = sum_j P_ij (dO_i . v_j), recomputed in fp32 from q, k, v and the lse, on
// tensor cores for the block of rows that holds them (ExactDsum).
#pragma once

#include <climits>
#include <type_traits>

#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>

#include "flashcute/common/fragment.hpp"
#include "flashcute/common/params.hpp"

namespace flashcute {

// Rows that see this many keys or fewer get the exact D (docs/perf-notes.md, "Backward: D"
// gives the error and the cost behind 64).
constexpr int kExactDsumKeys = 64;

// Sum over the kGroup lanes (aligned, consecutive) that share a row; every lane of the warp calls it.
template <int kGroup>
CUTE_DEVICE float group_sum(float x) {
  CUTE_UNROLL
  for (int o = 1; o < kGroup; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// A row's head_dim elements as lane `part` of kGroup holds them: 8 elements (16 bytes: strides are
// multiples of 8) at columns (part + i kGroup) 8, zero past head_dim. Compile-time sized, so that
// every load of a row is in flight at once.
template <int kGroup, int kMaxHeadDim>
struct RowChunks {
  static constexpr int kChunks = (kMaxHeadDim + 8 * kGroup - 1) / (8 * kGroup);
  uint4 v[kChunks];

  // head_dim 0 loads nothing: zeros.
  template <class Element>
  CUTE_DEVICE void load(const Element* row, int head_dim, int part) {
    CUTE_UNROLL
    for (int i = 0; i < kChunks; ++i) {
      const int c = (part + i * kGroup) * 8;
      v[i] = c < head_dim ? *reinterpret_cast<const uint4*>(row + c) : make_uint4(0, 0, 0, 0);
    }
  }
  // This lane's part of the dot product with `o`.
  template <class Element>
  CUTE_DEVICE float dot(const RowChunks& o) const {
    float acc = 0.f;
    CUTE_UNROLL
    for (int i = 0; i < kChunks; ++i) {
      const Element* x = reinterpret_cast<const Element*>(&v[i]);
      const Element* y = reinterpret_cast<const Element*>(&o.v[i]);
      CUTE_UNROLL
      for (int e = 0; e < 8; ++e) acc += float(x[e]) * float(y[e]);
    }
    return acc;
  }
};

// dO . O of this lane's row, lane `part` of the kGroup lanes that share it (head_dim 0: 0).
template <int kGroup, int kMaxHeadDim, class Element>
CUTE_DEVICE float row_dot(const Element* o, const Element* dout, int head_dim, int part) {
  RowChunks<kGroup, kMaxHeadDim> a, b;
  a.load(o, head_dim, part);
  b.load(dout, head_dim, part);
  return group_sum<kGroup>(a.template dot<Element>(b));
}

// D of a block's 64 query rows where they see at most kExactDsumKeys keys, on tensor cores
// (m16n8k16, fp32 accumulators): S = Q K^T and dP = dO V^T over the union of those rows' keys, 64
// keys and 32 head-dim columns a round, then D_i = sum_j P_ij dP_ij with P from the lse.
// 256 threads; warps (4, 2) over (rows, keys): 16 rows and half of each 64 keys a warp.
template <class Element>
struct ExactDsum {
  static constexpr int kRows = 64, kKeys = 64, kCols = 32, kThreads = 256;
  static_assert(kRows * kCols / 8 == kThreads && kKeys == kRows, "one 16-byte piece of each tile a thread");
  static constexpr float kLog2e = 1.4426950408889634f;
  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::bfloat16_t>, cute::SM80_16x8x16_F32BF16BF16F32_TN,
                                   cute::SM80_16x8x16_F32F16F16F32_TN>;
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<MmaOp>, cute::Layout<cute::Shape<cute::_4, cute::_2, cute::_1>>,
                                  cute::Tile<cute::_64, cute::_32, cute::_16>>;
  // (64, 32) tiles of 64-byte rows, swizzled so that ldmatrix is conflict-free.
  using SmemLayout = decltype(cute::tile_to_shape(
      cute::composition(cute::Swizzle<2, 3, 3>{}, cute::Layout<cute::Shape<cute::_8, cute::_32>, cute::Stride<cute::_32, cute::_1>>{}),
      cute::Shape<cute::_64, cute::_32>{}));
  using LdsmAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;

  struct Storage {
    cute::array_aligned<Element, kRows * kCols> q, dout, k, v;  // this round's (64, 32) tiles
    float partial[2][kRows];                                    // each key slice's row sums
    // Filled by dsum() before run(): each row's exact keys (an empty range if it takes dO . O or
    // has no key) and its lse in log2 units.
    int key_begin[kRows], key_end[kRows];
    float lse2[kRows];
  };

  // The block's inputs: row 0 of its queries and dO, key 0 of its KV head.
  struct Args {
    const Element *q, *dout, *k, *v;
    int64_t q_row_stride, do_row_stride, k_row_stride, v_row_stride;
    int rows;  // query rows of the block that exist (the others read zeros)
    int head_dim;
  };

  // Every thread of the block calls it, with the Storage's row fields filled; then row_d(i) is row
  // i's D (0 where its range is empty).
  CUTE_DEVICE static void run(const Args& a, const FwdParams& p, Storage& s) {
    using namespace cute;
    const int tid = int(threadIdx.x);
    __syncthreads();  // the row fields
    // The union of the rows' key ranges; each warp computes it (two rows a lane).
    const int lane = tid % 32;
    int first = INT_MAX, last = INT_MIN;
    for (int i = lane; i < kRows; i += 32) {
      if (s.key_begin[i] < s.key_end[i]) {
        first = cute::min(first, s.key_begin[i]);
        last = cute::max(last, s.key_end[i]);
      }
    }
    first = __reduce_min_sync(0xffffffffu, first);
    last = __reduce_max_sync(0xffffffffu, last);

    Tensor sQ = make_tensor(make_smem_ptr(s.q.data()), SmemLayout{});      // (64 rows, 32 cols)
    Tensor sdO = make_tensor(make_smem_ptr(s.dout.data()), SmemLayout{});  // (64 rows, 32 cols)
    Tensor sK = make_tensor(make_smem_ptr(s.k.data()), SmemLayout{});      // (64 keys, 32 cols)
    Tensor sV = make_tensor(make_smem_ptr(s.v.data()), SmemLayout{});      // (64 keys, 32 cols)
    TiledMma mma;
    auto thr_mma = mma.get_slice(tid);
    Tensor tSrQ = thr_mma.partition_fragment_A(sQ);    // (MMA,MMA_M,MMA_K)
    Tensor tSrdO = thr_mma.partition_fragment_A(sdO);  // (MMA,MMA_M,MMA_K)
    Tensor tSrK = thr_mma.partition_fragment_B(sK);    // (MMA,MMA_N,MMA_K)
    Tensor tSrV = thr_mma.partition_fragment_B(sV);    // (MMA,MMA_N,MMA_K)
    auto copy_a = make_tiled_copy_A(LdsmAtom{}, mma);
    auto copy_b = make_tiled_copy_B(LdsmAtom{}, mma);
    auto ldsm_a = copy_a.get_slice(tid);
    auto ldsm_b = copy_b.get_slice(tid);
    Tensor tXsQ = ldsm_a.partition_S(sQ);  // (CPY,CPY_M,CPY_K)
    Tensor tXrQ = ldsm_a.retile_D(tSrQ);
    Tensor tXsdO = ldsm_a.partition_S(sdO);
    Tensor tXrdO = ldsm_a.retile_D(tSrdO);
    Tensor tXsK = ldsm_b.partition_S(sK);  // (CPY,CPY_N,CPY_K)
    Tensor tXrK = ldsm_b.retile_D(tSrK);
    Tensor tXsV = ldsm_b.partition_S(sV);
    Tensor tXrV = ldsm_b.retile_D(tSrV);
    // (row, key) of each accumulator element: ((2,MMA_M),(2,MMA_N)).
    Tensor tScS = rowcol_view(thr_mma.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kKeys>>{})));
    static_assert(decltype(size<0>(tScS))::value == 2, "two rows a thread");
    int kb[2], ke[2];
    float lse2[2], dsum[2] = {0.f, 0.f};
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int row = get<0>(tScS(i, 0));
      kb[i] = s.key_begin[row];
      ke[i] = s.key_end[row];
      lse2[i] = s.lse2[row];
    }
    const bool softcap = p.softcap > 0.f;
    const float exp_scale = (softcap ? p.softcap : p.softmax_scale) * kLog2e;
    const float prescale = softcap ? p.softmax_scale / p.softcap : 0.f;

    // This thread's 16 bytes of each (64, 32) tile: row r, columns c..c+7.
    const int r = tid / 4, c = (tid % 4) * 8;
    auto load = [&](const Element* base, int64_t stride, bool ok) {
      return ok ? *reinterpret_cast<const uint4*>(base + int64_t(r) * stride) : make_uint4(0, 0, 0, 0);
    };
    for (int n0 = first; n0 < last; n0 += kKeys) {
      Tensor accS = partition_fragment_C(mma, Shape<Int<kRows>, Int<kKeys>>{});   // (MMA,MMA_M,MMA_N)
      Tensor accdP = partition_fragment_C(mma, Shape<Int<kRows>, Int<kKeys>>{});  // (MMA,MMA_M,MMA_N)
      clear(accS);
      clear(accdP);
      const bool q_ok = r < a.rows, k_ok = n0 + r < last;
      const Element* k_row = a.k + int64_t(n0) * a.k_row_stride;
      const Element* v_row = a.v + int64_t(n0) * a.v_row_stride;
      uint4 rq = load(a.q + c, a.q_row_stride, q_ok && c < a.head_dim);
      uint4 rdo = load(a.dout + c, a.do_row_stride, q_ok && c < a.head_dim);
      uint4 rk = load(k_row + c, a.k_row_stride, k_ok && c < a.head_dim);
      uint4 rv = load(v_row + c, a.v_row_stride, k_ok && c < a.head_dim);
      for (int c0 = 0; c0 < a.head_dim; c0 += kCols) {
        __syncthreads();  // the last round's ldmatrix reads are done
        *reinterpret_cast<uint4*>(&sQ(r, c)) = rq;
        *reinterpret_cast<uint4*>(&sdO(r, c)) = rdo;
        *reinterpret_cast<uint4*>(&sK(r, c)) = rk;
        *reinterpret_cast<uint4*>(&sV(r, c)) = rv;
        __syncthreads();
        // The next round's loads fly while this round's MMAs run.
        const int cn = c0 + kCols + c;
        rq = load(a.q + cn, a.q_row_stride, q_ok && cn < a.head_dim);
        rdo = load(a.dout + cn, a.do_row_stride, q_ok && cn < a.head_dim);
        rk = load(k_row + cn, a.k_row_stride, k_ok && cn < a.head_dim);
        rv = load(v_row + cn, a.v_row_stride, k_ok && cn < a.head_dim);
        copy(copy_a, tXsQ, tXrQ);
        copy(copy_b, tXsK, tXrK);
        copy(copy_a, tXsdO, tXrdO);
        copy(copy_b, tXsV, tXrV);
        gemm(mma, tSrQ, tSrK, accS);
        gemm(mma, tSrdO, tSrV, accdP);
      }
      Tensor s_rc = rowcol_view(accS);    // ((2,MMA_M),(2,MMA_N))
      Tensor dp_rc = rowcol_view(accdP);  // ((2,MMA_M),(2,MMA_N))
      CUTE_UNROLL
      for (int i = 0; i < 2; ++i) {
        CUTE_UNROLL
        for (int j = 0; j < size<1>(s_rc); ++j) {
          const int key = n0 + get<1>(tScS(i, j));
          float x = s_rc(i, j);
          if (softcap) x = tanhf(x * prescale);
          const float pr = exp2f(x * exp_scale - lse2[i]);
          if (key >= kb[i] && key < ke[i]) dsum[i] += pr * dp_rc(i, j);
        }
      }
    }
    // The quad's sum of each row, then one value per (key slice, row): a fixed order, the same bits
    // every run.
    CUTE_UNROLL
    for (int i = 0; i < 2; ++i) {
      dsum[i] += __shfl_xor_sync(0xffffffffu, dsum[i], 1);
      dsum[i] += __shfl_xor_sync(0xffffffffu, dsum[i], 2);
      if (lane % 4 == 0) s.partial[tid / 128][get<0>(tScS(i, 0))] = dsum[i];  // warps (4, 2): slice = warp / 4
    }
    __syncthreads();
  }

  CUTE_DEVICE static float row_d(const Storage& s, int i) { return s.partial[0][i] + s.partial[1][i]; }

  // D of this thread's row, local row i of the block: `d` (dO . O), or the exact D where the row is
  // exact. Every thread of the block calls it; each row's lane `part` 0 hands in its fields (its
  // visible keys [key_begin, key_end) and its lse, natural log; -inf: no key, D = 0).
  CUTE_DEVICE static float dsum(float d, bool exact, int i, int part, int key_begin, int key_end, float lse,
                                const Args& a, const FwdParams& p, Storage& s) {
    if (!__syncthreads_or(exact)) return d;
    if (part == 0) {
      s.key_begin[i] = key_begin;
      s.key_end[i] = exact && lse != -INFINITY ? key_end : key_begin;
      s.lse2[i] = lse * kLog2e;
    }
    run(a, p, s);
    return exact ? row_d(s, i) : d;
  }
};

}  // namespace flashcute
