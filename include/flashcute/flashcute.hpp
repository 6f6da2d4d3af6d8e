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
#pragma once

#include "flashcute/host/api.hpp"
#include "flashcute/sm80/launch_bwd.hpp"
#include "flashcute/sm80/launch_fwd.hpp"
#include "flashcute/sm80/kernel_merge.hpp"
#include "flashcute/sm80/kernel_kvcache.hpp"
#include "flashcute/sm80/launch_splitkv.hpp"
