#pragma once
// Helpers shared by the figure-script tests (scripts/fig_*.py run with --dump): the interpreter, the skip when it
// lacks the plotting modules, the small decode-cost run the decode-cost figure tests draw, and where a dumped
// panel's lines run (through a legend or a text box). Catch2 (WARN) and
// tests/cli/cli_util.hpp (run_command, run_kdalab).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/catch.hpp"
#include "experiments/results.hpp"
#include "tests/cli/cli_util.hpp"

namespace kdalab::testutil {

/// The interpreter the figure scripts are tested with (scripts/setup.sh installs h5py and matplotlib for it).
inline const char* const kPy = "/usr/bin/python3";

/// True (with a warning) when /usr/bin/python3 lacks h5py or matplotlib: the calling figure test then returns early.
/// Asked once per test process (a python start with matplotlib is ~0.3 s), the answer kept for its other test cases.
inline bool skip_without_plotting() {
  static const bool lacking = run_command(cat({kPy, " -c 'import h5py, matplotlib' >/dev/null 2>&1"})).code != 0;
  if (lacking) WARN("/usr/bin/python3 lacks h5py or matplotlib (scripts/setup.sh installs them): figure tests skipped");
  return lacking;
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
  const auto r = run_command(cat({kPy, " scripts/", script, " ", h5, " --dump ", dump}));
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
  const auto r = run_command(cat({kPy, " -c \"import h5py, numpy as np\n", code, "\""}));
  INFO(code << "\n" << r.output);
  REQUIRE(r.code == 0);
}

using nlohmann::json;

/// Runs `/usr/bin/python3 <args>` from the working directory (the repo root under ctest); checks nothing.
inline RunResult python(const std::string& args) { return run_command(cat({kPy, " ", args})); }

/// Runs the Python program `code` (one double-quoted shell word: escape '"' as '\\"') with python3 -c, REQUIREs
/// exit 0. The tests write their hand-made results files this way, with h5py.
inline void python_ok(const std::string& code) {
  const auto w = python("-c \"" + code + "\"");
  INFO(w.output);
  REQUIRE(w.code == 0);
}

/// Runs `kdalab <args>` (REQUIREs exit 0) and returns the run, its console output for the test to read.
inline RunResult kdalab_ok(const std::string& args) {
  const auto r = run_kdalab(args);
  INFO(r.output);
  REQUIRE(r.code == 0);
  return r;
}

/// How draw() runs a figure script: the dump only, or the dump and the PNG and PDF (figstyle.save() dumps before it
/// saves, so the dump is the same either way; saving costs ~0.8 s a run).
enum class Save { dump_only, png_pdf };

/// Runs scripts/<script> on `h5` with --dump, returns the dump (REQUIREs exit 0). With Save::png_pdf also with
/// --out-dir <d>/fig, and CHECKs that the script wrote a .png and a .pdf there: once per figure script in the tests.
inline json draw(const TempDir& d, const std::string& script, const std::string& h5, Save save = Save::dump_only) {
  const std::string dump = d.file(script + ".json");
  const std::string out_dir = save == Save::png_pdf ? " --out-dir " + d.file("fig") : std::string();
  const auto r = python("scripts/" + script + " " + h5 + out_dir + " --dump " + dump);
  INFO(script << ": " << r.output);
  REQUIRE(r.code == 0);
  if (save == Save::png_pdf) {
    int png = 0, pdf = 0;
    for (const auto& e : std::filesystem::directory_iterator(d.file("fig"))) {
      png += e.path().extension() == ".png";
      pdf += e.path().extension() == ".pdf";
    }
    CHECK(png >= 1);
    CHECK(pdf >= 1);
  }
  return json::parse(slurp(dump));
}

/// Runs `kdalab <args> --out <d>/<h5>` (REQUIREs exit 0), then draws that file with scripts/<script>: the dump.
inline json run_and_draw(const TempDir& d, const std::string& args, const std::string& h5, const std::string& script,
                         Save save = Save::dump_only) {
  kdalab_ok(args + " --out " + d.file(h5));
  return draw(d, script, d.file(h5), save);
}

/// The strings of the JSON array `texts`, each followed by a line break.
inline std::string lines_of(const json& texts) {
  std::string all;
  for (const auto& t : texts) all += t.get<std::string>() + "\n";
  return all;
}

/// The figure's footer (its texts outside the panels), one text a line.
inline std::string footer(const json& j) { return lines_of(j["texts"]); }

/// Every entry of every figure legend (not the panels' own legends), one a line.
inline std::string legends(const json& j) {
  std::string all;
  for (const auto& lg : j["legends"]) all += lines_of(lg);
  return all;
}

/// The config line(s) of a footer (from "config " to "command:").
inline std::string config_text(const json& j) {
  const std::string f = footer(j);
  const auto a = f.find("config "), b = f.find("command:");
  return a == std::string::npos ? std::string() : f.substr(a, b - a);
}

/// How a text is matched: the whole text, its start, or anywhere in it.
enum class Match { exact, prefix, anywhere };

inline bool matches(const std::string& s, const std::string& text, Match m) {
  switch (m) {
    case Match::exact: return s == text;
    case Match::prefix: return s.rfind(text, 0) == 0;
    case Match::anywhere: return s.find(text) != std::string::npos;
  }
  return false;
}

/// The last element of the JSON array `items` whose string `key` matches `text` (nullptr when none).
inline const json* find_last(const json& items, const char* key, const std::string& text, Match m) {
  const json* found = nullptr;
  for (const auto& it : items)
    if (it[key].is_string() && matches(it[key].get<std::string>(), text, m)) found = &it;
  return found;
}

/// The panel of the dump `j` titled `title` (the last one matching; nullptr when none).
inline const json* find_axis(const json& j, const std::string& title, Match m) { return find_last(j["axes"], "title", title, m); }

/// The line of the panel `ax` labelled `label` (the last one matching; nullptr when none).
inline const json* find_line(const json& ax, const std::string& label, Match m) {
  return find_last(ax["lines"], "label", label, m);
}

/// The y values drawn by the panel's data lines (coords "data"; null points left out). Lines placed in axes
/// fractions (the N = d_k marker, reference lines, the top-edge marker of non-finite rows) are not data.
inline std::vector<double> data_ys(const json& ax) {
  std::vector<double> ys;
  for (const auto& ln : ax["lines"])
    if (ln["coords"] == "data")
      for (const auto& y : ln["y"])
        if (!y.is_null()) ys.push_back(y.get<double>());
  return ys;
}

/// A text drawn in a panel: its words with line breaks folded to spaces (notes are wrapped), its box in axes
/// fractions [x0, y0, x1, y1] and its panel.
struct Note {
  std::string text;
  json box;
  const json* ax;
};

/// The texts of the panel `ax` that match `text` (line breaks folded to spaces first).
inline std::vector<Note> notes_in(const json& ax, const std::string& text, Match m) {
  std::vector<Note> found;
  for (std::size_t i = 0; i < ax["texts"].size(); ++i) {
    std::string s = ax["texts"][i];
    std::replace(s.begin(), s.end(), '\n', ' ');
    if (matches(s, text, m)) found.push_back({s, ax["text_boxes"][i], &ax});
  }
  return found;
}

/// The texts of every panel of the dump `j` that match `text` (as notes_in).
inline std::vector<Note> notes_in_figure(const json& j, const std::string& text, Match m) {
  std::vector<Note> found;
  for (const auto& ax : j["axes"])
    for (auto& n : notes_in(ax, text, m)) found.push_back(std::move(n));
  return found;
}

/// Checks that two coinciding series both stay visible: `under` is drawn underneath (a marker more than 2 pt larger,
/// lower z), `over` on top with another marker and line style.
inline void check_drawn_apart(const json& under, const json& over) {
  INFO(under["label"] << " under " << over["label"]);
  CHECK(under["markersize"].get<double>() > over["markersize"].get<double>() + 2.0);
  CHECK(under["marker"] != over["marker"]);
  CHECK(under["linestyle"] != over["linestyle"]);
  CHECK(over["zorder"].get<double>() > under["zorder"].get<double>());
}

/// The figure's panel whose title is `title` exactly (nullptr when none).
inline const json* axis_titled(const json& j, const std::string& title) {
  for (const auto& ax : j["axes"])
    if (ax["title"] == title) return &ax;
  return nullptr;
}

/// The index in ax["texts"] of the first text starting with `prefix` (-1 when none).
inline int text_index(const json& ax, const std::string& prefix) {
  for (std::size_t i = 0; i < ax["texts"].size(); ++i)
    if (ax["texts"][i].get<std::string>().rfind(prefix, 0) == 0) return static_cast<int>(i);
  return -1;
}

/// The panel of dump `j` whose title starts with `title` (nullptr when none).
inline const json* panel(const json& j, const std::string& title) {
  for (const auto& ax : j["axes"])
    if (ax["title"].get<std::string>().rfind(title, 0) == 0) return &ax;
  return nullptr;
}

/// The texts of axes `ax` that start with `prefix`, newlines (wrapping) made spaces, each with its box's top edge.
inline std::vector<std::pair<std::string, double>> texts_with_top(const json& ax, const std::string& prefix) {
  std::vector<std::pair<std::string, double>> out;
  for (std::size_t i = 0; i < ax["texts"].size(); ++i) {
    std::string s = ax["texts"][i];
    std::replace(s.begin(), s.end(), '\n', ' ');
    if (s.rfind(prefix, 0) == 0) out.emplace_back(s, ax["text_boxes"][i][3].get<double>());
  }
  return out;
}

/// The texts of axes `ax` that start with `prefix` (whole, newlines kept).
inline std::vector<std::string> texts_starting(const json& ax, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& t : ax["texts"]) {
    const std::string s = t;
    if (s.rfind(prefix, 0) == 0) out.push_back(s);
  }
  return out;
}

