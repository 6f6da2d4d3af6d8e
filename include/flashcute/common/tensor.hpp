// flashcute/common/tensor.hpp: a strided array as the host API sees it.
//
// Every caller describes its arrays this way: the nanobind module from DLPack, the XLA FFI
// handler from XLA's buffers, C++ users from their own pointers. Validation (host/validate_fwd.hpp)
// then checks one description, whoever made it.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "flashcute/common/types.hpp"

namespace flashcute {

// An array that flashcute only reads.
struct TensorRef {
  static constexpr int kMaxRank = 8;

  const void* data = nullptr;
  DType dtype = DType::kOther;
  const char* dtype_label = nullptr;  // the caller's name for a kOther dtype ("int8"), for messages
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};  // in elements

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank && i < kMaxRank; ++i) n *= shape[i];
    return n;
  }
  const char* dtype_str() const { return dtype == DType::kOther && dtype_label ? dtype_label : dtype_name(dtype); }
};

// An array that flashcute writes. Only made from a non-const pointer.
struct MutableTensorRef : TensorRef {
  void* mutable_data() const { return const_cast<void*>(data); }  // it was a void* when made
};

namespace detail {
template <class Ref, class Ptr>
Ref make_ref(Ptr data, DType dtype, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride) {
  Ref t;
  t.data = data;
  t.dtype = dtype;
  t.rank = int(shape.size()) < TensorRef::kMaxRank ? int(shape.size()) : TensorRef::kMaxRank;
  int i = 0;
  for (int64_t s : shape) {
    if (i < t.rank) t.shape[i] = s;
    ++i;
  }
  if (stride.size() == 0) {  // contiguous, row-major
    int64_t st = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      t.stride[d] = st;
      st *= t.shape[d];
    }
  } else {
    i = 0;
    for (int64_t s : stride) {
      if (i < t.rank) t.stride[i] = s;
      ++i;
    }
  }
  return t;
}
}  // namespace detail

// A read-only array; `stride` in elements, empty for contiguous row-major.
inline TensorRef tensor_ref(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> stride = {}) {
  return detail::make_ref<TensorRef>(data, dtype, shape, stride);
}

// A writable array; `stride` in elements, empty for contiguous row-major.
inline MutableTensorRef mutable_tensor_ref(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                           std::initializer_list<int64_t> stride = {}) {
  return detail::make_ref<MutableTensorRef>(data, dtype, shape, stride);
}

}  // namespace flashcute
