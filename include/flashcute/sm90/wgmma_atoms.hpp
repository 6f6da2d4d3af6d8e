// flashcute/sm90/wgmma_atoms.hpp: the wgmma shapes the kernels use that CuTe's core set lacks.
//
// CuTe's core GMMA atoms have N in {8, 16, 32, 64, 96, 128, 192, 256}. The others come with
// CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, whose 5.7 MB of headers cost every TU that includes
// cute/tensor.hpp about 40 s of front-end time (cudafe++ and cicc each parse them), sm80 ones
// too. d 256's Q K^T (80 keys a block) is the only shape outside the core set, so it has its
// own atom here, and no TU needs the extended set.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace flashcute::sm90 {

// wgmma.mma_async m64n80k16: f32 += A B, A and B (fp16 or bf16) both from shared memory through
// descriptors. An MMA operation in CuTe's form: fma() takes the 40 accumulator registers one by one.
template <class Element, cute::GMMA::Major kMajorA, cute::GMMA::Major kMajorB>
struct Wgmma64x80x16SS {
  using DRegisters = void;
  using ARegisters = uint64_t[1];
  using BRegisters = uint64_t[1];
  using CRegisters = float[40];

#define FLASHCUTE_WGMMA_N80_ARGS(T)                                                                                  \
  T d00, T d01, T d02, T d03, T d04, T d05, T d06, T d07, T d08, T d09, T d10, T d11, T d12, T d13, T d14, T d15,    \
      T d16, T d17, T d18, T d19, T d20, T d21, T d22, T d23, T d24, T d25, T d26, T d27, T d28, T d29, T d30, T d31, \
      T d32, T d33, T d34, T d35, T d36, T d37, T d38, T d39
#define FLASHCUTE_WGMMA_N80_ASM(types)                                                                               \
  asm volatile(                                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n80k16.f32." types " "                                                        \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "                  \
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, "        \
      "%40, %41, p, 1, 1, %43, %44;\n}\n"                                                                             \
      : "+f"(d00), "+f"(d01), "+f"(d02), "+f"(d03), "+f"(d04), "+f"(d05), "+f"(d06), "+f"(d07), "+f"(d08),           \
        "+f"(d09), "+f"(d10), "+f"(d11), "+f"(d12), "+f"(d13), "+f"(d14), "+f"(d15), "+f"(d16), "+f"(d17),           \
        "+f"(d18), "+f"(d19), "+f"(d20), "+f"(d21), "+f"(d22), "+f"(d23), "+f"(d24), "+f"(d25), "+f"(d26),           \
        "+f"(d27), "+f"(d28), "+f"(d29), "+f"(d30), "+f"(d31), "+f"(d32), "+f"(d33), "+f"(d34), "+f"(d35),           \
        "+f"(d36), "+f"(d37), "+f"(d38), "+f"(d39)                                                                   \
      : "l"(desc_a), "l"(desc_b), "r"(int32_t(scale_d)), "n"(int32_t(kMajorA)), "n"(int32_t(kMajorB)))

  CUTE_HOST_DEVICE static void fma(uint64_t const& desc_a, uint64_t const& desc_b, FLASHCUTE_WGMMA_N80_ARGS(float&),
                                   cute::GMMA::ScaleOut const scale_d = cute::GMMA::ScaleOut::One) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
    static_assert(std::is_same_v<Element, cute::half_t> || std::is_same_v<Element, cute::bfloat16_t>);
    if constexpr (std::is_same_v<Element, cute::half_t>) {
      FLASHCUTE_WGMMA_N80_ASM("f16.f16");
    } else {
      FLASHCUTE_WGMMA_N80_ASM("bf16.bf16");
    }
#else
    CUTE_INVALID_CONTROL_PATH("Wgmma64x80x16SS needs a TU compiled for sm_90a");
#endif
  }
#undef FLASHCUTE_WGMMA_N80_ASM
#undef FLASHCUTE_WGMMA_N80_ARGS
};

}  // namespace flashcute::sm90

// CuTe reads an MMA operation's shapes and thread layouts from its MMA_Traits.
namespace cute {
template <class Element, GMMA::Major kMajorA, GMMA::Major kMajorB>
struct MMA_Traits<flashcute::sm90::Wgmma64x80x16SS<Element, kMajorA, kMajorB>> {
  using ValTypeD = float;
  using ValTypeA = Element;
  using ValTypeB = Element;
  using ValTypeC = float;
  using FrgTypeA = GMMA::smem_desc<kMajorA>;
  using FrgTypeB = GMMA::smem_desc<kMajorB>;
  using Shape_MNK = Shape<_64, _80, _16>;
  using ThrID = Layout<_128>;
  using ALayout = GMMA::ABLayout<64, 16>;
  using BLayout = GMMA::ABLayout<80, 16>;
  using CLayout = GMMA::CLayout_64xN<80>;
  GMMA::ScaleOut accumulate_ = GMMA::ScaleOut::One;
};
}  // namespace cute
