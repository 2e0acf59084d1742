#pragma once
// Helpers shared by the figure-script tests (scripts/fig_*.py run with --dump): the interpreter, the skip when it
// lacks the plotting modules, the small decode-cost run the decode-cost figure tests draw, and where a dumped
// panel's lines run (through a legend or a text box). Catch2 (WARN) and
// tests/cli/cli_util.hpp (run_command, run_kdalab).
#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

namespace kdalab::testutil {

/// The interpreter the figure scripts are tested with (scripts/setup.sh installs h5py and matplotlib for it).
inline const char* const kPy = "/usr/bin/python3";

/// True (with a warning) when /usr/bin/python3 lacks h5py or matplotlib: the calling figure test then returns early.
inline bool skip_without_plotting() {
  if (run_command(std::string(kPy) + " -c 'import h5py, matplotlib' >/dev/null 2>&1").code == 0) return false;
  WARN("/usr/bin/python3 lacks h5py or matplotlib (scripts/setup.sh installs them): figure tests skipped");
  return true;
}

/// A small `kdalab decode-cost` run into `h5` (CPU rows at n = 1024, 2048, 4096, d = 64; no GPU rows), for the
/// decode-cost figure tests; REQUIREs exit 0 (its output in the failure message).
inline void make_small_decode_cost(const std::string& h5) {
  const auto r = run_kdalab("decode-cost --cpu-n 1024,2048,4096 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 "
                            "--context 1024 --gpu-n 0 --quiet --out " + h5);
  INFO(r.output);
  REQUIRE(r.code == 0);
}

/// Position of data value `v` along an axis with limits `lim` and scale `scale` ("log" or linear), as a fraction.
inline double frac(double v, const nlohmann::json& lim, const std::string& scale) {
  const double a = lim[0], b = lim[1];
  if (scale == "log") return (std::log(v) - std::log(a)) / (std::log(b) - std::log(a));
  return (v - a) / (b - a);
}

/// How many sampled points of the data lines of the dumped panel `ax` (straight segments between the points, sampled
/// 40 times each, in axes fractions) fall inside `box` ([x0, y0, x1, y1] in axes fractions, e.g. a legend_box or a
/// text_boxes entry).
inline int points_inside(const nlohmann::json& ax, const nlohmann::json& box) {
  int hits = 0;
  const double x0 = box[0], y0 = box[1], x1 = box[2], y1 = box[3];
  for (const auto& ln : ax["lines"]) {
    if (ln["coords"] != "data") continue;
    const auto& xs = ln["x"];
    const auto& ys = ln["y"];
    for (std::size_t i = 0; i + 1 < xs.size(); ++i) {
      if (xs[i].is_null() || ys[i].is_null() || xs[i + 1].is_null() || ys[i + 1].is_null()) continue;
      const double ax0 = frac(xs[i], ax["xlim"], ax["xscale"]), ay0 = frac(ys[i], ax["ylim"], ax["yscale"]);
      const double ax1 = frac(xs[i + 1], ax["xlim"], ax["xscale"]), ay1 = frac(ys[i + 1], ax["ylim"], ax["yscale"]);
      for (int s = 0; s <= 40; ++s) {
        const double u = s / 40.0, px = ax0 + u * (ax1 - ax0), py = ay0 + u * (ay1 - ay0);
        if (px >= x0 && px <= x1 && py >= y0 && py <= y1) ++hits;
      }
    }
  }
  return hits;
}

/// How many horizontal lines of the dumped panel `ax` drawn across it (axhline: coords "axes", x in axes fractions,
/// y in data) run through `box` ([x0, y0, x1, y1] in axes fractions): their height lies within [y0, y1] and their x
/// extent overlaps [x0, x1].
inline int hlines_through(const nlohmann::json& ax, const nlohmann::json& box) {
  int hits = 0;
  const double x0 = box[0], y0 = box[1], x1 = box[2], y1 = box[3];
  for (const auto& ln : ax["lines"]) {
    if (ln["coords"] != "axes" || ln["y"].size() != 2 || ln["y"][0].is_null() || ln["y"][0] != ln["y"][1]) continue;
    const double y = frac(ln["y"][0], ax["ylim"], ax["yscale"]);
    const double lx0 = ln["x"][0], lx1 = ln["x"][1];
    if (y >= y0 && y <= y1 && std::max(lx0, lx1) >= x0 && std::min(lx0, lx1) <= x1) ++hits;
  }
  return hits;
}

/// Runs scripts/<script> on `h5` with --dump only (no image files) and returns the dump; REQUIREs exit 0.
inline nlohmann::json dump_figure(const TempDir& d, const std::string& script, const std::string& h5) {
  const std::string dump = d.file(script + ".json");
  const auto r = run_command(std::string(kPy) + " scripts/" + script + " " + h5 + " --dump " + dump);
  INFO(script << ": " << r.output);
  REQUIRE(r.code == 0);
  return nlohmann::json::parse(slurp(dump));
}

/// The panel of the figure dump `dump` whose title starts with `title` (REQUIREd to exist): for tests that must not
/// depend on the panels' order. `title` by value (a string_view): a `const std::string&` bound to a literal made g++ 13
/// (the GPU machine) warn -Wdangling-reference at every `const auto& ax = panel_titled(j, "...")`, an error there.
inline const nlohmann::json& panel_titled(const nlohmann::json& dump, std::string_view title) {
  for (const auto& a : dump["axes"])
    if (a["title"].is_string() && a["title"].get_ref<const std::string&>().starts_with(title)) return a;
  INFO(dump["axes"].dump());
  FAIL("no panel titled '" << title << "...'");
  return dump;
}

/// Runs a python snippet with h5py and numpy (as np) imported, e.g. to write a hand-made results file; REQUIREs exit 0.
inline void python_h5(const std::string& code) {
  const auto r = run_command(std::string(kPy) + " -c \"import h5py, numpy as np\n" + code + "\"");
  INFO(code << "\n" << r.output);
  REQUIRE(r.code == 0);
}

}  // namespace kdalab::testutil
