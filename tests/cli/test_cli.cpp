// Command line: help, errors (exit 2, one line, no file), JSON configs, refusal to overwrite.
#include <filesystem>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab;
using namespace kdalab::testutil;

TEST_CASE("every subcommand has --help that exits 0 and describes the common options") {
  for (const char* sub : {"info", "parity", "recall", "copy", "decay-range", "decode-cost", "bench", "golden", "check"}) {
    const auto r = run_kdalab(std::string(sub) + " --help");
    INFO(sub << ": " << r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("--config") != std::string::npos);
    CHECK(r.output.find("--out") != std::string::npos);
    CHECK(r.output.find("--seed") != std::string::npos);
    CHECK(r.output.find("--quick") != std::string::npos);
    CHECK(r.output.find("--force") != std::string::npos);
  }
  const auto top = run_kdalab("--help");
  CHECK(top.code == 0);
  CHECK(top.output.find("decode-cost") != std::string::npos);
}

TEST_CASE("usage errors exit 2 with one line naming the problem") {
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

TEST_CASE("a config value really changes behaviour; the command line overrides it") {
  TempDir d;
  d.write("c.json", R"({"d": [128], "n": [1000, 1000000], "quiet": true})");
  auto r = run_kdalab("decode-cost --config " + d.file("c.json") + " --out " + d.file("a.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  auto dcol = h5read::array(d.file("a.h5"), "decode_cost/analytic/d");
  auto ratio = h5read::array(d.file("a.h5"), "decode_cost/analytic/ratio_floor");
  REQUIRE(dcol.numel() == 2);
  CHECK(dcol.data[0] == 128);
  CHECK(ratio.data[1] == 15625);  // seed 002: 256,000,000 / 16,384
  // The command line wins over the file.
  r = run_kdalab("decode-cost --config " + d.file("c.json") + " --n 1000 --out " + d.file("b.h5"));
  REQUIRE(r.code == 0);
  CHECK(h5read::array(d.file("b.h5"), "decode_cost/analytic/n").numel() == 1);
  // The effective config is recorded.
  const std::string cfg = h5read::attr_string(d.file("b.h5"), "/", "config");
  CHECK(cfg.find("\"d\":\"128\"") != std::string::npos);
}

TEST_CASE("bad configs exit 2 and leave no file") {
  TempDir d;
  d.write("unknown.json", R"({"d": [64], "bogus_key": 1})");
  d.write("notjson.json", "{ d: ");
  d.write("array.json", "[1, 2]");
  d.write("flag.json", R"({"quick": 3})");
  for (const auto& [file, needle] : std::vector<std::pair<std::string, std::string>>{
           {"unknown.json", "bogus_key"}, {"notjson.json", "not valid JSON"}, {"array.json", "JSON object"},
           {"flag.json", "flag"}, {"missing.json", "not found"}}) {
    const auto r = run_kdalab("decode-cost --quiet --config " + d.file(file) + " --out " + d.file("o.h5"));
    INFO(file << ": " << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(needle) != std::string::npos);
    CHECK(!std::filesystem::exists(d.file("o.h5")));
  }
}

TEST_CASE("an existing output is never overwritten without --force; unwritable outputs are refused") {
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

TEST_CASE("kdalab info reports the build and never needs a GPU") {
  const auto r = run_kdalab("info");
  INFO(r.output);
  CHECK(r.code == 0);
  for (const char* key : {"git", "compiler", "build type", "CUDA kernels", "GPU"}) CHECK(r.output.find(key) != std::string::npos);
  // a missing model config: one line naming it and where configs live, before any banner (session 6 newcomer)
  const auto m = run_kdalab("info --config no_such_model.json");
  INFO(m.output);
  CHECK(m.code == 2);
  CHECK(m.output.find("no_such_model.json") != std::string::npos);
  CHECK(m.output.find("data/configs/") != std::string::npos);
  CHECK(m.output.find("compiler") == std::string::npos);
}

// Finds of the adversarial review, each turned into a test.
TEST_CASE("config values cannot inject options; strict JSON; one value where one is expected") {
  TempDir d;
  REQUIRE(run_kdalab("decode-cost --quiet --n 1000 --out " + d.file("v.h5")).code == 0);
  d.write("inject.json", R"({"n": [1000, "--force"], "quiet": true})");
  auto r = run_kdalab("decode-cost --config " + d.file("inject.json") + " --out " + d.file("v.h5"));
  CHECK(r.code == 2);
  CHECK(r.output.find("looks like an option") != std::string::npos);
  CHECK(h5read::array(d.file("v.h5"), "decode_cost/analytic/n").data[0] == 1000);  // untouched
  d.write("trailing.json", R"({"quiet": true} {"n": [0]} xx)");
  r = run_kdalab("decode-cost --config " + d.file("trailing.json") + " --out " + d.file("t.h5"));
  CHECK(r.code == 2);
  CHECK(r.output.find("not valid JSON") != std::string::npos);
  d.write("list.json", R"({"memory-gb": [1, 2]})");
  r = run_kdalab("decode-cost --quiet --config " + d.file("list.json") + " --out " + d.file("l.h5"));
  CHECK(r.code == 2);
  CHECK(r.output.find("memory-gb") != std::string::npos);
  d.write("neg.json", R"({"n": [-5]})");  // negative numbers are values, not options
  r = run_kdalab("decode-cost --quiet --config " + d.file("neg.json") + " --out " + d.file("n.h5"));
  CHECK(r.code == 2);
  CHECK(r.output.find("--n") != std::string::npos);
  CHECK(!std::filesystem::exists(d.file("t.h5")));
  CHECK(!std::filesystem::exists(d.file("l.h5")));
}

TEST_CASE("non-finite option values, bad seeds, unknown subcommands and over-long names exit 2") {
  TempDir d;
  for (const char* bad : {"--d inf", "--n nan", "--memory-gb -inf", "--memory-gb 1e400", "--seed -1",
                          "--seed 99999999999999999999999", "--seed 1.5"}) {
    const auto r = run_kdalab(std::string("decode-cost --quiet ") + bad + " --out " + d.file("x.h5"));
    INFO(bad << ": " << r.output);
    CHECK(r.code == 2);
  }
  const auto sub = run_kdalab("frobnicate --quick");
  CHECK(sub.code == 2);
  CHECK(sub.output.find("unknown subcommand 'frobnicate'") != std::string::npos);
  const auto longname = run_kdalab("decode-cost --quiet --out " + d.file(std::string(240, 'x') + ".h5"));
  CHECK(longname.code == 2);
  CHECK(longname.output.find("too long") != std::string::npos);
  CHECK(d.count() == 0);
}

TEST_CASE("golden run outside the repository root names the working directory instead of suggesting --regen", "[cli]") {
  TempDir d;
  const std::string bin = std::filesystem::absolute(kdalab_bin()).string();
  const auto r = run_command("cd " + d.path.string() + " && " + bin + " golden");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("working directory") != std::string::npos);
  CHECK(r.output.find("--dir") != std::string::npos);
  CHECK(!std::filesystem::exists(d.file("data")));  // nothing written there
}

TEST_CASE("golden --help says which shared options have no effect for it", "[cli]") {
  const auto r = run_kdalab("golden --help");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("recorded in the results file") == std::string::npos);  // golden writes no results file
  CHECK(r.output.find("no effect for golden") != std::string::npos);
}
