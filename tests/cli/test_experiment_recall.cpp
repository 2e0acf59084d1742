// `kdalab recall`: the --quick table and the known curves (docs/equations.md): the delta rule with beta = 1 exact up
// to d_k orthonormal keys, linear attention's error ~ sqrt(N / d), softmax exact; each grid cell has its own
// generator (same numbers in a small and a larger grid); a grid without an N = d_k point says so.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
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

TEST_CASE("recall --quick: table, known curves", "[recall]") {
  TempDir d;
  const auto r = run_kdalab("recall --quick --quiet --out " + d.file("r.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string f = d.file("r.h5");
  const std::string t = "recall/capacity";
  require_columns(f, t, {"memory", "keys", "d_k", "N", "ratio", "beta", "g_min", "d_c", "accuracy", "rel_err", "queries",
                         "mean_distance", "state_numbers"});
  const auto mem = scol(f, t + "/memory"), keys = scol(f, t + "/keys");
  const auto dk = col(f, t + "/d_k"), N = col(f, t + "/N"), beta = col(f, t + "/beta"), acc = col(f, t + "/accuracy"),
             err = col(f, t + "/rel_err");
  int n_delta = 0, n_lin = 0, n_soft = 0;
  for (std::size_t i = 0; i < mem.size(); ++i) {
    CAPTURE(i, mem[i], keys[i], dk[i], N[i], beta[i], acc[i], err[i]);
    if (mem[i] == "deltanet" && keys[i] == "orthogonal" && beta[i] == 1.0 && N[i] <= dk[i]) {
      CHECK(acc[i] == 1.0);
      CHECK(err[i] <= tol::f64_identity.value);
      ++n_delta;
    }
    if (mem[i] == "deltanet" && keys[i] == "orthogonal" && beta[i] == 1.0 && N[i] >= 2 * dk[i]) CHECK(err[i] > 0.1);
    // beta = 0.5 on orthonormal keys writes half of each value (linear attention would write all of it).
    if (mem[i] == "deltanet" && keys[i] == "orthogonal" && beta[i] == 0.5 && N[i] <= dk[i]) {
      CHECK(std::abs(err[i] - 0.5) <= tol::f64_identity.value);
      ++n_delta;
    }
    if (mem[i] == "linear" && keys[i] == "random" && N[i] >= 4) {
      const double pred = std::sqrt((N[i] - 1) / dk[i]), f_ = tol::recall_linear_sqrt_factor.value;
      CHECK(err[i] <= f_ * pred);
      CHECK(err[i] >= pred / f_);
      ++n_lin;
    }
    if (mem[i] == "softmax" && keys[i] != "correlated") {
      CHECK(acc[i] == 1.0);
      CHECK(err[i] <= tol::recall_softmax_exact.value);
      ++n_soft;
    }
  }
  CHECK(n_delta >= 8);
  CHECK(n_lin >= 4);
  CHECK(n_soft >= 8);
  CHECK(h5read::attr_string(f, "/", "software") == "kdalab");
}

// Each grid cell of recall and copy has its own generator (numerics/random.hpp cell_seed): the same cell in two grids
// (and with other --memories / --dc-ratio) gives identical values.
TEST_CASE("a recall cell gives the same numbers in a small and a larger grid (and other memories)", "[recall]") {
  TempDir d;
  const std::string common = " --vocab 256 --trials 2 --quiet --beta 1 --g-min -5 --out ";
  const RunResult a = run_kdalab("recall --keys random --d-k 16 --ratio 1 --memories kda,mla --dc-ratio 1" + common +
                                 d.file("a.h5"));
  INFO(a.output);
  REQUIRE(a.code == 0);
  const RunResult b = run_kdalab("recall --keys orthogonal,random --d-k 8,16 --ratio 0.5,1 --memories mla,linear,kda "
                                 "--dc-ratio 0.5,1" + common + d.file("b.h5"));
  INFO(b.output);
  REQUIRE(b.code == 0);
  const std::vector<std::string> tk{"memory", "keys"}, nk{"d_k", "N", "d_c"}, v{"accuracy", "rel_err", "mean_distance"};
  const auto ra = rows_by_key(d.file("a.h5"), "recall/capacity", tk, nk, v);
  const auto rb = rows_by_key(d.file("b.h5"), "recall/capacity", tk, nk, v);
  REQUIRE(ra.size() == 2);  // kda and mla at keys=random, d_k=16, N=16
  for (const auto& [key, vals] : ra) {
    INFO(key);
    REQUIRE(rb.count(key) == 1);
    CHECK(rb.at(key) == vals);  // bit-identical: the same draws, the same arithmetic
  }
}

TEST_CASE("recall without --ratio 1 says there is no N = d_k row instead of an empty heading", "[recall]") {
  const TempDir d;
  const std::string small = "recall --d-k 8 --trials 1 --memories kda --keys random --quiet --out ";
  const RunResult none = run_kdalab(small + d.file("a.h5") + " --ratio 0.5,2");
  INFO(none.output);
  REQUIRE(none.code == 0);
  CHECK(has(none, "at N = d_k: no rows (--ratio has no 1); every --ratio point is in " + d.file("a.h5")));
  CHECK(!has(none, "at N = d_k (acc:"));
  // with ratio 1 in the grid the heading and its two pivot tables (acc, rel_err) are printed: a row per memory configuration, a column per (key kind, d_k)
  const RunResult one = run_kdalab(small + d.file("b.h5") + " --ratio 0.5,1 --beta 0.5,1");
  INFO(one.output);
  REQUIRE(one.code == 0);
  CHECK(has(one, "at N = d_k (acc:"));
  CHECK(!has(one, "no rows"));
  std::vector<std::string> lines;
  std::stringstream ss(one.output);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  const auto header = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("  acc ", 0) == 0; });
  REQUIRE(header != lines.end());
  CHECK(header->find("random 8") != std::string::npos);  // the column: key kind and d_k
  REQUIRE(header + 2 < lines.end());
  CHECK((header + 1)->rfind("  kda beta=0.5 g_min=-5", 0) == 0);  // one row per (memory, beta, g_min)
  CHECK((header + 2)->rfind("  kda beta=1 g_min=-5", 0) == 0);
  CHECK(has(one, "  rel_err "));
  // the summary is 1 heading + 2 x (1 header + 2 rows) lines, then "wrote"
  const auto heading = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("at N = d_k (acc:", 0) == 0; });
  const auto wrote = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("wrote ", 0) == 0; });
  CHECK(wrote - heading == 7);
}
