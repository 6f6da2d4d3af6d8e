// tune_fwd: times forward-kernel tile configs against each other on the
// FlashAttention benchmark grid (hidden 2048, 16k tokens), in one process.
//
// flashcute is header-only, so any sm80::FwdConfig can be instantiated here without
// touching the library's kernel list. CMake builds it as `tune_fwd` (head dim 128) when
// FLASHCUTE_BUILD_TUNING is ON (the default with FLASHCUTE_BUILD_TESTS), for the newest arch of
// FLASHCUTE_CUDA_ARCHS; for another head dim, build it by hand from a configured build dir:
//   nvcc -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr --use_fast_math -Iinclude \
//        -I<build>/include -Ithird_party/cutlass/include -DTUNE_HDIM=64 benchmarks/tune_fwd.cu -o tune64
// Each config's output is compared with the default config's (max |diff|), so a
// broken variant shows up as a large difference, not as a fast time.
// -DTUNE_ONLY_DEFAULT times only the default config: one reference launch per problem,
// then 3 warm-ups and 20 timed ones, for `ncu --launch-skip/--launch-count` (how the sm80
// kernels' ncu profiles were taken; docs/perf-notes.md, sm80 forward).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "flashcute/sm80/launch_fwd.hpp"
#include "tune_common.cuh"

#ifndef TUNE_HDIM
#define TUNE_HDIM 128
#endif

using flashcute::DType;
using flashcute::FwdParams;
using flashcute::sm80::FwdConfig;

struct Problem {
  int batch, seqlen, nheads, head_dim;
  bool causal;
};

FwdParams make_params(const Problem& pr, Element* q, Element* k, Element* v, Element* o) {
  FwdParams p;
  p.q = q; p.k = k; p.v = v; p.o = o;
  const int64_t row = int64_t(pr.nheads) * pr.head_dim, batch = row * pr.seqlen;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = batch;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = pr.head_dim;
  p.batch = pr.batch; p.seqlen_q = p.seqlen_k = pr.seqlen; p.nheads = p.nheads_k = pr.nheads; p.head_dim = pr.head_dim;
  p.softmax_scale = 1.f / sqrtf(float(pr.head_dim));
  p.window_left = -1; p.window_right = pr.causal ? 0 : -1;  // causal: no right context
  return p;
}

template <FwdConfig kCfg>
float time_config(const FwdParams& p, int iters) {
  using Traits = flashcute::sm80::FwdTraits<DType::kBFloat16, kCfg>;
  for (int i = 0; i < 3; ++i) {
    auto st = flashcute::sm80::launch_fwd_with<Traits>(p, nullptr);
    if (!st.ok()) { std::fprintf(stderr, "launch failed: %s\n", st.message.c_str()); std::exit(1); }
  }
  std::vector<float> ms(iters);
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    (void)flashcute::sm80::launch_fwd_with<Traits>(p, nullptr);
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaEventElapsedTime(&ms[i], a, b));
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

template <FwdConfig kCfg>
void run_one(const Problem& pr, const FwdParams& p, Element* o, Element* o_ref, size_t n, float* d_diff) {
  FwdParams pc = p;
  pc.o = o;
  const float ms = time_config<kCfg>(pc, 20);
  CHECK_CUDA(cudaMemset(d_diff, 0, sizeof(float)));
  max_abs_diff<<<264, 256>>>(o, o_ref, n, d_diff);
  float diff = 0.f;
  CHECK_CUDA(cudaMemcpy(&diff, d_diff, sizeof(float), cudaMemcpyDeviceToHost));
  const double flops = 4.0 * pr.batch * pr.nheads * double(pr.seqlen) * pr.seqlen * pr.head_dim / (pr.causal ? 2 : 1);
  std::printf("d=%3d causal=%d S=%5d  cfg(M=%3d,N=%3d,W=%d,bf=%d,qr=%d,ms=%d)  %8.3f ms  %6.1f TFLOP/s  maxdiff %.3g\n",
              pr.head_dim, pr.causal, pr.seqlen, kCfg.block_m, kCfg.block_n, kCfg.num_warps, kCfg.branch_free_refill, kCfg.q_in_regs, kCfg.mask_split, ms,
              flops / ms * 1e-9, diff);
}

