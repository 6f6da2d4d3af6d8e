// flashcute/sm90/launch_fwd.hpp: host-side launch of one sm90a forward kernel.
//
// Defines sm90::launch_fwd<dtype, head dim>, which host/kernels.hpp declares; a generated
// translation unit, compiled for sm_90a only, includes this header and instantiates one. The TMA
// descriptors are encoded here, on the host, from the params (cuTensorMapEncodeTiled, reached
// through the runtime's driver entry point: nothing links libcuda), and travel to the kernel as
// __grid_constant__ parameters. Encoding reads no device memory and enqueues nothing, so a launch
// can be captured into a CUDA graph. host/sm90_rules.hpp (sm90_can_run) has checked what TMA
// needs: 16-byte aligned bases and strides, no zero stride, at least one key.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashcute/common/launch.hpp"
#include "flashcute/common/mask.hpp"
#include "flashcute/common/params.hpp"
#include "flashcute/common/status.hpp"
#include "flashcute/sm90/config.hpp"
#include "flashcute/sm90/kernel_fwd.hpp"
#include "flashcute/sm90/scheduler.hpp"
#include "flashcute/sm90/tma.hpp"

namespace flashcute::sm90 {

template <class Traits>
FwdKernelParams<Traits> make_kernel_params(const FwdParams& p, TileSchedule schedule) {
  using namespace cute;
  using Element = typename Traits::Element;
  const FwdTmaExtents ext = fwd_tma_extents<Traits::kVarlen>(p);  // varlen: (total_q / total_k rows, 1 batch)
  auto q = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.q)),
                       make_shape(ext.rows_q, p.head_dim, p.nheads, ext.batches),
                       make_stride(tma_stride(p.q_row_stride), _1{}, tma_stride(p.q_head_stride),
                                   tma_stride(p.q_batch_stride)));  // (Sq,d,H,B)
  // A KV cache's K and V: (rows, d, Hk, pages), a page being a batch entry of a contiguous cache
  // (k_batch_stride apart) or one of num_pages of a paged one (k_batch_stride: the page stride).
  int rows_k = ext.rows_k, batches_k = ext.batches;
  if constexpr (Traits::kKvcache) {
    if (p.block_table != nullptr) rows_k = 1 << p.page_size_log2, batches_k = p.num_pages;
  }
  auto k = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k)),
                       make_shape(rows_k, p.head_dim, p.nheads_k, batches_k),
                       make_stride(tma_stride(p.k_row_stride), _1{}, tma_stride(p.k_head_stride),
                                   tma_stride(p.k_batch_stride)));  // (Sk,d,Hk,B)
  auto vt = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.v)),
                        make_shape(p.head_dim, rows_k, p.nheads_k, batches_k),
                        make_stride(_1{}, tma_stride(p.v_row_stride), tma_stride(p.v_head_stride),
                                    tma_stride(p.v_batch_stride)));  // (d,Sk,Hk,B)
  FwdKernelParams<Traits> kp{
      p,
      schedule,
      make_tma_copy(SM90_TMA_LOAD{}, q, take<0, 2>(typename Traits::SmemLayoutQ{})),
      make_tma_copy(SM90_TMA_LOAD{}, k, take<0, 2>(typename Traits::SmemLayoutK{})),
      make_tma_copy(SM90_TMA_LOAD{}, vt, take<0, 2>(typename Traits::SmemLayoutVt{})),
      FastDivmod(p.nheads),
      {},
      {},
      {},
      {},
  };
  if constexpr (Traits::kKvcache) {
    kp.tma_k_box = make_tma_copy(SM90_TMA_LOAD{}, k, typename Traits::SmemLayoutKBox{});
    kp.tma_v_box = make_tma_copy(SM90_TMA_LOAD{}, vt, typename Traits::SmemLayoutVtBox{});
    if constexpr (Traits::kMidBoxRows > 0) {
      kp.tma_k_mid = make_tma_copy(SM90_TMA_LOAD{}, k, typename Traits::template SmemLayoutKRows<Traits::kMidBoxRows>{});
      kp.tma_v_mid = make_tma_copy(SM90_TMA_LOAD{}, vt, typename Traits::template SmemLayoutVtRows<Traits::kMidBoxRows>{});
    }
  }
  return kp;
}

