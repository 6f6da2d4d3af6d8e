// flashcute/sm80/traits_bwd.hpp: everything the sm80 backward kernels derive from their BwdConfig.
//
// Both main kernels use the forward's building blocks: m16n8k16 MMAs with warps stacked along the
// rows (so every row's reductions stay in one warp), swizzled row-major tiles in shared memory,
// ldmatrix (transposed for the operands read across the head dim) and zero-filling cp.async.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>

#include "flashcute/common/element.hpp"
#include "flashcute/sm80/config_bwd.hpp"
#include "flashcute/sm80/traits.hpp"  // SmemLayoutAtom

namespace flashcute::sm80 {

template <DType kDType, BwdConfig kCfg>
struct BwdTraits {
  static_assert(validate_bwd(kCfg) == nullptr, "invalid BwdConfig: see flashcute::sm80::validate_bwd");

  using Element = typename ElementOf<kDType>::type;
  static constexpr BwdConfig kConfig = kCfg;
  static constexpr int kHeadDim = kCfg.head_dim;

  // dk/dv kernel.
  static constexpr int kKvWarps = kCfg.kv_warps;
  static constexpr int kKvThreads = 32 * kKvWarps;
  static constexpr int kKvBlockN = kCfg.kv_block_n();
  static constexpr int kKvBlockM = kCfg.kv_block_m;
  static constexpr int kDSplit = kCfg.d_split;
  static constexpr int kKvCols = kCfg.kv_cols();
  static constexpr int kKvSmemBytes = kCfg.kv_smem_bytes() + 2 * 2 * kKvBlockM * int(sizeof(float));  // + lse, dsum
  // dq kernel.
  static constexpr int kQWarps = kCfg.q_warps;
  static constexpr int kQThreads = 32 * kQWarps;
  static constexpr int kQBlockM = kCfg.q_block_m();
  static constexpr int kQBlockN = kCfg.q_block_n;
  static constexpr int kQSmemBytes = kCfg.q_smem_bytes();

  using MmaOp = std::conditional_t<kDType == DType::kBFloat16, cute::SM80_16x8x16_F32BF16BF16F32_TN,
                                   cute::SM80_16x8x16_F32F16F16F32_TN>;
  // kWarps warps stacked along M, each with 16 rows; 16 wide in N so one ldmatrix.x4 feeds two n8 atoms.
  template <int kWarps>
  using TiledMmaRows = cute::TiledMMA<cute::MMA_Atom<MmaOp>, cute::Layout<cute::Shape<cute::Int<kWarps>, cute::_1, cute::_1>>,
                                      cute::Tile<cute::Int<16 * kWarps>, cute::_16, cute::_16>>;
  using TiledMmaKv = TiledMmaRows<kKvWarps>;
  using TiledMmaQ = TiledMmaRows<kQWarps>;

  // Shared memory: (ROWS,D) row-major swizzled tiles, and their (D,ROWS) transposed views.
  static constexpr int kAtomCols = BwdConfig::atom_cols(kHeadDim);
  template <int kRows>
  using SmemLayoutRows = decltype(cute::tile_to_shape(SmemLayoutAtom<kAtomCols>{},
                                                      cute::Shape<cute::Int<kRows>, cute::Int<kHeadDim>>{}));  // (ROWS,D)
  template <int kRows>
  using SmemLayoutRowsT = decltype(cute::composition(
      SmemLayoutRows<kRows>{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kRows>>{}, cute::GenRowMajor{})));  // (D,ROWS)
  // The dk/dv output tile staged for its store: (BLK_N, KV_COLS).
  using SmemLayoutKvOut = decltype(cute::tile_to_shape(SmemLayoutAtom<BwdConfig::atom_cols(kKvCols)>{},
                                                       cute::Shape<cute::Int<kKvBlockN>, cute::Int<kKvCols>>{}));

  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomStore = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  // Global <-> shared, 16 B per thread per step, kCols / 8 threads per row.
  static constexpr int kElemsPerChunk = 16 / int(sizeof(Element));
  template <int kThreads, int kCols>
  using GmemThreadLayout =
      cute::Layout<cute::Shape<cute::Int<kThreads / (BwdConfig::atom_cols(kCols) / kElemsPerChunk)>,
                               cute::Int<BwdConfig::atom_cols(kCols) / kElemsPerChunk>>,
                   cute::Stride<cute::Int<BwdConfig::atom_cols(kCols) / kElemsPerChunk>, cute::_1>>;
  using GmemValLayout = cute::Layout<cute::Shape<cute::_1, cute::Int<kElemsPerChunk>>>;
  template <int kThreads>
  using GmemTiledCopyLoad = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>, Element>{},
      GmemThreadLayout<kThreads, kHeadDim>{}, GmemValLayout{}));
  template <int kThreads, int kCols>
  using GmemTiledCopyStore = decltype(cute::make_tiled_copy(cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{},
                                                            GmemThreadLayout<kThreads, kCols>{}, GmemValLayout{}));
};

}  // namespace flashcute::sm80
