// Integration check of reference/kda_layer.hpp with the hybrid stack's hook (reference/hybrid.hpp,
// KdaLayerTraits): the real KdaLayer plugged into the toy hybrid decodes == prefills. The traits
// specialisation below is local to this test (the hybrid owner decides where the shipped one lives);
// it maps the model config's linear_attn_config to a KdaConfig (HV = H, d_k = d_v = head_dim).
#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/hybrid.hpp"
#include "reference/kda_layer.hpp"
#include "reference/model_config.hpp"

namespace kdalab {
template <class S>
struct KdaLayerTraits<KdaLayer<S>> {
  using Cache = KdaCache<S>;
  static KdaConfig config(const ModelConfig& m) {
    KdaConfig c;
    c.hidden = m.hidden;
    c.H = c.HV = m.kda.num_heads;
    c.d_k = c.d_v = m.kda.head_dim;
    c.gate = m.kda.bounded_gate ? GateKind::bounded : GateKind::softplus;
    c.g_min = m.kda.g_min;
    c.conv_kernel = m.kda.conv_kernel;
    c.chunk = 16;
    return c;
  }
  template <class Normal>
  static KdaLayer<S> make(const ModelConfig& m, Normal&& normal, double std) {
    const KdaConfig c = config(m);
    return KdaLayer<S>(c, KdaWeights<S>::from_normal(c, normal, std));
  }
  static Cache make_cache(const KdaLayer<S>& l) { return l.make_cache(); }
  static Mat<S> prefill(const KdaLayer<S>& l, const Mat<S>& X, Cache& c) { return l.prefill(X, c); }
  static Vec<S> decode(const KdaLayer<S>& l, const Vec<S>& x, Cache& c) { return l.decode(x, c); }
};
}  // namespace kdalab

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
