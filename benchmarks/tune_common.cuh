// Helpers of the tuning tools (tune_fwd.cu, tune_bwd*.cu): a CUDA check that exits, bf16 random
// fills and a max |a - b| reduction, all on the device.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cutlass/numeric_types.h>

#define CHECK_CUDA(expr)                                                                        \
  do {                                                                                          \
    cudaError_t err_ = (expr);                                                                  \
    if (err_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(err_), __FILE__, __LINE__); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

using Element = cutlass::bfloat16_t;

__global__ void fill_random(Element* x, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    x[i] = Element(float(h & 0xffff) / 32768.f - 1.f);  // uniform in [-1, 1)
  }
}

__global__ void max_abs_diff(const Element* a, const Element* b, size_t n, float* out) {
  float m = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float d = fabsf(float(a[i]) - float(b[i]));
    m = (d != d) ? INFINITY : fmaxf(m, d);
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));  // non-negative floats order as ints
}
