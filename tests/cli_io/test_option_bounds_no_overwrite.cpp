// Finds of the adversarial review of the experiments, golden and check, each turned into a test:
// values that overflowed, never finished or crashed now exit 2 with a message naming the option; parity refuses a
// repeated list value and its messages name the option, the value and what is accepted; decode-cost --cpu-n gives the
// range message alone when the range fails (it cited a cache size, negative for n = -1).
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

TEST_CASE("decode-cost --cpu-n: the range message alone when the range fails, never a cache size") {
  TempDir d;
  const auto ok = run_kdalab("decode-cost --cpu-n 1024 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 --context 1024 "
                             "--gpu-n 0 --quiet --out " + d.file("ok.h5"));
  INFO(ok.output);
  REQUIRE(ok.code == 0);
  // was "would take 0.00745 GiB" for 1000001 x 1 (the range failed, not the size) and a negative GiB for -1
  for (const auto& [n, dd] : std::vector<std::pair<double, int>>{
           {2000000, 512}, {2000000, 128}, {999999.5, 16}, {1000001, 1}, {-1, 64}, {-1e300, 64}}) {
    const auto r = run_kdalab(fmt::format("decode-cost --quick --quiet --cpu-n {} --cpu-d {} --out {}", n, dd, d.file("x.h5")));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(fmt::format("--cpu-n: {} is not accepted; accepted: integers n in [0, 1e6]", n)) != std::string::npos);
    CHECK(r.output.find("GiB") == std::string::npos);
    CHECK(r.output.find("would take") == std::string::npos);
  }
  CHECK(d.count() == 1);  // ok.h5 only
}

TEST_CASE("parity refuses a repeated value in any list option (exit 2, the option and the value, no file)") {
  TempDir d;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"--C 64,64,16", "--C: 64 is given more than once"},
      {"--impl float64,float64", "--impl: float64 is given more than once"},
      {"--gate softplus,softplus", "--gate: softplus is given more than once"},
      {"--beta one,sigmoid,one", "--beta: one is given more than once"},
      {"--T 17,33,17", "--T: 17 is given more than once"},
      {"--B 1,1", "--B: 1 is given more than once"},
      {"--H 2,2", "--H: 2 is given more than once"},
      {"--dk 16,16", "--dk: 16 is given more than once"},
      {"--dv 16,16", "--dv: 16 is given more than once"},
      {"--g-min -5,-5", "--g-min: -5 is given more than once"},
      {"--state-precision fp32,fp32", "--state-precision: fp32 is given more than once"},
      {"--matmul-precision plan,bf16,plan", "--matmul-precision: plan is given more than once"},
  };
  int k = 0;
  for (const auto& [opt, says] : cases) {  // each its own --out: a file left by one case cannot fail the next
    const auto r = run_kdalab("parity --quick --quiet --T 17 --dk 16 --dv 16 " + opt + " --out " +
                              d.file(fmt::format("p{}.h5", ++k)));
    INFO(opt << ": " << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(says) != std::string::npos);
  }
  CHECK(d.count() == 0);
}

TEST_CASE("parity messages name the option, the value and what is accepted") {
  TempDir d;
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      // was "tensor 'g' has a non-finite value": the gate overflowed float32 inside the run
      {"--g-min -1e39 --impl float32",
       {"--g-min: -1e+39 is not accepted with --impl float32", "3.40282e+38", "<= g_min < 0"}},
      {"--g-min -1e39 --impl float64,float32-chunk", {"--g-min: -1e+39 is not accepted with --impl float32"}},
      // was "... accepted: bf16, fp16, tf32, fp32, fp64": fp64 is refused, plan was missing
      {"--matmul-precision PLAN", {"--matmul-precision: 'PLAN' is not accepted; accepted: plan, bf16, fp16, tf32, fp32\n"}},
      {"--matmul-precision fp64", {"--matmul-precision: 'fp64' is not a tensor-core format; accepted: plan, bf16, fp16, "
                                   "tf32, fp32\n"}},
      {"--state-precision fp16", {"--state-precision: 'fp16' is not accepted; accepted: fp32, bf16\n"}},
      {"--state-precision x", {"--state-precision: 'x' is not accepted; accepted: fp32, bf16\n"}},
      // was "give integers >= 1" without the cap
      {"--C 1e13", {"--C: 10000000000000 is not accepted; give integers in [1, 1e12]"}},
      {"--T 0", {"--T: 0 is not accepted; give integers in [1, 1e12]"}},
  };
  int k = 0;
  for (const auto& [opt, says] : cases) {  // each its own --out: a file left by one case cannot fail the next
    const auto r = run_kdalab("parity --quick --quiet --T 17 --dk 16 --dv 16 " + opt + " --out " +
                              d.file(fmt::format("p{}.h5", ++k)));
    INFO(opt << ": " << r.output);
    CHECK(r.code == 2);
    for (const auto& s : says) CHECK(r.output.find(s) != std::string::npos);  // "...\n": the list ends the message
    CHECK(r.output.find("non-finite") == std::string::npos);
  }
  CHECK(d.count() == 0);
  // the float64 implementations compute g in float64: the same g_min runs there (with float32 it read "tensor 'g'
  // has a non-finite value")
  const auto ok = run_kdalab("parity --quick --quiet --T 17 --dk 16 --dv 16 --g-min -1e39 --gate bounded --beta one "
                             "--impl float64 --out " + d.file("p.h5"));
  INFO(ok.output);
  CHECK(ok.code == 0);
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
