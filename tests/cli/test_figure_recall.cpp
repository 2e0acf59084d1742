// scripts/fig_recall.py and fig_recall_dim.py: the error axis is set by the data, exact errors in their strip;
// a curve lying on another stays visible; the sqrt(N/d_k) reference is drawn above the curves in its own style; the
// title says the memories ran in float64; accuracy vs d_k at fixed N from the recall grid.
// Runs /usr/bin/python3; skipped with a warning when it lacks h5py or matplotlib.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

TEST_CASE("fig_recall: error axis from the data, exact errors in their strip, integer config values",
          "[figures][recall][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const json j = run_and_draw(d, "recall --d-k 16 --ratio 0.5,1,2,4 --trials 1 --keys random,orthogonal "
                              "--memories softmax,linear,deltanet,kda --quiet", "recall.h5", "fig_recall.py", Save::png_pdf);
  int error_axes = 0, strips = 0;
  double smallest_drawn = INFINITY;
  for (const auto& ax : j["axes"]) {
    const std::string yl = ax["ylabel"];
    const bool error_panel = ax["yscale"] == "log";
    if (yl.find("exact") != std::string::npos) ++strips;
    if (!error_panel) continue;
    ++error_axes;
    const double lo = ax["ylim"][0], hi = ax["ylim"][1];
    CHECK(lo >= 1e-9);  // was 1e-17: the curves sat in a sliver at the top
    for (const double v : data_ys(ax)) {  // not the N = d_k marker line (axvline): y in axes fractions
      smallest_drawn = std::min(smallest_drawn, v);
      CHECK(v <= hi);  // never clipped at the top
      CHECK(v >= lo);
    }
  }
  CHECK(error_axes == 2);  // random and orthogonal keys
  CHECK(strips >= 1);
  CHECK(smallest_drawn >= 1e-8);  // exact recall (softmax: 0, delta rule below capacity: ~1e-16) is not on the log axis
  const std::string f = footer(j);
  CHECK(f.find("below 1e-08") != std::string::npos);  // the caption says what happened to them
  const std::string cfg = config_text(j);
  INFO(cfg);
  CHECK(cfg.find("d-k=[16]") != std::string::npos);  // the file's options hold 16.0: printed as stored on the command line
  CHECK(cfg.find("16.0") == std::string::npos);
  CHECK(cfg.find("ratio=[0.5,1,2,4]") != std::string::npos);
}

TEST_CASE("fig_recall: a curve lying on another stays visible and the panel's legend says which it lies on",
          "[figures][recall][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // orthogonal keys, beta = 1: DeltaNet and Gated DeltaNet both recall exactly up to d_k pairs, then 0.5, 0.25: the
  // same accuracy at every N (DeltaNet lies exactly under Gated DeltaNet)
  const json j = run_and_draw(d, "recall --d-k 16 --ratio 0.5,1,2,4 --trials 1 --keys orthogonal "
                              "--memories deltanet,gated_deltanet --quiet", "recall.h5", "fig_recall.py");
  const json* acc = find_axis(j, "orthogonal", Match::prefix);
  REQUIRE(acc != nullptr);
  const json* dn = find_line(*acc, "DeltaNet", Match::exact);
  const json* gdn = find_line(*acc, "Gated DeltaNet", Match::exact);
  REQUIRE(dn != nullptr);
  REQUIRE(gdn != nullptr);
  REQUIRE((*dn)["y"] == (*gdn)["y"]);  // the file does hold the coinciding curves this test is about
  // the first is drawn underneath (large open marker), the other on top (smaller, another marker and line style)
  check_drawn_apart(*dn, *gdn);
  const std::string legend = lines_of((*acc)["legend"]);
  INFO(legend);
  CHECK(legend.find("Gated DeltaNet: lies on DeltaNet") != std::string::npos);  // the panel's legend says so
  CHECK(footer(j).find("lies on") != std::string::npos);                       // and the caption what that means
  // the figure legend names each memory once, in its plain style
  const std::string names = legends(j);
  CHECK(names == "DeltaNet\nGated DeltaNet\n");
}

