// What tune_bwd.cu and tune_bwd_sm90.cu share: CUDA-event medians, a max |a - b| on the device,
// and one backward problem of the FlashAttention grid (hidden 2048, 16k tokens) with the sm80
// backward's gradients as the reference a config's are compared with.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "flashcute/sm80/launch_bwd.hpp"
#include "flashcute/sm80/launch_fwd.hpp"
#include "tune_common.cuh"

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

// One backward: random q, k, v, dO; the sm80 forward's out and lse; the sm80 backward's dq, dk,
// dv as the reference. params() points the gradients at dq, dk, dv and the workspace at
// `workspace_floats` floats. TUNE_WINDOW=w: a sliding window (w, w) instead of the mask asked for.
struct BwdProblem {
  Element *q, *k, *v, *o, *dout, *dq, *dk, *dv, *dq_ref, *dk_ref, *dv_ref;
  float *lse, *workspace, *diff_buf;
  size_t n;  // elements of each of the above tensors
  double flops;  // the forward's, FlashAttention's count (halved for causal, whole for a window)
  flashcute::BwdParams p;

  template <int kHeadDim>
  static BwdProblem make(int seqlen, bool causal, size_t workspace_floats) {
    BwdProblem b;
    const int batch = 16384 / seqlen, nheads = 2048 / kHeadDim;
    b.n = size_t(batch) * seqlen * nheads * kHeadDim;
    const size_t rows = size_t(batch) * nheads * seqlen;
    for (Element** ptr : {&b.q, &b.k, &b.v, &b.o, &b.dout, &b.dq, &b.dk, &b.dv, &b.dq_ref, &b.dk_ref, &b.dv_ref})
      CHECK_CUDA(cudaMalloc(ptr, b.n * sizeof(Element)));
    CHECK_CUDA(cudaMalloc(&b.lse, rows * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&b.workspace, std::max(workspace_floats, rows) * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&b.diff_buf, sizeof(float)));
    fill_random<<<264, 256>>>(b.q, b.n, 1u);
    fill_random<<<264, 256>>>(b.k, b.n, 2u);
    fill_random<<<264, 256>>>(b.v, b.n, 3u);
    fill_random<<<264, 256>>>(b.dout, b.n, 4u);
    CHECK_CUDA(cudaGetLastError());
    flashcute::BwdParams& p = b.p;
    p.q = b.q; p.k = b.k; p.v = b.v; p.o = b.o; p.lse = b.lse;
    p.dout = b.dout; p.dq = b.dq_ref; p.dk = b.dk_ref; p.dv = b.dv_ref; p.dsum = b.workspace;
    const int64_t row = int64_t(nheads) * kHeadDim, bstride = row * seqlen;
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = bstride;
    p.do_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = bstride;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
    p.do_row_stride = p.dq_row_stride = p.dk_row_stride = p.dv_row_stride = row;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = kHeadDim;
    p.do_head_stride = p.dq_head_stride = p.dk_head_stride = p.dv_head_stride = kHeadDim;
    p.lse_batch_stride = int64_t(nheads) * seqlen;
    p.lse_head_stride = seqlen;
    p.batch = batch; p.seqlen_q = p.seqlen_k = seqlen; p.nheads = p.nheads_k = nheads; p.head_dim = kHeadDim;
    p.softmax_scale = 1.f / sqrtf(float(kHeadDim));
    p.window_left = -1; p.window_right = causal ? 0 : -1;
    if (const char* w = std::getenv("TUNE_WINDOW")) p.window_left = p.window_right = std::atoi(w);
    auto st = flashcute::sm80::launch_fwd<flashcute::DType::kBFloat16, kHeadDim>(p, nullptr);  // out and lse
    if (st.ok()) st = flashcute::sm80::launch_bwd<flashcute::DType::kBFloat16, kHeadDim>(p, nullptr);
    if (!st.ok()) { std::fprintf(stderr, "reference launch failed: %s\n", st.message.c_str()); std::exit(1); }
    CHECK_CUDA(cudaDeviceSynchronize());
    p.dq = b.dq; p.dk = b.dk; p.dv = b.dv;
    b.flops = 4.0 * batch * nheads * double(seqlen) * seqlen * kHeadDim / (p.window_right == 0 && p.window_left < 0 ? 2 : 1);
    std::printf("d=%d window=(%d,%d) S=%d (b=%d h=%d)\n", kHeadDim, p.window_left, p.window_right, seqlen, batch,
                nheads);
    return b;
  }

  // max |a - b| over the n elements of a gradient and its reference.
  float diff(const Element* a, const Element* b) const {
    CHECK_CUDA(cudaMemset(diff_buf, 0, sizeof(float)));
    max_abs_diff<<<264, 256>>>(a, b, n, diff_buf);
    float h = 0.f;
    CHECK_CUDA(cudaMemcpy(&h, diff_buf, sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
  void print_diffs() const {
    std::printf("  maxdiff dq %.3g dk %.3g dv %.3g\n", diff(dq, dq_ref), diff(dk, dk_ref), diff(dv, dv_ref));
  }

  void release() {
    for (Element* ptr : {q, k, v, o, dout, dq, dk, dv, dq_ref, dk_ref, dv_ref}) CHECK_CUDA(cudaFree(ptr));
    for (float* ptr : {lse, workspace, diff_buf}) CHECK_CUDA(cudaFree(ptr));
  }
};

// The seqlens from the command line (default 1k, 4k, 16k).
inline std::vector<int> tune_seqlens(int argc, char** argv) {
  std::vector<int> seqlens = {1024, 4096, 16384};
  if (argc > 1) {
    seqlens.clear();
    for (int i = 1; i < argc; ++i) seqlens.push_back(std::atoi(argv[i]));
  }
  return seqlens;
}
