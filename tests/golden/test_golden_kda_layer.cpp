// Golden regression of the full KDA layer (reference/kda_layer.hpp): the current float64 layer
// (prefill, and prefill then decode steps) against the cpp_bin_float_50 outputs in
// data/golden/kda_layer.h5, written by `kdalab golden --regen`.
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/golden/golden_test_util.hpp"

using namespace kdalab;
using namespace kdalab::golden;
using kdalab::testutil::golden_cases;
using kdalab::testutil::rel_to;

namespace {
const std::string kFile = "data/golden/kda_layer.h5";
}

TEST_CASE("golden KDA layer: float64 prefill and decode vs the stored mp50 outputs (tol golden_f64)") {
  const auto names = golden_cases(kFile);
  REQUIRE(names.size() == kda_layer_cases().size());
  for (const auto& n : names) {
    INFO(n << ": " << tol::golden_f64.why);
    const KdaLayerFixture fx = load_kda_layer(kFile, n);
    const Tensor<double> y = read_f64(kFile, "/" + n + "/y");
    const auto r = run_kda_layer<double>(fx.c.cfg, fx.w, fx.x, fx.c.T);
    const double ey = rel_to(r.y, y), eo = rel_to(r.o_core, read_f64(kFile, "/" + n + "/o_core")),
                 es = rel_rms(states_tensor(r.S_final).data, read_f64(kFile, "/" + n + "/S_final").data);
    CAPTURE(ey, eo, es);
    CHECK(ey <= tol::golden_f64.value);
    CHECK(eo <= tol::golden_f64.value);
    CHECK(es <= tol::golden_f64.value);
    for (std::size_t k : {std::size_t(0), std::size_t(1), fx.c.T / 2}) {  // decode steps after a prefill of k tokens
      const double ed = rel_to(run_kda_layer<double>(fx.c.cfg, fx.w, fx.x, k).y, y);
      CAPTURE(k, ed);
      CHECK(ed <= tol::golden_f64.value);
    }
  }
}

TEST_CASE("golden KDA layer: a perturbed input or weight is caught (the comparison can fail)") {
  for (const auto& n : golden_cases(kFile)) {
    INFO(n);
    const Tensor<double> y = read_f64(kFile, "/" + n + "/y");
    KdaLayerFixture fx = load_kda_layer(kFile, n);
    fx.x(1, 0) += 1e-3;
    const double ex = rel_to(run_kda_layer<double>(fx.c.cfg, fx.w, fx.x, fx.c.T).y, y);
    fx = load_kda_layer(kFile, n);
    fx.w.A_log(0) += 1e-3;  // the gate: only the decay changes
    const double ea = rel_to(run_kda_layer<double>(fx.c.cfg, fx.w, fx.x, fx.c.T).y, y);
    CAPTURE(ex, ea);
    CHECK(ex > 1e3 * tol::golden_f64.value);
    CHECK(ea > 1e3 * tol::golden_f64.value);
  }
}

TEST_CASE("golden KDA layer: the stored weights and x are what the seeds draw, bit for bit") {
  for (const auto& c : kda_layer_cases()) {
    INFO(c.name);
    const KdaLayerFixture fx = load_kda_layer(kFile, c.name);
    CHECK(fx.c.T == c.T);
    CHECK(fx.c.seed == c.seed);
    const KdaWeights<double> w = KdaWeights<double>::random(c.cfg, c.seed);
    CHECK((fx.w.W_q == w.W_q));
    CHECK((fx.w.W_a_up == w.W_a_up));
    CHECK((fx.w.W_alpha == w.W_alpha));
    CHECK((fx.w.A_log == w.A_log));
    CHECK((fx.w.rms_w == w.rms_w));
    CHECK((fx.w.W_o == w.W_o));
    CHECK((fx.x == normal_mat(c.T, c.cfg.hidden, c.seed + 1)));
  }
}
