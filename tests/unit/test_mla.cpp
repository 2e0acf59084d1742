// Gated MLA identities: absorbed == naive, streaming (online softmax) == full softmax,
// decode over the latent cache == prefill, an independent loop-by-loop evaluation of the equations,
// cpp_bin_float_50 vs double, cache footprint numbers and the errors bad input must raise.
#include <cmath>
#include <string>
#include <vector>

#include "numerics/random.hpp"
#include "numerics/tolerance.hpp"
#include "reference/mla.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

namespace {

template <class A, class B>
double rel(const A& out, const B& ref) {
  const Mat<double> o = out.template cast<double>(), r = ref.template cast<double>();
  return (o - r).norm() / r.norm();
}

template <class S>
Mat<S> random_x(std::size_t T, std::size_t d, std::uint64_t seed) {
  Rng rng(seed);
  Mat<S> X(T, d);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t i = 0; i < d; ++i) X(t, i) = S(rng.normal());
  return X;
}

MlaConfig small_cfg(bool rope, std::size_t d_rope, std::size_t d_cq, bool gate) {
  MlaConfig c;
  c.hidden = 24; c.n_h = 3; c.d_c = 10; c.d_cq = d_cq; c.d_nope = 6; c.d_rope = d_rope; c.d_v = 5;
  c.rope = rope; c.rope_theta = 100.0; c.output_gate = gate;
  return c;
}

std::vector<MlaConfig> variants() {
  return {small_cfg(false, 0, 0, true),   // pure latent, NoPE, gated (K3, docs/equations.md section 5)
          small_cfg(false, 4, 0, false),  // shared k^R unrotated, no gate (Kimi Linear, mla_use_nope)
          small_cfg(true, 4, 8, true),    // DeepSeek-V2 decoupled RoPE, low-rank q, gated
          small_cfg(true, 2, 0, false)};
}

MlaWeights<double> weights(const MlaConfig& c, std::uint64_t seed) {
  Rng rng(seed);
  return mla_random_weights<double>(c, [&] { return rng.normal(); }, 0.0);
}

/// The equations of docs/equations.md section 5 written out with scalar loops, independent of mla.hpp's
/// matrix code (only rope_rotate is shared).
Mat<double> mla_by_loops(const MlaConfig& c, const MlaWeights<double>& w, const Mat<double>& X) {
  const std::size_t T = X.rows(), d = c.hidden, dqk = c.d_nope + c.d_rope;
  std::vector<Vec<double>> cl(T), kr(T), q(T), g(T);
  for (std::size_t t = 0; t < T; ++t) {
    cl[t] = Vec<double>::Zero(c.d_c);
    for (std::size_t a = 0; a < c.d_c; ++a)
      for (std::size_t i = 0; i < d; ++i) cl[t](a) += w.W_DKV(a, i) * X(t, i);
    kr[t] = Vec<double>::Zero(c.d_rope);
    for (std::size_t a = 0; a < c.d_rope; ++a)
      for (std::size_t i = 0; i < d; ++i) kr[t](a) += w.W_KR(a, i) * X(t, i);
    Vec<double> xq = X.row(t).transpose();
    if (c.d_cq) xq = w.W_DQ * xq;
    q[t] = (c.d_cq ? w.W_UQ : w.W_Q) * xq;
    if (c.rope) {
      rope_rotate<double>(kr[t], t, c.rope_theta);
      for (std::size_t h = 0; h < c.n_h; ++h) rope_rotate<double>(q[t].segment(h * dqk + c.d_nope, c.d_rope), t, c.rope_theta);
    }
    if (c.output_gate) {
      g[t] = w.W_g * X.row(t).transpose();
      for (auto& z : g[t]) z = 1.0 / (1.0 + std::exp(-z));
    }
  }
  Mat<double> Y(T, d);
  for (std::size_t t = 0; t < T; ++t) {
    Vec<double> o = Vec<double>::Zero(c.n_h * c.d_v);
    for (std::size_t h = 0; h < c.n_h; ++h) {
      std::vector<double> s(t + 1);
      double mx = -1e300;
      for (std::size_t tau = 0; tau <= t; ++tau) {
        double acc = 0;
        for (std::size_t a = 0; a < c.d_nope; ++a) {
          double k = 0;
          for (std::size_t b = 0; b < c.d_c; ++b) k += w.W_UK(h * c.d_nope + a, b) * cl[tau](b);
          acc += q[t](h * dqk + a) * k;
        }
        for (std::size_t a = 0; a < c.d_rope; ++a) acc += q[t](h * dqk + c.d_nope + a) * kr[tau](a);
        s[tau] = acc / std::sqrt(static_cast<double>(dqk));
        mx = std::max(mx, s[tau]);
      }
      double l = 0;
      for (auto& e : s) { e = std::exp(e - mx); l += e; }
      for (std::size_t tau = 0; tau <= t; ++tau)
        for (std::size_t a = 0; a < c.d_v; ++a) {
          double v = 0;
          for (std::size_t b = 0; b < c.d_c; ++b) v += w.W_UV(h * c.d_v + a, b) * cl[tau](b);
          o(h * c.d_v + a) += s[tau] / l * v;
        }
    }
    if (c.output_gate) o = o.cwiseProduct(g[t]);
    Y.row(t) = (w.W_o * o).transpose();
  }
  return Y;
}

}  // namespace

