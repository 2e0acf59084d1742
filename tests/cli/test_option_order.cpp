// The order of checks of every subcommand (cli::run): the options first, then the input files, then --out, then
// whether the build can run it; so a bad option is named before a bad or existing --out, before a FIFO or repeated
// input, and --in before --out; each message once.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "experiments/decode_cost_note.hpp"
#include "experiments/results.hpp"
#include "reference/model_config.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("bench names a bad option before its input files and before --out (exit 2, nothing written)", "[bench]") {
  {
    TempDir d;
    const std::string missing_dir_out = " --out " + d.file("no/such/folder/b.h5");
    d.write("old.h5", "an existing file that must survive");
    const std::string existing_out = " --out " + d.file("old.h5");
    struct Case {
      std::string args, names;
    };
    const std::vector<Case> cases = {
        {"--op kda-prefil", "--op"},
        {"--op kda-prefill --iters 0", "--iters"},
        {"--op kda-prefill --warmup -1", "--warmup"},
        {"--op mla-prefill --prefix -3", "--prefix"},
        {"--op kda-prefill --overlap 7", "--overlap"},
        {"--op kda-prefill --segments 65", "--segments"},
        {"--op kda-prefill --state-pass fast", "--state-pass"},
        {"--op kda-prefill --overlap 1", "--overlap"},
        {"--op all --shapes 1:16:1", "--shapes"},
        {"--op kda-prefill --shapes 1:16", "--shapes"},
        {"--op kda-decode --shapes 1:2:4", "--shapes"},
        {"--op kda-prefill --peer-json " + d.file("none.json"), "--peer-json"},
        {"--op kda-prefill --compare " + d.file("none.h5"), "--compare"},
    };
    for (const auto& c : cases)
      for (const std::string& out : {missing_dir_out, existing_out}) {
        const auto r = run_kdalab("bench " + c.args + out);
        INFO(c.args << out << "\n" << r.output);
        CHECK(r.code == 2);
        CHECK(has(r, c.names));
        CHECK(!has(r, "--out"));  // the option, not the output path, is what is wrong
        CHECK(!has(r, "not available"));
      }
    CHECK(slurp(d.file("old.h5")) == "an existing file that must survive");
    CHECK(d.count() == 1);
  }
  {
    const std::string d = fresh_dir("order");
    const std::string fifo = d + "/fifo.json";
    REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
    write_file(d + "/p.json", "{\"kda-prefill B=1 T=8192 H=64 HV=64\": 1.0}");
    const std::string p = d + "/p.json", p2 = d + "/./p.json";
    for (const std::string& files : {"--peer-json " + fifo, "--compare " + fifo, "--peer-json " + p + "," + p2,
                                     "--compare " + p + " --compare " + p2}) {
      // bad --op, then a bad number: the option is named, not the file
      for (const std::string& opt : {std::string("--op bogus"), std::string("--iters 0")}) {
        const RunResult r = run_kdalab("bench " + opt + " " + files + " --out " + d + "/o.h5");
        INFO(opt << " " << files << "\n" << r.output);
        CHECK(r.code == 2);
        CHECK(has(r, opt == "--op bogus" ? "--op = 'bogus'" : "--iters = 0"));
        CHECK(lines(r.output) == 1);
      }
      // with good options the file is named (and the FIFO never blocks)
      const RunResult r = run_kdalab("bench --op kda-prefill " + files + " --out " + d + "/o.h5");
      INFO(files << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK((has(r, "is not a regular file") || has(r, "is given more than once")));
    }
    CHECK(!std::filesystem::exists(d + "/o.h5"));
  }
  {
    TempDir d;
    const std::string key = "kda-prefill B=1 T=16 H=1 HV=1";
    d.write("p.json", "{\"" + key + "\": 1.5}");
    d.write("c.json", "{\"iters\": 3}");
    // --out one of the inputs: each option's own wording (a file list: "is the --peer-json file"; --config: "is the
    // input file --config"), exit 2, the input untouched
    auto r = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("p.json") + " --force");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--out '" + d.file("p.json") + "' is the --peer-json file '" + d.file("p.json") +
                 "'; give another results file (--peer-json files are read, never overwritten)"));
    r = run_timed("bench --config " + d.file("c.json") + " --out " + d.file("c.json") + " --force");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--out '" + d.file("c.json") + "' is the input file --config ('" + d.file("c.json") + "')"));
    CHECK(slurp(d.file("p.json")) == "{\"" + key + "\": 1.5}");
    CHECK(slurp(d.file("c.json")) == "{\"iters\": 3}");
    // bench's own checks come first: a bad option or a bad --peer-json file is named whatever --out is
    r = run_timed("bench --iters 0 --peer-json " + d.file("p.json") + " --out " + d.file("p.json"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--iters = 0"));
    d.write("bad.json", "{\"" + key + "\": -1}");
    r = run_timed("bench --peer-json " + d.file("bad.json") + " --out " + d.file("nodir/o.h5"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "has the value -1; accepted"));
    // then --out itself (its folder must exist), before "not available" (exit 3)
    r = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("nodir/o.h5"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--out '" + d.file("nodir/o.h5") + "': folder '" + d.file("nodir") + "' does not exist"));
    CHECK(d.count() == 3);  // p.json, c.json, bad.json: nothing written
  }
}

TEST_CASE("bench: --out is checked after the options and before the build, exit 2 in every build", "[bench]") {
  TempDir d;
  const std::string ok = "bench --op kda-prefill --shapes 1:16:1 --iters 1 --warmup 0 --compare data/baselines/h200.h5";
  auto r = run_kdalab(ok + " --out " + d.file("no/such/folder/b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--out"));
  CHECK(has(r, "does not exist"));
  d.write("old.h5", "an existing file that must survive");
  r = run_kdalab(ok + " --out " + d.file("old.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--force"));
  CHECK(slurp(d.file("old.h5")) == "an existing file that must survive");
  r = run_kdalab(ok + " --out " + d.path.string());  // a folder
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "is a directory"));
  CHECK(d.count() == 1);
}

