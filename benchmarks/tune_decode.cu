// tune_decode: times the KV-cache decode call (one query token a sequence) through the C++ API
// with the library's split count and with forced ones, contiguous and paged, in one process.
//
// Each variant is captured once as a CUDA graph and replayed after an L2 flush (256 MiB written,
// then another 256 MiB read, so L2 holds clean lines), as `python -m flashcute.bench decode` times
// replays; 20 replays in variant order, then 20 in reverse, the median of the 40. Every variant's
// output is compared with the first one's (max |diff|), so a broken variant shows as a large
// difference, not as a fast time.
//   nvcc -std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr --use_fast_math -Iinclude \
//        -I<build>/include -Ithird_party/cutlass/include -DTUNE_HDIM=128 benchmarks/tune_decode.cu -o tune_decode
//   ./tune_decode [batches] [seqlens] [splits]    e.g. ./tune_decode 1,2,4 4096,16384 4,8,16
//   (TUNE_SHORT=n: each sequence n keys short of the capacity seqlen; bandwidth still counts seqlen;
//   TUNE_IN_ORDER=1: the paged cache's pages in order, not shuffled)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#ifndef TUNE_HDIM
#define TUNE_HDIM 128
#endif
// plan_fwd asks for a plain forward kernel of the head dim before it looks at the KV-cache ones.
#define FLASHCUTE_KERNELS \
  FLASHCUTE_KERNEL(kSm80, kFwd, kBFloat16, TUNE_HDIM), FLASHCUTE_KERNEL(kSm80, kFwd, kBFloat16, TUNE_HDIM, kSplitkv)
#include "flashcute/flashcute.hpp"
#include "tune_common.cuh"

using flashcute::DType;

namespace {

std::vector<int> ints(const char* s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) v.push_back(std::atoi(t.c_str()));
  return v;
}

// Reads n 16-byte words (the flush's second half: the lines it leaves in L2 are clean).
__global__ void read_through(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // never in practice: keeps the loads
}

