// flashcute from C++: causal bf16 attention on the GPU, checked against a CPU reference.
// Exits 77 when there is no GPU to run on.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// Header-only use instantiates every kernel of the installed list in this translation unit; keep
// only the one this example runs (bf16, head dim 128), which builds several times faster.
#define FLASHCUTE_KERNELS FLASHCUTE_KERNEL(kSm80, kFwd, kBFloat16, 128)
#include <flashcute/flashcute.hpp>

#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    cudaError_t e = (expr);                                                               \
    if (e != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e));              \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to run\n");
    return 77;
  }
  // (batch, seqlen, heads, head_dim), contiguous, the same length for queries and keys.
  const int B = 2, S = 256, H = 4, D = 128;
  const size_t n = size_t(B) * S * H * D;
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  std::vector<__nv_bfloat16> q(n), k(n), v(n), o(n);
  for (auto* t : {&q, &k, &v})
    for (auto& x : *t) x = __float2bfloat16(normal(rng));

  __nv_bfloat16 *dq, *dk, *dv, *dout;
  for (auto** p : {&dq, &dk, &dv, &dout}) CHECK_CUDA(cudaMalloc(p, n * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMemcpy(dq, q.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dk, k.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, v.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));

  // Arrays are described by pointer, dtype, shape and (optionally) strides in elements.
  using flashcute::DType;
  flashcute::FwdArgs args;
  args.q = flashcute::tensor_ref(dq, DType::kBFloat16, {B, S, H, D});
  args.k = flashcute::tensor_ref(dk, DType::kBFloat16, {B, S, H, D});
  args.v = flashcute::tensor_ref(dv, DType::kBFloat16, {B, S, H, D});
  args.out = flashcute::mutable_tensor_ref(dout, DType::kBFloat16, {B, S, H, D});
  args.causal = true;
  const float scale = 1.f / std::sqrt(float(D));  // the default softmax_scale

  const flashcute::Status st = flashcute::run_fwd(args, /*stream=*/nullptr);
  if (!st.ok()) {
    std::fprintf(stderr, "run_fwd failed: %s\n", st.message.c_str());
    return 1;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(o.data(), dout, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  for (auto* ptr : {dq, dk, dv, dout}) CHECK_CUDA(cudaFree(ptr));

  // CPU reference: query i sees keys 0..i.
  auto at = [&](int b, int s, int h) { return ((size_t(b) * S + s) * H + h) * D; };
  double max_err = 0;
  std::vector<double> w(S);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < S; ++i) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int d = 0; d < D; ++d) s += double(__bfloat162float(q[at(b, i, h) + d])) * __bfloat162float(k[at(b, j, h) + d]);
          w[j] = s * scale;
          mx = std::max(mx, w[j]);
        }
        for (int j = 0; j <= i; ++j) sum += (w[j] = std::exp(w[j] - mx));
        for (int d = 0; d < D; ++d) {
          double ref = 0;
          for (int j = 0; j <= i; ++j) ref += w[j] / sum * __bfloat162float(v[at(b, j, h) + d]);
          const double err = std::abs(ref - double(__bfloat162float(o[at(b, i, h) + d])));
          max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
        }
      }
  std::printf("flashcute bf16 causal attention, B=%d S=%d H=%d D=%d: max abs error vs CPU %.3e\n", B, S, H, D, max_err);
  return max_err < 2e-2 ? 0 : 1;
}
