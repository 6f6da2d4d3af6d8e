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

constexpr double kGradAtol = 1e-4;

// dq, dk, dv in q's and k's (b, s, h, d) row-major shapes.
struct Gradients {
  std::vector<double> dq, dk, dv;
};

// The gradients of attention(p, q, k, v) for the output gradient dout. round_to: nullptr for the
// double reference; else the naive low-precision backward, which rounds to that dtype what torch
// autograd of the naive attention would (scores, probabilities, dP, dS, the softcap's derivative
// step, and each gradient at the end).
inline Gradients attention_grads(const Problem& p, const Get& q, const Get& k, const Get& v, const Get& dout,
                                 const flashcute::DType* round_to) {
  auto rnd = [&](double x) { return round_to ? double(to_float(from_float(float(x), *round_to), *round_to)) : x; };
  const int group = p.nheads / p.nheads_k;
  const int window_right = p.causal ? 0 : p.window_right;
  const int d_ = p.head_dim;
  Gradients g;
  g.dq.assign(size_t(p.batch) * p.seqlen_q * p.nheads * d_, 0.0);
  g.dk.assign(size_t(p.batch) * p.seqlen_k * p.nheads_k * d_, 0.0);
  g.dv.assign(g.dk.size(), 0.0);
  std::vector<double> scores(p.seqlen_k), tanhs(p.seqlen_k), probs(p.seqlen_k), dps(p.seqlen_k), qs(d_), dq(d_);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.nheads; ++h)
      for (int i = 0; i < p.seqlen_q; ++i) {
        const int hk = h / group;
        const int diag = i + p.seqlen_k - p.seqlen_q;
        const int lo = std::max(0, p.window_left >= 0 ? diag - p.window_left : 0);
        const int hi = std::min(p.seqlen_k - 1, window_right >= 0 ? diag + window_right : p.seqlen_k - 1);
        if (lo > hi) continue;  // sees no key: no gradient
        for (int d = 0; d < d_; ++d) qs[d] = rnd(double(q(b, i, h, d)) * p.scale);
        double max_score = -INFINITY;
        for (int j = lo; j <= hi; ++j) {
          double s = 0;
          for (int d = 0; d < d_; ++d) s += qs[d] * k(b, j, hk, d);
          s = rnd(s);
          if (p.softcap > 0.f) {
            tanhs[j] = std::tanh(s / p.softcap);
            s = rnd(p.softcap * tanhs[j]);
          }
          scores[j] = s;
          max_score = std::max(max_score, s);
        }
        double sum = 0;
        for (int j = lo; j <= hi; ++j) sum += std::exp(scores[j] - max_score);
        double dsum = 0;
        for (int j = lo; j <= hi; ++j) {
          probs[j] = std::exp(scores[j] - max_score) / sum;
          double dp = 0;
          for (int d = 0; d < d_; ++d) dp += double(dout(b, i, h, d)) * v(b, j, hk, d);
          dps[j] = rnd(dp);
          dsum += probs[j] * dps[j];
        }
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int j = lo; j <= hi; ++j) {
          double ds = rnd(probs[j] * (dps[j] - dsum));
          if (p.softcap > 0.f) ds = rnd(ds * (1 - tanhs[j] * tanhs[j]));
          const double pj = rnd(probs[j]);
          double* dk = &g.dk[((size_t(b) * p.seqlen_k + j) * p.nheads_k + hk) * d_];
          double* dv = &g.dv[((size_t(b) * p.seqlen_k + j) * p.nheads_k + hk) * d_];
          for (int d = 0; d < d_; ++d) {
            dq[d] += ds * k(b, j, hk, d);
            dk[d] += ds * qs[d];
            dv[d] += pj * dout(b, i, h, d);
          }
        }
        double* out = &g.dq[((size_t(b) * p.seqlen_q + i) * p.nheads + h) * d_];
        for (int d = 0; d < d_; ++d) out[d] = rnd(rnd(dq[d]) * p.scale);
      }
  for (double* x : {g.dk.data(), g.dv.data()})
    for (size_t n = 0; n < g.dk.size(); ++n) x[n] = rnd(x[n]);
  return g;
}

}  // namespace fctest
