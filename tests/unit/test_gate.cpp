// Unit tests of reference/gate.hpp: the K3 bounded gate and the Kimi Linear softplus gate
// (docs/equations.md section 2; K3 report Eqs. 2, 5).
#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/gate.hpp"

using namespace kdalab;
using namespace kdatest;

TEST_CASE("bounded gate = g_min Sigmoid(e^A (z + b)), closed range [g_min, 0] even when saturated") {
  Rng rng(21);
  const Eigen::Index HV = 3, d_k = 4, T = 50;
  Mat<double> z = randn<double>(rng, T, HV * d_k, 30.0);  // wide logits: saturates both ends
  z(0, 0) = 1e6;
  z(1, 0) = -1e6;
  const Vec<double> A = randv<double>(rng, HV, 0.0, 1.0);
  const Mat<double> b = randn<double>(rng, HV, d_k);
  const Mat<double> g = gate<double>(z, A, b, GateKind::bounded, -5.0);
  for (Eigen::Index t = 0; t < T; ++t)
    for (Eigen::Index c = 0; c < HV * d_k; ++c) {
      CHECK(g(t, c) <= 0.0);
      CHECK(g(t, c) >= -5.0);
      const Eigen::Index h = c / d_k, i = c % d_k;
      const double ref = -5.0 / (1.0 + std::exp(-std::exp(A(h)) * (z(t, c) + b(h, i))));
      CHECK(std::abs(g(t, c) - ref) <= 1e-14);
    }
  CHECK(g(0, 0) == -5.0);
  CHECK(g(1, 0) == 0.0);
  // float64 == mp50 truth on moderate logits
  const Mat<double> zm = randn<double>(rng, 8, HV * d_k);
  const Mat<double> gd = gate<double>(zm, A, b, GateKind::bounded, -5.0);
  const Mat<mp50> gm = gate<mp50>(zm.cast<mp50>(), A.cast<mp50>(), b.cast<mp50>(), GateKind::bounded, mp50(-5));
  CHECK(rel_err<mp50>(gd.cast<mp50>(), gm) <= tol::f64_vs_mp.value);
}

TEST_CASE("softplus gate = -e^A Softplus(z + dt_bias) <= 0, unbounded below") {
  Rng rng(22);
  const Eigen::Index HV = 2, d_k = 3;
  const Mat<double> z = randn<double>(rng, 20, HV * d_k, 5.0);
  const Vec<double> A = randv<double>(rng, HV, 0.0, 1.0);
  const Mat<double> b = randn<double>(rng, HV, d_k);
  const Mat<double> g = gate<double>(z, A, b, GateKind::softplus);
  for (Eigen::Index t = 0; t < 20; ++t)
    for (Eigen::Index c = 0; c < HV * d_k; ++c) {
      const Eigen::Index h = c / d_k, i = c % d_k;
      const double ref = -std::exp(A(h)) * std::log1p(std::exp(z(t, c) + b(h, i)));
      CHECK(g(t, c) <= 0.0);
      CHECK(std::abs(g(t, c) - ref) <= 1e-14 * std::max(1.0, std::abs(ref)));
    }
  CHECK(g.minCoeff() < -5.0);  // the Kimi Linear gate is not bounded by g_min
}

TEST_CASE("bounded gate keeps the 16-token cumulative log-decay in [-80, 0]; softplus does not") {
  Rng rng(23);
  const Eigen::Index HV = 4, d_k = 8, T = 200;
  const Vec<double> A = randv<double>(rng, HV, 0.0, 3.0);
  const Mat<double> b = randn<double>(rng, HV, d_k, 3.0);
  const Mat<double> z = randn<double>(rng, T, HV * d_k, 20.0);  // drive many gates into saturation at g_min
  const Mat<double> gb = gate<double>(z, A, b, GateKind::bounded, -5.0);
  const double lo = min_tile_log_decay<double>(gb, 16);
  INFO("min 16-token cumulative log-decay, bounded gate: " << lo);
  CHECK(lo >= -80.0);
  CHECK(lo < -70.0);  // the inputs really reach near the bound (the check is not vacuous)
  CHECK(lo <= 0.0);
  const Mat<double> gs = gate<double>(z, A, b, GateKind::softplus);
  CHECK(min_tile_log_decay<double>(gs, 16) < -80.0);
}

