// Unit tests of reference/mla_backward.hpp: the VJP of the MLA attention core (naive and absorbed)
// against central differences in cpp_bin_float_50, absorbed == naive gradients, causality (a query
// row's loss reaches no later cache row) and float64 against cpp_bin_float_50.
#include <functional>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "numerics/tolerance.hpp"
#include "reference/mla_backward.hpp"

using namespace kdalab;
using namespace kdatest;

namespace {
const mp50 fd_step("1e-17");  // central-difference step (numerics/tolerance.hpp)

MlaConfig small_cfg(std::size_t d_rope) {
  MlaConfig c;
  c.hidden = 8; c.n_h = 2; c.d_c = 5; c.d_nope = 3; c.d_rope = d_rope; c.d_v = 3;
  return c;
}
/// A random attention problem: T new queries after pos0 cached tokens (N = pos0 + T cache rows).
template <class S>
struct MlaProblem {
  MlaConfig cfg;
  MlaWeights<S> w;
  MlaProjected<S> p;
  Mat<S> C, K_R, dO;
  std::size_t pos0;
};
MlaProblem<double> make(std::uint64_t seed, const MlaConfig& cfg, Eigen::Index T, std::size_t pos0) {
  Rng rng(seed);
  const auto N = static_cast<Eigen::Index>(pos0) + T;
  const auto nh = static_cast<Eigen::Index>(cfg.n_h), dn = static_cast<Eigen::Index>(cfg.d_nope),
             dr = static_cast<Eigen::Index>(cfg.d_rope), dv = static_cast<Eigen::Index>(cfg.d_v),
             dc = static_cast<Eigen::Index>(cfg.d_c);
  MlaProblem<double> r{cfg, {}, {}, Mat<double>(), Mat<double>(), Mat<double>(), pos0};
  r.w.W_UK = randn<double>(rng, nh * dn, dc, 0.6);
  r.w.W_UV = randn<double>(rng, nh * dv, dc, 0.6);
  r.p.q_C = randn<double>(rng, T, nh * dn);
  r.p.q_R = randn<double>(rng, T, nh * dr);
  r.p.c = randn<double>(rng, T, dc);
  r.C = randn<double>(rng, N, dc);
  r.K_R = randn<double>(rng, N, dr);
  r.dO = randn<double>(rng, T, nh * dv);
  return r;
}
MlaProblem<mp50> to_mp(const MlaProblem<double>& d) {
  MlaProblem<mp50> r{d.cfg, d.w.cast<mp50>(), {}, d.C.cast<mp50>(), d.K_R.cast<mp50>(), d.dO.cast<mp50>(), d.pos0};
  r.p.q_C = d.p.q_C.cast<mp50>();
  r.p.q_R = d.p.q_R.cast<mp50>();
  r.p.c = d.p.c.cast<mp50>();
  return r;
}
/// The six differentiated inputs of a problem, in the order of MlaAttendGrad.
template <class S>
std::vector<Mat<S>*> inputs(MlaProblem<S>& q) { return {&q.p.q_C, &q.p.q_R, &q.C, &q.K_R, &q.w.W_UK, &q.w.W_UV}; }
template <class S>
std::vector<const Mat<S>*> grads(const MlaAttendGrad<S>& g) { return {&g.dq_C, &g.dq_R, &g.dC, &g.dK_R, &g.dW_UK, &g.dW_UV}; }
const char* names[] = {"q_C", "q_R", "C", "K_R", "W_UK", "W_UV"};
template <class S>
double rel(const Mat<S>& a, const Mat<S>& b) {
  return static_cast<double>(S((a - b).norm() / b.norm()));
}
}  // namespace

