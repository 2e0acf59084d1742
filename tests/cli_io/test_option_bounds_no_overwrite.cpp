// Finds of the adversarial review of the experiments, golden and check, each turned into a test:
// values that overflowed, never finished or crashed now exit 2 with a message naming the option.
#include <filesystem>

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
      {"decode-cost --quick --cpu-n 1000000 --cpu-d 512", "--cpu-n"},
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
