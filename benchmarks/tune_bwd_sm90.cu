// tune_bwd_sm90: times sm90a backward configs (sm90::BwdConfig) against each other on the
// FlashAttention benchmark grid (hidden 2048, 16k tokens), in one process, and splits each
// backward into its three kernels (preprocess, main, postprocess), so that a change can be aimed
// at the kernel that costs.
//
// Built as `tune_bwd_sm90` (head dim 128) with FLASHCUTE_BUILD_TUNING; for another head dim, by
// hand from a configured build dir:
//   nvcc -std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr --use_fast_math -Iinclude \
//        -I<build>/include -Ithird_party/cutlass/include -DTUNE_HDIM=64 benchmarks/tune_bwd_sm90.cu -lcuda
// Each config's dq, dk and dv are compared with the sm80 backward's (max |diff|), so a broken
// variant shows up as a large difference, not as a fast time. Times are CUDA-event medians of 10
// after 2 warm-ups; TFLOP/s count the backward as 2.5x the forward (FlashAttention's convention).
// Arguments: the seqlens (default 1024 4096 16384).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "flashcute/sm80/launch_bwd.hpp"
#include "flashcute/sm80/launch_fwd.hpp"
#include "flashcute/sm90/launch_bwd.hpp"
#include "tune_common.cuh"

#ifndef TUNE_HDIM
#define TUNE_HDIM 128
#endif

using flashcute::BwdParams;
using flashcute::DType;
using flashcute::sm90::BwdConfig;

struct Buffers {
  Element *q, *k, *v, *o, *dout, *dq, *dk, *dv, *dq_ref, *dk_ref, *dv_ref;
  float *lse, *workspace, *diff;
};

