// `kdalab decode-cost`: the --quick table, CPU rows, the hybrid model and its bound; the CPU softmax cache note
// (working set against the caches): printed once, recorded, naming the step whose working set leaves the L2,
// leaving out zero and NaN timings (never "inf" or "nan").
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "experiments/decode_cost_note.hpp"
#include "experiments/results.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("decode-cost's cache note names the step leaving the L2 and leaves out zero and NaN timings (never inf or nan)",
          "[decode-cost]") {
  {
    using kdalab::cli::CacheLevel;
    const std::vector<CacheLevel> caches = {{1, "Data", 32768, "0"}, {2, "Unified", 1048576, "0"}};
    const double nan = std::nan("");
    struct Case {
      std::vector<double> n, sec;
      std::string left_out;  // the count the note must give ("" = none left out)
    };
    for (const Case& c : std::vector<Case>{{{256, 512, 1024, 2048}, {0.0, 8e-6, 16e-6, 68e-6}, "1 of 4"},
                                          {{256, 512, 1024, 2048}, {4e-6, nan, 16e-6, 68e-6}, "1 of 4"},
                                          {{256, 512}, {0.0, 0.0}, "2 of 2"},
                                          {{1024}, {nan}, "1 of 1"},
                                          {{1024}, {1e-5}, ""},
                                          {{512, 1024}, {1e-5, 1e-5}, ""}}) {
      const std::string note = kdalab::cli::softmax_cache_note(c.n, c.sec, 128, caches);
      INFO(note);
      CHECK(note.find("inf") == std::string::npos);
      CHECK(note.find("nan") == std::string::npos);
      if (c.left_out.empty()) CHECK(note.find("left out") == std::string::npos);
      else CHECK(note.find(c.left_out + " timings left out") != std::string::npos);
    }
  }
  {
    using kdalab::cli::CacheLevel;
    const std::vector<CacheLevel> caches = {{1, "Data", 32768, "0"}, {2, "Unified", 1048576, "0"},
                                            {3, "Unified", 33554432, "0-1"}};
    // timings of a 2-core CPU: d = 128, 33.5 -> 144 us from n = 1024 to 2048 (4.3x for 2x the tokens; working
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
}

TEST_CASE("decode-cost notes the CPU softmax working set against the caches, once, and records it", "[decode-cost]") {
  TempDir d;
  const auto r = run_kdalab("decode-cost --cpu-n 1024,2048 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 "
                            "--context 1024 --gpu-n 0 --quiet --out " + d.file("dc.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto notes = note_lines(r.output);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].rfind("softmax read: ", 0) == 0);
  CHECK(notes[0].find("working set") != std::string::npos);
  CHECK((notes[0].find("caches") != std::string::npos || notes[0].find("cache sizes are unknown") != std::string::npos));
  CHECK(kdalab::h5read::attr_string(d.file("dc.h5"), "/decode_cost/cpu", "note") == notes[0]);
  // one softmax and one KDA row per n (a repeated --cpu-n value is refused: test_option_values.cpp)
  CHECK(kdalab::h5read::strings(d.file("dc.h5"), "/decode_cost/cpu/impl").size() == 4);
}

TEST_CASE("decode-cost --quick: the decode table of docs/design.md, CPU rows, the hybrid model and its bound",
          "[decode-cost]") {
  TempDir d;
  const auto r = run_kdalab("decode-cost --quick --quiet --out " + d.file("d.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string f = d.file("d.h5");
  const auto n = col(f, "decode_cost/analytic/n"), dd = col(f, "decode_cost/analytic/d"),
             rf = col(f, "decode_cost/analytic/ratio_floor"), sm = col(f, "decode_cost/analytic/softmax_reads");
  // The decode table of docs/design.md (d = 64): 1,000 -> 128,000 (31x); 128,000 -> 16,384,000 (4,000x); 1,000,000 -> 128,000,000 (31,250x).
  const std::vector<std::vector<double>> seed{{1000, 64, 128000, 31}, {128000, 64, 16384000, 4000}, {1000000, 64, 128000000, 31250},
                                              {1000000, 128, 256000000, 15625}};
  for (const auto& s : seed) {
    bool found = false;
    for (std::size_t i = 0; i < n.size(); ++i)
      if (n[i] == s[0] && dd[i] == s[1]) {
        found = true;
        CHECK(sm[i] == s[2]);
        CHECK(rf[i] == s[3]);
      }
    CHECK(found);
  }
  require_columns(f, "decode_cost/cpu", {"impl", "n", "d", "seconds_per_token", "numbers_read"});
  const auto impl = scol(f, "decode_cost/cpu/impl");
  const auto sec = col(f, "decode_cost/cpu/seconds_per_token"), cn = col(f, "decode_cost/cpu/n");
  double soft_small = 0, soft_big = 0;
  for (std::size_t i = 0; i < impl.size(); ++i) {
    CHECK(sec[i] > 0);
    if (impl[i] == "softmax" && cn[i] == 1024) soft_small = sec[i];
    if (impl[i] == "softmax" && cn[i] == 16384) soft_big = sec[i];
  }
  CHECK(soft_big > 4 * soft_small);  // 16x the cache: the read grows with n (loose: a shared CPU)
  require_columns(f, "decode_cost/hybrid", {"layout", "n", "batch", "batch_kind", "bytes_per_token", "seconds_per_token",
                                            "step_seconds", "memory_bytes", "speedup_vs_mla"});
  const double s48 = h5read::attr_double(f, "decode_cost/hybrid", "attention_speedup_1m_48b");
  CHECK(s48 > 3.7);
  CHECK(s48 < 27.0 / 7.0);  // the attention-only limit L / L_MLA
  CHECK(h5read::attr_double(f, "decode_cost/hybrid", "reported_speedup") == 11.48 / 1.84);
  CHECK(h5read::attr_string(f, "decode_cost/hybrid", "bound").find("EQUAL batch") != std::string::npos);
  CHECK(h5read::exists(f, "decode_cost/gpu"));
}
