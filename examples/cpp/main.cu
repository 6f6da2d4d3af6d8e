// flashcute from C++: causal attention on the GPU with every forward kernel this translation unit
// compiled, each checked against a CPU reference. Exits 77 when there is no GPU to run on.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

// Header-only use instantiates every kernel of the installed list in this translation unit.
// CMakeLists.txt's FLASHCUTE_EXAMPLE_KERNELS picks how many (main() runs each forward of them):
//   sm80       one sm80 forward (bf16, head dim 128): builds in a minute;
//   sm80+sm90  the same and its Hopper twin, which needs the TU compiled for sm_90a too;
//   installed  the installed package's whole list (flashcute/build_config.hpp): slow to build.
#if defined(FLASHCUTE_EXAMPLE_SM90)
#define FLASHCUTE_KERNELS FLASHCUTE_KERNEL(kSm80, kFwd, kBFloat16, 128), FLASHCUTE_KERNEL(kSm90, kFwd, kBFloat16, 128)
#elif !defined(FLASHCUTE_EXAMPLE_INSTALLED_LIST)
#define FLASHCUTE_KERNELS FLASHCUTE_KERNEL(kSm80, kFwd, kBFloat16, 128)
#endif
#include <flashcute/flashcute.hpp>

using flashcute::DType;

#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    cudaError_t e = (expr);                                                               \
    if (e != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e));              \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
float to_float(__half x) { return __half2float(x); }
template <class T> T from_float(float x);
template <> __nv_bfloat16 from_float(float x) { return __float2bfloat16(x); }
template <> __half from_float(float x) { return __float2half(x); }

// Causal attention of (B, S, H, D) contiguous arrays of T with the kernel `key` names, against
// the CPU reference: 0 when it passes, 1 when it fails.
template <class T>
int run_causal(const flashcute::KernelKey& key) {
  const int B = 2, S = 256, H = 4, D = key.head_dim;
  const DType dtype = key.dtype;
  const size_t n = size_t(B) * S * H * D;
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  std::vector<T> q(n), k(n), v(n), o(n);
  for (auto* t : {&q, &k, &v})
    for (auto& x : *t) x = from_float<T>(normal(rng));

  T *dq, *dk, *dv, *dout;
  for (auto** p : {&dq, &dk, &dv, &dout}) CHECK_CUDA(cudaMalloc(p, n * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(dq, q.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dk, k.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, v.data(), n * sizeof(T), cudaMemcpyHostToDevice));

  // Arrays are described by pointer, dtype, shape and (optionally) strides in elements.
  flashcute::FwdArgs args;
  args.q = flashcute::tensor_ref(dq, dtype, {B, S, H, D});
  args.k = flashcute::tensor_ref(dk, dtype, {B, S, H, D});
  args.v = flashcute::tensor_ref(dv, dtype, {B, S, H, D});
  args.out = flashcute::mutable_tensor_ref(dout, dtype, {B, S, H, D});
  args.causal = true;
  const float scale = 1.f / std::sqrt(float(D));  // the default softmax_scale

  // A forward runs on the sm90 kernels where the device and the call allow (compute capability
  // 9.0), else on the sm80 ones; FLASHCUTE_FORWARD_PATH=sm80 keeps it on the sm80 ones.
  setenv("FLASHCUTE_FORWARD_PATH", key.arch == flashcute::Arch::kSm80 ? "sm80" : "auto", 1);
  const flashcute::Status st = flashcute::run_fwd(args, /*stream=*/nullptr);
  if (!st.ok()) {
    std::fprintf(stderr, "run_fwd failed: %s\n", st.message.c_str());
    return 1;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(o.data(), dout, n * sizeof(T), cudaMemcpyDeviceToHost));
  for (auto* ptr : {dq, dk, dv, dout}) CHECK_CUDA(cudaFree(ptr));
  if (flashcute::last_forward_arch().load() != key.arch) {
    std::fprintf(stderr, "the forward ran on the %s kernels, not on %s\n",
                 flashcute::arch_name(flashcute::last_forward_arch().load()), flashcute::arch_name(key.arch));
    return 1;
  }

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
          for (int d = 0; d < D; ++d) s += double(to_float(q[at(b, i, h) + d])) * to_float(k[at(b, j, h) + d]);
          w[j] = s * scale;
          mx = std::max(mx, w[j]);
        }
        for (int j = 0; j <= i; ++j) sum += (w[j] = std::exp(w[j] - mx));
        for (int d = 0; d < D; ++d) {
          double ref = 0;
          for (int j = 0; j <= i; ++j) ref += w[j] / sum * to_float(v[at(b, j, h) + d]);
          const double err = std::abs(ref - double(to_float(o[at(b, i, h) + d])));
          max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
        }
      }
  const bool ok = max_err < 2e-2;
  std::printf("flashcute %s %s causal attention, B=%d S=%d H=%d D=%d: max abs error vs CPU %.3e%s\n",
              flashcute::arch_name(key.arch), flashcute::dtype_name(dtype), B, S, H, D, max_err, ok ? "" : ": FAILED");
  return ok ? 0 : 1;
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to run\n");
    return 77;
  }
  // Every plain forward kernel of the list (flashcute::kCompiledKernels); the sm90 ones only
  // where they can run, on compute capability 9.0.
  int failed = 0, ran = 0;
  for (const flashcute::KernelKey& key : flashcute::kCompiledKernels) {
    if (key.direction != flashcute::Direction::kFwd || key.variant != flashcute::Variant::kPlain) continue;
    if (key.arch == flashcute::Arch::kSm90 && !flashcute::device_is_sm90()) {
      std::printf("flashcute sm90 %s head dim %d: skipped, the device is not compute capability 9.0\n",
                  flashcute::dtype_name(key.dtype), key.head_dim);
      continue;
    }
    failed += key.dtype == flashcute::DType::kBFloat16 ? run_causal<__nv_bfloat16>(key) : run_causal<__half>(key);
    ++ran;
  }
  std::printf("%d of %d forward kernels passed\n", ran - failed, ran);
  return failed == 0 && ran > 0 ? 0 : 1;
}
