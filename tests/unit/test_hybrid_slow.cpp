// Slow hybrid checks in cpp_bin_float_50 (label `slow`): decode == prefill in mp50 on toy.json
// (rounding of mp50 only), and double vs mp50 over a longer sequence and every residual mode.
#include <string>

#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/unit/hybrid_testutil.hpp"

using namespace kdalab;
using namespace kdalab::testutil;

TEST_CASE("hybrid mp50: decode == prefill on toy.json (T = 7)", "[hybrid][mp50][slow]") {
  const ModelConfig cfg = read_model_config("data/configs/toy.json");
  const auto m = build<mp50>(cfg);
  const Mat<mp50> X = inputs(7, cfg.hidden, 17).cast<mp50>();
  const double e = decode_vs_prefill(m, X);
  INFO("rel = " << e);
  CHECK(e <= tol::mp_identity.value);
}

TEST_CASE("hybrid mp50 vs double on toy.json, T = 24, every residual mode", "[hybrid][mp50][slow]") {
  ModelConfig cfg = read_model_config("data/configs/toy.json");
  for (auto res : {ResidualMode::plain, ResidualMode::full, ResidualMode::block}) {
    cfg.opt.residual = res;
    const auto md = build<double>(cfg);
    const auto mm = build<mp50>(cfg);
    const Mat<double> X = inputs(24, cfg.hidden, 19);
    auto cd = md.make_cache(24);
    auto cm = mm.make_cache(24);
    const Mat<double> Yd = md.prefill(X, cd);
    const Mat<mp50> Ym = mm.prefill(Mat<mp50>(X.cast<mp50>()), cm);
    const double e = rel(Yd, Ym);
    INFO(residual_mode_name(res) << " rel = " << e);
    CHECK(e <= tol::f64_vs_mp.value);
  }
}
