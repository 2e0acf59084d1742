// The figure and summary scripts (scripts/fig_*.py, scripts/summary.py, scripts/figures.sh) on small
// results files, read back through the scripts' --dump JSON (what was drawn: axes limits, lines, legends,
// footer): the recall error axis is set by the data (not stretched to 1e-17; errors < 1e-8 go to the "exact"
// strip), coinciding parity series stay visible and say so, footers print config values as the file stores
// them (16, not 16.0), decode-cost's cache note reaches the footer, the summary prints key numbers with the
// recorded units (never "[1]"), figures.sh keeps a second file's same figure under another name, and footers
// leave out the run-control options (out, quick, quiet) while keeping the seed and every option that changes numbers;
// a parity file with non-finite rows draws its finite rows and marks the others (was a NaN/Inf axis-limit traceback);
// odd files (a table without rows or columns) skip with exit 3 and a missing or non-HDF5 path is one line, exit 2.
// Session 6 newcomer's finds: a panel note (decode-cost's "GPU rows skipped") sits under the panel, not on a curve;
// footers are wrapped whole (never cut with "…"); parity's full-range panel shows the reference lines as one band
// named above the data; --dump alone writes only the JSON (no figure redrawn behind the user's back) and says so;
// decay-range cells and summary.py say what the console says ("inf (3168)", never a made-up "NaN"); summary.py
// says what the "(8)" of decode_cost/hybrid is.
// Runs /usr/bin/python3 (as scripts/run.sh does); skipped with a warning when it lacks h5py or matplotlib.
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

