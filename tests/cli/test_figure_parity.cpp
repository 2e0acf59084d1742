// scripts/fig_parity.py: coinciding series stay visible and the legend says which lie on which; non-finite rows are
// marked at the top edge; the full-range panel shows the reference lines as one band; notes under the panel (skipped
// implementations and points, from parity's `notes`) are apart, whole, without empty or repeated reasons; the footer
// names the truth and the input kinds the rows were measured on.
// Runs /usr/bin/python3; skipped with a warning when it lacks h5py or matplotlib.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/decode_cost_note.hpp"
#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

TEST_CASE("fig_parity: coinciding series stay visible and the legend says which lie on which",
          "[figures][parity][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // A parity table where 'twin-bf16' and 'cuda-bf16' agree to 0.1% and 'float32' does not.
  const std::string h5 = d.file("parity.h5");
  python_ok("import h5py, numpy as np\n"
            "f = h5py.File('" + h5 + "', 'w')\n"
            "f.attrs['config'] = '{\\\"T\\\": \\\"[64,256]\\\", \\\"C\\\": [16.0, 32.0]}'\n"
            "g = f.create_group('parity/table')\n"
            "g['impl'] = np.array([b'float32', b'float32', b'twin-bf16', b'twin-bf16', b'cuda-bf16', b'cuda-bf16'])\n"
            "g['T'] = np.array([64, 256, 64, 256, 64, 256])\n"
            "g['o_rel_rms'] = np.array([1.2e-7, 1.3e-7, 1.70e-3, 1.75e-3, 1.7017e-3, 1.7505e-3])\n");
  const json j = draw(d, "fig_parity.py", h5);
  const auto& ax = j["axes"][0];
  const json* twin = find_line(ax, "twin-bf16", Match::prefix);
  const json* cuda = find_line(ax, "cuda-bf16", Match::prefix);
  REQUIRE(twin != nullptr);
  REQUIRE(cuda != nullptr);
  // the kernel is drawn underneath (larger marker, lower z), the twin on top with another marker and line style
  check_drawn_apart(*cuda, *twin);
  CHECK((*twin)["label"].get<std::string>().find("lies on cuda-bf16") != std::string::npos);
  for (const auto& ln : ax["lines"])  // the series that coincides with nothing says nothing
    if (ln["label"].get<std::string>().rfind("float32", 0) == 0)
      CHECK(ln["label"].get<std::string>().find("lies on") == std::string::npos);
  // the legend (a figure legend) carries the same words
  const std::string legend = legends(j);
  CHECK(legend.find("lies on cuda-bf16") != std::string::npos);
  // root config with number lists: printed as the command line takes them
  const std::string cfg = config_text(j);
  INFO(cfg);
  CHECK(cfg.find("C=[16,32]") != std::string::npos);
  CHECK(cfg.find("T=[64,256]") != std::string::npos);
}

