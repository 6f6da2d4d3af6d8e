// Host-only tests of plan_fwd and run_fwd: fixed-length and variable-length calls.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "flashcute/host/api.hpp"
#include "host_util.hpp"

namespace {

using namespace fctest;  // NOLINT: the test helpers

// ---------------------------------------------------------------------------------------- plan_fwd

// good_args() with q, k, v as views of one packed (batch, seqlen, 3, heads, d) array, no lse.
FwdArgs packed_qkv_args() {
  const int d = built_head_dim();
  const DType dt = built_dtype();
  FwdArgs a = good_args();
  const int64_t row = 3 * 8 * d;
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {2, 100, 8, d}, {100 * row, row, d, 1});
  a.k = flashcute::tensor_ref(fake(0x100000 + 2 * 8 * d), dt, {2, 100, 8, d}, {100 * row, row, d, 1});
  a.v = flashcute::tensor_ref(fake(0x100000 + 2 * 16 * d), dt, {2, 100, 8, d}, {100 * row, row, d, 1});
  a.lse.reset();
  return a;
}

TEST(PlanFwd, AcceptsAValidCall) {
  FwdPlan p;
  ASSERT_TRUE(plan(good_args(), &p).ok()) << plan(good_args()).message;
  EXPECT_FALSE(p.empty);
  EXPECT_EQ(p.kernel.head_dim, built_head_dim());
  EXPECT_EQ(p.kernel.dtype, built_dtype());
  const int d = built_head_dim();
  EXPECT_EQ(p.params.q_row_stride, 8 * d);
  EXPECT_EQ(p.params.q_batch_stride, 100 * 8 * d);
  EXPECT_EQ(p.params.k_head_stride, d);
  EXPECT_EQ(p.params.lse_batch_stride, 800);
  EXPECT_EQ(p.params.lse_head_stride, 100);
  EXPECT_EQ(p.params.nheads, 8);
  EXPECT_EQ(p.params.nheads_k, 2);
  EXPECT_FLOAT_EQ(p.params.softmax_scale, float(1.0 / std::sqrt(double(d))));
  EXPECT_EQ(p.params.window_left, -1);
  EXPECT_EQ(p.params.window_right, -1);
}

TEST(PlanFwd, NormalisesTheMask) {
  FwdArgs a = good_args();  // seqlen_q 100, seqlen_k 120
  a.causal = true;
  FwdPlan p;
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.window_right, 0);
  a = good_args();
  a.window_left = 120;            // >= seqlen_k: every key is in reach on the left
  a.window_right = 1LL << 40;     // beyond int: unbounded
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.window_left, -1);
  EXPECT_EQ(p.params.window_right, -1);
  a.window_left = 5;
  a.window_right = 98;  // < seqlen_q - 1: kept
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.window_left, 5);
  EXPECT_EQ(p.params.window_right, 98);
}

TEST(PlanFwd, StridedViewsAndSizeOneDims) {
  const int d = built_head_dim();
  const DType dt = built_dtype();
  FwdArgs a = packed_qkv_args();
  const int64_t row = 3 * 8 * d;
  FwdPlan p;
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_EQ(p.params.k_row_stride, row);
  EXPECT_EQ(p.params.lse, nullptr);
  // A stride that only ever multiplies index 0 is ignored (and zeroed): batch 1, seqlen 1, 1 head.
  a = good_args();
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {1, 1, 1, d}, {3, 5, 7, 1});
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {1, 1, 1, d}, {3, 5, 7, 1});
  a.v = a.k;
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {1, 1, 1, d}, {13, 11, 9, 1});
  a.lse.reset();
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_EQ(p.params.q_batch_stride, 0);
  EXPECT_EQ(p.params.o_row_stride, 0);
}