TEST_CASE("fig_recall_dim: accuracy vs d_k at fixed N (Zoology's MQAR layout), read from the recall grid",
          "[figures][recall][python]") {
  // accuracy vs model dimension: the figure reads the grid's cells with N = ratio x d_k: N = 16 has d_k 8 (ratio 2) and 16 (ratio 1)
  if (skip_without_plotting()) return;
  TempDir d;
  const json j = run_and_draw(d, "recall --d-k 8,16 --ratio 1,2 --memories softmax,linear,kda --keys random --trials 1 "
                              "--quiet", "r.h5", "fig_recall_dim.py");
  const json* ax = find_axis(j, "N = 16 key-value pairs", Match::exact);
  REQUIRE(ax != nullptr);
  const json* sm = find_line(*ax, "softmax", Match::exact);
  REQUIRE(sm != nullptr);
  CHECK((*sm)["x"] == json::array({8.0, 16.0}));      // d_k on the x axis
  CHECK((*sm)["y"] == json::array({1.0, 1.0}));       // softmax attention keeps every pair at any d_k
  const json* kda = find_line(*ax, "KDA", Match::exact);
  REQUIRE(kda != nullptr);
  CHECK((*kda)["y"][0].get<double>() < 1.0);          // 16 pairs in a d_k = 8 state: not all recalled
  // N = 8 (d_k 8, ratio 1) and N = 32 (d_k 16, ratio 2) have one d_k each: no panel
  CHECK(find_axis(j, "N = 8 key-value pairs", Match::exact) == nullptr);
  CHECK(find_axis(j, "N = 32 key-value pairs", Match::exact) == nullptr);
}

TEST_CASE("fig_recall draws the sqrt(N/d_k) reference above linear attention's dashes, in its own style",
          "[figures][recall][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const auto r = run_kdalab("recall --d-k 16 --ratio 0.5,1,2,4 --trials 1 --keys random --memories linear,deltanet "
                            "--quiet --out " + d.file("r.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const json j = dump_figure(d, "fig_recall.py", d.file("r.h5"));
  const json* ref = nullptr;
  const json* lin = nullptr;
  const json* ax = nullptr;
  for (const auto& a : j["axes"])
    for (const auto& ln : a["lines"]) {
      if (ln["label"] == "$\\sqrt{N/d_k}$") {
        ref = &ln;
        ax = &a;
      }
    }
  REQUIRE(ref != nullptr);
  for (const auto& ln : (*ax)["lines"])
    if (ln["label"].get<std::string>().find("linear attention") != std::string::npos) lin = &ln;
  REQUIRE(lin != nullptr);  // linear attention's error curve, in the same panel
  INFO((*ref).dump() << "\n" << (*lin).dump());
  CHECK((*ref)["zorder"].get<double>() > (*lin)["zorder"].get<double>());  // drawn above the dashes
  CHECK((*ref)["color"] != (*lin)["color"]);
  CHECK((*ref)["linestyle"] != (*lin)["linestyle"]);
  for (const auto& ln : (*ax)["lines"])  // above every curve of the panel, not only linear attention's
    if (&ln != ref) CHECK((*ref)["zorder"].get<double>() > ln["zorder"].get<double>());
  bool in_legend = false;
  for (const auto& t : (*ax)["legend"]) in_legend = in_legend || t == "$\\sqrt{N/d_k}$";
  CHECK(in_legend);  // the legend entry is kept
}

TEST_CASE("fig_recall's title says the memories ran in float64", "[figures][recall][python]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string h5 = d.file("r.h5");
  kdalab_ok("recall --d-k 8 --trials 1 --memories softmax,kda --keys random --ratio 0.5,1 --quiet --out " + h5);
  const json j = dump_figure(d, "fig_recall.py", h5);
  const std::string t = j["suptitle"];
  INFO(t);
  CHECK(t.find("$g_{\\min} = -5$, float64") != std::string::npos);
}