// Median milliseconds of `launch` over 10 runs after 2 warm-ups.
template <class Launch>
float median_ms(Launch&& launch) {
  for (int i = 0; i < 2; ++i) launch();
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms(10);
  for (float& t : ms) {
    CHECK_CUDA(cudaEventRecord(a));
    launch();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

float diff(const Element* a, const Element* b, size_t n, float* d_diff) {
  CHECK_CUDA(cudaMemset(d_diff, 0, sizeof(float)));
  max_abs_diff<<<264, 256>>>(a, b, n, d_diff);
  float h = 0.f;
  CHECK_CUDA(cudaMemcpy(&h, d_diff, sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

template <BwdConfig kCfg>
void run_one(const BwdParams& p, const Buffers& b, size_t n, double flops) {
  using Traits = flashcute::sm90::BwdTraits<DType::kBFloat16, kCfg>;
  CHECK_CUDA(cudaMemset(b.dq, 0xff, n * sizeof(Element)));  // NaN: an unwritten element shows
  const float total = median_ms([&] {
    auto st = flashcute::sm90::launch_bwd_with<Traits>(p, nullptr);
    if (!st.ok()) { std::fprintf(stderr, "launch failed: %s\n", st.message.c_str()); std::exit(1); }
  });
  // The pre- and postprocess alone, with launch_bwd_with's arguments (launch_bwd.hpp).
  const int padded = int(flashcute::sm90::bwd_padded_rows(p.seqlen_q));
  const int64_t rows = int64_t(p.batch) * p.nheads * padded;
  float* dq_accum = p.dsum + 2 * rows;
  const float pre = median_ms([&] {
    flashcute::sm90::bwd_preprocess_kernel<Element, Traits::kHeadDim>
        <<<dim3(padded / 64, p.nheads, p.batch), 256>>>(p, p.dsum, p.dsum + rows, dq_accum, nullptr, padded);
  });
  const float post = median_ms([&] {
    flashcute::sm90::bwd_postprocess_kernel<Traits>
        <<<dim3(padded / Traits::kBlockM, p.nheads, p.batch), Traits::kMmaThreads>>>(p, dq_accum, padded);
  });
  // The postprocess alone rewrote dq from a zeroed accumulator: run the whole backward again.
  (void)flashcute::sm90::launch_bwd_with<Traits>(p, nullptr);
  std::printf("  cfg(M=%3d N=%3d stages=%d)  %7.3f ms %6.1f TFLOP/s = pre %.3f + main %.3f + post %.3f ms"
              "  maxdiff dq %.3g dk %.3g dv %.3g\n",
              kCfg.block_m, kCfg.block_n, kCfg.stages, total, 2.5 * flops / total * 1e-9, pre, total - pre - post,
              post, diff(b.dq, b.dq_ref, n, b.diff), diff(b.dk, b.dk_ref, n, b.diff), diff(b.dv, b.dv_ref, n, b.diff));
}

template <BwdConfig... kCfgs>
void sweep(int seqlen, bool causal) {
  constexpr int d = TUNE_HDIM;
  const int batch = 16384 / seqlen, nheads = 2048 / d;
  const size_t n = size_t(batch) * seqlen * nheads * d, rows = size_t(batch) * nheads * seqlen;
  const size_t ws = size_t(flashcute::sm90::bwd_workspace_floats(batch, nheads, seqlen, d));
  Buffers b;
  for (Element** ptr : {&b.q, &b.k, &b.v, &b.o, &b.dout, &b.dq, &b.dk, &b.dv, &b.dq_ref, &b.dk_ref, &b.dv_ref})
    CHECK_CUDA(cudaMalloc(ptr, n * sizeof(Element)));
  CHECK_CUDA(cudaMalloc(&b.lse, rows * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&b.workspace, std::max(ws, rows) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&b.diff, sizeof(float)));
  fill_random<<<264, 256>>>(b.q, n, 1u);
  fill_random<<<264, 256>>>(b.k, n, 2u);
  fill_random<<<264, 256>>>(b.v, n, 3u);
  fill_random<<<264, 256>>>(b.dout, n, 4u);
  CHECK_CUDA(cudaGetLastError());

  BwdParams p;
  p.q = b.q; p.k = b.k; p.v = b.v; p.o = b.o; p.lse = b.lse;
  p.dout = b.dout; p.dq = b.dq_ref; p.dk = b.dk_ref; p.dv = b.dv_ref; p.dsum = b.workspace;
  const int64_t row = int64_t(nheads) * d, bstride = row * seqlen;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = bstride;
  p.do_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = bstride;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
  p.do_row_stride = p.dq_row_stride = p.dk_row_stride = p.dv_row_stride = row;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.do_head_stride = p.dq_head_stride = p.dk_head_stride = p.dv_head_stride = d;
  p.lse_batch_stride = int64_t(nheads) * seqlen;
  p.lse_head_stride = seqlen;
  p.batch = batch; p.seqlen_q = p.seqlen_k = seqlen; p.nheads = p.nheads_k = nheads; p.head_dim = d;
  p.softmax_scale = 1.f / sqrtf(float(d));
  p.window_left = -1; p.window_right = causal ? 0 : -1;
  if (const char* w = std::getenv("TUNE_WINDOW")) p.window_left = p.window_right = std::atoi(w);
  auto st = flashcute::sm80::launch_fwd<DType::kBFloat16, d>(p, nullptr);  // out and lse
  if (st.ok()) st = flashcute::sm80::launch_bwd<DType::kBFloat16, d>(p, nullptr);  // the reference gradients
  if (!st.ok()) { std::fprintf(stderr, "reference launch failed: %s\n", st.message.c_str()); std::exit(1); }
  CHECK_CUDA(cudaDeviceSynchronize());
  p.dq = b.dq; p.dk = b.dk; p.dv = b.dv;
  const double flops = 4.0 * batch * nheads * double(seqlen) * seqlen * d / (causal ? 2 : 1);
  std::printf("d=%d causal=%d window=(%d,%d) S=%d (b=%d h=%d)\n", d, causal, p.window_left, p.window_right, seqlen,
              batch, nheads);
  (run_one<kCfgs>(p, b, n, flops), ...);
  for (Element* ptr : {b.q, b.k, b.v, b.o, b.dout, b.dq, b.dk, b.dv, b.dq_ref, b.dk_ref, b.dv_ref}) CHECK_CUDA(cudaFree(ptr));
  for (float* ptr : {b.lse, b.workspace, b.diff}) CHECK_CUDA(cudaFree(ptr));
}

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "tune_bwd_sm90: no CUDA device\n");
    return 77;
  }
  std::vector<int> seqlens = {1024, 4096, 16384};
  if (argc > 1) {
    seqlens.clear();
    for (int i = 1; i < argc; ++i) seqlens.push_back(std::atoi(argv[i]));
  }
  constexpr BwdConfig kDefault = flashcute::sm90::default_bwd_config(TUNE_HDIM);
  // TUNE_WINDOW=w: a sliding window (w, w) instead of the two masks (FLOPs counted unmasked).
  const bool window = std::getenv("TUNE_WINDOW") != nullptr;
  for (bool causal : {false, true}) {
    if (window && causal) continue;
    for (int s : seqlens) {
#if TUNE_HDIM == 64
      sweep<kDefault, BwdConfig{64, 64, 128}>(s, causal);
#else
      sweep<kDefault>(s, causal);
#endif
    }
  }
  return 0;
}
