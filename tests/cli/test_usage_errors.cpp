// Usage errors: exit 2 with one line naming the problem; an unknown option names itself and points to the right
// --help (the subcommand's, or says to give a subcommand first).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("usage errors exit 2 with one line naming the problem", "[cli]") {
  const auto none = run_kdalab("");
  CHECK(none.code == 2);
  const auto unknown_sub = run_kdalab("frobnicate");
  CHECK(unknown_sub.code == 2);
  TempDir d;
  const auto bad_opt = run_kdalab("decode-cost --no-such-option 3 --out " + d.file("x.h5"));
  CHECK(bad_opt.code == 2);
  CHECK(bad_opt.output.find("no-such-option") != std::string::npos);
  const auto bad_val = run_kdalab("decode-cost --d 0 --quiet --out " + d.file("x.h5"));
  CHECK(bad_val.code == 2);
  CHECK(bad_val.output.find("--d") != std::string::npos);
  CHECK(d.count() == 0);  // nothing written
}

TEST_CASE("an unknown option after a subcommand points to that subcommand's --help", "[cli]") {
  const RunResult r = run_kdalab("recall --bogus --out /nonexistent/x.h5");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "kdalab recall: error: The following argument was not expected: --bogus (see 'kdalab recall --help')"));
  // before any subcommand the root help is the one that lists them
  const RunResult root = run_kdalab("");
  INFO(root.output);
  CHECK(root.code == 2);
  CHECK(has(root, "(see 'kdalab --help')"));
}

TEST_CASE("kdalab -x names the unknown option and says to give a subcommand first", "[cli]") {
  for (const std::string opt : {"-x", "--frobnicate", "--T=5"}) {
    const auto r = run_kdalab(opt);
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, cat({"unknown option '", opt, "'"})));
    CHECK(has(r, "give a subcommand first"));
    CHECK(has(r, "bench"));  // the subcommands are listed
  }
  // kdalab's own options still work, and no argument at all is still "A subcommand is required" (exit 2)
  CHECK(run_kdalab("--version").code == 0);
  CHECK(run_kdalab("-h").code == 0);
  const auto r = run_kdalab("");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "A subcommand is required"));
}
