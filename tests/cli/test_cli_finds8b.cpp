// The CLI breaker's finds of session 8, one test each (most serious first). The contract: bad input gets ONE line
// naming the option, the value and what is accepted, exit 2, before any other output, and nothing lost (no partial
// file, an existing file never overwritten without --force, never anything that is not a regular file).
// 1. info --config m.json --out m.json --force overwrote the model config it read (info skipped the --out-is-an-input
//    check);
// 2. bench --config c.json --out c.json --force exited 3 (no GPU) instead of 2 (bench compared --out with --compare
//    and --peer-json only);
// 3. --force replaced a FIFO or a device given as --out with a regular file;
// 4. a FIFO given as an input (--config, bench --peer-json, check --in, info --config) blocked forever;
// 5. a --config number below the smallest normal double (1e-400) was read as 0, and 99999999999999999999 as 1e+20;
// 6. --quick=banana said "give a value of type " (no type);
// 7. a very long --out path said "file system: filesystem error: status: File name too long";
// 8. info printed its banner before refusing a bad --out (existing without --force, missing folder);
// 9. bench --peer-json on an HDF5 file put raw non-UTF-8 bytes in the error line;
// 10. scripts/fig_decode_cost.py: NaN CPU times ended in a traceback; all-NaN / 0 / inf KDA times drew nothing while
//     the legend said "0 us" / "inf us"; one NaN among the KDA rows split the one measurement.
// Commands that could block run under `timeout` (exit 124 = a hang came back).
#include <sys/stat.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "experiments/cli.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

namespace {

/// `kdalab <args>` under `timeout 60`, so that a regression that blocks cannot hang the suite.
RunResult run_timed(const std::string& args) { return run_command("timeout 60 " + kdalab_bin() + " " + args); }

/// The one-line error shape: exit 2, one line on stderr+stdout together, starting "kdalab".
void require_one_line_exit2(const RunResult& r) {
  INFO(r.output);
  REQUIRE(r.code == 2);
  CHECK(r.output.rfind("kdalab", 0) == 0);
  CHECK(r.output.find('\n') == r.output.size() - 1);
}

/// Every byte of `s` is printable ASCII or a newline.
bool printable_ascii(const std::string& s) {
  for (const char ch : s) {
    const auto b = static_cast<unsigned char>(ch);
    if (b != '\n' && (b < 0x20 || b > 0x7e)) return false;
  }
  return true;
}

bool is_fifo(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}
}  // namespace

