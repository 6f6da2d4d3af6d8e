// flashcute::run_fwd on the GPU against the CPU reference (reference.hpp: FlashAttention's rule,
// the same as flashcute.testing), no Python involved.
//
// Every case pads each tensor's heads with 8 poisoned (NaN) elements and appends a poisoned tail,
// so the test also sees a kernel that reads past head_dim (NaN in the output), leaves an output
// element unwritten (still NaN) or writes outside its tensor (a changed guard element). Without a
// usable GPU every test is skipped, with the reason.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "flashcute/host/api.hpp"
#include "case.hpp"
#include "gpu_util.hpp"
#include "reference.hpp"

namespace {

using flashcute::DType;
using namespace fctest;  // NOLINT: the test helpers

class FwdGpu : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    static const std::string reason = no_gpu_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    const Case& c = GetParam();
    if (!flashcute::dtype_compiled(c.dtype) || flashcute::kernel_head_dim(c.head_dim, c.dtype) == 0)
      GTEST_SKIP() << flashcute::dtype_name(c.dtype) << " / head dim " << c.head_dim << " is not compiled into this build";
  }
};

TEST_P(FwdGpu, MatchesTheReference) {
  const Case& c = GetParam();
  std::mt19937 rng(uint32_t(std::hash<std::string>{}(c.name())));

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
    if (buf) ASSERT_CUDA(buf->upload());

  // Outputs, poisoned: every element run_fwd must write starts as NaN.
  const View ov = padded_view(c.seqlen_q, c.nheads, c.head_dim);
  Buffer obuf(c.batch * ov.batch_stride + kTail);
  ASSERT_CUDA(obuf.upload());
  const int64_t lse_head_stride = c.seqlen_q + 5;  // 5 guard floats after each head's row
  const int64_t lse_batch_stride = c.nheads * lse_head_stride;
  const size_t lse_elems = size_t(c.batch * lse_batch_stride + kTail);
  std::vector<float> lse_host(lse_elems);
  float* lse_dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&lse_dev, lse_elems * sizeof(float)));
  std::unique_ptr<float, decltype(&cudaFree)> lse_owner(lse_dev, &cudaFree);
  ASSERT_CUDA(cudaMemset(lse_dev, 0xff, lse_elems * sizeof(float)));

  flashcute::FwdArgs args;
  args.q = ref_of(q, qv, c.dtype, c.batch, c.seqlen_q, c.nheads, c.head_dim);
  args.k = ref_of(k, kv, c.dtype, c.batch, c.seqlen_k, c.nheads_k, c.head_dim);
  args.v = ref_of(v, vv, c.dtype, c.batch, c.seqlen_k, c.nheads_k, c.head_dim);
  args.out = flashcute::mutable_tensor_ref(obuf.dev, c.dtype, {c.batch, c.seqlen_q, c.nheads, c.head_dim},
                                           {ov.batch_stride, ov.row_stride, ov.head_stride, 1});
  if (c.with_lse)
    args.lse = flashcute::mutable_tensor_ref(lse_dev, DType::kFloat32, {c.batch, c.nheads, c.seqlen_q},
                                             {lse_batch_stride, lse_head_stride, 1});
  args.causal = c.causal;
  args.window_left = c.window_left;
  args.window_right = c.window_right;
  args.softcap = c.softcap;

  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreate(&stream));
  const flashcute::Status st = flashcute::run_fwd(args, stream);
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  ASSERT_CUDA(cudaStreamDestroy(stream));
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_CUDA(cudaGetLastError());
  ASSERT_CUDA(obuf.download());
  ASSERT_CUDA(cudaMemcpy(lse_host.data(), lse_dev, lse_elems * sizeof(float), cudaMemcpyDeviceToHost));

  fctest::Problem p{c.batch, c.seqlen_q, c.seqlen_k, c.nheads, c.nheads_k, c.head_dim, c.causal,
                    c.window_left, c.window_right, c.softcap, 1.f / std::sqrt(float(c.head_dim))};
  auto getter = [&](const Buffer& buf, const View& view) {
    return [&buf, view, &c](int b, int s, int h, int d) { return fctest::to_float(buf.host[size_t(view.at(b, s, h, d))], c.dtype); };
  };
  const fctest::Attention ref = fctest::attention(p, getter(q, qv), getter(k, kv), getter(v, vv), nullptr);
  const fctest::Attention naive = fctest::attention(p, getter(q, qv), getter(k, kv), getter(v, vv), &c.dtype);

  // Output: every element written and within the rule; every guard element untouched.
  double err = 0, naive_err = 0;
  int64_t nan_outputs = 0, bad_guard = 0;
  std::vector<char> is_output(obuf.host.size(), 0);
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.seqlen_q; ++i)
      for (int h = 0; h < c.nheads; ++h)
        for (int d = 0; d < c.head_dim; ++d) {
          const int64_t at = ov.at(b, i, h, d);
          is_output[size_t(at)] = 1;
          const size_t r = ((size_t(b) * c.seqlen_q + i) * c.nheads + h) * c.head_dim + d;
          const float got = fctest::to_float(obuf.host[size_t(at)], c.dtype);
          if (!std::isfinite(got)) ++nan_outputs;
          else err = std::max(err, std::abs(got - ref.out[r]));
          naive_err = std::max(naive_err, std::abs(naive.out[r] - ref.out[r]));
        }
  for (size_t at = 0; at < obuf.host.size(); ++at)
    if (!is_output[at] && obuf.host[at] != kPoison16) ++bad_guard;
  EXPECT_EQ(nan_outputs, 0) << "non-finite outputs (unwritten, or read from the padding)";
  EXPECT_LE(err, fctest::tolerance(naive_err, fctest::kOutAtol)) << "naive low-precision error " << naive_err;

  // lse: within the rule where a row sees keys, exactly -inf where it sees none, guards untouched.
  double lse_err = 0, lse_naive_err = 0;
  int64_t bad_empty_rows = 0, bad_lse = 0;
  uint32_t poison32;
  std::memset(&poison32, 0xff, 4);
  for (size_t at = 0; at < lse_elems; ++at) {
    const int64_t b = int64_t(at) / lse_batch_stride, h = int64_t(at) % lse_batch_stride / lse_head_stride;
    const int64_t i = int64_t(at) % lse_head_stride;
    if (!(c.with_lse && b < c.batch && i < c.seqlen_q)) {
      uint32_t bits;
      std::memcpy(&bits, &lse_host[at], 4);
      if (bits != poison32) ++bad_guard;
      continue;
    }
    const size_t r = (size_t(b) * c.nheads + h) * c.seqlen_q + i;
    const float got = lse_host[at];
    if (std::isinf(ref.lse[r])) {
      if (!(std::isinf(got) && got < 0)) ++bad_empty_rows;
    } else if (!std::isfinite(got)) {
      ++bad_lse;
    } else {
      lse_err = std::max(lse_err, std::abs(got - ref.lse[r]));
      lse_naive_err = std::max(lse_naive_err, std::abs(naive.lse[r] - ref.lse[r]));
    }
  }
  EXPECT_EQ(bad_guard, 0) << "guard elements around out or lse were overwritten";
  EXPECT_EQ(bad_empty_rows, 0) << "rows that see no key must have lse = -inf";
  EXPECT_EQ(bad_lse, 0) << "non-finite lse in rows that see keys";
  EXPECT_LE(lse_err, fctest::tolerance(lse_naive_err, fctest::kLseAtol)) << "naive lse error " << lse_naive_err;
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  const int seqlens[][2] = {{1, 1}, {1, 300}, {17, 17}, {17, 300}, {113, 113}, {300, 17}, {300, 300}};
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    // 72 is not a kernel head dim: it runs on the next one up, with columns predicated off.
    for (int head_dim : {64, 128, 72}) {
      int n = 0;
      for (const auto& sl : seqlens)
        for (bool causal : {false, true}) {
          const bool gqa = (n++ % 2) == 1;  // alternate MHA 4:4 and GQA 8:2
          cases.push_back({dtype, 2, sl[0], sl[1], gqa ? 8 : 4, gqa ? 2 : 4, head_dim, causal});
        }
    }
    constexpr int d = 64;
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
    cases.push_back({dtype, 2, 33, 17, 4, 4, 256, true});  // causal, sq > sk: rows without keys
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, FwdGpu, testing::ValuesIn(make_cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name(); });

