// The root attribute `config` records the values the run used, and feeding it back with --config writes the same
// tables bit for bit (measured timings aside): for every experiment subcommand. Boolean flags take exactly the
// spellings --help lists; --seed takes the range --help states.
#include <H5Cpp.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/faults/faults_util.hpp"

using namespace kdalab::faults;
namespace h5read = kdalab::h5read;

namespace {
nlohmann::json recorded(const std::string& file) { return nlohmann::json::parse(h5read::attr_string(file, "/", "config")); }

/// Every dataset path of the file (depth first, in name order).
void datasets(H5::Group g, const std::string& prefix, std::vector<std::string>& out) {
  for (hsize_t i = 0; i < g.getNumObjs(); ++i) {
    const std::string name = g.getObjnameByIdx(i);
    const std::string path = prefix + "/" + name;
    if (g.childObjType(name) == H5O_TYPE_GROUP) datasets(g.openGroup(name), path, out);
    else out.push_back(path);
  }
}
std::vector<std::string> datasets(const std::string& file) {
  H5::H5File f(file, H5F_ACC_RDONLY);
  std::vector<std::string> out;
  datasets(f.openGroup("/"), "", out);
  return out;
}

/// A measured time or rate: differs from run to run by nature.
bool measured(const std::string& file, const std::string& ds) {
  const std::string units = h5read::has_attr(file, ds, "units") ? h5read::attr_string(file, ds, "units") : "";
  return units == "s" || units == "B/s" || units == "FLOP/s" || units == "ns" || units == "ms" ||
         ds.find("time") != std::string::npos;
}

bool same_dataset(const std::string& a, const std::string& b, const std::string& ds) {
  H5::H5File fa(a, H5F_ACC_RDONLY);
  if (fa.openDataSet(ds).getTypeClass() == H5T_STRING) return h5read::strings(a, ds) == h5read::strings(b, ds);
  const auto x = h5read::array(a, ds), y = h5read::array(b, ds);
  return x.shape == y.shape && std::memcmp(x.data.data(), y.data.data(), x.data.size() * sizeof(double)) == 0;
}

/// The config with each value as the command line takes it: a list as "a,b,c" whether it was recorded as a JSON
/// array (given) or as its default's text "[a,b,c]" (not given); "out" left out (a replay writes another file).
nlohmann::json as_given(nlohmann::json c) {
  c.erase("out");
  for (auto& [k, v] : c.items()) {
    if (v.is_array()) {
      std::string s;
      for (const auto& x : v) {
        if (!s.empty()) s += ',';
        s += x.get<std::string>();
      }
      v = s;
    } else if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (s.size() >= 2 && s.front() == '[' && s.back() == ']') v = std::string(s.begin() + 1, s.end() - 1);
    }
  }
  return c;
}

Result kdalab_run(const std::vector<std::string>& args, const TempDir& logs) { return run(args, {}, logs.file("log")); }
}  // namespace

TEST_CASE("replaying a results file's config writes the same tables bit for bit", "[faults][parity][recall][copy][decay-range][decode-cost]") {
  H5::Exception::dontPrint();
  // The quick grids with smaller sizes where the quick run takes seconds (head dimensions, state sizes, string
  // lengths): the same tables and config keys in a tenth of the time; a size given on the command line is recorded
  // as given, the other options as their quick defaults, and both kinds must replay.
  const std::vector<std::vector<std::string>> runs{
      {"parity", "--quick", "--dk", "16", "--dv", "16"},
      {"recall", "--quick", "--d-k", "16,32"},
      {"copy", "--quick", "--d-k", "16,32", "--L", "4,8,16,32"},
      {"decay-range", "--quick"},
      {"decode-cost", "--quick", "--gpu-n", "0"},
  };
  for (const auto& base : runs) {
    TempDir d, logs;
    INFO(base.front());
    auto first = base;
    for (const char* a : {"--quiet", "--seed", "7", "--out"}) first.push_back(a);
    first.push_back(d.file("a.h5"));
    Result r = kdalab_run(first, logs);
    INFO(r.output);
    REQUIRE(r.code == 0);
    put(d.file("c.json"), h5read::attr_string(d.file("a.h5"), "/", "config"));
    r = kdalab_run({base.front(), "--config", d.file("c.json"), "--out", d.file("b.h5")}, logs);
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK(as_given(recorded(d.file("a.h5"))) == as_given(recorded(d.file("b.h5"))));
    const auto names = datasets(d.file("a.h5"));
    CHECK(names == datasets(d.file("b.h5")));
    CHECK(!names.empty());
    for (const auto& ds : names) {
      if (measured(d.file("a.h5"), ds)) continue;
      INFO(ds);
      CHECK(same_dataset(d.file("a.h5"), d.file("b.h5"), ds));
    }
  }
}

