// Golden regression of Gated MLA (reference/mla.hpp): naive, absorbed, streaming prefill, decode
// steps and the kernel-level pieces (absorbed query q~, attended latent a) in float64 against the
// cpp_bin_float_50 outputs in data/golden/mla.h5, written by `kdalab golden --regen`.
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/golden/golden_test_util.hpp"

using namespace kdalab;
using namespace kdalab::golden;
using kdalab::testutil::golden_cases;
using kdalab::testutil::rel_to;

namespace {
const std::string kFile = "data/golden/mla.h5";
}

TEST_CASE("golden MLA: float64 naive / absorbed / streaming / decode vs the stored mp50 outputs") {
  const auto names = golden_cases(kFile);
  REQUIRE(names.size() == mla_cases().size());
  for (const auto& n : names) {
    INFO(n << ": " << tol::golden_f64.why);
    const std::string g = "/" + n;
    const MlaFixture fx = load_mla(kFile, n);
    const auto r = run_mla<double>(fx.c.cfg, fx.w, fx.x);
    const Tensor<double> yn = read_f64(kFile, g + "/y_naive"), ya = read_f64(kFile, g + "/y_absorbed");
    const double e_n = rel_to(r.y_naive, yn), e_a = rel_to(r.y_absorbed, ya), e_s = rel_to(r.y_streaming, yn),
                 e_d = rel_to(r.y_decode, ya), e_q = rel_to(r.q_abs, read_f64(kFile, g + "/q_abs")),
                 e_l = rel_to(r.a, read_f64(kFile, g + "/a")), e_c = rel_to(r.c, read_f64(kFile, g + "/c"));
    CAPTURE(e_n, e_a, e_s, e_d, e_q, e_l, e_c);
    CHECK(e_n <= tol::golden_f64.value);
    CHECK(e_a <= tol::golden_f64.value);
    CHECK(e_s <= tol::golden_f64.value);
    CHECK(e_d <= tol::golden_f64.value);
    CHECK(e_q <= tol::golden_f64.value);
    CHECK(e_l <= tol::golden_f64.value);
    CHECK(e_c <= tol::golden_f64.value);
    // the stored naive and absorbed mp50 outputs are one function: they agree to storage rounding
    CHECK(rel_rms(yn.data, ya.data) <= tol::golden_mp.value);
  }
}

TEST_CASE("golden MLA: the multiprecision reference reproduces its stored output to storage rounding") {
  const std::string n = golden_cases(kFile).front();
  const MlaFixture fx = load_mla(kFile, n);
  MlaCache<mp50> c(fx.c.cfg, fx.c.T);
  const Mat<mp50> y = mla_prefill(fx.c.cfg, fx.w.cast<mp50>(), Mat<mp50>(fx.x.cast<mp50>()), c, MlaEval::absorbed);
  const double e = rel_to(y, read_f64(kFile, "/" + n + "/y_absorbed"));
  CAPTURE(e);
  CHECK(e <= tol::golden_mp.value);
}

TEST_CASE("golden MLA: a perturbed input or weight is caught (the comparison can fail)") {
  for (const auto& n : golden_cases(kFile)) {
    INFO(n);
    const Tensor<double> y = read_f64(kFile, "/" + n + "/y_naive");
    MlaFixture fx = load_mla(kFile, n);
    fx.x(2, 3) += 1e-3;
    const double ex = rel_to(run_mla<double>(fx.c.cfg, fx.w, fx.x).y_naive, y);
    fx = load_mla(kFile, n);
    fx.w.W_UK(0, 0) += 1e-3;
    const double ew = rel_to(run_mla<double>(fx.c.cfg, fx.w, fx.x).y_absorbed, y);
    CAPTURE(ex, ew);
    CHECK(ex > 1e3 * tol::golden_f64.value);
    CHECK(ew > 1e3 * tol::golden_f64.value);
  }
}

TEST_CASE("golden MLA: the stored weights and x are what the seeds draw, bit for bit") {
  for (const auto& c : mla_cases()) {
    INFO(c.name);
    const MlaFixture fx = load_mla(kFile, c.name);
    Rng rng(c.seed);
    const MlaWeights<double> w = mla_random_weights<double>(c.cfg, [&] { return rng.normal(); });
    CHECK((fx.w.W_DKV == w.W_DKV));
    CHECK((fx.w.W_UK == w.W_UK));
    CHECK((fx.w.W_UV == w.W_UV));
    CHECK((fx.w.W_o == w.W_o));
    CHECK((fx.x == normal_mat(c.T, c.cfg.hidden, c.seed + 1)));
  }
}
