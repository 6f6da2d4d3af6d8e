// tune_bwd_sm90: times sm90a backward configs (sm90::BwdConfig) against each other on the
// FlashAttention benchmark grid (hidden 2048, 16k tokens), in one process, and splits each
// backward into its three kernels (preprocess, main, postprocess), so that a change can be aimed
// at the kernel that costs.
//
// Built as `tune_bwd_sm90` (head dim 128) with FLASHCUTE_BUILD_TUNING; for another head dim, by
// hand from a configured build dir:
//   nvcc -std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr --use_fast_math -Iinclude \
//        -I<build>/include -Ithird_party/cutlass/include -DTUNE_HDIM=64 benchmarks/tune_bwd_sm90.cu
// Each config's dq, dk and dv are compared with the sm80 backward's (max |diff|), so a broken
// variant shows up as a large difference, not as a fast time. Times are CUDA-event medians of 10
// after 2 warm-ups; TFLOP/s count the backward as 2.5x the forward (FlashAttention's convention).
// Arguments: the seqlens (default 1024 4096 16384); TUNE_WINDOW=w runs a sliding window (w, w).
#include <cstring>

#include "flashcute/sm90/launch_bwd.hpp"
#include "tune_bwd_common.cuh"

#ifndef TUNE_HDIM
#define TUNE_HDIM 128
#endif

using flashcute::BwdParams;
using flashcute::DType;
using flashcute::sm90::BwdConfig;

template <BwdConfig kCfg>
void run_one(const BwdProblem& b) {
  using Traits = flashcute::sm90::BwdTraitsFor<DType::kBFloat16, kCfg>;
  const BwdParams& p = b.p;
  CHECK_CUDA(cudaMemset(b.dq, 0xff, b.n * sizeof(Element)));  // NaN: an unwritten element shows
  const float total = median_ms([&] {
    auto st = flashcute::sm90::launch_bwd_with<Traits>(p, nullptr);
    if (!st.ok()) { std::fprintf(stderr, "launch failed: %s\n", st.message.c_str()); std::exit(1); }
  });
  // The pre- and postprocess alone, with launch_bwd_with's arguments (launch_bwd.hpp).
  const int padded = int(flashcute::sm90::bwd_padded_rows(p.seqlen_q));
  const int64_t rows = int64_t(p.batch) * p.nheads * padded;
  float* dq_accum = p.dsum + 2 * rows;
  int* tile_counter = reinterpret_cast<int*>(dq_accum + flashcute::sm90::bwd_tile_counter_offset(rows, Traits::kHeadDim));
  const float pre = median_ms([&] {
    (void)flashcute::sm90::launch_bwd_preprocess<Element, Traits::kHeadDim>(p, p.dsum, p.dsum + rows, dq_accum,
                                                                            nullptr, tile_counter, padded, nullptr);
  });
  const float post = median_ms([&] {
    flashcute::sm90::bwd_postprocess_kernel<Traits>
        <<<dim3(padded / Traits::kBlockM, p.nheads, p.batch), Traits::kMmaThreads>>>(p, dq_accum, padded);
  });
  // deterministic=True: the same call with its dQ adds in turn.
  BwdParams pd = p;
  pd.deterministic = true;
  const float det = median_ms([&] { (void)flashcute::sm90::launch_bwd_with<Traits>(pd, nullptr); });
  // Its dq against the reference, and the same bits on a second run.
  std::vector<Element> det_dq(b.n), again(b.n);
  CHECK_CUDA(cudaMemcpy(det_dq.data(), b.dq, b.n * sizeof(Element), cudaMemcpyDeviceToHost));
  const float det_diff = b.diff(b.dq, b.dq_ref);
  (void)flashcute::sm90::launch_bwd_with<Traits>(pd, nullptr);
  CHECK_CUDA(cudaMemcpy(again.data(), b.dq, b.n * sizeof(Element), cudaMemcpyDeviceToHost));
  const bool same = std::memcmp(det_dq.data(), again.data(), b.n * sizeof(Element)) == 0;
  // The postprocess alone rewrote dq from a zeroed accumulator: run the whole backward again.
  (void)flashcute::sm90::launch_bwd_with<Traits>(p, nullptr);
  std::printf("  cfg(M=%3d N=%3d stages=%d%s)  %7.3f ms %6.1f TFLOP/s = pre %.3f + main %.3f + post %.3f ms; "
              "deterministic %.3f ms (%.2fx, dq maxdiff %.3g, %s)",
              kCfg.block_m, kCfg.block_n, kCfg.stages, kCfg.persistent ? " persistent" : "", total,
              2.5 * b.flops / total * 1e-9, pre, total - pre - post, post, det, total / det, det_diff,
              same ? "same bits twice" : "BITS DIFFER");
  b.print_diffs();
}

template <BwdConfig... kCfgs>
void sweep(int seqlen, bool causal) {
  constexpr int d = TUNE_HDIM;
  const size_t ws = size_t(flashcute::sm90::bwd_workspace_floats(16384 / seqlen, 2048 / d, seqlen, d));
  BwdProblem b = BwdProblem::make<d>(seqlen, causal, ws);
  (run_one<kCfgs>(b), ...);
  b.release();
}

constexpr BwdConfig kDefault = flashcute::sm90::default_bwd_config(TUNE_HDIM);
// A persistent default is timed beside the same config a CTA a tile.
constexpr BwdConfig per_tile(BwdConfig c) {
  c.persistent = false;
  return c;
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out at once, even into a pipe that a timeout cuts
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "tune_bwd_sm90: no CUDA device\n");
    return 77;
  }
  const std::vector<int> seqlens = tune_seqlens(argc, argv);
  const bool window = std::getenv("TUNE_WINDOW") != nullptr;  // a sliding window instead of the two masks
  for (bool causal : {false, true}) {
    if (window && causal) continue;
    for (int s : seqlens) {
      if constexpr (kDefault.persistent)
        sweep<kDefault, per_tile(kDefault)>(s, causal);
      else
        sweep<kDefault>(s, causal);
    }
  }
  return 0;
}
