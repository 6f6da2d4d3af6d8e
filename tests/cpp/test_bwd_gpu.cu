// flashcute::run_bwd on the GPU against the CPU reference (reference.hpp: FlashAttention's rule on
// each of dq, dk and dv), no Python involved; and run_bwd's errors, which come back as a Status.
//
// dout and the gradients live in padded, poisoned buffers (see test_fwd_gpu.cu): an unwritten
// gradient element stays NaN, and a write outside a tensor changes a guard element.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
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

class BwdGpu : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    static const std::string reason = no_gpu_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    const Case& c = GetParam();
    if (flashcute::kernel_head_dim(c.head_dim, c.dtype, flashcute::Direction::kBwd) == 0)
      GTEST_SKIP() << flashcute::dtype_name(c.dtype) << " / head dim " << c.head_dim
                   << " has no backward kernel in this build";
  }
};

// One gradient: every element written and within the rule, every guard element untouched.
void expect_gradient(const char* name, const Buffer& buf, const View& view, const std::vector<double>& ref,
                     const std::vector<double>& naive, int batch, int seqlen, int heads, int head_dim, DType dtype) {
  double err = 0, naive_err = 0;
  int64_t non_finite = 0, bad_guard = 0;
  std::vector<char> is_output(buf.host.size(), 0);
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < seqlen; ++s)
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < head_dim; ++d) {
          const int64_t at = view.at(b, s, h, d);
          is_output[size_t(at)] = 1;
          const size_t r = ((size_t(b) * seqlen + s) * heads + h) * head_dim + d;
          const float got = to_float(buf.host[size_t(at)], dtype);
          if (!std::isfinite(got)) ++non_finite;
          else err = std::max(err, std::abs(got - ref[r]));
          naive_err = std::max(naive_err, std::abs(naive[r] - ref[r]));
        }
  for (size_t at = 0; at < buf.host.size(); ++at)
    if (!is_output[at] && buf.host[at] != kPoison16) ++bad_guard;
  EXPECT_EQ(non_finite, 0) << name << ": non-finite elements (unwritten, or read from the padding)";
  EXPECT_EQ(bad_guard, 0) << name << ": guard elements were overwritten";
  EXPECT_LE(err, tolerance(naive_err, kGradAtol)) << name << ": naive low-precision error " << naive_err;
}

