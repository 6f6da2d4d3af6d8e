// flashcute/sm90/launch_bwd.hpp: host-side launch of the sm90a backward (three kernels in stream
// order, traits_bwd.hpp and kernel_bwd.hpp).
//
// Defines sm90::launch_bwd<dtype, head dim>, which common/launch.hpp declares; a generated
// translation unit, compiled for sm_90a only, instantiates one. Preconditions: what plan_bwd
// guarantees, sm90_bwd_can_run(params) (host/sm90_rules.hpp), and params.dsum pointing at
// bwd_workspace_floats(batch, nheads, seqlen_q, kHeadDim) floats (a varlen batch:
// bwd_varlen_workspace_floats(batch, nheads, total_q, kHeadDim)), 16-byte aligned. Reads no
// device memory on the host and enqueues only kernels: a launch can be captured into a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "flashcute/common/launch.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/pdl.hpp"
#include "flashcute/common/status.hpp"
#include "flashcute/sm90/kernel_bwd.hpp"
#include "flashcute/sm90/tma.hpp"
#include "flashcute/sm90/traits_bwd.hpp"

namespace flashcute::sm90 {

// The preprocess (kernel_bwd.hpp) over a call's padded rows. At d <= 64 the blocks with no exact-D
// row run on the lean kernel, the others (a causal call's first, a narrow window's all) on the one
// with the exact pass: for a fixed-length call the host splits the blocks (bwd_exact_blocks), for a
// varlen batch whose entries have few of them (bwd_varlen_few_exact_blocks) the kernels do, per
// entry. Other varlen batches, and larger head dims, run every block on the latter (the lean
// kernel measured no faster at d 128: perf-notes, b26).
template <class Element, int kHeadDim>
Status launch_bwd_preprocess(const BwdParams& p, float* dpsum, float* lse2, float* dq_accum, int* dq_semaphore,
                             int* tile_counter, int64_t padded, cudaStream_t stream) {
  const int blocks = int(bwd_padded_rows(p.seqlen_q) / 64);
  auto launch = [&](auto exact, int count, BwdPreBlocks which) {
    const dim3 grid(unsigned(count), unsigned(p.nheads), unsigned(p.batch));
    bwd_preprocess_kernel<Element, kHeadDim, decltype(exact)::value>
        <<<grid, 256, 0, stream>>>(p, which, dpsum, lse2, dq_accum, dq_semaphore, tile_counter, padded);
  };
  if constexpr (kHeadDim <= 64) {
    if (bwd_varlen_few_exact_blocks(p, kExactDsumKeys)) {
      launch(std::false_type{}, blocks, BwdPreBlocks::all());
      const int pairs = p.batch * p.nheads, ctas = std::max(1, std::min(pairs, 2 * std::max(1, device_sms())));
      bwd_preprocess_exact_kernel<Element, kHeadDim>
          <<<ctas, 256, 0, stream>>>(p, dpsum, lse2, dq_accum, dq_semaphore, padded);
    } else if (p.cu_seqlens_q == nullptr) {
      const BwdExactBlocks exact = bwd_exact_blocks(p, blocks, kExactDsumKeys);
      if (exact.post > exact.pre) launch(std::false_type{}, exact.post - exact.pre, BwdPreBlocks{0, exact.pre});
      if (exact.pre > 0 || exact.post < blocks)
        launch(std::true_type{}, exact.pre + blocks - exact.post, BwdPreBlocks{exact.pre, exact.post});
    } else {
      launch(std::true_type{}, blocks, BwdPreBlocks::all());
    }
    FLASHCUTE_CUDA_CHECK(cudaGetLastError());
    return Status::success();
  }
  launch(std::true_type{}, blocks, BwdPreBlocks::all());
  FLASHCUTE_CUDA_CHECK(cudaGetLastError());
  return Status::success();
}

// The three kernels of one config (BwdTraits); launch_bwd picks the tile table's.
template <class Traits>
Status launch_bwd_with(const BwdParams& params, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  using namespace cute;
  if (Status st = tma_encoder_available(); !st.ok()) return st;
  const BwdParams& p = params;
  const bool varlen = p.cu_seqlens_q != nullptr;
  // The workspace's rows a head (BwdKernelParams); the grids cover the longest entry.
  const int64_t padded = varlen ? bwd_varlen_padded_rows(p.total_q, p.batch) : bwd_padded_rows(p.seqlen_q);
  const int64_t rows = (varlen ? 1 : p.batch) * p.nheads * padded;
  float* dpsum = p.dsum;
  float* lse2 = p.dsum + rows;
  float* dq_accum = p.dsum + 2 * rows;
  int* dq_semaphore =
      p.deterministic ? reinterpret_cast<int*>(dq_accum + bwd_dq_counts_offset(rows, kHeadDim)) : nullptr;
  int* tile_counter = reinterpret_cast<int*>(dq_accum + bwd_tile_counter_offset(rows, kHeadDim));
  if (Status st = launch_bwd_preprocess<Element, kHeadDim>(p, dpsum, lse2, dq_accum, dq_semaphore, tile_counter,
                                                           padded, stream);
      !st.ok())
    return st;

  // (rows, d, heads, batch) as bwd_tma_shape has them: varlen (total, d, heads, 1).
  auto gmem = [&](const void* ptr, bool keys, int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
    return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), bwd_tma_shape(p, keys),
                       make_stride(tma_stride(row_stride), _1{}, tma_stride(head_stride), tma_stride(batch_stride)));
  };
  auto q = gmem(p.q, false, p.q_row_stride, p.q_head_stride, p.q_batch_stride);  // (Sq,d,H,B)
  auto dout = gmem(p.dout, false, p.do_row_stride, p.do_head_stride, p.do_batch_stride);
  auto k = gmem(p.k, true, p.k_row_stride, p.k_head_stride, p.k_batch_stride);  // (Sk,d,Hk,B)
  auto v = gmem(p.v, true, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
  const dim3 grid(unsigned((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN), unsigned(p.nheads_k),
                  unsigned(p.batch));
  // Deterministic calls without a mask walk rotated (BwdTile) where the config does: a CTA then
  // also waits for key blocks launched after it, so only where an entry's key blocks (grid.x at
  // most) fit on half the SMs at once, one CTA an SM, even beside another stream's kernels.
  const bool rotate = Traits::kConfig.rotate && p.deterministic && int(grid.x) <= device_sms() / 2;
  const BwdKernelParams<Traits> kp{
      p,
      dpsum,
      lse2,
      dq_accum,
      dq_semaphore,
      padded,
      make_tma_copy(SM90_TMA_LOAD{}, q, take<0, 2>(typename Traits::SmemLayoutQ{})),
      make_tma_copy(SM90_TMA_LOAD{}, dout, take<0, 2>(typename Traits::SmemLayoutQ{})),
      make_tma_copy(SM90_TMA_LOAD{}, k, typename Traits::SmemLayoutK{}),
      make_tma_copy(SM90_TMA_LOAD{}, v, typename Traits::SmemLayoutK{}),
      rotate,
      tile_counter,
  };
  constexpr int kSmem = Traits::kSmemBytes;
  // Each a dependent of the kernel before it (common/pdl.hpp), which hides its launch.
  // persistent: a CTA an SM (at most one a tile) over the tiles of the grid a CTA a tile would have.
  constexpr auto kernel = [] {
    if constexpr (Traits::kPersistent)
      return &bwd_kernel_persistent<Traits>;
    else
      return &bwd_kernel<Traits>;
  }();
  const int tiles = int(grid.x * grid.y * grid.z);
  const dim3 ctas = Traits::kPersistent ? dim3(unsigned(std::max(1, std::min(tiles, device_sms())))) : grid;
  if (Status st = allow_smem<kernel>(kSmem); !st.ok()) return st;
  FLASHCUTE_CUDA_CHECK((launch_dependent<kernel>(ctas, dim3(Traits::kNThreads), kSmem, stream, kp)));
  const dim3 grid_blocks(unsigned(bwd_padded_rows(p.seqlen_q) / Traits::kBlockM), unsigned(p.nheads),
                         unsigned(p.batch));
  FLASHCUTE_CUDA_CHECK((launch_dependent<&bwd_postprocess_kernel<Traits>>(grid_blocks, dim3(Traits::kMmaThreads), 0,
                                                                          stream, p, (const float*)dq_accum, padded)));
  return Status::success();
}

template <DType kDType, int kHeadDim>
Status launch_bwd(const BwdParams& params, cudaStream_t stream) {
  static_assert(has_bwd_config(kHeadDim), "no sm90 backward config for this head dim (traits_bwd.hpp)");
  return launch_bwd_with<BwdTraitsFor<kDType, default_bwd_config(kHeadDim)>>(params, stream);
}

}  // namespace flashcute::sm90
