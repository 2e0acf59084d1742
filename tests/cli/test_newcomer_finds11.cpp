// Session 11 newcomer's finds in the figures of `scripts/run.sh`, one test each (each broken once on purpose and seen
// to fail):
// 1. no figure said which results file it was drawn from (the footer had the git sha, the config and the command line,
//    whose --out is absent when the default was used): the footer now starts with "drawn from <path>";
// 2. a --quick run's figure looked like the full run's: its title now ends in " (--quick run)" (the suptitle, or the
//    first panel's title when the figure has none), a run without --quick keeps its title;
// 3. decode-cost's right panel: the legend covered the last segment of the CPU softmax curve (a steep rise at
//    n = 16384), its entries did not say the precision (float32), and the GPU entries said "H200" whatever GPU the file
//    was measured on: the panel now keeps its curves below the legend, the CPU entries say float32 (from the column's
//    description) and the GPU entries name the GPU of the file's `device` attribute;
// 4. fig_copy's information-bound panel: each "d_k=.." name was struck through by the next state's bf16 line, and
//    linear attention's dot hid under DeltaNet's at the same L: the names now sit beside the panel and coinciding
//    dots are drawn with figstyle's overlay;
// 5. fig_recall's title did not say in which arithmetic the memories ran: it now says float64.
// 7. (session 12) each experiment's --help now says which defaults --quick changes (left alone in session 11).
// 8. (session 12) a model config.json given to an experiment's --config is named as one (left alone in session 11).
// The figure tests run /usr/bin/python3 with --dump and are skipped with a warning when it lacks h5py or matplotlib.
#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

namespace {

/// The figure's footer texts, one a line.
std::string footer_of(const json& j) {
  std::string all;
  for (const auto& t : j["texts"]) all += t.get<std::string>() + "\n";
  return all;
}

/// `kdalab <args>` must exit 0.
void kdalab_must(const std::string& args) {
  const RunResult r = run_kdalab(args);
  INFO(args << "\n" << r.output);
  REQUIRE(r.code == 0);
}

/// The panel of dump `j` whose title starts with `title` (nullptr when none).
const json* panel(const json& j, const std::string& title) {
  for (const auto& ax : j["axes"])
    if (ax["title"].get<std::string>().rfind(title, 0) == 0) return &ax;
  return nullptr;
}

}  // namespace

TEST_CASE("newcomer11: the footer names the results file, a --quick run's title says so", "[cli][python]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string full = d.file("dc.h5"), quick = d.file("dc_quick.h5");
  make_small_decode_cost(full);
  // --quick with the same small grid given explicitly (explicit options win): the file records "quick": true
  kdalab_must("decode-cost --quick --cpu-n 1024,2048 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 --context 1024 "
              "--gpu-n 0 --quiet --out " + quick);
  const json jf = dump_figure(d, "fig_decode_cost.py", full);
  const json jq = dump_figure(d, "fig_decode_cost.py", quick);
  INFO(footer_of(jf));
  CHECK(footer_of(jf).find("drawn from " + full + "\n") != std::string::npos);
  CHECK(footer_of(jq).find("drawn from " + quick + "\n") != std::string::npos);
  CHECK(footer_of(jf).find("seed 1\n") != std::string::npos);  // the provenance line as before
  const std::string tf = jf["suptitle"], tq = jq["suptitle"];
  INFO(tf << "\n" << tq);
  CHECK(tq == tf + " (--quick run)");
  CHECK(tf.find("quick") == std::string::npos);
  // a figure without a suptitle (parity) says it in its first panel's title
  const std::string p = d.file("parity.h5");
  kdalab_must("parity --quick --quiet --T 17 --dk 16 --dv 16 --impl float64,float32 --out " + p);
  const json jp = dump_figure(d, "fig_parity.py", p);
  INFO(jp["axes"][0]["title"]);
  CHECK(jp["suptitle"] == "");
  CHECK(jp["axes"][0]["title"] == "KDA numeric parity by implementation and precision (--quick run)");
}

