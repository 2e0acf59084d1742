#pragma once
// Helpers of the hybrid tests: relative error, seeded inputs, the toy model builder.
#include <string>

#include "numerics/random.hpp"
#include "reference/hybrid.hpp"

namespace kdalab::testutil {

template <class S>
using ToyHybrid = Hybrid<S>;  // KDA layers: reference/kda_layer.hpp

/// The model of a config with its recorded seed (same weights in every scalar type).
template <class S>
ToyHybrid<S> build(const ModelConfig& cfg) {
  Rng rng(cfg.opt.seed);
  return ToyHybrid<S>::random(cfg, [&] { return rng.normal(); });
}

inline Mat<double> inputs(std::size_t T, std::size_t d, std::uint64_t seed) {
  Rng rng(seed);
  Mat<double> X(T, d);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t i = 0; i < d; ++i) X(t, i) = rng.normal();
  return X;
}

template <class A, class B>
double rel(const A& out, const B& ref) {
  const Mat<double> o = out.template cast<double>(), r = ref.template cast<double>();
  return (o - r).norm() / r.norm();
}

/// Prefill of X vs token-by-token decode of X on fresh caches: relative error.
template <class S>
double decode_vs_prefill(const ToyHybrid<S>& m, const Mat<S>& X) {
  auto cp = m.make_cache(X.rows()), cd = m.make_cache(X.rows());
  const Mat<S> Yp = m.prefill(X, cp);
  Mat<S> Yd(X.rows(), X.cols());
  for (Eigen::Index t = 0; t < X.rows(); ++t) Yd.row(t) = m.decode(Vec<S>(X.row(t).transpose()), cd).transpose();
  const Mat<S> diff = Yd - Yp;  // in S: an mp50 difference must not be rounded to double first
  return static_cast<double>(S(diff.norm() / Yp.norm()));
}

}  // namespace kdalab::testutil
