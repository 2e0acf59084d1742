// Session 9 leftovers of session 8's reviews, one test each:
// 1. bench --peer-json: a number that underflows a double (1e-400) was refused but quoted as "0.0"; it is quoted as
//    typed (cli::parse_json_once's numbers_as_typed, the --config reader's), exit 2, no output file;
// 2. golden --dir D: a fixture name in D that is a FIFO blocked HDF5's open forever; it is refused naming the file
//    (cli::require_regular_input), exit 2;
// 3. fig_recall: the sqrt(N / d_k) reference line was dotted in linear attention's colour, under its dashes; it has its
//    own colour and style and is drawn above the curves, legend entry kept;
// 4. fig_decay_range: a panel where every cell overflowed (fp16 at --gate-shift 20) read as an empty dark panel; its
//    NaN/Inf cells are hatched, a line under the title counts them, the colour bar has an "o not finite" key.
// The figure tests run /usr/bin/python3 with --dump and are skipped with a warning when it lacks h5py or matplotlib.
#include <sys/stat.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

namespace {

/// `kdalab <args>` under a 60 s timeout (exit 124 is a hang).
RunResult run_timed(const std::string& args) { return run_command("timeout 60 " + kdalab_bin() + " " + args); }

/// The axes of dump `j` whose title is `title` exactly (nullptr when none).
const json* axis_titled(const json& j, const std::string& title) {
  for (const auto& ax : j["axes"])
    if (ax["title"] == title) return &ax;
  return nullptr;
}

/// The index in ax["texts"] of the first text starting with `prefix` (-1 when none).
int text_index(const json& ax, const std::string& prefix) {
  for (std::size_t i = 0; i < ax["texts"].size(); ++i)
    if (ax["texts"][i].get<std::string>().rfind(prefix, 0) == 0) return static_cast<int>(i);
  return -1;
}
}  // namespace

TEST_CASE("lo9 1: bench --peer-json quotes a number that underflows a double as typed, not as 0.0", "[cli]") {
  TempDir d;
  const std::string key = "kda-prefill B=1 T=8192 H=64 HV=64";
  for (const std::string typed : {"1e-400", "-2.5E-999", "0.0"}) {
    d.write("p.json", "{\"_meta\": \"x\", \"" + key + "\": " + typed + "}");
    const auto r = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("o.h5"));
    INFO(typed << ": " << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "key '" + key + "' has the value " + typed + "; accepted: a time in milliseconds"));
    if (typed != "0.0") CHECK(!has(r, "has the value 0.0"));
    CHECK(d.count() == 1);  // no output file, no temporary
  }
  // a non-number keeps its JSON spelling (a string stays quoted, so "0.9" is not taken for the number 0.9)
  d.write("p.json", "{\"" + key + "\": \"0.9\"}");
  auto r = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("o.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "has the value \"0.9\"; accepted"));
  // a good time is still accepted (the run then ends as this build allows)
  d.write("p.json", "{\"" + key + "\": 0.9, \"mla-decode B=1 T=65536 H=128 HV=128\": null}");
  r = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("o.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
}

TEST_CASE("lo9 2: golden --dir refuses a fixture that is a FIFO, naming it, instead of hanging", "[cli]") {
  // one fixture of each loop of the check (golden_ops: kda_*; the layer ops: mla, hybrid, ...)
  for (const std::string name : {"kda_recurrent.h5", "mla.h5"}) {
    TempDir d;
    const std::string dir = d.file("g");
    std::filesystem::copy("data/golden", dir, std::filesystem::copy_options::recursive);
    std::filesystem::remove(dir + "/" + name);
    REQUIRE(::mkfifo((dir + "/" + name).c_str(), 0600) == 0);
    const auto r = run_timed("golden --dir " + dir);
    INFO(r.output);
    CHECK(r.code == 2);  // 124 is the timeout: the FIFO's open blocked
    CHECK(has(r, "golden file '" + dir + "/" + name + "' is not a regular file (a FIFO, device or socket); give a "
                 "golden HDF5 file"));
    CHECK(d.count() == 1);
  }
  // the real fixtures still pass
  const auto ok = run_timed("golden");
  INFO(ok.output);
  CHECK(ok.code == 0);
}

TEST_CASE("lo9 3: fig_recall draws the sqrt(N/d_k) reference above linear attention's dashes, in its own style",
          "[cli][python]") {
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

TEST_CASE("lo9 4: fig_decay_range marks an all-overflow panel: hatched cells counted under the title, a colour key",
          "[cli][python]") {
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

TEST_CASE("lo9 5: bench's --out checks run in cli::run's shared path, after bench's own checks, messages kept", "[cli]") {
  TempDir d;
  const std::string key = "kda-prefill B=1 T=16 H=1 HV=1";
  d.write("p.json", "{\"" + key + "\": 1.5}");
  d.write("c.json", "{\"iters\": 3}");
  // --out one of the inputs: each option's own wording (a file list: "is the --peer-json file"; --config: "is the
  // input file --config"), exit 2, the input untouched
  auto r = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("p.json") + " --force");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--out '" + d.file("p.json") + "' is the --peer-json file '" + d.file("p.json") +
               "'; give another results file (--peer-json files are read, never overwritten)"));
  r = run_timed("bench --config " + d.file("c.json") + " --out " + d.file("c.json") + " --force");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--out '" + d.file("c.json") + "' is the input file --config ('" + d.file("c.json") + "')"));
  CHECK(slurp(d.file("p.json")) == "{\"" + key + "\": 1.5}");
  CHECK(slurp(d.file("c.json")) == "{\"iters\": 3}");
  // bench's own checks come first: a bad option or a bad --peer-json file is named whatever --out is
  r = run_timed("bench --iters 0 --peer-json " + d.file("p.json") + " --out " + d.file("p.json"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--iters = 0"));
  d.write("bad.json", "{\"" + key + "\": -1}");
  r = run_timed("bench --peer-json " + d.file("bad.json") + " --out " + d.file("nodir/o.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "has the value -1; accepted"));
  // then --out itself (its folder must exist), before "not available" (exit 3)
  r = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("nodir/o.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--out '" + d.file("nodir/o.h5") + "': folder '" + d.file("nodir") + "' does not exist"));
  CHECK(d.count() == 3);  // p.json, c.json, bad.json: nothing written
}