TEST_CASE("fig_parity draws a parity file with non-finite rows: finite rows drawn, the others marked at the top edge",
          "[figures][parity][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // the twin's o has NaN at g_min = -100, recorded as o_rel_rms = inf (must not end in matplotlib's "Axis limits
  // cannot be NaN or Inf")
  kdalab_ok("parity --quick --g-min -100 --impl float64,twin-bf16 --T 17 --gate bounded --beta one --quiet --out " +
            d.file("small.h5"));
  const auto err = kdalab::h5read::array(d.file("small.h5"), "/parity/table/o_rel_rms");
  std::size_t nonfinite = 0;
  for (double e : err.data) nonfinite += std::isfinite(e) ? 0 : 1;
  REQUIRE(nonfinite > 0);  // the file does hold the rows this test is about
  REQUIRE(nonfinite < err.data.size());
  const json j = draw(d, "fig_parity.py", d.file("small.h5"));
  const auto& ax = j["axes"][0];
  CHECK(std::isfinite(ax["ylim"][0].get<double>()));
  CHECK(std::isfinite(ax["ylim"][1].get<double>()));
  int markers = 0;
  for (const auto& ln : ax["lines"])
    if (ln["label"].get<std::string>().find("non-finite") != std::string::npos && ln["coords"] == "axes") {
      ++markers;  // the top-edge marker
      for (const auto& y : ln["y"]) CHECK(y.get<double>() > 0.9);
    }
  const std::size_t finite_points = data_ys(ax).size();
  CHECK(markers >= 1);
  CHECK(finite_points >= 1);  // the float64 row is drawn
  const std::string legend = legends(j);
  INFO(legend);
  CHECK(legend.find("rows non-finite") != std::string::npos);  // per series: how many of its rows
  CHECK(legend.find("at the top edge: rows with non-finite o_rel_rms") != std::string::npos);
  std::string foot = footer(j);
  std::replace(foot.begin(), foot.end(), '\n', ' ');  // the caption is wrapped
  CHECK(foot.find(std::to_string(nonfinite) + " row(s) have a non-finite o_rel_rms") != std::string::npos);
}

TEST_CASE("fig_parity: the full-range panel shows the reference lines as one band named above the data",
          "[figures][parity][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const json j = draw(d, "fig_parity.py", long_parity_file(d));
  REQUIRE(j["axes"].size() >= 2);  // twin-bf16 is among the reference lines: the zoom panel is drawn
  const auto& full = j["axes"][0];
  const auto& zoom = j["axes"][1];
  auto reference_lines = [](const json& ax) {
    int n = 0;
    for (const auto& ln : ax["lines"])
      if (ln["coords"] == "axes" && ln["label"].get<std::string>().find("non-finite") == std::string::npos) ++n;
    return n;
  };
  CHECK(reference_lines(full) == 0);  // was: four dashed lines crowding the top of the panel over the bf16 markers
  CHECK(reference_lines(zoom) == 4);  // drawn where they can be told apart (and named at its right edge)
  // the highest data point and the band's name, in axes fractions of the log y axis
  const double lo = std::log10(full["ylim"][0].get<double>()), hi = std::log10(full["ylim"][1].get<double>());
  double top = -INFINITY;
  for (const double y : data_ys(full)) top = std::max(top, (std::log10(y) - lo) / (hi - lo));
  CHECK(top < 0.92);  // headroom above the data
  const auto names = notes_in(full, "reference lines", Match::anywhere);
  for (const auto& n : names) {
    INFO(n.box.dump() << " top of the data at " << top);
    CHECK(n.box[1].get<double>() > top);   // above every marker
    CHECK(n.box[3].get<double>() <= 1.0);  // inside the panel
  }
  CHECK(names.size() == 1);
  CHECK(legends(j).find("kdalab goal 2.0e-3") != std::string::npos);  // the legend still names each line's style
}

TEST_CASE("fig_parity: an implementation plotted at only some grid points says how many and why, under the panel",
          "[figures][parity][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // float32-chunk refuses the softplus points at C = 16 (factored decay span > 80 nats); the figure plotted its median
  // over the other half of the grid without a word
  kdalab_ok("parity --T 17,40 --dk 16 --dv 16 --gate bounded,softplus --beta one --C 16 "
            "--impl float64,float32-chunk --truth f64 --quiet --out " + d.file("p.h5"));
  const auto impl = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/impl");
  const auto chunk_rows = std::count(impl.begin(), impl.end(), "float32-chunk");
  REQUIRE(chunk_rows == 2);  // the file holds the partial implementation: 2 of its 4 points
  const json j = draw(d, "fig_parity.py", d.file("p.h5"));
  const auto notes = notes_in(j["axes"][0], "float32-chunk, C = 16: ", Match::prefix);
  for (const auto& n : notes) {
    INFO(n.text);
    CHECK(n.text.find("2 of the 4 grid points plotted") != std::string::npos);
    CHECK(n.text.find("the other 2 (every softplus-gate point) skipped: ") != std::string::npos);
    CHECK(n.text.find("> 80 nats: exp overflows in float32") != std::string::npos);  // the reason, from parity's notes
    INFO(n.box.dump());
    CHECK(n.box[3].get<double>() < 0.0);  // under the panel, where no data can be
  }
  CHECK(notes.size() == 1);
}

