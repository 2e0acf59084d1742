// scripts/summary.py: piped into a reader that stops early, it ends without a traceback.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;

TEST_CASE("summary.py piped into a reader that stops early ends without a traceback", "[figures][summary]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string h5 = d.file("dc.h5");
  make_small_decode_cost(h5);
  // `true` reads nothing and exits at once: every write of summary.py meets a closed pipe
  const RunResult r = run_command(std::string(kPy) + " scripts/summary.py " + h5 + " 2>" + d.file("err.txt") + " | true");
  const std::string err = slurp(d.file("err.txt"));
  INFO(err);
  CHECK(err.find("Traceback") == std::string::npos);
  CHECK(err.find("BrokenPipeError") == std::string::npos);
  CHECK(err.empty());
}
