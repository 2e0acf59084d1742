// The parity sweep's input generators (numerics/kda_inputs.hpp).
#include <cmath>

#include "numerics/kda_inputs.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

TEST_CASE("kda_inputs with the anchor settings is anchor_kda bit for bit") {
  KdaGenSpec s;
  s.B = 2; s.T = 19; s.H = 2; s.d_k = 32; s.d_v = 32; s.seed = 99;
  const KdaInputs a = kda_inputs(s), b = anchor_kda(2, 19, 2, 32, 99);
  CHECK(a.generator == "anchor-kda");
  for (auto [x, y] : {std::pair{&a.q_raw, &b.q_raw}, {&a.k_raw, &b.k_raw}, {&a.v, &b.v}, {&a.g_raw, &b.g_raw},
                      {&a.beta_raw, &b.beta_raw}, {&a.A_log, &b.A_log}, {&a.bias, &b.bias}, {&a.S0, &b.S0},
                      {&a.q, &b.q}, {&a.k, &b.k}, {&a.g, &b.g}, {&a.beta, &b.beta}}) {
    REQUIRE(x->shape == y->shape);
    CHECK(x->data == y->data);
  }
  CHECK(a.scale == b.scale);
}

TEST_CASE("kda_inputs variations: softplus gate, beta distributions, d_v != d_k") {
  KdaGenSpec s;
  s.T = 64; s.H = 2; s.d_k = 16; s.d_v = 24; s.gate = GateKind::softplus; s.beta = BetaDist::one; s.seed = 5;
  const KdaInputs in = kda_inputs(s);
  CHECK(in.generator == "anchor-kda(gate=softplus, beta=one, d_v=24)");
  CHECK(in.v.shape == std::vector<std::size_t>{1, 64, 2, 24});
  CHECK(in.S0.shape == std::vector<std::size_t>{1, 2, 16, 24});
  double gmin = 0, gmax = -1e9;
  for (double g : in.g.data) { gmin = std::min(gmin, g); gmax = std::max(gmax, g); }
  CHECK(gmax < 0.0);
  CHECK(gmin < -5.0);  // the softplus gate is unbounded below
  for (double b : in.beta.data) CHECK(b == 1.0);
  s.beta = BetaDist::wide;
  const KdaInputs w = kda_inputs(s);
  std::size_t extreme = 0;
  for (double b : w.beta.data) extreme += (b < 0.05 || b > 0.95);
  CHECK(extreme > w.beta.numel() / 4);
  s.gate = GateKind::bounded; s.g_min = -2.0;
  for (double g : kda_inputs(s).g.data) CHECK(g >= -2.0);
  s.g_min = 0.0;
  CHECK_THROWS_AS(kda_inputs(s), Error);
  CHECK_THROWS_AS(parse_beta_dist("uniform"), Error);
}

TEST_CASE("kda_inputs input kinds: long-memory gate and beta, collinear and identical keys, the other draws kept") {
  KdaGenSpec s;
  s.T = 40; s.H = 2; s.d_k = 16; s.d_v = 16; s.seed = 7;
  const KdaInputs a = kda_inputs(s);
  s.inputs = InputKind::long_memory;
  const KdaInputs lm = kda_inputs(s);
  CHECK(lm.generator == "anchor-kda(inputs=long-memory)");
  CHECK(lm.k_raw.data == a.k_raw.data);
  for (double g : lm.g.data) CHECK((g < 0.0 && g > -5.0 * std::exp(-8.0)));  // ~ -5 e^-12 Sigmoid spread
  for (double b : lm.beta.data) CHECK(b < 0.5);
  for (InputKind k : {InputKind::collinear_keys, InputKind::collinear_keys_slow_decay, InputKind::identical_keys}) {
    s.inputs = k;
    const KdaInputs c = kda_inputs(s);
    CAPTURE(input_kind_name(k));
    CHECK(c.q_raw.data == a.q_raw.data);
    CHECK(c.v.data == a.v.data);
    double min_cos = 1.0;
    for (std::size_t h = 0; h < s.H; ++h)
      for (std::size_t t = 1; t < s.T; ++t) {
        double dot = 0;
        for (std::size_t i = 0; i < s.d_k; ++i) dot += c.k(0, t, h, i) * c.k(0, 0, h, i);
        min_cos = std::min(min_cos, dot);
      }
    if (k == InputKind::identical_keys) CHECK(min_cos == Approx(1.0).epsilon(1e-14));
    else CHECK((min_cos > 0.99 && min_cos < 1.0 - 1e-6));
    for (double g : c.g.data)
      if (k == InputKind::collinear_keys_slow_decay) CHECK((g < 0.0 && g > -5.0 * std::exp(-8.0)));
      else CHECK(g == 0.0);
  }
  CHECK_THROWS_AS(parse_input_kind("long_memory", "--inputs"), Error);
}
