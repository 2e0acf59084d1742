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

TEST_CASE("an option whose value is left out, followed by another of the command's options, is named itself", "[cli]") {
  // "--precision --out x.h5" read '--out' as the precision and then named only the stray "x.h5"
  TempDir d;
  const std::string old = d.file("old.h5");
  write_file(old, "old");
  const auto before = std::filesystem::last_write_time(old);
  const struct {
    std::string args, name, next;
  } cases[] = {
      {"bench --op mla-decode --mla-precision --out " + old, "--mla-precision", "--out"},
      {"bench --op --quick --out " + old, "--op", "--quick"},
      {"bench --op kda-prefill --shapes --out " + old, "--shapes", "--out"},
      {"decode-cost --d --quiet --out " + old, "--d", "--quiet"},
      {"recall --config --seed=3 --out " + old, "--config", "--seed=3"},
  };
  for (const auto& c : cases) {
    const auto r = run_kdalab(c.args);
    INFO(c.args << "\n" << r.output);
    require_one_line_exit2(r);
    CHECK(has(r, c.name + ": no value given (the next argument, '" + c.next + "', is an option)"));
  }
  CHECK(std::filesystem::last_write_time(old) == before);
  CHECK(slurp(old) == "old");
  // a value that only starts with '-' is still a value: a negative number, or a name that is no option of the command
  const auto neg = run_kdalab("decode-cost --d -3 --quiet --out " + d.file("n.h5"));
  INFO(neg.output);
  CHECK(neg.code == 2);
  CHECK(!has(neg, "no value given"));
}
