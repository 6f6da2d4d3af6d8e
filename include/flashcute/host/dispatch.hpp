// flashcute/host/dispatch.hpp: from a FwdPlan's KernelKey to the one compiled kernel that runs it.
//
// The switch is generated from the list itself (kCompiledKernels in flashcute/build_config.hpp):
// one comparison per compiled kernel, each calling that kernel's launch function, so a kernel the
// build left out is never referenced. Needs only the CUDA runtime headers.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "flashcute/common/launch.hpp"
#include "flashcute/common/status.hpp"
#include "flashcute/host/kernels.hpp"
#include "flashcute/host/validate_bwd.hpp"
#include "flashcute/host/validate_fwd.hpp"

namespace flashcute {

// The sm90 tile table: FLASHCUTE_SM90_TILES=base keeps every sm90 forward on the first table's
// tiles (sm90::default_fwd_config), "long" takes the long-sequence tiles wherever a head dim has
// them (sm90::long_fwd_config), unset or "auto" lets sm90::use_long_tiles choose per call. Read
// at every launch (getenv: no device call), so tests and benchmarks can switch it between calls.
enum class Sm90Tiles : uint8_t { kAuto, kBase, kLong };

inline Status sm90_tiles_setting(Sm90Tiles& tiles) {
  static constexpr const char* kValues[] = {"auto", "base", "long"};  // in Sm90Tiles' order
  std::size_t index;
  const Status st = detail::env_choice("FLASHCUTE_SM90_TILES", kValues, "auto, base or long", index);
  tiles = Sm90Tiles(index);
  return st;
}

// The tile (block_m, block_n) of the kernel the last forward launch of this process ran on,
// as block_m << 16 | block_n (0 before any): a diagnostic for tests and benchmarks.
inline std::atomic<uint32_t>& last_forward_tile() {
  static std::atomic<uint32_t> tile{0};
  return tile;
}

namespace detail {

inline void record_forward_tile(int block_m, int block_n) {
  last_forward_tile().store(uint32_t(block_m) << 16 | uint32_t(block_n), std::memory_order_relaxed);
}

// Whether the kernels of a direction take Params (BwdParams: the backward; FwdParams: the others).
template <class Params>
constexpr bool takes_params(Direction d) {
  return std::is_same_v<Params, BwdParams> == (d == Direction::kBwd);
}

template <KernelKey kKey, class Params>
Status launch_kernel(const Params& params, cudaStream_t stream) {
  static_assert(takes_params<Params>(kKey.direction));
  if constexpr (kKey.arch == Arch::kSm90 && kKey.direction == Direction::kBwd) {
    return sm90::launch_bwd<kKey.dtype, kKey.head_dim>(params, stream);
  } else if constexpr (kKey.arch == Arch::kSm90) {
    static_assert(kKey.variant == Variant::kPlain, "the sm90 family has the plain forward and backward only");
    constexpr sm90::FwdConfig kBase = sm90::default_fwd_config(kKey.head_dim);
    if (params.cu_seqlens_q != nullptr) {  // varlen: the first table's tiles
      record_forward_tile(kBase.block_m, kBase.block_n);
      return sm90::launch_fwd_varlen<kKey.dtype, kKey.head_dim>(params, stream);
    }
    if (params.cache_seqlens != nullptr || params.block_table != nullptr) {  // a KV cache: the same
      if constexpr (kvcache_compiled()) {
        record_forward_tile(kBase.block_m, kBase.block_n);
        return sm90::launch_fwd_kvcache<kKey.dtype, kKey.head_dim>(params, stream);
      }
      return Status::invalid(StatusCode::kNotCompiled, "k_cache", "KV-cache kernels in this build", "none",
                             "flashcute was built without KV-cache kernels (build option FLASHCUTE_KVCACHE)");
    }
    Sm90Tiles tiles;
    FLASHCUTE_RETURN_IF_ERROR(sm90_tiles_setting(tiles));
    if constexpr (sm90::has_long_fwd_config(kKey.head_dim)) {
      constexpr sm90::FwdConfig kLong = sm90::long_fwd_config(kKey.head_dim);
      const bool take_long =
          tiles == Sm90Tiles::kLong ||
          (tiles == Sm90Tiles::kAuto &&
           sm90::use_long_tiles(params.seqlen_q, params.seqlen_k, int64_t(params.nheads) * params.batch,
                                params.window_left, params.window_right, device_sms(), kLong.block_m));
      if (take_long) {
        record_forward_tile(kLong.block_m, kLong.block_n);
        return sm90::launch_fwd_long<kKey.dtype, kKey.head_dim>(params, stream);
      }
    }
    record_forward_tile(kBase.block_m, kBase.block_n);
    return sm90::launch_fwd<kKey.dtype, kKey.head_dim>(params, stream);
  } else if constexpr (kKey.variant == Variant::kSplitkv) {
    if (params.seqlen_q <= sm80::kDecodeRows) {
      if (params.block_table != nullptr)
        return sm80::launch_splitkv_decode_paged<kKey.dtype, kKey.head_dim>(params, stream);
      return sm80::launch_splitkv_decode<kKey.dtype, kKey.head_dim>(params, stream);
    }
    return sm80::launch_splitkv<kKey.dtype, kKey.head_dim>(params, stream);
  } else if constexpr (kKey.direction == Direction::kFwd) {
    constexpr sm80::FwdConfig kBase = sm80::default_fwd_config(kKey.head_dim);
    record_forward_tile(kBase.block_m, kBase.block_n);
    return sm80::launch_fwd<kKey.dtype, kKey.head_dim>(params, stream);
  } else {
    return sm80::launch_bwd<kKey.dtype, kKey.head_dim>(params, stream);
  }
}

template <class Params, std::size_t... I>
Status launch_listed(const KernelKey& key, const Params& params, cudaStream_t stream, std::index_sequence<I...>) {
  Status status;
  // Only the kernels of Params' direction are referenced: an if constexpr per list entry.
  auto try_one = [&](auto index) {
    constexpr KernelKey kKey = kCompiledKernels[decltype(index)::value];
    if constexpr (takes_params<Params>(kKey.direction)) {
      if (kKey == key) {
        status = launch_kernel<kKey>(params, stream);
        return true;
      }
    }
    return false;
  };
  const bool found = (try_one(std::integral_constant<std::size_t, I>{}) || ...);
  if (!found)  // plan_fwd only picks compiled kernels: a plan made by hand can get here
    return Status::invalid(StatusCode::kNotCompiled, "q", "a compiled kernel", "none",
                           "flashcute: no kernel for this dtype and head dim was compiled into this build");
  return status;
}

}  // namespace detail

namespace detail {

template <class Params>
Status launch_key(const KernelKey& key, const Params& params, cudaStream_t stream) {
  Status st = launch_listed(key, params, stream, std::make_index_sequence<kNumCompiledKernels>{});
  if (st.cuda_error == cudaErrorNoKernelImageForDevice || st.cuda_error == cudaErrorInvalidDeviceFunction)
    st.message += std::string("; this build has kernels for compute capabilities ") + kBuildCudaArchs +
                  " (build option FLASHCUTE_CUDA_ARCHS): rebuild it for this GPU";
  return st;
}

}  // namespace detail

namespace detail {
// The sm90 backward's kernel head dim for head_dim and dtype where it may run on `device`, else 0.
inline int sm90_bwd_head_dim_on(int head_dim, DType dtype, int device) {
  const int hd = head_dim > 0 ? kernel_head_dim(head_dim, dtype, Direction::kBwd, Arch::kSm90) : 0;
  return hd > 0 && device_is_sm90(device) ? hd : 0;
}
}  // namespace detail

// The float32 workspace a fixed-length backward call needs for the fastest path it may take on
// `device` (-1: the current one): the sm80 backward's, or, where the sm90 backward may take it (a
// kernel for this head dim and dtype in the build, a compute capability 9.0 device), the larger
// sm90 one. The sm80 size (the three-argument bwd_workspace_floats) stays valid: it keeps the
// call on the sm80 kernels.
inline int64_t bwd_workspace_floats(int64_t batch, int64_t nheads, int64_t seqlen_q, int head_dim, DType dtype,
                                    int device = -1) {
  const int64_t sm80 = bwd_workspace_floats(batch, nheads, seqlen_q);
  const int hd = detail::sm90_bwd_head_dim_on(head_dim, dtype, device);
  return hd == 0 ? sm80 : std::max(sm80, sm90::bwd_workspace_floats(batch, nheads, seqlen_q, hd));
}
// The same for a varlen batch of `batch` sequences and total_q queries: the sm80 backward's
// bwd_workspace_floats(1, nheads, total_q), or the larger sm90::bwd_varlen_workspace_floats.
inline int64_t bwd_varlen_workspace_floats(int64_t batch, int64_t nheads, int64_t total_q, int head_dim, DType dtype,
                                           int device = -1) {
  const int64_t sm80 = bwd_workspace_floats(1, nheads, total_q);
  const int hd = detail::sm90_bwd_head_dim_on(head_dim, dtype, device);
  return hd == 0 ? sm80 : std::max(sm80, sm90::bwd_varlen_workspace_floats(batch, nheads, total_q, hd));
}

// The kernel family the last forward launch of this process ran on (sm80 before any): a
// diagnostic for tests and benchmarks, which ask which path a call took.
inline std::atomic<Arch>& last_forward_arch() {
  static std::atomic<Arch> arch{Arch::kSm80};
  return arch;
}

// The kernel a forward plan runs on the current device: its sm90 twin where that can run.
inline Status forward_kernel(const FwdPlan& plan, KernelKey& key) {
  key = plan.kernel;
  // (plan.sm90 is plan_fwd's verdict; sm90_can_run again for plans made or edited by hand.)
  if (!plan.sm90 || key.direction != Direction::kFwd || key.variant != Variant::kPlain ||
      sm90_can_run(plan.params) != nullptr)
    return Status::success();
  ForwardPath path;
  FLASHCUTE_RETURN_IF_ERROR(forward_path_setting(path));
  if (path == ForwardPath::kAuto && device_is_sm90()) key.arch = Arch::kSm90;
  return Status::success();
}

// The backward path: unset, "auto" or "sm90", a call the Hopper backward can take
// (plan.sm90_kernel) runs on it on a compute capability 9.0 device; FLASHCUTE_BACKWARD_PATH=sm80
// runs every backward on the mma.sync kernels. Read at every launch (getenv: no device call).
enum class BackwardPath : uint8_t { kSm80, kSm90 };

inline Status backward_path_setting(BackwardPath& path) {
  static constexpr const char* kValues[] = {"auto", "sm80", "sm90"};
  std::size_t index;
  const Status st = detail::env_choice("FLASHCUTE_BACKWARD_PATH", kValues, "auto, sm80 or sm90", index);
  path = index == 1 ? BackwardPath::kSm80 : BackwardPath::kSm90;
  return st;
}

// The kernel family the last backward launch of this process ran on (sm80 before any).
inline std::atomic<Arch>& last_backward_arch() {
  static std::atomic<Arch> arch{Arch::kSm80};
  return arch;
}

// The kernel a backward plan runs on the current device.
inline Status backward_kernel(const BwdPlan& plan, KernelKey& key) {
  key = plan.kernel;
  if (plan.sm90_kernel.arch != Arch::kSm90) return Status::success();
  BackwardPath path;
  FLASHCUTE_RETURN_IF_ERROR(backward_path_setting(path));
  if (path == BackwardPath::kSm90 && device_is_sm90()) key = plan.sm90_kernel;
  return Status::success();
}

// Launches a plan from plan_bwd() on `stream`. Never synchronises; an empty plan launches nothing.
inline Status launch(const BwdPlan& plan, cudaStream_t stream) {
  if (plan.empty) return Status::success();
  KernelKey key;
  FLASHCUTE_RETURN_IF_ERROR(backward_kernel(plan, key));
  FLASHCUTE_RETURN_IF_ERROR(detail::launch_key(key, plan.params, stream));
  last_backward_arch().store(key.arch, std::memory_order_relaxed);
  return Status::success();
}

// Launches a plan from plan_fwd(). A KV-cache plan is up to three kernels in stream order: the
// append of the new keys and values, the attention, and the combine of its split-KV partials.
inline Status launch(const FwdPlan& plan, cudaStream_t stream) {
  // (A build without the KV-cache kernels (FLASHCUTE_KVCACHE=OFF) has no append or combine either;
  // plan_fwd refuses its KV-cache calls.)
  if constexpr (kvcache_compiled()) {
    if (plan.append) FLASHCUTE_RETURN_IF_ERROR(sm80::launch_append_kv<0>(plan.params, plan.append_params, stream));
  }
  if (plan.empty) return Status::success();
  if (plan.workspace_floats > 0 && plan.params.o_accum == nullptr)
    return Status::invalid_argument("workspace", "float32 with >= " + std::to_string(plan.workspace_floats) +
                                                     " elements for " + std::to_string(plan.params.num_splits) +
                                                     " key splits", "none (attach_workspace)");
  KernelKey key;
  FLASHCUTE_RETURN_IF_ERROR(forward_kernel(plan, key));
  FLASHCUTE_RETURN_IF_ERROR(detail::launch_key(key, plan.params, stream));
  if (key.direction == Direction::kFwd) last_forward_arch().store(key.arch, std::memory_order_relaxed);
  if constexpr (kvcache_compiled()) {
    if (plan.kernel.variant == Variant::kSplitkv && plan.params.num_splits > 1)
      return sm80::launch_combine<0>(plan.params, plan.kernel.dtype, stream);
  }
  return Status::success();
}

}  // namespace flashcute
