// flashcute/sm80/traits.hpp: everything an sm80 forward kernel derives from its FwdConfig.
//
// One place builds the element types, the MMA, the swizzled shared-memory
// layouts and the copy atoms; the kernel body only uses them.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>

#include "flashcute/common/element.hpp"
#include "flashcute/sm80/config.hpp"

namespace flashcute::sm80 {

// The swizzled shared-memory row atom: 8 rows of 32 or 64 halves.
// Without the swizzle, the 8 rows an ldmatrix phase reads (same 16 B column,
// consecutive rows, row pitch a multiple of 128 B) would all hit the same four
// banks; XOR-ing the 16 B chunk index with the row index spreads them over all 32.
template <int kAtomCols>
using SmemLayoutAtom = decltype(cute::composition(
    cute::Swizzle<kAtomCols == 64 ? 3 : 2, 3, 3>{},
    cute::Layout<cute::Shape<cute::_8, cute::Int<kAtomCols>>, cute::Stride<cute::Int<kAtomCols>, cute::_1>>{}));

template <DType kDType, FwdConfig kCfg>
struct FwdTraits {
  static_assert(validate(kCfg) == nullptr, "invalid FwdConfig: see flashcute::validate");

  using Element = typename ElementOf<kDType>::type;
  using ElementAccum = float;

  static constexpr FwdConfig kConfig = kCfg;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kHeadDim = kCfg.head_dim;
  static constexpr int kNWarps = kCfg.num_warps;
  static constexpr int kNThreads = kCfg.num_threads();
  static constexpr int kMinCtasPerSm = kCfg.min_ctas_per_sm;
  static constexpr bool kBranchFreeRefill = kCfg.branch_free_refill;
  static constexpr bool kQInRegs = kCfg.q_in_regs;
  static constexpr bool kMaskSplit = kCfg.mask_split;
  static constexpr bool kSplitKv = kCfg.split_kv;
  static constexpr int kKvStages = kCfg.kv_stages;
  static constexpr bool kWarpSplit = kCfg.warp_split;
  static constexpr KvLayout kKvLayout = kCfg.kv_layout;
  static constexpr int kSmemBytes = kCfg.smem_bytes(int(sizeof(Element)));
  static constexpr int kPageSlotsOffset = kCfg.page_slots_offset(int(sizeof(Element)));

  // Tensor cores: m16n8k16 with fp32 accumulators. Warps are stacked along M, so
  // each warp owns whole query rows and the softmax never crosses warps. The
  // permutation tile is 16 wide in N so that one ldmatrix.x4 feeds two n8 atoms.
  using MmaOp = std::conditional_t<kDType == DType::kBFloat16, cute::SM80_16x8x16_F32BF16BF16F32_TN,
                                   cute::SM80_16x8x16_F32F16F16F32_TN>;
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<MmaOp>, cute::Layout<cute::Shape<cute::Int<kNWarps>, cute::_1, cute::_1>>,
                                  cute::Tile<cute::Int<16 * kNWarps>, cute::_16, cute::_16>>;

  // Shared memory.
  static constexpr int kAtomCols = kCfg.smem_atom_cols();
  using SmemLayoutQ = decltype(cute::tile_to_shape(SmemLayoutAtom<kAtomCols>{},
                                                   cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));  // (BLK_M,D)
  using SmemLayoutKV = decltype(cute::tile_to_shape(SmemLayoutAtom<kAtomCols>{},
                                                    cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));  // (BLK_N,D)
  // V read as the (D, BLK_N) B operand of P*V: the same bytes, indexed transposed.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{}, cute::GenRowMajor{})));  // (D,BLK_N)
  using SmemLayoutO = SmemLayoutQ;  // O is staged in Q's buffer

  // Shared -> registers: ldmatrix.x4, transposed for V.
  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  // Registers -> shared for the O tile (each thread holds pairs of adjacent columns).
  using SmemCopyAtomO = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  // Global <-> shared: 16 B per thread per step, a row atom's width per thread row.
  static constexpr int kElemsPerChunk = 16 / int(sizeof(Element));
  static constexpr int kThreadsPerRow = kAtomCols / kElemsPerChunk;
  using GmemThreadLayout = cute::Layout<cute::Shape<cute::Int<kNThreads / kThreadsPerRow>, cute::Int<kThreadsPerRow>>,
                                        cute::Stride<cute::Int<kThreadsPerRow>, cute::_1>>;
  using GmemValLayout = cute::Layout<cute::Shape<cute::_1, cute::Int<kElemsPerChunk>>>;
  // Zero-filling cp.async: predicated-off chunks (ragged rows, columns past the head dim) become zeros.
  using GmemTiledCopyQKV = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>, Element>{}, GmemThreadLayout{},
      GmemValLayout{}));
  using GmemTiledCopyO = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{}, GmemThreadLayout{}, GmemValLayout{}));

  static_assert(kBlockN % (kNThreads / kThreadsPerRow) == 0 && kBlockM % (kNThreads / kThreadsPerRow) == 0);
};

}  // namespace flashcute::sm80
