// The attention problem a C++ test runs or plans: one type for the host tests (host_util.hpp)
// and the GPU tests (test_fwd_gpu.cu, test_bwd_gpu.cu). Host only; no CUDA.
#pragma once

#include <ostream>
#include <string>

#include "flashcute/common/types.hpp"

namespace fctest {

// Arrays are (batch, seqlen, heads, head_dim); nheads_k < nheads is GQA. The options are
// AttnOptions' (-1: an unbounded window side; softcap 0: none).
struct Case {
  flashcute::DType dtype;
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool packed_qkv = false;  // q, k, v are views of one (batch, seqlen, 3, heads, head_dim) tensor
  bool with_lse = true;

  // A GoogleTest-safe name, e.g. bf16_d64_b2_sq100_sk120_h8k2_causal.
  std::string name() const {
    std::string s = std::string(dtype == flashcute::DType::kFloat16 ? "fp16" : "bf16") + "_d" +
                    std::to_string(head_dim) + "_b" + std::to_string(batch) + "_sq" + std::to_string(seqlen_q) +
                    "_sk" + std::to_string(seqlen_k) + "_h" + std::to_string(nheads) + "k" + std::to_string(nheads_k);
    if (causal) s += "_causal";
    if (window_left >= 0 || window_right >= 0)
      s += "_win" + std::to_string(window_left + 1) + "x" + std::to_string(window_right + 1);
    if (softcap > 0.f) s += "_softcap";
    if (packed_qkv) s += "_packed";
    if (!with_lse) s += "_nolse";
    return s;
  }
};

// GoogleTest prints a failing case's parameter with this (found by argument-dependent lookup).
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

}  // namespace fctest
