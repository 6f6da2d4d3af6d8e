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

#include <cute/tensor.hpp>

#include "flashcute/common/params.hpp"

namespace flashcute {

// Rows that see this many keys or fewer get the exact D (docs/perf-notes.md, "Backward: D"
// gives the error and the cost behind 64).
constexpr int kExactDsumKeys = 64;

// A row's inputs for the exact D: row pointers, key-0 pointers of its KV head, and its keys.
template <class Element>
struct DsumRow {
  const Element* q;     // query row
  const Element* dout;  // its dO row
  const Element* k;     // key 0 of the row's KV head
  const Element* v;
  int64_t k_row_stride, v_row_stride;
  int key_begin, key_end;  // visible keys [key_begin, key_end), clamped
};

// Sum over the kGroup lanes (aligned, consecutive) that share a row. `lanes` is their mask.
template <int kGroup>
CUTE_DEVICE float group_sum(float x, unsigned lanes) {
  CUTE_UNROLL
  for (int o = 1; o < kGroup; o *= 2) x += __shfl_xor_sync(lanes, x, o);
  return x;
}

// dO . o over head_dim elements, 8 a lane per step (16-byte loads: strides are multiples of 8),
// lane `part` of kGroup; every lane of the group gets the sum.
template <int kGroup, class Element>
CUTE_DEVICE float group_dot(const Element* a, const Element* b, int head_dim, int part, unsigned lanes) {
  float acc = 0.f;
  for (int c = part * 8; c < head_dim; c += kGroup * 8) {
    const uint4 x = *reinterpret_cast<const uint4*>(a + c);
    const uint4 y = *reinterpret_cast<const uint4*>(b + c);
    const Element* ex = reinterpret_cast<const Element*>(&x);
    const Element* ey = reinterpret_cast<const Element*>(&y);
    CUTE_UNROLL
    for (int e = 0; e < 8; ++e) acc += float(ex[e]) * float(ey[e]);
  }
  return group_sum<kGroup>(acc, lanes);
}

// D = sum_j P_ij (dO_i . v_j) over the row's visible keys, P from the forward's lse (natural
// log units, as the forward returns it) and the scores' scale and softcap. lse = -inf (no key)
// gives 0.
template <int kGroup, class Element>
CUTE_DEVICE float exact_dsum(const DsumRow<Element>& r, const FwdParams& p, float lse, int head_dim, int part,
                             unsigned lanes) {
  constexpr float kLog2e = 1.4426950408889634f;
  if (lse == -INFINITY) return 0.f;
  const bool softcap = p.softcap > 0.f;
  const float exp_scale = (softcap ? p.softcap : p.softmax_scale) * kLog2e;
  const float prescale = softcap ? p.softmax_scale / p.softcap : 0.f;
  const float lse2 = lse * kLog2e;
  float d = 0.f;
  for (int j = r.key_begin; j < r.key_end; ++j) {
    float s = group_dot<kGroup>(r.q, r.k + j * r.k_row_stride, head_dim, part, lanes);
    const float dp = group_dot<kGroup>(r.dout, r.v + j * r.v_row_stride, head_dim, part, lanes);
    if (softcap) s = tanhf(s * prescale);
    d += exp2f(s * exp_scale - lse2) * dp;
  }
  return d;
}

}  // namespace flashcute
