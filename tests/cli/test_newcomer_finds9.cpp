// Session 9 newcomer's finds, one test each:
// 1. `info --config` with a file that is not a model config (a kdalab options file) printed info's 7-line header and
//    only then failed: now one line before any output, saying info --config expects a Hugging Face style model
//    config.json and naming one (data/configs/kimi-linear-48b.json); exit 2;
// 2. info's MLA line said "qk_rope 64 (NoPE: unrotated)": it now says what the rope width is (the config's
//    decoupled-RoPE width) and that kdalab's MLA applies no rotation to it (NoPE);
// 3. README defines matmul_precision = plan where the parity experiment is described;
// 4. fig_parity: the notes under the full-range panel are separate lines, each whole (the float32-chunk note keeps
//    its "; accepted: F * |g_min| <= 80 ..." part), and the zoom panel has a y-axis label;
// 5. fig_copy's "L = d_k" label sits above the panel's frame, where no curve covers it; fig_hybrid's right-panel
//    legend covers no curve;
// 6. decode-cost's cache note names the step whose working set leaves the L2 as plausibly the L2 edge (given fixed
//    timings: softmax_cache_note, experiments/decode_cost_note.hpp).
// The figure tests run /usr/bin/python3 with --dump and are skipped with a warning when it lacks h5py or matplotlib.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiments/decode_cost_note.hpp"
#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

