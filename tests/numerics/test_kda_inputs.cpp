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
