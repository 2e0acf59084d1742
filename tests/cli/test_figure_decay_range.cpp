// scripts/fig_decay_range.py and summary.py on decay-range files: cells say what the console says (inf as stored,
// the NaN+Inf count of o); an all-overflow panel is hatched, counted under the title, with a colour key; the fp64
// control panel says why its softplus cells are non-finite.
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

TEST_CASE("decay-range: figure cells and summary.py say what the console says (inf as stored, NaN+Inf count of o)",
          "[figures][decay-range][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // gate shift 20 pins the decays at their bound: g_min = -8 and softplus overflow the factored tile (rel_rms = inf,
  // o has NaN), and every fp16 row does
  const auto r = kdalab_ok("decay-range --g-min -1,-8 --C 16,64 --precision fp32,fp16 --T 32 --D 16 --kernel-plan false "
                           "--quiet --out " + d.file("dr.h5"));
  // the console's fp32 table: "<rel_rms> (<NaN+Inf count of o>)" per cell, e.g. "inf (336)"
  std::vector<std::string> console;
  const std::regex cell(R"(\b(inf|nan) \(([0-9]+)\))");
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), cell), end; it != end; ++it) console.push_back(it->str());
  REQUIRE(!console.empty());
  const json j = draw(d, "fig_decay_range.py", d.file("dr.h5"), Save::png_pdf);
  int dark = 0;
  for (const auto& ax : j["axes"])
    for (const auto& t : ax["texts"]) {
      const std::string s = t;
      INFO(ax["title"] << ": " << s);
      CHECK(s.find("NaN") == std::string::npos);  // was "NaN\novf": the console says inf
      CHECK(s.find("Inf") == std::string::npos);
      if (s.rfind("inf (", 0) == 0 || s.rfind("nan (", 0) == 0) ++dark;
    }
  const json* fp32 = find_axis(j, "chunked, fp32", Match::exact);
  REQUIRE(fp32 != nullptr);
  for (const auto& c : console) {  // each console cell is a cell of the fp32 panel, word for word
    bool found = false;
    for (const auto& t : (*fp32)["texts"]) found = found || t.get<std::string>().rfind(c + "\n", 0) == 0 || t == c;
    INFO(c << " in " << (*fp32)["texts"].dump());
    CHECK(found);
  }
  CHECK(dark >= 6 + static_cast<int>(console.size()));  // every fp16 cell is dark too
  CHECK(footer(j).find("how many values of o are NaN or Inf") != std::string::npos);  // the footer says what (336) is

  const auto s = python("scripts/summary.py " + d.file("dr.h5"));
  INFO(s.output);
  REQUIRE(s.code == 0);
  CHECK(!has(s, "NaN "));  // was the fp16 median: "NaN" over no finite row
  const std::regex fp16(R"(chunked\s+fp16\s+6\s+inf\s+inf\s+6\s+[0-9]+\s+[0-9]+)");  // rows, median, max, NaN/Inf rows, o_nan, o_inf
  CHECK(std::regex_search(s.output, fp16));
  CHECK(has(s, "o_nan (sum)"));
  CHECK(has(s, "o_inf (sum)"));
}