TEST_CASE("fig_parity says under the panel that the cuda-bf16 rows were skipped, from parity's notes",
          "[figures][parity][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("p.h5");
  // d_k = 16: no cuda-bf16 row in any build (a CPU build: no GPU / no CUDA; a GPU: the kernel runs d_k = 128 only)
  const auto r = run_kdalab("parity --T 17 --dk 16 --dv 16 --impl float64,float32,cuda-bf16 --truth f64 --quiet --out " + h5);
  INFO(r.output);
  REQUIRE(r.code == 0);
  REQUIRE(has(r, "note: cuda-bf16 row"));  // stdout says it; the figure must too
  const auto impl = kdalab::h5read::strings(h5, "/parity/table/impl");
  REQUIRE(std::count(impl.begin(), impl.end(), "cuda-bf16") == 0);
  const std::string rec = note_line(h5, "cuda-bf16 row");  // where parity records the skip
  REQUIRE(!rec.empty());
#ifndef KDALAB_HAVE_CUDA
  CHECK(rec.rfind("cuda-bf16 rows skipped: ", 0) == 0);
#endif
  const std::string why = rec.substr(rec.find(": ") + 2);  // the reason after "rows skipped: " / "skipped at ...: "
  const json j = dump_figure(d, "fig_parity.py", h5);
  const auto notes = texts_with_top(j["axes"][0], "cuda-bf16 (the CUDA kernel): not drawn, every row skipped: ");
  REQUIRE(notes.size() == 1);
  INFO(notes[0].first << "\nrecorded: " << why);
  // the recorded reason, word for word (the note wraps at spaces only: compare with single spaces)
  CHECK(notes[0].first.find(why.substr(0, std::min<std::size_t>(why.size(), 40))) != std::string::npos);
  CHECK(notes[0].second < 0.0);  // under the panel (its top edge below the axes), where no data can be
  // the footer names the truth the rows were compared with (--truth f64 here), not "the high-precision recurrence"
  std::string footer;
  for (const auto& x : j["texts"]) footer += std::string(x) + " ";
  for (auto& ch : footer) if (ch == '\n') ch = ' ';
  INFO(footer);
  CHECK(footer.find("Truth: the float64 recurrence") != std::string::npos);
}

TEST_CASE("fig_parity: a GPU run that skipped some points says how many cuda-bf16 points are plotted",
          "[figures][parity][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("p.h5");
  // as kdalab parity on a GPU writes it: the softplus point (1) is outside the kernel's shapes
  python_h5("f = h5py.File('" + h5 + "', 'w')\n"
         "g = f.create_group('parity/table')\n"
         "g['impl'] = np.array([b'float64', b'float64', b'cuda-bf16'])\n"
         "g['point'] = np.array([0, 1, 0])\n"
         "g['T'] = np.array([64, 64, 64])\n"
         "g['o_rel_rms'] = np.array([1e-16, 2e-16, 1.7e-3])\n"
         "f['parity'].attrs['notes'] = 'cuda-bf16 row skipped at B=1 T=64 H=2 d_k=128 d_v=128 C=16 gate=softplus: "
         "the kernel runs the bounded (K3) gate, C = 16, d_k = d_v = 128, HV = H only'\n");
  const json j = dump_figure(d, "fig_parity.py", h5);
  const auto notes = texts_with_top(j["axes"][0], "cuda-bf16: ");
  REQUIRE(notes.size() == 1);
  INFO(notes[0].first);
  CHECK(notes[0].first.find("cuda-bf16: 1 of the 2 grid points plotted; its rows at the others skipped: the kernel runs "
                            "the bounded (K3) gate") != std::string::npos);
  CHECK(texts_with_top(j["axes"][0], "cuda-bf16 (the CUDA kernel): not drawn").empty());  // it is drawn
  CHECK(notes[0].second < 0.0);
}

