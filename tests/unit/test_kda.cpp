// Unit tests of reference/kda.hpp: the recurrence in its three forms (product, delta, gradient
// step), the d_v x d_k state orientation (its stated transpose), the special cases, float64 vs the mp50 truth, decode == prefill,
// and bad input (docs/equations.md section 1).
#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/kda.hpp"

using namespace kdalab;
using namespace kdatest;

namespace {
/// Anchor-like heads: beta ~ U(0.05, 1), S0 ~ N(0, 0.01), g in [-5, 0].
Head random_head(std::uint64_t seed, Eigen::Index T, Eigen::Index dk, Eigen::Index dv) {
  return kdatest::random_head(seed, T, dk, dv, 0.05, 1.0, 0.1, 5.0);
}
}  // namespace

TEST_CASE("product form, delta form and gradient-step form agree (K3 Eq. 1)") {
  const Eigen::Index T = 60, dk = 6, dv = 5;
  const Head h = random_head(31, T, dk, dv);
  Mat<double> Sd = h.S0, Sp = h.S0, Sg = h.S0;
  double worst_p = 0, worst_g = 0;
  for (Eigen::Index t = 0; t < T; ++t) {
    const Vec<double> q = h.q.row(t).transpose(), k = h.k.row(t).transpose(), v = h.v.row(t).transpose(),
                      g = h.g.row(t).transpose();
    const Vec<double> od = kda_step<double>(Sd, q, k, v, g, h.beta(t), 0.4);
    const Vec<double> op = kda_step_product<double>(Sp, q, k, v, g, h.beta(t), 0.4);
    const Vec<double> og = kda_step_gradient<double>(Sg, q, k, v, g, h.beta(t), 0.4);
    worst_p = std::max(worst_p, (op - od).norm() / od.norm());
    worst_g = std::max(worst_g, (og - od).norm() / od.norm());
  }
  INFO("product vs delta " << worst_p << ", gradient vs delta " << worst_g);
  CHECK(worst_p <= tol::f64_identity.value);
  CHECK(worst_g <= tol::f64_identity.value);
  CHECK(rel_err(Sp, Sd) <= tol::f64_identity.value);
  CHECK(rel_err(Sg, Sd) <= tol::f64_identity.value);
}

TEST_CASE("a state held as d_v x d_k (read o = S k) is the stated transpose S^T of the reference state") {
  const Eigen::Index T = 30, dk = 5, dv = 3;
  const Head h = random_head(32, T, dk, dv);
  Mat<double> S = h.S0, Ss = to_seed_layout(h.S0);
  for (Eigen::Index t = 0; t < T; ++t) {
    const Vec<double> q = h.q.row(t).transpose(), k = h.k.row(t).transpose(), v = h.v.row(t).transpose(),
                      g = h.g.row(t).transpose();
    const Vec<double> o = kda_step<double>(S, q, k, v, g, h.beta(t), 1.0);
    const Vec<double> os = kda_step_seed<double>(Ss, q, k, v, g, h.beta(t), 1.0);
    CHECK((os - o).norm() <= tol::f64_identity.value * o.norm());
  }
  CHECK(Ss.rows() == dv);
  CHECK(rel_err<double>(Ss, to_seed_layout(S)) <= tol::f64_identity.value);
}