TEST_CASE("decay logits from x (low rank) and from v (K3 Eq. 2)") {
  Rng rng(24);
  const Eigen::Index T = 5, hidden = 6, r = 2, HV = 2, d_k = 3, d_v = 4;
  const Mat<double> x = randn<double>(rng, T, hidden), Wd = randn<double>(rng, r, hidden),
                    Wu = randn<double>(rng, HV * d_k, r);
  const Mat<double> zx = gate_logit_from_x(x, Wd, Wu);
  CHECK(zx.rows() == T);
  CHECK(zx.cols() == HV * d_k);
  CHECK(rel_err<double>(zx, x * (Wu * Wd).transpose()) <= 1e-14);
  const Mat<double> v = randn<double>(rng, T, HV * d_v), Wa = randn<double>(rng, HV * d_k, HV * d_v);
  const Mat<double> zv = gate_logit_from_v(v, Wa);
  CHECK(rel_err<double>(zv, v * Wa.transpose()) == 0.0);
  require_error([&] { gate_logit_from_x<double>(x, randn<double>(rng, r, hidden + 1), Wu); }, {"'W_down'"});
  require_error([&] { gate_logit_from_x<double>(x, Wd, randn<double>(rng, HV * d_k, r + 1)); }, {"'W_up'"});
  require_error([&] { gate_logit_from_v<double>(v, randn<double>(rng, HV * d_k, 3)); }, {"'W_alpha'"});
}

TEST_CASE("gate and validate_gate reject bad input, naming the tensor") {
  Rng rng(25);
  const Mat<double> z = randn<double>(rng, 2, 6);
  const Vec<double> A = Vec<double>::Zero(2);
  const Mat<double> b = Mat<double>::Zero(2, 3);
  require_error([&] { gate<double>(z, A, Mat<double>::Zero(3, 3), GateKind::bounded); }, {"'bias'"});
  require_error([&] { gate<double>(randn<double>(rng, 2, 5), A, b, GateKind::bounded); }, {"'z'"});
  require_error([&] { gate<double>(z, A, b, GateKind::bounded, 1.0); }, {"g_min"});
  Mat<double> zn = z;
  zn(1, 2) = NAN;
  require_error([&] { gate<double>(zn, A, b, GateKind::bounded); }, {"'z'", "non-finite"});

  Tensor<double> g({1, 3, 1, 2}, -1.0);
  validate_gate(g, GateKind::bounded, -5.0);  // fine
  g.data[3] = 0.25;
  require_error([&] { validate_gate(g, GateKind::softplus); }, {"'g'", "> 0", "flat index 3"});
  g.data[3] = -5.5;
  validate_gate(g, GateKind::softplus);  // unbounded gate accepts it
  require_error([&] { validate_gate(g, GateKind::bounded, -5.0); }, {"'g'", "g_min", "flat index 3"});
  g.data[3] = -5.0;
  validate_gate(g, GateKind::bounded, -5.0);  // closed interval: g_min itself is accepted
  g.data[4] = NAN;
  require_error([&] { validate_gate(g, GateKind::bounded, -5.0); }, {"'g'", "non-finite"});
}

TEST_CASE("gate names parse") {
  CHECK(parse_gate_kind("bounded") == GateKind::bounded);
  CHECK(parse_gate_kind("softplus") == GateKind::softplus);
  CHECK(parse_gate_input("v") == GateInput::from_v);
  require_error([] { parse_gate_kind("tanh", "gate_kind"); }, {"gate_kind", "tanh"});
}
