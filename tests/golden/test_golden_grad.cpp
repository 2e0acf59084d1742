// Golden regression of the reverse-mode derivatives (reference/*_backward.hpp): every gradient
// fixture data/golden/<op>_grad.h5 (experiments/golden_grad.cpp; `kdalab golden --regen`) checked
// with the current float64 backward against the stored cpp_bin_float_50 gradients, the same code
// `kdalab golden` runs; and a check that the comparison can fail.
#include <string>
#include <vector>

#include "experiments/golden_layers.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/kda_backward.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

TEST_CASE("golden gradients: float64 backward of every gradient fixture vs the stored mp50 gradients") {
  const std::vector<golden::LayerOp> ops = golden::grad_ops();
  REQUIRE(ops.size() == 5);
  for (const auto& op : ops) {
    const std::string path = "data/golden/" + op.op + ".h5";
    REQUIRE(h5read::attr_string(path, "/", "cases") == op.cases);
    int checks = 0;
    op.check(path, [&](const std::string& what, double err, double tol) {
      INFO(what << ": relative RMS " << err << " (tol " << tol << "; " << tol::backward_f64_vs_mp.why << ")");
      CHECK(err <= tol);
      ++checks;
    });
    INFO(op.op);
    CHECK(checks >= 3);
  }
}

TEST_CASE("golden gradients: a perturbed input is caught (the comparison can fail)") {
  const std::string path = "data/golden/kda_recurrent_grad.h5", g = "/grouped_T24/";
  Tensor<double> q = golden::read_f64(path, g + "q"), k = golden::read_f64(path, g + "k"),
                 v = golden::read_f64(path, g + "v"), gg = golden::read_f64(path, g + "g"),
                 beta = golden::read_f64(path, g + "beta"), S0 = golden::read_f64(path, g + "S0"),
                 dO = golden::read_f64(path, g + "dO"), dS_T = golden::read_f64(path, g + "dS_T");
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.dim(3)));
  const auto err_dg = [&] {
    const KdaGrad<double> d = kda_recurrent_backward<double>(q, k, v, gg, beta, &S0, scale, dO, &dS_T);
    return rel_rms(d.dg.data, golden::read_f64(path, g + "dg").data);
  };
  const double e0 = err_dg();
  gg.data[5] -= 1e-6;
  const double e1 = err_dg();
  CAPTURE(e0, e1);
  CHECK(e0 <= tol::backward_f64_vs_mp.value);
  CHECK(e1 > 1e3 * tol::backward_f64_vs_mp.value);
}
