#pragma once
// Helpers shared by the KDA reference tests (tests/unit/test_kda*.cpp, test_gate*, test_layers*).
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "numerics/random.hpp"
#include "reference/error.hpp"
#include "reference/scalar.hpp"
#include "reference/tensor.hpp"

namespace kdatest {
using kdalab::Mat;
using kdalab::Rng;
using kdalab::Tensor;
using kdalab::Vec;

/// Seeded N(0, sigma^2) matrix, drawn in double and cast to S (exact), so double and mp50 see equal values.
template <class S>
Mat<S> randn(Rng& rng, Eigen::Index r, Eigen::Index c, double sigma = 1.0) {
  Mat<S> m(r, c);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = S(sigma * rng.normal());
  return m;
}
template <class S>
Vec<S> randv(Rng& rng, Eigen::Index n, double a, double b) {
  Vec<S> v(n);
  for (Eigen::Index i = 0; i < n; ++i) v(i) = S(rng.uniform(a, b));
  return v;
}
/// One head of seeded float64 KDA inputs: q, k unit rows [T, d_k], v [T, d_v], g [T, d_k] in
/// [-g_span, 0], beta [T] ~ U(beta_lo, beta_hi), S0 [d_k, d_v] ~ N(0, s0_sigma^2). Fixed draw order
/// (q, k, v, beta, S0, then g row by row), so a seed names the same inputs in every test.
struct Head {
  Mat<double> q, k, v, g;
  Vec<double> beta;
  Mat<double> S0;
};
inline Head random_head(std::uint64_t seed, Eigen::Index T, Eigen::Index dk, Eigen::Index dv, double beta_lo,
                        double beta_hi, double s0_sigma, double g_span) {
  Rng rng(seed);
  Head h{randn<double>(rng, T, dk), randn<double>(rng, T, dk), randn<double>(rng, T, dv), Mat<double>(T, dk),
         randv<double>(rng, T, beta_lo, beta_hi), randn<double>(rng, dk, dv, s0_sigma)};
  for (Eigen::Index t = 0; t < T; ++t) {
    h.q.row(t).normalize();
    h.k.row(t).normalize();
    for (Eigen::Index i = 0; i < dk; ++i) h.g(t, i) = -g_span * rng.uniform();
  }
  return h;
}
/// Relative 2-norm error ||a - b|| / ||b|| computed in S, returned as double.
template <class S>
double rel_err(const Mat<S>& a, const Mat<S>& b) {
  const S den = b.norm();
  const S num = (a - b).norm();
  return static_cast<double>(den > S(0) ? S(num / den) : num);
}
template <class S>
double rel_err(const Tensor<S>& a, const Tensor<S>& b) {
  REQUIRE(a.shape == b.shape);
  S num = 0, den = 0;
  for (std::size_t i = 0; i < a.numel(); ++i) {
    num += (a.data[i] - b.data[i]) * (a.data[i] - b.data[i]);
    den += b.data[i] * b.data[i];
  }
  return static_cast<double>(den > S(0) ? S(kdalab::ssqrt<S>(num) / kdalab::ssqrt<S>(den)) : kdalab::ssqrt<S>(num));
}
/// Runs f, requires it to throw kdalab::Error whose message contains every string of `needles`.
template <class F>
void require_error(F&& f, const std::vector<std::string>& needles) {
  bool thrown = false;
  try {
    f();
  } catch (const kdalab::Error& e) {
    thrown = true;
    const std::string msg = e.what();
    INFO("message: " << msg);
    for (const auto& n : needles) {
      INFO("expected to contain: " << n);
      CHECK(msg.find(n) != std::string::npos);
    }
  }
  CHECK(thrown);
}
/// A random batched KDA problem in float64 (cast() it for mp50): q, k unit rows times `knorm`,
/// v ~ N(0, 1), g = g_min * U(0, 1) per (token, head, channel) (bounded-gate range), beta ~ U(0.05, 1),
/// S0 ~ 0.1 N(0, 1) (zero when !with_s0), scale = d_k^-1/2.
struct Problem {
  std::size_t B, T, H, HV, dk, dv;
  Tensor<double> q, k, v, g, beta, S0;
  double scale;
  template <class S>
  struct Cast {
    Tensor<S> q, k, v, g, beta, S0;
    S scale;
  };
  template <class S>
  Cast<S> as() const {
    return {q.cast<S>(), k.cast<S>(), v.cast<S>(), g.cast<S>(), beta.cast<S>(), S0.cast<S>(), S(scale)};
  }
};
inline Problem make_problem(std::uint64_t seed, std::size_t B, std::size_t T, std::size_t H, std::size_t HV,
                            std::size_t dk, std::size_t dv, double g_min = -5.0, double knorm = 1.0,
                            bool with_s0 = true) {
  Rng rng(seed);
  Problem p{B, T, H, HV, dk, dv, Tensor<double>({B, T, H, dk}), Tensor<double>({B, T, H, dk}),
            Tensor<double>({B, T, HV, dv}), Tensor<double>({B, T, HV, dk}), Tensor<double>({B, T, HV}),
            Tensor<double>({B, HV, dk, dv}), 1.0 / std::sqrt(static_cast<double>(dk))};
  rng.fill_normal(p.q);
  rng.fill_normal(p.k);
  for (Tensor<double>* t : {&p.q, &p.k})
    for (std::size_t r = 0; r < t->numel() / dk; ++r) {
      double n2 = 0;
      for (std::size_t i = 0; i < dk; ++i) n2 += t->data[r * dk + i] * t->data[r * dk + i];
      for (std::size_t i = 0; i < dk; ++i) t->data[r * dk + i] *= (t == &p.k ? knorm : 1.0) / std::sqrt(n2);
    }
  rng.fill_normal(p.v);
  for (auto& x : p.g.data) x = g_min * rng.uniform();
  for (auto& x : p.beta.data) x = rng.uniform(0.05, 1.0);
  if (with_s0) rng.fill_normal(p.S0, 0.1);
  return p;
}

}  // namespace kdatest
