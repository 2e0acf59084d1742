// Unit tests of reference/kda_layer.hpp: the full KDA layer (K3 report Eqs. 2, 5, 6): decode ==
// prefill with the cache (state + ShortConv tails), chunked == recurrent prefill, float64 vs the
// mp50 truth, the layer == the composition of its documented ops, grouped value heads, varlen,
// seeded init, bad input.
#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/kda_layer.hpp"

using namespace kdalab;
using namespace kdatest;

namespace {
KdaConfig small_config(GateKind gk = GateKind::bounded, GateInput gi = GateInput::from_x) {
  KdaConfig c;
  c.hidden = 12;
  c.H = 2;
  c.HV = 4;  // grouped value heads, HV = 2H
  c.d_k = 4;
  c.d_v = 3;
  c.gate = gk;
  c.gate_input = gi;
  c.chunk = 16;
  return c;
}
Mat<double> input(std::uint64_t seed, Eigen::Index T, Eigen::Index hidden) {
  Rng rng(seed);
  return randn<double>(rng, T, hidden);
}
}  // namespace

TEST_CASE("KDA layer: decode steps after a prefill == one prefill (every gate kind and gate input)") {
  for (GateKind gk : {GateKind::bounded, GateKind::softplus})
    for (GateInput gi : {GateInput::from_x, GateInput::from_v}) {
      const KdaLayer<double> layer(small_config(gk, gi), 7);
      const Eigen::Index T = 37, T1 = 20;
      const Mat<double> x = input(61, T, 12);
      auto c_full = layer.make_cache();
      const Mat<double> y = layer.prefill(x, c_full);
      auto c = layer.make_cache();
      Mat<double> y2(T, 12);
      y2.topRows(T1) = layer.prefill(x.topRows(T1), c);
      for (Eigen::Index t = T1; t < T; ++t) y2.row(t) = layer.decode(x.row(t).transpose(), c).transpose();
      INFO("gate " << gate_kind_name(gk) << ", z from " << gate_input_name(gi));
      CHECK(rel_err<double>(y2, y) <= tol::f64_identity.value);
      CHECK(c.tokens == static_cast<std::size_t>(T));
      for (std::size_t h = 0; h < 4; ++h) CHECK(rel_err<double>(c.S[h], c_full.S[h]) <= tol::f64_identity.value);
      CHECK(rel_err<double>(c.v_tail.x, c_full.v_tail.x) <= tol::f64_identity.value);
      // all-decode (from an empty cache) == prefill too
      auto c3 = layer.make_cache();
      Mat<double> y3(T, 12);
      for (Eigen::Index t = 0; t < T; ++t) y3.row(t) = layer.decode(x.row(t).transpose(), c3).transpose();
      CHECK(rel_err<double>(y3, y) <= tol::f64_identity.value);
    }
}

TEST_CASE("KDA layer: dropping the ShortConv tail from the cache breaks decode (the tail matters)") {
  const KdaLayer<double> layer(small_config(), 8);
  const Mat<double> x = input(62, 12, 12);
  auto c_full = layer.make_cache();
  const Mat<double> y = layer.prefill(x, c_full);
  auto c = layer.make_cache();
  layer.prefill(x.topRows(8), c);
  c.q_tail = ConvTail<double>(4, 8);  // forget the q tail
  const Vec<double> y8 = layer.decode(x.row(8).transpose(), c);
  CHECK((y8 - y.row(8).transpose()).norm() > 1e-6 * y.row(8).norm());
}

TEST_CASE("KDA layer: chunked prefill == recurrent prefill for several C") {
  KdaConfig cfg = small_config();
  const Mat<double> x = input(63, 70, 12);
  cfg.chunk = 0;
  const KdaLayer<double> rec(cfg, 9);
  auto cr = rec.make_cache();
  const Mat<double> yr = rec.prefill(x, cr);
  for (std::size_t C : {1u, 3u, 16u, 64u, 128u}) {
    cfg.chunk = C;
    cfg.inverse = C == 64 ? TriInverse::neumann : TriInverse::forward_substitution;
    const KdaLayer<double> ch(cfg, 9);
    auto cc = ch.make_cache();
    INFO("C = " << C);
    CHECK(rel_err<double>(ch.prefill(x, cc), yr) <= tol::f64_identity.value);
    CHECK(rel_err<double>(cc.S[3], cr.S[3]) <= tol::f64_identity.value);
  }
}