// Runs case c on the backward path `sm90` asks for (FLASHCUTE_BACKWARD_PATH) and checks it. On the
// sm90 path the workspace is the sm90 one, and a case that path cannot take is skipped.
// deterministic: the call asks for it, and four more runs must give the same bits.
void run_case(const Case& c, bool sm90, bool deterministic = false) {
  std::mt19937 rng(uint32_t(std::hash<std::string>{}(c.name())));
  const View qv = padded_view(c.seqlen_q, c.nheads, c.head_dim);
  const View kv = padded_view(c.seqlen_k, c.nheads_k, c.head_dim);
  Buffer q(c.batch * qv.batch_stride + kTail), k(c.batch * kv.batch_stride + kTail),
      v(c.batch * kv.batch_stride + kTail), dout(c.batch * qv.batch_stride + kTail),
      out(c.batch * qv.batch_stride + kTail);
  Buffer dq(c.batch * qv.batch_stride + kTail), dk(c.batch * kv.batch_stride + kTail),
      dv(c.batch * kv.batch_stride + kTail);
  fill(q, qv, c.batch, c.seqlen_q, c.nheads, c.head_dim, c.dtype, rng);
  fill(k, kv, c.batch, c.seqlen_k, c.nheads_k, c.head_dim, c.dtype, rng);
  fill(v, kv, c.batch, c.seqlen_k, c.nheads_k, c.head_dim, c.dtype, rng);
  fill(dout, qv, c.batch, c.seqlen_q, c.nheads, c.head_dim, c.dtype, rng);
  for (Buffer* b : {&q, &k, &v, &dout, &out, &dq, &dk, &dv}) ASSERT_CUDA(b->upload());
  const int64_t lse_elems = int64_t(c.batch) * c.nheads * c.seqlen_q;
  const int sm90_hd = flashcute::kernel_head_dim(c.head_dim, c.dtype, flashcute::Direction::kBwd, flashcute::Arch::kSm90);
  if (sm90 && sm90_hd == 0) GTEST_SKIP() << "no sm90 backward kernel for this head dim and dtype in this build";
  if (sm90 && !flashcute::device_is_sm90()) GTEST_SKIP() << "the sm90 backward needs a compute capability 9.0 GPU";
  const int64_t ws_elems = sm90 ? flashcute::sm90::bwd_workspace_floats(c.batch, c.nheads, c.seqlen_q, sm90_hd)
                                : flashcute::bwd_workspace_floats(c.batch, c.nheads, c.seqlen_q);
  float *lse = nullptr, *ws = nullptr;
  ASSERT_CUDA(cudaMalloc(&lse, size_t(std::max<int64_t>(lse_elems, 1)) * 4));
  std::unique_ptr<float, decltype(&cudaFree)> lse_owner(lse, &cudaFree);
  ASSERT_CUDA(cudaMalloc(&ws, size_t(std::max<int64_t>(ws_elems, 1)) * 4));
  std::unique_ptr<float, decltype(&cudaFree)> ws_owner(ws, &cudaFree);

  auto ref4 = [&](const Buffer& buf, const View& view, int s, int h) {
    return ref_of(buf, view, c.dtype, c.batch, s, h, c.head_dim);
  };
  auto mut4 = [&](Buffer& buf, const View& view, int s, int h) {
    return flashcute::mutable_tensor_ref(buf.dev, c.dtype, {c.batch, s, h, c.head_dim},
                                         {view.batch_stride, view.row_stride, view.head_stride, 1});
  };
  flashcute::FwdArgs fa;
  fa.q = ref4(q, qv, c.seqlen_q, c.nheads);
  fa.k = ref4(k, kv, c.seqlen_k, c.nheads_k);
  fa.v = ref4(v, kv, c.seqlen_k, c.nheads_k);
  fa.out = mut4(out, qv, c.seqlen_q, c.nheads);
  fa.lse = flashcute::mutable_tensor_ref(lse, DType::kFloat32, {c.batch, c.nheads, c.seqlen_q});
  fa.causal = c.causal;
  fa.window_left = c.window_left;
  fa.window_right = c.window_right;
  fa.softcap = c.softcap;
  flashcute::BwdArgs ba;
  ba.dout = ref4(dout, qv, c.seqlen_q, c.nheads);
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.out = fa.out;
  ba.lse = *fa.lse;
  ba.dq = mut4(dq, qv, c.seqlen_q, c.nheads);
  ba.dk = mut4(dk, kv, c.seqlen_k, c.nheads_k);
  ba.dv = mut4(dv, kv, c.seqlen_k, c.nheads_k);
  ba.workspace = flashcute::mutable_tensor_ref(ws, DType::kFloat32, {ws_elems});
  ba.causal = c.causal;
  ba.window_left = c.window_left;
  ba.window_right = c.window_right;
  ba.softcap = c.softcap;
  ba.deterministic = deterministic;

  if (sm90) {
    flashcute::BwdPlan plan;
    ASSERT_TRUE(flashcute::plan_bwd(ba, plan).ok());
    if (plan.sm90_kernel.arch != flashcute::Arch::kSm90) {
      const char* why = flashcute::sm90_bwd_can_run(plan.params);
      GTEST_SKIP() << "the sm90 backward cannot take this case: " << (why ? why : "?");
    }
  }
  setenv("FLASHCUTE_BACKWARD_PATH", sm90 ? "sm90" : "sm80", 1);
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreate(&stream));
  const flashcute::Status fst = flashcute::run_fwd(fa, stream);
  const flashcute::Status bst = fst.ok() ? flashcute::run_bwd(ba, stream) : fst;
  unsetenv("FLASHCUTE_BACKWARD_PATH");
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  ASSERT_CUDA(cudaStreamDestroy(stream));
  ASSERT_TRUE(bst.ok()) << bst.message;
  EXPECT_EQ(flashcute::last_backward_arch().load(), sm90 ? flashcute::Arch::kSm90 : flashcute::Arch::kSm80);
  for (Buffer* b : {&dq, &dk, &dv}) ASSERT_CUDA(b->download());
  if (deterministic) {
    const std::vector<uint16_t> first[3] = {dq.host, dk.host, dv.host};
    setenv("FLASHCUTE_BACKWARD_PATH", sm90 ? "sm90" : "sm80", 1);
    for (int run = 1; run < 5; ++run) {
      for (Buffer* b : {&dq, &dk, &dv}) ASSERT_CUDA(cudaMemset(b->dev, 0xff, b->host.size() * 2));
      ASSERT_TRUE(flashcute::run_bwd(ba, nullptr).ok());
      ASSERT_CUDA(cudaDeviceSynchronize());
      for (Buffer* b : {&dq, &dk, &dv}) ASSERT_CUDA(b->download());
      EXPECT_TRUE(dq.host == first[0] && dk.host == first[1] && dv.host == first[2]) << "run " << run << " differs";
    }
    unsetenv("FLASHCUTE_BACKWARD_PATH");
  }

  Problem p{c.batch, c.seqlen_q, c.seqlen_k, c.nheads, c.nheads_k, c.head_dim, c.causal,
            c.window_left, c.window_right, c.softcap, 1.f / std::sqrt(float(c.head_dim))};
  auto getter = [&](const Buffer& buf, const View& view) {
    return [&buf, view, &c](int b, int s, int h, int d) { return to_float(buf.host[size_t(view.at(b, s, h, d))], c.dtype); };
  };
  const Gradients ref = attention_grads(p, getter(q, qv), getter(k, kv), getter(v, kv), getter(dout, qv), nullptr);
  const Gradients naive = attention_grads(p, getter(q, qv), getter(k, kv), getter(v, kv), getter(dout, qv), &c.dtype);
  expect_gradient("dq", dq, qv, ref.dq, naive.dq, c.batch, c.seqlen_q, c.nheads, c.head_dim, c.dtype);
  expect_gradient("dk", dk, kv, ref.dk, naive.dk, c.batch, c.seqlen_k, c.nheads_k, c.head_dim, c.dtype);
  expect_gradient("dv", dv, kv, ref.dv, naive.dv, c.batch, c.seqlen_k, c.nheads_k, c.head_dim, c.dtype);
}