// Which calls the sm90 (TMA) kernels may take: plan.sm90 is set only where this build has one and
// TMA can read the arrays; launch() then uses it on a compute capability 9.0 device.
TEST(PlanFwd, Sm90TakesWhatTmaCanRead) {
  const int d = built_head_dim();
  const DType dt = built_dtype();
  bool sm90_built = false;
  for (const flashcute::KernelKey& key : flashcute::kCompiledKernels)
    sm90_built = sm90_built || (key.arch == flashcute::Arch::kSm90 && key.dtype == dt && key.head_dim == d);
  FwdPlan p;
  ASSERT_TRUE(plan(good_args(), &p).ok());
  EXPECT_EQ(p.kernel.arch, flashcute::Arch::kSm80);  // the plan names the portable kernel
  EXPECT_EQ(flashcute::sm90_can_run(p.params), nullptr);
  EXPECT_EQ(p.sm90, sm90_built);
  // The packed-qkv views: strides 3 * heads * d, multiples of 16 bytes.
  FwdArgs a = packed_qkv_args();
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(flashcute::sm90_can_run(p.params), nullptr);
  // k broadcast over the batch (batch stride 0, as .expand makes it): TMA needs a real stride, so
  // the sm80 kernel runs it.
  a = good_args();
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {2, 120, 2, d}, {0, 2 * d, d, 1});
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_STREQ(flashcute::sm90_can_run(p.params), "k: a broadcast (0) stride or one of 2^38 elements or more");
  EXPECT_FALSE(p.sm90);
  // The same for v's heads.
  a = good_args();
  a.v = flashcute::tensor_ref(fake(0x300000), dt, {2, 120, 2, d}, {120 * d, d, 0, 1});
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_STREQ(flashcute::sm90_can_run(p.params), "v: a broadcast (0) stride or one of 2^38 elements or more");
  EXPECT_FALSE(p.sm90);
  // Strides plan_fwd would refuse (not multiples of 8 elements) are refused here too, for params
  // made by hand.
  flashcute::FwdParams odd = p.params;
  odd.q_row_stride = 8 * d + 4;
  EXPECT_STREQ(flashcute::sm90_can_run(odd), "q: a stride that is not a multiple of 16 bytes");
  // Size-one dims (stride zeroed by the plan) are fine.
  a = good_args();
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {1, 1, 8, d});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {1, 1, 8, d});
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {1, 120, 2, d});
  a.v = flashcute::tensor_ref(fake(0x300000), dt, {1, 120, 2, d});
  a.lse.reset();
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_EQ(flashcute::sm90_can_run(p.params), nullptr);
  // No keys: the sm80 kernel writes the zeros.
  flashcute::FwdParams none = p.params;
  none.seqlen_k = 0;
  EXPECT_STREQ(flashcute::sm90_can_run(none), "no keys");
}

TEST(PlanFwd, EmptyProblems) {
  FwdArgs a = good_args();
  const int d = built_head_dim();
  // No keys: valid, and k/v may be null.
  a.k = flashcute::tensor_ref(nullptr, built_dtype(), {2, 0, 2, d});
  a.v = a.k;
  FwdPlan p;
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_FALSE(p.empty);
  EXPECT_EQ(p.params.seqlen_k, 0);
  // No queries: nothing to launch, null pointers fine.
  a = good_args();
  a.q = flashcute::tensor_ref(nullptr, built_dtype(), {2, 0, 8, d});
  a.out = flashcute::mutable_tensor_ref(nullptr, built_dtype(), {2, 0, 8, d});
  a.lse = flashcute::mutable_tensor_ref(nullptr, DType::kFloat32, {2, 8, 0});
  ASSERT_TRUE(plan(a, &p).ok()) << plan(a).message;
  EXPECT_TRUE(p.empty);
}

