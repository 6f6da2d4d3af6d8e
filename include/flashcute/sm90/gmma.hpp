// flashcute/sm90/gmma.hpp: warpgroup MMA helpers of the sm90a kernels: the views of a wgmma
// accumulator that the softmax and the next GEMM need, and a whole GEMM issued as one wgmma batch.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace flashcute::sm90 {

// A wgmma accumulator ((2,2,N/8),MMA_M,MMA_N) as (row, col): ((2,MMA_M),(2,N/8,MMA_N)). Per
// warp it is the m16n8 accumulator repeated along N: value 0/1 are adjacent columns, value +2
// is row + 8, the third mode steps 8 columns.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto gmma_rowcol_layout(Layout const& acc) {
  using namespace cute;
  static_assert(decltype(rank<0>(acc))::value == 3);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// The same accumulator as the register A operand of the next wgmma (K = its N):
// ((2,2,2),MMA_M,(N/16,MMA_N)). Two neighbouring 8-column groups form one k16 slice, in the order
// the RS wgmma expects (column pair, row + 8, k + 8): a view, no data moves.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto gmma_acc_to_a_layout(Layout const& acc) {
  using namespace cute;
  auto split = logical_divide(acc, Shape<Shape<_1, _1, _2>, _1, _1>{});  // ((2,2,(2,N/16)),MMA_M,MMA_N)
  return make_layout(make_layout(get<0, 0>(split), get<0, 1>(split), get<0, 2, 0>(split)), get<1>(split),
                     make_layout(get<0, 2, 1>(split), get<2>(split)));
}

// Issues C (+)= A B over every k slice as one wgmma batch (not waited for). kZeroInit: the first
// slice overwrites C; kARegs: A is a register fragment (RS), not shared-memory descriptors (SS).
template <bool kZeroInit, bool kARegs, class TiledMma, class TA, class TB, class TC>
CUTE_DEVICE void wgmma_gemm(TiledMma& tiled_mma, TA const& tCrA, TB const& tCrB, TC& tCrC) {
  using namespace cute;
  if constexpr (kARegs) warpgroup_fence_operand(const_cast<TA&>(tCrA));
  warpgroup_fence_operand(tCrC);
  warpgroup_arrive();  // the accumulator's (and P's) register writes are visible to wgmma
  if constexpr (kZeroInit) tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), tCrC);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tCrC);
  if constexpr (kARegs) warpgroup_fence_operand(const_cast<TA&>(tCrA));
}

}  // namespace flashcute::sm90
