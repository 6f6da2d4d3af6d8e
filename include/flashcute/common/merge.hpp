// flashcute/common/merge.hpp: what the merges of partial attentions share (the split-KV kernel's
// warps, the combine kernel's splits).
#pragma once

#include <cute/config.hpp>

#include <cmath>

namespace flashcute {

// max(a, b), NaN if either is NaN (fmaxf drops it): a NaN partial (a key on a page outside the
// cache) keeps its row NaN even where every other part is empty.
CUTE_HOST_DEVICE float max_nan(float a, float b) { return a > b || a != a ? a : b; }

// The merge of N partial attentions by their lse: returns the merged lse and sets weight[i] =
// e^(part[i] - lse), the factor of part i's normalised output. Empty parts (lse -inf) weigh 0, all
// empty gives -inf and weights 0; a NaN part makes the lse and every weight NaN.
template <int N>
CUTE_HOST_DEVICE float merge_lse(const float (&part)[N], float (&weight)[N]) {
  float max_lse = part[0];
  CUTE_UNROLL
  for (int i = 1; i < N; ++i) max_lse = max_nan(max_lse, part[i]);
  float sum = 0.f;
  CUTE_UNROLL
  for (int i = 0; i < N; ++i) sum += max_lse == -INFINITY ? 0.f : expf(part[i] - max_lse);
  const float lse = max_lse == -INFINITY ? -INFINITY : max_lse + logf(sum);
  CUTE_UNROLL
  for (int i = 0; i < N; ++i) weight[i] = lse == -INFINITY ? 0.f : expf(part[i] - lse);
  return lse;
}

}  // namespace flashcute