TEST(PlanFwd, RejectsRanksAndDtypes) {
  FwdArgs a = good_args();
  a.q.rank = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "q: expected 4 dims (batch, seqlen_q, nheads, headdim), got 3");
  a = good_args();
  a.out.rank = 5;
  expect_error(plan(a), StatusCode::kInvalidArgument, "out", "out: expected 4 dims");
  a = good_args();
  a.q.dtype = a.k.dtype = a.v.dtype = a.out.dtype = DType::kOther;
  a.q.dtype_label = "int8";
  expect_error(plan(a), StatusCode::kInvalidType, "q", "q: expected a float16 or bfloat16 array, got int8");
  a = good_args();
  a.v.dtype = DType::kFloat32;
  expect_error(plan(a), StatusCode::kInvalidType, "v",
               std::string("v: expected ") + flashcute::dtype_name(built_dtype()) + " like q, got float32");
  a = good_args();
  a.lse->dtype = built_dtype();
  expect_error(plan(a), StatusCode::kInvalidType, "lse", "lse: expected float32 (batch, nheads, seqlen_q) = (2, 8, 100)");
}

TEST(PlanFwd, RejectsShapes) {
  const int d = built_head_dim();
  const DType dt = built_dtype();
  FwdArgs a = good_args();
  a.k.shape[0] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "k: batch 3 does not match q's batch 2");
  a = good_args();
  a.v.shape[1] = 7;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v", "seqlen_k differs: 7 vs 120");
  a = good_args();
  a.k.shape[2] = a.v.shape[2] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "nheads (8) must be a multiple of nheads_k (3)");
  a = good_args();
  a.q.shape[3] = a.k.shape[3] = a.v.shape[3] = a.out.shape[3] = 12;
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "headdim must be a multiple of 8 and <= 256, got 12");
  a = good_args();
  a.out.shape[1] = 99;
  expect_error(plan(a), StatusCode::kInvalidArgument, "out", "out: expected shape (2, 100, 8, ");
  a = good_args();
  a.lse->shape[2] = 99;
  expect_error(plan(a), StatusCode::kInvalidArgument, "lse", "got shape (2, 8, 99)");
  // The launch grid takes at most 65535 heads and batch entries.
  a = good_args();
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {70000, 1, 8, d});
  a.k = a.v = flashcute::tensor_ref(fake(0x200000), dt, {70000, 1, 2, d});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {70000, 1, 8, d});
  a.lse.reset();
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "q: batch 70000 exceeds 65535");
  a = good_args();
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {1, 1, 1LL << 31, d});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {1, 1, 1LL << 31, d});
  a.k = a.v = flashcute::tensor_ref(fake(0x200000), dt, {1, 1, 1, d});
  a.lse.reset();
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "nheads 2147483648 exceeds the supported maximum");
}

TEST(PlanFwd, RejectsStridesAndPointers) {
  const int d = built_head_dim();
  const DType dt = built_dtype();
  FwdArgs a = good_args();
  a.k.stride[3] = 2;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "k: the last dim must be contiguous (stride 1), got stride 2");
  a = good_args();
  a.v.stride[1] += 4;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v",
               "v: the row (seqlen) stride must be a multiple of 8 elements (16 bytes)");
  a = good_args();
  a.q.stride[0] = -a.q.stride[0];
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "q: negative strides are not supported");
  a = good_args();
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {2, 100, 8, d}, {100 * d, d, 0, 1});
  expect_error(plan(a), StatusCode::kInvalidArgument, "out", "make distinct elements overlap");
  a = good_args();
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x500000), DType::kFloat32, {2, 8, 100}, {1600, 200, 2});
  expect_error(plan(a), StatusCode::kInvalidArgument, "lse", "contiguous in seqlen_q (stride 1)");
  a = good_args();
  a.k.data = fake(0x200008);
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "k: the data pointer must be 16-byte aligned");
  a = good_args();
  a.v.data = nullptr;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v", "v: the data pointer is null");
  a = good_args();
  a.lse->data = fake(0x500002);
  expect_error(plan(a), StatusCode::kInvalidArgument, "lse", "lse: the data pointer must be 4-byte aligned");
}

