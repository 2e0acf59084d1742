// The figure scripts' inputs and outputs: scripts/figures.sh keeps a second results file's same figure under another
// name and reports a file that every figure refuses once; odd files (no rows, missing columns) skip with exit 3, a bad path is one line with exit 2; --dump alone
// writes only the JSON and says so.
// Runs /usr/bin/python3; skipped with a warning when it lacks h5py or matplotlib.
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

TEST_CASE("figures.sh keeps a second results file's same figure under <figure>-<stem>", "[figures][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  for (const char* name : {"parity.h5", "parity_long.h5"})
    kdalab_ok(std::string("parity --T 17 --dk 16 --dv 16 --impl float64,float32 --truth f64 --quiet --out ") + d.file(name));
  // figures.sh runs every fig_*.py beside it: a copy with only the parity figure keeps this test to two drawings
  std::filesystem::create_directories(d.file("scripts"));
  for (const char* s : {"figures.sh", "figures_fork.py", "figstyle.py", "fig_parity.py"})
    std::filesystem::copy_file(std::string("scripts/") + s, d.file(std::string("scripts/") + s));
  const auto r = run_command("FIGURES=" + d.file("fig") + " bash " + d.file("scripts/figures.sh") + " " +
                             d.file("parity.h5") + " " + d.file("parity_long.h5"));
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(std::filesystem::exists(d.file("fig/parity_error.png")));
  CHECK(std::filesystem::exists(d.file("fig/parity_error-parity_long.png")));
  CHECK(std::filesystem::exists(d.file("fig/parity_error-parity_long.pdf")));
}

TEST_CASE("figures.sh reports a file every figure refuses for one reason once, not once per figure", "[figures][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  std::filesystem::create_directories(d.file("scripts"));
  for (const char* s : {"figures.sh", "figures_fork.py", "figstyle.py", "fig_parity.py", "fig_recall.py"})
    std::filesystem::copy_file(std::string("scripts/") + s, d.file(std::string("scripts/") + s));
  d.write("text.h5", "not an HDF5 file\n");
  const auto r = run_command("FIGURES=" + d.file("fig") + " bash " + d.file("scripts/figures.sh") + " " +
                             d.file("text.h5"));
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK(r.output.find("every figure failed on " + d.file("text.h5") + ": error: ") != std::string::npos);
  CHECK(r.output.find("not an HDF5 file") != std::string::npos);
  CHECK(r.output.find("fig_parity.py failed") == std::string::npos);  // not one block per script
  CHECK(r.output.find("1 failure(s)") != std::string::npos);
}

TEST_CASE("figure scripts on odd files: no rows or missing columns skip (exit 3), a bad path is one line (exit 2)",
          "[figures][python]") {
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

TEST_CASE("--dump alone writes only the JSON and says so; with --out-dir the figure too", "[figures][python]") {
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
