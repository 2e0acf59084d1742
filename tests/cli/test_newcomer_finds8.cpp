// Session 7 newcomer's leftover output finds (after scripts/run.sh on a clean clone), one test each:
// 1. fig_parity says under its full-range panel that the cuda-bf16 rows were skipped (stdout said it, the figure did
//    not), from parity's `notes` attribute; a GPU run that skipped some points says how many were plotted;
// 2. `kdalab decay-range --precision fp64` prints the fp64 table, not an empty fp32 one (fp32's table when fp32 ran,
//    else one table per precision that ran);
// 3. `kdalab info --config` describes full_mla_bytes with the config's own MLA layer ("Gated MLA" only with an output
//    gate; Kimi Linear's is plain MLA);
// 4. fig_decode_cost draws the CPU KDA step, ONE measurement repeated on every n row, as one horizontal line without
//    markers (was 5 points that looked like 5 measurements); the softmax and GPU lines keep one marker per n.
// The figure tests run /usr/bin/python3 with --dump (as tests/cli/test_figure_scripts.cpp does) and are skipped
// with a warning when it lacks h5py or matplotlib.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

namespace {

/// The texts of axes `ax` that start with `prefix`, newlines (wrapping) made spaces, each with its box's top edge.
std::vector<std::pair<std::string, double>> texts_starting(const json& ax, const std::string& prefix) {
  std::vector<std::pair<std::string, double>> out;
  for (std::size_t i = 0; i < ax["texts"].size(); ++i) {
    std::string s = ax["texts"][i];
    std::replace(s.begin(), s.end(), '\n', ' ');
    if (s.rfind(prefix, 0) == 0) out.emplace_back(s, ax["text_boxes"][i][3].get<double>());
  }
  return out;
}

/// The parity `notes` line that starts with `prefix` ("" when none).
std::string note_line(const std::string& h5, const std::string& prefix) {
  std::istringstream in(kdalab::h5read::attr_string(h5, "parity", "notes"));
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return line;
  return {};
}
}  // namespace

TEST_CASE("fig_parity says under the panel that the cuda-bf16 rows were skipped, from parity's notes", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("p.h5");
  // d_k = 16: no cuda-bf16 row in any build (a CPU build: no GPU / no CUDA; a GPU: the kernel runs d_k = 128 only)
  const auto r = run_kdalab("parity --T 17 --dk 16 --dv 16 --impl float64,float32,cuda-bf16 --truth f64 --quiet --out " + h5);
  INFO(r.output);
  REQUIRE(r.code == 0);
  REQUIRE(has(r, "note: cuda-bf16 row"));  // stdout says it (the newcomer's point: the figure did not)
  const auto impl = kdalab::h5read::strings(h5, "/parity/table/impl");
  REQUIRE(std::count(impl.begin(), impl.end(), "cuda-bf16") == 0);
  const std::string rec = note_line(h5, "cuda-bf16 row");  // where parity records the skip
  REQUIRE(!rec.empty());
#ifndef KDALAB_HAVE_CUDA
  CHECK(rec.rfind("cuda-bf16 rows skipped: ", 0) == 0);
#endif
  const std::string why = rec.substr(rec.find(": ") + 2);  // the reason after "rows skipped: " / "skipped at ...: "
  const json j = dump_figure(d, "fig_parity.py", h5);
  const auto notes = texts_starting(j["axes"][0], "cuda-bf16 (the CUDA kernel): not drawn, every row skipped: ");
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

TEST_CASE("fig_parity: a GPU run that skipped some points says how many cuda-bf16 points are plotted", "[cli][python]") {
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
  const auto notes = texts_starting(j["axes"][0], "cuda-bf16: ");
  REQUIRE(notes.size() == 1);
  INFO(notes[0].first);
  CHECK(notes[0].first.find("cuda-bf16: 1 of the 2 grid points plotted; its rows at the others skipped: the kernel runs "
                            "the bounded (K3) gate") != std::string::npos);
  CHECK(texts_starting(j["axes"][0], "cuda-bf16 (the CUDA kernel): not drawn").empty());  // it is drawn
  CHECK(notes[0].second < 0.0);
}

TEST_CASE("decay-range prints console tables only of precisions that ran (fp32's when it ran, else each one's)",
          "[cli]") {
  TempDir d;
  auto table_rows = [](const std::string& out, const std::string& prec) {
    // the table of `prec`: its header, the g_min header line, then one line per gate (g_min -1 here) with a value
    const std::regex re("chunked algorithm, " + prec + ", relative RMS of o[^\n]*\n +g_min +C = 16\n +-1 +([0-9.]+e[-+][0-9]+|inf|nan) \\(");
    return std::regex_search(out, re);
  };
  auto run = [&](const std::string& prec) {
    const auto r = run_kdalab("decay-range --precision " + prec + " --g-min -1 --softplus false --C 16 --T 32 --D 8 "
                              "--kernel-plan false --quiet --out " + d.file(prec + ".h5"));
    INFO(r.output);
    REQUIRE(r.code == 0);
    return r;
  };
  const auto r = run("fp64");
  INFO(r.output);
  CHECK(table_rows(r.output, "fp64"));        // the precision that ran, with its numbers
  CHECK(!has(r, "chunked algorithm, fp32"));  // was an empty fp32 table: nothing under its header
  const auto r2 = run("bf16,fp16");
  INFO(r2.output);
  CHECK(table_rows(r2.output, "bf16"));
  CHECK(table_rows(r2.output, "fp16"));
  CHECK(r2.output.find("chunked algorithm, bf16") < r2.output.find("chunked algorithm, fp16"));  // in the order given
  CHECK(!has(r2, "chunked algorithm, fp32"));
  const auto r3 = run("fp64,fp32");  // fp32 ran: its table, the key numbers, as before (the default run's console)
  INFO(r3.output);
  CHECK(table_rows(r3.output, "fp32"));
  CHECK(!has(r3, "chunked algorithm, fp64"));
}

TEST_CASE("info: full_mla_bytes names the config's own MLA layer (Gated MLA only with an output gate)", "[cli]") {
  TempDir d;
  const auto r = run_kdalab("info --config data/configs/kimi-linear-48b.json --quiet --out " + d.file("kl.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string kl = kdalab::h5read::attr_string(d.file("kl.h5"), "model/cache/full_mla_bytes", "description");
  INFO(kl);
  CHECK(kl.find("Gated") == std::string::npos);  // Kimi Linear's MLA has no output gate (was "every layer Gated MLA")
  CHECK(kl.rfind("every layer MLA (the config's MLA layer, no output gate)", 0) == 0);
  const auto r2 = run_kdalab("info --config data/configs/toy.json --quiet --out " + d.file("toy.h5"));
  INFO(r2.output);
  REQUIRE(r2.code == 0);
  const std::string toy = kdalab::h5read::attr_string(d.file("toy.h5"), "model/cache/full_mla_bytes", "description");
  INFO(toy);
  CHECK(toy.rfind("every layer Gated MLA (the config's MLA layer, output gate on)", 0) == 0);
}

TEST_CASE("fig_decode_cost draws the CPU KDA step as one measurement, the softmax and GPU lines per n", "[cli][python]") {
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
