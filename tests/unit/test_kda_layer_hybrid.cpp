// Integration check of reference/kda_layer.hpp with the hybrid stack's hook (reference/hybrid.hpp,
// KdaLayerTraits, whose shipped specialisation for KdaLayer<S> lives in reference/hybrid.hpp): the
// real KdaLayer plugged into the toy hybrid decodes == prefills.
#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/hybrid.hpp"
#include "reference/kda_layer.hpp"
#include "reference/model_config.hpp"


using namespace kdalab;
using namespace kdatest;

TEST_CASE("the real KdaLayer in the toy hybrid: decode == prefill") {
  const ModelConfig cfg = read_model_config("data/configs/toy.json");
  Rng rng(cfg.opt.seed);
  const auto m = Hybrid<double, KdaLayer<double>>::random(cfg, [&] { return rng.normal(); });
  std::size_t kda_layers = 0;
  for (const auto& L : m.layers) kda_layers += L.kind == LayerKind::kda;
  CHECK(kda_layers >= 1);
  for (std::size_t T : {1u, 7u, 40u}) {
    Rng xr(500 + T);
    const Mat<double> X = randn<double>(xr, static_cast<Eigen::Index>(T), static_cast<Eigen::Index>(cfg.hidden));
    auto cp = m.make_cache(T), cd = m.make_cache(T);
    const Mat<double> Yp = m.prefill(X, cp);
    Mat<double> Yd(X.rows(), X.cols());
    for (Eigen::Index t = 0; t < X.rows(); ++t) Yd.row(t) = m.decode(Vec<double>(X.row(t).transpose()), cd).transpose();
    const double e = rel_err<double>(Yd, Yp);
    INFO("T = " << T << ": decode vs prefill " << e);
    CHECK(e <= tol::f64_hybrid.value);
    CHECK(Yp.allFinite());
  }
}
