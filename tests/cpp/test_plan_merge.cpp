// Host-only tests of plan_merge and run_merge.
#include <gtest/gtest.h>

#include "flashcute/host/api.hpp"
#include "host_util.hpp"

namespace {

using namespace fctest;  // NOLINT: the test helpers

// ---------------------------------------------------------------------------------------- merge

flashcute::MergeArgs good_merge_args() {
  flashcute::MergeArgs a;
  a.out_a = flashcute::tensor_ref(fake(0x100000), DType::kBFloat16, {2, 30, 4, 64});
  a.lse_a = flashcute::tensor_ref(fake(0x200000), DType::kFloat32, {2, 4, 30});
  a.out_b = flashcute::tensor_ref(fake(0x300000), DType::kBFloat16, {2, 30, 4, 64});
  a.lse_b = flashcute::tensor_ref(fake(0x400000), DType::kFloat32, {2, 4, 30});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x500000), DType::kBFloat16, {2, 30, 4, 64});
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x600000), DType::kFloat32, {2, 4, 30});
  return a;
}

TEST(PlanMerge, AcceptsFixedAndVarlenShapes) {
  flashcute::MergePlan p;
  ASSERT_TRUE(flashcute::plan_merge(good_merge_args(), p).ok());
  EXPECT_EQ(p.params.batch, 2);
  EXPECT_EQ(p.params.seqlen, 30);
  EXPECT_EQ(p.params.a_stride[1], 4 * 64);   // (batch, row, head) of out_a
  EXPECT_EQ(p.params.lse_stride[1], 30);     // (batch, head, row) of lse
  flashcute::MergeArgs a;
  a.out_a = flashcute::tensor_ref(fake(0x100000), DType::kFloat32, {50, 4, 64});
  a.lse_a = flashcute::tensor_ref(fake(0x200000), DType::kFloat32, {4, 50});
  a.out_b = a.out_a;
  a.lse_b = a.lse_a;
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x100000), DType::kFloat32, {50, 4, 64});  // in place
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x200000), DType::kFloat32, {4, 50});
  ASSERT_TRUE(flashcute::plan_merge(a, p).ok());
  EXPECT_EQ(p.params.batch, 1);
  EXPECT_EQ(p.params.seqlen, 50);
  EXPECT_EQ(p.params.lse_stride[1], 50);
}

TEST(PlanMerge, RejectsEachArgumentByName) {
  flashcute::MergePlan p;
  flashcute::MergeArgs a = good_merge_args();
  a.out_b.shape[3] = 32;
  expect_error(flashcute::plan_merge(a, p), StatusCode::kInvalidArgument, "out_b", "like out_a");
  a = good_merge_args();
  a.out.dtype = DType::kFloat16;
  expect_error(flashcute::plan_merge(a, p), StatusCode::kInvalidType, "out", "bfloat16 like out_a");
  a = good_merge_args();
  a.lse_b.shape[2] = 29;
  expect_error(flashcute::plan_merge(a, p), StatusCode::kInvalidArgument, "lse_b", "(batch, nheads, seqlen) = (2, 4, 30)");
  a = good_merge_args();
  a.out_a.dtype = DType::kInt32;
  expect_error(flashcute::plan_merge(a, p), StatusCode::kInvalidType, "out_a", "float16, bfloat16 or float32");
  a = good_merge_args();
  a.out_a.stride[3] = 2;
  expect_error(flashcute::plan_merge(a, p), StatusCode::kInvalidArgument, "out_a", "contiguous");
  EXPECT_EQ(flashcute::run_merge(a, bogus_stream()).code, StatusCode::kInvalidArgument);  // before any CUDA call
}

}  // namespace