namespace {

/// Runs `/usr/bin/python3 <args>` from the working directory (the repo root under ctest); checks nothing.
RunResult python(const std::string& args) { return run_command(std::string(kPy) + " " + args); }

/// Runs the Python program `code` (one double-quoted shell word: escape '"' as '\\"') with python3 -c, REQUIREs
/// exit 0. The tests write their hand-made results files this way, with h5py.
void python_ok(const std::string& code) {
  const auto w = python("-c \"" + code + "\"");
  INFO(w.output);
  REQUIRE(w.code == 0);
}

/// Runs `kdalab <args>` (REQUIREs exit 0) and returns the run, its console output for the test to read.
RunResult kdalab_ok(const std::string& args) {
  const auto r = run_kdalab(args);
  INFO(r.output);
  REQUIRE(r.code == 0);
  return r;
}

/// Runs scripts/<script> on `h5` with --dump, returns the dump (REQUIREs exit 0).
json draw(const TempDir& d, const std::string& script, const std::string& h5) {
  const std::string dump = d.file(script + ".json");
  const auto r = python("scripts/" + script + " " + h5 + " --out-dir " + d.file("fig") + " --dump " + dump);
  INFO(script << ": " << r.output);
  REQUIRE(r.code == 0);
  return json::parse(slurp(dump));
}

/// Runs `kdalab <args> --out <d>/<h5>` (REQUIREs exit 0), then draws that file with scripts/<script>: the dump.
json run_and_draw(const TempDir& d, const std::string& args, const std::string& h5, const std::string& script) {
  kdalab_ok(args + " --out " + d.file(h5));
  return draw(d, script, d.file(h5));
}

/// The strings of the JSON array `texts`, each followed by a line break.
std::string lines_of(const json& texts) {
  std::string all;
  for (const auto& t : texts) all += t.get<std::string>() + "\n";
  return all;
}

/// The figure's footer (its texts outside the panels), one text a line.
std::string footer(const json& j) { return lines_of(j["texts"]); }

/// Every entry of every figure legend (not the panels' own legends), one a line.
std::string legends(const json& j) {
  std::string all;
  for (const auto& lg : j["legends"]) all += lines_of(lg);
  return all;
}

/// The config line(s) of a footer (from "config " to "command:").
std::string config_text(const json& j) {
  const std::string f = footer(j);
  const auto a = f.find("config "), b = f.find("command:");
  return a == std::string::npos ? std::string() : f.substr(a, b - a);
}

/// How a text is matched: the whole text, its start, or anywhere in it.
enum class Match { exact, prefix, anywhere };

bool matches(const std::string& s, const std::string& text, Match m) {
  switch (m) {
    case Match::exact: return s == text;
    case Match::prefix: return s.rfind(text, 0) == 0;
    case Match::anywhere: return s.find(text) != std::string::npos;
  }
  return false;
}

/// The last element of the JSON array `items` whose string `key` matches `text` (nullptr when none).
const json* find_last(const json& items, const char* key, const std::string& text, Match m) {
  const json* found = nullptr;
  for (const auto& it : items)
    if (it[key].is_string() && matches(it[key].get<std::string>(), text, m)) found = &it;
  return found;
}

/// The panel of the dump `j` titled `title` (the last one matching; nullptr when none).
const json* find_axis(const json& j, const std::string& title, Match m) { return find_last(j["axes"], "title", title, m); }

/// The line of the panel `ax` labelled `label` (the last one matching; nullptr when none).
const json* find_line(const json& ax, const std::string& label, Match m) {
  return find_last(ax["lines"], "label", label, m);
}

/// The y values drawn by the panel's data lines (coords "data"; null points left out). Lines placed in axes
/// fractions (the N = d_k marker, reference lines, the top-edge marker of non-finite rows) are not data.
std::vector<double> data_ys(const json& ax) {
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
std::vector<Note> notes_in(const json& ax, const std::string& text, Match m) {
  std::vector<Note> found;
  for (std::size_t i = 0; i < ax["texts"].size(); ++i) {
    std::string s = ax["texts"][i];
    std::replace(s.begin(), s.end(), '\n', ' ');
    if (matches(s, text, m)) found.push_back({s, ax["text_boxes"][i], &ax});
  }
  return found;
}

/// The texts of every panel of the dump `j` that match `text` (as notes_in).
std::vector<Note> notes_in_figure(const json& j, const std::string& text, Match m) {
  std::vector<Note> found;
  for (const auto& ax : j["axes"])
    for (auto& n : notes_in(ax, text, m)) found.push_back(std::move(n));
  return found;
}

/// Checks that two coinciding series both stay visible: `under` is drawn underneath (a marker more than 2 pt larger,
/// lower z), `over` on top with another marker and line style.
void check_drawn_apart(const json& under, const json& over) {
  INFO(under["label"] << " under " << over["label"]);
  CHECK(under["markersize"].get<double>() > over["markersize"].get<double>() + 2.0);
  CHECK(under["marker"] != over["marker"]);
  CHECK(under["linestyle"] != over["linestyle"]);
  CHECK(over["zorder"].get<double>() > under["zorder"].get<double>());
}
}  // namespace

TEST_CASE("fig_recall: error axis from the data, exact errors in their strip, integer config values", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const json j = run_and_draw(d, "recall --d-k 16 --ratio 0.5,1,2,4 --trials 1 --keys random,orthogonal "
                              "--memories softmax,linear,deltanet,kda --quiet", "recall.h5", "fig_recall.py");
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

TEST_CASE("fig_parity: coinciding series stay visible and the legend says which lie on which", "[cli][python]") {
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

TEST_CASE("figure footers leave out the run-control options (out, quick, quiet) and keep the seed and the grid",
          "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // parity has no group `options`: its footer shows the root config, which records out/quick/quiet/seed
  kdalab_ok("parity --quick --quiet --seed 7 --T 17 --dk 16 --dv 16 --impl float64,float32 --out " + d.file("parity.h5"));
  const std::string root = kdalab::h5read::attr_string(d.file("parity.h5"), "/", "config");
  INFO(root);
  CHECK(root.find("\"quick\"") != std::string::npos);  // the file still records them (a replay needs them) ...
  CHECK(root.find("\"out\"") != std::string::npos);
  const json j = draw(d, "fig_parity.py", d.file("parity.h5"));
  const std::string cfg = config_text(j);
  INFO(cfg);
  REQUIRE(cfg.rfind("config ", 0) == 0);
  for (const char* key : {" out=", " quick=", " quiet=", " force="}) CHECK(cfg.find(key) == std::string::npos);  // ... the footer not
  CHECK(cfg.find(" seed=7") != std::string::npos);
  CHECK(footer(j).find("seed 7\n") != std::string::npos);  // the provenance line
  CHECK(cfg.find(" T=17") != std::string::npos);         // options that change numbers stay,
  CHECK(cfg.find(" gate=[bounded,softplus]") != std::string::npos);  // including what --quick set
  CHECK(cfg.find(" truth=f64") != std::string::npos);
}

TEST_CASE("decode-cost's cache note reaches the figure footer, its GPU note sits under the panel; summary.py prints "
          "numbers with their units", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const json j = run_and_draw(d, "decode-cost --cpu-n 1024,2048 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 "
                              "--context 1024 --gpu-n 0 --quiet", "dc.h5", "fig_decode_cost.py");
  CHECK(footer(j).find("CPU: softmax read:") != std::string::npos);
  CHECK(config_text(j).find("cpu-n=[1024,2048]") != std::string::npos);
  CHECK(config_text(j).find(" quiet=") == std::string::npos);
  CHECK(footer(j).find("seed 1\n") != std::string::npos);  // the default seed
  // --gpu-n 0: no GPU rows, so the right panel carries decode-cost's note "GPU rows skipped: ..."; it must sit below
  // the axes (was: axes fraction (0.02, 0.02), on top of the flat KDA line at the bottom of the panel)
  const auto notes = notes_in_figure(j, "GPU rows skipped", Match::prefix);
  for (const auto& n : notes) {
    INFO(n.box.dump());
    CHECK(n.box[3].get<double>() < 0.0);  // its top edge is under the axes: no data there
  }
  CHECK(notes.size() == 1);

  const auto s = python("scripts/summary.py " + d.file("dc.h5"));
  INFO(s.output);
  REQUIRE(s.code == 0);
  CHECK(has(s, "decode_cost/cpu: 4 rows"));
  CHECK(has(s, "seconds_per_token [s]"));  // the unit the file records
  CHECK(has(s, "decode_cost/cpu note: softmax read:"));
  CHECK(has(s, "speedup_vs_mla"));
  CHECK(!has(s, "[1]"));  // dimensionless columns carry no unit text
  CHECK(has(s, " 1024 "));  // numbers, not only dataset names
  // the hybrid table shows the rows at the largest n and says which n and how many (was "at the largest n (8)")
  CHECK(has(s, "decode_cost/hybrid: "));
  CHECK(has(s, " at the largest n = 1024\n"));
  CHECK(!has(s, "at the largest n ("));
}

TEST_CASE("figures.sh keeps a second results file's same figure under <figure>-<stem>", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  for (const char* name : {"parity.h5", "parity_long.h5"})
    kdalab_ok(std::string("parity --T 17 --dk 16 --dv 16 --impl float64,float32 --truth f64 --quiet --out ") + d.file(name));
  // figures.sh runs every fig_*.py beside it: a copy with only the parity figure keeps this test to two drawings
  std::filesystem::create_directories(d.file("scripts"));
  for (const char* s : {"figures.sh", "figstyle.py", "fig_parity.py"})
    std::filesystem::copy_file(std::string("scripts/") + s, d.file(std::string("scripts/") + s));
  const auto r = run_command("FIGURES=" + d.file("fig") + " bash " + d.file("scripts/figures.sh") + " " +
                             d.file("parity.h5") + " " + d.file("parity_long.h5"));
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(std::filesystem::exists(d.file("fig/parity_error.png")));
  CHECK(std::filesystem::exists(d.file("fig/parity_error-parity_long.png")));
  CHECK(std::filesystem::exists(d.file("fig/parity_error-parity_long.pdf")));
}

TEST_CASE("fig_parity draws a parity file with non-finite rows: finite rows drawn, the others marked at the top edge",
          "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // the breaker's file: the twin's o has NaN at g_min = -100, recorded as o_rel_rms = inf (was: ValueError, Axis
  // limits cannot be NaN or Inf, exit 1)
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

TEST_CASE("figure scripts on odd files: no rows or missing columns skip (exit 3), a bad path is one line (exit 2)",
          "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // small files with an empty table (or one without the needed columns), as h5py writes them
  python_ok("import h5py, numpy as np\n"
            "def mk(name, group, cols):\n"
            "    with h5py.File('" + d.path.string() + "/' + name, 'w') as f:\n"
            "        g = f.create_group(group)\n"
            "        for k in cols: g[k] = np.array([])\n"
            "mk('parity.h5', 'parity/table', ['impl', 'T', 'o_rel_rms'])\n"
            "mk('analytic.h5', 'decode_cost/analytic', ['n', 'd', 'softmax_reads', 'kda_reads', 'ratio_floor'])\n"
            "mk('hybrid.h5', 'decode_cost/hybrid', ['layout', 'n', 'batch_kind', 'batch', 'seconds_per_token', 'speedup_vs_mla'])\n"
            "mk('decay.h5', 'decay_range/table', ['gate', 'g_min', 'C', 'impl', 'precision', 'rel_rms', 'o_nan', 'o_inf', 'overflow', 'underflow', 'subnormal'])\n"
            "with h5py.File('" + d.path.string() + "/nocols.h5', 'w') as f: f['decode_cost/analytic/n'] = np.array([1000.0])\n");
  d.write("text.h5", "not an HDF5 file\n");
  struct Case {
    std::string script, file;
    int code;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"fig_parity.py", "parity.h5", 3, "skip: " + d.file("parity.h5") + ": parity/table has no rows"},  // was exit 0, blank
           {"fig_decode_cost.py", "analytic.h5", 3, "decode_cost/analytic has no rows"},  // AttributeError
           {"fig_hybrid.py", "hybrid.h5", 3, "decode_cost/hybrid has no rows"},           // AttributeError
           {"fig_decay_range.py", "decay.h5", 3, "decay_range/table has no rows"},       // AttributeError
           {"fig_decode_cost.py", "nocols.h5", 3, "decode_cost/analytic has no column(s) d, softmax_reads"},  // KeyError
           {"fig_parity.py", "text.h5", 2, "fig_parity.py: error: " + d.file("text.h5") + ": not an HDF5 file"},
           {"fig_copy.py", "missing.h5", 2, "fig_copy.py: error: " + d.file("missing.h5") + ": no such file"},
           {"fig_recall.py", "text.h5", 2, "fig_recall.py: error: "}}) {
    const auto r = python("scripts/" + c.script + " " + d.file(c.file) + " --out-dir " + d.file("fig"));
    INFO(c.script << " " << c.file << ": " << r.output);
    CHECK(r.code == c.code);
    CHECK(r.output.find(c.says) != std::string::npos);
    CHECK(r.output.find("Traceback") == std::string::npos);
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);  // one line
  }
  CHECK(!std::filesystem::exists(d.file("fig")));  // nothing drawn
  // summary.py: an empty table is "0 rows" (was ValueError); a file that is not HDF5 is one line and exit 2
  auto s = python("scripts/summary.py " + d.file("hybrid.h5"));
  INFO(s.output);
  CHECK(s.code == 0);
  CHECK(has(s, "decode_cost/hybrid: 0 rows"));
  CHECK(!has(s, "Traceback"));
  s = python("scripts/summary.py " + d.file("text.h5") + " " + d.file("hybrid.h5"));
  INFO(s.output);
  CHECK(s.code == 2);
  CHECK(has(s, "summary.py: error: " + d.file("text.h5") + ": not an HDF5 file"));
  CHECK(has(s, "decode_cost/hybrid: 0 rows"));  // the other files are still summarised
  CHECK(!has(s, "Traceback"));
}

namespace {
/// A parity file where twin-bf16 sits among the reference lines (so fig_parity draws its zoom panel), with a root
/// config and a command line far longer than one footer line.
std::string long_parity_file(const TempDir& d) {
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
}  // namespace

TEST_CASE("figure footers are wrapped whole: every config value and the whole command line, no '…'", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const json j = draw(d, "fig_parity.py", long_parity_file(d));
  std::string foot = footer(j);
  INFO(foot);
  CHECK(foot.find("\u2026") == std::string::npos);  // was: the config cut after two lines with " …"
  CHECK(foot.find("...") == std::string::npos);
  // wrapped lines continue with two spaces of indent: undo the wrapping, then every pair must be there whole
  std::string flat;
  for (std::size_t k = 0; k < foot.size(); ++k) {
    if (foot.compare(k, 3, "\n  ") == 0) {
      flat += ' ';
      k += 2;
    } else {
      flat += foot[k];
    }
  }
  foot = flat;
  for (int i = 0; i < 30; ++i) {
    std::string ii = i < 10 ? "0" : "";
    ii += std::to_string(i);
    std::string kv = "impl-";
    kv += ii;
    kv += "=[";
    for (int k = 0; k < 6; ++k) {
      kv += k ? ",value-" : "value-";
      kv += ii;
      kv += "-";
      kv += std::to_string(k);
    }
    kv += "]";
    CHECK(foot.find(kv) != std::string::npos);
  }
  CHECK(foot.find(" last-key=the-end\n") != std::string::npos);
  CHECK(foot.find("--opt-59 59 --out tail.h5") != std::string::npos);  // the command line's tail
  int longest = 0, len = 0;
  for (char c : footer(j)) len = (c == '\n') ? (longest = std::max(longest, len), 0) : len + 1;
  CHECK(longest <= 260);  // wrapped at the figure's width, not one endless line
}

TEST_CASE("fig_parity: the full-range panel shows the reference lines as one band named above the data",
          "[cli][python]") {
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

TEST_CASE("--dump alone writes only the JSON and says so; with --out-dir the figure too", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = long_parity_file(d);
  const std::string script = std::filesystem::absolute("scripts/fig_parity.py").string();
  // run in the temp folder: a figure written to the default figures/ would land there, not in the repository
  auto fig_parity_in_d = [&](const std::string& options) {
    return run_command("cd " + d.path.string() + " && " + kPy + " " + script + " " + h5 + options);
  };
  auto r = fig_parity_in_d(" --dump " + d.file("a.json"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(std::filesystem::exists(d.file("a.json")));
  CHECK(!std::filesystem::exists(d.file("figures")));  // was: figures/parity_error.png and .pdf silently redrawn
  CHECK(has(r, "wrote " + d.file("a.json") + " (the dump only"));
  CHECK(!has(r, "/parity_error.png"));  // no figure path among those written
  r = fig_parity_in_d(" --dump " + d.file("b.json") + " --out-dir " + d.file("fig"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(std::filesystem::exists(d.file("b.json")));
  CHECK(std::filesystem::exists(d.file("fig/parity_error.png")));
  CHECK(has(r, "wrote " + d.file("b.json") + " " + d.file("fig/parity_error.png") + " " + d.file("fig/parity_error.pdf")));
  r = fig_parity_in_d("");  // no --dump: figures/ as before
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(std::filesystem::exists(d.file("figures/parity_error.png")));
  CHECK(has(r, "wrote figures/parity_error.png figures/parity_error.pdf"));
}

TEST_CASE("decay-range: figure cells and summary.py say what the console says (inf as stored, NaN+Inf count of o)",
          "[cli][python]") {
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
  const json j = draw(d, "fig_decay_range.py", d.file("dr.h5"));
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

TEST_CASE("fig_recall: a curve lying on another stays visible and the panel's legend says which it lies on",
          "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // orthogonal keys, beta = 1: DeltaNet and Gated DeltaNet both recall exactly up to d_k pairs, then 0.5, 0.25: the
  // same accuracy at every N (the newcomer saw DeltaNet hidden exactly under Gated DeltaNet, no word about it)
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

TEST_CASE("fig_parity: an implementation plotted at only some grid points says how many and why, under the panel",
          "[cli][python]") {
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

TEST_CASE("decay-range: the fp64 control panel says why its softplus cells are non-finite, under the panel",
          "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // --gate-shift 20 (the default): the unbounded softplus gate reaches g ~ -40 per token, so a 32-token chunk's
  // factored decay is ~1100 nats, past fp64's exp range (709.8): the control's cell is "inf (...)" (the newcomer saw
  // non-finite values in a control with no word why); at C = 16 (~650 nats) and for g_min = -1 it stays finite
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

TEST_CASE("fig_hybrid's time-per-token panel (Kimi Linear Fig. 1b's layout, attention only) agrees with its speedup "
          "panel", "[cli][python]") {
  // session 13: the hybrid figure had no TPOT-vs-context panel (left alone in sessions 11-12); the new left panel
  // draws each layout's attention time per token at batch 1, whose all-MLA / hybrid ratio is the middle panel's curve
  if (skip_without_plotting()) return;
  TempDir d;
  const json j = run_and_draw(d, "decode-cost --quick --quiet", "dc.h5", "fig_hybrid.py");
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

TEST_CASE("fig_recall_dim: accuracy vs d_k at fixed N (Zoology's MQAR layout), read from the recall grid", "[cli][python]") {
  // session 13: the recall figure had no accuracy-vs-model-dimension view (left alone in sessions 11-12); this figure
  // reads the grid's cells with N = ratio x d_k: N = 16 has d_k 8 (ratio 2) and 16 (ratio 1)
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
