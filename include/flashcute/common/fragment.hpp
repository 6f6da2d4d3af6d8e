// flashcute/common/fragment.hpp: views and conversions of MMA register fragments.
//
// An m16n8 accumulator fragment holds, per thread, values for 2 rows x 2 columns
// of each atom: ((2,2),MMA_M,MMA_N) with value modes (col pair, row +8). The
// softmax wants rows and columns: ((2,MMA_M),(2,MMA_N)).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace flashcute {

// ((2,2),MMA_M,MMA_N) -> ((2,MMA_M),(2,MMA_N)): (row, col) indexing of an accumulator.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol_layout(Layout const& acc) {
  static_assert(decltype(cute::rank(acc))::value == 3);
  static_assert(decltype(cute::rank<0>(acc))::value == 2);
  return cute::make_layout(cute::make_layout(cute::get<0, 1>(acc), cute::get<1>(acc)),
                           cute::make_layout(cute::get<0, 0>(acc), cute::get<2>(acc)));
}

template <class Tensor>
CUTE_HOST_DEVICE constexpr auto rowcol_view(Tensor&& acc) {
  return cute::make_tensor(acc.data(), rowcol_layout(acc.layout()));
}

// Accumulator ((2,2),MMA_M,MMA_N) -> A operand ((2,2,2),MMA_M,MMA_N/2) of the next
// m16n8k16: two neighbouring n8 accumulator tiles form one k16 A tile, in the
// same register order (row/col pair, row +8, k +8).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_to_a_layout(Layout const& acc) {
  static_assert(decltype(cute::size<0>(acc))::value == 4);
  static_assert(decltype(cute::size<2>(acc))::value % 2 == 0);
  auto split = cute::logical_divide(acc, cute::Shape<cute::Underscore, cute::Underscore, cute::_2>{});  // ((2,2),MMA_M,(2,MMA_N/2))
  return cute::make_layout(cute::make_layout(cute::get<0>(split), cute::get<2, 0>(split)), cute::get<1>(split),
                           cute::get<2, 1>(split));
}

// Element-type conversion of a register fragment into a new owning fragment,
// using the packed converters (cvt.rn.bf16x2.f32 and friends).
template <class To, class Tensor>
CUTE_DEVICE auto convert_fragment(Tensor const& src) {
  using From = typename std::decay_t<Tensor>::value_type;
  constexpr int kN = decltype(cute::size(src))::value;
  auto dst = cute::make_tensor<To>(src.layout());
  cutlass::NumericArrayConverter<To, From, kN> convert;
  *reinterpret_cast<cutlass::Array<To, kN>*>(dst.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, kN> const*>(src.data()));
  return dst;
}

// The same into an existing fragment of the same size (a register buffer that must stay put, such
// as a wgmma operand).
template <class TensorSrc, class TensorDst>
CUTE_DEVICE void convert_fragment_into(TensorSrc const& src, TensorDst& dst) {
  using From = typename std::decay_t<TensorSrc>::value_type;
  using To = typename std::decay_t<TensorDst>::value_type;
  constexpr int kN = decltype(cute::size(src))::value;
  static_assert(decltype(cute::size(dst))::value == kN);
  cutlass::NumericArrayConverter<To, From, kN> convert;
  *reinterpret_cast<cutlass::Array<To, kN>*>(dst.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, kN> const*>(src.data()));
}

}  // namespace flashcute