/// `s` with newlines (wrapping) made spaces.
inline std::string unwrapped(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

/// Every text of axes `ax` with newlines (wrapping) made spaces, joined by " | ".
inline std::string axes_texts(const json& ax) {
  std::string all;
  for (const auto& t : ax["texts"]) all += std::string(t) + " | ";
  for (auto& c : all)
    if (c == '\n') c = ' ';
  return all;
}

/// The parity `notes` line that starts with `prefix` ("" when none).
inline std::string note_line(const std::string& h5, const std::string& prefix) {
  std::istringstream in(kdalab::h5read::attr_string(h5, "parity", "notes"));
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return line;
  return {};
}

/// A parity file where twin-bf16 sits among the reference lines (so fig_parity draws its zoom panel), with a root
/// config and a command line far longer than one footer line.
inline std::string long_parity_file(const TempDir& d) {
  const std::string h5 = d.file("long.h5");
  python_ok("import h5py, json, numpy as np\n"
            "f = h5py.File('" + h5 + "', 'w')\n"
            "cfg = {'impl-%02d' % i: ['value-%02d-%d' % (i, k) for k in range(6)] for i in range(30)}\n"
            "cfg['last-key'] = 'the-end'\n"
            "f.attrs['config'] = json.dumps(cfg)\n"
            "f.attrs['command_line'] = 'kdalab parity ' + ' '.join('--opt-%02d %d' % (i, i) for i in range(60)) + ' --out tail.h5'\n"
            "g = f.create_group('parity/table')\n"
            "g['impl'] = np.array([b'float32', b'float32', b'twin-bf16', b'twin-bf16'])\n"
            "g['T'] = np.array([64, 256, 64, 256])\n"
            "g['o_rel_rms'] = np.array([1.2e-7, 1.3e-7, 1.70e-3, 3.75e-3])\n");
  return h5;
}

}  // namespace kdalab::testutil
