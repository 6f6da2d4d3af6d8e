// flashcute::run_fwd against a CPU reference (double accumulation), no Python involved.
//
// Every case pads each tensor's heads with 8 poisoned (NaN) elements and appends a
// poisoned tail, so the test also sees a kernel that reads past head_dim (NaN in the
// output), leaves an output element unwritten (still NaN) or writes outside its
// tensor (a changed guard element). Exits 77 (ctest: skipped) without a usable GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "flashcute/api.hpp"

namespace {

using flashcute::DType;

#define CUDA_CHECK(expr)                                                                              \
  do {                                                                                                \
    cudaError_t err_ = (expr);                                                                        \
    if (err_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

constexpr uint16_t kPoison16 = 0xffff;  // NaN in both fp16 and bf16
constexpr int kHeadPad = 8;             // poisoned elements after each head's head_dim columns
constexpr int64_t kTail = 256;          // poisoned elements after each tensor

float to_float(uint16_t bits, DType dtype) {
  if (dtype == DType::kFloat16) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

uint16_t from_float(float x, DType dtype) {
  if (dtype == DType::kFloat16) return __half_raw(__float2half_rn(x)).x;
  return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
}

struct Case {
  DType dtype;
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool packed_qkv = false;  // q, k, v are views of one (batch, seqlen, 3, heads, head_dim) tensor
  bool with_lse = true;

  std::string name() const {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s d=%d b=%d sq=%d sk=%d h=%d/%d%s%s%s%s%s",
                  dtype == DType::kFloat16 ? "fp16" : "bf16", head_dim, batch, seqlen_q, seqlen_k, nheads, nheads_k,
                  causal ? " causal" : "", window_left >= 0 || window_right >= 0 ? " window" : "",
                  softcap > 0.f ? " softcap" : "", packed_qkv ? " packed" : "", with_lse ? "" : " no-lse");
    return buf;
  }
};

// Where a (batch, seqlen, heads, head_dim) tensor's elements live in its buffer.
struct View {
  int64_t offset = 0, batch_stride = 0, row_stride = 0, head_stride = 0;
  int64_t at(int b, int s, int h, int d) const { return offset + b * batch_stride + s * row_stride + h * head_stride + d; }
};

View padded_view(int seqlen, int heads, int head_dim) {
  View v;
  v.head_stride = head_dim + kHeadPad;
  v.row_stride = heads * v.head_stride;
  v.batch_stride = seqlen * v.row_stride;
  return v;
}

// A device buffer of 16-bit elements with a host mirror.
struct Buffer {
  std::vector<uint16_t> host;
  void* dev = nullptr;
  explicit Buffer(int64_t n) : host(size_t(n), kPoison16) { CUDA_CHECK(cudaMalloc(&dev, size_t(n) * 2)); }
  ~Buffer() { cudaFree(dev); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void upload() { CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice)); }
  void download() { CUDA_CHECK(cudaMemcpy(host.data(), dev, host.size() * 2, cudaMemcpyDeviceToHost)); }
};

// Fills the view's elements with N(0, 1) values rounded to dtype; the rest stays poisoned.
void fill(Buffer& buf, const View& v, int batch, int seqlen, int heads, int head_dim, DType dtype, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < seqlen; ++s)
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < head_dim; ++d) buf.host[size_t(v.at(b, s, h, d))] = from_float(normal(rng), dtype);
}

