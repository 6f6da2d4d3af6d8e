// flashcute/sm80/copy.hpp: predicated global -> shared tile loads (cp.async).
//
// Tiles at the ragged end of a sequence, and head dims narrower than the
// kernel's, load only the valid 16 B chunks and zero the rest of the tile, so
// the GEMMs can run on whole tiles: zero Q/K columns add nothing to Q*K^T, and
// zero V rows add nothing to P*V (their P is 0 after masking, and 0 * 0 stays
// finite where 0 * garbage could be NaN).
#pragma once

#include <cute/tensor.hpp>

#include "flashcute/common/store.hpp"  // store_tile, for the epilogues beside these loads

namespace flashcute::sm80 {

// src/dst: (CPY,CPY_M,CPY_K) partitions of one tile; coord: the same partition of
// the tile's identity tensor, giving (row, col) within the tile. tiled_copy must
// use a zero-filling cp.async atom: a chunk whose predicate is false reads no
// global memory and writes 16 zero bytes, so there is no branch per chunk.
// kCheckRows: the tile may run past max_rows. Columns are always checked
// against max_cols (the head dim): one compare per chunk.
template <bool kCheckRows, class TiledCopy, class SrcTensor, class DstTensor, class CoordTensor>
CUTE_DEVICE void load_tile(TiledCopy const& tiled_copy, SrcTensor const& src, DstTensor&& dst, CoordTensor const& coord,
                           int max_rows, int max_cols) {
  CUTE_STATIC_ASSERT_V(cute::rank(src) == cute::Int<3>{});
  CUTE_STATIC_ASSERT_V(cute::size<1>(src) == cute::size<1>(dst));
  CUTE_STATIC_ASSERT_V(cute::size<2>(src) == cute::size<2>(dst));
  CUTE_UNROLL
  for (int m = 0; m < cute::size<1>(src); ++m) {
    const bool row_ok = !kCheckRows || cute::get<0>(coord(0, m, 0)) < max_rows;
    CUTE_UNROLL
    for (int k = 0; k < cute::size<2>(src); ++k) {
      const bool ok = row_ok && cute::get<1>(coord(0, m, k)) < max_cols;
      cute::copy(tiled_copy.with(ok), src(cute::_, m, k), dst(cute::_, m, k));
    }
  }
}

// Where load_tile_gather finds one row: the address of its column 0, and whether it may be read
// at all (false: its page is not in the cache; row is then not used).
template <class Element>
struct GatherRow {
  Element const* row;
  bool ok;
};

// cp.async of one 16-byte chunk, src_bytes of it read (16, or 0 to zero-fill), issued only where
// `issue`: the address of a chunk not issued is never used.
CUTE_DEVICE void cp_async_if(bool issue, uint32_t smem, void const* gmem, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n"
      " @p cp.async.cg.shared.global.L2::128B [%1], [%2], 16, %3;\n}\n" ::"r"(int(issue)),
      "r"(smem), "l"(gmem), "r"(src_bytes));
#endif
}

// load_tile for a tile whose rows are not evenly spaced in memory (a paged KV cache). src is the
// partition of the tile as if its rows were contiguous: its addresses serve only the rows past
// max_rows, zero-filled without a read. row_at(m, r) gives the GatherRow of the thread's m-th row
// (tile row r). Called once per row, all of them before the first copy: only for the rows that are
// loaded, or with kEveryRow for every row (row_at must then be safe on rows past max_rows, and
// cheap: the rows need no branch around it). A row that may not be read issues no cp.async;
// kNanBad (a K tile) fills it with NaN, so every score that sees it is NaN, else (a V tile) with
// zeros. The fill is the one branch, taken only where a page is bad; its stores are plain: the
// barrier before every read of the tile publishes them.
template <bool kCheckRows, bool kNanBad, bool kEveryRow = false, class SrcTensor, class DstTensor, class CoordTensor,
          class RowAt>
CUTE_DEVICE void load_tile_gather(SrcTensor const& src, DstTensor&& dst, CoordTensor const& coord, RowAt const& row_at,
                                  int max_rows, int max_cols) {
  using Element = std::remove_cv_t<typename std::decay_t<SrcTensor>::value_type>;
  CUTE_STATIC_ASSERT_V(cute::rank(src) == cute::Int<3>{});
  CUTE_STATIC_ASSERT_V(cute::size<1>(src) == cute::size<1>(dst));
  CUTE_STATIC_ASSERT_V(cute::size<2>(src) == cute::size<2>(dst));
  static_assert(sizeof(Element) == 2, "the NaN fill is for 16-bit types");
  static_assert(decltype(cute::size<0>(src))::value * sizeof(Element) == 16, "one 16-byte chunk per copy");
  constexpr int kRows = decltype(cute::size<1>(src))::value;
  GatherRow<Element> at[kRows];
  bool row_in[kRows];
  bool any_bad = false;
  CUTE_UNROLL
  for (int m = 0; m < kRows; ++m) {
    const int row = cute::get<0>(coord(0, m, 0));
    row_in[m] = !kCheckRows || row < max_rows;
    const GatherRow<Element> past_end{&src(0, m, 0), true};  // zero-filled
    if constexpr (kEveryRow) {
      const GatherRow<Element> found = row_at(m, row);
      at[m] = row_in[m] ? found : past_end;
    } else {
      at[m] = row_in[m] ? row_at(m, row) : past_end;
    }
    any_bad |= !at[m].ok;
  }
  CUTE_UNROLL
  for (int m = 0; m < kRows; ++m) {
    CUTE_UNROLL
    for (int k = 0; k < cute::size<2>(src); ++k) {
      const int col = cute::get<1>(coord(0, m, k));
      const bool read = row_in[m] && col < max_cols;
      cp_async_if(at[m].ok, cute::cast_smem_ptr_to_uint(&dst(0, m, k)), at[m].row + col, read ? 16 : 0);
    }
  }
  if (any_bad) {
    constexpr uint64_t kFill = kNanBad ? 0x7fff7fff7fff7fffull : 0ull;  // 0x7fff: a quiet NaN in fp16 and bf16
    CUTE_UNROLL
    for (int m = 0; m < kRows; ++m) {
      if (at[m].ok) continue;
      CUTE_UNROLL
      for (int k = 0; k < cute::size<2>(src); ++k)
        cute::fill(cute::recast<cute::uint128_t>(dst(cute::_, m, k)), cute::uint128_t(kFill, kFill));
    }
  }
}

}  // namespace flashcute::sm80
