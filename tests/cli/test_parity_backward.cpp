// `kdalab parity --backward`: the gradient-parity mode writes one row per (point, implementation) with one relative
// RMS per gradient; float64 against the mp50 backward is at rounding level, float32 at its own, the bf16 emulation at
// bf16's (in a tree that has numerics/plain_emulation.hpp; otherwise its rows are skipped with a note and, asked for
// alone, exit 3); an implementation of the forward mode is refused.
#include <cmath>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;
using namespace kdalab;

TEST_CASE("parity --backward writes one relative RMS per gradient; float64 is at rounding level against mp50",
          "[parity]") {
  TempDir d;
  const std::string out = d.file("pb.h5");
  const RunResult r = run_kdalab("parity --backward --quick --quiet --dk 8 --dv 8 --impl float64,float32,bf16-emu --out " + out);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const bool emulated = !has(r, "note: bf16-emu rows skipped");
  const std::vector<std::string> grads = {"dq", "dk", "dv", "dg", "dbeta", "dS0"};
  std::vector<std::string> cols = {"impl", "T", "truth", "worst_rel_rms"};
  for (const auto& g : grads) cols.push_back(g + "_rel_rms");
  require_columns(out, "/parity_backward/table", cols);
  const auto impl = scol(out, "/parity_backward/table/impl");
  const auto truth = scol(out, "/parity_backward/table/truth");
  REQUIRE(impl.size() == (emulated ? 6u : 4u));  // T = 16, 64 (--quick) x float64, float32 (, bf16-emu)
  for (std::size_t i = 0; i < impl.size(); ++i) {
    INFO("row " << i << " " << impl[i] << " truth " << truth[i]);
    CHECK(truth[i] == "cpp_bin_float_50");
    for (const auto& g : grads) {
      const double e = col(out, "/parity_backward/table/" + g + "_rel_rms")[i];
      INFO(g << ": " << e);
      if (impl[i] == "float64") CHECK((e > 0 && e <= tol::backward_f64_vs_mp.value));
      else if (impl[i] == "float32") CHECK((e > 1e-9 && e < 1e-5));  // rounding of a 24-bit significand
      else CHECK((e > 1e-4 && e < 5e-2));                              // bf16 operands: an 8-bit significand
    }
  }
  CHECK((h5read::attr_string(out, "/parity_backward", "notes").find("bf16-emu") != std::string::npos) == !emulated);
}

TEST_CASE("parity --backward: bf16-emu alone without the emulation exits 3 and writes nothing; a forward-only "
          "implementation or option, or a point too large to allocate, exits 2",
          "[parity]") {
  TempDir d;
  const std::string out = d.file("pb.h5");
  RunResult r = run_kdalab("parity --backward --quick --quiet --dk 4 --dv 4 --impl bf16-emu --out " + out);
  INFO(r.output);
  if (has(r, "bf16-emu rows skipped")) {
    CHECK(r.code == 3);
    CHECK(!std::filesystem::exists(out));
  } else {
    CHECK(r.code == 0);
    std::filesystem::remove(out);
  }
  r = run_kdalab("parity --backward --quick --impl twin-bf16 --out " + out);
  INFO(r.output);
  require_one_line_exit2(r);
  CHECK(has(r, "--impl: 'twin-bf16' is not an implementation of --backward"));
  CHECK(!std::filesystem::exists(out));
  // options of the forward sweep that the gradient mode does not read are refused, never ignored
  for (const std::string opt : {"--C 32", "--state-precision bf16", "--matmul-precision tf32", "--windows 4"}) {
    r = run_kdalab("parity --backward --quick --dk 4 --dv 4 " + opt + " --out " + out);
    require_one_line_exit2(r);
    CHECK(has(r, opt.substr(0, opt.find(' ')) + " has no effect with --backward"));
    CHECK(!std::filesystem::exists(out));
  }
  // a grid point too large to allocate is one error line (no table header before it), nothing written
  r = run_kdalab("parity --backward --T 1000000000000 --dk 2 --dv 2 --out " + out);
  require_one_line_exit2(r);
  CHECK(has(r, "not enough memory"));
  CHECK(!std::filesystem::exists(out));
}

TEST_CASE("parity --backward's results file replays through --config to the same rows; rows name their input kind",
          "[parity]") {
  TempDir d;
  const std::string a = d.file("a.h5"), b = d.file("b.h5");
  RunResult r = run_kdalab("parity --backward --quiet --T 1,5 --dk 4 --dv 4 --inputs long-memory,identical-keys "
                           "--beta one --out " + a);
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(has(r, "  mp     identical-keys\n"));  // each printed row names its input kind (--quiet: no progress lines)
  d.write("replay.json", h5read::attr_string(a, "/", "config"));
  r = run_kdalab("parity --quiet --config " + d.file("replay.json") + " --out " + b);
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(scol(b, "/parity_backward/table/generator") == scol(a, "/parity_backward/table/generator"));
  CHECK(col(b, "/parity_backward/table/dq_rel_rms") == col(a, "/parity_backward/table/dq_rel_rms"));
}
