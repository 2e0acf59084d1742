// The plain emulation behind `kdalab check`'s budget (numerics/plain_emulation.hpp) and the budget rule
// (numerics/budget.hpp): at fp64 the emulation is the float64 reference (forward and every gradient agree with the
// exact recurrence's to float64 rounding), its error grows from fp32 to bf16, and the budget is a function of the
// inputs, the precision and the output format only.
#include <map>
#include <random>

#include "numerics/budget.hpp"
#include "numerics/plain_emulation.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

namespace {
Tensor<double> normal(std::vector<std::size_t> shape, std::mt19937_64& gen, double scale = 1, bool bf16 = false) {
  Tensor<double> t(std::move(shape));
  std::normal_distribution<double> n(0, 1);
  for (auto& x : t.data) x = bf16 ? round_bf16(scale * n(gen)) : scale * n(gen);
  return t;
}

/// A small KDA problem with every pre-op: two chunks (the second one partial), grouped value heads, K3 gate.
KdaCheckOp kda_problem(std::mt19937_64& gen) {
  const std::size_t B = 1, T = 80, H = 1, HV = 2, D = 16;
  KdaCheckOp c;
  c.q = normal({B, T, H, D}, gen, 1, true);
  c.k = normal({B, T, H, D}, gen, 1, true);
  c.v = normal({B, T, HV, D}, gen, 1, true);
  c.g = normal({B, T, HV, D}, gen, 1, true);
  c.beta = normal({B, T, HV}, gen, 1, true);
  c.A_log = normal({HV}, gen, 0.3);
  c.bias = normal({HV, D}, gen, 0.3);
  c.S0 = normal({B, HV, D, D}, gen, 0.1);
  c.has_S0 = c.l2norm = c.beta_logits = true;
  c.gate = KdaGateKind::k3;
  c.scale = 0.25;
  return c;
}

std::vector<const Tensor<double>*> all(const KdaCheckGrads& g) {
  return {&g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta, &g.dS0, &g.dA_log, &g.dbias};
}
const char* const kKdaNames[] = {"dq", "dk", "dv", "dg", "dbeta", "dS0", "dA_log", "dbias"};
}  // namespace

TEST_CASE("emulation: KDA error grows from fp32 to bf16 and is float64 rounding at fp64, forward and backward",
          "[check]") {
  std::mt19937_64 gen(7);
  const KdaCheckOp c = kda_problem(gen);
  const Tensor<double> dO = normal({1, 80, 2, 16}, gen), dS = normal({1, 2, 16, 16}, gen, 0.1);
  const KdaCheckGrads truth = kda_check_backward_truth<double>(c, dO, &dS);
  const KdaPreops<double> p = kda_check_preops<double>(c);
  const KdaOutput<double> fwd = kda_recurrent<double>(p.q, p.k, c.v, p.g, p.beta, &c.S0, c.scale);
  const auto e16 = emul::kda(c, Format::bf16, 64, &dO, &dS), e32 = emul::kda(c, Format::fp32, 64, &dO, &dS),
             e64 = emul::kda(c, Format::fp64, 64, &dO, &dS);
  const auto t = all(truth), g16 = all(e16.grads), g32 = all(e32.grads), g64 = all(e64.grads);
  for (std::size_t i = 0; i < t.size(); ++i) {
    INFO(kKdaNames[i]);
    const double r16 = rel_rms(g16[i]->data, t[i]->data), r32 = rel_rms(g32[i]->data, t[i]->data),
                 r64 = rel_rms(g64[i]->data, t[i]->data);
    CAPTURE(r16, r32, r64);
    CHECK(r64 <= tol::backward_f64_vs_mp.value);
    CHECK(r32 > 10 * r64);
    CHECK(r16 > 100 * r32);
  }
  for (auto [e, tr] : {std::pair{&e64.o, &fwd.o}, std::pair{&e64.S, &fwd.S_final}})
    CHECK(rel_rms(e->data, tr->data) <= tol::f64_identity.value);
  CHECK(rel_rms(e16.o.data, fwd.o.data) > 100 * rel_rms(e32.o.data, fwd.o.data));
  // C = 1 (the kda-decode emulation) is the recurrence at p: the same truth at fp64
  CHECK(rel_rms(emul::kda(c, Format::fp64, 1).o.data, fwd.o.data) <= tol::f64_identity.value);
}