// FlashAttention-2 semantics: bottom-right aligned mask, optional window and softcap.
void reference(const Case& c, const Buffer& q, const View& qv, const Buffer& k, const View& kv, const Buffer& v,
               const View& vv, float scale, std::vector<double>& out, std::vector<double>& lse) {
  const int group = c.nheads / c.nheads_k;
  const int window_right = c.causal ? 0 : c.window_right;
  out.assign(size_t(c.batch) * c.seqlen_q * c.nheads * c.head_dim, 0.0);
  lse.assign(size_t(c.batch) * c.nheads * c.seqlen_q, -INFINITY);
  std::vector<double> qrow(c.head_dim), scores(c.seqlen_k);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.nheads; ++h)
      for (int i = 0; i < c.seqlen_q; ++i) {
        const int diag = i + c.seqlen_k - c.seqlen_q;
        const int lo = std::max(0, c.window_left >= 0 ? diag - c.window_left : 0);
        const int hi = std::min(c.seqlen_k - 1, window_right >= 0 ? diag + window_right : c.seqlen_k - 1);
        if (lo > hi) continue;  // sees no key: out = 0, lse = -inf
        for (int d = 0; d < c.head_dim; ++d) qrow[d] = to_float(q.host[size_t(qv.at(b, i, h, d))], c.dtype);
        double max_score = -INFINITY;
        for (int j = lo; j <= hi; ++j) {
          double s = 0;
          for (int d = 0; d < c.head_dim; ++d) s += qrow[d] * to_float(k.host[size_t(kv.at(b, j, h / group, d))], c.dtype);
          s *= scale;
          if (c.softcap > 0.f) s = c.softcap * std::tanh(s / c.softcap);
          scores[j] = s;
          max_score = std::max(max_score, s);
        }
        double sum = 0;
        for (int j = lo; j <= hi; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
        double* o = &out[((size_t(b) * c.seqlen_q + i) * c.nheads + h) * c.head_dim];
        for (int j = lo; j <= hi; ++j)
          for (int d = 0; d < c.head_dim; ++d)
            o[d] += scores[j] / sum * to_float(v.host[size_t(vv.at(b, j, h / group, d))], c.dtype);
        lse[(size_t(b) * c.nheads + h) * c.seqlen_q + i] = max_score + std::log(sum);
      }
}

