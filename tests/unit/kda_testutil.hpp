#pragma once
// Helpers shared by the KDA reference tests (tests/unit/test_kda*.cpp, test_gate*, test_layers*).
#include <cmath>
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
}  // namespace kdatest
