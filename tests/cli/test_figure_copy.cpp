// scripts/fig_copy.py (read back through --dump): the information-bound panel names each state beside the panel, no
// line through a name, coinciding dots stay visible; the L = d_k label sits above the frame.
// Runs /usr/bin/python3; skipped with a warning when it lacks h5py or matplotlib.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiments/decode_cost_note.hpp"
#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

TEST_CASE("fig_copy's information bound names each state beside the panel, no line through a name, no dot hidden",
          "[figures][copy][python]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string h5 = d.file("c.h5");
  kdalab_ok("copy --d-k 16,32,64 --L 4,8,16,32,64 --trials 4 --precision fp32,bf16 --quiet --out " + h5);
  const json j = dump_figure(d, "fig_copy.py", h5);
  const json* ax = panel(j, "information bound");
  REQUIRE(ax != nullptr);
  int names = 0;
  for (std::size_t i = 0; i < (*ax)["texts"].size(); ++i) {
    const std::string s = (*ax)["texts"][i];
    if (s.rfind("$d_k$=", 0) != 0) continue;
    ++names;
    const json& box = (*ax)["text_boxes"][i];
    INFO(s << " " << box.dump());
    CHECK(hlines_through(*ax, box) == 0);  // was: the next state's bf16 line through the name
    CHECK(points_inside(*ax, box) == 0);
  }
  CHECK(names == 3);
  // the longest-L dots: every memory drawn, and two at one point told apart (an open ring under a smaller dot)
  int dots = 0, rings = 0;
  for (const auto& ln : (*ax)["lines"]) {
    const std::string label = ln["label"];
    if (label.find("longest L") == std::string::npos) continue;
    ++dots;
    if (ln["markerfacecolor"] == "none") ++rings;
    for (const auto& other : (*ax)["lines"]) {  // a dot at the same point as another has another size or shape
      if (&other == &ln || other["label"].get<std::string>().find("longest L") == std::string::npos) continue;
      if (other["x"] != ln["x"] || other["y"] != ln["y"]) continue;
      INFO(label << " and " << other["label"]);
      CHECK((other["markersize"] != ln["markersize"] || other["marker"] != ln["marker"]));
    }
  }
  CHECK(dots == 9);    // linear attention, DeltaNet, KDA at three states
  CHECK(rings >= 1);   // linear attention and DeltaNet copy the same L (as in scripts/run.sh's run)
}

TEST_CASE("fig_copy: the L = d_k label sits above the frame, where no curve covers it", "[figures][copy][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("c.h5");
  const auto r = run_kdalab("copy --d-k 16,32 --L 4,8,16,32,64 --trials 4 --precision fp32,bf16 --quiet --out " + h5);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const json j = dump_figure(d, "fig_copy.py", h5);
  for (std::size_t p = 0; p < 2; ++p) {
    const auto& ax = j["axes"][p];
    int found = 0;
    for (std::size_t i = 0; i < ax["texts"].size(); ++i) {
      if (ax["texts"][i] != "$L = d_k$") continue;
      ++found;
      const auto& box = ax["text_boxes"][i];
      INFO(ax["title"] << " " << box.dump());
      CHECK(box[1].get<double>() >= 1.0);  // above the data area
      CHECK(box[0].get<double>() < box[2].get<double>());
      CHECK(points_inside(ax, box) == 0);
      // centred on the dotted L = d_k line
      const double dk = p == 0 ? 16.0 : 32.0, x = frac(dk, ax["xlim"], ax["xscale"]);
      CHECK(box[0].get<double>() < x);
      CHECK(box[2].get<double>() > x);
    }
    CHECK(found == 1);
  }
}
