// flashcute/sm80/kernel_kvcache.hpp: the two small kernels around a KV-cache attention.
//
// - append_kv: writes the new keys and values into the cache, in place, at cache_seqlens[b]
//   (contiguous or paged), before the attention reads them.
// - combine: merges the num_splits float32 partials of a split-KV attention into out and lse by
//   their lse (merge_attn_states generalised to n parts).
// Both are memory-bound and elementwise, plain CUDA for any GPU flashcute runs on, and generic in
// the dtype: src/kvcache.cu instantiates them once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "flashcute/common/merge.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/pdl.hpp"
#include "flashcute/common/seqlen.hpp"
#include "flashcute/common/status.hpp"
#include "flashcute/common/types.hpp"

namespace flashcute::sm80 {

// The most split-KV partials one call may have: the combine kernel keeps one lse per split in
// four registers per lane.
inline constexpr int kMaxSplits = 128;

namespace kvcache_detail {

constexpr int kWarpsPerCta = 8;

// One warp per new row (b, i, kv head); each lane moves 16-byte chunks (8 elements of a 2-byte
// dtype, so the kernel does not depend on which one). The destination row is cache_seqlens[b] + i;
// one outside [0, seqlen_k), or on a page outside the cache, is dropped, so no value of
// cache_seqlens or block_table moves a write off the cache.
__global__ void __launch_bounds__(32 * kWarpsPerCta)
    append_kv_kernel(__grid_constant__ const FwdParams p, __grid_constant__ const AppendKvParams a) {
  allow_dependents();  // the attention after it waits for the whole append (sm80/kernel_fwd.hpp)
  const int64_t rows = int64_t(p.batch) * p.seqlen_new * p.nheads_k;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (row >= rows) return;
  const int h = int(row % p.nheads_k);
  const int i = int(row / p.nheads_k % p.seqlen_new);
  const int b = int(row / (int64_t(p.nheads_k) * p.seqlen_new));
  const int64_t key = int64_t(p.cache_seqlens[b]) + i;
  if (key < 0 || key >= p.seqlen_k) return;
  int64_t k_row, v_row;
  if (p.block_table != nullptr) {
    const PagedKv pages(p, b);
    const int page = pages.page_of(int(key));
    if (!pages.valid(page)) return;
    k_row = pages.offset(page, int(key), p.k_batch_stride, p.k_row_stride);
    v_row = pages.offset(page, int(key), p.v_batch_stride, p.v_row_stride);
  } else {
    k_row = b * p.k_batch_stride + key * p.k_row_stride;
    v_row = b * p.v_batch_stride + key * p.v_row_stride;
  }
  auto* k = reinterpret_cast<uint4*>(static_cast<uint16_t*>(const_cast<void*>(p.k)) + k_row + h * p.k_head_stride);
  auto* v = reinterpret_cast<uint4*>(static_cast<uint16_t*>(const_cast<void*>(p.v)) + v_row + h * p.v_head_stride);
  const auto* kn = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.k_new) + b * a.kn_batch_stride +
                                                  i * a.kn_row_stride + h * a.kn_head_stride);
  const auto* vn = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.v_new) + b * a.vn_batch_stride +
                                                  i * a.vn_row_stride + h * a.vn_head_stride);
  for (int c = threadIdx.x % 32; c < p.head_dim / 8; c += 32) {
    k[c] = kn[c];
    v[c] = vn[c];
  }
}

template <class T>
__device__ void store4(T* dst, float4 x) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 lo = __floats2half2_rn(x.x, x.y), hi = __floats2half2_rn(x.z, x.w);
    *reinterpret_cast<uint2*>(dst) = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  } else {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    *reinterpret_cast<uint2*>(dst) = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
}

