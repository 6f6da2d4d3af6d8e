// Helpers of the host-only tests (test_tile_tables.cpp, test_sm90_scheduler.cpp,
// test_kernel_list.cpp, test_plan_*.cpp, built as one test_host): valid calls at fake addresses,
// planned and checked without a GPU. Every pointer is fake and never dereferenced.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "case.hpp"
#include "flashcute/host/api.hpp"

namespace fctest {

using flashcute::DType;
using flashcute::FwdArgs;
using flashcute::FwdPlan;
using flashcute::Status;
using flashcute::StatusCode;

inline const void* fake(std::uintptr_t addr) { return reinterpret_cast<const void*>(addr); }
inline void* fake_mut(std::uintptr_t addr) { return reinterpret_cast<void*>(addr); }

// The dtype and head dim this build can run, so that valid calls plan.
inline DType built_dtype() {
  return flashcute::dtype_compiled(DType::kBFloat16) ? DType::kBFloat16 : DType::kFloat16;
}
inline int built_head_dim() { return flashcute::kCompiledKernels[0].head_dim; }

// The call of `c` (its packed_qkv and with_lse aside): contiguous q, k, v, out at 0x100000 to
// 0x400000 and lse at 0x500000, with c's mask and softcap.
inline FwdArgs contiguous_args(const Case& c) {
  FwdArgs a;
  a.q = flashcute::tensor_ref(fake(0x100000), c.dtype, {c.batch, c.seqlen_q, c.nheads, c.head_dim});
  a.k = flashcute::tensor_ref(fake(0x200000), c.dtype, {c.batch, c.seqlen_k, c.nheads_k, c.head_dim});
  a.v = flashcute::tensor_ref(fake(0x300000), c.dtype, {c.batch, c.seqlen_k, c.nheads_k, c.head_dim});
  a.out = flashcute::mutable_tensor_ref(fake_mut(0x400000), c.dtype, {c.batch, c.seqlen_q, c.nheads, c.head_dim});
  a.lse = flashcute::mutable_tensor_ref(fake_mut(0x500000), DType::kFloat32, {c.batch, c.nheads, c.seqlen_q});
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  return a;
}

// A valid call: contiguous (batch, seqlen, heads, head_dim) arrays, GQA 4:1, with lse.
inline FwdArgs good_args(int d = built_head_dim()) {
  return contiguous_args(Case{built_dtype(), 2, 100, 120, 8, 2, d});
}

inline Status plan(const FwdArgs& a, FwdPlan* out = nullptr) {
  FwdPlan p;
  Status st = flashcute::plan_fwd(a, p);
  if (out) *out = p;
  return st;
}

// Expects `st` to be an error of `code` about `arg` whose message contains `fragment`.
inline void expect_error(const Status& st, StatusCode code, const char* arg, const std::string& fragment) {
  EXPECT_EQ(st.code, code) << st.message;
  EXPECT_EQ(st.arg, arg) << st.message;
  EXPECT_NE(st.message.find(fragment), std::string::npos) << "message: " << st.message << "\nexpected: " << fragment;
  EXPECT_FALSE(st.expected.empty());
  EXPECT_FALSE(st.got.empty());
}

// run_* must return before touching CUDA unless they launch: the stream is garbage, so any
// runtime call would fail or crash.
inline cudaStream_t bogus_stream() { return reinterpret_cast<cudaStream_t>(std::uintptr_t{0xdead0}); }

}  // namespace fctest
