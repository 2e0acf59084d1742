// Golden regression of the KDA / Gated MLA hybrid (reference/hybrid.hpp) on data/configs/toy.json:
// float64 prefill (naive and absorbed MLA) and token-by-token decode against the cpp_bin_float_50
// output in data/golden/hybrid.h5 (`kdalab golden --regen`).
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/golden/golden_test_util.hpp"

using namespace kdalab;
using namespace kdalab::golden;
using kdalab::testutil::golden_cases;
using kdalab::testutil::rel_to;

namespace {
const std::string kFile = "data/golden/hybrid.h5";

Mat<double> decode_all(const Hybrid<double>& m, const Mat<double>& x) {
  auto c = m.make_cache(static_cast<std::size_t>(x.rows()));
  Mat<double> y(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) y.row(t) = m.decode(Vec<double>(x.row(t).transpose()), c).transpose();
  return y;
}
}  // namespace

TEST_CASE("golden hybrid: float64 prefill and decode vs the stored mp50 output") {
  const auto names = golden_cases(kFile);
  REQUIRE(names.size() == hybrid_cases().size());
  for (const auto& n : names) {
    INFO(n << ": " << tol::golden_f64_hybrid.why);
    const HybridFixture fx = load_hybrid(kFile, n);
    CHECK(fx.cfg.count(LayerKind::kda) > 0);  // every layer kind is exercised
    CHECK(fx.cfg.count(LayerKind::mla) > 0);
    Hybrid<double> m = build_hybrid<double>(fx.cfg);
    CHECK(rel_rms(hybrid_weights_sum(m).data, read_f64(kFile, "/" + n + "/weights_sum").data) <= tol::golden_f64_hybrid.value);
    const Tensor<double> y = read_f64(kFile, "/" + n + "/y");
    auto c = m.make_cache(fx.c.T);
    const double ep = rel_to(m.prefill(fx.x, c), y);
    const double ed = rel_to(decode_all(m, fx.x), y);
    m.mla_eval = MlaEval::absorbed;
    auto ca = m.make_cache(fx.c.T);
    const double ea = rel_to(m.prefill(fx.x, ca), y);
    CAPTURE(ep, ed, ea);
    CHECK(ep <= tol::golden_f64_hybrid.value);
    CHECK(ed <= tol::golden_f64_hybrid.value);
    CHECK(ea <= tol::golden_f64_hybrid.value);
  }
}

TEST_CASE("golden hybrid: a perturbed input token or weight is caught (the comparison can fail)") {
  const std::string n = golden_cases(kFile).front();
  const Tensor<double> y = read_f64(kFile, "/" + n + "/y");
  HybridFixture fx = load_hybrid(kFile, n);
  Hybrid<double> m = build_hybrid<double>(fx.cfg);
  fx.x(fx.x.rows() - 1, 0) += 1e-3;  // the last token: only its own output row may move
  auto c = m.make_cache(fx.c.T);
  const double ex = rel_to(m.prefill(fx.x, c), y);
  fx = load_hybrid(kFile, n);
  m.w_out(0) += 1e-3;  // the final AttnRes pseudo-query
  auto c2 = m.make_cache(fx.c.T);
  const double ew = rel_to(m.prefill(fx.x, c2), y);
  CAPTURE(ex, ew);
  CHECK(ex > 1e2 * tol::golden_f64_hybrid.value);
  CHECK(ew > 1e2 * tol::golden_f64_hybrid.value);
}
