// Host-only tests of plan_bwd and run_bwd.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

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

// ------------------------------------------------------------------------- the sm90 backward's plan

TEST(PlanBwd, Sm90WorkspaceIsPaddedRowsTimesHeadDimPlusTwo) {
  EXPECT_EQ(flashcute::sm90::bwd_padded_rows(1), 128);
  EXPECT_EQ(flashcute::sm90::bwd_padded_rows(128), 128);
  EXPECT_EQ(flashcute::sm90::bwd_padded_rows(129), 256);
  // Whole query blocks of every config in the tile table.
  for (int hd : {64, 128, 192, 256}) {
    ASSERT_TRUE(flashcute::sm90::has_bwd_config(hd)) << hd;
    EXPECT_EQ(flashcute::sm90::bwd_padded_rows(1) % flashcute::sm90::default_bwd_config(hd).block_m, 0) << hd;
  }
  // + add counts + the tile counter
  EXPECT_EQ(flashcute::sm90::bwd_workspace_floats(2, 8, 100, 128), 2 * 8 * 128 * 130 + 2 * 8 * 2 + 1);
  EXPECT_EQ(flashcute::sm90::bwd_workspace_floats(0, 8, 100, 64), 0);
}

// plan_bwd names the sm90 kernel where the build has one for the call's dtype and head dim, the
// workspace is the sm90 size and sm90_bwd_can_run; the sm80 kernel stays the plan's kernel.
TEST(PlanBwd, NamesTheSm90KernelWhereItCanRun) {
  const int hd = flashcute::kernel_head_dim(built_head_dim(), built_dtype(), flashcute::Direction::kBwd,
                                            flashcute::Arch::kSm90);
  flashcute::BwdArgs a = good_bwd_args();
  a.workspace.shape[0] = flashcute::sm90::bwd_workspace_floats(2, 8, 100, 128);
  flashcute::BwdPlan p;
  const Status st = flashcute::plan_bwd(a, p);
  if (flashcute::kernel_head_dim(built_head_dim(), built_dtype(), flashcute::Direction::kBwd) == 0) {
    EXPECT_EQ(st.code, StatusCode::kNotCompiled) << st.message;  // FLASHCUTE_BACKWARD=OFF
    return;
  }
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(p.kernel.arch, flashcute::Arch::kSm80);
  if (hd == 0) {  // no sm90 backward for this head dim, or a build without 90a
    EXPECT_EQ(p.sm90_kernel.arch, flashcute::Arch::kSm80);
    return;
  }
  EXPECT_EQ(p.sm90_kernel.arch, flashcute::Arch::kSm90);
  EXPECT_EQ(p.sm90_kernel.direction, flashcute::Direction::kBwd);
  EXPECT_EQ(p.sm90_kernel.head_dim, hd);
  // The sm80 workspace is too small for it.
  a.workspace.shape[0] = flashcute::bwd_workspace_floats(2, 8, 100);
  ASSERT_TRUE(flashcute::plan_bwd(a, p).ok());
  EXPECT_EQ(p.sm90_kernel.arch, flashcute::Arch::kSm80);
  a = good_bwd_args();
  a.workspace.shape[0] = flashcute::sm90::bwd_workspace_floats(2, 8, 100, 128);
  a.softcap = 5.f;
  ASSERT_TRUE(flashcute::plan_bwd(a, p).ok());
  EXPECT_EQ(p.sm90_kernel.arch, flashcute::Arch::kSm90);
  // Deterministic calls take it too (its dQ adds then go in turn), and say so in the params.
  a.softcap = 0.f;
  a.deterministic = true;
  ASSERT_TRUE(flashcute::plan_bwd(a, p).ok());
  EXPECT_EQ(p.sm90_kernel.arch, flashcute::Arch::kSm90);
  EXPECT_TRUE(p.params.deterministic);
  // partial_keys (ring attention's blocks) reaches the kernels' params, off by default.
  EXPECT_FALSE(p.params.partial_keys);
  a.partial_keys = true;
  ASSERT_TRUE(flashcute::plan_bwd(a, p).ok());
  EXPECT_TRUE(p.params.partial_keys);
}