namespace {

/// Number of '\n' in `s`.
std::size_t line_count(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

/// The texts of axes `ax` that start with `prefix` (whole, newlines kept).
std::vector<std::string> texts_starting(const json& ax, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& t : ax["texts"]) {
    const std::string s = t;
    if (s.rfind(prefix, 0) == 0) out.push_back(s);
  }
  return out;
}

/// `s` with newlines (wrapping) made spaces.
std::string unwrapped(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

}  // namespace

TEST_CASE("info --config with a kdalab options file: one line before any output, naming a model config", "[cli]") {
  const auto r = run_kdalab("info --config data/configs/parity.json");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(line_count(r.output) == 1);   // the one error line, nothing before it
  CHECK(!has(r, "compiler:"));        // no banner
  CHECK(has(r, "is a kdalab options file (its keys are options of kdalab parity"));  // what it is (session 11: was
                                                                                        // "'hidden_size' is missing")
  CHECK(has(r, "info --config expects a Hugging Face style model config.json"));
  CHECK(has(r, "data/configs/kimi-linear-48b.json"));
  // a model config still prints the banner and the layout
  const auto ok = run_kdalab("info --config data/configs/kimi-linear-48b.json");
  INFO(ok.output);
  CHECK(ok.code == 0);
  CHECK(has(ok, "compiler:"));
  CHECK(has(ok, "layout:"));
}

TEST_CASE("info --config kimi-k3: the qk_rope width is described, not called NoPE without a word", "[cli]") {
  const auto r = run_kdalab("info --config data/configs/kimi-k3.json");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(!has(r, "(NoPE: unrotated)"));
  CHECK(has(r, "qk_rope 64 (the config's decoupled-RoPE width; mla_use_nope: kdalab's MLA applies no rotation to "
               "these dims, NoPE, see EQUATIONS.md section 5)"));
}

TEST_CASE("README defines matmul_precision = plan where the parity experiment is described", "[cli]") {
  const std::string readme = slurp("README.md");
  const std::size_t row = readme.find("| `parity` |");
  REQUIRE(row != std::string::npos);
  const std::string line = readme.substr(row, readme.find('\n', row) - row);
  INFO(line);
  CHECK(line.find("`matmul_precision`") != std::string::npos);
  CHECK(line.find("`plan` is the CUDA kernel's own choice (`kda_plan_kernel()`") != std::string::npos);
  CHECK(line.find("intra-chunk products in fp32") != std::string::npos);
}

TEST_CASE("fig_parity: the notes under the panel are apart and whole; the zoom panel's y axis is labelled",
          "[cli][python]") {
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

TEST_CASE("fig_copy: the L = d_k label sits above the frame, where no curve covers it", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("c.h5");
  const auto r = run_kdalab("copy --d-k 16,32 --L 4,8,16,32,64 --trials 4 --precision fp32,bf16 --quiet --out " + h5);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const json j = dump_figure(d, "fig_copy.py", h5);
  for (std::size_t p = 0; p < 2; ++p) {
    const auto& ax = j["axes"][p];
    int found = 0;
    for (std::size_t i = 0; i < ax["texts"].size(); ++i) {
      if (ax["texts"][i] != "$L = d_k$") continue;
      ++found;
      const auto& box = ax["text_boxes"][i];
      INFO(ax["title"] << " " << box.dump());
      CHECK(box[1].get<double>() >= 1.0);  // above the data area
      CHECK(box[0].get<double>() < box[2].get<double>());
      CHECK(points_inside(ax, box) == 0);
      // centred on the dotted L = d_k line
      const double dk = p == 0 ? 16.0 : 32.0, x = frac(dk, ax["xlim"], ax["xscale"]);
      CHECK(box[0].get<double>() < x);
      CHECK(box[2].get<double>() > x);
    }
    CHECK(found == 1);
  }
}

TEST_CASE("fig_hybrid: the right panel's legend covers no curve", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("dc.h5");
  // the hybrid model at the default contexts (1K .. 1M: the curves the newcomer saw), no CPU or GPU measurement
  const auto r = run_kdalab("decode-cost --cpu-n 0 --n 1000 --d 64 --gpu-n 0 --quiet --out " + h5);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const json j = dump_figure(d, "fig_hybrid.py", h5);
  // every panel's legend (the speedup panel's touched the K3 curve near n ~ 1e4; session 13's time-per-token panel
  // keeps its legend below the axes)
  REQUIRE(j["axes"].size() == 3);
  for (std::size_t p = 0; p < j["axes"].size(); ++p) {
    const auto& ax = j["axes"][p];
    INFO(ax["title"] << " legend box " << ax["legend_box"].dump());
    REQUIRE(ax["legend_box"].size() == 4);
    CHECK(points_inside(ax, ax["legend_box"]) == 0);
  }
}

TEST_CASE("decode-cost: the cache note names the step whose working set leaves the L2 as plausibly its edge",
          "[cli]") {
  using kdalab::cli::CacheLevel;
  const std::vector<CacheLevel> caches = {{1, "Data", 32768, "0"}, {2, "Unified", 1048576, "0"},
                                          {3, "Unified", 33554432, "0-1"}};
  // the session-9 newcomer's CPU: d = 128, 33.5 -> 144 us from n = 1024 to 2048 (4.3x for 2x the tokens; working
  // set 1024 x 257 x 4 B = 1.0 MiB, the L2's size), and the largest rise per number at 8192 -> 16384 (the note's
  // main step, the only one it explained)
  const std::vector<double> n = {1024, 2048, 4096, 8192, 16384};
  const std::vector<double> sec = {33.5e-6, 144e-6, 300e-6, 620e-6, 2900e-6};
  const std::string note = kdalab::cli::softmax_cache_note(n, sec, 128, caches);
  INFO(note);
  CHECK(note.rfind("softmax read: 4.7x the time for 2x the tokens from n = 8192 to 16384", 0) == 0);  // as before
  CHECK(note.find("From n = 1024 to 2048 the time grows 4.3x for 2x the tokens; the working set at n = 1024 is "
                  "1.0 MiB, 100% of the L2 (1.0 MiB), so that step is plausibly the L2 edge (plausibly: cache misses "
                  "were not measured).") != std::string::npos);
  CHECK(note.find("plausibly the L1") == std::string::npos);  // no rise where the working set leaves the L1d
  CHECK(note.find("plausibly the L3") == std::string::npos);  // 16 MiB is half the L3: not its edge
  CHECK(note.find('\n') == std::string::npos);                // one line
  // the time per number flat across the L2 edge: no step, no edge named
  const std::string flat = kdalab::cli::softmax_cache_note({1024, 2048}, {33.5e-6, 68e-6}, 128, caches);
  INFO(flat);
  CHECK(flat.rfind("softmax read: time per number read within 1.5x", 0) == 0);
  CHECK(flat.find("plausibly") == std::string::npos);
  // the same step with d = 64 (working set 0.5 MiB, half the L2): not its edge either
  const std::string half = kdalab::cli::softmax_cache_note({512, 1024}, {33.5e-6, 144e-6}, 64, caches);
  INFO(half);
  CHECK(half.find("plausibly the L2") == std::string::npos);
}
