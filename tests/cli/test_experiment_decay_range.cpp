// `kdalab decay-range`: fp32 chunk-16 survives g_min = -5 and fails past the edges (and for C = 32 at -3); an overflow
// is counted only where the algorithm's stored K/Gamma is not finite; the console prints the tables of the
// precisions that ran.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "experiments/results.hpp"
#include "numerics/tolerance.hpp"
#include "reference/model_config.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("decay-range --quick: fp32 chunk-16 survives g_min = -5, fails past the edges and for C = 32 at -3",
          "[decay-range]") {
  TempDir d;
  const auto r = run_kdalab("decay-range --quick --quiet --out " + d.file("dr.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string f = d.file("dr.h5"), t = "decay_range/table";
  require_columns(f, t, {"impl", "precision", "C", "gate", "g_min", "g_mean", "g_lowest", "c_min", "rel_rms", "o_nan", "o_inf",
                         "values", "overflow", "underflow", "subnormal", "allow_unsafe_range"});
  const auto impl = scol(f, t + "/impl"), prec = scol(f, t + "/precision"), gate = scol(f, t + "/gate");
  const auto C = col(f, t + "/C"), gm = col(f, t + "/g_min"), err = col(f, t + "/rel_rms"), nan = col(f, t + "/o_nan"),
             inf = col(f, t + "/o_inf"), ovf = col(f, t + "/overflow");
  int seen = 0;
  for (std::size_t i = 0; i < impl.size(); ++i) {
    CAPTURE(i, impl[i], prec[i], C[i], gate[i], gm[i], err[i]);
    if (impl[i] != "chunked" || gate[i] != "bounded") continue;
    if (prec[i] == "fp64") CHECK(err[i] <= tol::f64_identity.value);  // the chunked reference in double
    if (prec[i] == "fp32" && C[i] == 16 && gm[i] >= -5) {
      CHECK(err[i] <= tol::f32_vs_truth.value);
      CHECK(ovf[i] == 0);
      ++seen;
    }
    if (prec[i] == "fp32" && C[i] == 16 && gm[i] <= -6) CHECK(nan[i] + inf[i] > 0);
    if (prec[i] == "fp32" && C[i] == 32 && gm[i] <= -3) CHECK(nan[i] + inf[i] > 0);  // 32 x 3 = 96 > 88.7
    if (prec[i] == "fp16" && C[i] == 16 && gm[i] <= -1) CHECK(ovf[i] > 0);           // fp16 cannot hold a tile
  }
  CHECK(seen >= 3);
  CHECK(std::abs(h5read::attr_double(f, "decay_range", "fp32_overflow_edge_C16") + 5.545) < 1e-3);
}

// The range analysis counts K/Gamma = k e^-c as the chunked algorithm stores it (numerics/kda_twin.hpp Ki), not
// 1/Gamma = e^-c, which the algorithm never forms: with |k_i| < 1 a 1/Gamma just past the format's largest value is a
// finite K/Gamma. So an overflow ("ovf" in the figure) means a non-finite value in the algorithm.
TEST_CASE("decay-range counts an overflow only where the algorithm's stored K/Gamma is not finite", "[decay-range]") {
  TempDir d;
  const std::string f = d.file("dr.h5");
  // g_min = -5.55 at C = 16: c reaches -88.8, past fp32's e^88.72 edge for 1/Gamma; K/Gamma stays finite
  const RunResult r = run_kdalab("decay-range --quick --g-min -1,-5,-5.55,-6 --C 16,32 --precision fp32,bf16 --quiet --out " + f);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string t = "decay_range/table";
  const auto impl = h5read::strings(f, t + "/impl"), prec = h5read::strings(f, t + "/precision");
  const auto C = h5read::array(f, t + "/C").data, gm = h5read::array(f, t + "/g_min").data,
             ovf = h5read::array(f, t + "/overflow").data, nan = h5read::array(f, t + "/o_nan").data,
             inf = h5read::array(f, t + "/o_inf").data, err = h5read::array(f, t + "/rel_rms").data;
  int edge = 0, bad = 0;
  for (std::size_t i = 0; i < impl.size(); ++i) {
    INFO(impl[i] << " " << prec[i] << " C=" << C[i] << " g_min=" << gm[i] << " overflow=" << ovf[i] << " nan=" << nan[i]
                 << " inf=" << inf[i] << " rel_rms=" << err[i]);
    const bool finite = nan[i] + inf[i] == 0 && std::isfinite(err[i]);
    if (ovf[i] > 0) CHECK(!finite);  // "ovf" never on a finite output
    if (gm[i] == -5.55 && C[i] == 16 && prec[i] == "fp32") {
      CHECK(finite);
      CHECK(ovf[i] == 0);  // was 256: every tile's last 1/Gamma = e^88.8
      ++edge;
    }
    if (!finite) {
      CHECK(ovf[i] > 0);  // the non-finite cells here are K/Gamma overflows (C = 32 and g_min = -6)
      ++bad;
    }
  }
  CHECK(edge == 1);
  CHECK(bad > 0);
}

TEST_CASE("decay-range prints console tables only of precisions that ran (fp32's when it ran, else each one's)",
          "[decay-range]") {
  TempDir d;
  auto table_rows = [](const std::string& out, const std::string& prec) {
    // the table of `prec`: its header, the g_min header line, then one line per gate (g_min -1 here) with a value
    const std::regex re("chunked algorithm, " + prec + ", relative RMS of o[^\n]*\n +g_min +C = 16\n +-1 +([0-9.]+e[-+][0-9]+|inf|nan) \\(");
    return std::regex_search(out, re);
  };
  auto run = [&](const std::string& prec) {
    const auto r = run_kdalab("decay-range --precision " + prec + " --g-min -1 --softplus false --C 16 --T 32 --D 8 "
                              "--kernel-plan false --quiet --out " + d.file(prec + ".h5"));
    INFO(r.output);
    REQUIRE(r.code == 0);
    return r;
  };
  const auto r = run("fp64");
  INFO(r.output);
  CHECK(table_rows(r.output, "fp64"));        // the precision that ran, with its numbers
  CHECK(!has(r, "chunked algorithm, fp32"));  // was an empty fp32 table: nothing under its header
  const auto r2 = run("bf16,fp16");
  INFO(r2.output);
  CHECK(table_rows(r2.output, "bf16"));
  CHECK(table_rows(r2.output, "fp16"));
  CHECK(r2.output.find("chunked algorithm, bf16") < r2.output.find("chunked algorithm, fp16"));  // in the order given
  CHECK(!has(r2, "chunked algorithm, fp32"));
  const auto r3 = run("fp64,fp32");  // fp32 ran: its table, the key numbers, as before (the default run's console)
  INFO(r3.output);
  CHECK(table_rows(r3.output, "fp32"));
  CHECK(!has(r3, "chunked algorithm, fp64"));
}
