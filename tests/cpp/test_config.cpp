// Host-only tests of config.hpp and api.hpp: kernel config rules, head-dim dispatch
// and parameter checks. Needs no GPU and launches nothing.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "flashcute/api.hpp"

namespace {

using flashcute::DType;
using flashcute::FwdConfig;
using flashcute::FwdParams;
using flashcute::Status;
using flashcute::StatusCode;

int g_checks = 0;
int g_failures = 0;

#define CHECK(cond, ...)                                      \
  do {                                                        \
    ++g_checks;                                               \
    if (!(cond)) {                                            \
      ++g_failures;                                           \
      std::printf("%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                               \
      std::printf("\n");                                      \
    }                                                         \
  } while (0)

bool same(const char* a, const char* b) { return a && b ? std::strcmp(a, b) == 0 : a == b; }

// Expect `st` to carry `code`, and for errors, exactly `message`.
void expect_status(const char* what, Status st, StatusCode code, const char* message = nullptr) {
  CHECK(st.code == code, "%s: code %d, expected %d (message: \"%s\")", what, int(st.code), int(code), st.message);
  if (message) CHECK(same(st.message, message), "%s: message \"%s\", expected \"%s\"", what, st.message, message);
}

// ---------------------------------------------------------------------------------------
void test_default_configs() {
  for (int hd : flashcute::kKernelHeadDims) {
    const FwdConfig cfg = flashcute::default_fwd_config(hd);
    CHECK(cfg.head_dim == hd, "default_fwd_config(%d).head_dim == %d", hd, cfg.head_dim);
    const char* err = flashcute::validate(cfg);
    CHECK(err == nullptr, "default_fwd_config(%d) is invalid: %s", hd, err);
  }
}

void test_validate_rejects() {
  struct Bad {
    FwdConfig cfg;
    const char* message;
  };
  const Bad cases[] = {
      {{48, 128, 64, 4}, "head_dim must be a multiple of 32, at most 256"},
      {{288, 128, 64, 4}, "head_dim must be a multiple of 32, at most 256"},
      {{128, 128, 64, 2}, "num_warps must be 4 or 8"},
      {{128, 128, 64, 16}, "num_warps must be 4 or 8"},
      {{128, 96, 64, 4}, "block_m must be a multiple of 16 * num_warps (one m16 MMA row block per warp)"},
      {{128, 64, 64, 8}, "block_m must be a multiple of 16 * num_warps (one m16 MMA row block per warp)"},
      {{128, 128, 24, 4}, "block_n must be a multiple of 16, at least 32"},
      {{128, 128, 16, 4}, "block_n must be a multiple of 16, at least 32"},
      {{256, 256, 256, 8}, "tiles exceed the 227 KB shared-memory limit"},
      {{128, 128, 48, 8}, "block_n must be a multiple of the loader's rows per step"},
  };
  for (const Bad& bad : cases) {
    const char* err = flashcute::validate(bad.cfg);
    CHECK(same(err, bad.message), "validate({%d, %d, %d, %d}) gave \"%s\", expected \"%s\"", bad.cfg.head_dim,
          bad.cfg.block_m, bad.cfg.block_n, bad.cfg.num_warps, err ? err : "(valid)", bad.message);
  }
}

// ---------------------------------------------------------------------------------------
// The kernel head dims this build has, straight from the macros (not through api.hpp).
constexpr int kBuilt[] = {FLASHCUTE_ENABLE_HDIM32 ? 32 : 0,   FLASHCUTE_ENABLE_HDIM64 ? 64 : 0,
                          FLASHCUTE_ENABLE_HDIM96 ? 96 : 0,   FLASHCUTE_ENABLE_HDIM128 ? 128 : 0,
                          FLASHCUTE_ENABLE_HDIM192 ? 192 : 0, FLASHCUTE_ENABLE_HDIM256 ? 256 : 0};

void test_head_dim_mapping() {
  const int all[] = {32, 64, 96, 128, 192, 256};
  for (int i = 0; i < 6; ++i) {
    CHECK(flashcute::head_dim_compiled(all[i]) == (kBuilt[i] != 0), "head_dim_compiled(%d)", all[i]);
  }
  CHECK(!flashcute::head_dim_compiled(72), "72 is not a kernel head dim");
  CHECK(flashcute::dtype_compiled(DType::kFloat16) == bool(FLASHCUTE_ENABLE_FP16), "dtype_compiled(fp16)");
  CHECK(flashcute::dtype_compiled(DType::kBFloat16) == bool(FLASHCUTE_ENABLE_BF16), "dtype_compiled(bf16)");

  for (int d = 8; d <= 256; d += 8) {
    int any = 0, built = 0;
    for (int i = 5; i >= 0; --i) {
      if (d <= all[i]) any = all[i];
      if (kBuilt[i] != 0 && d <= kBuilt[i]) built = kBuilt[i];
    }
    CHECK(flashcute::kernel_head_dim_for(d) == any, "kernel_head_dim_for(%d) == %d, expected %d", d,
          flashcute::kernel_head_dim_for(d), any);
    CHECK(flashcute::dispatch_head_dim(d) == built, "dispatch_head_dim(%d) == %d, expected %d", d,
          flashcute::dispatch_head_dim(d), built);
  }
  CHECK(flashcute::kernel_head_dim_for(264) == 0, "kernel_head_dim_for(264)");
  CHECK(flashcute::dispatch_head_dim(264) == 0, "dispatch_head_dim(264)");
  // Exact boundaries.
  CHECK(flashcute::kernel_head_dim_for(32) == 32 && flashcute::kernel_head_dim_for(40) == 64, "32 / 40");
  CHECK(flashcute::kernel_head_dim_for(136) == 192 && flashcute::kernel_head_dim_for(200) == 256, "136 / 200");
}

// ---------------------------------------------------------------------------------------
// Never dereferenced: check_fwd_params only looks at alignment.
const void* fake_ptr(std::uintptr_t addr) { return reinterpret_cast<const void*>(addr); }

// A valid problem: contiguous (batch, seqlen, heads, head_dim) tensors, GQA 4:1.
FwdParams good_params(int head_dim = 128) {
  FwdParams p;
  p.batch = 2;
  p.seqlen_q = 100;
  p.seqlen_k = 120;
  p.nheads = 8;
  p.nheads_k = 2;
  p.head_dim = head_dim;
  p.q = fake_ptr(0x10000);
  p.k = fake_ptr(0x20000);
  p.v = fake_ptr(0x30000);
  p.o = const_cast<void*>(fake_ptr(0x40000));
  p.q_head_stride = p.o_head_stride = head_dim;
  p.q_row_stride = p.o_row_stride = int64_t(p.nheads) * head_dim;
  p.q_batch_stride = p.o_batch_stride = p.q_row_stride * p.seqlen_q;
  p.k_head_stride = p.v_head_stride = head_dim;
  p.k_row_stride = p.v_row_stride = int64_t(p.nheads_k) * head_dim;
  p.k_batch_stride = p.v_batch_stride = p.k_row_stride * p.seqlen_k;
  p.softmax_scale = 1.f / std::sqrt(float(head_dim));
  p.dtype = DType::kBFloat16;
  return p;
}

template <class Mutate>
void expect_invalid(const char* what, Mutate mutate, const char* message) {
  FwdParams p = good_params();
  mutate(p);
  expect_status(what, flashcute::check_fwd_params(p), StatusCode::kInvalidArgument, message);
}

void test_check_params_rejects() {
  const char* kSeq = "batch and seqlens must be >= 0";
  const char* kHeads = "nheads and nheads_k must be > 0";
  const char* kHeadDim = "head_dim must be a multiple of 8 in [8, 256]";
  const char* kAlign = "q, k, v and o must be 16-byte aligned";
  const char* kStride = "batch, row and head strides must be multiples of 8 elements (16 bytes)";
  expect_invalid("batch -1", [](FwdParams& p) { p.batch = -1; }, kSeq);
  expect_invalid("seqlen_q -1", [](FwdParams& p) { p.seqlen_q = -1; }, kSeq);
  expect_invalid("seqlen_k -1", [](FwdParams& p) { p.seqlen_k = -1; }, kSeq);
  expect_invalid("nheads 0", [](FwdParams& p) { p.nheads = 0; }, kHeads);
  expect_invalid("nheads_k 0", [](FwdParams& p) { p.nheads_k = 0; }, kHeads);
  expect_invalid("nheads 6 % nheads_k 4", [](FwdParams& p) { p.nheads = 6; p.nheads_k = 4; },
                 "nheads must be a multiple of nheads_k");
  expect_invalid("head_dim 0", [](FwdParams& p) { p.head_dim = 0; }, kHeadDim);
  expect_invalid("head_dim 12", [](FwdParams& p) { p.head_dim = 12; }, kHeadDim);
  expect_invalid("head_dim 264", [](FwdParams& p) { p.head_dim = 264; }, kHeadDim);
  expect_invalid("dtype 7", [](FwdParams& p) { p.dtype = static_cast<DType>(7); }, "dtype must be float16 or bfloat16");
  const char* kScale = "softmax_scale must be finite and > 0";
  expect_invalid("softmax_scale 0", [](FwdParams& p) { p.softmax_scale = 0.f; }, kScale);
  expect_invalid("softmax_scale -0.5", [](FwdParams& p) { p.softmax_scale = -0.5f; }, kScale);
  expect_invalid("softmax_scale NaN", [](FwdParams& p) { p.softmax_scale = std::nanf(""); }, kScale);
  expect_invalid("softmax_scale inf", [](FwdParams& p) { p.softmax_scale = INFINITY; }, kScale);
  expect_invalid("softcap -1", [](FwdParams& p) { p.softcap = -1.f; }, "softcap must be >= 0");
  expect_invalid("q null", [](FwdParams& p) { p.q = nullptr; }, "q, k, v and o must be non-null");
  expect_invalid("o null", [](FwdParams& p) { p.o = nullptr; }, "q, k, v and o must be non-null");
  expect_invalid("q misaligned", [](FwdParams& p) { p.q = fake_ptr(0x10008); }, kAlign);
  expect_invalid("k misaligned", [](FwdParams& p) { p.k = fake_ptr(0x20002); }, kAlign);
  expect_invalid("v misaligned", [](FwdParams& p) { p.v = fake_ptr(0x30004); }, kAlign);
  expect_invalid("o misaligned", [](FwdParams& p) { p.o = const_cast<void*>(fake_ptr(0x40008)); }, kAlign);
  expect_invalid("q row stride 1028", [](FwdParams& p) { p.q_row_stride = 1028; }, kStride);
  expect_invalid("k batch stride +4", [](FwdParams& p) { p.k_batch_stride += 4; }, kStride);
  expect_invalid("v head stride 132", [](FwdParams& p) { p.v_head_stride = 132; }, kStride);
  expect_invalid("o head stride 129", [](FwdParams& p) { p.o_head_stride = 129; }, kStride);
}

void test_check_params_accepts() {
  expect_status("good", flashcute::check_fwd_params(good_params()), StatusCode::kSuccess);
  for (int d : {8, 72, 136, 256}) {
    expect_status("head dims", flashcute::check_fwd_params(good_params(d)), StatusCode::kSuccess);
  }
  FwdParams p = good_params();
  p.nheads_k = 1;  // MQA
  expect_status("MQA", flashcute::check_fwd_params(p), StatusCode::kSuccess);
  p = good_params();
  p.dtype = DType::kFloat16;
  p.causal = true;
  p.window_left = 64;
  p.softcap = 30.f;
  expect_status("fp16 causal window softcap", flashcute::check_fwd_params(p), StatusCode::kSuccess);
  // q, k, v as views into one packed (batch, seqlen, 3, heads, head_dim) tensor.
  p = good_params(64);
  p.nheads_k = p.nheads;
  p.seqlen_k = p.seqlen_q;
  p.k = fake_ptr(0x10000 + 2 * 8 * 64);
  p.v = fake_ptr(0x10000 + 2 * 2 * 8 * 64);
  p.q_row_stride = p.k_row_stride = p.v_row_stride = 3 * 8 * 64;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.q_row_stride * p.seqlen_q;
  expect_status("packed qkv", flashcute::check_fwd_params(p), StatusCode::kSuccess);
  p = good_params();
  p.seqlen_k = 0;  // no keys: valid, o = 0 and lse = -inf
  expect_status("seqlen_k 0", flashcute::check_fwd_params(p), StatusCode::kSuccess);
}

// ---------------------------------------------------------------------------------------
// run_fwd must return before touching CUDA: the stream is garbage and every pointer is
// null, so any launch or runtime call would fail or crash.
cudaStream_t bogus_stream() { return reinterpret_cast<cudaStream_t>(std::uintptr_t{0xdead0}); }

void test_run_fwd_without_cuda() {
  FwdParams p = good_params();
  p.q = p.k = p.v = nullptr;
  p.o = nullptr;
  p.batch = 0;
  expect_status("run_fwd batch 0", flashcute::run_fwd(p, bogus_stream()), StatusCode::kSuccess);
  p.batch = 2;
  p.seqlen_q = 0;
  expect_status("run_fwd seqlen_q 0", flashcute::run_fwd(p, bogus_stream()), StatusCode::kSuccess);

  p = good_params();
  p.head_dim = 12;
  expect_status("run_fwd invalid", flashcute::run_fwd(p, bogus_stream()), StatusCode::kInvalidArgument);

  // What this build left out is reported, not launched.
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    if (flashcute::dtype_compiled(dtype)) continue;
    p = good_params();
    p.dtype = dtype;
    expect_status("run_fwd dtype not compiled", flashcute::run_fwd(p, bogus_stream()), StatusCode::kNotCompiled);
  }
  for (int d = 8; d <= 256; d += 8) {
    if (flashcute::dispatch_head_dim(d) != 0) continue;
    p = good_params(d);
    p.dtype = flashcute::dtype_compiled(DType::kBFloat16) ? DType::kBFloat16 : DType::kFloat16;
    expect_status("run_fwd head dim not compiled", flashcute::run_fwd(p, bogus_stream()), StatusCode::kNotCompiled);
  }
}

}  // namespace

int main() {
  test_default_configs();
  test_validate_rejects();
  test_head_dim_mapping();
  test_check_params_rejects();
  test_check_params_accepts();
  test_run_fwd_without_cuda();
  std::printf("test_config: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