TEST_CASE("MLA attention VJP == central differences in cpp_bin_float_50 (naive and absorbed)", "[backward][mla][mp50]") {
  for (const std::size_t d_rope : {std::size_t(0), std::size_t(2)}) {
    const MlaProblem<mp50> base = to_mp(make(401 + d_rope, small_cfg(d_rope), 4, 3));
    Rng rng(402);
    for (const bool absorbed : {false, true}) {
      const auto attend = [&](const MlaProblem<mp50>& q) {
        return absorbed ? mla_attend_absorbed<mp50>(q.cfg, q.w, q.p, q.C, q.K_R, q.pos0)
                        : mla_attend_naive<mp50>(q.cfg, q.w, q.p, q.C, q.K_R, q.pos0);
      };
      const MlaAttendGrad<mp50> g =
          absorbed ? mla_attend_absorbed_backward<mp50>(base.cfg, base.w, base.p, base.C, base.K_R, base.pos0, base.dO)
                   : mla_attend_naive_backward<mp50>(base.cfg, base.w, base.p, base.C, base.K_R, base.pos0, base.dO);
      const auto gs = grads(g);
      for (std::size_t k = 0; k < gs.size(); ++k) {
        if (d_rope == 0 && (k == 1 || k == 3)) continue;  // no q_R, K_R
        MlaProblem<mp50> q = base;
        const Mat<mp50> x0 = *inputs(q)[k];
        const Mat<mp50> dir = randn<mp50>(rng, x0.rows(), x0.cols());
        *inputs(q)[k] = x0 + fd_step * dir;
        const mp50 lp = base.dO.cwiseProduct(attend(q)).sum();
        *inputs(q)[k] = x0 - fd_step * dir;
        const mp50 lm = base.dO.cwiseProduct(attend(q)).sum();
        const mp50 fd = (lp - lm) / (2 * fd_step), an = gs[k]->cwiseProduct(dir).sum();
        const double e = static_cast<double>(sabs<mp50>(mp50((fd - an) / an)));
        INFO((absorbed ? "absorbed" : "naive") << ", d_rope " << d_rope << ", d/d" << names[k] << ": relative error " << e);
        CHECK(e <= tol::backward_fd_mp.value);
      }
    }
  }
}

TEST_CASE("MLA absorbed VJP == naive VJP in float64", "[backward][mla]") {
  for (const std::size_t d_rope : {std::size_t(0), std::size_t(4)}) {
    MlaConfig cfg = small_cfg(d_rope);
    cfg.n_h = 3; cfg.d_c = 12; cfg.d_nope = 8; cfg.d_v = 6;
    const MlaProblem<double> q = make(411, cfg, 9, 5);
    const auto a = mla_attend_absorbed_backward<double>(q.cfg, q.w, q.p, q.C, q.K_R, q.pos0, q.dO);
    const auto n = mla_attend_naive_backward<double>(q.cfg, q.w, q.p, q.C, q.K_R, q.pos0, q.dO);
    const auto ga = grads(a), gn = grads(n);
    for (std::size_t k = 0; k < ga.size(); ++k) {
      if (d_rope == 0 && (k == 1 || k == 3)) continue;
      INFO("d_rope " << d_rope << ", d" << names[k] << ": relative difference " << rel(*ga[k], *gn[k]));
      CHECK(rel(*ga[k], *gn[k]) <= tol::f64_identity.value);
    }
  }
}

TEST_CASE("MLA: a loss on query row t has exactly zero gradient for cache rows after pos0 + t", "[backward][mla]") {
  const MlaProblem<double> base = make(421, small_cfg(2), 6, 2);
  for (Eigen::Index t = 0; t < 6; ++t) {
    MlaProblem<double> q = base;
    for (Eigen::Index r = 0; r < q.dO.rows(); ++r)
      if (r != t) q.dO.row(r).setZero();
    for (const bool absorbed : {false, true}) {
      const auto g = absorbed ? mla_attend_absorbed_backward<double>(q.cfg, q.w, q.p, q.C, q.K_R, q.pos0, q.dO)
                              : mla_attend_naive_backward<double>(q.cfg, q.w, q.p, q.C, q.K_R, q.pos0, q.dO);
      const Eigen::Index last = static_cast<Eigen::Index>(q.pos0) + t;  // the last cache row query t sees
      INFO((absorbed ? "absorbed" : "naive") << ", query row " << t);
      bool later_zero = true;
      for (Eigen::Index r = last + 1; r < g.dC.rows(); ++r)
        later_zero = later_zero && g.dC.row(r).cwiseAbs().maxCoeff() == 0.0 && g.dK_R.row(r).cwiseAbs().maxCoeff() == 0.0;
      CHECK(later_zero);
      CHECK(g.dC.row(last).norm() > 0.0);
    }
  }
}

TEST_CASE("MLA float64 gradients == cpp_bin_float_50 gradients", "[backward][mla][mp50]") {
  MlaConfig cfg = small_cfg(4);
  cfg.n_h = 2; cfg.d_c = 16; cfg.d_nope = 8; cfg.d_v = 8;
  const MlaProblem<double> q = make(431, cfg, 12, 20);
  const MlaProblem<mp50> m = to_mp(q);
  const auto d = mla_attend_absorbed_backward<double>(q.cfg, q.w, q.p, q.C, q.K_R, q.pos0, q.dO);
  const auto t = mla_attend_absorbed_backward<mp50>(m.cfg, m.w, m.p, m.C, m.K_R, m.pos0, m.dO);
  const auto gd = grads(d);
  const auto gt = grads(t);
  for (std::size_t k = 0; k < gd.size(); ++k) {
    const double e = rel<mp50>(gd[k]->cast<mp50>(), *gt[k]);
    INFO("d" << names[k] << ": relative RMS " << e);
    CHECK(e <= tol::backward_f64_vs_mp.value);
  }
}

