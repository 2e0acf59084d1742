// `kdalab parity`: the quick sweep writes its table and summary; bad configs exit 2 and write no file.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "experiments/results.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab;
namespace fs = std::filesystem;

namespace {
struct Run {
  int rc;
  std::string out;
};
// The shared runner (tests/cli/cli_util.hpp), adapted to this file's field names.
Run run(const std::string& args) {
  const auto r = testutil::run_kdalab(args);
  return {r.code, r.output};
}
fs::path tmpdir() {
  const fs::path d = fs::temp_directory_path() / ("kdalab_test_parity_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}
void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }
}  // namespace

TEST_CASE("parity --quick writes the table, the summary and which truth each row used") {
  const fs::path d = tmpdir();
  const std::string out = (d / "quick.h5").string();
  const auto t0 = std::chrono::steady_clock::now();
  const Run r = run("parity --quick --out " + out);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(secs < 60.0);
  CHECK(r.out.find("o median rRMS") != std::string::npos);  // the summary table is printed
  CHECK(r.out.find("twin-bf16") != std::string::npos);
  // without the CUDA kernels or a GPU: a note and no cuda-bf16 rows; with them (the H200 machine): the rows
  // (this check assumed no GPU and failed there, session 5's first cli_io run on the GPU machine)
  const bool cuda_rows = std::regex_search(r.out, std::regex(R"(cuda-bf16 +(fp32|bf16) +)"));  // a table row
  CHECK(cuda_rows != (r.out.find("cuda-bf16 rows skipped") != std::string::npos));
  // float32 chunked refuses softplus gates whose factored span exceeds 80 nats: a note, no row
  CHECK(r.out.find("float32-chunk C=16 skipped") != std::string::npos);
  const auto impl = h5read::strings(out, "/parity/table/impl");
  const auto truth = h5read::strings(out, "/parity/table/truth");
  const auto err = h5read::array(out, "/parity/table/o_rel_rms");
  REQUIRE(impl.size() == err.numel());
  REQUIRE(impl.size() >= 2);
  for (const char* col : {"o_max_abs", "o_max_ulp_bf16", "o_nan", "o_inf", "S_rel_rms", "o_rel_rms_last_window", "T",
                          "C", "state_precision", "matmul_precision", "gate", "beta", "g_min", "generator"})
    CHECK(h5read::exists(out, std::string("/parity/table/") + col));
  const auto mm = h5read::strings(out, "/parity/table/matmul_precision");
  const auto gate = h5read::strings(out, "/parity/table/gate");
  std::size_t plan_rows = 0, bf16_rows = 0;
  double plan_worst = 0, bf16_best = 1;
  for (std::size_t i = 0; i < impl.size(); ++i) {
    CHECK(truth[i].rfind("float64", 0) == 0);  // --quick uses the float64 truth
    if (impl[i] == "float32") {
      CHECK(err.data[i] > 0.0);
      CHECK(err.data[i] < tol::f32_vs_truth.value);
    }
    if (impl[i] == "float64-chunk") CHECK(err.data[i] < tol::f64_identity.value);  // chunked == recurrent
    if (impl[i] == "float32-chunk") CHECK(err.data[i] < tol::f32_vs_truth.value);
    if (impl[i] == "twin-bf16" && gate[i] == "bounded") {
      if (mm[i] == "plan") { ++plan_rows; plan_worst = std::max(plan_worst, err.data[i]); }
      if (mm[i] == "bf16") { ++bf16_rows; bf16_best = std::min(bf16_best, err.data[i]); }
    }
  }
  // the kernel plan holds its tolerance on anchor-kda inputs; all-bf16 operands cost ~2x more
  CHECK(plan_rows > 0);
  CHECK(bf16_rows > 0);
  CHECK(plan_worst <= tol::kda_twin_plan.value);
  CHECK(bf16_best > 1.5 * plan_worst);
  CHECK(h5read::strings(out, "/parity/summary/impl").size() >= 2);
  CHECK(h5read::array(out, "/parity/o_rel_rms_windows").dim(0) == impl.size());
  fs::remove_all(d);
}

TEST_CASE("parity with the multiprecision truth: float64 within 1e-12, float32 near u_fp32") {
  const fs::path d = tmpdir();
  const std::string out = (d / "mp.h5").string();
  const Run r = run("parity --T 17 --dk 64 --dv 32 --impl float64,float32 --truth mp --quiet --out " + out);
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto impl = h5read::strings(out, "/parity/table/impl");
  const auto truth = h5read::strings(out, "/parity/table/truth");
  const auto err = h5read::array(out, "/parity/table/o_rel_rms");
  REQUIRE(impl.size() == 2);
  CHECK(truth[0] == "cpp_bin_float_50");
  CHECK(err.data[0] > 0.0);
  CHECK(err.data[0] < tol::f64_vs_mp.value);
  CHECK(err.data[1] < tol::f32_vs_truth.value);
  fs::remove_all(d);
}

TEST_CASE("bad parity configs exit 2 and leave no file") {
  const fs::path d = tmpdir();
  struct Bad {
    const char* name;
    const char* json;
    const char* says;
  };
  for (const Bad& b : {Bad{"unknown key", R"({"T": [17], "chunk": [16]})", "unknown key 'chunk'"},
                       Bad{"empty grid", R"({"T": []})", "empty list"},
                       Bad{"C = 0", R"({"T": [17], "C": [0]})", "--C: 0"},
                       Bad{"unknown impl", R"({"impl": ["float16"]})", "float16"},
                       Bad{"g_min >= 0", R"({"g-min": [0.5]})", "--g-min"},
                       Bad{"bad truth", R"({"truth": "exact"})", "--truth"},
                       Bad{"not JSON", R"({"T": [17)", "not valid JSON"}}) {
    INFO(b.name);
    const fs::path cfg = d / "bad.json", out = d / "bad.h5";
    write(cfg, b.json);
    const Run r = run("parity --quiet --config " + cfg.string() + " --out " + out.string());
    INFO(r.out);
    CHECK(r.rc == 2);
    CHECK(r.out.find(b.says) != std::string::npos);
    CHECK_FALSE(fs::exists(out));
    for (const auto& e : fs::directory_iterator(d)) CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
  }
  // on the command line too
  const Run r = run("parity --quiet --C 16,0 --out " + (d / "c0.h5").string());
  CHECK(r.rc == 2);
  CHECK_FALSE(fs::exists(d / "c0.h5"));
  fs::remove_all(d);
}

TEST_CASE("the full parity config is valid") {
  // parse only: an impossible --out folder fails after the config is read, before any work
  const Run r = run("parity --config data/configs/parity.json --out /nonexistent_dir/x.h5");
  INFO(r.out);
  CHECK(r.rc == 2);
  CHECK(r.out.find("does not exist") != std::string::npos);
  CHECK(r.out.find("unknown key") == std::string::npos);
}
