// Host-only tests of the kernel list: it is the product of the build options, and head dims
// dispatch to the kernels it holds.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>

#include "flashcute/host/api.hpp"
#include "host_util.hpp"

namespace {

using namespace fctest;  // NOLINT: the test helpers

std::set<std::string> split(const char* csv) {
  std::set<std::string> out;
  std::stringstream ss(csv);
  for (std::string item; std::getline(ss, item, ',');) out.insert(item);
  return out;
}

// ---------------------------------------------------------------------------------------- the list

TEST(KernelList, IsTheProductOfTheBuildOptions) {
  // CMake wrote both the options and the list into build_config.hpp: they must agree.
  const std::set<std::string> dims = split(flashcute::kBuildHeadDims), dtypes = split(flashcute::kBuildDtypes);
  std::set<std::string> listed;
  int backward = 0, splitkv = 0, sm90 = 0, sm90_bwd = 0, sm90_bwd_expected = 0;
  const bool sm90a = split(flashcute::kBuildCudaArchs).count("90a") > 0;
  for (const flashcute::KernelKey& k : flashcute::kCompiledKernels) {
    // The Hopper forward, one per (dtype, head dim), and its backward for the head dims with an
    // sm90 backward config, with 90a.
    if (k.arch == flashcute::Arch::kSm90 && k.direction == flashcute::Direction::kBwd) {
      EXPECT_TRUE(sm90a);
      EXPECT_TRUE(flashcute::sm90::has_bwd_config(k.head_dim)) << k.head_dim;
      EXPECT_TRUE(dims.count(std::to_string(k.head_dim))) << k.head_dim;
      ++sm90_bwd;
      continue;
    }
    if (k.arch == flashcute::Arch::kSm90) {
      EXPECT_TRUE(sm90a);
      EXPECT_EQ(k.direction, flashcute::Direction::kFwd);
      EXPECT_EQ(k.variant, flashcute::Variant::kPlain);
      EXPECT_TRUE(dims.count(std::to_string(k.head_dim))) << k.head_dim;
      EXPECT_TRUE(dtypes.count(flashcute::dtype_option(k.dtype))) << flashcute::dtype_name(k.dtype);
      ++sm90;
      continue;
    }
    EXPECT_EQ(k.arch, flashcute::Arch::kSm80);
    EXPECT_TRUE(k.variant == flashcute::Variant::kPlain || k.direction == flashcute::Direction::kFwd);
    EXPECT_TRUE(dims.count(std::to_string(k.head_dim))) << k.head_dim;
    EXPECT_TRUE(dtypes.count(flashcute::dtype_option(k.dtype))) << flashcute::dtype_name(k.dtype);
    listed.insert(std::string(flashcute::kernel_kind_name(k)) + "/" + flashcute::dtype_option(k.dtype) + "/" +
                  std::to_string(k.head_dim));
    backward += k.direction == flashcute::Direction::kBwd;
    splitkv += k.variant == flashcute::Variant::kSplitkv;
  }
  // Every (dtype, head dim) has a forward, and either all or none has a backward
  // (FLASHCUTE_BACKWARD) and a KV-cache kernel (FLASHCUTE_KVCACHE).
  const size_t per_direction = dims.size() * dtypes.size();
  EXPECT_TRUE(backward == 0 || size_t(backward) == per_direction) << backward;
  EXPECT_TRUE(splitkv == 0 || size_t(splitkv) == per_direction) << splitkv;
  EXPECT_EQ(std::string(flashcute::kBuildBackward) == "ON", backward > 0);
  EXPECT_EQ(std::string(flashcute::kBuildKvcache) == "ON", splitkv > 0);
  EXPECT_EQ(size_t(sm90), sm90a ? per_direction : 0);
  for (const std::string& d : dims)
    sm90_bwd_expected += flashcute::sm90::has_bwd_config(std::stoi(d)) ? int(dtypes.size()) : 0;
  EXPECT_EQ(sm90_bwd, sm90a && backward > 0 ? sm90_bwd_expected : 0);
  EXPECT_EQ(listed.size(), per_direction + size_t(backward) + size_t(splitkv));
  EXPECT_EQ(flashcute::kNumCompiledKernels,
            per_direction + size_t(backward) + size_t(splitkv) + size_t(sm90) + size_t(sm90_bwd));
}

TEST(KernelList, HeadDimDispatch) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (int d = 8; d <= 256; d += 8) {
      int expected = 0;  // the smallest compiled kernel head dim >= d
      for (const flashcute::KernelKey& k : flashcute::kCompiledKernels)
        if (k.dtype == dtype && k.head_dim >= d && (expected == 0 || k.head_dim < expected)) expected = k.head_dim;
      EXPECT_EQ(flashcute::kernel_head_dim(d, dtype), expected) << d;
    }
  }
  EXPECT_EQ(flashcute::kernel_head_dim(264), 0);
  EXPECT_EQ(flashcute::catalog_head_dim(32), 32);
  EXPECT_EQ(flashcute::catalog_head_dim(40), 64);
  EXPECT_EQ(flashcute::catalog_head_dim(136), 192);
  EXPECT_EQ(flashcute::catalog_head_dim(200), 256);
  EXPECT_EQ(flashcute::catalog_head_dim(264), 0);
}

}  // namespace