TEST_CASE("MLA naive prefill equals the equations written as loops", "[mla]") {
  for (const auto& c : variants()) {
    const auto w = weights(c, 11);
    const Mat<double> X = random_x<double>(9, c.hidden, 12);
    MlaCache<double> cache(c, 9);
    const Mat<double> Y = mla_prefill(c, w, X, cache, MlaEval::naive);
    INFO("rope " << c.rope << " d_rope " << c.d_rope << " d_cq " << c.d_cq << " gate " << c.output_gate);
    CHECK(rel(Y, mla_by_loops(c, w, X)) <= tol::f64_identity.value);
    CHECK(cache.len == 9);
  }
}

TEST_CASE("MLA absorbed == naive and streaming (online softmax) == full softmax", "[mla]") {
  for (const auto& c : variants()) {
    const auto w = weights(c, 21);
    const Mat<double> X = random_x<double>(37, c.hidden, 22);
    MlaCache<double> c0(c, 37), c1(c, 37);
    const Mat<double> Yn = mla_prefill(c, w, X, c0, MlaEval::naive);
    const Mat<double> Ya = mla_prefill(c, w, X, c1, MlaEval::absorbed);
    INFO("rope " << c.rope << " d_rope " << c.d_rope << " d_cq " << c.d_cq << " gate " << c.output_gate);
    CHECK(rel(Ya, Yn) <= tol::f64_identity.value);
    for (std::size_t tile : {1u, 4u, 5u, 16u, 64u}) {
      MlaCache<double> c2(c, 37);
      const Mat<double> Ys = mla_prefill(c, w, X, c2, MlaEval::streaming, tile);
      INFO("tile " << tile);
      CHECK(rel(Ys, Yn) <= tol::f64_identity.value);
    }
  }
}

TEST_CASE("MLA streaming survives logits that overflow a naive exp", "[mla]") {
  // Scores of ~1e3 (large weights): exp would overflow without the running max.
  const MlaConfig c = small_cfg(false, 0, 0, true);
  Rng rng(5);
  const auto w = mla_random_weights<double>(c, [&] { return rng.normal(); }, 3.0);
  const Mat<double> X = random_x<double>(20, c.hidden, 6) * 3.0;
  MlaCache<double> c0(c, 20), c1(c, 20);
  const Mat<double> Yn = mla_prefill(c, w, X, c0, MlaEval::naive);
  const Mat<double> Ys = mla_prefill(c, w, X, c1, MlaEval::streaming, 3);
  REQUIRE(Yn.allFinite());
  CHECK(rel(Ys, Yn) <= tol::f64_identity.value);
}

TEST_CASE("MLA decode over the latent cache == prefill; chunked prefill == prefill", "[mla]") {
  for (const auto& c : variants()) {
    const auto w = weights(c, 31);
    const std::size_t T = 23;
    const Mat<double> X = random_x<double>(T, c.hidden, 32);
    MlaCache<double> cp(c, T), cd(c, T), cc(c, T);
    const Mat<double> Yp = mla_prefill(c, w, X, cp, MlaEval::naive);
    Mat<double> Yd(T, c.hidden);
    for (std::size_t t = 0; t < T; ++t) Yd.row(t) = mla_decode(c, w, Vec<double>(X.row(t).transpose()), cd).transpose();
    INFO("rope " << c.rope << " d_rope " << c.d_rope << " d_cq " << c.d_cq << " gate " << c.output_gate);
    CHECK(rel(Yd, Yp) <= tol::f64_identity.value);
    CHECK(rel(cd.c, cp.c) <= tol::f64_identity.value);
    Mat<double> Yc(T, c.hidden);
    Yc.topRows(8) = mla_prefill(c, w, Mat<double>(X.topRows(8)), cc, MlaEval::naive);
    Yc.bottomRows(T - 8) = mla_prefill(c, w, Mat<double>(X.bottomRows(T - 8)), cc, MlaEval::streaming, 4);
    CHECK(rel(Yc, Yp) <= tol::f64_identity.value);
  }
}

TEST_CASE("MLA RoPE: position 0 is the identity rotation, later positions are not", "[mla]") {
  MlaConfig on = small_cfg(true, 4, 0, true), off = on;
  off.rope = false;
  const auto w = weights(on, 41);
  const Mat<double> X = random_x<double>(6, on.hidden, 42);
  MlaCache<double> a(on, 6), b(off, 6);
  const Mat<double> Ya = mla_prefill(on, w, X, a), Yb = mla_prefill(off, w, X, b);
  CHECK((Ya.row(0) - Yb.row(0)).norm() <= 1e-14 * Yb.row(0).norm());
  CHECK((Ya.bottomRows(5) - Yb.bottomRows(5)).norm() > 1e-3 * Yb.norm());
}

