// Host-only tests of plan_fwd with a KV cache: contiguous and paged, with and without an append.
#include <gtest/gtest.h>

#include <cstdint>

#include "flashcute/host/api.hpp"
#include "host_util.hpp"

namespace {

using namespace fctest;  // NOLINT: the test helpers

// ---------------------------------------------------------------------------------------- KV cache

// A decode step: one query per sequence, GQA 4:1, over a contiguous cache of 1000 keys.
FwdArgs good_kvcache_args() {
  FwdArgs a = contiguous_args(Case{built_dtype(), 4, 1, 1000, 8, 2, built_head_dim()});
  flashcute::KvcacheArgs& kv = a.kvcache.emplace();
  kv.cache_seqlens = flashcute::tensor_ref(fake(0xb00000), DType::kInt32, {4});
  kv.num_sms = 132;
  return a;
}

// The same step over a paged cache: 50 pages of 64 keys, 16 pages per sequence, appending 3 keys.
FwdArgs good_paged_args() {
  FwdArgs a = good_kvcache_args();
  const int d = built_head_dim();
  a.k = flashcute::tensor_ref(fake(0x200000), a.q.dtype, {50, 64, 2, d});
  a.v = flashcute::tensor_ref(fake(0x300000), a.q.dtype, {50, 64, 2, d});
  a.kvcache->block_table = flashcute::tensor_ref(fake(0xc00000), DType::kInt32, {4, 16});
  a.kvcache->k_new = flashcute::tensor_ref(fake(0xd00000), a.q.dtype, {4, 3, 2, d});
  a.kvcache->v_new = flashcute::tensor_ref(fake(0xe00000), a.q.dtype, {4, 3, 2, d});
  return a;
}

TEST(PlanKvcache, PacksTheGroupAndSplitsTheKeys) {
  if (!flashcute::kvcache_compiled()) GTEST_SKIP() << "the KV-cache kernels are not in this build (FLASHCUTE_KVCACHE=OFF)";
  const int d = built_head_dim();
  FwdPlan p;
  ASSERT_TRUE(plan(good_kvcache_args(), &p).ok());
  const flashcute::FwdParams& q = p.params;
  EXPECT_EQ(p.kernel.direction, flashcute::Direction::kFwd);
  EXPECT_EQ(p.kernel.variant, flashcute::Variant::kSplitkv);
  EXPECT_EQ(q.seqlen_q, 4);  // the 4 query heads of a KV head are the rows of one tile
  EXPECT_EQ(q.nheads, 2);
  EXPECT_EQ(q.q_row_stride, d);
  EXPECT_EQ(q.q_head_stride, 4 * d);
  EXPECT_EQ(q.lse_head_stride, 4);
  EXPECT_EQ(q.seqlen_k, 1000);
  EXPECT_EQ(q.cache_seqlens, static_cast<const int*>(fake(0xb00000)));
  EXPECT_FALSE(p.append);
  // 8 CTAs on 132 SMs: the keys are split, and the workspace holds every split's partial.
  EXPECT_GT(q.num_splits, 1);
  EXPECT_EQ(p.workspace_floats, int64_t(q.num_splits) * 4 * 2 * 4 * (d + 1));
  EXPECT_EQ(q.o_accum, nullptr);
  FwdArgs a = good_kvcache_args();
  a.kvcache->num_splits = 1;
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.num_splits, 1);
  EXPECT_EQ(p.workspace_floats, 0);
  a.window_left = 10;  // a window aligns per query row: no packing
  ASSERT_TRUE(plan(a, &p).ok());
  EXPECT_EQ(p.params.seqlen_q, 1);
  EXPECT_EQ(p.params.nheads, 8);
}

TEST(PlanKvcache, RefusedWhenTheKernelsAreLeftOut) {
  if (flashcute::kvcache_compiled()) GTEST_SKIP() << "this build has the KV-cache kernels";
  FwdPlan p;
  const flashcute::Status st = plan(good_kvcache_args(), &p);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code, flashcute::StatusCode::kNotCompiled);
  EXPECT_EQ(st.arg, "k_cache");
}

TEST(PlanKvcache, ChoosesSplitsToFillTheGpu) {
  using flashcute::detail::choose_num_splits;
  EXPECT_EQ(choose_num_splits(512, 32, 132), 1);   // enough CTAs already
  EXPECT_EQ(choose_num_splits(128, 32, 132), 1);   // one wave
  EXPECT_EQ(choose_num_splits(8, 32, 132), 16);    // 128 CTAs of 2 blocks: one wave
  EXPECT_EQ(choose_num_splits(8, 512, 132), 16);   // 17 would take a second wave
  EXPECT_EQ(choose_num_splits(8, 1, 132), 1);      // one key block cannot be split
  EXPECT_LE(choose_num_splits(1, 100000, 132), flashcute::kMaxNumSplits);
}