namespace {
/// Every weight matrix of MlaWeights with its name, in a fixed order.
template <class S>
std::vector<std::pair<std::string, Mat<S>*>> mla_weight_mats(MlaWeights<S>& w) {
  return {{"W_DKV", &w.W_DKV}, {"W_KR", &w.W_KR}, {"W_Q", &w.W_Q}, {"W_DQ", &w.W_DQ}, {"W_UQ", &w.W_UQ},
          {"W_UK", &w.W_UK},   {"W_UV", &w.W_UV}, {"W_g", &w.W_g}, {"W_o", &w.W_o}};
}
}  // namespace

TEST_CASE("MLA layer VJP == central differences in cpp_bin_float_50 for x and every projection weight "
          "(RoPE on/off, q_lora_rank 0/3, gate on/off)",
          "[backward][mla][mp50]") {
  struct Variant {
    bool rope;
    std::size_t d_cq;
    bool gate;
    MlaEval eval;
  };
  for (const Variant var : {Variant{false, 0, true, MlaEval::naive}, Variant{true, 3, true, MlaEval::absorbed},
                            Variant{true, 0, false, MlaEval::naive}}) {
    MlaConfig cfg = small_cfg(2);
    cfg.rope = var.rope;
    cfg.d_cq = var.d_cq;
    cfg.output_gate = var.gate;
    Rng wr(441);
    const MlaWeights<mp50> w = mla_random_weights<mp50>(cfg, [&] { return wr.normal(); });
    Rng rng(442);
    const Eigen::Index T = 5;
    const Mat<mp50> x = randn<mp50>(rng, T, 8), dy = randn<mp50>(rng, T, 8);
    const MlaLayerGrad<mp50> g = mla_prefill_backward<mp50>(cfg, w, x, dy, var.eval);
    const auto L = [&](const Mat<mp50>& xx, const MlaWeights<mp50>& ww) {
      MlaCache<mp50> cache(cfg, static_cast<std::size_t>(T));
      return mp50(dy.cwiseProduct(mla_prefill<mp50>(cfg, ww, xx, cache, var.eval)).sum());
    };
    const auto central = [&](const std::function<mp50(const mp50&)>& f, const mp50& an) {
      const mp50 fd = (f(fd_step) - f(mp50(-fd_step))) / (2 * fd_step);
      return static_cast<double>(sabs<mp50>(mp50((fd - an) / an)));
    };
    const std::string where = std::string("rope ") + (var.rope ? "on" : "off") + ", d_cq " + std::to_string(var.d_cq) +
                              ", gate " + (var.gate ? "on" : "off") + ", " + mla_eval_name(var.eval);
    const Mat<mp50> dx = randn<mp50>(rng, T, 8);
    const double ex = central([&](const mp50& h) { return L(Mat<mp50>(x + h * dx), w); }, g.dx.cwiseProduct(dx).sum());
    INFO(where << ", d/dx: relative error " << ex);
    CHECK(ex <= tol::backward_fd_mp.value);
    MlaWeights<mp50> wd = w, gd = g.dw;
    auto mats = mla_weight_mats(wd);
    auto gmats = mla_weight_mats(gd);
    for (std::size_t i = 0; i < mats.size(); ++i) {
      if (mats[i].second->size() == 0) {  // not used by this config: no gradient either
        CHECK(gmats[i].second->size() == 0);
        continue;
      }
      const Mat<mp50> w0 = *mats[i].second;
      const Mat<mp50> dir = randn<mp50>(rng, w0.rows(), w0.cols());
      const double e = central(
          [&](const mp50& h) {
            *mats[i].second = w0 + h * dir;
            const mp50 l = L(x, wd);
            *mats[i].second = w0;
            return l;
          },
          gmats[i].second->cwiseProduct(dir).sum());
      INFO(where << ", d/d" << mats[i].first << ": relative error " << e);
      CHECK(e <= tol::backward_fd_mp.value);
    }
  }
}

TEST_CASE("MLA layer VJP rejects dY of the wrong shape, naming it", "[backward][mla][errors]") {
  const MlaConfig cfg = small_cfg(2);
  Rng wr(451);
  const MlaWeights<double> w = mla_random_weights<double>(cfg, [&] { return wr.normal(); });
  require_error([&] { mla_prefill_backward<double>(cfg, w, Mat<double>::Zero(3, 8), Mat<double>::Zero(3, 7)); },
                {"'dY'", "[3, 7]", "[3, 8]"});
}
