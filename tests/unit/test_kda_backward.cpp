// Unit tests of the exact reverse-mode derivatives of the KDA reference: the recurrence
// (reference/kda_backward.hpp), the pre-ops (reference/layers_backward.hpp, reference/gate_backward.hpp)
// and the fused op on the kernel's inputs (reference/kda_fused_backward.hpp). The oracle is the
// central difference of L(x) = <dO, o(x)> + <dS_T, S_T(x)> along random directions in
// cpp_bin_float_50; float64 is compared with cpp_bin_float_50; causality and checkpointing are
// exact identities.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "numerics/tolerance.hpp"
#include "reference/kda_fused_backward.hpp"

using namespace kdalab;
using namespace kdatest;

namespace {

/// Sum of a ⊙ b over all elements, in S.
template <class S>
S inner(const Tensor<S>& a, const Tensor<S>& b) {
  REQUIRE(a.shape == b.shape);
  S s = S(0);
  for (std::size_t i = 0; i < a.numel(); ++i) s += a.data[i] * b.data[i];
  return s;
}
template <class S>
S inner(const Mat<S>& a, const Mat<S>& b) {
  return a.cwiseProduct(b).sum();
}

/// N(0, sigma^2) tensor of a shape, drawn in float64.
Tensor<double> randn_tensor(Rng& rng, const std::vector<std::size_t>& shape, double sigma = 1.0) {
  Tensor<double> t(shape);
  rng.fill_normal(t, sigma);
  return t;
}

/// The central-difference step in cpp_bin_float_50 (file comment of numerics/tolerance.hpp).
const mp50 fd_step("1e-17");

/// Relative error of the analytic directional derivative `an` = <grad, dx> against the central
/// difference of L along dx at x (input `which` of `x` moved): |fd - an| / |an|, or |fd| when an = 0.
double fd_rel_err(const std::function<mp50(const std::vector<Tensor<mp50>>&)>& L, std::vector<Tensor<mp50>> x,
                  std::size_t which, const Tensor<mp50>& dx, const mp50& an) {
  const Tensor<mp50> x0 = x[which];
  for (std::size_t i = 0; i < x0.numel(); ++i) x[which].data[i] = x0.data[i] + fd_step * dx.data[i];
  const mp50 lp = L(x);
  for (std::size_t i = 0; i < x0.numel(); ++i) x[which].data[i] = x0.data[i] - fd_step * dx.data[i];
  const mp50 lm = L(x);
  const mp50 fd = (lp - lm) / (2 * fd_step);
  return an == 0 ? static_cast<double>(sabs<mp50>(fd)) : static_cast<double>(sabs<mp50>(mp50((fd - an) / an)));
}

/// Upstream gradients of a KDA problem: dO [B, T, HV, d_v], dS_T [B, HV, d_k, d_v].
struct Upstream {
  Tensor<double> dO, dS_T;
};
Upstream random_upstream(std::uint64_t seed, const Problem& p) {
  Rng rng(seed);
  return {randn_tensor(rng, {p.B, p.T, p.HV, p.dv}), randn_tensor(rng, {p.B, p.HV, p.dk, p.dv})};
}

const std::vector<KdaVariant> all_variants = {KdaVariant::kda, KdaVariant::gated_deltanet, KdaVariant::deltanet,
                                              KdaVariant::gla, KdaVariant::linear};

}  // namespace

TEST_CASE("recurrence VJP == central differences in cpp_bin_float_50 for every input and variant",
          "[backward][mp50]") {
  // Grouped value heads (HV = 2 H): dq, dk sum over the two value heads reading key head 0.
  const Problem p = make_problem(201, 1, 13, 1, 2, 4, 3);
  const auto m = p.as<mp50>();
  const Upstream up = random_upstream(202, p);
  const Tensor<mp50> dO = up.dO.cast<mp50>(), dS_T = up.dS_T.cast<mp50>();
  Rng rng(203);
  for (const KdaVariant var : all_variants) {
    const auto L = [&](const std::vector<Tensor<mp50>>& x) {
      const auto out = kda_recurrent<mp50>(x[0], x[1], x[2], x[3], x[4], &x[5], m.scale, var);
      return mp50(inner(dO, out.o) + inner(dS_T, out.S_final));
    };
    const KdaGrad<mp50> gr = kda_recurrent_backward<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale, dO, &dS_T, var);
    const std::vector<Tensor<mp50>> x = {m.q, m.k, m.v, m.g, m.beta, m.S0};
    const std::vector<const Tensor<mp50>*> grads = {&gr.dq, &gr.dk, &gr.dv, &gr.dg, &gr.dbeta, &gr.dS0};
    const char* names[] = {"q", "k", "v", "g", "beta", "S0"};
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const Tensor<mp50> dx = randn_tensor(rng, x[i].shape).cast<mp50>();
      const double e = fd_rel_err(L, x, i, dx, inner(*grads[i], dx));
      INFO("variant " << variant_name(var) << ", d/d" << names[i] << ": relative error " << e);
      CHECK(e <= tol::backward_fd_mp.value);
      worst = std::max(worst, e);
    }
    INFO("variant " << variant_name(var) << ": worst relative error " << worst);
    CHECK(worst <= tol::backward_fd_mp.value);
  }
}