TEST(PlanFwd, RejectsScalars) {
  for (double scale : {0.0, -1.0, double(NAN), double(INFINITY), 1e300, 1e-60}) {
    FwdArgs a = good_args();
    a.softmax_scale = scale;
    expect_error(plan(a), StatusCode::kInvalidArgument, "softmax_scale", "softmax_scale must be a finite number > 0");
  }
  for (double cap : {-1.0, double(NAN), double(INFINITY)}) {
    FwdArgs a = good_args();
    a.softcap = cap;
    expect_error(plan(a), StatusCode::kInvalidArgument, "softcap", "softcap must be a finite number >= 0");
  }
  FwdArgs a = good_args();
  a.window_left = -2;
  expect_error(plan(a), StatusCode::kInvalidArgument, "window_left", "window_left must be >= -1 (-1: unbounded), got -2");
  a = good_args();
  a.window_right = -3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "window_right", "window_right must be >= -1");
}

// The options alone follow the same rules (the Python API asks them first), and the backward
// takes the forward's options as they are: one AttnOptions in both.
TEST(PlanFwd, OptionsAreOneStructWithOneSetOfRules) {
  flashcute::AttnOptions o;
  EXPECT_TRUE(flashcute::detail::check_options(o).ok());
  o.window_left = -2;
  expect_error(flashcute::detail::check_options(o), StatusCode::kInvalidArgument, "window_left",
               "window_left must be >= -1 (-1: unbounded), got -2");
  o = {};
  o.softmax_scale = 1e300;  // finite as a double, not as the kernels' float
  expect_error(flashcute::detail::check_options(o), StatusCode::kInvalidArgument, "softmax_scale",
               "softmax_scale must be a finite number > 0");
  expect_error(flashcute::detail::check_num_splits(129), StatusCode::kInvalidArgument, "num_splits",
               "num_splits: expected 0 (automatic) to 128, got 129");
  expect_error(flashcute::detail::check_max_seqlens(0, -1), StatusCode::kInvalidArgument, "max_seqlen_k",
               "max_seqlen_k must be >= 0");

  flashcute::BwdArgs b;
  b.options() = good_args().options();
  b.softcap = -1.0;  // the forward's rules, checked by plan_fwd for the backward
  flashcute::FwdArgs f = good_args();
  f.options() = b.options();
  expect_error(plan(f), StatusCode::kInvalidArgument, "softcap", "softcap must be a finite number >= 0");
}

TEST(PlanFwd, ReportsWhatTheBuildLeftOut) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    if (flashcute::dtype_compiled(dt)) continue;
    FwdArgs a = good_args();
    a.q.dtype = a.k.dtype = a.v.dtype = a.out.dtype = dt;
    const Status st = plan(a);
    EXPECT_EQ(st.code, StatusCode::kNotCompiled);
    EXPECT_NE(st.message.find("FLASHCUTE_DTYPES"), std::string::npos) << st.message;
  }
  for (int d = 8; d <= 256; d += 8) {
    if (flashcute::kernel_head_dim(d, built_dtype()) != 0) continue;
    const Status st = plan(good_args(d));
    EXPECT_EQ(st.code, StatusCode::kNotCompiled) << d;
    EXPECT_NE(st.message.find("head dim " + std::to_string(d)), std::string::npos) << st.message;
    EXPECT_NE(st.message.find("FLASHCUTE_HEAD_DIMS"), std::string::npos) << st.message;
  }
}

TEST(RunFwd, ValidatesBeforeTouchingCuda) {
  FwdArgs a = good_args();
  a.q.shape[0] = a.k.shape[0] = a.v.shape[0] = a.out.shape[0] = a.lse->shape[0] = 0;
  EXPECT_TRUE(flashcute::run_fwd(a, bogus_stream()).ok());
  a = good_args();
  a.softcap = -1.0;
  EXPECT_EQ(flashcute::run_fwd(a, bogus_stream()).code, StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------- varlen

// A valid variable-length call: three sequences packed into 100 query rows and 120 key rows.
FwdArgs good_varlen_args() {
  const DType dt = built_dtype();
  const int d = built_head_dim();
  FwdArgs a;
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {100, 8, d});
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {120, 2, d});
  a.v = flashcute::tensor_ref(fake(0x300000), dt, {120, 2, d});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), dt, {100, 8, d});
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x500000), DType::kFloat32, {8, 100});
  a.varlen = flashcute::VarlenArgs{flashcute::tensor_ref(fake(0xb00000), DType::kInt32, {4}),
                                   flashcute::tensor_ref(fake(0xc00000), DType::kInt32, {4}), 60, 70};
  return a;
}

