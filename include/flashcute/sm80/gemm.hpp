// flashcute/sm80/gemm.hpp: warp-level tiled GEMMs on m16n8k16 tensor cores.
//
// Both GEMMs accumulate into fp32 registers and keep one k-slice of operands
// in flight: ldmatrix for slice k+1 is issued before the MMAs of slice k, so
// shared-memory latency hides behind tensor-core work.
#pragma once

#include <cute/tensor.hpp>

namespace flashcute::sm80 {

// acc += A * B^T with both operands read from shared memory (S = Q K^T).
// tCrA/tCrB: MMA register fragments (MMA,MMA_M,MMA_K)/(MMA,MMA_N,MMA_K);
// tCsA/tCsB: the ldmatrix partitions of shared memory; tCrA_view/tCrB_view: the
// same registers as the ldmatrix destination.
template <class TiledMma, class Acc, class RegA, class RegB, class SmemA, class SmemB, class ViewA, class ViewB,
          class CopyA, class CopyB>
CUTE_DEVICE void gemm_ss(TiledMma const& tiled_mma, Acc& acc, RegA& tCrA, RegB& tCrB, SmemA const& tCsA,
                         SmemB const& tCsB, ViewA& tCrA_view, ViewB& tCrB_view, CopyA const& copy_a,
                         CopyB const& copy_b) {
  CUTE_STATIC_ASSERT_V(cute::size<1>(tCrA) == cute::size<1>(acc));  // MMA_M
  CUTE_STATIC_ASSERT_V(cute::size<1>(tCrB) == cute::size<2>(acc));  // MMA_N
  CUTE_STATIC_ASSERT_V(cute::size<2>(tCrA) == cute::size<2>(tCrB));  // MMA_K
  constexpr int kSlices = decltype(cute::size<2>(tCrA))::value;
  cute::copy(copy_a, tCsA(cute::_, cute::_, 0), tCrA_view(cute::_, cute::_, 0));
  cute::copy(copy_b, tCsB(cute::_, cute::_, 0), tCrB_view(cute::_, cute::_, 0));
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    if (k + 1 < kSlices) {
      cute::copy(copy_a, tCsA(cute::_, cute::_, k + 1), tCrA_view(cute::_, cute::_, k + 1));
      cute::copy(copy_b, tCsB(cute::_, cute::_, k + 1), tCrB_view(cute::_, cute::_, k + 1));
    }
    cute::gemm(tiled_mma, tCrA(cute::_, cute::_, k), tCrB(cute::_, cute::_, k), acc);
  }
}

// acc += A * B^T with A already in registers (O += P V, P straight from the softmax;
// and S = Q K^T when Q is held in registers).
template <class TiledMma, class Acc, class RegA, class RegB, class SmemB, class ViewB, class CopyB>
CUTE_DEVICE void gemm_rs(TiledMma const& tiled_mma, Acc& acc, RegA const& tCrA, RegB& tCrB, SmemB const& tCsB,
                         ViewB& tCrB_view, CopyB const& copy_b) {
  CUTE_STATIC_ASSERT_V(cute::size<1>(tCrA) == cute::size<1>(acc));  // MMA_M
  CUTE_STATIC_ASSERT_V(cute::size<1>(tCrB) == cute::size<2>(acc));  // MMA_N
  CUTE_STATIC_ASSERT_V(cute::size<2>(tCrA) == cute::size<2>(tCrB));  // MMA_K
  constexpr int kSlices = decltype(cute::size<2>(tCrA))::value;
  cute::copy(copy_b, tCsB(cute::_, cute::_, 0), tCrB_view(cute::_, cute::_, 0));
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    if (k + 1 < kSlices) {
      cute::copy(copy_b, tCsB(cute::_, cute::_, k + 1), tCrB_view(cute::_, cute::_, k + 1));
    }
    cute::gemm(tiled_mma, tCrA(cute::_, cute::_, k), tCrB(cute::_, cute::_, k), acc);
  }
}

}  // namespace flashcute::sm80