TEST_P(BwdGpu, MatchesTheReference) { run_case(GetParam(), false); }

// The same case on the Hopper backward (sm90/launch_bwd.hpp), where it can take it.
TEST_P(BwdGpu, Sm90MatchesTheReference) { run_case(GetParam(), true); }

// deterministic=true on the Hopper backward (its dQ adds in turn): correct, and five runs agree.
TEST_P(BwdGpu, Sm90DeterministicIsBitwise) { run_case(GetParam(), true, true); }

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    cases.push_back({dtype, 2, 17, 113, 4, 4, 64});
    cases.push_back({dtype, 2, 113, 17, 8, 2, 64, true});  // causal, sq > sk: rows without keys
    cases.push_back({dtype, 1, 130, 130, 4, 1, 128, true});
    Case window{dtype, 1, 200, 150, 4, 2, 72};  // 72 runs on the 96 kernel
    window.window_left = 30;
    window.window_right = 5;
    cases.push_back(window);
    Case softcap{dtype, 1, 65, 97, 2, 2, 256, true};
    softcap.softcap = 3.f;
    cases.push_back(softcap);
    cases.push_back({dtype, 1, 40, 70, 2, 2, 192});
    cases.push_back({dtype, 1, 33, 0, 2, 2, 64});   // no keys: dq = 0
    cases.push_back({dtype, 1, 0, 33, 2, 2, 64});   // no queries: dk = dv = 0
    // Shapes for the sm90 backward's tiles (64 or 128 queries x 128 keys a CTA): ragged blocks on both
    // sides, GQA, a query block across the causal diagonal, one query, several CTAs of keys.
    cases.push_back({dtype, 2, 300, 517, 8, 2, 128});
    cases.push_back({dtype, 1, 1000, 1000, 2, 2, 64, true});
    cases.push_back({dtype, 1, 1, 257, 4, 1, 128});
    cases.push_back({dtype, 3, 129, 64, 2, 1, 64, true});  // causal, sq > sk
    cases.push_back({dtype, 1, 64, 300, 2, 2, 40});        // 40 runs on the 64 kernels
    Case window2{dtype, 1, 333, 280, 2, 1, 128};
    window2.window_left = 100;
    window2.window_right = 20;
    cases.push_back(window2);
    // Rows that see one or two keys: D from the rounded O broke the rule here (common/dsum.hpp).
    Case few_keys{dtype, 2, 113, 2, 1, 1, 64, true};
    few_keys.window_left = 16;
    few_keys.window_right = 100;
    cases.push_back(few_keys);
    cases.push_back({dtype, 2, 3, 40, 2, 1, 128});
    Case softcap2{dtype, 1, 200, 230, 4, 2, 128, true};  // softcap on the sm90 backward's head dims
    softcap2.softcap = 10.f;
    cases.push_back(softcap2);
    Case softcap3{dtype, 2, 150, 150, 2, 2, 64};
    softcap3.softcap = 2.f;
    softcap3.window_left = 40;
    softcap3.window_right = 10;
    cases.push_back(softcap3);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, BwdGpu, testing::ValuesIn(make_cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name(); });

}  // namespace