TEST_CASE("finds8b 1: info refuses an --out that is its --config, with --force too, before any output", "[cli]") {
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

TEST_CASE("finds8b 2: bench refuses an --out that is its --config with exit 2, before the no-GPU exit 3", "[cli]") {
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

TEST_CASE("finds8b 3: an --out that is a FIFO is never replaced, with --force too", "[cli]") {
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

TEST_CASE("finds8b 4: a FIFO given as an input file is refused, never read (it blocked forever)", "[cli]") {
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

TEST_CASE("finds8b 5: --config numbers are checked as typed (1e-400 is not 0, 99999999999999999999 not 1e+20)", "[cli]") {
  TempDir d;
  d.write("tiny.json", "{\"overlap\": 1e-400}");
  auto r = run_timed("recall --quick --quiet --config " + d.file("tiny.json") + " --out " + d.file("r.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "--overlap: '1e-400' is not accepted"));
  CHECK(has(r, "smallest normal double"));
  d.write("big.json", "{\"seed\": 99999999999999999999}");
  r = run_timed("recall --quick --quiet --config " + d.file("big.json") + " --out " + d.file("r.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "--seed: '99999999999999999999' is not accepted"));
  d.write("int.json", "{\"cpu-d\": 1e3}");  // an INT option given a float: named as typed, not "1000.0"
  r = run_timed("decode-cost --quick --quiet --config " + d.file("int.json") + " --out " + d.file("r.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "'1e3' is not accepted"));
  CHECK(!std::filesystem::exists(d.file("r.h5")));
  // ordinary numbers still read: a good float and an integer from --config are accepted (the file records them)
  d.write("ok.json", "{\"min-time\": 0.001, \"cpu-d\": 64, \"cpu-n\": [1024], \"n\": 1000, \"d\": 64, \"context\": 1024, "
                     "\"gpu-n\": 0}");
  r = run_timed("decode-cost --quiet --config " + d.file("ok.json") + " --out " + d.file("ok.h5"));
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(std::filesystem::is_regular_file(d.file("ok.h5")));
}

TEST_CASE("finds8b 6: a flag given a bad value says what a flag takes", "[cli]") {
  const auto r = run_timed("parity --quick=banana");
  require_one_line_exit2(r);
  CHECK(has(r, "--quick: 'banana' is not accepted; give true, false, 1 or 0"));
  CHECK(!has(r, "of type \n"));
}

TEST_CASE("finds8b 7: a too long --out path is named as --out with what is accepted", "[cli]") {
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

TEST_CASE("finds8b 8: info refuses a bad --out before printing anything", "[cli]") {
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

TEST_CASE("finds8b 9: an error line quoting file content holds no raw non-printable bytes", "[cli]") {
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


TEST_CASE("finds8b 10: fig_decode_cost draws no line for non-finite or non-positive times and says so", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("dc.h5");
  make_small_decode_cost(h5);
  // Sets seconds_per_token: `softmax` and `kda` are python expressions for the value of row i of that impl.
  const auto draw = [&](const std::string& name, const std::string& softmax, const std::string& kda) {
    const std::string h = d.file(name + ".h5");
    std::filesystem::copy_file(h5, h);
    const auto py = run_command(std::string(kPy) + " -c \"import h5py, numpy as np\n"
                                "f = h5py.File('" + h + "', 'a')\n"
                                "impl = [x.decode() if isinstance(x, bytes) else x for x in f['decode_cost/cpu/impl'][:]]\n"
                                "s = f['decode_cost/cpu/seconds_per_token']\n"
                                "v = s[:]\n"
                                "ks = [i for i, x in enumerate(impl) if x == 'kda']\n"
                                "ss = [i for i, x in enumerate(impl) if x == 'softmax']\n"
                                "for j, i in enumerate(ss): v[i] = " + softmax + "\n"
                                "for j, i in enumerate(ks): v[i] = " + kda + "\n"
                                "s[...] = v\n\"");
    INFO(py.output);
    REQUIRE(py.code == 0);
    const std::string dump = d.file(name + ".json");
    const auto fr = run_command(std::string(kPy) + " scripts/fig_decode_cost.py " + h + " --dump " + dump);
    INFO(name << ": " << fr.output);
    REQUIRE(fr.code == 0);
    CHECK(!has(fr, "Traceback"));
    return json::parse(slurp(dump));
  };
  const auto kda_lines = [](const json& ax) {
    json out = json::array();
    for (const auto& ln : ax["lines"])
      if (ln["label"].get<std::string>().rfind("CPU reference, float32: KDA step", 0) == 0) out.push_back(ln);
    return out;
  };
  const auto note = [](const json& ax) {
    std::string all;
    for (const auto& t : ax["texts"]) all += t.get<std::string>() + " ";
    for (auto& ch : all)
      if (ch == '\n') ch = ' ';
    return all;
  };
  {  // every CPU row NaN: exit 0, nothing drawn in the CPU panel, a note says why
    const json j = draw("allnan", "np.nan", "np.nan");
    const json& ax = j["axes"][1];
    INFO(ax.dump());
    CHECK(ax["lines"].size() == 0);
    CHECK(has(RunResult{0, note(ax)}, "CPU KDA step: 3 of 3 rows have no finite time > 0"));
    CHECK(has(RunResult{0, note(ax)}, "CPU softmax read: 3 of 3 rows"));
  }
  for (const std::string bad : {"0.0", "np.inf", "-1.0"}) {  // every KDA time 0, inf or negative: no "0 us" / "inf us"
    const json j = draw("kda" + std::to_string(bad.size()), "1e-6 * (j + 1)", bad);
    const json& ax = j["axes"][1];
    INFO(bad << " " << ax.dump());
    CHECK(kda_lines(ax).size() == 0);
    for (const auto& l : ax["legend"]) CHECK(l.get<std::string>().find("one measurement") == std::string::npos);
    CHECK(has(RunResult{0, note(ax)}, "CPU KDA step: 3 of 3 rows have no finite time > 0"));
    int softmax = 0;
    for (const auto& ln : ax["lines"]) softmax += ln["label"].get<std::string>().rfind("CPU reference, float32: softmax", 0) == 0;
    CHECK(softmax == 1);
  }
  {  // one NaN among the KDA rows: the two finite equal rows are the one measurement
    const json j = draw("onenan", "1e-6 * (j + 1)", "np.nan if j == 1 else 2e-6");
    const json& ax = j["axes"][1];
    INFO(ax.dump());
    const json k = kda_lines(ax);
    REQUIRE(k.size() == 1);
    CHECK(k[0]["label"].get<std::string>().find("one measurement, 2 µs") != std::string::npos);
    CHECK(k[0]["marker"] == "None");
    CHECK(k[0]["x"].size() == 2);
    CHECK(k[0]["x"][0].get<double>() == 1024.0);
    CHECK(k[0]["x"][1].get<double>() == 4096.0);
    CHECK(has(RunResult{0, note(ax)}, "CPU KDA step: 1 of 3 rows have no finite time > 0"));
  }
}
