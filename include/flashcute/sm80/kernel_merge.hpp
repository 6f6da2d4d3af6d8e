// flashcute/sm80/kernel_merge.hpp: merge_attn_states, the exact merge of two partial attentions
// by their logsumexp (MergeParams in common/params.hpp). Memory-bound and elementwise: one warp
// per (batch, row, head), its lanes over the head dim. Plain CUDA, any GPU flashcute runs on.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "flashcute/common/params.hpp"
#include "flashcute/common/status.hpp"
#include "flashcute/common/types.hpp"

namespace flashcute::sm80 {

namespace merge_detail {

template <class T>
__device__ float to_f32(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else return __bfloat162float(x);
}

template <class T>
__device__ T from_f32(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return __float2bfloat16_rn(x);
}

constexpr int kWarpsPerCta = 8;

template <class T>
__global__ void __launch_bounds__(32 * kWarpsPerCta) merge_kernel(__grid_constant__ const MergeParams p) {
  const int64_t rows = int64_t(p.batch) * p.seqlen * p.nheads;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int h = int(row % p.nheads);
  const int s = int(row / p.nheads % p.seqlen);
  const int b = int(row / (int64_t(p.nheads) * p.seqlen));
  auto lse_at = [&](const int64_t* st) { return b * st[0] + h * st[1] + s * st[2]; };
  auto out_at = [&](const int64_t* st) { return b * st[0] + s * st[1] + h * st[2]; };
  const float la = p.lse_a[lse_at(p.lse_a_stride)];
  const float lb = p.lse_b[lse_at(p.lse_b_stride)];
  // Around the larger lse, so neither exponential overflows. Both -inf (no key on either side):
  // out = 0 and lse = -inf. A NaN in either stays NaN in both results.
  const float m = la > lb ? la : lb;
  float wa = 0.f, wb = 0.f, lse = -INFINITY;
  if (m != -INFINITY || la != la || lb != lb) {
    wa = expf(la - m);
    wb = expf(lb - m);
    const float sum = wa + wb;
    lse = m + logf(sum);
    wa /= sum;
    wb /= sum;
  }
  const T* a = static_cast<const T*>(p.out_a) + out_at(p.a_stride);
  const T* bb = static_cast<const T*>(p.out_b) + out_at(p.b_stride);
  T* o = static_cast<T*>(p.out) + out_at(p.out_stride);
  // Each lane reads its elements of a and b before it writes them to o: in place (o == a) is safe.
  for (int c = lane; c < p.head_dim; c += 32) o[c] = from_f32<T>(wa * to_f32(a[c]) + wb * to_f32(bb[c]));
  __syncwarp();  // every lane has read lse_a / lse_b before lane 0 overwrites them (lse may alias)
  if (lane == 0) p.lse[lse_at(p.lse_stride)] = lse;
}

}  // namespace merge_detail

// Launches the merge for out's dtype (float16, bfloat16 or float32) on `stream`.
template <int kUnused>
Status launch_merge(const MergeParams& p, DType dtype, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.seqlen * p.nheads;
  if (rows == 0) return Status::success();
  const int64_t ctas = (rows + merge_detail::kWarpsPerCta - 1) / merge_detail::kWarpsPerCta;
  if (ctas > 0x7fffffff) return Status::invalid_argument("out_a", "fewer than 2^34 rows", std::to_string(rows));
  const dim3 grid{unsigned(ctas)}, block{32 * merge_detail::kWarpsPerCta};
  switch (dtype) {
    case DType::kFloat16: merge_detail::merge_kernel<__half><<<grid, block, 0, stream>>>(p); break;
    case DType::kBFloat16: merge_detail::merge_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(p); break;
    case DType::kFloat32: merge_detail::merge_kernel<float><<<grid, block, 0, stream>>>(p); break;
    default: return Status::invalid_type("out_a", "a float16, bfloat16 or float32 array", dtype_name(dtype));
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? Status::success() : Status::cuda(err, "merge_kernel<<<...>>>");
}

}  // namespace flashcute::sm80
