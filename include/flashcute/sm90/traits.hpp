// flashcute/sm90/traits.hpp: everything an sm90a forward kernel derives from its FwdConfig.
//
// The wgmma tiled MMAs (Q K^T from shared memory, P V with P in registers), the shared-memory
// layouts they read (GMMA swizzle atoms, V used MN-major as it lies in memory, no transpose), and
// the TMA copies that fill them. The kernel body only uses these.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "flashcute/common/element.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/sm90/config.hpp"
#include "flashcute/sm90/pipeline.hpp"
#include "flashcute/sm90/scheduler.hpp"
#include "flashcute/sm90/wgmma_atoms.hpp"

namespace flashcute::sm90 {

// The wgmma of S = Q K^T for n keys over k = d: CuTe's selector, or this library's atom where
// CuTe's core set lacks the shape (wgmma_atoms.hpp).
template <class Element, int kN, int kK>
constexpr auto qk_op() {
  using namespace cute;
  if constexpr (kN == 80) return Wgmma64x80x16SS<Element, GMMA::Major::K, GMMA::Major::K>{};
  else return GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kN>, Int<kK>>>();
}
// The N of one atom of a tiled wgmma.
template <class TiledMma>
constexpr int gmma_n = cute::size<1>(typename TiledMma::AtomShape_MNK{});

// Rows of kCols elements copied 16 bytes a thread by a warpgroup (128 threads), as many
// threads a row as divide its 16-byte chunks (16, 8 or 4): the epilogues' stores of a tile read
// back from shared memory.
template <class Element, int kCols>
constexpr int gmem_row_threads() {
  constexpr int kPerChunk = 16 / int(sizeof(Element));
  static_assert(kCols % kPerChunk == 0, "a row is whole 16-byte chunks");
  constexpr int kChunks = kCols / kPerChunk;
  return kChunks % 16 == 0 ? 16 : (kChunks % 8 == 0 ? 8 : 4);
}
template <class Element, int kCols>
using GmemRowCopy = decltype(cute::make_tiled_copy(
    cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{},
    cute::Layout<cute::Shape<cute::Int<128 / gmem_row_threads<Element, kCols>()>,
                             cute::Int<gmem_row_threads<Element, kCols>()>>,
                 cute::Stride<cute::Int<gmem_row_threads<Element, kCols>()>, cute::_1>>{},
    cute::Layout<cute::Shape<cute::_1, cute::Int<16 / int(sizeof(Element))>>>{}));

// The widest GMMA swizzle atom that tiles a (rows, cols) tile: 128 B rows where the contiguous
// extent allows, else 64 B or 32 B. kMajor says which extent is contiguous (K: cols; MN: rows).
template <class Element, cute::GMMA::Major kMajor, int kContiguous>
constexpr auto gmma_smem_atom() {
  using namespace cute;
  constexpr bool kK = kMajor == GMMA::Major::K;
  if constexpr (kContiguous % 64 == 0) {
    if constexpr (kK) return GMMA::Layout_K_SW128_Atom<Element>{};
    else return GMMA::Layout_MN_SW128_Atom<Element>{};
  } else if constexpr (kContiguous % 32 == 0) {
    if constexpr (kK) return GMMA::Layout_K_SW64_Atom<Element>{};
    else return GMMA::Layout_MN_SW64_Atom<Element>{};
  } else {
    static_assert(kContiguous % 16 == 0, "a GMMA tile needs 16-element (32 B) rows");
    if constexpr (kK) return GMMA::Layout_K_SW32_Atom<Element>{};
    else return GMMA::Layout_MN_SW32_Atom<Element>{};
  }
}

// A kernel for config kCfg over the batches kMode says (config.hpp, FwdMode).
template <DType kDType, FwdConfig kCfg, FwdMode kMode = FwdMode::kFixed>
struct FwdTraits {
  static_assert(validate(kCfg) == nullptr, "invalid sm90 FwdConfig: see flashcute::sm90::validate");
  using Element = typename ElementOf<kDType>::type;

