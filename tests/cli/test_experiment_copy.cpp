// `kdalab copy`: the --quick table, the information bound, the capacity of the delta rule (docs/equations.md); each
// grid cell has its own generator, so a cell gives the same numbers in a small and a larger grid.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
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

TEST_CASE("copy --quick: table, the information bound, and the capacity of the delta rule", "[copy]") {
  TempDir d;
  const auto r = run_kdalab("copy --quick --quiet --out " + d.file("c.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string f = d.file("c.h5"), t = "copy/accuracy";
  require_columns(f, t, {"memory", "precision", "d_k", "L", "alphabet", "token_accuracy", "copy_accuracy", "rel_err",
                         "strings", "state_numbers", "state_bits", "info_bits", "bound_allows"});
  const auto mem = scol(f, t + "/memory"), prec = scol(f, t + "/precision");
  const auto dk = col(f, t + "/d_k"), L = col(f, t + "/L"), D = col(f, t + "/alphabet"), ca = col(f, t + "/copy_accuracy"),
             info = col(f, t + "/info_bits"), bits = col(f, t + "/state_bits"), allow = col(f, t + "/bound_allows");
  int n = 0;
  for (std::size_t i = 0; i < mem.size(); ++i) {
    CAPTURE(i, mem[i], prec[i], dk[i], L[i], ca[i]);
    CHECK(info[i] == L[i] * std::log2(D[i]));
    CHECK(allow[i] == (info[i] <= bits[i] ? 1.0 : 0.0));
    if (mem[i] == "softmax") CHECK(ca[i] == 1.0);
    if (mem[i] == "deltanet" && prec[i] == "fp64") {  // orthogonal position keys (the default)
      if (L[i] <= dk[i]) CHECK(ca[i] == 1.0);
      if (L[i] >= 2 * dk[i]) CHECK(ca[i] == 0.0);
      ++n;
    }
    if (mem[i] == "kda" && prec[i] == "fp32") CHECK(bits[i] == dk[i] * dk[i] * 32);
  }
  CHECK(n >= 6);
}

TEST_CASE("a copy cell gives the same numbers in a small and a larger grid", "[copy]") {
  TempDir d;
  const std::string common = " --alphabet 8 --trials 3 --quiet --memories kda,deltanet --out ";
  const RunResult a = run_kdalab("copy --d-k 16 --L 8 --precision fp64" + common + d.file("a.h5"));
  INFO(a.output);
  REQUIRE(a.code == 0);
  const RunResult b = run_kdalab("copy --d-k 8,16 --L 4,8 --precision fp32,fp64" + common + d.file("b.h5"));
  INFO(b.output);
  REQUIRE(b.code == 0);
  const std::vector<std::string> tk{"memory", "precision"}, nk{"d_k", "L"}, v{"token_accuracy", "copy_accuracy", "rel_err"};
  const auto ra = rows_by_key(d.file("a.h5"), "copy/accuracy", tk, nk, v);
  const auto rb = rows_by_key(d.file("b.h5"), "copy/accuracy", tk, nk, v);
  REQUIRE(ra.size() == 2);
  for (const auto& [key, vals] : ra) {
    INFO(key);
    REQUIRE(rb.count(key) == 1);
    CHECK(rb.at(key) == vals);
  }
}
