// flashcute/host/kernels.hpp: the list of compiled kernels, and what can be asked of it.
//
// CMake owns the list: it generates one translation unit per kernel and flashcute/build_config.hpp,
// which names the same kernels in kCompiledKernels. Everything that needs to know what a build
// can run (the dispatch, the validation's "not compiled" errors, the Python module's
// compiled_head_dims(), the tests) asks here. The kernels' launch functions are declared in
// common/launch.hpp. Needs no CUDA header.
#pragma once

#include <cstddef>
#include <iterator>

#include "flashcute/build_config.hpp"
#include "flashcute/common/types.hpp"
#include "flashcute/sm80/config.hpp"
#include "flashcute/sm80/config_bwd.hpp"
#include "flashcute/sm90/config.hpp"

namespace flashcute {

inline constexpr std::size_t kNumCompiledKernels = std::size(kCompiledKernels);

// Every catalog head dim has a tile config, and every listed kernel is a catalog head dim.
constexpr bool kernel_list_is_consistent() {
  for (int hd : kKernelHeadDims) {
    if (sm80::default_fwd_config(hd).head_dim != hd || sm80::validate(sm80::default_fwd_config(hd)) != nullptr)
      return false;
    if (sm80::default_bwd_config(hd).head_dim != hd || sm80::validate_bwd(sm80::default_bwd_config(hd)) != nullptr)
      return false;
    if (sm80::default_splitkv_config(hd).head_dim != hd || sm80::validate(sm80::default_splitkv_config(hd)) != nullptr)
      return false;
    if (sm90::default_fwd_config(hd).head_dim != hd || sm90::validate(sm90::default_fwd_config(hd)) != nullptr)
      return false;
    if (sm90::has_long_fwd_config(hd) && sm90::validate(sm90::long_fwd_config(hd)) != nullptr) return false;
  }
  for (const KernelKey& key : kCompiledKernels) {
    if (key.arch == Arch::kSm90 && key.direction == Direction::kBwd && !sm90::has_bwd_config(key.head_dim))
      return false;
    bool in_catalog = false;
    for (int hd : kKernelHeadDims) in_catalog = in_catalog || hd == key.head_dim;
    if (!in_catalog) return false;
  }
  return true;
}
static_assert(kernel_list_is_consistent(),
              "flashcute/build_config.hpp names a head dim with no valid tile config (sm80/config.hpp, sm90/config.hpp)");

// Whether any kernel of this direction (any variant) and dtype is compiled.
constexpr bool dtype_compiled(DType dtype, Direction direction = Direction::kFwd) {
  for (const KernelKey& k : kCompiledKernels)
    if (k.direction == direction && k.dtype == dtype) return true;
  return false;
}

// Whether the KV-cache kernels (and so its append and combine, src/kvcache.cu) are compiled.
constexpr bool kvcache_compiled() {
  for (const KernelKey& k : kCompiledKernels)
    if (k.variant == Variant::kSplitkv) return true;
  return false;
}

// The kernel head dim a user head dim runs on: the smallest compiled one >= head_dim, for this
// family, direction, variant and dtype; 0 when none is.
constexpr int kernel_head_dim(int head_dim, DType dtype, Direction direction = Direction::kFwd,
                              Arch arch = Arch::kSm80, Variant variant = Variant::kPlain) {
  int best = 0;
  for (const KernelKey& k : kCompiledKernels) {
    if (k.arch == arch && k.direction == direction && k.variant == variant && k.dtype == dtype &&
        k.head_dim >= head_dim && (best == 0 || k.head_dim < best))
      best = k.head_dim;
  }
  return best;
}

// The same over every dtype: what a head dim runs on in this build, whatever its dtype.
constexpr int kernel_head_dim(int head_dim) {
  int best = 0;
  for (const KernelKey& k : kCompiledKernels) {
    if (k.direction == Direction::kFwd && k.variant == Variant::kPlain && k.head_dim >= head_dim &&
        (best == 0 || k.head_dim < best))
      best = k.head_dim;
  }
  return best;
}

// The catalog head dim a user head dim would run on in a build with every kernel; 0 above 256.
constexpr int catalog_head_dim(int head_dim) {
  for (int hd : kKernelHeadDims)
    if (head_dim <= hd) return hd;
  return 0;
}

}  // namespace flashcute
