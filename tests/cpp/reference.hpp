// The CPU reference attention and tolerance rule of the C++ GPU tests: the same rule as the
// Python package's flashcute.testing (the module docstring there says it in full):
//
//   max |out - ref| <= 2 * max |naive - ref| + 1e-5     (lse: + 1e-3, rows that see a key)
//
// where ref is computed in double and naive rounds to the input dtype what attention computed in
// that dtype would: q * scale, the scores, the softcapped scores, the probabilities, the output. A row
// that sees no key has out = 0 and lse = -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "flashcute/common/types.hpp"

namespace fctest {

constexpr double kOutAtol = 1e-5;
constexpr double kLseAtol = 1e-3;

inline double tolerance(double naive_err, double atol) { return 2 * naive_err + atol; }

inline float to_float(uint16_t bits, flashcute::DType dtype) {
  if (dtype == flashcute::DType::kFloat16) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

inline uint16_t from_float(float x, flashcute::DType dtype) {
  if (dtype == flashcute::DType::kFloat16) return __half_raw(__float2half_rn(x)).x;
  return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
}

struct Problem {
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  float scale = 0.f;
};

// out (batch, seqlen_q, nheads, head_dim) and lse (batch, nheads, seqlen_q), row-major.
struct Attention {
  std::vector<double> out, lse;
};

// q(b, s, h, d), k(b, s, h, d), v(b, s, h, d): element accessors. round_to: nullptr for the
// double reference, else the input dtype of the naive low-precision attention.
using Get = std::function<float(int, int, int, int)>;

inline Attention attention(const Problem& p, const Get& q, const Get& k, const Get& v, const flashcute::DType* round_to) {
  auto rnd = [&](double x) { return round_to ? double(to_float(from_float(float(x), *round_to), *round_to)) : x; };
  const int group = p.nheads / p.nheads_k;
  const int window_right = p.causal ? 0 : p.window_right;
  Attention a;
  a.out.assign(size_t(p.batch) * p.seqlen_q * p.nheads * p.head_dim, 0.0);
  a.lse.assign(size_t(p.batch) * p.nheads * p.seqlen_q, -INFINITY);
  std::vector<double> scores(p.seqlen_k), acc(p.head_dim);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.nheads; ++h)
      for (int i = 0; i < p.seqlen_q; ++i) {
        const int diag = i + p.seqlen_k - p.seqlen_q;
        const int lo = std::max(0, p.window_left >= 0 ? diag - p.window_left : 0);
        const int hi = std::min(p.seqlen_k - 1, window_right >= 0 ? diag + window_right : p.seqlen_k - 1);
        if (lo > hi) continue;  // sees no key
        double max_score = -INFINITY;
        for (int j = lo; j <= hi; ++j) {
          double s = 0;
          for (int d = 0; d < p.head_dim; ++d) s += rnd(double(q(b, i, h, d)) * p.scale) * k(b, j, h / group, d);
          s = rnd(s);
          if (p.softcap > 0.f) s = rnd(p.softcap * std::tanh(s / p.softcap));
          scores[j] = s;
          max_score = std::max(max_score, s);
        }
        double sum = 0;
        for (int j = lo; j <= hi; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = lo; j <= hi; ++j) {
          const double pj = rnd(scores[j] / sum);
          for (int d = 0; d < p.head_dim; ++d) acc[d] += pj * v(b, j, h / group, d);
        }
        double* o = &a.out[((size_t(b) * p.seqlen_q + i) * p.nheads + h) * p.head_dim];
        for (int d = 0; d < p.head_dim; ++d) o[d] = rnd(acc[d]);
        a.lse[(size_t(b) * p.nheads + h) * p.seqlen_q + i] = max_score + std::log(sum);
      }
  return a;
}

}  // namespace fctest
