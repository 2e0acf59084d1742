// docs/results.md: its table of current numbers is what scripts/results_table.py makes from the checked-in H200
// baselines, so a baseline replaced without regenerating the table (or a table edited by hand) fails here.
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
