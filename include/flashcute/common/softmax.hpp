// flashcute/common/softmax.hpp: the online softmax, one statement per step.
//
// Scores stay unscaled in registers; scale_log2 = score_scale * log2(e) is folded
// into the exponent, so each probability is one FFMA and one exp2. Row sums stay
// per-thread partial sums until finalize(), so the main loop reduces across the
// four threads of a row (two shuffles) only for the max.
#pragma once

#include <cute/tensor.hpp>

namespace flashcute {

// Reduction over the 4 threads (lane % 4) that share an MMA accumulator row.
template <class Op>
CUTE_DEVICE float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffff, x, 1));
  x = op(x, __shfl_xor_sync(0xffffffff, x, 2));
  return x;
}

struct MaxOp {
  CUTE_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  CUTE_DEVICE float operator()(float a, float b) const { return a + b; }
};

template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];  // running max of the raw scores, full row
  float row_sum[kRows];  // running sum of exp, this thread's columns only
  float scale_log2;      // score scale * log2(e)

  CUTE_DEVICE explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      row_max[i] = -INFINITY;
      row_sum[i] = 0.f;
    }
  }

  // The maximum of row i over the running one and this block's scores (a ((2,MMA_M),(2,MMA_N))
  // row/col view), across the row's four threads.
  template <class Scores>
  CUTE_DEVICE float block_row_max(Scores const& scores, int i) const {
    float tile_max = row_max[i];
    CUTE_UNROLL
    for (int j = 0; j < cute::size<1>(scores); ++j) tile_max = fmaxf(tile_max, scores(i, j));
    return quad_allreduce(tile_max, MaxOp{});
  }

  // Row i of scores into exp2(score * scale_log2 - base); returns this thread's sum of them.
  template <class Scores>
  CUTE_DEVICE float exp_row(Scores& scores, int i, float base) const {
    float tile_sum = 0.f;
    CUTE_UNROLL
    for (int j = 0; j < cute::size<1>(scores); ++j) {
      scores(i, j) = exp2f(scores(i, j) * scale_log2 - base);
      tile_sum += scores(i, j);
    }
    return tile_sum;
  }

  // Row i of scores into unnormalised probabilities against the row's new running max; returns
  // how much the row of O must shrink.
  template <class Scores>
  CUTE_DEVICE float rescale_row(Scores& scores, int i) {
    const float new_max = block_row_max(scores, i);
    // A row that has seen no visible key keeps max -inf; use 0 as its base so exp2 stays finite (and gives 0).
    const float base = new_max == -INFINITY ? 0.f : new_max * scale_log2;
    const float rescale = exp2f(row_max[i] * scale_log2 - base);
    row_max[i] = new_max;
    const float tile_sum = exp_row(scores, i, base);
    row_sum[i] = row_sum[i] * rescale + tile_sum;
    return rescale;
  }

  // scores, acc_o: ((2,MMA_M),(2,MMA_N)) row/col views. Turns scores into
  // unnormalised probabilities and rescales acc_o to the new running max, row by row.
  template <class Scores, class AccO>
  CUTE_DEVICE void update(Scores& scores, AccO& acc_o) {
    static_assert(decltype(cute::size<0>(scores))::value == kRows);
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const float rescale = rescale_row(scores, i);
      CUTE_UNROLL
      for (int j = 0; j < cute::size<1>(acc_o); ++j) acc_o(i, j) *= rescale;
    }
  }

  // How far a row's maximum may grow, in log2 units of the probabilities, before rescale_scores_lazy
  // moves it: probabilities stay at most 2^8, exact in bf16 and fp16 (P V accumulates in fp32).
  static constexpr float kMaxGrowthLog2 = 8.f;

  // update() in two halves, for a kernel whose P V of the previous block is still in flight while
  // it exponentiates the next scores (sm90): rescale_scores_lazy() turns scores into probabilities
  // and says how much acc_o must shrink; rescale_o() applies that once the accumulator is settled.
  // The maximum is FlashAttention-4's lazy one: it only has to bound the exponentials, so a row
  // keeps it until a block raises it by more than kMaxGrowthLog2 (the sum and O use the same one,
  // so the result is the same). Returns whether any of this thread's rows moved (rescale[i] != 1):
  // where no row of a warp did, O need not be touched.
  template <class Scores>
  CUTE_DEVICE bool rescale_scores_lazy(Scores& scores, float (&rescale)[kRows]) {
    static_assert(decltype(cute::size<0>(scores))::value == kRows);
    bool moved = false;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const float new_max = block_row_max(scores, i);
      // +inf at the row's first visible key; NaN (not taken) while it has seen none.
      const float growth = (new_max - row_max[i]) * scale_log2;
      const bool grows = growth > kMaxGrowthLog2;
      // A row that had seen no visible key has O = 0 and sum 0: nothing to shrink.
      const bool shrinks = grows && row_max[i] != -INFINITY;
      rescale[i] = shrinks ? exp2f(-growth) : 1.f;
      moved |= shrinks;
      row_max[i] = grows ? new_max : row_max[i];
      // A row that has seen no visible key keeps max -inf; use 0 as its base so exp2 stays finite (and gives 0).
      const float base = row_max[i] == -INFINITY ? 0.f : row_max[i] * scale_log2;
      row_sum[i] = row_sum[i] * rescale[i] + exp_row(scores, i, base);
    }
    return moved;
  }

  template <class AccO>
  CUTE_DEVICE static void rescale_o(AccO& acc_o, float const (&rescale)[kRows]) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < cute::size<1>(acc_o); ++j) acc_o(i, j) *= rescale[i];
    }
  }

  // Normalises acc_o and returns each row's natural-log logsumexp in lse[]
  // (-inf, with acc_o zeroed, for rows that saw no visible key).
  template <class AccO>
  CUTE_DEVICE void finalize(AccO& acc_o, float (&lse)[kRows]) {
    constexpr float kLn2 = 0.6931471805599453f;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const float sum = quad_allreduce(row_sum[i], SumOp{});
      const bool empty = sum == 0.f;
      const float inv_sum = empty ? 0.f : 1.f / sum;
      lse[i] = empty ? -INFINITY : (row_max[i] * scale_log2 + __log2f(sum)) * kLn2;
      CUTE_UNROLL
      for (int j = 0; j < cute::size<1>(acc_o); ++j) acc_o(i, j) *= inv_sum;
    }
  }
};

}  // namespace flashcute
