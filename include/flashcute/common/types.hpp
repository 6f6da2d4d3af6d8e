// flashcute/common/types.hpp: the names every layer shares.
//
// DType is an element type; Arch names a kernel family (the code path a kernel is built from,
// not the GPU it runs on); Direction is forward or backward, and Variant a kernel of a direction
// built for one use (the forward over a KV cache). A KernelKey names one compiled kernel: CMake generates the list of them (flashcute/build_config.hpp), and the host
// dispatch, the Python module and the tests all read that list.
#pragma once

#include <cstdint>

namespace flashcute {

// The largest head dim any kernel takes; user head dims are multiples of 8 up to it.
inline constexpr int kMaxHeadDim = 256;

// Element types of the arrays flashcute reads and writes. kOther stands for anything else a
// caller may pass (int8, float64, ...), so that validation can name it and refuse it.
enum class DType : uint8_t { kFloat16, kBFloat16, kFloat32, kInt32, kOther };

constexpr const char* dtype_name(DType d) {
  switch (d) {
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kInt32: return "int32";
    default: return "an unsupported dtype";
  }
}

// The spelling of the build option FLASHCUTE_DTYPES.
constexpr const char* dtype_option(DType d) { return d == DType::kFloat16 ? "fp16" : "bf16"; }

// Kernel families. kSm80: mma.sync m16n8k16 + cp.async + ldmatrix; runs on sm80 and every newer
// GPU. kSm90: wgmma + TMA + warp specialisation, the Hopper forward; built for sm_90a only, it
// runs on compute capability 9.0 and nowhere else (host/dispatch.hpp picks it there).
enum class Arch : uint8_t { kSm80, kSm90 };

// kFwd: attention forward; kBwd: its backward (dq, dk, dv).
enum class Direction : uint8_t { kFwd, kBwd };

// kPlain: the kernel of its direction. kSplitkv: the forward over a KV cache
// (flash_attn_with_kvcache): split-KV partials, paged K/V, per-entry cache lengths, from a tile
// table of its own (sm80::default_splitkv_config).
enum class Variant : uint8_t { kPlain, kSplitkv };

// One compiled kernel. A structural type: usable as a template argument.
struct KernelKey {
  Arch arch = Arch::kSm80;
  Direction direction = Direction::kFwd;
  DType dtype = DType::kBFloat16;
  int head_dim = 0;  // the kernel head dim; a user head dim <= it runs on it, padded
  Variant variant = Variant::kPlain;

  friend constexpr bool operator==(const KernelKey&, const KernelKey&) = default;
};

constexpr const char* arch_name(Arch a) { return a == Arch::kSm80 ? "sm80" : a == Arch::kSm90 ? "sm90" : "unknown"; }
constexpr const char* direction_name(Direction d) {
  return d == Direction::kFwd ? "fwd" : d == Direction::kBwd ? "bwd" : "unknown";
}
// A kernel's kind, as the list names it (cmake/FlashcuteKernelList.cmake: sm80_splitkv_bf16_hdim64):
// its direction for a plain kernel ("fwd", "bwd"), else its variant ("splitkv").
constexpr const char* kernel_kind_name(const KernelKey& k) {
  return k.variant == Variant::kSplitkv ? "splitkv" : direction_name(k.direction);
}

}  // namespace flashcute

// Spells one KernelKey; flashcute/build_config.hpp lists the compiled kernels with it, and a
// header-only user can define FLASHCUTE_KERNELS with it (see flashcute/flashcute.hpp). A variant
// other than kPlain comes fifth: FLASHCUTE_KERNEL(kSm80, kFwd, kBFloat16, 128, kSplitkv).
#define FLASHCUTE_KERNEL(arch, direction, dtype, head_dim, ...)                                         \
  ::flashcute::KernelKey {                                                                               \
    ::flashcute::Arch::arch, ::flashcute::Direction::direction, ::flashcute::DType::dtype, head_dim      \
        __VA_OPT__(, ::flashcute::Variant::__VA_ARGS__)                                                   \
  }