TEST_CASE("fig_parity: the notes under the panel are apart and whole; the zoom panel's y axis is labelled",
          "[figures][parity][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("p.h5");
  // float32-chunk skips the softplus points (span > 80 nats); cuda-bf16 has no row in this build (or without a GPU);
  // twin-bf16's bf16-level error gives the zoom panel
  const auto r = run_kdalab("parity --T 17,40 --dk 16 --dv 16 --gate bounded,softplus --beta one --C 16 "
                            "--impl float64,float32-chunk,twin-bf16,cuda-bf16 --state-precision fp32 "
                            "--matmul-precision plan --truth f64 --quiet --out " + h5);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const json j = dump_figure(d, "fig_parity.py", h5);
  const auto notes = texts_starting(j["axes"][0], "float32-chunk, C = 16: ");
  REQUIRE(notes.size() == 1);
  const std::string t = notes[0];
  INFO(t);
  // the float32-chunk note whole: its advice included, ended by a full stop
  CHECK(unwrapped(t).find("exp overflows in float32; accepted: F * |g_min| <= 80 (use a smaller C or tile, or "
                          "kda_recurrent, which has no such limit).") != std::string::npos);
  // the CUDA note, when there is one, starts a line of its own after that full stop
  const auto impl = kdalab::h5read::strings(h5, "/parity/table/impl");
  const bool cuda_rows = std::find(impl.begin(), impl.end(), "cuda-bf16") != impl.end();
  if (!cuda_rows) CHECK(t.find(".\ncuda-bf16 (the CUDA kernel): not drawn, every row skipped") != std::string::npos);
  CHECK(unwrapped(t).find("limit) cuda-bf16") == std::string::npos);  // not run together
  // a hand-made file whose first note is short: joined by a space, the CUDA note ran on in the same line
  const std::string h5b = d.file("short.h5");
  python_h5("f = h5py.File('" + h5b + "', 'w')\n"
            "g = f.create_group('parity/table')\n"
            "g['impl'] = np.array([b'float64', b'float64', b'float32-chunk'])\n"
            "g['point'] = np.array([0, 1, 0])\n"
            "g['T'] = np.array([64, 64, 64])\n"
            "g['C'] = np.array([16, 16, 16])\n"
            "g['gate'] = np.array([b'bounded', b'softplus', b'bounded'])\n"
            "g['o_rel_rms'] = np.array([1e-16, 2e-16, 1e-7])\n"
            "f['parity'].attrs['notes'] = 'float32-chunk C=16 skipped at point 1 (T=64 gate=softplus): exp overflows "
            "in float32; accepted: F * |g_min| <= 80\\ncuda-bf16 rows skipped: no GPU visible'\n");
  const json jb = dump_figure(d, "fig_parity.py", h5b);
  const auto short_notes = texts_starting(jb["axes"][0], "float32-chunk, C = 16: ");
  REQUIRE(short_notes.size() == 1);
  INFO(short_notes[0]);
  CHECK(short_notes[0].find("exp overflows in float32; accepted: F * |g_min| <= 80.\ncuda-bf16 (the CUDA kernel): "
                            "not drawn, every row skipped: no GPU visible.") != std::string::npos);
  REQUIRE(j["axes"].size() >= 2);
  INFO(j["axes"][1]["title"]);
  CHECK(std::string(j["axes"][1]["title"]).rfind("zoom", 0) == 0);
  CHECK(j["axes"][1]["ylabel"] == "relative RMS error of $o$ vs truth (zoom)");
}

