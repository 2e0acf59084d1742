// --config files: a value really changes behaviour and the command line overrides it; the results file's root
// attribute `config` records the effective values (--quick's and the file's, not the defaults), so a run can be
// replayed; config values obey the command line's rules (strict JSON, one value where one is expected, no option
// injection, numbers checked as typed, a key twice refused); a model config given to an experiment is named as one;
// the shipped experiment configs never write a file scripts/run.sh writes, nor two of them one file.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "experiments/cli.hpp"
#include "experiments/results.hpp"
#include "reference/model_config.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("a config value really changes behaviour; the command line overrides it", "[config]") {
  TempDir d;
  d.write("c.json", R"({"d": [128], "n": [1000, 1000000], "quiet": true})");
  auto r = run_kdalab("decode-cost --config " + d.file("c.json") + " --out " + d.file("a.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  auto dcol = h5read::array(d.file("a.h5"), "decode_cost/analytic/d");
  auto ratio = h5read::array(d.file("a.h5"), "decode_cost/analytic/ratio_floor");
  REQUIRE(dcol.numel() == 2);
  CHECK(dcol.data[0] == 128);
  CHECK(ratio.data[1] == 15625);  // 256,000,000 / 16,384 (docs/design.md's decode table)
  // The command line wins over the file.
  r = run_kdalab("decode-cost --config " + d.file("c.json") + " --n 1000 --out " + d.file("b.h5"));
  REQUIRE(r.code == 0);
  CHECK(h5read::array(d.file("b.h5"), "decode_cost/analytic/n").numel() == 1);
  // The effective config is recorded.
  const std::string cfg = h5read::attr_string(d.file("b.h5"), "/", "config");
  CHECK(cfg.find("\"d\":\"128\"") != std::string::npos);
}

TEST_CASE("bad configs exit 2 and leave no file", "[config]") {
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

TEST_CASE("config values cannot inject options; strict JSON; one value where one is expected", "[config]") {
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

TEST_CASE("--config numbers are checked as typed (1e-400 is not 0, 99999999999999999999 not 1e+20)", "[config]") {
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

TEST_CASE("results config records the values --quick and --config set, not the defaults", "[config]") {
  TempDir d;
  // decode-cost: --min-time defaults to 0.05; --quick makes it 0.02 unless given
  auto r = run_kdalab("decode-cost --quiet --cpu-n 0 --gpu-n 0 --out " + d.file("plain.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(recorded(d.file("plain.h5")).at("min-time") == "0.05");
  r = run_kdalab("decode-cost --quick --quiet --cpu-n 0 --gpu-n 0 --out " + d.file("quick.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto q = recorded(d.file("quick.h5"));
  CHECK(q.at("min-time") == "0.02");
  CHECK(q.at("quick") == true);
  CHECK(!q.contains("force"));  // a replay never overwrites on its own
  // replaying a --force run's config without --force leaves the existing file alone (exit 2)
  r = run_kdalab("decode-cost --quick --quiet --force --cpu-n 0 --gpu-n 0 --out " + d.file("quick.h5"));
  REQUIRE(r.code == 0);
  d.write("replay.json", h5read::attr_string(d.file("quick.h5"), "/", "config"));
  r = run_kdalab("decode-cost --config " + d.file("replay.json"));
  INFO(r.output);
  CHECK(r.code == 2);
  // "force": true in a config file (older results files recorded it) is refused, never applied
  d.write("force.json", R"({"force": true})");
  r = run_kdalab("decode-cost --config " + d.file("force.json") + " --quick --quiet --cpu-n 0 --gpu-n 0 --out " +
                 d.file("quick.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("key 'force'") != std::string::npos);
  CHECK(q.at("cpu-n") == "0");
  // numbers keep every digit (CLI11 alone printed 1048576 as "1.04858e+06"), so a replay is exact
  CHECK(q.at("context").get<std::string>().find("1048576]") != std::string::npos);
  // a --config file's values (and the command line over them)
  d.write("c.json", R"({"min-time": 0.03, "cpu-d": 64, "quick": true})");
  r = run_kdalab("decode-cost --config " + d.file("c.json") + " --quiet --cpu-n 0 --gpu-n 0 --cpu-d 32 --out " +
                 d.file("cfg.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto c = recorded(d.file("cfg.h5"));
  CHECK(c.at("min-time") == "0.03");
  CHECK(c.at("cpu-d") == "32");
  CHECK(c.at("quick") == true);
}

// data/configs/{parity,recall,copy,decode_cost}.json write results/<experiment>_full.h5, never results/<experiment>.h5
// (scripts/run.sh's quick results): replaying a full-grid config must not meet the quick results.
TEST_CASE("no experiment config writes a file scripts/run.sh writes, and no two configs one file", "[config]") {
  std::set<std::string> quick;  // run.sh's --out "$results/NAME"
  const std::string run_sh = slurp("scripts/run.sh");
  const std::regex out_re("--out \"\\$results/([^\"]+)\"");
  for (std::sregex_iterator it(run_sh.begin(), run_sh.end(), out_re), end; it != end; ++it) quick.insert((*it)[1].str());
  REQUIRE(quick.size() >= 5);
  std::set<std::string> outs;
  int configs = 0;
  for (const auto& e : std::filesystem::directory_iterator("data/configs")) {
    const nlohmann::json j = nlohmann::json::parse(slurp(e.path().string()));
    if (!j.contains("out")) continue;  // model configs
    ++configs;
    const std::string out = j["out"];
    INFO(e.path().string() << ": out " << out);
    REQUIRE(out.rfind("results/", 0) == 0);
    CHECK(quick.count(out.substr(8)) == 0);
    CHECK(outs.insert(out).second);
  }
  CHECK(configs == 5);
}

TEST_CASE("a model config given to an experiment's --config is named as one", "[config]") {
  // `kdalab parity --config data/configs/kimi-k3.json`: the refusal says the file is a model config.json (not only
  // "unknown key '_comment'"), that `kdalab info --config` reads those, and what an options file is; exit 2, nothing
  // written.
  TempDir d;
  for (const std::string cmd : {"parity", "recall", "decode-cost"}) {
    const std::string out = d.file(cmd + ".h5");
    const RunResult r = run_kdalab(cmd + " --quick --config data/configs/kimi-k3.json --out " + out);
    INFO(cmd << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--config 'data/configs/kimi-k3.json': this is a model config.json (it has hidden_size or "
                 "num_hidden_layers), not a kdalab options file for '" + cmd + "'"));
    CHECK(has(r, "model configs are read by `kdalab info --config`"));
    CHECK(!std::filesystem::exists(out));
  }
  // an options file with a wrong key keeps the old message
  d.write("bad.json", "{\"T\": [17], \"no-such-option\": 1}");
  const RunResult r = run_kdalab("parity --quick --config " + d.file("bad.json") + " --out " + d.file("p.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "unknown key 'no-such-option' for 'parity'; accepted keys: "));
  CHECK(r.output.find("model config") == std::string::npos);
}

TEST_CASE("--config values obey the command line's rules; a key twice is refused", "[config]") {
  TempDir d;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"{\"power-a\": \" inf\"}", "--power-a: ' inf' is not accepted; give the number without surrounding whitespace"},
      {"{\"T\": [17], \"T\": [300]}", "key 'T' appears twice; give each key once"},  // the last one won silently
      {"{\"seed\": 5, \"seed\": 5}", "key 'seed' appears twice"},
      {"{\"T\": \"17,,300\"}", "--T: the list '17,,300' has an empty item"},
      {"{\"T\": [17, \"\"]}", "--T: the list '' has an empty item"},
      {"{\"softplus\": \"0x1\"}", "--softplus: '0x1' is not accepted; accepted: true, false, 1 or 0"},
  };
  int k = 0;
  for (const auto& [json, says] : cases) {
    const std::string name = fmt::format("c{}.json", ++k);
    d.write(name, json);
    const std::string sub = json.find("power-a") != std::string::npos ? "recall"
                            : json.find("softplus") != std::string::npos ? "decay-range"
                                                                          : "parity";
    const auto r = run_kdalab(sub + " --quick --quiet --config " + d.file(name) + " --out " + d.file(name + ".h5"));
    INFO(json << ": " << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(says) != std::string::npos);
    if (says.find("twice") != std::string::npos) CHECK(r.output.find("--config '" + d.file(name) + "'") != std::string::npos);
    CHECK(!std::filesystem::exists(d.file(name + ".h5")));
  }
}

TEST_CASE("a --config key or text value holding a NUL is named whole and refused before anything runs", "[config]") {
  TempDir d;
  // JSON's \u0000 is the one way a NUL reaches an option: a message quoting the value ended at the NUL, and an --out
  // "o\u0000x.h5" was checked as "o", so the run computed its whole grid before a cut message refused it
  d.write("out.json", "{\"out\": \"" + d.file("o") + "\\u0000x.h5\"}");
  auto r = run_timed("decode-cost --quick --config " + d.file("out.json"));
  require_one_line_exit2(r);
  CHECK(has(r, "key 'out' has the value '" + d.file("o") + "\\x00x.h5', which holds a NUL character"));
  CHECK(has(r, "accepted: text without it"));
  CHECK(!std::filesystem::exists(d.file("o")));
  d.write("seed.json", "{\"seed\": \"5\\u0000\"}");
  r = run_timed("decode-cost --quick --quiet --config " + d.file("seed.json") + " --out " + d.file("s.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "key 'seed' has the value '5\\x00', which holds a NUL character"));
  d.write("list.json", "{\"g-min\": [-3, \"-5\\u0000\"]}");
  r = run_timed("decay-range --quick --quiet --config " + d.file("list.json") + " --out " + d.file("l.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "key 'g-min' has the value '-5\\x00', which holds a NUL character"));
  d.write("key.json", "{\"se\\u0000ed\": 5}");
  r = run_timed("recall --quick --quiet --config " + d.file("key.json") + " --out " + d.file("k.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "unknown key 'se\\x00ed' for 'recall'; accepted keys: "));
  for (const char* f : {"s.h5", "l.h5", "k.h5"}) CHECK(!std::filesystem::exists(d.file(f)));
}
