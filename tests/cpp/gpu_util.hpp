// Helpers of the C++ GPU tests: poisoned, padded device buffers with host mirrors, and why GPU
// tests cannot run here.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "flashcute/host/api.hpp"
#include "reference.hpp"

namespace fctest {

using flashcute::DType;

#define ASSERT_CUDA(expr)                                                                         \
  do {                                                                                            \
    cudaError_t err_ = (expr);                                                                    \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorName(err_) << " " << cudaGetErrorString(err_); \
  } while (0)

constexpr uint16_t kPoison16 = 0xffff;  // NaN in both fp16 and bf16
constexpr int kHeadPad = 8;             // poisoned elements after each head's head_dim columns
constexpr int64_t kTail = 256;          // poisoned elements after each tensor

// Why GPU tests cannot run here, or "" when they can.
std::string no_gpu_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device: cudaGetDeviceCount returned 0";
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "cudaGetDeviceProperties failed";
  if (prop.major < 8) return std::string(prop.name) + " is older than sm80";
  return "";
}

// Where a (batch, seqlen, heads, head_dim) tensor's elements live in its buffer.
struct View {
  int64_t offset = 0, batch_stride = 0, row_stride = 0, head_stride = 0;
  int64_t at(int b, int s, int h, int d) const { return offset + b * batch_stride + s * row_stride + h * head_stride + d; }
};

View padded_view(int seqlen, int heads, int head_dim) {
  View v;
  v.head_stride = head_dim + kHeadPad;
  v.row_stride = heads * v.head_stride;
  v.batch_stride = seqlen * v.row_stride;
  return v;
}

// A device buffer of 16-bit elements with a host mirror.
struct Buffer {
  std::vector<uint16_t> host;
  void* dev = nullptr;
  explicit Buffer(int64_t n) : host(size_t(n), kPoison16) { (void)cudaMalloc(&dev, size_t(n) * 2); }
  ~Buffer() { cudaFree(dev); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  cudaError_t upload() { return cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice); }
  cudaError_t download() { return cudaMemcpy(host.data(), dev, host.size() * 2, cudaMemcpyDeviceToHost); }
};

// Fills the view's elements with N(0, 1) values rounded to dtype; the rest stays poisoned.
void fill(Buffer& buf, const View& v, int batch, int seqlen, int heads, int head_dim, DType dtype, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < seqlen; ++s)
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < head_dim; ++d) buf.host[size_t(v.at(b, s, h, d))] = fctest::from_float(normal(rng), dtype);
}

flashcute::TensorRef ref_of(const Buffer& buf, const View& v, DType dt, int b, int s, int h, int d) {
  return flashcute::tensor_ref(static_cast<const uint16_t*>(buf.dev) + v.offset, dt, {b, s, h, d},
                               {v.batch_stride, v.row_stride, v.head_stride, 1});
}

}  // namespace fctest
