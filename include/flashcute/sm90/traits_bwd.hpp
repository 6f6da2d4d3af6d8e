// flashcute/sm90/traits_bwd.hpp: the static configuration of the sm90a backward, and everything
// its kernels derive from it.
//
// A CTA owns block_n keys of one (batch, KV head) and walks the query blocks that see them, for
// every query head of the KV head's group (FlashAttention-3's order, GQA summed in registers).
// Two MMA warpgroups own 64 keys each and compute the transposed tiles S^T = K Q^T and
// dP^T = V dO^T (FlashAttention-3's SdP_swapAB): the accumulators already sit where the A operand
// of dV += P^T dO and dK += dS^T Q wants them, so P never touches shared memory; dS goes there
// once, for dQ = dS K, which the warpgroups split in halves or warpgroup 1 computes alone.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "flashcute/common/element.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/sm90/config.hpp"
#include "flashcute/sm90/pipeline.hpp"
#include "flashcute/sm90/traits.hpp"

namespace flashcute::sm90 {

// What both designs derive alike from a config: the element type, the block sizes, the Q/dO and
// K/V layouts with their transposed views, the TMA copies that fill them, and the 16-byte stores of
// the dK/dV epilogue.
template <DType kDType, BwdConfig kCfg>
struct BwdTraitsBase {
  static_assert(kCfg.head_dim % 64 == 0, "head dims of whole 128-byte swizzle rows");
  using Element = typename ElementOf<kDType>::type;
  static constexpr BwdConfig kConfig = kCfg;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kHeadDim = kCfg.head_dim;
  static constexpr int kStages = kCfg.stages;
  static constexpr int kMmaWarpgroups = kCfg.mma_warpgroups();
  static constexpr int kNThreads = kCfg.num_threads();
  static constexpr int kMmaThreads = 128 * kMmaWarpgroups;
  // The main kernel persistent (bwd_kernel_persistent): two-way dQ only, never rotated.
  static constexpr bool kPersistent = kCfg.persistent;
  static_assert(!kPersistent || (!kCfg.split_d && !kCfg.dq_one_wg && !kCfg.rotate),
                "persistent: two-way dQ, not split_d, walks not rotated (BwdConfig::persistent)");
  // A step's dQ, fp32, one contiguous chunk a warpgroup of TiledMmaDQ in its fragment order
  // (value pair p of the warpgroup's thread t at 2 (p 128 + t)): added so into the global
  // accumulator, read so by the postprocess. (BwdTraits: one warpgroup computes dQ.)
  static constexpr int kDqChunk = kBlockM * kHeadDim / kMmaWarpgroups;
  static constexpr int kDqThreads = kMmaThreads;  // the threads of TiledMmaDQ

  using BlkM = cute::Int<kBlockM>;
  using BlkN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;
  using Pipe = cute::Int<kStages>;
  using Major = cute::GMMA::Major;

  // Q and dO: (BLK_M,D,PIPE), K and V: (BLK_N,D); each also seen transposed, (D,BLK_M,PIPE) and
  // (D,BLK_N), as the operand of the GEMMs that reduce over its rows (the same bytes).
  using SmemAtomK = decltype(gmma_smem_atom<Element, Major::K, kHeadDim>());
  using SmemLayoutQ = decltype(cute::tile_to_shape(SmemAtomK{}, cute::Shape<BlkM, HeadDim, Pipe>{}));
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{}, cute::make_layout(cute::Shape<HeadDim, BlkM, Pipe>{},
                                       cute::Stride<BlkM, cute::_1, cute::Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutK = decltype(cute::tile_to_shape(SmemAtomK{}, cute::Shape<BlkN, HeadDim>{}));
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutK{}, cute::make_layout(cute::Shape<HeadDim, BlkN>{}, cute::Stride<BlkN, cute::_1>{})));

  // The epilogue's global stores: rows of dK and dV read back from shared memory.
  using GmemTiledCopyKV = GmemRowCopy<Element, kHeadDim>;