TEST_CASE("special cases reduce correctly (docs/equations.md section 1)") {
  const std::size_t T = 25, H = 2, HV = 2, dk = 4, dv = 3;
  const Problem p = make_problem(33, 1, T, H, HV, dk, dv);
  const auto run = [&](const Tensor<double>& g, const Tensor<double>& beta, KdaVariant var) {
    return kda_recurrent(p.q, p.k, p.v, g, beta, &p.S0, p.scale, var);
  };
  SECTION("deltanet == kda with g = 0") {
    const Tensor<double> g0(p.g.shape, 0.0);
    CHECK(rel_err(run(p.g, p.beta, KdaVariant::deltanet).o, run(g0, p.beta, KdaVariant::kda).o) == 0.0);
  }
  SECTION("gated deltanet == kda with g[0] on every channel") {
    Tensor<double> gs = p.g;
    for (std::size_t r = 0; r < gs.numel() / dk; ++r)
      for (std::size_t i = 1; i < dk; ++i) gs.data[r * dk + i] = gs.data[r * dk];
    const auto a = run(p.g, p.beta, KdaVariant::gated_deltanet), b = run(gs, p.beta, KdaVariant::kda);
    CHECK(rel_err(a.o, b.o) <= tol::f64_identity.value);
    CHECK(rel_err(a.S_final, b.S_final) <= tol::f64_identity.value);
    CHECK(rel_err(a.o, run(p.g, p.beta, KdaVariant::kda).o) > 1e-3);  // and it differs from per-channel KDA
  }
  SECTION("gla: S = Diag(alpha) S + k v^T, beta ignored; linear: S = S + k v^T") {
    const Tensor<double> beta_other(p.beta.shape, 0.3);
    const auto gla = run(p.g, p.beta, KdaVariant::gla);
    CHECK(rel_err(gla.o, run(p.g, beta_other, KdaVariant::gla).o) == 0.0);
    const auto lin = run(p.g, p.beta, KdaVariant::linear);
    // closed forms per head: o_t = scale (Gamma_t q_t)^T S0 + scale sum_{j<=t} (q_t ⊙ e^{G_t - G_j})^T k_j v_j
    for (KdaVariant var : {KdaVariant::gla, KdaVariant::linear}) {
      const auto& out = var == KdaVariant::gla ? gla : lin;
      double worst = 0;
      for (std::size_t h = 0; h < HV; ++h)
        for (std::size_t t = 0; t < T; ++t) {
          Vec<double> G = Vec<double>::Zero(dk), ref = Vec<double>::Zero(dv);
          std::vector<Vec<double>> Gs;
          for (std::size_t s = 0; s <= t; ++s) {
            for (std::size_t i = 0; i < dk; ++i) G(i) += var == KdaVariant::gla ? p.g(0, s, h, i) : 0.0;
            Gs.push_back(G);
          }
          for (std::size_t i = 0; i < dk; ++i)
            for (std::size_t j = 0; j < dv; ++j) ref(j) += p.q(0, t, h, i) * std::exp(G(i)) * p.S0(0, h, i, j);
          for (std::size_t s = 0; s <= t; ++s) {
            double w = 0;
            for (std::size_t i = 0; i < dk; ++i) w += p.q(0, t, h, i) * std::exp(G(i) - Gs[s](i)) * p.k(0, s, h, i);
            for (std::size_t j = 0; j < dv; ++j) ref(j) += w * p.v(0, s, h, j);
          }
          for (std::size_t j = 0; j < dv; ++j) worst = std::max(worst, std::abs(p.scale * ref(j) - out.o(0, t, h, j)));
        }
      INFO(variant_name(var) << " worst abs error vs closed form " << worst);
      CHECK(worst <= 1e-13);
    }
  }
  SECTION("beta = 0: the state only fades") {
    const Tensor<double> b0(p.beta.shape, 0.0);
    const auto r = run(p.g, b0, KdaVariant::kda);
    for (std::size_t h = 0; h < HV; ++h)
      for (std::size_t i = 0; i < dk; ++i) {
        double G = 0;
        for (std::size_t t = 0; t < T; ++t) G += p.g(0, t, h, i);
        for (std::size_t j = 0; j < dv; ++j)
          CHECK(std::abs(r.S_final(0, h, i, j) - std::exp(G) * p.S0(0, h, i, j)) <= 1e-15);
      }
  }
  SECTION("beta = 1 with a unit key: reading k right after the write returns exactly v") {
    Rng rng(34);
    Mat<double> S = randn<double>(rng, dk, dv);
    for (int rep = 0; rep < 5; ++rep) {
      Vec<double> k = randn<double>(rng, dk, 1).col(0);
      k.normalize();
      const Vec<double> v = randn<double>(rng, dv, 1).col(0), g = randv<double>(rng, dk, -5.0, 0.0);
      const Vec<double> o = kda_step<double>(S, k, k, v, g, 1.0, 1.0);
      CHECK((o - v).norm() <= 1e-14 * v.norm());
    }
  }
}

TEST_CASE("float64 recurrence == cpp_bin_float_50 truth") {
  const Problem p = make_problem(35, 1, 64, 2, 4, 8, 8);
  const auto d = kda_recurrent(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale);
  const auto m = p.as<mp50>();
  const auto t = kda_recurrent<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale);
  const double eo = rel_err<mp50>(d.o.cast<mp50>(), t.o), es = rel_err<mp50>(d.S_final.cast<mp50>(), t.S_final);
  INFO("rel err o " << eo << ", S " << es);
  CHECK(eo <= tol::f64_vs_mp.value);
  CHECK(es <= tol::f64_vs_mp.value);
  CHECK(eo > 0.0);  // the two really are different precisions
}

TEST_CASE("decode steps == prefill: T1 tokens, then one token at a time with the carried state") {
  const std::size_t T = 40, T1 = 13;
  const Problem p = make_problem(36, 2, T, 2, 4, 5, 3);
  const auto full = kda_recurrent(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale);
  // slice helper along T for B = 2
  auto sl = [](const Tensor<double>& x, std::size_t t0, std::size_t t1) {
    std::vector<std::size_t> shp = x.shape;
    shp[1] = t1 - t0;
    Tensor<double> y(shp);
    const std::size_t row = x.numel() / (x.shape[0] * x.shape[1]);
    for (std::size_t b = 0; b < x.shape[0]; ++b)
      for (std::size_t t = t0; t < t1; ++t)
        for (std::size_t i = 0; i < row; ++i) y.data[(b * (t1 - t0) + t - t0) * row + i] = x.data[(b * x.shape[1] + t) * row + i];
    return y;
  };
  auto pre = kda_recurrent(sl(p.q, 0, T1), sl(p.k, 0, T1), sl(p.v, 0, T1), sl(p.g, 0, T1), sl(p.beta, 0, T1), &p.S0,
                           p.scale);
  Tensor<double> state = pre.S_final;
  double worst = 0;
  for (std::size_t t = T1; t < T; ++t) {
    const auto step = kda_recurrent(sl(p.q, t, t + 1), sl(p.k, t, t + 1), sl(p.v, t, t + 1), sl(p.g, t, t + 1),
                                    sl(p.beta, t, t + 1), &state, p.scale);
    state = step.S_final;
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t h = 0; h < 4; ++h)
        for (std::size_t j = 0; j < 3; ++j) worst = std::max(worst, std::abs(step.o(b, 0, h, j) - full.o(b, t, h, j)));
  }
  CHECK(worst <= 1e-14);
  CHECK(rel_err(state, full.S_final) <= tol::f64_identity.value);
}

