// flashcute/flashcute.hpp: the whole library, header-only.
//
//   #include <flashcute/flashcute.hpp>
//   flashcute::Status st = flashcute::run_fwd(args, stream);   // see flashcute/host/api.hpp
//
// Compile with nvcc as C++20. Including this header instantiates every kernel of the list in
// flashcute/build_config.hpp in the including translation unit (the installed package's list
// is the one its build was configured with). To build fewer, define FLASHCUTE_KERNELS first:
//   #define FLASHCUTE_KERNELS FLASHCUTE_KERNEL(kSm80, kFwd, kBFloat16, 128), FLASHCUTE_KERNEL(...)
//   #include <flashcute/flashcute.hpp>
//
// A list with sm90 kernels (the Hopper forward and backward, FLASHCUTE_KERNEL(kSm90, ...)) needs the
// translation unit compiled for sm_90a too, e.g. CUDA_ARCHITECTURES "80-real;90a-real": their
// device code exists for sm_90a alone (other archs get an empty body, never launched, since the
// dispatch takes them on compute capability 9.0 only). The checks at the end of this file refuse
// a list with sm90 kernels in a translation unit built without compute capability 9.0, or built
// for plain sm_90, where the Hopper kernels would have no code.
#pragma once

#include "flashcute/host/api.hpp"
#include "flashcute/sm80/launch_bwd.hpp"
#include "flashcute/sm80/launch_fwd.hpp"
#include "flashcute/sm80/kernel_merge.hpp"
#include "flashcute/sm80/kernel_kvcache.hpp"
#include "flashcute/sm80/launch_splitkv.hpp"
#include "flashcute/sm90/launch_bwd.hpp"
#include "flashcute/sm90/launch_fwd.hpp"

namespace flashcute::detail {

// Whether the kernel list names a kernel of this family.
constexpr bool lists_family(Arch arch) {
  for (const KernelKey& k : kCompiledKernels)
    if (k.arch == arch) return true;
  return false;
}

// Whether this translation unit builds device code for compute capability `cc` (nvcc's
// __CUDA_ARCH_LIST__, defined in every compilation pass; 900 for both sm_90 and sm_90a).
constexpr bool tu_builds_for(int cc) {
#if defined(__CUDA_ARCH_LIST__)
  constexpr int kArchs[] = {__CUDA_ARCH_LIST__};
  for (int a : kArchs)
    if (a == cc) return true;
  return false;
#else
  (void)cc;  // not nvcc: nothing to check against
  return true;
#endif
}

}  // namespace flashcute::detail

static_assert(!flashcute::detail::lists_family(flashcute::Arch::kSm90) || flashcute::detail::tu_builds_for(900),
              "flashcute: the kernel list (FLASHCUTE_KERNELS, or the installed flashcute/build_config.hpp) names sm90 "
              "kernels, which run on sm_90a code only: compile this translation unit for sm_90a too "
              "(CUDA_ARCHITECTURES 90a-real beside the others), or define FLASHCUTE_KERNELS without them");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
static_assert(!flashcute::detail::lists_family(flashcute::Arch::kSm90),
              "flashcute: this translation unit is compiled for sm_90, where the sm90 kernels of the list have no "
              "code (wgmma and setmaxnreg exist in sm_90a only): compile for 90a (CUDA_ARCHITECTURES 90a-real) "
              "instead of 90; the sm80 kernels run on sm_90a code as well");
#endif