// One warp per output row (b, h, s). Lane l holds the lse of splits l, l + 32, ...; the warp
// reduces their max and sum, then each lane accumulates 4 columns at a time over the splits, in
// split order.
// Empty splits have lse = -inf and weigh 0; a row no split saw gets out = 0 and lse = -inf; a row
// with a NaN partial gets NaN.
// Launched as a dependent of the split-KV kernel (common/pdl.hpp): it reads nothing before
// wait_for_primary().
template <class T>
__global__ void __launch_bounds__(32 * kWarpsPerCta) combine_kernel(__grid_constant__ const FwdParams p) {
  constexpr int kSlots = kMaxSplits / 32;
  // kChunk splits' partials are loaded before any is added, so that their loads are in flight
  // together; the first chunk's go out with the lse loads, so up to 16 splits (what a batch-1
  // decode picks) cost one round trip to L2, not three.
  constexpr int kChunk = 16;
  static_assert(32 % kChunk == 0, "a chunk's splits share one lse slot");
  const int64_t rows = int64_t(p.batch) * p.nheads * p.seqlen_q;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;  // ((b, h), s) like lse_accum
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int s = int(row % p.seqlen_q);
  const int h = int(row / p.seqlen_q % p.nheads);
  const int b = int(row / (int64_t(p.seqlen_q) * p.nheads));
  const int64_t split_stride = rows;  // lse_accum is (num_splits, batch, nheads, seqlen_q)
  wait_for_primary();

  // x: splits first .. first + kChunk - 1 of columns c .. c + 3 (zeros past num_splits or head_dim).
  float4 x[kChunk];
  auto load_chunk = [&](int first, int c) {
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const int split = first + u;
      x[u] = c < p.head_dim && split < p.num_splits
                 ? *reinterpret_cast<const float4*>(p.o_accum + (split * split_stride + row) * p.head_dim + c)
                 : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  load_chunk(0, lane * 4);

  float lse_part[kSlots];
  float max_lse = -INFINITY;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const int split = j * 32 + lane;
    lse_part[j] = split < p.num_splits ? p.lse_accum[split * split_stride + row] : -INFINITY;
    max_lse = max_nan(max_lse, lse_part[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) max_lse = max_nan(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, o));
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) sum += max_lse == -INFINITY ? 0.f : expf(lse_part[j] - max_lse);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float lse = max_lse == -INFINITY ? -INFINITY : max_lse + logf(sum);
  // Each split's weight, e^(lse_split - lse); 0 for empty splits and for an empty row.
#pragma unroll
  for (int j = 0; j < kSlots; ++j) lse_part[j] = lse == -INFINITY ? 0.f : expf(lse_part[j] - lse);

  T* out = static_cast<T*>(p.o) + b * p.o_batch_stride + s * p.o_row_stride + h * p.o_head_stride;
  // Every lane runs every pass, so that each shuffle has the whole warp; lanes past head_dim
  // (lane 16 on at d 64) only serve the shuffles.
  for (int c0 = 0; c0 < p.head_dim; c0 += 128) {
    const int c = c0 + lane * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    // The weights of splits first .. first + 31 in slot 0, shifted down a slot every 32 splits
    // (a static shift: an indexed slot would put the array in local memory).
    float slots[kSlots];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) slots[j] = lse_part[j];
    for (int first = 0; first < p.num_splits; first += kChunk) {
      if (c0 > 0 || first > 0) load_chunk(first, c);  // the first chunk is in x already
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        const float w = __shfl_sync(0xffffffffu, slots[0], (first + u) % 32);
        if (first + u < p.num_splits)
          acc.x += w * x[u].x, acc.y += w * x[u].y, acc.z += w * x[u].z, acc.w += w * x[u].w;
      }
      if ((first + kChunk) % 32 == 0) {
#pragma unroll
        for (int j = 0; j + 1 < kSlots; ++j) slots[j] = slots[j + 1];
      }
    }
    if (c < p.head_dim) store4(out + c, acc);
  }
  if (lane == 0 && p.lse != nullptr) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + s] = lse;
}

}  // namespace kvcache_detail

// Appends a.k_new / a.v_new into the cache p describes (p.k, p.v, cache_seqlens, seqlen_new).
template <int kUnused>
Status launch_append_kv(const FwdParams& p, const AppendKvParams& a, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.seqlen_new * p.nheads_k;
  if (rows == 0) return Status::success();
  const dim3 grid{unsigned((rows + kvcache_detail::kWarpsPerCta - 1) / kvcache_detail::kWarpsPerCta)};
  kvcache_detail::append_kv_kernel<<<grid, 32 * kvcache_detail::kWarpsPerCta, 0, stream>>>(p, a);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? Status::success() : Status::cuda(err, "append_kv_kernel<<<...>>>");
}

// Merges p.num_splits partials (p.o_accum, p.lse_accum) into p.o (dtype) and p.lse.
template <int kUnused>
Status launch_combine(const FwdParams& p, DType dtype, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.nheads * p.seqlen_q;
  if (rows == 0) return Status::success();
  const dim3 grid{unsigned((rows + kvcache_detail::kWarpsPerCta - 1) / kvcache_detail::kWarpsPerCta)};
  const dim3 block{32 * kvcache_detail::kWarpsPerCta};
  const cudaError_t err = dtype == DType::kFloat16
                              ? launch_dependent<kvcache_detail::combine_kernel<__half>>(grid, block, 0, stream, p)
                              : launch_dependent<kvcache_detail::combine_kernel<__nv_bfloat16>>(grid, block, 0, stream, p);
  if (err != cudaSuccess) (void)cudaGetLastError();  // the launch's error is returned, not left behind
  return err == cudaSuccess ? Status::success() : Status::cuda(err, "combine_kernel<<<...>>>");
}

}  // namespace flashcute::sm80