TEST_CASE("pre-op VJPs == central differences in cpp_bin_float_50 (L2Norm, Sigmoid, bounded and softplus gates)",
          "[backward][mp50]") {
  Rng rng(211);
  const Eigen::Index T = 5, HV = 2, dk = 3;
  const Mat<mp50> z = randn<mp50>(rng, T, HV * dk, 2.0), dy = randn<mp50>(rng, T, HV * dk);
  const Vec<mp50> A_log = randv<mp50>(rng, HV, -1.0, 1.0);
  const Mat<mp50> bias = randn<mp50>(rng, HV, dk);
  const auto matdir = [&](Eigen::Index r, Eigen::Index c) { return randn<mp50>(rng, r, c); };
  const auto central = [&](const std::function<mp50(const mp50&)>& L) {
    return mp50((L(fd_step) - L(mp50(-fd_step))) / (2 * fd_step));
  };
  const auto rel = [](const mp50& fd, const mp50& an) { return static_cast<double>(sabs<mp50>(mp50((fd - an) / an))); };
  SECTION("L2Norm, eps = 1e-6 and eps = 0") {
    for (const mp50& eps : {mp50(1e-6), mp50(0)}) {
      const Mat<mp50> dx = matdir(T, HV * dk);
      const mp50 an = inner(l2norm_backward<mp50>(z, dy, dk, eps), dx);
      const mp50 fd = central([&](const mp50& h) { return inner(dy, l2norm<mp50>(Mat<mp50>(z + h * dx), dk, eps)); });
      INFO("eps " << static_cast<double>(eps) << ": relative error " << rel(fd, an));
      CHECK(rel(fd, an) <= tol::backward_fd_mp.value);
    }
  }
  SECTION("Sigmoid") {
    const Mat<mp50> dx = matdir(T, HV * dk);
    const mp50 an = inner(sigmoid_mat_backward<mp50>(z, dy), dx);
    const mp50 fd = central([&](const mp50& h) { return inner(dy, sigmoid_mat<mp50>(Mat<mp50>(z + h * dx))); });
    INFO("relative error " << rel(fd, an));
    CHECK(rel(fd, an) <= tol::backward_fd_mp.value);
  }
  SECTION("gates: d/dz, d/dA_log, d/dbias") {
    for (const GateKind kind : {GateKind::bounded, GateKind::softplus}) {
      const GateGrad<mp50> gg = gate_backward<mp50>(z, A_log, bias, kind, dy);
      const Mat<mp50> dz = matdir(T, HV * dk), db = matdir(HV, dk);
      const Vec<mp50> dA = randn<mp50>(rng, HV, 1).col(0);
      const auto G = [&](const Mat<mp50>& zz, const Vec<mp50>& AA, const Mat<mp50>& bb) {
        return inner(dy, gate<mp50>(zz, AA, bb, kind));
      };
      const double ez = rel(central([&](const mp50& h) { return G(z + h * dz, A_log, bias); }), inner(gg.dz, dz));
      const double eA = rel(central([&](const mp50& h) { return G(z, A_log + h * dA, bias); }), gg.dA_log.dot(dA));
      const double eb = rel(central([&](const mp50& h) { return G(z, A_log, bias + h * db); }), inner(gg.dbias, db));
      INFO(gate_kind_name(kind) << ": relative errors dz " << ez << ", dA_log " << eA << ", dbias " << eb);
      CHECK(ez <= tol::backward_fd_mp.value);
      CHECK(eA <= tol::backward_fd_mp.value);
      CHECK(eb <= tol::backward_fd_mp.value);
    }
  }
}