TEST_CASE("check: options, then --in, then --out; a bad --in is named before a bad --out, and once", "[check]") {
  {
    TempDir d;
    fs::copy_file("data/golden/kda_recurrent.h5", d.file("in.h5"));
    const std::string bad_out = " --out " + d.file("no/such/folder/r.h5");
    struct Case {
      std::string args, says;
    };
    for (const Case& c : {Case{"check --op bogus --in none.h5" + bad_out, "--op 'bogus' is unknown"},
                          Case{"check --truth x --in none.h5" + bad_out, "--truth 'x' is unknown"},
                          Case{"check --tol -1 --in none.h5" + bad_out, "--tol -1 is not accepted"},
                          Case{"check" + bad_out, "--in FILE.h5 is required"},
                          Case{"check --in " + d.file("none.h5") + bad_out, "--in '" + d.file("none.h5") + "': not found"},
                          Case{"check --in " + d.file("in.h5") + bad_out, "folder '" + d.file("no/such/folder") + "' does not exist"},
                          Case{"check --in " + d.file("in.h5") + " --out " + d.file("in.h5"), "is the input file --in"},
                          Case{"check --in " + d.file("in.h5") + " --out " + d.file("in.h5") + " --force", "is the input file --in"}}) {
      const auto r = run_kdalab(c.args);
      INFO(c.args << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, c.says));
      CHECK(has(r, "kdalab check: error:"));
      CHECK(count(r.output, "error:") == 1);
    }
    CHECK(d.count() == 1);  // in.h5 only (a valid check writing its report: test_check.cpp)
  }
  {
    TempDir d;  // no results/ folder here: the default --out results/check.h5 cannot be written either
    const std::string bin = std::filesystem::absolute(kdalab_bin()).string();
    auto r = run_command("cd " + d.path.string() + " && " + bin + " check --quiet");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find("--in FILE.h5 is required") != std::string::npos);
    CHECK(r.output.find("--out") == std::string::npos);
    r = run_command("cd " + d.path.string() + " && " + bin + " check --quiet --in none.h5");
    CHECK(r.code == 2);
    CHECK(r.output.find("--in 'none.h5': not found") != std::string::npos);
    CHECK(r.output.find("results") == std::string::npos);
    // with a readable --in, the --out folder is the next thing to fix
    std::filesystem::copy_file("data/golden/kda_recurrent.h5", d.file("in.h5"));
    r = run_command("cd " + d.path.string() + " && " + bin + " check --quiet --in in.h5");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find("--out 'results/check.h5': folder 'results' does not exist") != std::string::npos);
    CHECK(d.count() == 1);  // in.h5 only
  }
  {
    TempDir d;
    d.write("text.h5", "not an HDF5 file\n");
    std::filesystem::create_directories(d.file("dir"));
    for (const std::string& in : {d.file("dir"), d.file("text.h5")}) {
      const auto r = run_kdalab("check --quiet --in " + in + " --out " + d.file("no/such/folder/r.h5"));
      INFO(r.output);
      CHECK(r.code == 2);
      CHECK(r.output.find("kdalab check: error: --in '" + in + "': not found or not a readable HDF5 file") != std::string::npos);
      CHECK(r.output.find("--out") == std::string::npos);
    }
    const auto r = run_kdalab("check --quiet --out " + d.file("r.h5"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find("kdalab check: error: --in FILE.h5 is required") != std::string::npos);
    CHECK(r.output.find("check: check") == std::string::npos);
    CHECK(d.count() == 2);  // text.h5 and dir only
  }
}

