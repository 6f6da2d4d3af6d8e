// flashcute/common/dsum.hpp: D = rowsum(dO * O), the backward's per-row statistic, for the
// preprocess kernels of both families.
//
// dS = P * (dP - D) needs D = sum_j P_ij dP_ij. The usual shortcut D = dO . O reads O rounded to
// the input dtype, and its rounding error shifts every dS of the row by the same amount. Where a
// row sees many keys, O is an average and that shift is small next to the gradients' own rounding;
// where it sees a few, it is not: bf16, seqlen_q 113, seqlen_k 2, causal, window (16, 100) gave dQ
// and dK about 5x the naive bf16 error (issue 30). Rows that see at most kExactDsumKeys keys
// therefore take D = sum_j P_ij (dO_i . v_j), recomputed in fp32 from q, k, v and the lse.
#pragma once

#include <climits>

#include <cute/tensor.hpp>

#include "flashcute/common/params.hpp"

namespace flashcute {

// Rows that see this many keys or fewer get the exact D (docs/perf-notes.md, "Backward: D"
// gives the error and the cost behind 64).
constexpr int kExactDsumKeys = 64;

// A row's inputs: row pointers, key-0 pointers of its KV head, and its visible keys.
template <class Element>
struct DsumRow {
  const Element* q;     // query row
  const Element* dout;  // its dO row
  const Element* o;     // its O row
  const Element* k;     // key 0 of the row's KV head
  const Element* v;
  int64_t k_row_stride, v_row_stride;
  int key_begin, key_end;  // visible keys [key_begin, key_end), clamped
};

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

// D of this lane's row, lane `part` of the kGroup lanes that share it; every lane of the warp
// calls it together (rows >= seqlen_q with valid = false), so that the warp stays converged: the
// exact rows' key loop runs over the union of the warp's exact rows' keys, each row adding only
// its own.
// P comes from the forward's lse (natural log units); lse = -inf (no key) gives 0.
template <int kGroup, int kMaxHeadDim, class Element>
CUTE_DEVICE float row_dsum(const DsumRow<Element>& r, bool valid, const FwdParams& p, float lse, int head_dim,
                           int part) {
  constexpr float kLog2e = 1.4426950408889634f;
  const bool exact = valid && r.key_end - r.key_begin <= kExactDsumKeys;
  RowChunks<kGroup, kMaxHeadDim> a, b;
  a.load(r.o, valid && !exact ? head_dim : 0, part);
  b.load(r.dout, valid ? head_dim : 0, part);
  float d = group_sum<kGroup>(a.template dot<Element>(b));
  const int first = __reduce_min_sync(0xffffffffu, exact ? r.key_begin : INT_MAX);
  const int last = __reduce_max_sync(0xffffffffu, exact ? r.key_end : INT_MIN);
  if (first >= last) return d;
  const bool softcap = p.softcap > 0.f;
  const float exp_scale = (softcap ? p.softcap : p.softmax_scale) * kLog2e;
  const float prescale = softcap ? p.softmax_scale / p.softcap : 0.f;
  const float lse2 = lse * kLog2e;
  a.load(r.q, exact ? head_dim : 0, part);
  float exact_d = 0.f;
  for (int j = first; j < last; ++j) {
    const bool mine = exact && j >= r.key_begin && j < r.key_end && lse != -INFINITY;
    RowChunks<kGroup, kMaxHeadDim> k, v;
    k.load(r.k + j * r.k_row_stride, mine ? head_dim : 0, part);
    v.load(r.v + j * r.v_row_stride, mine ? head_dim : 0, part);
    float s = group_sum<kGroup>(a.template dot<Element>(k));
    const float dp = group_sum<kGroup>(b.template dot<Element>(v));
    if (softcap) s = tanhf(s * prescale);
    if (mine) exact_d += exp2f(s * exp_scale - lse2) * dp;
  }
  return exact ? exact_d : d;
}

}  // namespace flashcute
