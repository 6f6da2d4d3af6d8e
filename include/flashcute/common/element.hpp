// flashcute/common/element.hpp: the CUTLASS element type of each DType, for device code.
#pragma once

#include <cutlass/numeric_types.h>

#include "flashcute/common/types.hpp"

namespace flashcute {

template <DType kDType> struct ElementOf;
template <> struct ElementOf<DType::kFloat16> { using type = cutlass::half_t; };
template <> struct ElementOf<DType::kBFloat16> { using type = cutlass::bfloat16_t; };

}  // namespace flashcute
