// Host-only tests of plan_bwd and run_bwd.
#include <gtest/gtest.h>

#include "flashcute/host/api.hpp"
#include "host_util.hpp"

namespace {

using namespace fctest;  // NOLINT: the test helpers

// ---------------------------------------------------------------------------------------- plan_bwd

// A valid backward call of good_args()' shapes.
flashcute::BwdArgs good_bwd_args() {
  const FwdArgs f = good_args();
  flashcute::BwdArgs a;
  a.dout = flashcute::tensor_ref(fake(0x600000), f.q.dtype, {2, 100, 8, f.q.shape[3]});
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.out = f.out;
  a.lse = *f.lse;
  a.dq = flashcute::mutable_tensor_ref(fake_mut(0x700000), f.q.dtype, {2, 100, 8, f.q.shape[3]});
  a.dk = flashcute::mutable_tensor_ref(fake_mut(0x800000), f.q.dtype, {2, 120, 2, f.q.shape[3]});
  a.dv = flashcute::mutable_tensor_ref(fake_mut(0x900000), f.q.dtype, {2, 120, 2, f.q.shape[3]});
  a.workspace = flashcute::mutable_tensor_ref(fake_mut(0xa00000), DType::kFloat32,
                                              {flashcute::bwd_workspace_floats(2, 8, 100)});
  return a;
}

TEST(PlanBwd, AcceptsAValidCall) {
  flashcute::BwdPlan p;
  const Status st = flashcute::plan_bwd(good_bwd_args(), p);
  const bool built = flashcute::kernel_head_dim(built_head_dim(), built_dtype(), flashcute::Direction::kBwd) != 0;
  if (!built) {  // a build with FLASHCUTE_BACKWARD=OFF says so
    EXPECT_EQ(st.code, StatusCode::kNotCompiled) << st.message;
    return;
  }
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(p.kernel.direction, flashcute::Direction::kBwd);
  EXPECT_FALSE(p.empty);
  EXPECT_EQ(p.params.dq, fake_mut(0x700000));
  EXPECT_EQ(p.params.do_row_stride, 8 * built_head_dim());
  EXPECT_EQ(p.params.dk_row_stride, 2 * built_head_dim());
}

TEST(PlanBwd, RejectsEachNewArgumentByName) {
  flashcute::BwdPlan p;
  flashcute::BwdArgs a = good_bwd_args();
  a.dout.shape[1] = 99;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidArgument, "dout", "like q");
  a = good_bwd_args();
  a.dk.shape[2] = 4;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidArgument, "dk", "like k");
  a = good_bwd_args();
  a.dv.dtype = DType::kFloat32;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidType, "dv", "like v");
  a = good_bwd_args();
  a.dq.stride[3] = 2;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidArgument, "dq", "contiguous");
  a = good_bwd_args();
  a.workspace.shape[0] -= 1;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidArgument, "workspace", "at least 1600");
  a = good_bwd_args();
  a.lse.shape[2] = 7;
  expect_error(flashcute::plan_bwd(a, p), StatusCode::kInvalidArgument, "lse", "float32 (batch, nheads, seqlen_q)");
}

TEST(RunBwd, ValidatesBeforeTouchingCuda) {
  flashcute::BwdArgs a = good_bwd_args();
  a.softcap = -1.0;
  EXPECT_EQ(flashcute::run_bwd(a, bogus_stream()).code, StatusCode::kInvalidArgument);
}

}  // namespace
