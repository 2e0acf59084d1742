// Finds of the adversarial review of the experiments, golden and check, each turned into a test:
// values that overflowed, never finished or crashed now exit 2 with a message naming the option.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <string>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli_io/cli_util.hpp"

using namespace kdalab::testutil;

TEST_CASE("out-of-range experiment options exit 2 naming the option, with no file") {
  TempDir d;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"decode-cost --quick --n 1e30", "--n"},
      {"decode-cost --quick --context 1e300", "--context"},
      {"decode-cost --quick --memory-gb 1e300", "--memory-gb"},
      {"decode-cost --quick --bandwidth-gbs 1e-300", "--bandwidth-gbs"},
      {"decode-cost --quick --cpu-n 2000000 --cpu-d 512", "--cpu-n"},  // 1e6 x 512 fits: 3.8 GiB of float32
      {"recall --quick --trials 1e9", "--trials"},
      {"recall --quick --decay-bias-hi 1e300", "--decay-bias"},
      {"recall --quick --softmax-scale 1e300", "--softmax-scale"},
      {"recall --quick --span 1e9", "--span"},
      {"copy --quick --L 1000000", "--L"},
      {"copy --quick --decay-bias-lo -1e300", "--decay-bias"},
  };
  for (const auto& [args, needle] : cases) {
    const auto r = run_kdalab(args + " --quiet --out " + d.file("x.h5"));
    INFO(args << ": " << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(needle) != std::string::npos);
  }
  CHECK(d.count() == 0);
}

TEST_CASE("decode-cost: a --cpu-n whose CPU softmax cache is too large exits 2; the bytes follow the cache's type") {
  TempDir d;
  // the element type the CPU decode step runs in, as decode-cost prints it ("one head, d = 64, float32, one core")
  const auto ok = run_kdalab("decode-cost --cpu-n 1024 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 --context 1024 "
                             "--gpu-n 0 --quiet --out " + d.file("ok.h5"));
  INFO(ok.output);
  REQUIRE(ok.code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(ok.output, m, std::regex(R"(one head, d = 64, (float32|float64), one core)")));
  const int bytes = m[1].str() == "float32" ? 4 : 8;
  for (const auto& [n, dd] : std::vector<std::pair<double, int>>{{2000000, 512}, {2000000, 128}, {999999.5, 16}}) {
    const auto r = run_kdalab(fmt::format("decode-cost --quick --quiet --cpu-n {} --cpu-d {} --out {}", n, dd, d.file("x.h5")));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(fmt::format("--cpu-n: {} with --cpu-d {} is not accepted", n, dd)) != std::string::npos);
    CHECK(r.output.find(fmt::format("accepted: integers n in [0, 1e6] with 2 n d x {} B <= 4 GiB", bytes)) != std::string::npos);
    std::smatch g;
    REQUIRE(std::regex_search(r.output, g, std::regex(R"(its softmax cache, 2 n d x (\d+) B, would take ([0-9.e+]+) GiB)")));
    CHECK(std::stoi(g[1].str()) == bytes);  // was "x 8 B" for a float32 cache: twice the bytes it holds
    const double gib = 2.0 * n * dd * bytes / 1073741824.0;
    CHECK(std::fabs(std::stod(g[2].str()) - gib) <= 0.005 * gib);
  }
  CHECK(d.count() == 1);  // ok.h5 only
}

TEST_CASE("golden --regen never replaces fixtures without --force; check never overwrites its input") {
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
