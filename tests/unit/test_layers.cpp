// Unit tests of reference/layers.hpp: ShortConv (causal, tail cache), Swish, L2Norm, RMSNorm,
// output gate (docs/equations.md section 3).
#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/layers.hpp"

using namespace kdalab;
using namespace kdatest;

TEST_CASE("short_conv is causal depthwise with the current token on the last tap") {
  Rng rng(11);
  const Eigen::Index T = 9, C = 5, K = 4;
  const Mat<double> x = randn<double>(rng, T, C), w = randn<double>(rng, C, K);
  ConvTail<double> tail(K, C);
  const Mat<double> y = short_conv(x, w, tail);
  Mat<double> ref = Mat<double>::Zero(T, C);
  for (Eigen::Index t = 0; t < T; ++t)
    for (Eigen::Index c = 0; c < C; ++c)
      for (Eigen::Index j = 0; j < K; ++j) {
        const Eigen::Index src = t - (K - 1) + j;
        if (src >= 0) ref(t, c) += w(c, j) * x(src, c);
      }
  CHECK(rel_err(y, ref) <= tol::f64_identity.value);
  // Causality: changing token 5 leaves outputs 0..4 untouched.
  Mat<double> x2 = x;
  x2.row(5).array() += 1.0;
  ConvTail<double> tail2(K, C);
  const Mat<double> y2 = short_conv(x2, w, tail2);
  CHECK((y2.topRows(5) - y.topRows(5)).norm() == 0.0);
  CHECK((y2.row(5) - y.row(5)).norm() > 0.0);
  // The tail holds the last K - 1 inputs.
  CHECK((tail.x - x.bottomRows(K - 1)).norm() == 0.0);
}

TEST_CASE("short_conv: prefill then token-by-token decode == one prefill (tail cache)") {
  Rng rng(12);
  const Eigen::Index T = 11, C = 6, K = 4;
  const Mat<double> x = randn<double>(rng, T, C), w = randn<double>(rng, C, K);
  ConvTail<double> full(K, C);
  const Mat<double> y = short_conv(x, w, full);
  for (Eigen::Index split : {0, 1, 2, 3, 7}) {
    ConvTail<double> tail(K, C);
    Mat<double> y2(T, C);
    y2.topRows(split) = short_conv<double>(x.topRows(split), w, tail);
    for (Eigen::Index t = split; t < T; ++t) y2.row(t) = short_conv<double>(x.row(t), w, tail);
    INFO("split " << split);
    CHECK(rel_err(y2, y) <= tol::f64_identity.value);
    CHECK((tail.x - full.x).norm() == 0.0);
  }
}

TEST_CASE("short_conv rejects mismatched weights and tails, naming them") {
  Rng rng(13);
  const Mat<double> x = randn<double>(rng, 4, 3);
  ConvTail<double> tail(4, 3), bad_tail(4, 2);
  require_error([&] { short_conv<double>(x, randn<double>(rng, 2, 4), tail); }, {"'w'", "channels = 3"});
  require_error([&] { short_conv<double>(x, randn<double>(rng, 3, 4), bad_tail); }, {"'tail'"});
}

TEST_CASE("swish and sigmoid elementwise, stable at large |x|") {
  Mat<double> x(1, 5);
  x << -800.0, -3.0, 0.0, 2.0, 800.0;
  const Mat<double> s = swish_mat(x), g = sigmoid_mat(x);
  for (Eigen::Index i = 0; i < 5; ++i) {
    CHECK(std::isfinite(s(0, i)));
    CHECK(std::abs(g(0, i) - 1.0 / (1.0 + std::exp(-x(0, i)))) <= 1e-15);
    CHECK(std::abs(s(0, i) - x(0, i) * g(0, i)) <= 1e-15 * std::max(1.0, std::abs(x(0, i))));
  }
  CHECK(s(0, 2) == 0.0);
  CHECK(s(0, 4) == 800.0);
}

TEST_CASE("l2norm per head: unit rows with eps = 0, x / sqrt(|x|^2 + eps) otherwise") {
  Rng rng(14);
  const Eigen::Index d = 4, heads = 3;
  const Mat<double> x = randn<double>(rng, 5, heads * d);
  const Mat<double> y0 = l2norm<double>(x, d, 0.0);
  const Mat<double> y1 = l2norm<double>(x, d, 0.5);
  for (Eigen::Index t = 0; t < 5; ++t)
    for (Eigen::Index h = 0; h < heads; ++h) {
      CHECK(std::abs(y0.row(t).segment(h * d, d).norm() - 1.0) <= 1e-15);
      const double n2 = x.row(t).segment(h * d, d).squaredNorm();
      CHECK(std::abs(y1.row(t).segment(h * d, d).norm() - std::sqrt(n2 / (n2 + 0.5))) <= 1e-15);
    }
  require_error([&] { l2norm<double>(x, 5); }, {"'x'", "head dim 5"});
}

TEST_CASE("rmsnorm per head with a shared weight; float64 == mp50 truth") {
  Rng rng(15);
  const Eigen::Index d = 4, heads = 2;
  const Mat<double> x = randn<double>(rng, 3, heads * d);
  const Vec<double> w = randv<double>(rng, d, 0.5, 1.5);
  const Mat<double> y = rmsnorm<double>(x, w, 1e-5);
  const Mat<mp50> ym = rmsnorm<mp50>(x.cast<mp50>(), w.cast<mp50>(), mp50(1e-5));
  CHECK(rel_err<mp50>(y.cast<mp50>(), ym) <= tol::f64_vs_mp.value);
  // With w = 1 and eps = 0 each head has mean square 1.
  const Mat<double> y1 = rmsnorm<double>(x, Vec<double>::Ones(d), 0.0);
  for (Eigen::Index t = 0; t < 3; ++t)
    for (Eigen::Index h = 0; h < heads; ++h) CHECK(std::abs(y1.row(t).segment(h * d, d).squaredNorm() / d - 1.0) <= 1e-14);
  // Each head is normalised on its own: scaling head 1 leaves head 0 unchanged.
  Mat<double> x2 = x;
  x2.rightCols(d) *= 7.0;
  const Mat<double> y2 = rmsnorm<double>(x2, w, 0.0), y3 = rmsnorm<double>(x, w, 0.0);
  CHECK((y2 - y3).norm() <= 1e-14);
  require_error([&] { rmsnorm<double>(x, Vec<double>::Ones(3)); }, {"'x'", "'w'"});
}

TEST_CASE("output_gate = Sigmoid(logit) * o, shape checked") {
  Rng rng(16);
  const Mat<double> o = randn<double>(rng, 3, 4), z = randn<double>(rng, 3, 4);
  const Mat<double> y = output_gate(o, z);
  for (Eigen::Index i = 0; i < o.size(); ++i)
    CHECK(std::abs(y.data()[i] - o.data()[i] / (1.0 + std::exp(-z.data()[i]))) <= 1e-15);
  require_error([&] { output_gate<double>(o, randn<double>(rng, 3, 5)); }, {"'gate_logit'"});
  require_error([&] { linear<double>(o, randn<double>(rng, 2, 5), "W_o"); }, {"'W_o'"});
}
