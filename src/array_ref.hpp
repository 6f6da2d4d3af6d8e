// src/array_ref.hpp: the one way flashcute._C turns an array into a TensorRef.
//
// Each source describes its arrays differently: nanobind's view of a DLPack capsule, a
// (data_ptr, shape, strides, dtype name) descriptor from the torch fast path, an XLA buffer,
// a tracer's shape. Each has a small helper (in ext_common.hpp and xla_ffi.cpp) that reads its
// own fields and hands them to array_ref(), which alone fills the TensorRef: rank, shape,
// strides (row-major contiguous when the source has none), dtype and its label.
// Needs neither nanobind nor XLA.
#pragma once

#include <cstdint>
#include <cstring>

#include "flashcute/common/tensor.hpp"

namespace flashcute_ext {

// shape[i] and (unless null) strides[i], i < rank, in elements; the label names a dtype flashcute
// has no DType for, for messages, and must outlive the ref.
template <class Ref, class Dim, class Stride = int64_t>
Ref array_ref(const void* data, flashcute::DType dtype, const char* label, int rank, const Dim* shape,
              const Stride* strides = nullptr) {
  Ref r;
  r.data = data;
  r.dtype = dtype;
  r.dtype_label = label;
  r.rank = rank;
  const int n = rank < flashcute::TensorRef::kMaxRank ? rank : flashcute::TensorRef::kMaxRank;
  int64_t contiguous = 1;
  for (int i = n - 1; i >= 0; --i) {
    r.shape[i] = int64_t(shape[i]);
    r.stride[i] = strides ? int64_t(strides[i]) : contiguous;
    contiguous *= r.shape[i] > 1 ? r.shape[i] : 1;
  }
  return r;
}

// The dtype names the Python side uses (numpy's, torch's without "torch.").
inline flashcute::DType dtype_from_name(const char* name) {
  if (std::strcmp(name, "float16") == 0) return flashcute::DType::kFloat16;
  if (std::strcmp(name, "bfloat16") == 0) return flashcute::DType::kBFloat16;
  if (std::strcmp(name, "float32") == 0) return flashcute::DType::kFloat32;
  if (std::strcmp(name, "int32") == 0) return flashcute::DType::kInt32;
  return flashcute::DType::kOther;
}

}  // namespace flashcute_ext