// Launches the kernel built from any FwdTraits. Preconditions: what plan_fwd guarantees, and
// sm90_can_run(params).
template <class Traits>
Status launch_fwd_with(const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmem = Traits::kSmemBytes;
  constexpr auto kernel = &fwd_kernel<Traits>;
  if (Status st = allow_smem<kernel>(kSmem); !st.ok()) return st;
  if (Status st = tma_encoder_available(); !st.ok()) return st;
  // Where the units of work cost the same (no mask: tiles; causal: pairs of tiles) one persistent
  // CTA per SM walks them, and its producer loads the next tile's Q and first keys while the
  // consumers finish the last; with causal pairs the last units may be dealt tile by tile
  // (scheduler.hpp). Window tiles differ in length: one CTA each, heaviest first, balanced by the
  // hardware.
  const bool causal = params.window_left < 0 && params.window_right == 0;
  const unsigned m_blocks = unsigned((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM);
  const unsigned heads_batch = unsigned(params.nheads) * unsigned(params.batch);
  const unsigned units = (causal ? (m_blocks + 1) / 2 : m_blocks) * heads_batch;
  TileSchedule schedule = make_tile_schedule(causal, m_blocks, heads_batch, units);  // one CTA per unit
  if constexpr (Traits::kFwdMode == FwdMode::kVarlenMixed) {
    // The units of the sequences that exist (at most `units`), one persistent CTA per SM
    // (TileScheduler::at_varlen), windows too; no tail.
    const int sms = device_sms();
    if (sms > 0 && units > unsigned(sms)) schedule = make_tile_schedule(causal, m_blocks, heads_batch, unsigned(sms));
  } else if (causal || (params.window_left < 0 && params.window_right < 0)) {
    const int sms = device_sms();
    if (sms > 0) {
      // A query tile's cost: its key blocks, plus one for what a tile costs beyond them (its first
      // softmax and epilogue: about one main-loop step, as ncu put it at d 128 1k).
      const KeyMask mask{params.seqlen_k, params.seqlen_k - params.seqlen_q, params.window_left, params.window_right};
      auto cost = [&](int m_block) {
        const KeyMask::Blocks blocks =
            mask.key_blocks(m_block * Traits::kBlockM, Traits::kBlockM, params.seqlen_q, Traits::kBlockN);
        return double(blocks.last - blocks.first + 1);
      };
      schedule = plan_tile_schedule(causal, m_blocks, heads_batch, unsigned(sms), cost);
      if (schedule.tail_tiles == 0 && units <= unsigned(sms)) schedule = make_tile_schedule(causal, m_blocks, heads_batch, units);
    }
  }
  const FwdKernelParams<Traits> kp = make_kernel_params<Traits>(params, schedule);
  kernel<<<dim3(schedule.ctas), Traits::kNThreads, kSmem, stream>>>(kp);
  FLASHCUTE_CUDA_CHECK(cudaGetLastError());
  return Status::success();
}

// The kernel of the list (flashcute/build_config.hpp): the tile table's config for kHeadDim.
template <DType kDType, int kHeadDim>
Status launch_fwd(const FwdParams& params, cudaStream_t stream) {
  static_assert(validate(default_fwd_config(kHeadDim)) == nullptr, "no valid sm90 config for this head dim");
  return launch_fwd_with<FwdTraits<kDType, default_fwd_config(kHeadDim)>>(params, stream);
}

// The same kernel on the second table's long-sequence config (config.hpp, long_fwd_config), in a
// generated translation unit of its own; host/dispatch.hpp chooses between the two per call.
template <DType kDType, int kHeadDim>
Status launch_fwd_long(const FwdParams& params, cudaStream_t stream) {
  static_assert(has_long_fwd_config(kHeadDim) && validate(long_fwd_config(kHeadDim)) == nullptr,
                "no valid long-sequence sm90 config for this head dim: CMake's _flashcute_sm90_long_head_dims "
                "must list the head dims of sm90::long_fwd_config");
  return launch_fwd_with<FwdTraits<kDType, long_fwd_config(kHeadDim)>>(params, stream);
}

// The same kernel for a variable-length batch (cu_seqlens), on the first table's config, in a
// generated translation unit of its own (sm90_fwd_<dtype>_hdim<d>_varlen); host/dispatch.hpp
// takes it for varlen calls. Where every sequence has max_seqlen_q queries (total_q = batch x
// max_seqlen_q, known on the host), the fixed-length walk over the longest sequence's tiles
// (FwdMode::kVarlen: as fast as the fixed-length call there); else the walk over the units of
// the sequences that exist (kVarlenMixed), which leaves no empty position.
template <DType kDType, int kHeadDim>
Status launch_fwd_varlen(const FwdParams& params, cudaStream_t stream) {
  constexpr FwdConfig kCfg = default_fwd_config(kHeadDim);
  if (int64_t(params.total_q) == int64_t(params.batch) * params.seqlen_q)
    return launch_fwd_with<FwdTraits<kDType, kCfg, FwdMode::kVarlen>>(params, stream);
  return launch_fwd_with<FwdTraits<kDType, kCfg, FwdMode::kVarlenMixed>>(params, stream);
}

// The same kernel over a KV cache, contiguous or paged (cache_seqlens, block_table), on the first
// table's config, in a generated translation unit of its own (sm90_fwd_<dtype>_hdim<d>_kvcache);
// host/dispatch.hpp takes it for KV-cache plans that chose the sm90 path (plan_fwd_kvcache). The
// walk and its costs assume every entry holds the whole capacity (params.seqlen_k).
template <DType kDType, int kHeadDim>
Status launch_fwd_kvcache(const FwdParams& params, cudaStream_t stream) {
  return launch_fwd_with<FwdTraits<kDType, kvcache_fwd_config(kHeadDim), FwdMode::kKvcache>>(params, stream);
}

}  // namespace flashcute::sm90
