// flashcute/flashcute.hpp: the whole library, header-only.
//
//   #include <flashcute/flashcute.hpp>
//   flashcute::FwdParams p = ...;
//   flashcute::Status st = flashcute::run_fwd(p, stream);
//
// Compile with nvcc (C++20). Every enabled dtype x head dim kernel is instantiated
// in the including translation unit; set FLASHCUTE_ENABLE_HDIM<d>=0 or
// FLASHCUTE_ENABLE_{FP16,BF16}=0 to build fewer.
#pragma once

#include "flashcute/api.hpp"
#include "flashcute/launch.hpp"