namespace {
/// Raw kernel-style inputs in float64: q_raw, k_raw ~ N(0, 1) (not unit), g_raw ~ N(0, 1),
/// beta_raw ~ N(0, 1), A_log ~ U(-1, 1), bias ~ N(0, 1), v ~ N(0, 1), S0 ~ 0.1 N(0, 1).
struct RawProblem {
  Tensor<double> q_raw, k_raw, v, g_raw, beta_raw, A_log, bias, S0;
  double scale;
  std::vector<Tensor<double>> all() const { return {q_raw, k_raw, v, g_raw, beta_raw, A_log, bias, S0}; }
};
RawProblem make_raw(std::uint64_t seed, std::size_t B, std::size_t T, std::size_t H, std::size_t HV, std::size_t dk,
                    std::size_t dv) {
  Rng rng(seed);
  RawProblem r{randn_tensor(rng, {B, T, H, dk}), randn_tensor(rng, {B, T, H, dk}), randn_tensor(rng, {B, T, HV, dv}),
               randn_tensor(rng, {B, T, HV, dk}), randn_tensor(rng, {B, T, HV}), Tensor<double>({HV}),
               randn_tensor(rng, {HV, dk}), randn_tensor(rng, {B, HV, dk, dv}, 0.1),
               1.0 / std::sqrt(static_cast<double>(dk))};
  for (auto& a : r.A_log.data) a = rng.uniform(-1.0, 1.0);
  return r;
}
template <class S>
std::vector<Tensor<S>> cast_all(const std::vector<Tensor<double>>& x) {
  std::vector<Tensor<S>> r;
  for (const auto& t : x) r.push_back(t.cast<S>());
  return r;
}
template <class S>
KdaFusedGrad<S> fused_backward(const std::vector<Tensor<S>>& x, const S& scale, const Tensor<S>& dO,
                               const Tensor<S>* dS_T, GateKind kind, const S& l2_eps, std::size_t checkpoint = 0) {
  return kda_fused_backward<S>(x[0], x[1], x[2], x[3], x[4], x[5], x[6], &x[7], scale, dO, dS_T, {kind, S(-5)},
                               l2_eps, checkpoint);
}
template <class S>
std::vector<const Tensor<S>*> fused_grads(const KdaFusedGrad<S>& g) {
  return {&g.dq_raw, &g.dk_raw, &g.dv, &g.dg_raw, &g.dbeta_raw, &g.dA_log, &g.dbias, &g.dS0};
}
const char* fused_names[] = {"q_raw", "k_raw", "v", "g_raw", "beta_raw", "A_log", "bias", "S0"};
}  // namespace

TEST_CASE("fused-op VJP (kernel inputs) == central differences in cpp_bin_float_50, both gates",
          "[backward][mp50]") {
  const std::size_t B = 2, T = 9, H = 2, HV = 2, dk = 4, dv = 4;
  const RawProblem rp = make_raw(221, B, T, H, HV, dk, dv);
  const std::vector<Tensor<mp50>> x = cast_all<mp50>(rp.all());
  const mp50 scale(rp.scale);
  Rng rng(222);
  const Tensor<mp50> dO = randn_tensor(rng, {B, T, HV, dv}).cast<mp50>(),
                     dS_T = randn_tensor(rng, {B, HV, dk, dv}).cast<mp50>();
  for (const GateKind kind : {GateKind::bounded, GateKind::softplus})
    for (const mp50& l2_eps : {mp50(0), mp50(1e-6)}) {
      const auto L = [&](const std::vector<Tensor<mp50>>& y) {
        const auto out = kda_fused<mp50>(y[0], y[1], y[2], y[3], y[4], y[5], y[6], &y[7], scale, {kind, mp50(-5)}, l2_eps);
        return mp50(inner(dO, out.o) + inner(dS_T, out.S_final));
      };
      const KdaFusedGrad<mp50> gr = fused_backward<mp50>(x, scale, dO, &dS_T, kind, l2_eps);
      const auto grads = fused_grads(gr);
      for (std::size_t i = 0; i < x.size(); ++i) {
        const Tensor<mp50> dx = randn_tensor(rng, x[i].shape).cast<mp50>();
        const double e = fd_rel_err(L, x, i, dx, inner(*grads[i], dx));
        INFO(gate_kind_name(kind) << " gate, l2_eps " << static_cast<double>(l2_eps) << ", d/d" << fused_names[i]
                                  << ": relative error " << e);
        CHECK(e <= tol::backward_fd_mp.value);
      }
    }
}