  static constexpr FwdConfig kConfig = kCfg;
  static constexpr FwdMode kFwdMode = kMode;
  static constexpr bool kVarlen = kMode == FwdMode::kVarlen || kMode == FwdMode::kVarlenMixed;
  static constexpr bool kKvcache = kMode == FwdMode::kKvcache;
  // Each tile carries its own lengths (WorkTile::sequence), and the consumers' mask is set to them.
  static constexpr bool kTileLengths = kMode != FwdMode::kFixed;
  // A KV cache's K/V load: keys per TMA box, the smallest page size (and a divisor of block_n).
  static constexpr int kBoxRows = 16;
  // ... and in boxes of 64 keys, from pages of 64 keys or more, where a block is several of them
  // (fewer TMA instructions: 16-key boxes cost d 128 about half its speed; 0: none).
  static constexpr int kMidBoxRows = kCfg.block_n > 64 && kCfg.block_n % 64 == 0 ? 64 : 0;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kHeadDim = kCfg.head_dim;
  static constexpr int kStages = kCfg.stages;
  static constexpr int kQStages = kCfg.q_stages;
  static constexpr int kConsumerWarpgroups = kCfg.consumer_warpgroups();
  static constexpr int kNThreads = kCfg.num_threads();
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;

  using BlkM = cute::Int<kBlockM>;
  using BlkN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;