TEST_CASE("decay-range: the fp64 control panel says why its softplus cells are non-finite, under the panel",
          "[figures][decay-range][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // --gate-shift 20 (the default): the unbounded softplus gate reaches g ~ -40 per token, so a 32-token chunk's
  // factored decay is ~1100 nats, past fp64's exp range (709.8): the control's cell is "inf (...)", and the panel says
  // why; at C = 16 (~650 nats) and for g_min = -1 it stays finite
  kdalab_ok("decay-range --g-min -1 --C 16,32 --precision fp64 --T 64 --D 16 --kernel-plan false --quiet --out " +
            d.file("dr.h5"));
  const auto o_nan = kdalab::h5read::array(d.file("dr.h5"), "/decay_range/table/o_nan");
  const auto C = kdalab::h5read::array(d.file("dr.h5"), "/decay_range/table/C");
  const auto gate = kdalab::h5read::strings(d.file("dr.h5"), "/decay_range/table/gate");
  std::vector<std::string> dark;  // the non-finite cells the file holds: softplus at C = 32 only
  for (std::size_t i = 0; i < gate.size(); ++i)
    if (o_nan.data[i] > 0) dark.push_back(gate[i] + " C=" + std::to_string(std::lround(C.data[i])));
  REQUIRE(dark == std::vector<std::string>{"softplus C=32"});
  const json j = draw(d, "fig_decay_range.py", d.file("dr.h5"));
  const auto notes = notes_in_figure(j, "Dark fp64 cells (the control): ", Match::prefix);
  for (const auto& n : notes) {
    INFO(n.text);
    CHECK((*n.ax)["title"] == "chunked, fp64 (control)");
    CHECK(n.text.find("softplus at C = 32: ") != std::string::npos);  // which cells (not C = 16, not g_min = -1)
    CHECK(n.text.find("C = 16") == std::string::npos);
    CHECK(n.text.find("g_min = -1") == std::string::npos);
    CHECK(n.text.find("unbounded") != std::string::npos);         // why: the gate has no lower bound,
    CHECK(n.text.find("--gate-shift 20") != std::string::npos);   // the shift pins it low,
    CHECK(n.text.find("past fp64's exp range (|c| > 709.8)") != std::string::npos);  // the factored decay overflows
    CHECK(n.text.find("o gets NaN") != std::string::npos);
    INFO(n.box.dump());
    CHECK(n.box[3].get<double>() < 0.0);  // under the panel, not over its cells
  }
  CHECK(notes.size() == 1);
}

TEST_CASE("fig_decay_range marks an all-overflow panel: hatched cells counted under the title, a colour key",
          "[figures][decay-range][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // --gate-shift 20 (the default): every fp16 cell overflows, fp32 only at g_min = -8
  const auto r = run_kdalab("decay-range --g-min -1,-8 --C 16,64 --precision fp32,fp16 --T 32 --D 16 "
                            "--kernel-plan false --quiet --out " + d.file("dr.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto prec = kdalab::h5read::strings(d.file("dr.h5"), "/decay_range/table/precision");
  const auto o_nan = kdalab::h5read::array(d.file("dr.h5"), "/decay_range/table/o_nan");
  const auto o_inf = kdalab::h5read::array(d.file("dr.h5"), "/decay_range/table/o_inf");
  int fp16_cells = 0, fp16_bad = 0, fp32_cells = 0, fp32_bad = 0;
  for (std::size_t i = 0; i < prec.size(); ++i) {
    const bool bad = o_nan.data[i] + o_inf.data[i] > 0;
    (prec[i] == "fp16" ? fp16_cells : fp32_cells) += 1;
    (prec[i] == "fp16" ? fp16_bad : fp32_bad) += bad ? 1 : 0;
  }
  REQUIRE(fp16_cells == 6);  // the file is the case this test is about: every fp16 cell and some fp32 cells overflow
  REQUIRE(fp16_bad == 6);
  REQUIRE(fp32_bad > 0);
  REQUIRE(fp32_bad < fp32_cells);
  const json j = dump_figure(d, "fig_decay_range.py", d.file("dr.h5"));
  const json* fp16 = axis_titled(j, "chunked, fp16");  // the title itself is unchanged
  const json* fp32 = axis_titled(j, "chunked, fp32");
  REQUIRE(fp16 != nullptr);
  REQUIRE(fp32 != nullptr);
  INFO((*fp16)["texts"].dump() << "\n" << (*fp32)["texts"].dump());
  const int k16 = text_index(*fp16, "all 6 cells non-finite (overflow)");
  REQUIRE(k16 >= 0);
  CHECK((*fp16)["text_boxes"][k16][1].get<double>() >= 1.0);  // at the top, above the cells, under the title
  const int k32 = text_index(*fp32, std::to_string(fp32_bad) + " of " + std::to_string(fp32_cells) + " cells non-finite");
  REQUIRE(k32 >= 0);
  CHECK((*fp32)["text_boxes"][k32][1].get<double>() >= 1.0);
  bool key = false;  // the colour bar's key of the dark cells
  for (const auto& ax : j["axes"]) key = key || text_index(ax, "o not finite\n(overflow)") >= 0;
  CHECK(key);
  std::string footer;  // the figure's texts, wrapping undone
  for (const auto& t : j["texts"]) footer += t.get<std::string>() + " ";
  for (auto& ch : footer)
    if (ch == '\n') ch = ' ';
  INFO(footer);
  CHECK(footer.find("Dark hatched cells: o has NaN/Inf (counted under each panel's title)") !=
        std::string::npos);  // the footer says what the marks mean
}