template <FwdConfig... kCfgs>
void sweep(int seqlen, bool causal) {
  constexpr int d = TUNE_HDIM;
  Problem pr{16384 / seqlen, seqlen, 2048 / d, d, causal};
  const size_t n = size_t(pr.batch) * pr.seqlen * pr.nheads * d;
  Element *q, *k, *v, *o, *o_ref;
  float* d_diff;
  CHECK_CUDA(cudaMalloc(&q, n * sizeof(Element)));
  CHECK_CUDA(cudaMalloc(&k, n * sizeof(Element)));
  CHECK_CUDA(cudaMalloc(&v, n * sizeof(Element)));
  CHECK_CUDA(cudaMalloc(&o, n * sizeof(Element)));
  CHECK_CUDA(cudaMalloc(&o_ref, n * sizeof(Element)));
  CHECK_CUDA(cudaMalloc(&d_diff, sizeof(float)));
  fill_random<<<264, 256>>>(q, n, 1u);
  fill_random<<<264, 256>>>(k, n, 2u);
  fill_random<<<264, 256>>>(v, n, 3u);
  CHECK_CUDA(cudaGetLastError());
  FwdParams p = make_params(pr, q, k, v, o_ref);
  auto st = flashcute::sm80::launch_fwd<DType::kBFloat16, d>(p, nullptr);
  if (!st.ok()) { std::fprintf(stderr, "reference launch failed: %s\n", st.message.c_str()); std::exit(1); }
  CHECK_CUDA(cudaDeviceSynchronize());
  (run_one<kCfgs>(pr, p, o, o_ref, n, d_diff), ...);
  for (Element* ptr : {q, k, v, o, o_ref}) CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaFree(d_diff));
}

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "tune_fwd: no CUDA device\n");
    return 77;
  }
  std::vector<int> seqlens = {512, 1024, 4096, 16384};
  if (argc > 1) {
    seqlens.clear();
    for (int i = 1; i < argc; ++i) seqlens.push_back(std::atoi(argv[i]));
  }
  for (bool causal : {false, true}) {
    for (int s : seqlens) {
#if defined(TUNE_ONLY_DEFAULT)  // one launch per problem, for profilers (ncu --launch-count)
      sweep<flashcute::sm80::default_fwd_config(TUNE_HDIM)>(s, causal);
#elif TUNE_HDIM == 32
      sweep<flashcute::sm80::default_fwd_config(32),
               FwdConfig{.head_dim = 32, .block_m = 128, .block_n = 128, .num_warps = 4, .branch_free_refill = false}>(s, causal);
#elif TUNE_HDIM == 64
      sweep<flashcute::sm80::default_fwd_config(64),
            FwdConfig{.head_dim = 64, .block_m = 128, .block_n = 64, .num_warps = 4, .q_in_regs = true}>(s, causal);
#elif TUNE_HDIM == 96
      sweep<flashcute::sm80::default_fwd_config(96), FwdConfig{.head_dim = 96, .block_m = 128, .block_n = 32, .num_warps = 4}>(s, causal);
#elif TUNE_HDIM == 128
      sweep<flashcute::sm80::default_fwd_config(128),
            FwdConfig{.head_dim = 128, .block_m = 128, .block_n = 48, .num_warps = 4, .mask_split = true},
            flashcute::sm80::default_fwd_config(128)>(s, causal);
#elif TUNE_HDIM == 192
      sweep<flashcute::sm80::default_fwd_config(192), FwdConfig{.head_dim = 192, .block_m = 64, .block_n = 64, .num_warps = 4}>(s, causal);
#else
      sweep<flashcute::sm80::default_fwd_config(256), FwdConfig{.head_dim = 256, .block_m = 64, .block_n = 64, .num_warps = 4}>(s, causal);
#endif
    }
  }
  return 0;
}
