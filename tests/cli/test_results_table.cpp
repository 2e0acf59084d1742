// docs/results.md: its tables of current numbers are what scripts/results_table.py makes from the checked-in H200 and
// H100 baselines, so a baseline replaced without regenerating its table (or a table edited by hand) fails here.
#include <filesystem>
#include <string>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;

TEST_CASE("docs/results.md holds the table results_table.py makes from the H200 baselines", "[figures][results_table]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string copy = d.file("results.md");
  std::filesystem::copy_file("docs/results.md", copy);
  const RunResult r =
      python("scripts/results_table.py data/baselines/h200.h5 data/baselines/h200/*.h5 --readme " + copy + " 2>&1");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string before = slurp("docs/results.md"), after = slurp(copy);
  CHECK(before.find("<!-- results-table:begin -->") != std::string::npos);
  // the regenerated file equals the checked-in one: regenerate with the command in docs/results.md when it differs
  CHECK(after == before);
}

TEST_CASE("docs/results.md holds the H100 table results_table.py makes from the H100 baselines (--marker)",
          "[figures][results_table]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string copy = d.file("results.md");
  std::filesystem::copy_file("docs/results.md", copy);
  const RunResult r =
      python("scripts/results_table.py data/baselines/h100/*.h5 --readme " + copy + " --marker results-table-h100 2>&1");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string before = slurp("docs/results.md"), after = slurp(copy);
  CHECK(before.find("<!-- results-table-h100:begin -->") != std::string::npos);
  // the H200 block is left as it is, the H100 block regenerated equal: regenerate with the command in docs/results.md
  CHECK(after == before);
}

TEST_CASE("results_table.py refuses a bad --marker with one line, exit 2, nothing written", "[figures][results_table]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string copy = d.file("results.md");
  std::filesystem::copy_file("docs/results.md", copy);
  const std::string before = slurp(copy);
  for (const char* bad : {"'a b'", "'x;y'"}) {
    const RunResult r = python(std::string("scripts/results_table.py data/baselines/h100/attn-res.h5 --readme ") + copy +
                               " --marker " + bad + " 2>&1");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find("--marker") != std::string::npos);
    CHECK(r.output.find("accepted: letters, digits and '-'") != std::string::npos);
  }
  const RunResult none = python(std::string("scripts/results_table.py data/baselines/h100/attn-res.h5 --readme ") + copy +
                                " --marker no-such-block 2>&1");
  INFO(none.output);
  CHECK(none.code == 2);
  CHECK(none.output.find("needs the markers <!-- no-such-block:begin -->") != std::string::npos);
  CHECK(slurp(copy) == before);
}