TEST_CASE("MLA in cpp_bin_float_50: absorbed == naive to 1e-40, and double agrees to 1e-12", "[mla][mp50]") {
  const MlaConfig c = small_cfg(true, 2, 4, true);
  const auto wd = weights(c, 51);
  const auto wm = wd.cast<mp50>();
  const Mat<double> Xd = random_x<double>(5, c.hidden, 52);
  const Mat<mp50> Xm = Xd.cast<mp50>();
  MlaCache<mp50> m0(c, 5), m1(c, 5);
  MlaCache<double> d0(c, 5);
  const Mat<mp50> Yn = mla_prefill(c, wm, Xm, m0, MlaEval::naive);
  const Mat<mp50> Ya = mla_prefill(c, wm, Xm, m1, MlaEval::absorbed);
  const Mat<mp50> diff = Ya - Yn;
  const mp50 r = diff.norm() / Yn.norm();
  CHECK(static_cast<double>(r) <= tol::mp_identity.value);
  const Mat<double> Yd = mla_prefill(c, wd, Xd, d0, MlaEval::naive);
  CHECK(rel(Yd, Yn) <= tol::f64_vs_mp.value);
}

TEST_CASE("MLA cache footprint per token: Kimi Linear 48B shapes", "[mla]") {
  MlaConfig c;
  c.hidden = 2304; c.n_h = 32; c.d_c = 512; c.d_nope = 128; c.d_rope = 64; c.d_v = 128;
  CHECK(mla_cache_values_per_token(c) == 576);
  CHECK(mha_cache_values_per_token(c) == 32 * (192 + 128));
  CHECK(kda_state_values(32, 128, 128, 4) == 32 * 128 * 128 + 3 * 32 * (128 + 128 + 128));
  c.d_rope = 0; c.d_v = 128;  // pure NoPE MLA: d_c vs 2 n_h d_h (docs/equations.md section 5)
  CHECK(mla_cache_values_per_token(c) == 512);
  CHECK(mha_cache_values_per_token(c) == 2 * 32 * 128);
}

TEST_CASE("MLA bad input gives clear errors", "[mla][errors]") {
  const MlaConfig good = small_cfg(false, 4, 0, true);
  const auto w = weights(good, 61);
  const Mat<double> X = random_x<double>(4, good.hidden, 62);
  auto msg = [](auto&& f) {
    try { f(); } catch (const Error& e) { return std::string(e.what()); }
    return std::string("no error");
  };
  SECTION("d_c < 1") {
    MlaConfig c = good;
    c.d_c = 0;
    const std::string m = msg([&] { MlaCache<double> k(c, 4); mla_prefill(c, w, X, k); });
    INFO(m);
    CHECK(m.find("kv_lora_rank") != std::string::npos);
  }
  SECTION("projection shapes that disagree") {
    auto bad = w;
    bad.W_UK = Mat<double>::Ones(good.n_h * good.d_nope, good.d_c + 1);
    MlaCache<double> k(good, 4);
    const std::string m = msg([&] { mla_prefill(good, bad, X, k); });
    INFO(m);
    CHECK(m.find("W_UK") != std::string::npos);
    CHECK(m.find("[18, 10]") != std::string::npos);
    auto bad2 = w;
    bad2.W_o = Mat<double>::Ones(good.hidden, good.n_h * good.d_v + 2);
    CHECK(msg([&] { mla_prefill(good, bad2, X, k); }).find("W_o") != std::string::npos);
    CHECK(k.len == 0);
  }
  SECTION("input width and non-finite input") {
    MlaCache<double> k(good, 4);
    CHECK(msg([&] { mla_prefill(good, w, Mat<double>(Mat<double>::Ones(2, good.hidden + 1)), k); }).find("'x'") != std::string::npos);
    Mat<double> Xn = X;
    Xn(1, 3) = NAN;
    CHECK(msg([&] { mla_prefill(good, w, Xn, k); }).find("non-finite") != std::string::npos);
  }
  SECTION("decode past capacity leaves the cache unchanged") {
    MlaCache<double> k(good, 3);
    for (int t = 0; t < 3; ++t) mla_decode(good, w, Vec<double>(X.row(t).transpose()), k);
    const Mat<double> before = k.c;
    const std::string m = msg([&] { mla_decode(good, w, Vec<double>(X.row(3).transpose()), k); });
    INFO(m);
    CHECK(m.find("capacity 3") != std::string::npos);
    CHECK(k.len == 3);
    CHECK(k.c == before);
    MlaCache<double> k2(good, 3);
    CHECK(msg([&] { mla_prefill(good, w, X, k2); }).find("capacity") != std::string::npos);
  }
  SECTION("odd RoPE width, zero tile, zero capacity") {
    MlaConfig c = small_cfg(true, 3, 0, true);
    CHECK(msg([&] { mla_validate_config(c); }).find("even") != std::string::npos);
    MlaCache<double> k(good, 4);
    CHECK(msg([&] { mla_prefill(good, w, X, k, MlaEval::streaming, 0); }).find("tile") != std::string::npos);
    CHECK(msg([&] { MlaCache<double> z(good, 0); }).find("capacity") != std::string::npos);
  }
}
