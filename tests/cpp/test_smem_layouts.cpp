// Host-only checks of the shared-memory layouts every sm80 forward kernel derives from its
// FwdConfig. CuTe layouts are plain functions, so the properties the kernel relies on can be
// verified here, on any machine:
//   1. each tile layout is a bijection onto [0, rows * cols);
//   2. every 16 B chunk (8 halves along the head dim) stays contiguous, which cp.async and
//      ldmatrix both need;
//   3. the 8 rows an ldmatrix phase reads at one chunk column fall in 8 distinct 16 B bank
//      groups, i.e. the swizzle leaves no bank conflict;
//   4. the transposed V view reads the same element as V: Vt(d, n) == V(n, d).
#include <gtest/gtest.h>

#include <vector>

#include "flashcute/sm80/traits.hpp"

namespace {

template <class Layout>
void check_tile(Layout const& layout, int rows, int cols) {
  std::vector<int> hits(rows * cols, 0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const int off = int(layout(r, c));
      ASSERT_TRUE(off >= 0 && off < rows * cols) << "offset out of range at (" << r << ", " << c << ")";
      ++hits[off];
    }
  }
  for (int i = 0; i < rows * cols; ++i) ASSERT_EQ(hits[i], 1) << "not a bijection at offset " << i;

  constexpr int kElemsPerChunk = 8;  // 16 B of 16-bit elements
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; c += kElemsPerChunk) {
      const int base = int(layout(r, c));
      ASSERT_EQ(base % kElemsPerChunk, 0) << "chunk not 16 B aligned at (" << r << ", " << c << ")";
      for (int e = 1; e < kElemsPerChunk; ++e)
        ASSERT_EQ(int(layout(r, c + e)), base + e) << "chunk not contiguous at (" << r << ", " << c << ")";
    }
  }

  for (int r0 = 0; r0 < rows; r0 += 8) {
    for (int c = 0; c < cols; c += kElemsPerChunk) {
      bool seen[8] = {};
      for (int i = 0; i < 8; ++i) {
        const int bank_group = (int(layout(r0 + i, c)) * 2 / 16) % 8;
        ASSERT_FALSE(seen[bank_group]) << "ldmatrix bank conflict at rows " << r0 << "+" << i << ", col " << c;
        seen[bank_group] = true;
      }
    }
  }
}

template <flashcute::DType kDType, int kHeadDim>
void check_config() {
  using Traits = flashcute::sm80::FwdTraits<kDType, flashcute::sm80::default_fwd_config(kHeadDim)>;
  constexpr int kM = Traits::kBlockM, kN = Traits::kBlockN, kD = Traits::kHeadDim;
  SCOPED_TRACE(testing::Message() << "head dim " << kD << ", BLK_M " << kM << ", BLK_N " << kN);
  check_tile(typename Traits::SmemLayoutQ{}, kM, kD);
  check_tile(typename Traits::SmemLayoutKV{}, kN, kD);

  typename Traits::SmemLayoutKV kv;
  typename Traits::SmemLayoutVt vt;
  for (int n = 0; n < kN; ++n)
    for (int d = 0; d < kD; ++d) ASSERT_EQ(int(vt(d, n)), int(kv(n, d))) << "Vt(" << d << ", " << n << ")";

  // The gmem tiled copy uses every thread of the CTA.
  using Copy = typename Traits::GmemTiledCopyQKV;
  EXPECT_EQ(int(cute::size(typename Copy::TiledNumThr{})), Traits::kNThreads);
}

using flashcute::DType;
TEST(SmemLayouts, HeadDim32) { check_config<DType::kBFloat16, 32>(); }
TEST(SmemLayouts, HeadDim64) { check_config<DType::kBFloat16, 64>(); }
TEST(SmemLayouts, HeadDim96) { check_config<DType::kBFloat16, 96>(); }
TEST(SmemLayouts, HeadDim128) { check_config<DType::kBFloat16, 128>(); }
TEST(SmemLayouts, HeadDim192) { check_config<DType::kBFloat16, 192>(); }
TEST(SmemLayouts, HeadDim256) { check_config<DType::kBFloat16, 256>(); }
TEST(SmemLayouts, HeadDim128Fp16) { check_config<DType::kFloat16, 128>(); }

}  // namespace