TEST_CASE("KDA layer: float64 == cpp_bin_float_50 truth (same seed, same weights)") {
  KdaConfig cfg = small_config(GateKind::bounded, GateInput::from_v);
  cfg.chunk = 8;
  const KdaLayer<double> ld(cfg, 10);
  const KdaLayer<mp50> lm(cfg, 10);
  CHECK(rel_err<mp50>(ld.weights().W_o.cast<mp50>(), lm.weights().W_o) == 0.0);
  const Mat<double> x = input(64, 20, 12);
  auto cd = ld.make_cache();
  auto cm = lm.make_cache();
  const Mat<double> yd = ld.prefill(x, cd);
  const Mat<mp50> ym = lm.prefill(x.cast<mp50>(), cm);
  const double e = rel_err<mp50>(yd.cast<mp50>(), ym);
  INFO("relative error " << e);
  CHECK(e <= tol::f64_vs_mp.value);
  CHECK(e > 0.0);
}

TEST_CASE("KDA layer == composition of its documented ops and the batched recurrence") {
  const KdaConfig cfg = small_config(GateKind::bounded, GateInput::from_x);
  const KdaLayer<double> layer(cfg, 11);
  const auto& w = layer.weights();
  const Eigen::Index T = 15;
  const Mat<double> x = input(65, T, 12);
  auto cache = layer.make_cache();
  KdaActivations<double> act;
  const Mat<double> y = layer.prefill(x, cache, &act);
  // by hand
  ConvTail<double> tq(4, 8), tk(4, 8), tv(4, 12);
  const Mat<double> q = l2norm<double>(swish_mat<double>(short_conv<double>(x * w.W_q.transpose(), w.conv_q, tq)), 4, 1e-6);
  const Mat<double> k = l2norm<double>(swish_mat<double>(short_conv<double>(x * w.W_k.transpose(), w.conv_k, tk)), 4, 1e-6);
  const Mat<double> v = swish_mat<double>(short_conv<double>(x * w.W_v.transpose(), w.conv_v, tv));
  const Mat<double> beta = sigmoid_mat<double>(x * w.W_beta.transpose());
  const Mat<double> g = gate<double>(x * w.W_a_down.transpose() * w.W_a_up.transpose(), w.A_log, w.g_bias, GateKind::bounded, -5.0);
  CHECK(g.maxCoeff() <= 0.0);
  CHECK(g.minCoeff() >= -5.0);
  for (Eigen::Index t = 0; t < T; ++t) CHECK(std::abs(q.row(t).segment(4, 4).norm() - 1.0) < 1e-5);
  Tensor<double> Q({1, static_cast<std::size_t>(T), 2, 4}), K = Q, V({1, static_cast<std::size_t>(T), 4, 3}),
      G({1, static_cast<std::size_t>(T), 4, 4}), B({1, static_cast<std::size_t>(T), 4});
  for (Eigen::Index t = 0; t < T; ++t) {
    for (std::size_t i = 0; i < 8; ++i) { Q.data[t * 8 + i] = q(t, i); K.data[t * 8 + i] = k(t, i); }
    for (std::size_t i = 0; i < 12; ++i) V.data[t * 12 + i] = v(t, i);
    for (std::size_t i = 0; i < 16; ++i) G.data[t * 16 + i] = g(t, i);
    for (std::size_t i = 0; i < 4; ++i) B.data[t * 4 + i] = beta(t, i);
  }
  const auto core = kda_recurrent<double>(Q, K, V, G, B, nullptr, 0.5);
  Mat<double> o(T, 12);
  for (Eigen::Index t = 0; t < T; ++t)
    for (std::size_t i = 0; i < 12; ++i) o(t, i) = core.o.data[t * 12 + i];
  CHECK(rel_err<double>(act.o, o) <= tol::f64_identity.value);
  const Mat<double> yh = output_gate<double>(rmsnorm<double>(o, w.rms_w, 1e-5), x * w.W_g.transpose()) * w.W_o.transpose();
  CHECK(rel_err<double>(y, yh) <= tol::f64_identity.value);
  for (std::size_t h = 0; h < 4; ++h)
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 3; ++j) CHECK(std::abs(cache.S[h](i, j) - core.S_final(0, h, i, j)) <= 1e-14);
}