TEST_CASE("newcomer11: decode-cost's measured panel keeps its curves below the legend and names precision and GPU",
          "[cli][python]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string h5 = d.file("dc.h5");
  kdalab_must("decode-cost --cpu-n 1024,2048,4096,8192,16384 --cpu-d 128 --min-time 0.01 --n 1000 --d 64 "
              "--context 1024 --gpu-n 0 --quiet --out " + h5);
  // the session-11 run's times (us): a steep last step (cache effect) that ran under the upper-left legend
  python_h5("f = h5py.File('" + h5 + "', 'r+')\n"
            "t = f['decode_cost/cpu/seconds_per_token']\n"
            "t[...] = 1e-6 * np.array([70.62, 89.03, 271.6, 454.95, 3131.24, 13.47, 13.47, 13.47, 13.47, 13.47])\n");
  const json j = dump_figure(d, "fig_decode_cost.py", h5);
  const json* ax = panel(j, "Measured per-token decode step");
  REQUIRE(ax != nullptr);
  INFO((*ax)["legend_box"].dump() << " ylim " << (*ax)["ylim"].dump());
  REQUIRE((*ax)["legend_box"].size() == 4);
  CHECK(points_inside(*ax, (*ax)["legend_box"]) == 0);
  REQUIRE((*ax)["legend"].size() == 2);
  CHECK((*ax)["legend"][0] == "CPU reference, float32: softmax read (d = 128)");
  CHECK((*ax)["legend"][1].get<std::string>().rfind("CPU reference, float32: KDA step (d = 128):", 0) == 0);

  // GPU rows measured on another GPU than the H200 (written by hand: this build has no CUDA kernels)
  const std::string g5 = d.file("dc_gpu.h5");
  python_h5("import shutil\nshutil.copy('" + h5 + "', '" + g5 + "')\n"
            "f = h5py.File('" + g5 + "', 'r+')\n"
            "f.attrs['device'] = 'CPU: Some CPU; GPU: NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB, driver API 13.0)'\n"
            "g = f['decode_cost/gpu']\n"
            "g['n'] = np.array([1024, 65536, 1048576])\n"
            "g['mla_layer_s'] = np.array([6e-6, 40e-6, 320e-6])\n"
            "g['kda_layer_s'] = np.array([9e-6, 9e-6, 9e-6])\n");
  const json jg = dump_figure(d, "fig_decode_cost.py", g5);
  const json* axg = panel(jg, "Measured per-token decode step");
  REQUIRE(axg != nullptr);
  std::string legend;
  for (const auto& s : (*axg)["legend"]) legend += s.get<std::string>() + "\n";
  INFO(legend << (*axg)["legend_box"].dump());
  CHECK(legend.find("NVIDIA H100 80GB HBM3, kdalab kernel: absorbed MLA decode,\n  32 heads, $d_c$ = 512, bf16 cache") !=
        std::string::npos);
  CHECK(legend.find("NVIDIA H100 80GB HBM3, kdalab kernel: KDA decode step,\n  32 heads, fp32 state") != std::string::npos);
  CHECK(legend.find("H200") == std::string::npos);
  CHECK(points_inside(*axg, (*axg)["legend_box"]) == 0);
}