TEST_CASE("bad input gives a kdalab::Error naming the tensor") {
  const Problem p = make_problem(37, 1, 5, 2, 2, 3, 3);
  const auto call = [&](const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v, const Tensor<double>& g,
                        const Tensor<double>& beta, const Tensor<double>* S0) {
    return [=] { kda_recurrent(q, k, v, g, beta, S0, p.scale); };
  };
  require_error(call(p.q, Tensor<double>({1, 5, 2, 4}), p.v, p.g, p.beta, &p.S0), {"'k'", "[1, 5, 2, 4]"});
  require_error(call(p.q, p.k, p.v, p.g, Tensor<double>({1, 4, 2}), &p.S0), {"'beta'"});
  const Tensor<double> badS0({1, 2, 3, 4});
  require_error(call(p.q, p.k, p.v, p.g, p.beta, &badS0), {"'S0'"});
  Tensor<double> v = p.v;
  v.data[7] = NAN;
  require_error(call(p.q, p.k, v, p.g, p.beta, &p.S0), {"'v'", "non-finite", "flat index 7"});
  Tensor<double> q = p.q;
  q.data[2] = INFINITY;
  require_error(call(q, p.k, p.v, p.g, p.beta, &p.S0), {"'q'", "non-finite"});
  Tensor<double> g = p.g;
  g.data[4] = 0.5;
  require_error(call(p.q, p.k, p.v, g, p.beta, &p.S0), {"'g'", "> 0", "flat index 4"});
  // HV = 3 value heads over H = 2 key heads
  const Problem p3 = make_problem(38, 1, 5, 2, 3, 3, 3);
  require_error(call(p3.q, p3.k, p3.v, p3.g, p3.beta, &p3.S0), {"'v'", "HV = 3", "H = 2"});
}

TEST_CASE("varlen recurrence == sequences one by one, each with its own state, last of length 1") {
  const std::vector<std::size_t> cu{0, 7, 7, 30, 31};
  const Problem p = make_problem(39, 1, 31, 2, 4, 4, 3);
  Rng rng(40);
  Tensor<double> S0({4, 4, 4, 3});
  rng.fill_normal(S0, 0.1);
  const auto r = kda_recurrent_varlen(p.q, p.k, p.v, p.g, p.beta, &S0, cu, p.scale);
  for (std::size_t n = 0; n + 1 < cu.size(); ++n) {
    Tensor<double> s0({1, 4, 4, 3});
    std::copy(S0.data.begin() + n * 48, S0.data.begin() + (n + 1) * 48, s0.data.begin());
    if (cu[n + 1] == cu[n]) {
      for (std::size_t i = 0; i < 48; ++i) CHECK(r.S_final.data[n * 48 + i] == s0.data[i]);
      continue;
    }
    const auto one = kda_recurrent(slice_tokens(p.q, cu[n], cu[n + 1]), slice_tokens(p.k, cu[n], cu[n + 1]),
                                   slice_tokens(p.v, cu[n], cu[n + 1]), slice_tokens(p.g, cu[n], cu[n + 1]),
                                   slice_tokens(p.beta, cu[n], cu[n + 1]), &s0, p.scale);
    CHECK(rel_err(slice_tokens(r.o, cu[n], cu[n + 1]), one.o) == 0.0);
    for (std::size_t i = 0; i < 48; ++i) CHECK(r.S_final.data[n * 48 + i] == one.S_final.data[i]);
  }
  // running the packed batch as ONE sequence differs (the states must not leak across sequences)
  const auto leak = kda_recurrent<double>(p.q, p.k, p.v, p.g, p.beta, nullptr, p.scale);
  CHECK(rel_err(slice_tokens(leak.o, 7, 31), slice_tokens(r.o, 7, 31)) > 1e-3);
  require_error([&] { kda_recurrent_varlen(p.q, p.k, p.v, p.g, p.beta, &S0, {0, 7, 5, 31}, p.scale); },
                {"'cu_seqlens'", "index 2"});
  require_error([&] { kda_recurrent_varlen(p.q, p.k, p.v, p.g, p.beta, &S0, {0, 7, 30}, p.scale); },
                {"'cu_seqlens'", "31"});
  require_error([&] { kda_recurrent_varlen(p.q, p.k, p.v, p.g, p.beta, &S0, {0, 31}, p.scale); }, {"'S0'"});
}
