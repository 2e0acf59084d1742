// The root attribute `config` of a results file records the options' effective values: the ones
// --quick sets inside a subcommand and the ones read from a --config file, not the registered
// defaults (adversarial review find; experiments/cli.cpp Context::open_results).
#include <nlohmann/json.hpp>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab;
using namespace kdalab::testutil;

namespace {
nlohmann::json recorded(const std::string& file) { return nlohmann::json::parse(h5read::attr_string(file, "/", "config")); }
}  // namespace

TEST_CASE("results config records the values --quick and --config set, not the defaults") {
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
