// tune_bwd: times backward tile configs against each other on the FlashAttention benchmark grid
// (hidden 2048, 16k tokens), in one process, and splits each backward into its three kernels
// (D = rowsum(dO * O), dk/dv, dq), so that a change can be aimed at the kernel that costs.
//
// Any sm80::BwdConfig can be instantiated here without touching the library's kernel list. CMake
// builds it as `tune_bwd` (head dim 128) with FLASHCUTE_BUILD_TUNING; for another head dim, build
// it by hand from a configured build dir:
//   nvcc -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr --use_fast_math -Iinclude \
//        -I<build>/include -Ithird_party/cutlass/include -DTUNE_HDIM=64 benchmarks/tune_bwd.cu -o tune_bwd64
// Each config's dq, dk and dv are compared with the default config's (max |diff|), so a broken
// variant shows up as a large difference, not as a fast time. Times are CUDA-event medians of 10
// after 2 warm-ups; TFLOP/s count the backward as 2.5x the forward (FlashAttention's convention).
// Arguments: the seqlens (default 1024 4096 16384); TUNE_WINDOW=w runs a sliding window (w, w).
#include "flashcute/sm80/launch_bwd.hpp"
#include "tune_bwd_common.cuh"

#ifndef TUNE_HDIM
#define TUNE_HDIM 128
#endif

using flashcute::BwdParams;
using flashcute::DType;
using flashcute::sm80::BwdConfig;

template <BwdConfig kCfg>
void run_one(const BwdProblem& b) {
  using Traits = flashcute::sm80::BwdTraits<DType::kBFloat16, kCfg>;
  const BwdParams& p = b.p;
  const float total = median_ms([&] {
    auto st = flashcute::sm80::launch_bwd_with<Traits>(p, nullptr);
    if (!st.ok()) { std::fprintf(stderr, "launch failed: %s\n", st.message.c_str()); std::exit(1); }
  });
  // The parts, one kernel at a time (launch_bwd_with launches them in this order).
  const float dsum = median_ms([&] {
    flashcute::sm80::bwd_dsum_kernel<Element><<<dim3((p.seqlen_q + 31) / 32, p.nheads, p.batch), 256>>>(p);
  });
  const float dkdv = median_ms([&] {
    (void)flashcute::sm80::detail::launch_dkdv_parts<Traits>(p, nullptr,
                                                            std::make_integer_sequence<int, Traits::kDSplit>{});
  });
  const float dq = median_ms([&] {
    flashcute::sm80::bwd_dq_kernel<Traits><<<dim3((p.seqlen_q + Traits::kQBlockM - 1) / Traits::kQBlockM, p.nheads, p.batch),
                            Traits::kQThreads, Traits::kQSmemBytes>>>(p);
  });
  std::printf("  cfg(kvW=%d kvM=%2d split=%d qW=%d qN=%3d)  %7.3f ms %6.1f TFLOP/s = D %.3f + dkdv %.3f + dq %.3f ms",
              kCfg.kv_warps, kCfg.kv_block_m, kCfg.d_split, kCfg.q_warps, kCfg.q_block_n, total,
              2.5 * b.flops / total * 1e-9, dsum, dkdv, dq);
  b.print_diffs();
}

template <BwdConfig... kCfgs>
void sweep(int seqlen, bool causal) {
  BwdProblem b = BwdProblem::make<TUNE_HDIM>(seqlen, causal, 0);  // the sm80 workspace: one float a row
  (run_one<kCfgs>(b), ...);
  b.release();
}

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "tune_bwd: no CUDA device\n");
    return 77;
  }
  const std::vector<int> seqlens = tune_seqlens(argc, argv);
  constexpr BwdConfig kDefault = flashcute::sm80::default_bwd_config(TUNE_HDIM);
  const bool window = std::getenv("TUNE_WINDOW") != nullptr;  // a sliding window instead of the two masks
  for (bool causal : {false, true}) {
    if (window && causal) continue;
    for (int s : seqlens) {
#if TUNE_HDIM == 128
      sweep<kDefault, BwdConfig{.head_dim = 128, .kv_warps = 8, .kv_block_m = 32, .q_warps = 4, .q_block_n = 64},
            BwdConfig{.head_dim = 128, .kv_warps = 8, .kv_block_m = 64, .q_warps = 4, .q_block_n = 64},
            BwdConfig{.head_dim = 128, .kv_warps = 8, .kv_block_m = 64, .q_warps = 4, .q_block_n = 32},
            BwdConfig{.head_dim = 128, .kv_warps = 8, .kv_block_m = 64, .q_warps = 8, .q_block_n = 64}>(s, causal);
#elif TUNE_HDIM == 64
      sweep<kDefault, BwdConfig{.head_dim = 64, .kv_warps = 8, .kv_block_m = 64, .q_warps = 4, .q_block_n = 128},
            BwdConfig{.head_dim = 64, .kv_warps = 4, .kv_block_m = 128, .q_warps = 4, .q_block_n = 128},
            BwdConfig{.head_dim = 64, .kv_warps = 8, .kv_block_m = 128, .q_warps = 4, .q_block_n = 64},
            BwdConfig{.head_dim = 64, .kv_warps = 8, .kv_block_m = 64, .q_warps = 8, .q_block_n = 64}>(s, causal);
#elif TUNE_HDIM == 256
      sweep<kDefault,
            BwdConfig{.head_dim = 256, .kv_warps = 4, .kv_block_m = 32, .d_split = 2, .q_warps = 4, .q_block_n = 64},
            BwdConfig{.head_dim = 256, .kv_warps = 8, .kv_block_m = 32, .d_split = 2, .q_warps = 4, .q_block_n = 32},
            BwdConfig{.head_dim = 256, .kv_warps = 4, .kv_block_m = 64, .d_split = 2, .q_warps = 4, .q_block_n = 64}>(
          s, causal);
#else
      sweep<kDefault>(s, causal);
#endif
    }
  }
  return 0;
}
