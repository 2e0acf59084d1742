// scripts/fig_decode_cost.py: the CPU KDA step is one measurement (one line), the softmax and GPU lines one marker
// per n; non-finite or non-positive times draw no line and say so; the measured panel keeps its curves below the
// legend and names precision and GPU; decode-cost's cache note reaches the footer.
// Runs /usr/bin/python3; skipped with a warning when it lacks h5py or matplotlib.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/cli.hpp"
#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

TEST_CASE("fig_decode_cost draws no line for non-finite or non-positive times and says so",
          "[figures][decode-cost][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("dc.h5");
  make_small_decode_cost(h5);
  // Sets seconds_per_token: `softmax` and `kda` are python expressions for the value of row i of that impl.
  const auto draw = [&](const std::string& name, const std::string& softmax, const std::string& kda) {
    const std::string h = d.file(name + ".h5");
    std::filesystem::copy_file(h5, h);
    const auto py = run_command(std::string(kPy) + " -c \"import h5py, numpy as np\n"
                                "f = h5py.File('" + h + "', 'a')\n"
                                "impl = [x.decode() if isinstance(x, bytes) else x for x in f['decode_cost/cpu/impl'][:]]\n"
                                "s = f['decode_cost/cpu/seconds_per_token']\n"
                                "v = s[:]\n"
                                "ks = [i for i, x in enumerate(impl) if x == 'kda']\n"
                                "ss = [i for i, x in enumerate(impl) if x == 'softmax']\n"
                                "for j, i in enumerate(ss): v[i] = " + softmax + "\n"
                                "for j, i in enumerate(ks): v[i] = " + kda + "\n"
                                "s[...] = v\n\"");
    INFO(py.output);
    REQUIRE(py.code == 0);
    const std::string dump = d.file(name + ".json");
    const auto fr = run_command(std::string(kPy) + " scripts/fig_decode_cost.py " + h + " --dump " + dump);
    INFO(name << ": " << fr.output);
    REQUIRE(fr.code == 0);
    CHECK(!has(fr, "Traceback"));
    return json::parse(slurp(dump));
  };
  const auto kda_lines = [](const json& ax) {
    json out = json::array();
    for (const auto& ln : ax["lines"])
      if (ln["label"].get<std::string>().rfind("CPU reference, float32: KDA step", 0) == 0) out.push_back(ln);
    return out;
  };
  const auto note = [](const json& ax) {
    std::string all;
    for (const auto& t : ax["texts"]) all += t.get<std::string>() + " ";
    for (auto& ch : all)
      if (ch == '\n') ch = ' ';
    return all;
  };
  {  // every CPU row NaN: exit 0, nothing drawn in the CPU panel, a note says why
    const json j = draw("allnan", "np.nan", "np.nan");
    const json& ax = j["axes"][1];
    INFO(ax.dump());
    CHECK(ax["lines"].size() == 0);
    CHECK(has(RunResult{0, note(ax)}, "CPU KDA step: 3 of 3 rows have no finite time > 0"));
    CHECK(has(RunResult{0, note(ax)}, "CPU softmax read: 3 of 3 rows"));
  }
  for (const std::string bad : {"0.0", "np.inf", "-1.0"}) {  // every KDA time 0, inf or negative: no "0 us" / "inf us"
    const json j = draw("kda" + std::to_string(bad.size()), "1e-6 * (j + 1)", bad);
    const json& ax = j["axes"][1];
    INFO(bad << " " << ax.dump());
    CHECK(kda_lines(ax).size() == 0);
    for (const auto& l : ax["legend"]) CHECK(l.get<std::string>().find("one measurement") == std::string::npos);
    CHECK(has(RunResult{0, note(ax)}, "CPU KDA step: 3 of 3 rows have no finite time > 0"));
    int softmax = 0;
    for (const auto& ln : ax["lines"]) softmax += ln["label"].get<std::string>().rfind("CPU reference, float32: softmax", 0) == 0;
    CHECK(softmax == 1);
  }
  {  // one NaN among the KDA rows: the two finite equal rows are the one measurement
    const json j = draw("onenan", "1e-6 * (j + 1)", "np.nan if j == 1 else 2e-6");
    const json& ax = j["axes"][1];
    INFO(ax.dump());
    const json k = kda_lines(ax);
    REQUIRE(k.size() == 1);
    CHECK(k[0]["label"].get<std::string>().find("one measurement, 2 µs") != std::string::npos);
    CHECK(k[0]["marker"] == "None");
    CHECK(k[0]["x"].size() == 2);
    CHECK(k[0]["x"][0].get<double>() == 1024.0);
    CHECK(k[0]["x"][1].get<double>() == 4096.0);
    CHECK(has(RunResult{0, note(ax)}, "CPU KDA step: 1 of 3 rows have no finite time > 0"));
  }
}