TEST_CASE("a flag given as false records false and runs the full mode", "[faults][decode-cost]") {
  TempDir d, logs;
  for (const char* v : {"false", "0"}) {
    const std::string out = d.file(std::string("q") + v + ".h5");
    const Result r = kdalab_run({"decode-cost", std::string("--quick=") + v, std::string("--quiet=") + v, "--cpu-n", "0",
                                 "--gpu-n", "0", "--out", out}, logs);
    INFO(v << ": " << r.output);
    REQUIRE(r.code == 0);
    const auto c = recorded(out);
    CHECK(c.at("quick") == false);
    CHECK(c.at("quiet") == false);
    CHECK(c.at("min-time") == "0.05");  // the full mode's value (--quick: 0.02)
  }
  for (const char* v : {"true", "1"}) {
    const std::string out = d.file(std::string("t") + v + ".h5");
    const Result r = kdalab_run({"decode-cost", std::string("--quick=") + v, "--quiet", "--cpu-n", "0", "--gpu-n", "0",
                                 "--out", out}, logs);
    INFO(v << ": " << r.output);
    REQUIRE(r.code == 0);
    CHECK(recorded(out).at("quick") == true);
    CHECK(recorded(out).at("min-time") == "0.02");
  }
}

TEST_CASE("a flag takes only the spellings --help lists", "[faults][parity]") {
  TempDir d, logs;
  for (const char* v : {"no", "off", "yes", "on", "", "2"}) {
    const Result r = kdalab_run({"parity", std::string("--quick=") + v, "--out", d.file("p.h5")}, logs);
    INFO("--quick=" << v << ": " << r.output);
    CHECK(r.code == 2);
    CHECK(r.has("--quick: '" + std::string(v) + "' is not accepted; give true, false, 1 or 0"));
  }
  CHECK(!fs::exists(d.file("p.h5")));
}

TEST_CASE("--seed takes every integer in [0, 2^64 - 1], the range --help states, and refuses others saying so", "[faults][info]") {
  TempDir d, logs;
  Result r = kdalab_run({"parity", "--help"}, logs);
  CHECK(r.has("[0, 2^64 - 1]"));
  for (const char* s : {"0", "9223372036854775808", "18446744073709551615"}) {
    const std::string out = d.file(std::string("s") + s + ".h5");
    r = kdalab_run({"info", "--seed", s, "--out", out}, logs);
    INFO(s << ": " << r.output);
    REQUIRE(r.code == 0);
    CHECK(h5read::attr_string(out, "/", "seed") == s);
  }
  for (const char* s : {"18446744073709551616", "-1", "99999999999999999999999"}) {
    r = kdalab_run({"info", "--seed", s, "--out", d.file("x.h5")}, logs);
    INFO(s << ": " << r.output);
    CHECK(r.code == 2);
    CHECK(r.has("give an integer in [0, 2^64 - 1]"));
  }
}

TEST_CASE("--T is refused with the range --help states, in a form the option takes", "[faults][parity][decay-range]") {
  TempDir d, logs;
  for (const auto& [sub, range] : std::vector<std::pair<std::string, std::string>>{
           {"parity", "[1, 1000000000000]"}, {"decay-range", "[1, 1000000]"}}) {
    Result r = kdalab_run({sub, "--help"}, logs);
    INFO(sub << " --help: " << r.output);
    CHECK(r.has("in " + range));
    r = kdalab_run({sub, "--T", "0", "--out", d.file("x.h5")}, logs);
    INFO(sub << " --T 0: " << r.output);
    CHECK(r.code == 2);
    CHECK(r.has("--T: 0 is not accepted; give " + std::string(sub == "parity" ? "integers" : "an integer") + " in " + range));
  }
  CHECK(!fs::exists(d.file("x.h5")));
}