// A variable-length batch through the C++ API (FwdArgs::varlen): each sequence's output and lse
// are the same bits as a fixed-length run_fwd of that sequence alone (which the cases above check
// against the reference); rows are padded and poisoned as above, and an empty sequence, a
// sequence without keys and garbage cu_seqlens (clamped on the device) are in the mix.
TEST(FwdVarlenGpu, SequencesMatchFixedLengthCalls) {
  static const std::string reason = no_gpu_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  const DType dt = DType::kBFloat16;
  const int h = 4, hk = 2, d = 64;
  if (!flashcute::dtype_compiled(dt) || flashcute::kernel_head_dim(d, dt) == 0)
    GTEST_SKIP() << "bfloat16 / head dim 64 is not compiled into this build";
  // Varlen calls run on the sm80 kernels: the fixed-length calls this compares with bit for bit
  // must too (on an H100/H200 they would otherwise take the sm90 ones).
  struct Sm80Path {
    Sm80Path() { setenv("FLASHCUTE_FORWARD_PATH", "sm80", 1); }
    ~Sm80Path() { unsetenv("FLASHCUTE_FORWARD_PATH"); }
  } sm80_path;
  const std::vector<int> lens_q = {70, 0, 1, 130, 33}, lens_k = {50, 20, 9, 130, 0};
  std::vector<int> cu_q = {0}, cu_k = {0};
  for (size_t b = 0; b < lens_q.size(); ++b) cu_q.push_back(cu_q.back() + lens_q[b]), cu_k.push_back(cu_k.back() + lens_k[b]);
  const int tq = cu_q.back(), tk = cu_k.back(), batch = int(lens_q.size());
  std::mt19937 rng(7);
  // (1, total, heads, d) views with padded heads: the same helpers as the fixed-length cases.
  const View qv = padded_view(tq, h, d), kv = padded_view(tk, hk, d), ov = padded_view(tq, h, d);
  Buffer q(qv.batch_stride + kTail), k(kv.batch_stride + kTail), v(kv.batch_stride + kTail);
  fill(q, qv, 1, tq, h, d, dt, rng);
  fill(k, kv, 1, tk, hk, d, dt, rng);
  fill(v, kv, 1, tk, hk, d, dt, rng);
  Buffer out(ov.batch_stride + kTail), alone(ov.batch_stride + kTail);
  for (Buffer* buf : {&q, &k, &v, &out, &alone}) ASSERT_CUDA(buf->upload());
  int* cu_dev = nullptr;
  float* lse_dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&cu_dev, 4 * sizeof(int) * (batch + 1)));
  std::unique_ptr<int, decltype(&cudaFree)> cu_owner(cu_dev, &cudaFree);
  ASSERT_CUDA(cudaMalloc(&lse_dev, 2 * sizeof(float) * h * tq));
  std::unique_ptr<float, decltype(&cudaFree)> lse_owner(lse_dev, &cudaFree);
  ASSERT_CUDA(cudaMemset(lse_dev, 0xff, 2 * sizeof(float) * h * tq));
  ASSERT_CUDA(cudaMemcpy(cu_dev, cu_q.data(), sizeof(int) * (batch + 1), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(cu_dev + batch + 1, cu_k.data(), sizeof(int) * (batch + 1), cudaMemcpyHostToDevice));
  const std::vector<int> garbage = {-7, 40, 1 << 30, 12, 3, INT32_MIN};
  ASSERT_CUDA(cudaMemcpy(cu_dev + 2 * (batch + 1), garbage.data(), sizeof(int) * (batch + 1), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(cu_dev + 3 * (batch + 1), garbage.data(), sizeof(int) * (batch + 1), cudaMemcpyHostToDevice));

  auto run = [&](const int* cu_q_dev, const int* cu_k_dev, float* lse) {
    flashcute::FwdArgs args;
    args.q = flashcute::tensor_ref(q.dev, dt, {tq, h, d}, {qv.row_stride, qv.head_stride, 1});
    args.k = flashcute::tensor_ref(k.dev, dt, {tk, hk, d}, {kv.row_stride, kv.head_stride, 1});
    args.v = flashcute::tensor_ref(v.dev, dt, {tk, hk, d}, {kv.row_stride, kv.head_stride, 1});
    args.out = flashcute::mutable_tensor_ref(out.dev, dt, {tq, h, d}, {ov.row_stride, ov.head_stride, 1});
    args.lse = flashcute::mutable_tensor_ref(lse, DType::kFloat32, {h, tq}, {tq, 1});
    args.causal = true;
    args.varlen = flashcute::VarlenArgs{flashcute::tensor_ref(cu_q_dev, DType::kInt32, {batch + 1}),
                                        flashcute::tensor_ref(cu_k_dev, DType::kInt32, {batch + 1}), 130, 130};
    return flashcute::run_fwd(args, nullptr);
  };
  flashcute::Status st = run(cu_dev, cu_dev + batch + 1, lse_dev);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(out.download());
  std::vector<float> lse(size_t(h) * tq);
  ASSERT_CUDA(cudaMemcpy(lse.data(), lse_dev, sizeof(float) * h * tq, cudaMemcpyDeviceToHost));

  // Each sequence alone, into `alone` at the same rows, with its own lse.
  float* lse1 = lse_dev + h * tq;
  for (int b = 0; b < batch; ++b) {
    if (lens_q[b] == 0) continue;
    flashcute::FwdArgs args;
    const int64_t qo = qv.at(0, cu_q[b], 0, 0), ko = kv.at(0, cu_k[b], 0, 0);
    args.q = flashcute::tensor_ref(static_cast<const uint16_t*>(q.dev) + qo, dt, {1, lens_q[b], h, d},
                                   {qv.batch_stride, qv.row_stride, qv.head_stride, 1});
    args.k = flashcute::tensor_ref(static_cast<const uint16_t*>(k.dev) + ko, dt, {1, lens_k[b], hk, d},
                                   {kv.batch_stride, kv.row_stride, kv.head_stride, 1});
    args.v = flashcute::tensor_ref(static_cast<const uint16_t*>(v.dev) + ko, dt, {1, lens_k[b], hk, d},
                                   {kv.batch_stride, kv.row_stride, kv.head_stride, 1});
    args.out = flashcute::mutable_tensor_ref(static_cast<uint16_t*>(alone.dev) + qo, dt, {1, lens_q[b], h, d},
                                             {ov.batch_stride, ov.row_stride, ov.head_stride, 1});
    args.lse = flashcute::mutable_tensor_ref(lse1 + cu_q[b], DType::kFloat32, {1, h, lens_q[b]}, {h * tq, tq, 1});
    args.causal = true;
    st = flashcute::run_fwd(args, nullptr);
    ASSERT_TRUE(st.ok()) << "sequence " << b << ": " << st.message;
  }
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(alone.download());
  std::vector<float> lse_alone(size_t(h) * tq);
  ASSERT_CUDA(cudaMemcpy(lse_alone.data(), lse1, sizeof(float) * h * tq, cudaMemcpyDeviceToHost));
  EXPECT_EQ(out.host, alone.host) << "varlen output differs from the fixed-length calls (or a guard changed)";
  EXPECT_EQ(0, std::memcmp(lse.data(), lse_alone.data(), sizeof(float) * h * tq)) << "varlen lse differs";
  for (int i = 0; i < tq; ++i)
    for (int hh = 0; hh < h; ++hh)
      for (int dd = 0; dd < d; ++dd)
        EXPECT_TRUE(std::isfinite(fctest::to_float(out.host[size_t(ov.at(0, i, hh, dd))], dt))) << "row " << i;

  // Garbage cu_seqlens: clamped on the device, so the call stays inside its arrays and succeeds
  // (compute-sanitizer's memcheck is what proves the "inside"; here: no error, guards intact).
  st = run(cu_dev + 2 * (batch + 1), cu_dev + 3 * (batch + 1), lse_dev);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(out.download());
  for (size_t at = size_t(ov.batch_stride); at < out.host.size(); ++at) ASSERT_EQ(out.host[at], kPoison16) << at;
}

}  // namespace