TEST_CASE("fig_parity leaves out empty and repeated reasons of parity's notes", "[figures][parity][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("p.h5");
  // no cuda-bf16 row; one empty reason, one reason twice (CPU-build style and shape style)
  python_h5("f = h5py.File('" + h5 + "', 'w')\n"
         "g = f.create_group('parity/table')\n"
         "g['impl'] = np.array([b'float64', b'float64'])\n"
         "g['point'] = np.array([0, 1])\n"
         "g['T'] = np.array([64, 64])\n"
         "g['o_rel_rms'] = np.array([1e-16, 2e-16])\n"
         "f['parity'].attrs['notes'] = 'cuda-bf16 rows skipped: \\ncuda-bf16 rows skipped: no GPU visible\\n"
         "cuda-bf16 row skipped at B=1 T=64 C=16: no GPU visible\\n'\n");
  json j = dump_figure(d, "fig_parity.py", h5);
  std::string t = axes_texts(j["axes"][0]);
  INFO(t);
  CHECK(t.find("cuda-bf16 (the CUDA kernel): not drawn, every row skipped: no GPU visible. |") != std::string::npos);
  CHECK(t.find("skipped: .") == std::string::npos);
  CHECK(t.find("skipped: ;") == std::string::npos);
  CHECK(t.find("no GPU visible; no GPU visible") == std::string::npos);
  // only empty reasons: the skip is still said, without ": ."
  python_h5("f = h5py.File('" + h5 + "', 'a')\n"
         "f['parity'].attrs['notes'] = 'cuda-bf16 rows skipped: \\ncuda-bf16 rows skipped:'\n");
  j = dump_figure(d, "fig_parity.py", h5);
  t = axes_texts(j["axes"][0]);
  INFO(t);
  CHECK(t.find("cuda-bf16 (the CUDA kernel): not drawn, every row skipped. |") != std::string::npos);
  CHECK(t.find("skipped: .") == std::string::npos);
  // a GPU run: two points outside the kernel's shapes with the same reason, and an empty one
  python_h5("f = h5py.File('" + h5 + "', 'w')\n"
         "g = f.create_group('parity/table')\n"
         "g['impl'] = np.array([b'float64', b'float64', b'float64', b'cuda-bf16'])\n"
         "g['point'] = np.array([0, 1, 2, 0])\n"
         "g['T'] = np.array([64, 64, 64, 64])\n"
         "g['o_rel_rms'] = np.array([1e-16, 2e-16, 2e-16, 1.7e-3])\n"
         "f['parity'].attrs['notes'] = 'cuda-bf16 row skipped at B=1 C=16 gate=softplus: the kernel runs d_k = 128\\n"
         "cuda-bf16 row skipped at B=1 C=32 gate=softplus: the kernel runs d_k = 128\\n"
         "cuda-bf16 row skipped at B=1 C=64 gate=softplus: '\n");
  j = dump_figure(d, "fig_parity.py", h5);
  t = axes_texts(j["axes"][0]);
  INFO(t);
  CHECK(t.find("cuda-bf16: 1 of the 3 grid points plotted; its rows at the others skipped: the kernel runs d_k = 128. |") !=
        std::string::npos);
}

TEST_CASE("fig_parity's footer names the input kinds of a parity run with --inputs", "[figures][parity][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("p.h5");
  const auto r = run_kdalab("parity --T 17 --dk 8 --dv 8 --inputs anchor,long-memory --impl float64,float32 --truth f64 "
                            "--quiet --out " + h5);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const json j = dump_figure(d, "fig_parity.py", h5);
  std::string footer;
  for (const auto& x : j["texts"]) footer += std::string(x) + " ";
  for (auto& ch : footer) if (ch == '\n') ch = ' ';
  INFO(footer);
  CHECK(footer.find("inputs of the kinds anchor, long-memory (numerics/kda_inputs.hpp), pooled in the medians") !=
        std::string::npos);
}