TEST_CASE("float64 gradients == cpp_bin_float_50 gradients (recurrence and fused op)", "[backward][mp50]") {
  SECTION("recurrence, T = 64, H = 2, HV = 4, d_k = d_v = 8") {
    const Problem p = make_problem(231, 1, 64, 2, 4, 8, 8);
    const Upstream up = random_upstream(232, p);
    const auto m = p.as<mp50>();
    const Tensor<mp50> dO = up.dO.cast<mp50>(), dS_T = up.dS_T.cast<mp50>();
    const KdaGrad<double> d = kda_recurrent_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, up.dO, &up.dS_T);
    const KdaGrad<mp50> t = kda_recurrent_backward<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale, dO, &dS_T);
    const std::vector<std::pair<const Tensor<double>*, const Tensor<mp50>*>> pairs = {
        {&d.dq, &t.dq}, {&d.dk, &t.dk}, {&d.dv, &t.dv}, {&d.dg, &t.dg}, {&d.dbeta, &t.dbeta}, {&d.dS0, &t.dS0}};
    const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "dS0"};
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      const double e = rel_err<mp50>(pairs[i].first->cast<mp50>(), *pairs[i].second);
      INFO(names[i] << ": relative RMS " << e);
      CHECK(e <= tol::backward_f64_vs_mp.value);
      CHECK(e > 0.0);  // the two really are different precisions
    }
  }
  SECTION("fused op, T = 40, H = 1, HV = 2, d_k = d_v = 8, both gates") {
    const std::size_t B = 1, T = 40, H = 1, HV = 2, dk = 8, dv = 8;
    const RawProblem rp = make_raw(233, B, T, H, HV, dk, dv);
    Rng rng(234);
    const Tensor<double> dO = randn_tensor(rng, {B, T, HV, dv}), dS_T = randn_tensor(rng, {B, HV, dk, dv});
    const Tensor<mp50> dOm = dO.cast<mp50>(), dS_Tm = dS_T.cast<mp50>();
    for (const GateKind kind : {GateKind::bounded, GateKind::softplus}) {
      const auto d = fused_backward<double>(rp.all(), rp.scale, dO, &dS_T, kind, 0.0);
      const auto t = fused_backward<mp50>(cast_all<mp50>(rp.all()), mp50(rp.scale), dOm, &dS_Tm, kind, mp50(0));
      const auto gd = fused_grads(d);
      const auto gt = fused_grads(t);
      for (std::size_t i = 0; i < gd.size(); ++i) {
        const double e = rel_err<mp50>(gd[i]->cast<mp50>(), *gt[i]);
        INFO(gate_kind_name(kind) << " gate, d" << fused_names[i] << ": relative RMS " << e);
        CHECK(e <= tol::backward_f64_vs_mp.value);
      }
    }
  }
}

TEST_CASE("packed variable-length VJP == central differences in cpp_bin_float_50, empty sequence included",
          "[backward][mp50]") {
  const std::vector<std::size_t> cu = {0, 5, 5, 11, 12};  // lengths 5, 0, 6, 1
  const std::size_t N = cu.size() - 1;
  const Problem p = make_problem(271, 1, 12, 1, 2, 3, 2);
  const auto m = p.as<mp50>();
  Rng rng(272);
  const Tensor<mp50> S0 = randn_tensor(rng, {N, p.HV, p.dk, p.dv}, 0.1).cast<mp50>();
  const Tensor<mp50> dO = randn_tensor(rng, {1, p.T, p.HV, p.dv}).cast<mp50>(),
                     dS_T = randn_tensor(rng, {N, p.HV, p.dk, p.dv}).cast<mp50>();
  const auto L = [&](const std::vector<Tensor<mp50>>& x) {
    const auto out = kda_recurrent_varlen<mp50>(x[0], x[1], x[2], x[3], x[4], &x[5], cu, m.scale);
    return mp50(inner(dO, out.o) + inner(dS_T, out.S_final));
  };
  const KdaGrad<mp50> gr = kda_recurrent_varlen_backward<mp50>(m.q, m.k, m.v, m.g, m.beta, &S0, cu, m.scale, dO, &dS_T);
  const std::vector<Tensor<mp50>> x = {m.q, m.k, m.v, m.g, m.beta, S0};
  const std::vector<const Tensor<mp50>*> grads = {&gr.dq, &gr.dk, &gr.dv, &gr.dg, &gr.dbeta, &gr.dS0};
  const char* names[] = {"q", "k", "v", "g", "beta", "S0"};
  for (std::size_t i = 0; i < x.size(); ++i) {
    const Tensor<mp50> dx = randn_tensor(rng, x[i].shape).cast<mp50>();
    const double e = fd_rel_err(L, x, i, dx, inner(*grads[i], dx));
    INFO("varlen, d/d" << names[i] << ": relative error " << e);
    CHECK(e <= tol::backward_fd_mp.value);
  }
  const std::size_t st = p.HV * p.dk * p.dv;  // the empty sequence 1 passes its state through
  CHECK(std::equal(gr.dS0.data.begin() + st, gr.dS0.data.begin() + 2 * st, dS_T.data.begin() + st));
}

