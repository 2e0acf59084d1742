// --out: an existing output is never overwritten without --force; never replaced when it is not a regular file (a
// FIFO), with --force too; unwritable or too long paths are refused naming --out; info refuses a bad --out before
// printing anything; golden --regen never replaces fixtures without --force; check never overwrites its input.
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "experiments/cli.hpp"
#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("an existing output is never overwritten without --force; unwritable outputs are refused", "[out]") {
  TempDir d;
  REQUIRE(run_kdalab("decode-cost --quiet --n 1000 --out " + d.file("r.h5")).code == 0);
  const auto t0 = std::filesystem::last_write_time(d.file("r.h5"));
  const auto again = run_kdalab("decode-cost --quiet --n 2000 --out " + d.file("r.h5"));
  CHECK(again.code == 2);
  CHECK(again.output.find("--force") != std::string::npos);
  CHECK(std::filesystem::last_write_time(d.file("r.h5")) == t0);
  CHECK(h5read::array(d.file("r.h5"), "decode_cost/analytic/n").data[0] == 1000);
  REQUIRE(run_kdalab("decode-cost --quiet --n 2000 --force --out " + d.file("r.h5")).code == 0);
  CHECK(h5read::array(d.file("r.h5"), "decode_cost/analytic/n").data[0] == 2000);
  const auto nodir = run_kdalab("decode-cost --quiet --out " + d.file("no/such/dir/r.h5"));
  CHECK(nodir.code == 2);
  CHECK(nodir.output.find("does not exist") != std::string::npos);
  CHECK(d.count() == 1);  // no temporaries left behind
}

TEST_CASE("an --out that is a FIFO is never replaced, with --force too", "[out]") {
  TempDir d;
  const std::string fifo = d.file("ff");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& args : {"info --out " + fifo + " --force", "info --out " + fifo,
                                 "decode-cost --quick --quiet --out " + fifo + " --force"}) {
    const auto r = run_timed(args);
    require_one_line_exit2(r);
    CHECK(has(r, "--out '" + fifo + "' is not a regular file"));
    CHECK(is_fifo(fifo));
    CHECK(d.count() == 1);  // no temporary left either
  }
}

TEST_CASE("a too long --out path is named as --out with what is accepted", "[out]") {
  TempDir d;
  std::string deep = d.path.string();
  while (deep.size() < 4300) deep += "/dd";
  std::string long_name(300, 'x');
  for (const std::string& out : {deep + "/x.h5", d.file(long_name + ".h5")}) {
    for (const std::string sub : {"info", "parity --quick"}) {
      const auto r = run_timed(sub + " --out " + out);
      require_one_line_exit2(r);
      CHECK(has(r, "--out '" + out + "'"));
      CHECK(has(r, "too long"));
      CHECK(!has(r, "filesystem error"));
      CHECK(!has(r, "compiler:"));  // info's banner
    }
  }
  CHECK(d.count() == 0);
}

TEST_CASE("info refuses a bad --out before printing anything", "[info][out]") {
  TempDir d;
  d.write("c.json", "old");
  auto r = run_timed("info --out " + d.file("c.json"));
  require_one_line_exit2(r);
  CHECK(has(r, "already exists; pass --force"));
  CHECK(!has(r, "compiler:"));
  CHECK(slurp(d.file("c.json")) == "old");
  r = run_timed("info --out " + d.file("nod/x.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "does not exist; create it first"));
  CHECK(!has(r, "compiler:"));
  // info without --out and with a good --out still works
  r = run_timed("info");
  CHECK(r.code == 0);
  CHECK(has(r, "compiler:"));
  r = run_timed("info --out " + d.file("i.h5"));
  CHECK(r.code == 0);
  CHECK(std::filesystem::is_regular_file(d.file("i.h5")));
}

TEST_CASE("golden --regen never replaces fixtures without --force; check never overwrites its input",
          "[golden][check][out]") {
  TempDir d;
  const std::string gdir = d.file("g");
  std::filesystem::create_directories(gdir);
  for (const auto& e : std::filesystem::directory_iterator("data/golden"))
    std::filesystem::copy_file(e.path(), gdir + "/" + e.path().filename().string());
  const auto before = std::filesystem::last_write_time(gdir + "/kda_recurrent.h5");
  const auto r = run_kdalab("golden --regen --quiet --dir " + gdir);
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("--force") != std::string::npos);
  CHECK(std::filesystem::last_write_time(gdir + "/kda_recurrent.h5") == before);
  const auto empty = run_kdalab("golden --regen --quiet --dir ''");
  CHECK(empty.code == 2);
  const std::string in = gdir + "/kda_recurrent.h5";
  const auto same = run_kdalab("check --op kda --quiet --in " + in + " --out " + in + " --force");
  INFO(same.output);
  CHECK(same.code == 2);
  CHECK(std::filesystem::last_write_time(in) == before);
}