struct Variant {
  std::string name;
  bool paged;
  int splits;  // 0: the library's choice
};

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int> batches = ints(argc > 1 ? argv[1] : "1,2,4");
  const std::vector<int> seqlens = ints(argc > 2 ? argv[2] : "2048,4096,8192,16384,65536");
  const std::vector<int> forced = ints(argc > 3 ? argv[3] : "4,8,16");
  const int d = TUNE_HDIM, page = 64;
  const std::vector<std::pair<int, int>> heads = {{32, 8}, {8, 8}};
  std::vector<Variant> variants = {{"auto", false, 0}, {"paged", true, 0}};
  for (int s : forced) {
    variants.push_back({"s" + std::to_string(s), false, s});
    variants.push_back({"paged-s" + std::to_string(s), true, s});
  }
  // TUNE_SHORT=n: each sequence holds n keys fewer than the cache's capacity (cache_seqlens).
  const int short_by = std::getenv("TUNE_SHORT") ? std::atoi(std::getenv("TUNE_SHORT")) : 0;
  const size_t flush_bytes = size_t(256) << 20;
  void* flush = nullptr;
  CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
  void* clean = nullptr;
  unsigned* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&clean, flush_bytes));
  CHECK_CUDA(cudaMemset(clean, 0, flush_bytes));
  CHECK_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t ev0, ev1;
  CHECK_CUDA(cudaEventCreate(&ev0));
  CHECK_CUDA(cudaEventCreate(&ev1));
  float* diff = nullptr;
  CHECK_CUDA(cudaMalloc(&diff, sizeof(float)));

  std::printf("d %d bf16, page %d, TB/s of K+V (graph replays, L2 flushed); chosen splits in brackets\n", d, page);
  std::printf("%6s %5s %7s %7s |", "heads", "batch", "seqlen", "KV MB");
  for (const Variant& v : variants) std::printf(" %13s", v.name.c_str());
  std::printf(" | max|diff|\n");
  for (auto [h, hk] : heads) {
    for (int batch : batches) {
      for (int sk : seqlens) {
        const int64_t kv_elems = int64_t(batch) * sk * hk * d;
        Element *k = nullptr, *v = nullptr, *q = nullptr;
        CHECK_CUDA(cudaMalloc(&k, 2 * kv_elems * sizeof(Element)));
        v = k + kv_elems;
        CHECK_CUDA(cudaMalloc(&q, size_t(batch) * h * d * sizeof(Element)));
        fill_random<<<1024, 256>>>(k, 2 * kv_elems, 1);
        fill_random<<<64, 256>>>(q, size_t(batch) * h * d, 2);
        // The paged cache holds the same keys: page j of sequence b is page perm[b * per_seq + j].
        const int per_seq = sk / page, num_pages = batch * per_seq;
        std::vector<int> perm(num_pages);
        std::iota(perm.begin(), perm.end(), 0);
        if (!std::getenv("TUNE_IN_ORDER")) std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
        Element *kp = nullptr, *vp = nullptr;
        CHECK_CUDA(cudaMalloc(&kp, 2 * kv_elems * sizeof(Element)));
        vp = kp + kv_elems;
        const size_t page_elems = size_t(page) * hk * d;
        for (int b = 0; b < batch; ++b)
          for (int j = 0; j < per_seq; ++j) {
            const size_t src = (size_t(b) * per_seq + j) * page_elems, dst = size_t(perm[b * per_seq + j]) * page_elems;
            CHECK_CUDA(cudaMemcpy(kp + dst, k + src, page_elems * sizeof(Element), cudaMemcpyDeviceToDevice));
            CHECK_CUDA(cudaMemcpy(vp + dst, v + src, page_elems * sizeof(Element), cudaMemcpyDeviceToDevice));
          }
        int* ints_dev = nullptr;  // block table, then cache lengths
        CHECK_CUDA(cudaMalloc(&ints_dev, sizeof(int) * (num_pages + batch)));
        std::vector<int> lens(batch, sk - short_by);
        CHECK_CUDA(cudaMemcpy(ints_dev, perm.data(), sizeof(int) * num_pages, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(ints_dev + num_pages, lens.data(), sizeof(int) * batch, cudaMemcpyHostToDevice));

        const size_t n_out = size_t(batch) * h * d;
        std::vector<Element*> outs;
        std::vector<float*> works;
        std::vector<cudaGraphExec_t> graphs;
        std::vector<int> chosen;
        for (const Variant& var : variants) {
          flashcute::FwdArgs args;
          if (var.paged) {
            args.k = flashcute::tensor_ref(kp, DType::kBFloat16, {num_pages, page, hk, d});
            args.v = flashcute::tensor_ref(vp, DType::kBFloat16, {num_pages, page, hk, d});
          } else {
            args.k = flashcute::tensor_ref(k, DType::kBFloat16, {batch, sk, hk, d});
            args.v = flashcute::tensor_ref(v, DType::kBFloat16, {batch, sk, hk, d});
          }
          args.q = flashcute::tensor_ref(q, DType::kBFloat16, {batch, 1, h, d});
          Element* out = nullptr;
          CHECK_CUDA(cudaMalloc(&out, n_out * sizeof(Element)));
          outs.push_back(out);
          args.out = flashcute::mutable_tensor_ref(out, DType::kBFloat16, {batch, 1, h, d});
          flashcute::KvcacheArgs& kv = args.kvcache.emplace();
          kv.cache_seqlens = flashcute::tensor_ref(ints_dev + num_pages, DType::kInt32, {batch});
          if (var.paged) kv.block_table = flashcute::tensor_ref(ints_dev, DType::kInt32, {batch, per_seq});
          kv.num_splits = var.splits;
          flashcute::FwdPlan plan;
          flashcute::Status st = flashcute::plan_fwd(args, plan);
          if (!st.ok()) { std::fprintf(stderr, "plan: %s\n", st.message.c_str()); return 1; }
          chosen.push_back(plan.params.num_splits);
          float* work = nullptr;
          if (plan.workspace_floats > 0) {
            CHECK_CUDA(cudaMalloc(&work, sizeof(float) * plan.workspace_floats));
            kv.workspace = flashcute::mutable_tensor_ref(work, DType::kFloat32, {plan.workspace_floats});
          }
          works.push_back(work);
          cudaGraph_t g;
          CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          st = flashcute::run_fwd(args, stream);
          CHECK_CUDA(cudaStreamEndCapture(stream, &g));
          if (!st.ok()) { std::fprintf(stderr, "run: %s\n", st.message.c_str()); return 1; }
          cudaGraphExec_t ge;
          CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
          CHECK_CUDA(cudaGraphDestroy(g));
          graphs.push_back(ge);
        }
        const int nv = int(variants.size()), iters = 20, warmup = 5;
        std::vector<std::vector<float>> ms(nv);
        for (int pass = 0; pass < 2; ++pass) {
          for (int o = 0; o < nv; ++o) {
            const int i = pass == 0 ? o : nv - 1 - o;
            for (int w = 0; w < warmup; ++w) CHECK_CUDA(cudaGraphLaunch(graphs[i], stream));
            for (int it = 0; it < iters; ++it) {
              CHECK_CUDA(cudaMemsetAsync(flush, it & 0xff, flush_bytes, stream));
              read_through<<<1024, 256, 0, stream>>>(static_cast<const uint4*>(clean), flush_bytes / 16, sink);
              CHECK_CUDA(cudaEventRecord(ev0, stream));
              CHECK_CUDA(cudaGraphLaunch(graphs[i], stream));
              CHECK_CUDA(cudaEventRecord(ev1, stream));
              CHECK_CUDA(cudaEventSynchronize(ev1));
              float t = 0.f;
              CHECK_CUDA(cudaEventElapsedTime(&t, ev0, ev1));
              ms[i].push_back(t);
            }
          }
        }
        float worst = 0.f;
        for (int i = 1; i < nv; ++i) {
          CHECK_CUDA(cudaMemset(diff, 0, sizeof(float)));
          max_abs_diff<<<64, 256>>>(outs[0], outs[i], n_out, diff);
          float m = 0.f;
          CHECK_CUDA(cudaMemcpy(&m, diff, sizeof(float), cudaMemcpyDeviceToHost));
          worst = std::max(worst, m);
        }
        const double bytes = 2.0 * kv_elems * sizeof(Element);
        std::printf("%3d:%-2d %5d %7d %7.0f |", h, hk, batch, sk, bytes / 1e6);
        for (int i = 0; i < nv; ++i) {
          std::sort(ms[i].begin(), ms[i].end());
          const float med = 0.5f * (ms[i][ms[i].size() / 2 - 1] + ms[i][ms[i].size() / 2]);
          char cell[32];
          std::snprintf(cell, sizeof cell, "%.3f [%d]", bytes / (med * 1e-3) / 1e12, chosen[i]);
          std::printf(" %13s", cell);
        }
        std::printf(" | %.2e\n", worst);
        std::fflush(stdout);
        for (auto ge : graphs) CHECK_CUDA(cudaGraphExecDestroy(ge));
        for (auto* o : outs) CHECK_CUDA(cudaFree(o));
        for (auto* w : works) if (w) CHECK_CUDA(cudaFree(w));
        CHECK_CUDA(cudaFree(k));
        CHECK_CUDA(cudaFree(kp));
        CHECK_CUDA(cudaFree(q));
        CHECK_CUDA(cudaFree(ints_dev));
      }
    }
  }
  return 0;
}