TEST_CASE("a loss on o_1..o_P has exactly zero gradient for every later token", "[backward]") {
  const std::size_t B = 1, T = 20, H = 1, HV = 2, dk = 5, dv = 4, P = 7;
  const auto zero_after = [&](const Tensor<double>& g, bool want_nonzero_before) {
    const std::size_t row = g.numel() / (g.dim(0) * g.dim(1));  // elements per token (B = 1)
    bool after_zero = true, before_nonzero = false;
    for (std::size_t i = 0; i < g.numel(); ++i) {
      if (i / row >= P && g.data[i] != 0.0) after_zero = false;
      if (i / row < P && g.data[i] != 0.0) before_nonzero = true;
    }
    CHECK(after_zero);
    if (want_nonzero_before) CHECK(before_nonzero);
  };
  Rng rng(241);
  Tensor<double> dO = randn_tensor(rng, {B, T, HV, dv});
  for (std::size_t i = P * HV * dv; i < dO.numel(); ++i) dO.data[i] = 0.0;
  SECTION("recurrence, every variant") {
    const Problem p = make_problem(242, B, T, H, HV, dk, dv);
    for (const KdaVariant var : all_variants) {
      INFO("variant " << variant_name(var));
      const auto g = kda_recurrent_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, dO, nullptr, var);
      for (const Tensor<double>* t : {&g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta})
        zero_after(*t, var == KdaVariant::kda && t != &g.dg);
    }
  }
  SECTION("fused op, both gates") {
    const RawProblem rp = make_raw(243, B, T, H, HV, dk, dv);
    for (const GateKind kind : {GateKind::bounded, GateKind::softplus}) {
      INFO(gate_kind_name(kind) << " gate");
      const auto g = fused_backward<double>(rp.all(), rp.scale, dO, nullptr, kind, 0.0);
      for (const Tensor<double>* t : {&g.dq_raw, &g.dk_raw, &g.dv, &g.dg_raw, &g.dbeta_raw}) zero_after(*t, true);
    }
  }
}

TEST_CASE("checkpointed reverse sweep == all states kept, bit for bit, for any checkpoint interval",
          "[backward]") {
  const Problem p = make_problem(251, 2, 23, 1, 2, 4, 3);
  const Upstream up = random_upstream(252, p);
  for (const KdaVariant var : {KdaVariant::kda, KdaVariant::gla}) {
    const auto all = kda_recurrent_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, up.dO, &up.dS_T, var, 0);
    for (const std::size_t C : {1, 2, 5, 7, 16, 22, 23, 40}) {
      INFO("variant " << variant_name(var) << ", checkpoint every " << C << " tokens (T = 23)");
      const auto c = kda_recurrent_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, up.dO, &up.dS_T, var, C);
      CHECK(c.dq.data == all.dq.data);
      CHECK(c.dk.data == all.dk.data);
      CHECK(c.dv.data == all.dv.data);
      CHECK(c.dg.data == all.dg.data);
      CHECK(c.dbeta.data == all.dbeta.data);
      CHECK(c.dS0.data == all.dS0.data);
    }
  }
}

TEST_CASE("backward rejects bad upstream gradients and bad inputs, naming the tensor", "[backward][errors]") {
  const Problem p = make_problem(261, 1, 6, 1, 1, 3, 2);
  const Tensor<double> dO({1, 6, 1, 2}), dS_T({1, 1, 3, 2});
  require_error([&] { kda_recurrent_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, Tensor<double>({1, 5, 1, 2}), &dS_T); },
                {"'dO'", "[1, 5, 1, 2]", "[1, 6, 1, 2]"});
  require_error([&] { kda_recurrent_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, dO, &dO); },
                {"'dS_T'", "[1, 1, 3, 2]"});
  Tensor<double> bad = dO;
  bad.data[3] = std::nan("");
  require_error([&] { kda_recurrent_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, bad, &dS_T); },
                {"'dO'", "non-finite", "flat index 3"});
  const RawProblem rp = make_raw(262, 1, 6, 1, 1, 3, 2);
  std::vector<Tensor<double>> x = rp.all();
  x[6] = Tensor<double>({1, 2});
  require_error([&] { fused_backward<double>(x, rp.scale, dO, nullptr, GateKind::bounded, 0.0); },
                {"'bias'", "[1, 2]", "[1, 3]"});
}
