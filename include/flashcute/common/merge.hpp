// flashcute/common/merge.hpp: what the merges of partial attentions share (the split-KV kernel's
// warps, the combine kernel's splits).
#pragma once

#include <cute/config.hpp>

namespace flashcute {

// max(a, b), NaN if either is NaN (fmaxf drops it): a NaN partial (a key on a page outside the
// cache) keeps its row NaN even where every other part is empty.
CUTE_HOST_DEVICE float max_nan(float a, float b) { return a > b || a != a ? a : b; }

}  // namespace flashcute