// A varlen call: three sequences in 100 query rows and 120 key rows. The sm90 backward takes it
// with a workspace of bwd_varlen_workspace_floats (each sequence's rows start on a 128-row
// block, BwdBatch), not with the sm80 size.
TEST(PlanBwd, NamesTheSm90KernelForVarlen) {
  const DType dt = built_dtype();
  const int d = built_head_dim();
  if (flashcute::kernel_head_dim(d, dt, flashcute::Direction::kBwd) == 0) GTEST_SKIP() << "no backward kernel built";
  flashcute::BwdArgs a;
  a.q = flashcute::tensor_ref(fake(0x100000), dt, {100, 8, d});
  a.k = flashcute::tensor_ref(fake(0x200000), dt, {120, 2, d});
  a.v = flashcute::tensor_ref(fake(0x300000), dt, {120, 2, d});
  a.out = flashcute::tensor_ref(fake(0x400000), dt, {100, 8, d});
  a.lse = flashcute::tensor_ref(fake(0x500000), DType::kFloat32, {8, 100});
  a.dout = flashcute::tensor_ref(fake(0x600000), dt, {100, 8, d});
  a.dq = flashcute::mutable_tensor_ref(fake_mut(0x700000), dt, {100, 8, d});
  a.dk = flashcute::mutable_tensor_ref(fake_mut(0x800000), dt, {120, 2, d});
  a.dv = flashcute::mutable_tensor_ref(fake_mut(0x900000), dt, {120, 2, d});
  a.varlen = flashcute::VarlenArgs{flashcute::tensor_ref(fake(0xb00000), DType::kInt32, {4}),
                                   flashcute::tensor_ref(fake(0xc00000), DType::kInt32, {4}), 60, 70};
  const int hd = flashcute::kernel_head_dim(d, dt, flashcute::Direction::kBwd, flashcute::Arch::kSm90);
  // (nheads, padded total) rows: 100 rounded to 128, and 128 for each of the 3 sequences.
  EXPECT_EQ(flashcute::sm90::bwd_varlen_workspace_floats(3, 8, 100, 128), 8 * 512 * 130 + 8 * 512 / 64 + 1);
  a.workspace = flashcute::mutable_tensor_ref(fake_mut(0xa00000), DType::kFloat32,
                                              {flashcute::sm90::bwd_varlen_workspace_floats(3, 8, 100, 256)});
  flashcute::BwdPlan p;
  ASSERT_TRUE(flashcute::plan_bwd(a, p).ok());
  EXPECT_EQ(p.sm90_kernel.arch, hd > 0 ? flashcute::Arch::kSm90 : flashcute::Arch::kSm80);
  EXPECT_EQ(p.params.dq_batch_stride, 0);
  EXPECT_EQ(flashcute::sm90_bwd_can_run(p.params), nullptr);
  a.workspace.shape[0] = flashcute::bwd_workspace_floats(1, 8, 100);  // the sm80 size: the sm80 kernel
  ASSERT_TRUE(flashcute::plan_bwd(a, p).ok());
  EXPECT_EQ(p.sm90_kernel.arch, flashcute::Arch::kSm80);
  // No key anywhere (max_seqlen_k 0): no TMA descriptor to make, the sm80 kernel.
  p.params.seqlen_k = 0;
  EXPECT_STREQ(flashcute::sm90_bwd_can_run(p.params), "no keys");
}

