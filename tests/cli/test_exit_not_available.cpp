// Exit 3 = "cannot run here": bench with valid options, check --kernel and parity --impl cuda-bf16 in a build without
// the CUDA kernels or without a GPU exit 3 (never 0, so a GPU-less CI gate cannot pass vacuously), before any
// expensive work; a CUDA build with a GPU runs them.
#include <H5Cpp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;

TEST_CASE("bench: valid options in a build that cannot run the benchmark: exit 3, never 0, --compare included",
          "[bench]") {
  TempDir d;
  const std::string tiny = "bench --op kda-prefill --shapes 1:16:1 --iters 1 --warmup 0";
  for (const std::string& extra :
       {std::string(), std::string(" --compare data/baselines/h200.h5"),
        std::string(" --quick --force")}) {
    const auto r = run_kdalab(tiny + extra + " --out " + d.file("b.h5"));
    INFO(extra << "\n" << r.output);
    CHECK(bench_valid_exit(r));
#ifndef KDALAB_HAVE_CUDA
    CHECK(r.code == 3);
    CHECK(has(r, "--preset cuda"));
    CHECK(has(r, extra.find("--compare") != std::string::npos ? "nothing was measured, compared or written"
                                                               : "nothing was measured or written"));
    CHECK(d.count() == 0);
#endif
    std::filesystem::remove(d.file("b.h5"));  // a GPU run wrote it
  }
#ifndef KDALAB_HAVE_CUDA
  // --op all with its default shapes and a --config: the same refusal
  d.write("c.json", R"({"op": "all", "iters": 2, "compare": ["data/baselines/h200.h5"]})");
  const auto r = run_kdalab("bench --config " + d.file("c.json") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 3);
  CHECK(d.count() == 1);  // c.json only
#endif
}

TEST_CASE("exit 3 = not available here: check --kernel and parity --impl cuda-bf16 without CUDA kernels or a GPU, at once",
          "[check][parity]") {
  {
    TempDir d;
    write_kernel_input(d.file("in.h5"));
    auto r = run_kdalab("check --op kda --kernel --in " + d.file("in.h5") + " --out " + d.file("r.h5"));
    INFO(r.output);
  #ifndef KDALAB_HAVE_CUDA
    CHECK(r.code == 3);
    CHECK(has(r, "not available in this build"));
    CHECK(has(r, "--preset cuda"));
    CHECK(!fs::exists(d.file("r.h5")));
  #else
    // with a GPU the kernel runs (0 pass or 1 fail: the verdict is not what this case is about); without one: exit 3
    CHECK((r.code == 0 || r.code == 1 || (r.code == 3 && has(r, "no GPU visible"))));
    if (r.code == 3) CHECK(!fs::exists(d.file("r.h5")));
    if (r.code != 3) CHECK(has(r, "o_kdalab"));
    fs::remove(d.file("r.h5"));
  #endif
    // input the kernel does not take is bad input (exit 2) in every build, before the build is looked at
    write_kernel_input(d.file("in2.h5"), false);
    r = run_kdalab("check --op kda --kernel --in " + d.file("in2.h5") + " --out " + d.file("r.h5"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "gate = \"k3\""));
    CHECK(!fs::exists(d.file("r.h5")));
    // check --help names exit 3
    r = run_kdalab("check --help");
    CHECK(has(r, "3 --kernel without"));
    // parity with only the CUDA implementation, where it cannot run: exit 3, nothing written
    r = run_kdalab("parity --impl cuda-bf16 --B 1 --T 16 --H 1 --dk 128 --dv 128 --C 16 --truth f64 --quiet --out " +
                   d.file("p.h5"));
    INFO(r.output);
  #ifndef KDALAB_HAVE_CUDA
    CHECK(r.code == 3);
    CHECK(has(r, "not available in this build / on this machine"));
    CHECK(!fs::exists(d.file("p.h5")));
  #else
    CHECK((r.code == 0 || r.code == 3));
  #endif
  }
  {
    if (!has(run_kdalab("info"), "GPUs:          0")) {
      WARN("a GPU is visible: the cuda-bf16 rows run here, nothing to test");
      return;
    }
    const TempDir d;
    // one point whose mp50 truth takes tens of seconds (~15 s at T = 300 on a loaded 2-core machine)
    const auto t0 = std::chrono::steady_clock::now();
    const RunResult r = run_kdalab("parity --impl cuda-bf16 --T 600 --gate bounded --beta sigmoid --truth mp --out " +
                                   d.file("p.h5"));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(r.output << "\n" << s << " s");
    CHECK(r.code == 3);
    CHECK(has(r, "kdalab parity: not available in this build / on this machine: no implementation produced a row "
                 "(cuda-bf16 rows skipped: no GPU ("));
    CHECK(!has(r, "parity: 100.0%"));  // no point was run
    CHECK(s < 5.0);
    CHECK(!std::filesystem::exists(d.file("p.h5")));
  }
}