TEST(PlanKvcache, PagedCacheAndAppend) {
  if (!flashcute::kvcache_compiled()) GTEST_SKIP() << "the KV-cache kernels are not in this build (FLASHCUTE_KVCACHE=OFF)";
  const int d = built_head_dim();
  FwdPlan p;
  ASSERT_TRUE(plan(good_paged_args(), &p).ok());
  const flashcute::FwdParams& q = p.params;
  EXPECT_FALSE(p.sm90);  // the KV-cache kernels are the sm80 family's
  EXPECT_EQ(q.seqlen_k, 16 * 64);  // the capacity: pages per sequence times the page size
  EXPECT_EQ(q.page_size_log2, 6);
  EXPECT_EQ(q.num_pages, 50);
  EXPECT_EQ(q.max_pages_per_seq, 16);
  EXPECT_EQ(q.k_batch_stride, 64 * 2 * d);  // between pages
  EXPECT_EQ(q.block_table_batch_stride, 16);
  EXPECT_TRUE(p.append);
  EXPECT_EQ(q.seqlen_new, 3);
  EXPECT_EQ(p.append_params.kn_row_stride, 2 * d);
  auto ws = flashcute::mutable_tensor_ref(fake_mut(0x900000), DType::kFloat32, {p.workspace_floats});
  ASSERT_TRUE(flashcute::attach_workspace(p, ws).ok());
  EXPECT_EQ(p.params.o_accum, static_cast<float*>(fake_mut(0x900000)));
  ws.shape[0] = p.workspace_floats - 1;
  expect_error(flashcute::attach_workspace(p, ws), StatusCode::kInvalidArgument, "workspace", "float32, contiguous");
}

TEST(PlanKvcache, RejectsEachArgumentByName) {
  if (!flashcute::kvcache_compiled()) GTEST_SKIP() << "the KV-cache kernels are not in this build (FLASHCUTE_KVCACHE=OFF)";
  FwdArgs a = good_paged_args();
  a.k.shape[1] = a.v.shape[1] = 48;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k_cache", "power of two >= 16");
  a = good_paged_args();
  a.kvcache->block_table->dtype = DType::kFloat32;
  expect_error(plan(a), StatusCode::kInvalidType, "block_table", "int32 (batch, max_num_blocks_per_seq)");
  a = good_paged_args();
  a.kvcache->block_table->shape[0] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "block_table", "(4, 16)");
  a = good_paged_args();
  a.kvcache->cache_seqlens->shape[0] = 5;
  expect_error(plan(a), StatusCode::kInvalidArgument, "cache_seqlens", "int32 (batch,) = (4,)");
  a = good_paged_args();
  a.kvcache->cache_seqlens.reset();
  expect_error(plan(a), StatusCode::kInvalidArgument, "cache_seqlens", "required when k and v are given");
  a = good_paged_args();
  a.kvcache->k_new->shape[1] = a.kvcache->v_new->shape[1] = 16 * 64 + 1;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k", "overflow a cache of 1024");
  a = good_paged_args();
  a.kvcache->v_new.reset();
  expect_error(plan(a), StatusCode::kInvalidArgument, "v", "v: k and v (the new keys and values) must be given together");
  a = good_paged_args();
  a.kvcache->v_new->shape[2] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v", "(batch, seqlen_new, nheads_k, headdim)");
  a = good_paged_args();
  a.kvcache->num_splits = 129;
  expect_error(plan(a), StatusCode::kInvalidArgument, "num_splits", "0 (automatic) to 128");
  a = good_kvcache_args();
  a.k.shape[0] = a.v.shape[0] = 3;
  expect_error(plan(a), StatusCode::kInvalidArgument, "k_cache", "batch 3 does not match q's batch 4");
  a = good_kvcache_args();
  a.v.shape[1] = 999;
  expect_error(plan(a), StatusCode::kInvalidArgument, "v_cache", "like k_cache");
  // A plan that splits the keys and has no workspace attached is refused before any CUDA call.
  EXPECT_EQ(flashcute::run_fwd(good_kvcache_args(), bogus_stream()).arg, "workspace");
}

}  // namespace