// The workspace for the fastest path: the sm90 size where this build and the current device can
// run the sm90 backward, else the sm80 size; head dim 0 asks for the sm80 size.
TEST(PlanBwd, WorkspaceForTheFastestPath) {
  const int64_t sm80 = flashcute::bwd_workspace_floats(2, 8, 100);
  EXPECT_EQ(flashcute::bwd_workspace_floats(2, 8, 100, 0, DType::kBFloat16), sm80);
  const int hd = flashcute::kernel_head_dim(128, DType::kBFloat16, flashcute::Direction::kBwd, flashcute::Arch::kSm90);
  const bool sm90 = flashcute::device_is_sm90();
  (void)cudaGetLastError();  // without a GPU the query fails (not sticky)
  const int64_t n = flashcute::bwd_workspace_floats(2, 8, 100, 128, DType::kBFloat16);
  (void)cudaGetLastError();
  EXPECT_EQ(n, hd > 0 && sm90 ? flashcute::sm90::bwd_workspace_floats(2, 8, 100, hd) : sm80);
}

TEST(PlanBwd, Sm90CanRunSaysWhyNot) {
  flashcute::BwdParams p;
  p.batch = 1, p.seqlen_q = 10, p.seqlen_k = 10, p.nheads = 1, p.nheads_k = 1, p.head_dim = 64;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = 64;
  EXPECT_EQ(flashcute::sm90_bwd_can_run(p), nullptr);
  p.softcap = 1.f;
  EXPECT_EQ(flashcute::sm90_bwd_can_run(p), nullptr);
  p.softcap = 0.f;
  p.dq_row_stride = 68;  // not a multiple of 16 bytes
  EXPECT_NE(std::string(flashcute::sm90_bwd_can_run(p)).find("dq"), std::string::npos);
  p.dq_row_stride = 64;
  p.dk_head_stride = 3;
  EXPECT_NE(std::string(flashcute::sm90_bwd_can_run(p)).find("dk"), std::string::npos);
  p.dk_head_stride = 0;
  p.dv_row_stride = 68;  // even, but the epilogue stores 16 bytes a thread
  EXPECT_NE(std::string(flashcute::sm90_bwd_can_run(p)).find("dv"), std::string::npos);
  p.dv_row_stride = 64;
  p.seqlen_q = 0;
  EXPECT_STREQ(flashcute::sm90_bwd_can_run(p), "no queries");
}

TEST(PlanBwd, BackwardPathSettingIsReadFromTheEnvironment) {
  flashcute::BackwardPath path;
  unsetenv("FLASHCUTE_BACKWARD_PATH");
  ASSERT_TRUE(flashcute::backward_path_setting(path).ok());
  EXPECT_EQ(path, flashcute::BackwardPath::kSm90);  // the Hopper backward where it can run
  setenv("FLASHCUTE_BACKWARD_PATH", "auto", 1);
  ASSERT_TRUE(flashcute::backward_path_setting(path).ok());
  EXPECT_EQ(path, flashcute::BackwardPath::kSm90);
  setenv("FLASHCUTE_BACKWARD_PATH", "sm80", 1);
  ASSERT_TRUE(flashcute::backward_path_setting(path).ok());
  EXPECT_EQ(path, flashcute::BackwardPath::kSm80);
  setenv("FLASHCUTE_BACKWARD_PATH", "sm90", 1);
  ASSERT_TRUE(flashcute::backward_path_setting(path).ok());
  EXPECT_EQ(path, flashcute::BackwardPath::kSm90);
  setenv("FLASHCUTE_BACKWARD_PATH", "hopper", 1);
  expect_error(flashcute::backward_path_setting(path), StatusCode::kInvalidArgument, "FLASHCUTE_BACKWARD_PATH",
               "auto, sm80 or sm90");
  unsetenv("FLASHCUTE_BACKWARD_PATH");
}

TEST(RunBwd, ValidatesBeforeTouchingCuda) {
  flashcute::BwdArgs a = good_bwd_args();
  a.softcap = -1.0;
  EXPECT_EQ(flashcute::run_bwd(a, bogus_stream()).code, StatusCode::kInvalidArgument);
}

}  // namespace
