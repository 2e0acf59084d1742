// Input files of every subcommand (--config, --in, --compare, --peer-json, info --config): a FIFO or other non-regular
// file is refused, never read (it would block); one file by two paths is a repeat; --out is never one of the inputs
// (same path, symlink, other spelling), checked before any other exit; an error line quoting file content holds no
// raw non-printable bytes.
#include <H5Cpp.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/cli.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;
using nlohmann::json;

TEST_CASE("--out is never one of the inputs (--compare, --peer-json, --in, --config; same path, link or spelling), exit 2 first",
          "[bench][check][config][info]") {
  {
    TempDir d;
    fs::copy_file(kBaseline, d.file("base.h5"));
    fs::copy_file(kBaseline, d.file("base2.h5"));
    d.write("peer.json", "{\"kda-prefill B=1 T=16 H=1 HV=1\": 1.5}");  // valid: read completely before --out is looked at
    d.write("peer2.json", "{\"kda-prefill B=2 T=16 H=1 HV=1\": 2.5}");
    fs::create_directories(d.path / "sub");
    struct Input {
      std::string option, file, first;  // first: another file of the same option, given before `file`
    };
    for (const Input& in : {Input{"--compare", "base.h5", d.file("base2.h5")},
                            Input{"--peer-json", "peer.json", d.file("peer2.json")}}) {
      const std::string link = "link-" + in.file;
      fs::create_symlink(d.file(in.file), d.file(link));
      const std::string before = slurp(d.file(in.file));
      for (const std::string& out : {d.file(in.file), d.file(link), (d.path / "sub" / ".." / in.file).string()})
        for (const std::string& force : {std::string(), std::string(" --force")}) {
          const auto r = run_kdalab(kTiny + " " + in.option + " " + in.first + " " + d.file(in.file) + " --out " + out + force);
          INFO(in.option << " " << out << force << "\n" << r.output);
          CHECK(r.code == 2);
          CHECK(has(r, "--out"));
          CHECK(has(r, "is the " + in.option + " file"));
        }
      // the other way round: the input through the link, --out the file itself
      const auto r = run_kdalab(kTiny + " " + in.option + " " + d.file(link) + " --out " + d.file(in.file) + " --force");
      INFO(in.option << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, "is the " + in.option + " file"));
      CHECK(slurp(d.file(in.file)) == before);
    }
  }
  {
    TempDir d;
    fs::copy_file(kBaseline, d.file("base.h5"));
    fs::create_directories(d.path / "sub");
    fs::create_symlink(d.file("base.h5"), d.file("link.h5"));
    fs::create_hard_link(d.file("base.h5"), d.file("hard.h5"));
    d.write("p.json", "{\"kda-prefill B=1 T=16 H=1 HV=1\": 1.5}");
    // existing files: std::filesystem::equivalent
    for (const std::string& other : {std::string("./base.h5"), std::string("sub/../base.h5"), std::string("link.h5"),
                                     std::string("hard.h5"), d.file("base.h5")}) {
      auto r = run_in(d.path, kTiny + " --compare base.h5 --compare " + other + " --out b.h5");
      INFO(other << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, "--compare: " + other + " is given more than once; give each value once"));
    }
    auto r = run_in(d.path, kTiny + " --peer-json p.json,./p.json --out b.h5");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--peer-json: ./p.json is given more than once"));
    // files that do not exist: compared by their absolute weakly_canonical forms (the repeat is named, not the file)
    r = run_in(d.path, kTiny + " --compare x.h5 --compare ./x.h5 --out b.h5");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--compare: ./x.h5 is given more than once"));
    // two different files stay two files
    r = run_in(d.path, kTiny + " --compare base.h5," + fs::absolute(kBaseline).string() + " --out b.h5");
    INFO(r.output);
    CHECK(bench_valid_exit(r));

    // check: --out is never the --in file, whatever the spelling; the file is left as it was
    const std::string before = slurp(d.file("base.h5"));
    for (const std::string& out : {std::string("base.h5"), std::string("./base.h5"), std::string("sub/../base.h5"),
                                   std::string("link.h5"), std::string("hard.h5")}) {
      r = run_in(d.path, "check --quiet --truth f64 --in base.h5 --force --out " + out);
      INFO(out << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, "--out '" + out + "' is the input file --in ('base.h5')"));
    }
    CHECK(slurp(d.file("base.h5")) == before);
    // --config is an input of every subcommand
    d.write("c.json", "{\"seed\": 3}");
    const std::string cbefore = slurp(d.file("c.json"));
    r = run_in(d.path, "parity --quick --config c.json --force --out sub/../c.json");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--out 'sub/../c.json' is the input file --config ('c.json')"));
    CHECK(slurp(d.file("c.json")) == cbefore);
  }
  {
    TempDir d;
    const std::string model = slurp("data/configs/kimi-linear-48b.json");
    REQUIRE(!model.empty());
    d.write("m.json", model);
    for (const std::string extra : {"", " --force"}) {
      const auto r = run_timed("info --config " + d.file("m.json") + " --out " + d.file("m.json") + extra);
      require_one_line_exit2(r);
      CHECK(has(r, "--out '" + d.file("m.json") + "' is the input file --config"));
      CHECK(slurp(d.file("m.json")) == model);
    }
    // another spelling of the same file
    const auto r = run_timed("info --config " + d.file("m.json") + " --out " + d.path.string() + "/./m.json --force");
    require_one_line_exit2(r);
    CHECK(has(r, "is the input file --config"));
    CHECK(slurp(d.file("m.json")) == model);
    CHECK(d.count() == 1);
  }
  {
    TempDir d;
    const std::string cfg = "{\"op\": \"kda-decode\", \"iters\": 3}";
    d.write("c.json", cfg);
    const auto r = run_timed("bench --config " + d.file("c.json") + " --out " + d.file("c.json") + " --force");
    require_one_line_exit2(r);
    CHECK(has(r, "--out '" + d.file("c.json") + "' is the input file --config"));
    CHECK(slurp(d.file("c.json")) == cfg);
    // --compare / --peer-json still refused the same way (the shared check)
    d.write("p.json", "{}");
    const auto p = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("p.json") + " --force");
    require_one_line_exit2(p);
    CHECK(has(p, "is the --peer-json file"));
    CHECK(slurp(d.file("p.json")) == "{}");
    // a good bench line still ends as this build allows (no false refusal)
    const auto ok = run_timed("bench --config " + d.file("c.json") + " --out " + d.file("out.h5"));
    INFO(ok.output);
    CHECK(bench_valid_exit(ok));
  }
}