  // Global tensors as the TMA descriptors see them: (seqlen, d, head, batch).
  using ShapeQKV = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideQKV = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using Gmem = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{},
                                          StrideQKV{}));
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, Gmem{}, cute::take<0, 2>(SmemLayoutQ{})));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, Gmem{}, SmemLayoutK{}));
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kRowBytes = kBlockM * sizeof(float);  // a step's lse or D
};

// The names a design's traits use from BwdTraitsBase (a dependent base, which unqualified lookup
// does not search).
#define FLASHCUTE_BWD_TRAITS_BASE_NAMES(Base) \
  using typename Base::Element;               \
  using typename Base::BlkM;                  \
  using typename Base::BlkN;                  \
  using typename Base::HeadDim;               \
  using typename Base::Pipe;                  \
  using typename Base::Major;                 \
  using typename Base::SmemLayoutQ;           \
  using typename Base::SmemLayoutK;           \
  using Base::kBlockM;                        \
  using Base::kBlockN;                        \
  using Base::kHeadDim;                       \
  using Base::kStages;                        \
  using Base::kMmaWarpgroups

template <DType kDType, BwdConfig kCfg>
struct BwdTraits : BwdTraitsBase<kDType, kCfg> {
  static_assert(!kCfg.split_d && kCfg.mma_wgs == kCfg.block_n / 64, "64 keys a warpgroup (split_d: BwdTraitsSplitD)");
  static_assert((kCfg.block_m == 64 || kCfg.block_m == 128) && kCfg.block_n == 128,
                "64 or 128 query rows by 128 keys: the layouts below assume them");
  static_assert(128 % kCfg.block_m == 0, "bwd_padded_rows rounds to 128: whole query blocks");
  using Base = BwdTraitsBase<kDType, kCfg>;
  FLASHCUTE_BWD_TRAITS_BASE_NAMES(Base);
  static constexpr bool kSplitD = false;

  // S^T = K Q^T and dP^T = V dO^T: (BLK_N,BLK_M) over K = D, both operands K-major; warpgroup w
  // computes keys [64 w, 64 w + 64).
  using AtomLayoutKeys = cute::Layout<cute::Shape<cute::Int<kMmaWarpgroups>, cute::_1, cute::_1>>;
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::_64, BlkM, HeadDim>>(), AtomLayoutKeys{}));
  // dV += P^T dO, dK += dS^T Q: (BLK_N,D) over K = BLK_M; A from the S^T / dP^T registers, B the
  // (D,BLK_M) view of dO / Q, d contiguous (MN-major).
  using TiledMmaKV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, HeadDim, BlkM>, Major::K, Major::MN>(),
      AtomLayoutKeys{}));
  // dQ = dS K: (BLK_M,D) over K = BLK_N; dS queries-contiguous and the (D,BLK_N) view of K both
  // MN-major; two 64 x 64 halves, rows [64 h, 64 h + 64) at 128-row steps, else columns
  // [64 h, 64 h + 64). Warpgroup h computes half h, or with dq_one_wg warpgroup 1 both (one
  // accumulator of 32 registers at a time): then dS goes one way only, and warpgroup 0 hands its
  // half over and goes on instead of meeting warpgroup 1 every step.
  static_assert(kBlockM * kHeadDim == 2 * 64 * 64, "dQ in two 64 x 64 halves");
  static constexpr bool kDqOneWg = kCfg.dq_one_wg;
  static constexpr bool kDqHalvesByRows = kBlockM == 128;
  using TiledMmaDQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::_64, cute::_64, BlkN>, Major::MN,
                                 Major::MN>()));
  static constexpr int kDqThreads = 128;
  // A step's dQ in the fragment order of TiledMmaDQ over (BLK_M,D) (value pair p of thread t at
  // 2 (p 128 + t)): half h is its pairs [16 h, 16 h + 16).
  static constexpr int kDqChunk = kBlockM * kHeadDim;
  static_assert(gmma_n<TiledMmaSdP> == kBlockM && gmma_n<TiledMmaKV> == kHeadDim && gmma_n<TiledMmaDQ> == 64,
                "a wgmma shape the backward needs has no atom: add it to sm90/wgmma_atoms.hpp");
  // dS: (BLK_M,BLK_N,2), queries contiguous, two buffers (one step's dQ reads one while the next
  // step writes the other); written through its (BLK_N,BLK_M,2) view from the dS^T accumulators.
  using SmemLayoutDS = decltype(cute::tile_to_shape(gmma_smem_atom<Element, Major::MN, kBlockM>(),
                                                    cute::Shape<BlkM, BlkN, cute::_2>{}));
  using SmemLayoutDSt = decltype(cute::composition(
      SmemLayoutDS{}, cute::make_layout(cute::Shape<BlkN, BlkM, cute::_2>{},
                                        cute::Stride<BlkM, cute::_1, cute::Int<kBlockM * kBlockN>>{})));

  // dS^T into the dS buffer, and the epilogue's dK and dV into the K and V buffers, by stmatrix;
  // each warpgroup's 64 rows of dK and dV are read back and stored (GmemTiledCopyKV).
  using SmemCopyAtomKV = cute::Copy_Atom<cute::SM90_U32x4_STSM_N, Element>;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDS>, 1024> ds;
    // A step's dQ (kDqChunk), which the writer warp adds into the global accumulator as it lies.
    cute::array_aligned<float, kBlockM * kHeadDim, 128> dq;
    // Each Q/dO stage's rows' lse (log2 units) and D, loaded with them (bulk copies).
    cute::array_aligned<float, kStages * kBlockM, 128> lse2;
    cute::array_aligned<float, kStages * kBlockM, 128> dpsum;
    PipelineBarriers<kStages> qdo_bar;  // a step's Q and dO, one barrier pair per buffer
    uint64_t kv_full;                   // the CTA's K and V, loaded once
    // persistent: the tile ring (producer -> writer and MMA warps) and K, V free for the next tile
    uint64_t tile_full[2], tile_empty[2], kv_empty;
    int tile_slot[2];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared storage exceeds 227 KB");
};