// Runs one case; returns true when it passes.
bool run_case(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const float scale = 1.f / std::sqrt(float(c.head_dim));

  // Inputs: three padded tensors, or three views of one packed tensor.
  View qv, kv, vv;
  std::unique_ptr<Buffer> qbuf, kbuf, vbuf;
  if (c.packed_qkv) {  // requires seqlen_q == seqlen_k and nheads == nheads_k
    const int64_t hd = int64_t(c.nheads) * c.head_dim;
    for (View* view : {&qv, &kv, &vv}) {
      view->head_stride = c.head_dim;
      view->row_stride = 3 * hd;
      view->batch_stride = c.seqlen_q * view->row_stride;
    }
    kv.offset = hd;
    vv.offset = 2 * hd;
    qbuf = std::make_unique<Buffer>(c.batch * qv.batch_stride + kTail);
  } else {
    qv = padded_view(c.seqlen_q, c.nheads, c.head_dim);
    kv = vv = padded_view(c.seqlen_k, c.nheads_k, c.head_dim);
    qbuf = std::make_unique<Buffer>(c.batch * qv.batch_stride + kTail);
    kbuf = std::make_unique<Buffer>(c.batch * kv.batch_stride + kTail);
    vbuf = std::make_unique<Buffer>(c.batch * vv.batch_stride + kTail);
  }
  Buffer& q = *qbuf;
  Buffer& k = c.packed_qkv ? q : *kbuf;
  Buffer& v = c.packed_qkv ? q : *vbuf;
  fill(q, qv, c.batch, c.seqlen_q, c.nheads, c.head_dim, c.dtype, rng);
  fill(k, kv, c.batch, c.seqlen_k, c.nheads_k, c.head_dim, c.dtype, rng);
  fill(v, vv, c.batch, c.seqlen_k, c.nheads_k, c.head_dim, c.dtype, rng);
  for (Buffer* buf : {qbuf.get(), kbuf.get(), vbuf.get()})
    if (buf) buf->upload();

  // Outputs, poisoned: every element run_fwd must write starts as NaN.
  const View ov = padded_view(c.seqlen_q, c.nheads, c.head_dim);
  Buffer obuf(c.batch * ov.batch_stride + kTail);
  obuf.upload();
  const int64_t lse_head_stride = c.seqlen_q + 5;  // 5 guard floats after each head's row
  const int64_t lse_batch_stride = c.nheads * lse_head_stride;
  const size_t lse_elems = size_t(c.batch * lse_batch_stride + kTail);
  std::vector<float> lse_host(lse_elems);
  float* lse_dev = nullptr;
  CUDA_CHECK(cudaMalloc(&lse_dev, lse_elems * sizeof(float)));
  CUDA_CHECK(cudaMemset(lse_dev, 0xff, lse_elems * sizeof(float)));

  flashcute::FwdParams p;
  p.q = static_cast<const uint16_t*>(q.dev) + qv.offset;
  p.k = static_cast<const uint16_t*>(k.dev) + kv.offset;
  p.v = static_cast<const uint16_t*>(v.dev) + vv.offset;
  p.o = obuf.dev;
  p.lse = c.with_lse ? lse_dev : nullptr;
  p.q_batch_stride = qv.batch_stride, p.q_row_stride = qv.row_stride, p.q_head_stride = qv.head_stride;
  p.k_batch_stride = kv.batch_stride, p.k_row_stride = kv.row_stride, p.k_head_stride = kv.head_stride;
  p.v_batch_stride = vv.batch_stride, p.v_row_stride = vv.row_stride, p.v_head_stride = vv.head_stride;
  p.o_batch_stride = ov.batch_stride, p.o_row_stride = ov.row_stride, p.o_head_stride = ov.head_stride;
  p.lse_batch_stride = lse_batch_stride, p.lse_head_stride = lse_head_stride;
  p.batch = c.batch, p.seqlen_q = c.seqlen_q, p.seqlen_k = c.seqlen_k;
  p.nheads = c.nheads, p.nheads_k = c.nheads_k, p.head_dim = c.head_dim;
  p.softmax_scale = scale;
  p.softcap = c.softcap;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.dtype = c.dtype;

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const flashcute::Status st = flashcute::run_fwd(p, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaStreamDestroy(stream));
  if (!st.ok()) {
    std::printf("FAIL %s: run_fwd returned code %d: %s (%s)\n", c.name().c_str(), int(st.code), st.message,
                cudaGetErrorString(st.cuda_error));
    CUDA_CHECK(cudaFree(lse_dev));
    return false;
  }
  obuf.download();
  CUDA_CHECK(cudaMemcpy(lse_host.data(), lse_dev, lse_elems * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(lse_dev));

  std::vector<double> ref_o, ref_lse;
  reference(c, q, qv, k, kv, v, vv, scale, ref_o, ref_lse);

  // Output: every element written and close; every guard element untouched.
  const double tol_o = c.dtype == DType::kBFloat16 ? 2e-2 : 4e-3;
  const double tol_lse = 2e-3;
  double err_o = 0, err_lse = 0;
  int worst[4] = {0, 0, 0, 0};  // (b, i, h, d) of the largest output error
  int64_t nan_outputs = 0, bad_guard = 0, bad_lse = 0;
  std::vector<char> is_output(obuf.host.size(), 0);
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.seqlen_q; ++i)
      for (int h = 0; h < c.nheads; ++h)
        for (int d = 0; d < c.head_dim; ++d) {
          const int64_t at = ov.at(b, i, h, d);
          is_output[size_t(at)] = 1;
          const float got = to_float(obuf.host[size_t(at)], c.dtype);
          const double want = ref_o[((size_t(b) * c.seqlen_q + i) * c.nheads + h) * c.head_dim + d];
          if (std::isnan(got)) {
            ++nan_outputs;
          } else if (std::abs(got - want) > err_o) {
            err_o = std::abs(got - want);
            worst[0] = b, worst[1] = i, worst[2] = h, worst[3] = d;
          }
        }
  for (size_t at = 0; at < obuf.host.size(); ++at)
    if (!is_output[at] && obuf.host[at] != kPoison16) ++bad_guard;

  uint32_t poison32;
  std::memset(&poison32, 0xff, 4);
  for (size_t at = 0; at < lse_elems; ++at) {
    const int64_t b = int64_t(at) / lse_batch_stride, h = int64_t(at) % lse_batch_stride / lse_head_stride;
    const int64_t i = int64_t(at) % lse_head_stride;
    const bool inside = c.with_lse && b < c.batch && i < c.seqlen_q;
    if (!inside) {
      uint32_t bits;
      std::memcpy(&bits, &lse_host[at], 4);
      if (bits != poison32) ++bad_guard;
      continue;
    }
    const double want = ref_lse[(size_t(b) * c.nheads + h) * c.seqlen_q + i];
    const float got = lse_host[at];
    if (std::isinf(want)) {
      if (!(std::isinf(got) && got < 0)) ++bad_lse;
    } else if (!(std::abs(got - want) <= tol_lse)) {  // NaN (unwritten) fails too
      ++bad_lse;
      if (!std::isnan(got)) err_lse = std::max(err_lse, std::abs(got - want));
    } else {
      err_lse = std::max(err_lse, std::abs(got - want));
    }
  }

  const bool pass = err_o <= tol_o && nan_outputs == 0 && bad_guard == 0 && bad_lse == 0;
  std::printf("%s %-52s max|dO| %.2e (tol %.0e)  max|dlse| %.2e", pass ? "ok  " : "FAIL", c.name().c_str(), err_o,
              tol_o, err_lse);
  if (err_o > tol_o) std::printf(" at (b %d, row %d, head %d, col %d)", worst[0], worst[1], worst[2], worst[3]);
  if (nan_outputs) std::printf("  NaN outputs (unwritten, or read from padding): %lld", (long long)nan_outputs);
  if (bad_guard) std::printf("  guard elements overwritten: %lld", (long long)bad_guard);
  if (bad_lse) std::printf("  wrong lse: %lld", (long long)bad_lse);
  std::printf("\n");
  return pass;
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  std::vector<DType> dtypes;
  if (flashcute::dtype_compiled(DType::kBFloat16)) dtypes.push_back(DType::kBFloat16);
  if (flashcute::dtype_compiled(DType::kFloat16)) dtypes.push_back(DType::kFloat16);
  const int seqlens[][2] = {{1, 1}, {1, 300}, {17, 17}, {17, 300}, {113, 113}, {300, 17}, {300, 300}};
  for (DType dtype : dtypes) {
    // 72 is not a kernel head dim: it runs on the next one up, with columns predicated off.
    for (int head_dim : {64, 128, 72}) {
      if (flashcute::dispatch_head_dim(head_dim) == 0) {
        std::printf("skip head_dim %d: no kernel head dim >= %d in this build\n", head_dim, head_dim);
        continue;
      }
      int n = 0;
      for (const auto& sl : seqlens)
        for (bool causal : {false, true}) {
          const bool gqa = (n++ % 2) == 1;  // alternate MHA 4:4 and GQA 8:2
          cases.push_back({dtype, 2, sl[0], sl[1], gqa ? 8 : 4, gqa ? 2 : 4, head_dim, causal});
        }
    }
    // Options, on the smallest head dim this build has that is >= 64.
    const int d = flashcute::dispatch_head_dim(64);
    if (d == 0) continue;
    Case sliding{dtype, 1, 300, 300, 4, 4, d};
    sliding.window_left = 48;
    sliding.window_right = 16;
    cases.push_back(sliding);
    Case left_only{dtype, 1, 113, 300, 8, 2, d};
    left_only.window_left = 32;
    cases.push_back(left_only);
    Case softcap{dtype, 2, 113, 300, 4, 4, d, true};
    softcap.softcap = 2.f;  // small enough to change the result
    cases.push_back(softcap);
    Case packed{dtype, 2, 113, 113, 4, 4, d, true};
    packed.packed_qkv = true;
    cases.push_back(packed);
    Case no_lse{dtype, 3, 17, 113, 4, 1, d};
    no_lse.with_lse = false;
    cases.push_back(no_lse);
    cases.push_back({dtype, 1, 17, 0, 4, 4, d});  // no keys: o = 0, lse = -inf
  }
  return cases;
}

}  // namespace

int main() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("test_fwd_gpu: skipped: no CUDA device (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
    return 77;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 8) {
    std::printf("test_fwd_gpu: skipped: %s is sm%d%d, flashcute needs sm80 or newer\n", prop.name, prop.major,
                prop.minor);
    return 77;
  }
  std::printf("test_fwd_gpu: %s (sm%d%d)\n", prop.name, prop.major, prop.minor);

  const std::vector<Case> cases = make_cases();
  int failed = 0;
  for (size_t i = 0; i < cases.size(); ++i) failed += run_case(cases[i], uint32_t(1234 + i)) ? 0 : 1;
  std::printf("test_fwd_gpu: %zu cases, %d failed\n", cases.size(), failed);
  return failed == 0 ? 0 : 1;
}