TEST_CASE("a FIFO given as an input file is refused, never read (it blocked forever)", "[bench][check][info][config]") {
  TempDir d;
  const std::string fifo = d.file("f2");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  struct Case {
    std::string args, option;
  };
  for (const Case& c : {Case{"parity --config " + fifo + " --quick", "--config"},
                        Case{"info --config " + fifo, "--config"},
                        Case{"bench --peer-json " + fifo, "--peer-json"},
                        Case{"bench --compare " + fifo, "--compare"},
                        Case{"check --in " + fifo + " --out " + d.file("o.h5"), "--in"}}) {
    const auto r = run_timed(c.args);
    INFO(c.args);
    require_one_line_exit2(r);  // 124 would be the timeout: a hang
    CHECK(has(r, c.option + " '" + fifo + "' is not a regular file"));
  }
  // --in given through --config is checked too
  d.write("c.json", "{\"in\": \"" + fifo + "\"}");
  const auto r = run_timed("check --config " + d.file("c.json") + " --out " + d.file("o.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "--in '" + fifo + "' is not a regular file"));
  CHECK(is_fifo(fifo));
}

TEST_CASE("an error line quoting file content holds no raw non-printable bytes", "[bench]") {
  TempDir d;
  REQUIRE(run_timed("info --out " + d.file("a.h5")).code == 0);
  const auto r = run_timed("bench --peer-json " + d.file("a.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "--peer-json: '" + d.file("a.h5") + "' is not valid JSON"));
  CHECK(printable_ascii(r.output));
  // the escaping itself: invalid UTF-8 and control bytes as \xNN, valid UTF-8 (a name with ü) kept
  CHECK(kdalab::cli::printable("a\x89" "b") == "a\\x89b");
  CHECK(kdalab::cli::printable("x\ry\x1b\tz") == "x\\x0dy\\x1b\tz");  // a tab is kept
  CHECK(kdalab::cli::printable("f\xc3\xbcr.json") == "f\xc3\xbcr.json");
  CHECK(kdalab::cli::printable("\xe2\x82") == "\\xe2\\x82");  // truncated 3-byte sequence
  CHECK(kdalab::cli::printable("\xc0\xaf") == "\\xc0\\xaf");  // overlong '/'
}
