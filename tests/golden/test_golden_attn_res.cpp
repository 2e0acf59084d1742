// Golden regression of Attention Residuals (reference/attn_res.hpp): full and block AttnRes in
// float64 against the cpp_bin_float_50 outputs in data/golden/attn_res.h5 (`kdalab golden --regen`).
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/golden/golden_test_util.hpp"

using namespace kdalab;
using namespace kdalab::golden;
using kdalab::testutil::golden_cases;
using kdalab::testutil::rel_to;

namespace {
const std::string kFile = "data/golden/attn_res.h5";
}

TEST_CASE("golden AttnRes: float64 full and block forms vs the stored mp50 outputs") {
  const auto names = golden_cases(kFile);
  REQUIRE(names.size() == attn_res_cases().size());
  for (const auto& n : names) {
    INFO(n << ": " << tol::golden_f64.why);
    const AttnResFixture fx = load_attn_res(kFile, n);
    const Tensor<double> hf = read_f64(kFile, "/" + n + "/h_full"), hb = read_f64(kFile, "/" + n + "/h_block");
    const double ef = rel_to(run_attn_res<double>(fx.v, fx.w, ResidualMode::full, 1, fx.c.eps), hf);
    const double eb = rel_to(run_attn_res<double>(fx.v, fx.w, ResidualMode::block, fx.c.block_sources, fx.c.eps), hb);
    // the direct two-pass softmax (attn_res_full) token by token, too
    Mat<double> direct(static_cast<Eigen::Index>(fx.c.T), static_cast<Eigen::Index>(fx.c.d));
    for (Eigen::Index t = 0; t < direct.rows(); ++t) {
      std::vector<Vec<double>> src;
      for (const auto& v : fx.v) src.push_back(v.row(t).transpose());
      direct.row(t) = attn_res_full<double>(fx.w, src, fx.c.eps).transpose();
    }
    const double ed = rel_to(direct, hf);
    CAPTURE(ef, eb, ed);
    CHECK(ef <= tol::golden_f64.value);
    CHECK(eb <= tol::golden_f64.value);
    CHECK(ed <= tol::golden_f64.value);
    CHECK(rel_rms(hf.data, hb.data) > 1e-3);  // block sums really differ from the full form here
  }
}

TEST_CASE("golden AttnRes: the multiprecision reference reproduces its stored outputs to storage rounding") {
  for (const auto& n : golden_cases(kFile)) {
    const AttnResFixture fx = load_attn_res(kFile, n);
    std::vector<Mat<mp50>> vm;
    for (const auto& v : fx.v) vm.push_back(v.cast<mp50>());
    const double e = rel_to(run_attn_res<mp50>(vm, fx.w.cast<mp50>(), ResidualMode::block, fx.c.block_sources, fx.c.eps),
                            read_f64(kFile, "/" + n + "/h_block"));
    CAPTURE(n, e);
    CHECK(e <= tol::golden_mp.value);
  }
}

TEST_CASE("golden AttnRes: a perturbed source or pseudo-query is caught (the comparison can fail)") {
  for (const auto& n : golden_cases(kFile)) {
    INFO(n);
    const Tensor<double> hf = read_f64(kFile, "/" + n + "/h_full");
    AttnResFixture fx = load_attn_res(kFile, n);
    fx.v[2](0, 1) += 1e-3;
    const double ev = rel_to(run_attn_res<double>(fx.v, fx.w, ResidualMode::full, 1, fx.c.eps), hf);
    fx = load_attn_res(kFile, n);
    fx.w(3) += 1e-3;
    const double ew = rel_to(run_attn_res<double>(fx.v, fx.w, ResidualMode::full, 1, fx.c.eps), hf);
    CAPTURE(ev, ew);
    CHECK(ev > 1e3 * tol::golden_f64.value);
    CHECK(ew > 1e3 * tol::golden_f64.value);
  }
}

TEST_CASE("golden AttnRes: the stored inputs are what the seeds draw, bit for bit") {
  for (const auto& c : attn_res_cases()) {
    INFO(c.name);
    const AttnResFixture st = load_attn_res(kFile, c.name), now = make_attn_res(c);
    REQUIRE(st.v.size() == now.v.size());
    for (std::size_t i = 0; i < st.v.size(); ++i) CHECK((st.v[i] == now.v[i]));
    CHECK((st.w == now.w));
  }
}