// d 192 and 256 (BwdConfig::split_d): 64-row steps, dK and dV split by head-dim columns. Neither
// S nor dP is transposed: warpgroup w computes keys [w kKeysWg, (w + 1) kKeysWg) of S = Q K^T and
// dP = dO V^T; P and dS go to shared memory (keys contiguous, two buffers); then every warpgroup
// computes its kColsWg columns of dV^T += dO^T P, dK^T += Q^T dS and dQ = dS K over all the keys.
// No room is left for a dQ staging buffer: dQ is added into the accumulator from registers.
template <DType kDType, BwdConfig kCfg>
struct BwdTraitsSplitD : BwdTraitsBase<kDType, kCfg> {
  static_assert(kCfg.split_d && kCfg.block_m == 64, "64-row steps");
  static_assert(kCfg.head_dim % (64 * kCfg.mma_wgs) == 0, "each warpgroup a multiple of 64 head-dim columns");
  static_assert(kCfg.block_n % (8 * kCfg.mma_wgs) == 0, "each warpgroup's keys one wgmma N");
  using Base = BwdTraitsBase<kDType, kCfg>;
  FLASHCUTE_BWD_TRAITS_BASE_NAMES(Base);
  static constexpr bool kSplitD = true;
  static constexpr int kKeysWg = kBlockN / kMmaWarpgroups;   // keys of S and dP a warpgroup
  static constexpr int kColsWg = kHeadDim / kMmaWarpgroups;  // columns of dK, dV, dQ a warpgroup

  using AlongN = cute::Layout<cute::Shape<cute::_1, cute::Int<kMmaWarpgroups>, cute::_1>>;
  using AlongM = cute::Layout<cute::Shape<cute::Int<kMmaWarpgroups>, cute::_1, cute::_1>>;