TEST_CASE("KDA layer varlen == sequences one by one, each with its own cache, last of length 1") {
  const KdaLayer<double> layer(small_config(), 12);
  const std::vector<std::size_t> cu{0, 17, 18, 40, 41};
  const Mat<double> x = input(66, 41, 12);
  std::vector<KdaCache<double>> caches(4, layer.make_cache());
  const Mat<double> y = layer.prefill_varlen(x, cu, caches);
  for (std::size_t n = 0; n < 4; ++n) {
    auto c = layer.make_cache();
    const auto t0 = static_cast<Eigen::Index>(cu[n]), len = static_cast<Eigen::Index>(cu[n + 1] - cu[n]);
    const Mat<double> yn = layer.prefill(x.middleRows(t0, len), c);
    INFO("sequence " << n);
    CHECK(rel_err<double>(Mat<double>(y.middleRows(t0, len)), yn) == 0.0);
    CHECK(rel_err<double>(caches[n].S[1], c.S[1]) == 0.0);
    CHECK(caches[n].tokens == static_cast<std::size_t>(len));
  }
  // one packed sequence differs: state and conv tails must not leak across sequences
  auto one = layer.make_cache();
  const Mat<double> ypacked = layer.prefill(x, one);
  CHECK(rel_err<double>(Mat<double>(ypacked.row(17)), Mat<double>(y.row(17))) > 1e-3);
  std::vector<KdaCache<double>> three(3, layer.make_cache());
  require_error([&] { layer.prefill_varlen(x, cu, three); }, {"'caches'"});
  require_error([&] { layer.prefill_varlen(x, {0, 17, 40}, caches); }, {"'cu_seqlens'", "41"});
}

TEST_CASE("KDA layer: seeded init is reproducible; bad input names the tensor or option") {
  const KdaLayer<double> a(small_config(), 5), b(small_config(), 5), c(small_config(), 6);
  CHECK(rel_err<double>(a.weights().W_q, b.weights().W_q) == 0.0);
  CHECK(rel_err<double>(a.weights().W_q, c.weights().W_q) > 0.1);
  auto cache = a.make_cache();
  require_error([&] { a.prefill(input(67, 3, 11), cache); }, {"'x'", "hidden = 12"});
  Mat<double> x = input(68, 3, 12);
  x(2, 5) = NAN;
  require_error([&] { a.prefill(x, cache); }, {"'x'", "non-finite", "token 2"});
  KdaCache<double> wrong;
  require_error([&] { a.prefill(input(69, 3, 12), wrong); }, {"'cache'"});
  KdaConfig bad = small_config();
  bad.HV = 3;
  require_error([&] { KdaLayer<double>(bad, 1); }, {"'HV'", "'H'"});
  bad = small_config();
  bad.g_min = 0.5;
  require_error([&] { KdaLayer<double>(bad, 1); }, {"'g_min'"});
  bad = small_config();
  bad.d_k = 0;
  require_error([&] { KdaLayer<double>(bad, 1); }, {"'d_k'"});
  KdaWeights<double> w = a.weights();
  w.W_o = Mat<double>::Zero(12, 5);
  require_error([&] { KdaLayer<double>(small_config(), w); }, {"'W_o'"});
  // an unbounded gate with a huge time constant is refused by the chunked prefill, not garbled
  KdaConfig big = small_config(GateKind::softplus);
  big.chunk = 32;
  KdaWeights<double> wb = KdaWeights<double>::random(big, 3);
  wb.A_log.setConstant(4.0);  // e^4 ~ 55 nats per token: 16-token tiles span > 700
  wb.g_bias.setConstant(3.0);
  const KdaLayer<double> lb(big, wb);
  auto cb = lb.make_cache();
  require_error([&] { lb.prefill(input(70, 40, 12), cb); }, {"'C'", "'g'"});
}
