// The CLI's leftover rough edges of the session-7 review, one TEST_CASE per find: bench --compare / --peer-json
// split on commas like every list option, files compared by identity (a repeat, --out being an input), a flag given
// twice refused, a FLOAT that underflows refused quoting the text as given, --help winning over a bad value, and
// check's order of checks (options, --in, --out) through cli::run's one mechanism (Command::check / inputs).
// Each case runs the kdalab binary (KDALAB_BIN) on files it writes into a temp folder.
#include <filesystem>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;
namespace fs = std::filesystem;

namespace {

const std::string kTiny = "bench --op kda-prefill --shapes 1:16:1 --iters 1 --warmup 0";
const std::string kKda = "data/baselines/h200-kda.h5";
const std::string kMla = "data/baselines/h200-mla.h5";

/// `kdalab <args>` run inside folder `dir` (for relative spellings of one file).
RunResult run_in(const fs::path& dir, const std::string& args) {
  return run_command("cd " + dir.string() + " && " + fs::absolute(kdalab_bin()).string() + " " + args);
}

/// How many times `s` occurs in `text`.
std::size_t count(const std::string& text, const std::string& s) {
  std::size_t n = 0;
  for (auto p = text.find(s); p != std::string::npos; p = text.find(s, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("bench --compare and --peer-json split on commas like every list option", "[cli][bench]") {
  TempDir d;
  d.write("p1.json", "{\"kda-prefill B=1 T=16 H=1 HV=1\": 1.5}");
  d.write("p2.json", "{\"kda-prefill B=2 T=16 H=1 HV=1\": 2.5}");
  // two valid files in one value: checked, then a build without a GPU says it cannot run (exit 3)
  auto r = run_kdalab(kTiny + " --compare " + kKda + "," + kMla + " --peer-json " + d.file("p1.json") + "," +
                      d.file("p2.json") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
  // a build without the kernels (or without a GPU) measures nothing; a GPU build measures, compares with both files
  // and writes b.h5 (the later runs use other --out names)
  if (r.code == 3) CHECK(has(r, "nothing was measured, compared or written"));
  else CHECK(has(r, "bench --compare: "));
  const std::size_t written = r.code == 0 ? 1 : 0;
  // a missing file in a comma list is named alone, exit 2, before the build's exit 3
  r = run_kdalab(kTiny + " --compare " + kKda + "," + d.file("none.h5") + " --out " + d.file("b1.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--compare: '" + d.file("none.h5") + "'"));
  CHECK_FALSE(has(r, kKda + ","));
  r = run_kdalab(kTiny + " --peer-json " + d.file("p1.json") + "," + d.file("none.json") + " --out " + d.file("b1.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--peer-json: cannot open '" + d.file("none.json") + "'"));
  // an empty item is refused as in every list option
  r = run_kdalab(kTiny + " --compare " + kKda + ", --out " + d.file("b1.h5"));
  CHECK(r.code == 2);
  CHECK(has(r, "--compare: the list '" + kKda + ",' has an empty item"));
  // --config: one string holding two files is two files too
  d.write("c.json", "{\"compare\": \"" + kKda + "," + kMla + "\"}");
  r = run_kdalab(kTiny + " --config " + d.file("c.json") + " --out " + d.file("b2.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
  // p1.json, p2.json, c.json, and b.h5 / b2.h5 only where a GPU ran them; the refused runs wrote nothing (no b1.h5)
  CHECK(d.count() == 3 + written + (r.code == 0 ? 1 : 0));
  CHECK_FALSE(fs::exists(d.file("b1.h5")));
  // --help says so for both options
  r = run_kdalab("bench --help");
  CHECK(r.code == 0);
  CHECK(count(r.output, "comma-separated like every list option") == 2);
}

TEST_CASE("one file by two paths: a repeat in --compare / --peer-json, and --out never an input (--in, --config)",
          "[cli][bench][check]") {
  TempDir d;
  fs::copy_file(kKda, d.file("base.h5"));
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
  r = run_in(d.path, kTiny + " --compare base.h5," + fs::absolute(kMla).string() + " --out b.h5");
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

TEST_CASE("a flag given twice is refused like any non-list option given twice", "[cli]") {
  TempDir d;
  for (const std::string& args : {std::string("info --quick --quick"), std::string("info --quiet --quiet"),
                                  std::string("parity --force --seed 3 --force"),
                                  kTiny + " --variants --variants"}) {
    const auto r = run_kdalab(args + " --out " + d.file("x.h5"));
    INFO(args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, ": the option is given more than once ('--"));
    CHECK(has(r, "'); give it once"));
  }
  const auto r = run_kdalab("info --quick --quiet");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(d.count() == 0);
}

TEST_CASE("a FLOAT that underflows (to 0 or a denormal) is refused, quoting the text as given", "[cli]") {
  for (const std::string& v : {std::string("1e-400"), std::string("-1e-400"), std::string("1e-310"),
                               std::string("0.00001e-305")}) {
    const auto r = run_kdalab("decode-cost --quick --min-time " + v + " --out /nonexistent/x.h5");
    INFO(v << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--min-time: '" + v + "' is not accepted: it is below the smallest normal double"));
    CHECK_FALSE(has(r, "--min-time: 0 "));
  }
  // 0 and the smallest normal double go through the parser to the subcommand's own check (here: --op first)
  for (const std::string& v : {std::string("0"), std::string("0e-500"), std::string("2.2250738585072014e-308")}) {
    const auto r = run_kdalab("check --tol " + v + " --op bogus --in none.h5");
    INFO(v << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--op 'bogus' is unknown"));
  }
}

TEST_CASE("--help anywhere after the subcommand prints the help and exits 0, whatever else the line holds", "[cli]") {
  const auto plain = run_kdalab("parity --help");
  REQUIRE(plain.code == 0);
  REQUIRE(has(plain, "--T"));
  for (const std::string& args : {std::string("parity --T ,, --help"), std::string("parity --help --T ,,"),
                                  std::string("parity --quick --quick -h"), std::string("parity --T abc --help"),
                                  std::string("parity --seed 1 --seed 2 --help"), std::string("parity --g-min 1e-400 --help")}) {
    const auto r = run_kdalab(args);
    INFO(args << "\n" << r.output);
    CHECK(r.code == 0);
    CHECK(r.output == plain.output);
  }
  const auto bench = run_kdalab("bench --compare a.h5,, --help");
  CHECK(bench.code == 0);
  CHECK(bench.output == run_kdalab("bench --help").output);
}

TEST_CASE("check: options, then --in, then --out, through cli::run's one order (Command::check, inputs)", "[cli][check]") {
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