// A paged KV cache through the C++ API (FwdArgs::kvcache): one decode step with an append, GQA
// 4:1 packed, split-KV with the workspace the plan asks for; the appended rows must be in the
// cache, the spare pages untouched, and each sequence's output and lse pass the reference rule
// against its keys read through the block table.
TEST(FwdKvcacheGpu, PagedDecodeStepMatchesTheReference) {
  static const std::string reason = no_gpu_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  const DType dt = DType::kBFloat16;
  const int batch = 2, h = 8, hk = 2, d = 64, page = 16, per_seq = 8, num_pages = batch * per_seq + 3;
  using flashcute::Arch, flashcute::Direction, flashcute::Variant;
  if (flashcute::kernel_head_dim(d, dt, Direction::kFwd, Arch::kSm80, Variant::kSplitkv) == 0)
    GTEST_SKIP() << "no KV-cache kernel for bfloat16 / head dim 64 in this build";
  const std::vector<int> lens = {37, 100};  // keys already cached; one new key each
  std::vector<int> table(batch * per_seq);
  for (int i = 0; i < batch * per_seq; ++i) table[i] = (i * 7 + 3) % num_pages;  // shuffled, 3 spare pages
  std::mt19937 rng(11);
  const View cv{0, int64_t(page) * hk * d, int64_t(hk) * d, d};  // (num_pages, page, hk, d) contiguous
  const View qv{0, int64_t(h) * d, int64_t(h) * d, d};            // (batch, 1, h, d)
  const View nv{0, int64_t(hk) * d, int64_t(hk) * d, d};          // (batch, 1, hk, d)
  Buffer kc(num_pages * cv.batch_stride), vc(num_pages * cv.batch_stride), q(batch * qv.batch_stride),
      kn(batch * nv.batch_stride), vn(batch * nv.batch_stride), out(batch * qv.batch_stride);
  fill(kc, cv, num_pages, page, hk, d, dt, rng);
  fill(vc, cv, num_pages, page, hk, d, dt, rng);
  fill(q, qv, batch, 1, h, d, dt, rng);
  fill(kn, nv, batch, 1, hk, d, dt, rng);
  fill(vn, nv, batch, 1, hk, d, dt, rng);
  const std::vector<uint16_t> kc_before = kc.host;
  for (Buffer* buf : {&kc, &vc, &q, &kn, &vn, &out}) ASSERT_CUDA(buf->upload());
  int* ints = nullptr;  // block table, then cache lengths
  float* floats = nullptr;  // lse, then the workspace
  ASSERT_CUDA(cudaMalloc(&ints, sizeof(int) * (table.size() + batch)));
  std::unique_ptr<int, decltype(&cudaFree)> ints_owner(ints, &cudaFree);
  ASSERT_CUDA(cudaMemcpy(ints, table.data(), sizeof(int) * table.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(ints + table.size(), lens.data(), sizeof(int) * batch, cudaMemcpyHostToDevice));

  flashcute::FwdArgs args;
  args.q = ref_of(q, qv, dt, batch, 1, h, d);
  args.k = ref_of(kc, cv, dt, num_pages, page, hk, d);
  args.v = ref_of(vc, cv, dt, num_pages, page, hk, d);
  args.out = flashcute::mutable_tensor_ref(out.dev, dt, {batch, 1, h, d});
  flashcute::KvcacheArgs& kv = args.kvcache.emplace();
  kv.block_table = flashcute::tensor_ref(ints, DType::kInt32, {batch, per_seq});
  kv.cache_seqlens = flashcute::tensor_ref(ints + table.size(), DType::kInt32, {batch});
  kv.k_new = ref_of(kn, nv, dt, batch, 1, hk, d);
  kv.v_new = ref_of(vn, nv, dt, batch, 1, hk, d);
  kv.num_splits = 3;
  flashcute::FwdPlan plan;
  flashcute::Status st = flashcute::plan_fwd(args, plan);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_GT(plan.workspace_floats, 0);
  ASSERT_CUDA(cudaMalloc(&floats, sizeof(float) * (batch * h + plan.workspace_floats)));
  std::unique_ptr<float, decltype(&cudaFree)> floats_owner(floats, &cudaFree);
  args.lse = flashcute::mutable_tensor_ref(floats, DType::kFloat32, {batch, h, 1});
  kv.workspace = flashcute::mutable_tensor_ref(floats + 64, DType::kFloat32, {plan.workspace_floats});
  st = flashcute::run_fwd(args, nullptr);  // plan, attach the workspace, append, attend, combine
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(out.download());
  ASSERT_CUDA(kc.download());
  ASSERT_CUDA(vc.download());
  std::vector<float> lse(batch * h);
  ASSERT_CUDA(cudaMemcpy(lse.data(), floats, sizeof(float) * lse.size(), cudaMemcpyDeviceToHost));

  auto at = [&](const Buffer& c, int b, int key, int head, int col) {  // key `key` of sequence b
    const int p = table[b * per_seq + key / page];
    return to_float(c.host[size_t(cv.at(p, key % page, head, col))], dt);
  };
  for (int b = 0; b < batch; ++b) {
    for (int c = 0; c < d; ++c)  // the appended key, at position lens[b]
      ASSERT_EQ(at(kc, b, lens[b], 1, c), to_float(kn.host[size_t(nv.at(b, 0, 1, c))], dt)) << b;
    Problem p{1, 1, lens[b] + 1, h, hk, d};
    p.scale = 1.f / std::sqrt(float(d));
    const Get qg = [&](int, int, int hh, int c) { return to_float(q.host[size_t(qv.at(b, 0, hh, c))], dt); };
    const Get kg = [&](int, int key, int hh, int c) { return at(kc, b, key, hh, c); };
    const Get vg = [&](int, int key, int hh, int c) { return at(vc, b, key, hh, c); };
    const Attention ref = attention(p, qg, kg, vg, nullptr), naive = attention(p, qg, kg, vg, &dt);
    double err = 0, naive_err = 0, lse_err = 0, lse_naive = 0;
    for (int hh = 0; hh < h; ++hh) {
      for (int c = 0; c < d; ++c) {
        const size_t r = size_t(hh) * d + c;
        const double got = to_float(out.host[size_t(qv.at(b, 0, hh, c))], dt);
        ASSERT_TRUE(std::isfinite(got)) << b << " " << hh << " " << c;
        err = std::max(err, std::abs(got - ref.out[r]));
        naive_err = std::max(naive_err, std::abs(naive.out[r] - ref.out[r]));
      }
      lse_err = std::max(lse_err, std::abs(double(lse[b * h + hh]) - ref.lse[hh]));
      lse_naive = std::max(lse_naive, std::abs(naive.lse[hh] - ref.lse[hh]));
    }
    EXPECT_LE(err, tolerance(naive_err, kOutAtol)) << "sequence " << b;
    EXPECT_LE(lse_err, tolerance(lse_naive, kLseAtol)) << "sequence " << b;
  }
  for (int p = 0; p < num_pages; ++p) {  // pages no sequence points at are untouched
    if (std::find(table.begin(), table.end(), p) != table.end()) continue;
    for (int64_t i = 0; i < cv.batch_stride; ++i)
      ASSERT_EQ(kc.host[size_t(p * cv.batch_stride + i)], kc_before[size_t(p * cv.batch_stride + i)]) << p;
  }
}