// Item 4 (each input list checked once) is not observable from outside: a check that ran twice on the same files gives
// the same answer. This keeps what the change must not alter: in bench and check the option is named before a FIFO or
// repeated input file, the input before a bad --out, one line, exit 2.
TEST_CASE("bench and check keep their order of input-file checks (option, then files, then --out)", "[bench][check]") {
  TempDir d;
  const std::string fifo = d.file("fifo.h5");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  d.write("p.json", "{}");
  const std::string p = d.file("p.json"), p2 = d.path.string() + "/./p.json", bad_out = d.file("no/such/o.h5");
  struct Case {
    std::string args, want;
  };
  for (const Case& c : std::vector<Case>{
           {"check --op bogus --in " + fifo, "--op 'bogus' is unknown"},
           {"check --op kda --in " + fifo + " --out " + bad_out, "--in '" + fifo + "' is not a regular file"},
           {"bench --iters 0 --compare " + fifo, "--iters = 0"},
           {"bench --op kda-prefill --compare " + fifo + " --out " + bad_out, "--compare '" + fifo + "' is not a regular file"},
           {"bench --op kda-prefill --peer-json " + p + "," + p2 + " --out " + bad_out, "is given more than once"},
           {"bench --op kda-prefill --peer-json " + fifo + " --compare " + fifo, "--peer-json '" + fifo + "'"},
       }) {
    const RunResult r = run_kdalab(c.args);
    INFO(c.args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, c.want));
    CHECK(lines(r.output) == 1);
  }
  CHECK(!std::filesystem::exists(d.file("no")));
}

// Every experiment checks its options in its Command::check, before --out, in one order for all (decode-cost's
// --gpu-n / --gpu-iters before any CPU timing).
TEST_CASE("every experiment names a bad option before a bad --out, and before an existing --out", "[cli]") {
  TempDir d;
  const std::string no_dir = d.file("no_such_folder/x.h5");
  d.write("old.h5", "old");
  const std::vector<std::pair<std::string, std::string>> cases{
      {"parity --T 0", "--T: 0"},
      {"parity --quick --truth bogus", "--truth: 'bogus'"},
      {"recall --span 0.5", "--span: 0.5"},
      {"recall --quick --memories bogus", "bogus"},
      {"copy --beta 2", "--beta: 2"},
      {"copy --precision fp8", "fp8"},
      {"decay-range --T 0", "--T: 0"},
      {"decay-range --precision tf32", "--precision: tf32"},
      {"decode-cost --min-time 0", "--min-time: 0"},
      {"decode-cost --gpu-n -5", "--gpu-n: -5"},
      {"decode-cost --gpu-iters 0", "--gpu-iters: 0"},
  };
  for (const auto& [args, want] : cases)
    for (const std::string& out : {no_dir, d.file("old.h5")}) {
      const RunResult r = run_kdalab(args + " --quiet --out " + out);
      INFO(args << " --out " << out << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, want));
      CHECK(!has(r, "--out"));
    }
  CHECK(slurp(d.file("old.h5")) == "old");
  CHECK(!std::filesystem::exists(d.file("no_such_folder")));
}