  // One 64-row wgmma atom per consumer warpgroup, stacked along M.
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>;
  // S = Q K^T: (BLK_M,BLK_N) over K = D; both operands K-major in shared memory.
  using TiledMmaQK = decltype(cute::make_tiled_mma(qk_op<Element, kBlockN, kHeadDim>(), AtomLayout{}));
  // The left half of S, (BLK_M,BLK_N/2): only its layouts are used, to view the first half of an S
  // accumulator (the same registers: the accumulator's 8-column groups run left to right).
  using TiledMmaQKHalf = decltype(cute::make_tiled_mma(qk_op<Element, kBlockN / 2, kHeadDim>(), AtomLayout{}));
  // O += P V: (BLK_M,D) over K = BLK_N; P from registers, V MN-major (d contiguous, as stored).
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<BlkM, HeadDim, BlkN>, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      AtomLayout{}));
  // One wgmma spans each GEMM's N: CuTe's selectors fall back to a narrower atom, repeated, for an
  // N outside the shapes they know (wgmma_atoms.hpp), which would compile and run slowly.
  static_assert(gmma_n<TiledMmaQK> == kBlockN && gmma_n<TiledMmaPV> == kHeadDim,
                "a wgmma shape the kernels need has no atom: add it to sm90/wgmma_atoms.hpp");

  using SmemLayoutQ = decltype(cute::tile_to_shape(gmma_smem_atom<Element, cute::GMMA::Major::K, kHeadDim>(),
                                                   cute::Shape<BlkM, HeadDim, cute::Int<kQStages>>{}));  // (BLK_M,D,QPIPE)
  using SmemLayoutK = decltype(cute::tile_to_shape(gmma_smem_atom<Element, cute::GMMA::Major::K, kHeadDim>(),
                                                   cute::Shape<BlkN, HeadDim, cute::Int<kStages>>{}));  // (BLK_N,D,PIPE)
  // V^T: (D,BLK_N,PIPE), d contiguous; atoms tile along the keys first.
  using SmemLayoutVt = decltype(cute::tile_to_shape(gmma_smem_atom<Element, cute::GMMA::Major::MN, kHeadDim>(),
                                                    cute::Shape<HeadDim, BlkN, cute::Int<kStages>>{},
                                                    cute::Step<cute::_2, cute::_1, cute::_3>{}));

  // O staged for the epilogue (config o_smem): (BLK_M,D), consumer warpgroup w owning rows
  // [64 w, 64 w + 64). Written by stmatrix from the P V accumulators' layout, read back 16 bytes
  // a thread (GmemRowCopy), and stored to global memory the same way.
  using SmemLayoutO = decltype(cute::tile_to_shape(gmma_smem_atom<Element, cute::GMMA::Major::K, kHeadDim>(),
                                                   cute::Shape<BlkM, HeadDim>{}));  // (BLK_M,D)
  using SmemCopyAtomO = cute::Copy_Atom<cute::SM90_U32x4_STSM_N, Element>;
  using GmemTiledCopyO = GmemRowCopy<Element, kHeadDim>;

  // Global tensors as the TMA descriptors see them: (seqlen, d, head, batch) for Q and K,
  // (d, seqlen, head, batch) for V (the transposed view of the same memory).
  using ShapeQKV = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideQK = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using StrideVt = cute::Stride<cute::_1, int64_t, int64_t, int64_t>;
  using GmemQK = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{},
                                            StrideQK{}));
  using GmemVt = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{},
                                            StrideVt{}));
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemQK{}, cute::take<0, 2>(SmemLayoutQ{})));
  // kKvcache: one box of kRows keys, laid out as those rows of a K (V^T) buffer: each box fills a
  // contiguous, whole-atom part of every 64-column slice of the buffer.
  template <int kRows>
  using SmemLayoutKRows = decltype(cute::tile_to_shape(gmma_smem_atom<Element, cute::GMMA::Major::K, kHeadDim>(),
                                                       cute::Shape<cute::Int<kRows>, HeadDim>{}));  // (BOX,D)
  template <int kRows>
  using SmemLayoutVtRows = decltype(cute::tile_to_shape(gmma_smem_atom<Element, cute::GMMA::Major::MN, kHeadDim>(),
                                                        cute::Shape<HeadDim, cute::Int<kRows>>{},
                                                        cute::Step<cute::_2, cute::_1>{}));  // (D,BOX)
  using SmemLayoutKBox = SmemLayoutKRows<kBoxRows>;
  using SmemLayoutVtBox = SmemLayoutVtRows<kBoxRows>;
  static_assert(kBlockN % kBoxRows == 0, "a key block is whole boxes");
  // Whole key blocks (every mode; a KV cache's blocks that lie in one page and hold no row past
  // the keys), and kKvcache's boxes.
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemQK{}, cute::take<0, 2>(SmemLayoutK{})));
  using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemVt{}, cute::take<0, 2>(SmemLayoutVt{})));
  struct NoTma {};
  using TmaKBox = std::conditional_t<
      kKvcache, decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemQK{}, SmemLayoutKBox{})), NoTma>;
  using TmaVBox = std::conditional_t<
      kKvcache, decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemVt{}, SmemLayoutVtBox{})), NoTma>;
  static constexpr int kMidRows = kMidBoxRows > 0 ? kMidBoxRows : kBoxRows;  // (a type for every config)
  using TmaKMid = std::conditional_t<
      (kKvcache && kMidBoxRows > 0),
      decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemQK{}, SmemLayoutKRows<kMidRows>{})), NoTma>;
  using TmaVMid = std::conditional_t<
      (kKvcache && kMidBoxRows > 0),
      decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemVt{}, SmemLayoutVtRows<kMidRows>{})), NoTma>;

  // Bytes one TMA load of a tile writes (out-of-bounds elements are zero-filled and count too).
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKvBytes = kBlockN * kHeadDim * sizeof(Element);

  struct NoOStorage {};
  struct NoFixStorage {};
  // kKvcache: the producer threads' own barriers (K's, V's) for a key block they mend before the
  // consumers read it (FwdMainloop::load_cache_block).
  struct FixBarriers {
    uint64_t k, v;
  };
  using FixStorage = std::conditional_t<kKvcache, FixBarriers, NoFixStorage>;
  using OStorage =
      std::conditional_t<kCfg.o_smem, cute::array_aligned<Element, cute::cosize_v<SmemLayoutO>, 1024>, NoOStorage>;
  struct SharedStorage {
    // 1024 B alignment: the 128 B swizzle pattern repeats every 8 rows of 128 B.
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutVt>, 1024> v;
    OStorage o;
    PipelineBarriers<kQStages> q_bar;  // Q (persistent CTAs reload it per tile)
    PipelineBarriers<kStages> k_bar;
    PipelineBarriers<kStages> v_bar;
    FixStorage fix_bar;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared storage exceeds 227 KB");
};

// What the kernel receives: the plain params and the three TMA descriptors built from them.
template <class Traits>
struct FwdKernelParams {
  FwdParams params;
  TileSchedule schedule;  // how the CTAs walk the tiles (scheduler.hpp)
  typename Traits::TmaQ tma_q;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  FastDivmod div_heads;  // by params.nheads: a tile's (batch, head) from batch * nheads + head
  typename Traits::TmaKBox tma_k_box;  // kKvcache only: the same arrays in boxes of kBoxRows keys
  typename Traits::TmaVBox tma_v_box;
  typename Traits::TmaKMid tma_k_mid;  // and in boxes of kMidBoxRows keys, where the config has them
  typename Traits::TmaVMid tma_v_mid;
};

}  // namespace flashcute::sm90