  // S = Q K^T and dP = dO V^T: (BLK_M,BLK_N) over K = D, both operands K-major.
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<BlkM, cute::Int<kKeysWg>, HeadDim>>(),
      AlongN{}));
  // dV^T += dO^T P, dK^T += Q^T dS: (D,BLK_N) over K = BLK_M; A the (D,BLK_M) view of dO / Q and
  // B the (BLK_N,BLK_M) view of P / dS, both contiguous along their first mode (MN-major). The
  // warpgroups take 64-row atoms of D in turn (kColsWg / 64 each).
  using TiledMmaKV = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::_64, BlkN, BlkM>, Major::MN,
                                 Major::MN>(),
      AlongM{}));
  // dQ = dS K: (BLK_M,D) over K = BLK_N; dS keys-contiguous (K-major), the (D,BLK_N) view of K
  // MN-major; warpgroup w computes columns [w kColsWg, (w + 1) kColsWg).
  using TiledMmaDQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<BlkM, cute::Int<kColsWg>, BlkN>, Major::K,
                                 Major::MN>(),
      AlongN{}));
  static_assert(gmma_n<TiledMmaSdP> == kKeysWg && gmma_n<TiledMmaKV> == kBlockN && gmma_n<TiledMmaDQ> == kColsWg,
                "a wgmma shape the backward needs has no atom: add it to sm90/wgmma_atoms.hpp");
  // P and dS: (BLK_M,BLK_N,2), keys contiguous, two buffers (a step writes one while the other
  // warpgroups may still read the last step's); also seen as (BLK_N,BLK_M,2).
  using SmemLayoutPdS = decltype(cute::tile_to_shape(gmma_smem_atom<Element, Major::K, kBlockN>(),
                                                     cute::Shape<BlkM, BlkN, cute::_2>{}));
  using SmemLayoutPdSt = decltype(cute::composition(
      SmemLayoutPdS{}, cute::make_layout(cute::Shape<BlkN, BlkM, cute::_2>{},
                                         cute::Stride<BlkM, cute::_1, cute::Int<kBlockM * kBlockN>>{})));

  // P and dS written from the accumulators by stmatrix; dK^T and dV^T into the K and V buffers
  // by transposing stmatrix.
  using SmemCopyAtomPdS = cute::Copy_Atom<cute::SM90_U32x4_STSM_N, Element>;
  using SmemCopyAtomKV = cute::Copy_Atom<cute::SM90_U16x8_STSM_T, Element>;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutPdS>, 1024> p;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutPdS>, 1024> ds;
    cute::array_aligned<float, kStages * kBlockM, 128> lse2;
    cute::array_aligned<float, kStages * kBlockM, 128> dpsum;
    PipelineBarriers<kStages> qdo_bar;
    uint64_t kv_full;
    // Deterministic, by step parity: every MMA thread has made its dQ adds / the release warp has
    // counted them (BwdMainloopSplitD::add_dq, release_dq).
    uint64_t dq_added[2], dq_released[2];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared storage exceeds 227 KB");
};

#undef FLASHCUTE_BWD_TRAITS_BASE_NAMES

// The traits of a config: BwdTraitsSplitD where it splits by head-dim columns, else BwdTraits.
template <DType kDType, BwdConfig kCfg>
using BwdTraitsFor = std::conditional_t<kCfg.split_d, BwdTraitsSplitD<kDType, kCfg>, BwdTraits<kDType, kCfg>>;

// What the main kernel receives: the plain params, the workspace's parts and the TMA descriptors.
template <class Traits>
struct BwdKernelParams {
  BwdParams params;
  // The workspace, per (batch, head) a run of padded_rows rows (bwd_padded_rows), or for a varlen
  // batch per head one run of bwd_varlen_padded_rows in which BwdBatch::rows places each sequence.
  const float* dpsum;  // D = rowsum(dO o O), a row
  const float* lse2;   // lse * log2(e), a row; +inf on rows no key reaches and on padding rows
  // kernel head dim floats a row, zeroed by the preprocess; each block of BLK_M rows in kDqChunk
  // order (the postprocess reorders it).
  float* dq_accum;
  // deterministic: one add count per 64 rows, zeroed by the preprocess; the count of the block
  // of BLK_M rows that starts there orders the key blocks' dQ adds (wait_turn); nullptr otherwise.
  int* dq_semaphore;
  int64_t padded_rows;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaQ tma_do;
  typename Traits::TmaK tma_k;
  typename Traits::TmaK tma_v;
  bool dq_rotate;  // the CTAs walk their query blocks rotated (BwdTile), where the mask allows it
  int* tile_counter;  // persistent: taken tiles past the first gridDim.x, zeroed by the preprocess
};

}  // namespace flashcute::sm90