TEST_CASE("decode-cost's cache note reaches the figure footer, its GPU note sits under the panel; summary.py prints numbers with their units",
          "[figures][decode-cost][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const json j = run_and_draw(d, "decode-cost --cpu-n 1024,2048 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 "
                              "--context 1024 --gpu-n 0 --quiet", "dc.h5", "fig_decode_cost.py", Save::png_pdf);
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

TEST_CASE("decode-cost's measured panel keeps its curves below the legend and names precision and GPU",
          "[figures][decode-cost][python]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string h5 = d.file("dc.h5");
  kdalab_ok("decode-cost --cpu-n 1024,2048,4096,8192,16384 --cpu-d 128 --min-time 0.01 --n 1000 --d 64 "
              "--context 1024 --gpu-n 0 --quiet --out " + h5);
  // measured times (us) with a steep last step (cache effect) that ran under the upper-left legend
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

TEST_CASE("fig_decode_cost draws the CPU KDA step as one measurement, the softmax and GPU lines per n",
          "[figures][decode-cost][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("dc.h5");
  make_small_decode_cost(h5);
  const auto impl = kdalab::h5read::strings(h5, "/decode_cost/cpu/impl");
  const auto sec = kdalab::h5read::array(h5, "/decode_cost/cpu/seconds_per_token");
  double kda_s = NAN;
  for (std::size_t i = 0; i < impl.size(); ++i)
    if (impl[i] == "kda") {
      if (std::isnan(kda_s)) kda_s = sec.data[i];
      REQUIRE(sec.data[i] == kda_s);  // the file repeats ONE measurement on every n row (what this test is about)
    }
  REQUIRE(std::count(impl.begin(), impl.end(), "kda") == 3);
  // the GPU lines as a GPU run records them (a CPU build has none): they must keep a marker per n (this file's
  // `device` names no GPU, so the legend says "GPU")
  python_h5("f = h5py.File('" + h5 + "', 'a')\n"
         "g = f.require_group('decode_cost/gpu')\n"
         "g['n'] = np.array([1000.0, 128000.0, 1000000.0])\n"
         "g['mla_layer_s'] = np.array([2e-5, 6e-5, 3e-4])\n"
         "g['kda_layer_s'] = np.array([1e-5, 1e-5, 1e-5])\n");
  const json j = dump_figure(d, "fig_decode_cost.py", h5);
  REQUIRE(j["axes"].size() >= 2);
  const json& ax = j["axes"][1];
  int kda = 0, softmax = 0, gpu = 0;
  for (const auto& ln : ax["lines"]) {
    const std::string label = ln["label"];
    INFO(label << " marker " << ln["marker"] << " x " << ln["x"].dump() << " y " << ln["y"].dump());
    if (label.rfind("CPU reference, float32: KDA step", 0) == 0) {
      ++kda;
      CHECK(label.find("one measurement") != std::string::npos);  // the legend says what it is
      CHECK(ln["marker"] == "None");                              // no per-n markers
      CHECK(ln["x"].size() == 2);                                 // one segment over the n range
      CHECK(ln["x"][0].get<double>() == 1024.0);
      CHECK(ln["x"][1].get<double>() == 4096.0);
      CHECK(std::abs(ln["y"][0].get<double>() - 1e6 * kda_s) <= 1e-9 * 1e6 * kda_s);
      CHECK(ln["y"][1] == ln["y"][0]);
    } else if (label.rfind("CPU reference, float32: softmax read", 0) == 0) {
      ++softmax;
      CHECK(ln["marker"] == "o");  // three measurements, three markers
      CHECK(ln["x"].size() == 3);
    } else if (label.rfind("GPU, kdalab kernel: ", 0) == 0) {
      ++gpu;
      CHECK(ln["marker"] != "None");  // kept as they are: a marker per n
      CHECK(ln["x"].size() == 3);
      CHECK(label.find("one measurement") == std::string::npos);
    }
  }
  CHECK(kda == 1);
  CHECK(softmax == 1);
  CHECK(gpu == 2);
}
