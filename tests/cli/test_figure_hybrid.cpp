// scripts/fig_hybrid.py: the time-per-token panel agrees with the speedup panel; both panels label the layouts in
// prose; the right panel's legend covers no curve; the K3 layout's limit L / L_MLA is drawn, labelled, from the file.
// Runs /usr/bin/python3; skipped with a warning when it lacks h5py or matplotlib.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "experiments/decode_cost_note.hpp"
#include "experiments/results.hpp"
#include "reference/model_config.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("fig_hybrid's time-per-token panel (Kimi Linear Fig. 1b's layout, attention only) agrees with its speedup panel",
          "[figures][decode-cost][python]") {
  // the left panel draws each layout's attention time per token at batch 1, whose all-MLA / hybrid ratio is the middle panel's curve
  if (skip_without_plotting()) return;
  TempDir d;
  const json j = run_and_draw(d, "decode-cost --quick --quiet", "dc.h5", "fig_hybrid.py", Save::png_pdf);
  const json* tpot = find_axis(j, "Time per output token vs context (attention only)", Match::exact);
  const json* ratio = find_axis(j, "Attention reads per token, any batch", Match::exact);
  REQUIRE(tpot != nullptr);
  REQUIRE(ratio != nullptr);
  const json* mla = find_line(*tpot, "all-MLA, Kimi Linear 48B shapes (27 MLA) (model)", Match::exact);
  const json* hyb = find_line(*tpot, "Kimi Linear 48B (20 KDA + 7 MLA) (model)", Match::exact);
  const json* sp = find_line(*ratio, "Kimi Linear 48B (20 KDA + 7 MLA)", Match::exact);
  REQUIRE(mla != nullptr);
  REQUIRE(hyb != nullptr);
  REQUIRE(sp != nullptr);
  REQUIRE((*mla)["x"].size() >= 2);
  REQUIRE((*mla)["x"] == (*hyb)["x"]);
  REQUIRE((*mla)["x"] == (*sp)["x"]);
  for (std::size_t i = 0; i < (*mla)["x"].size(); ++i) {
    const double m = (*mla)["y"][i].get<double>(), h = (*hyb)["y"][i].get<double>(), s = (*sp)["y"][i].get<double>();
    INFO("n = " << (*mla)["x"][i] << ": all-MLA " << m << " ms, hybrid " << h << " ms, speedup " << s);
    CHECK(m > 0.0);
    CHECK(m / h == Approx(s).epsilon(1e-9));
  }
  // the paper's whole-model TPOTs at 1M are drawn for scale
  CHECK(find_line(*tpot, "reported TPOT at 1M, MLA model (11.48 ms)", Match::exact) != nullptr);
  CHECK(find_line(*tpot, "reported TPOT at 1M, Kimi Linear (1.84 ms)", Match::exact) != nullptr);
}

// Besides Kimi Linear 48B's limit 27/7, the K3 layout's L / L_MLA (93/24 at --k3-layers 93: 23 blocks of 3 KDA + 1 MLA
// and the final MLA, docs/equations.md section 7): decode-cost records the K3 layout's layer counts and the figure
// draws its limit line, labelled, in the K3 colour.
TEST_CASE("fig_hybrid draws the K3 layout's limit L / L_MLA, labelled, from the file",
          "[figures][decode-cost][python]") {
  if (skip_without_plotting()) return;
  for (const auto& [layers, mla] : std::vector<std::pair<int, int>>{{93, 24}, {89, 23}}) {
    TempDir d;
    const std::string h5 = d.file("dc.h5");
    const RunResult r = run_kdalab("decode-cost --cpu-n 0 --n 1000 --d 64 --gpu-n 0 --k3-layers " +
                                   std::to_string(layers) + " --quiet --out " + h5);
    INFO(r.output);
    REQUIRE(r.code == 0);
    const nlohmann::json j = dump_figure(d, "fig_hybrid.py", h5);
    // the speedup panel, found by its title (the time-per-token panel is left of it)
    const auto& ax = panel_titled(j, "Attention reads per token, any batch");
    const double lim = static_cast<double>(layers) / mla;
    const std::string label = "K3 limit " + std::to_string(layers) + "/" + std::to_string(mla) + " = " +
                              (layers == 93 ? "3.88x" : "3.87x") + " (layer count illustrative)";
    INFO(ax["texts"].dump());
    int texts = 0, lines = 0;
    for (const auto& t : ax["texts"]) texts += t.get<std::string>() == label ? 1 : 0;
    for (const auto& l : ax["lines"])
      if (l["coords"] == "axes" && l["color"] == "#1f77b4" && l["y"][0].get<double>() == lim) ++lines;
    CHECK(texts == 1);
    CHECK(lines == 1);
  }
}

TEST_CASE("fig_hybrid: the right panel's legend covers no curve", "[figures][decode-cost][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("dc.h5");
  // the hybrid model at the default contexts (1K .. 1M), no CPU or GPU measurement
  const auto r = run_kdalab("decode-cost --cpu-n 0 --n 1000 --d 64 --gpu-n 0 --quiet --out " + h5);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const json j = dump_figure(d, "fig_hybrid.py", h5);
  // every panel's legend (the speedup panel's legend must not touch the K3 curve near n ~ 1e4; the time-per-token
  // panel keeps its legend below the axes)
  REQUIRE(j["axes"].size() == 3);
  for (std::size_t p = 0; p < j["axes"].size(); ++p) {
    const auto& ax = j["axes"][p];
    INFO(ax["title"] << " legend box " << ax["legend_box"].dump());
    REQUIRE(ax["legend_box"].size() == 4);
    CHECK(points_inside(ax, ax["legend_box"]) == 0);
  }
}

TEST_CASE("fig_hybrid: both panels label the layouts in prose, the right one as the left one",
          "[figures][decode-cost][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("dc.h5");
  make_small_decode_cost(h5);
  const json j = dump_figure(d, "fig_hybrid.py", h5);
  // the speedup panel and the batch panel
  const auto& left = panel_titled(j, "Attention reads per token, any batch")["legend"];
  const auto& right = panel_titled(j, "Batch under ")["legend"];
  INFO(left.dump() << "\n" << right.dump());
  REQUIRE(right.size() == 4);  // two hybrids and their all-MLA stacks
  for (const auto& lab : right) {
    const std::string s = lab;
    CHECK(s.rfind("all-mla", 0) != 0);  // no internal config name
    CHECK(s.rfind("kimi-", 0) != 0);
  }
  // every hybrid label of the left panel is on the right panel too, word for word
  int hybrids = 0;
  for (const auto& lab : left) {
    const std::string s = lab;
    if (s.find("measured") != std::string::npos) continue;  // the GPU points (left panel only)
    ++hybrids;
    bool found = false;
    for (const auto& x : right) found = found || x == lab;
    CHECK(found);
  }
  CHECK(hybrids == 2);
  CHECK(right.dump().find("all-MLA, Kimi Linear 48B shapes") != std::string::npos);
  CHECK(right.dump().find("all-MLA, K3 shapes") != std::string::npos);
}