TEST_CASE("emulation: MLA and AttnRes error grows from fp32 to bf16 and is float64 rounding at fp64", "[check]") {
  std::mt19937_64 gen(11);
  MlaCheckOp m;
  m.q = normal({1, 6, 2, 16}, gen, 1, true);
  m.c = normal({1, 9, 16}, gen, 1, true);
  m.q_rope = normal({1, 6, 2, 4}, gen, 1, true);
  m.k_rope = normal({1, 9, 4}, gen, 1, true);
  m.scale = 0.2;
  const Tensor<double> dO = normal({1, 6, 2, 16}, gen);
  const MlaCheckGrads mt = mla_check_backward_truth<double>(m, dO);
  AttnResCheckOp a;
  a.v = normal({5, 3, 32}, gen, 1, true);
  a.w = normal({32}, gen, 0.5);
  a.mode = ResidualMode::block;
  a.block_sources = 3;  // sources b_0 = v_0, b_1 = v_1 + v_2 + v_3, partial v_4
  const Tensor<double> dh = normal({3, 32}, gen);
  const AttnResCheckGrads at = attn_res_check_backward_truth<double>(a, dh);
  std::map<Format, std::vector<double>> err;  // per precision: every gradient's relative RMS
  for (Format p : {Format::bf16, Format::fp32, Format::fp64}) {
    const auto me = emul::mla(m, p, &dO);
    const auto ae = emul::attn_res(a, p, &dh);
    err[p] = {rel_rms(me.grads.dq.data, mt.dq.data), rel_rms(me.grads.dc.data, mt.dc.data),
              rel_rms(me.grads.dq_rope.data, mt.dq_rope.data), rel_rms(me.grads.dk_rope.data, mt.dk_rope.data),
              rel_rms(ae.grads.dv.data, at.dv.data), rel_rms(ae.grads.dw.data, at.dw.data)};
  }
  for (std::size_t i = 0; i < err[Format::fp64].size(); ++i) {
    INFO("gradient " << i << " (dq, dc, dq_rope, dk_rope, dv, dw)");
    CAPTURE(err[Format::bf16][i], err[Format::fp32][i], err[Format::fp64][i]);
    CHECK(err[Format::fp64][i] <= tol::backward_f64_vs_mp.value);
    CHECK(err[Format::fp32][i] > 10 * err[Format::fp64][i]);
    CHECK(err[Format::bf16][i] > 100 * err[Format::fp32][i]);
  }
}

TEST_CASE("budget: F times (emulation error + output rounding), at least the floor; fp64 output rounding is 0",
          "[check]") {
  const std::vector<double> truth{1.1, -2.3, 3.7, 0.55}, emulation{1.101, -2.3, 3.7, 0.55};
  const Budget b16 = budget_of(emulation, truth, Format::bf16), b64 = budget_of(truth, truth, Format::fp64);
  CHECK(b16.emulation == Approx(rel_rms(emulation, truth)));
  CHECK(b16.output_rounding > 0);
  CHECK(b16.value == Approx(tol::budget_factor.value * (b16.emulation + b16.output_rounding)));
  CHECK(b64.output_rounding == 0);
  CHECK(b64.value == tol::budget_floor.value);
  ErrorMetrics m;
  m.rel_rms = 2 * b16.value;
  CHECK(verdict_text(m, b16.value) == "over budget by x2");
  m.rel_rms = 0.5 * b16.value;
  CHECK(verdict_text(m, b16.value) == "within the noise of its precision");
  m.nan_count = 3;
  CHECK(verdict_text(m, b16.value) == "bug: 3 NaN");
}