TEST(PlanFwdVarlen, PlansTheSequencesOnTheDevice) {
  FwdPlan p;
  ASSERT_TRUE(plan(good_varlen_args(), &p).ok());
  const flashcute::FwdParams& q = p.params;
  EXPECT_EQ(q.batch, 3);
  EXPECT_EQ(q.seqlen_q, 60);  // the longest sequences size the grid
  EXPECT_EQ(q.seqlen_k, 70);
  EXPECT_EQ(q.total_q, 100);
  EXPECT_EQ(q.total_k, 120);
  EXPECT_EQ(q.cu_seqlens_q, static_cast<const int*>(fake(0xb00000)));
  EXPECT_EQ(q.cu_seqlens_k, static_cast<const int*>(fake(0xc00000)));
  EXPECT_EQ(q.q_batch_stride, 0);
  EXPECT_EQ(q.q_row_stride, 8 * built_head_dim());
  EXPECT_EQ(q.lse_head_stride, 100);  // lse (nheads, total_q)
  EXPECT_FALSE(p.empty);
  // The sm90 kernels take varlen batches too (their varlen twin, sm90::launch_fwd_varlen).
  bool sm90_built = false;
  for (const flashcute::KernelKey& key : flashcute::kCompiledKernels)
    sm90_built = sm90_built || (key.arch == flashcute::Arch::kSm90 && key.direction == flashcute::Direction::kFwd &&
                                key.dtype == built_dtype() && key.head_dim == built_head_dim());
  EXPECT_EQ(flashcute::sm90_can_run(q), nullptr);
  EXPECT_EQ(p.sm90, sm90_built);
  // ... unless there is nothing to read.
  flashcute::FwdParams none = q;
  none.total_k = 0;
  EXPECT_STREQ(flashcute::sm90_can_run(none), "no keys");
  none = q;
  none.total_q = 0;
  EXPECT_STREQ(flashcute::sm90_can_run(none), "no queries");
  // Window bounds are normalised against the packed totals, which bound every sequence.
  FwdArgs a = good_varlen_args();
  a.window_left = 119;
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.window_left, 119);
  a.window_left = 120;
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.window_left, -1);
  a = good_varlen_args();
  a.varlen->max_seqlen_q = 0;
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_TRUE(p.empty);
}

TEST(PlanFwdVarlen, RejectsEachArgumentByName) {
  FwdArgs a = good_varlen_args();
  a.varlen->cu_seqlens_q.dtype = DType::kFloat32;
  expect_error(plan(a), StatusCode::kInvalidType, "cu_seqlens_q", "int32 (batch + 1,)");
  a = good_varlen_args();
  a.varlen->cu_seqlens_k.shape[0] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "cu_seqlens_k", "does not match cu_seqlens_q's (4,)");
  a = good_varlen_args();
  a.varlen->cu_seqlens_q.stride[0] = 2;
  expect_error(plan(a), StatusCode::kInvalidArgument, "cu_seqlens_q", "contiguous");
  a = good_varlen_args();
  a.varlen->max_seqlen_k = -1;
  expect_error(plan(a), StatusCode::kInvalidArgument, "max_seqlen_k", ">= 0");
  a = good_varlen_args();
  a.q = good_args().q;  // 4 dims
  expect_error(plan(a), StatusCode::kInvalidArgument, "q", "(total_q, nheads, headdim)");
  a = good_varlen_args();
  a.v.shape[0] = 119;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v", "like k");
  a = good_varlen_args();
  a.lse->shape[1] = 99;
  expect_error(plan(a), StatusCode::kInvalidArgument, "lse", "float32 (nheads, total_q) = (8, 100)");
  a = good_varlen_args();
  a.k.stride[0] = 2 * built_head_dim() + 1;  // a row stride that is not 16-byte vectors: the fixed-length rules
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "multiple of 8");
}

}  // namespace
