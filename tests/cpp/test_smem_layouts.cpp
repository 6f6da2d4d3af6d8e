// Host-only checks of the shared-memory layouts every forward kernel derives
// from its FwdConfig. CuTe layouts are plain functions, so the properties the
// kernel relies on can be verified here, on any machine:
//   1. each tile layout is a bijection onto [0, rows * cols);
//   2. every 16 B chunk (8 halves along the head dim) stays contiguous, which
//      cp.async and ldmatrix both need;
//   3. the 8 rows an ldmatrix phase reads at one chunk column fall in 8 distinct
//      16 B bank groups, i.e. the swizzle leaves no bank conflict;
//   4. the transposed V view reads the same element as V: Vt(d, n) == V(n, d).
#include <cstdio>
#include <vector>

#include "flashcute/traits.hpp"

namespace {

int g_failures = 0;
int g_head_dim = 0;  // the config under test, for messages

void expect(bool ok, const char* what, int a, int b) {
  if (!ok) {
    ++g_failures;
    if (g_failures < 20) std::printf("FAIL hdim %d: %s (%d, %d)\n", g_head_dim, what, a, b);
  }
}

template <class Layout>
void check_tile(Layout const& layout, int rows, int cols, const char* name) {
  std::vector<int> hits(rows * cols, 0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const int off = int(layout(r, c));
      expect(off >= 0 && off < rows * cols, name, r, c);
      if (off >= 0 && off < rows * cols) ++hits[off];
    }
  }
  for (int i = 0; i < rows * cols; ++i) expect(hits[i] == 1, "layout is not a bijection", i, hits[i]);

  const int elems_per_chunk = 8;  // 16 B of 16-bit elements
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; c += elems_per_chunk) {
      const int base = int(layout(r, c));
      expect(base % elems_per_chunk == 0, "chunk is not 16 B aligned", r, c);
      for (int e = 1; e < elems_per_chunk; ++e) expect(int(layout(r, c + e)) == base + e, "chunk is not contiguous", r, c);
    }
  }

  for (int r0 = 0; r0 < rows; r0 += 8) {
    for (int c = 0; c < cols; c += elems_per_chunk) {
      bool seen[8] = {};
      for (int i = 0; i < 8; ++i) {
        const int bank_group = (int(layout(r0 + i, c)) * 2 / 16) % 8;
        expect(!seen[bank_group], "ldmatrix phase has a bank conflict", r0 + i, c);
        seen[bank_group] = true;
      }
    }
  }
}

template <flashcute::DType kDType, int kHeadDim>
void check_config() {
  using Traits = flashcute::FwdTraits<kDType, flashcute::default_fwd_config(kHeadDim)>;
  constexpr int kM = Traits::kBlockM, kN = Traits::kBlockN, kD = Traits::kHeadDim;
  g_head_dim = kD;
  check_tile(typename Traits::SmemLayoutQ{}, kM, kD, "Q offset out of range");
  check_tile(typename Traits::SmemLayoutKV{}, kN, kD, "K/V offset out of range");

  typename Traits::SmemLayoutKV kv;
  typename Traits::SmemLayoutVt vt;
  for (int n = 0; n < kN; ++n)
    for (int d = 0; d < kD; ++d) expect(int(vt(d, n)) == int(kv(n, d)), "Vt(d, n) != V(n, d)", d, n);

  // The gmem tiled copy covers whole rows: one step moves a (threads/row-chunks) x atom block.
  using Copy = typename Traits::GmemTiledCopyQKV;
  expect(int(cute::size(typename Copy::TiledNumThr{})) == Traits::kNThreads, "gmem copy thread count", Traits::kNThreads, 0);

  std::printf("hdim %3d %s: BLK_M %d, BLK_N %d, %d warps, %d KB smem: checked\n", kD,
              kDType == flashcute::DType::kBFloat16 ? "bf16" : "fp16", kM, kN, Traits::kNWarps, Traits::kSmemBytes / 1024);
}

}  // namespace

int main() {
  using flashcute::DType;
  check_config<DType::kBFloat16, 32>();
  check_config<DType::kBFloat16, 64>();
  check_config<DType::kBFloat16, 96>();
  check_config<DType::kBFloat16, 128>();
  check_config<DType::kBFloat16, 192>();
  check_config<DType::kBFloat16, 256>();
  check_config<DType::kFloat16, 128>();
  if (g_failures != 0) {
    std::printf("%d failures\n", g_failures);
    return 1;
  }
  std::printf("all layout checks passed\n");
  return 0;
}