TEST_CASE("newcomer11: fig_copy's information bound names each state beside the panel, no line through a name, "
          "no dot hidden", "[cli][python]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string h5 = d.file("c.h5");
  kdalab_must("copy --d-k 16,32,64 --L 4,8,16,32,64 --trials 4 --precision fp32,bf16 --quiet --out " + h5);
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

TEST_CASE("newcomer11: fig_recall's title says the memories ran in float64", "[cli][python]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string h5 = d.file("r.h5");
  kdalab_must("recall --d-k 8 --trials 1 --memories softmax,kda --keys random --ratio 0.5,1 --quiet --out " + h5);
  const json j = dump_figure(d, "fig_recall.py", h5);
  const std::string t = j["suptitle"];
  INFO(t);
  CHECK(t.find("$g_{\\min} = -5$, float64") != std::string::npos);
}

TEST_CASE("newcomer11: the root help says which subcommands write a file, check --tol's help reads whole",
          "[cli]") {
  // 6. `kdalab --help` said "Each subcommand writes one HDF5 results file (--out)": golden writes none, info only with
  //    --out, bench only on a GPU; check --help ended its --tol text in "... the peers' bar fails.)".
  const RunResult root = run_kdalab("--help");
  INFO(root.output);
  REQUIRE(root.code == 0);
  CHECK(root.output.find("Each subcommand writes one HDF5 results file") == std::string::npos);
  CHECK(has(root, "Each experiment (parity, recall, copy, decay-range, decode-cost) writes one HDF5 results file"));
  CHECK(has(root, "check writes a report there, bench only when it runs on a GPU, info only when --out is given, "
                  "golden never."));
  const RunResult check = run_kdalab("check --help");
  INFO(check.output);
  REQUIRE(check.code == 0);
  CHECK(has(check, "it has no NaN/Inf. Default: the threshold fla's own tests use (RMS ratio 5e-3)"));
  CHECK(check.output.find("fails.)") == std::string::npos);
}

TEST_CASE("newcomer11 (left alone then, fixed in session 12): each experiment's --help says what --quick changes",
          "[cli]") {
  // 7. `--quick` said "smaller defaults for some options" in every experiment's --help, so a newcomer could not tell a
  //    quick run's grid from the full one without reading the code or a results file. Each experiment now names the
  //    values (built from the same constants its check applies).
  struct Case {
    std::string cmd, says;
  };
  for (const Case& c : {Case{"recall", "--d-k 16,32,64, --trials 2, --vocab 2048, each unless given explicitly"},
                        Case{"copy", "--d-k 16,32,64, --L 4,8,16,32,64,128,256, --trials 8, each unless given"},
                        Case{"parity", "--T 17,300,1000, --gate bounded,softplus, --beta sigmoid,one, --truth f64, each"},
                        Case{"decode-cost", "--cpu-n 1024,2048,4096,8192,16384, --min-time 0.02, each unless given"},
                        Case{"decay-range", "--T 128, --D 32, each unless given explicitly"}}) {
    const RunResult r = run_kdalab(c.cmd + " --help");
    INFO(c.cmd << "\n" << r.output);
    REQUIRE(r.code == 0);
    // CLI11 wraps long descriptions: compare with the help's whitespace runs collapsed to one space
    std::string flat;
    for (char ch : r.output) {
      const bool ws = ch == ' ' || ch == '\n' || ch == '\t';
      if (ws && (flat.empty() || flat.back() == ' ')) continue;
      flat += ws ? ' ' : ch;
    }
    CHECK(flat.find(c.says) != std::string::npos);
    CHECK(flat.find("smaller defaults for some options") == std::string::npos);
  }
}

TEST_CASE("newcomer11 (left alone then, fixed in session 12): a model config given to an experiment's --config is named "
          "as one", "[cli]") {
  // 8. `kdalab parity --config data/configs/kimi-k3.json` said only "unknown key '_comment' for 'parity'": the refusal
  //    now says the file is a model config.json, that `kdalab info --config` reads those, and what an options file is;
  //    exit 2, nothing written.
  TempDir d;
  for (const std::string cmd : {"parity", "recall", "decode-cost"}) {
    const std::string out = d.file(cmd + ".h5");
    const RunResult r = run_kdalab(cmd + " --quick --config data/configs/kimi-k3.json --out " + out);
    INFO(cmd << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--config 'data/configs/kimi-k3.json': this is a model config.json (it has hidden_size or "
                 "num_hidden_layers), not a kdalab options file for '" + cmd + "'"));
    CHECK(has(r, "model configs are read by `kdalab info --config`"));
    CHECK(!std::filesystem::exists(out));
  }
  // an options file with a wrong key keeps the old message
  d.write("bad.json", "{\"T\": [17], \"no-such-option\": 1}");
  const RunResult r = run_kdalab("parity --quick --config " + d.file("bad.json") + " --out " + d.file("p.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "unknown key 'no-such-option' for 'parity'; accepted keys: "));
  CHECK(r.output.find("model config") == std::string::npos);
}
