// `kdalab parity`: the quick sweep writes its table, summary and which truth each row used; the multiprecision truth;
// bad configs exit 2 and write no file; its notes (skipped > 80 nats, NaN/Inf rows, skipped implementations) are
// printed once, after the summary, grouped and recorded; rows that overflow are noted and summarised as NaN; the
// README defines the parity columns.
#include <H5Cpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "experiments/decode_cost_note.hpp"
#include "experiments/results.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;


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

TEST_CASE("parity prints each note once, after the summary, and records it", "[parity]") {
  TempDir d;
  // softplus gates at T = 17, d_k = 128 reach a factored span > 80 nats at C = 16: float32-chunk skips them
  const auto r = run_kdalab("parity --T 17 --dk 128 --dv 128 --gate softplus --beta sigmoid,one --C 16 "
                            "--impl float32,float32-chunk,cuda-bf16 --truth f64 --out " + d.file("p.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto notes = note_lines(r.output);
  REQUIRE(notes.size() >= 1);  // one for both skipped points (two betas), one for cuda-bf16 without a GPU
  CHECK(count(r.output, "float32-chunk C=16 skipped at 2 points [0 (T=17 H=1 softplus sigmoid), "
                        "1 (T=17 H=1 softplus one)]: ") == 1);
  std::size_t span_notes = 0;  // the "> 80 nats" notes: each phrase appears in its note only
  for (const auto& n : notes) span_notes += count(n, "80 nats");
  CHECK(span_notes == 1);
  CHECK(count(r.output, "80 nats") == span_notes);
  const std::string recorded = kdalab::h5read::attr_string(d.file("p.h5"), "/parity", "notes");
  for (const auto& n : notes) {
    INFO(n);
    CHECK(count(r.output, n) == 1);  // printed once: no second copy on stderr
    CHECK(recorded.find(n) != std::string::npos);
  }
  CHECK(r.output.find("note: ") > r.output.find("o median rRMS"));  // after the summary table
}

TEST_CASE("parity with no row prints every note once, the first in its one-line error", "[parity]") {
  TempDir d;
  const auto r = run_kdalab("parity --T 17 --dk 128 --dv 128 --gate softplus --beta sigmoid,one --C 16 "
                            "--impl float32-chunk --truth f64 --quiet --out " + d.file("p.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(count(r.output, "skipped at 2 points [0 (T=17 H=1 softplus sigmoid), 1 (T=17 H=1 softplus one)]") == 1);
  CHECK(count(r.output, "80 nats") == 1);
  CHECK(d.count() == 0);
}

TEST_CASE("parity --quick: one '> 80 nats' note per (implementation, C), listing every skipped point", "[parity]") {
  TempDir d;
  // --quick's grid (T = 17, 300, 1000; bounded and softplus gates; beta sigmoid and one): float32-chunk refuses
  // the six softplus points at every C (factored tile 16 for C = 32); float64-chunk (700 nats) refuses none.
  const auto r = run_kdalab("parity --quick --C 16,32 --impl float64,float64-chunk,float32-chunk --out " + d.file("p.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto notes = note_lines(r.output);
  const auto impl = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/impl");
  const auto gate = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/gate");
  const auto point = kdalab::h5read::array(d.file("p.h5"), "/parity/table/point");
  const auto C = kdalab::h5read::array(d.file("p.h5"), "/parity/table/C");
  std::set<long> all_points, softplus_points;
  for (std::size_t i = 0; i < impl.size(); ++i) {
    all_points.insert(std::lround(point.data[i]));
    if (gate[i] == "softplus") softplus_points.insert(std::lround(point.data[i]));
  }
  REQUIRE(all_points.size() == 12);
  REQUIRE(softplus_points.size() == 6);
  const std::string recorded = kdalab::h5read::attr_string(d.file("p.h5"), "/parity", "notes");
  std::size_t span_notes = 0;
  for (const auto& n : notes) span_notes += count(n, "80 nats");
  CHECK(span_notes == 2);  // float32-chunk at C = 16 and at C = 32; was six per C, one per point
  CHECK(count(r.output, "80 nats") == 2);
  CHECK(count(recorded, "80 nats") == 2);  // the file's notes are merged the same way
  for (const char* c : {"16", "32"}) {
    const std::string head = std::string("float32-chunk C=") + c + " skipped at ";
    INFO(head);
    CHECK(count(r.output, head) == 1);
    CHECK(count(recorded, head) == 1);
    CHECK(count(r.output, "float64-chunk C=" + std::string(c) + " skipped") == 0);
    const std::string* n = nullptr;
    for (const auto& x : notes)
      if (x.rfind(head, 0) == 0) n = &x;
    REQUIRE(n != nullptr);
    INFO(*n);
    CHECK(n->rfind(head + "6 points [", 0) == 0);
    CHECK(recorded.find(*n) != std::string::npos);
    // the listed points are exactly the points without a float32-chunk row at this C: the softplus ones
    std::set<long> listed, with_row;
    const std::string list = n->substr(n->find('['), n->find(']') - n->find('['));
    const std::regex item(R"((\d+) \(T=\d+ H=\d+ softplus (sigmoid|one)\))");
    for (auto it = std::sregex_iterator(list.begin(), list.end(), item); it != std::sregex_iterator(); ++it)
      listed.insert(std::stol((*it)[1].str()));
    for (std::size_t i = 0; i < impl.size(); ++i)
      if (impl[i] == "float32-chunk" && std::lround(C.data[i]) == std::stol(c)) with_row.insert(std::lround(point.data[i]));
    CHECK(listed == softplus_points);
    for (long p : listed) CHECK(with_row.count(p) == 0);
    CHECK(listed.size() + with_row.size() == all_points.size());
    // what each point's note said is kept: the reason, and the spans as a range over the points
    CHECK(n->find("kda_chunked: option 'C' (chunk size) = " + std::string(c)) != std::string::npos);
    CHECK(std::regex_search(*n, std::regex(R"(factored decay span F \* \|g_min\| = [0-9.]+ \.\. [0-9.]+ > 80 nats: )"
                                           R"(exp overflows in float32)")));
  }
}

TEST_CASE("parity: one NaN/Inf note per (implementation, C, state precision, matmul precision), naming them and listing the points",
          "[parity]") {
  TempDir d;
  // g_min = -100 is far beyond the factored chunk form's range: every twin row has NaN in o at the bounded points
  // (0: T = 17, 2: T = 40), none at the softplus points (1, 3); the two state precisions give the same counts, so
  // their notes were identical (the precisions were not named) and one was silently dropped.
  const auto r = run_kdalab("parity --g-min -100 --impl float64,twin-bf16 --T 17,40 --dk 16 --dv 16 --gate bounded,softplus "
                            "--beta one --C 16 --state-precision fp32,bf16 --matmul-precision plan,bf16 --truth f64 --out " +
                            d.file("p.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto notes = note_lines(r.output);
  const std::string recorded = kdalab::h5read::attr_string(d.file("p.h5"), "/parity", "notes");
  const auto impl = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/impl");
  const auto st = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/state_precision");
  const auto mm = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/matmul_precision");
  const auto point = kdalab::h5read::array(d.file("p.h5"), "/parity/table/point");
  const auto C = kdalab::h5read::array(d.file("p.h5"), "/parity/table/C");
  const auto o_nan = kdalab::h5read::array(d.file("p.h5"), "/parity/table/o_nan");
  const auto o_inf = kdalab::h5read::array(d.file("p.h5"), "/parity/table/o_inf");
  const auto S_nan = kdalab::h5read::array(d.file("p.h5"), "/parity/table/S_nan");
  const auto S_inf = kdalab::h5read::array(d.file("p.h5"), "/parity/table/S_inf");
  std::size_t nan_notes = 0;
  for (const auto& n : notes) nan_notes += count(n, "has NaN/Inf");
  CHECK(nan_notes == 4);  // (state fp32, bf16) x (matmul plan, bf16); was one per point, de-duplicated across precisions
  CHECK(count(recorded, "has NaN/Inf") == 4);
  // every (implementation, C, state, matmul) whose rows hold NaN/Inf has exactly one note, listing exactly its points
  std::map<std::string, std::set<long>> bad;
  for (std::size_t i = 0; i < impl.size(); ++i)
    if (o_nan.data[i] + o_inf.data[i] + S_nan.data[i] + S_inf.data[i] > 0)
      bad[fmt::format("{} C={} (state {}, matmul {}) has NaN/Inf at ", impl[i], std::lround(C.data[i]), st[i], mm[i])]
          .insert(std::lround(point.data[i]));
  REQUIRE(bad.size() == 4);
  for (const auto& [head, points] : bad) {
    INFO(head);
    CHECK(points == std::set<long>{0, 2});
    const std::string* n = nullptr;
    for (const auto& x : notes)
      if (x.rfind(head, 0) == 0) n = &x;
    REQUIRE(n != nullptr);
    INFO(*n);
    CHECK(count(r.output, head) == 1);
    CHECK(recorded.find(*n) != std::string::npos);  // the file's notes are the same text
    CHECK(n->rfind(head + "2 points [0 (T=17 H=1 bounded one), 2 (T=40 H=1 bounded one)]: o has ", 0) == 0);
    CHECK(n->find("recorded in the rows") != std::string::npos);
  }
}

TEST_CASE("parity's progress line names only implementations that produced a row (not the skipped cuda-bf16)",
          "[parity]") {
  TempDir d;
  // d_k = 16: cuda-bf16 is skipped in every build (no GPU, no CUDA kernels, or a shape the kernel does not run);
  // float32-chunk is skipped at the softplus points (span > 80 nats at T = 300). KDALAB_PROGRESS_INTERVAL=0 draws the
  // progress line at every tick (off a terminal one line each), so every label the run showed is in the output.
  const auto r = run_command("KDALAB_PROGRESS_INTERVAL=0 " + kdalab_bin() +
                             " parity --T 300 --dk 16 --dv 16 --gate bounded,softplus --beta one --C 16 "
                             "--impl float32,float32-chunk,cuda-bf16 --truth f64 --out " + d.file("p.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto impl = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/impl");
  const auto gate = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/gate");
  REQUIRE(std::count(impl.begin(), impl.end(), "cuda-bf16") == 0);  // the rows this test is about are skipped
  std::set<std::string> chunk_gates;
  for (std::size_t i = 0; i < impl.size(); ++i)
    if (impl[i] == "float32-chunk") chunk_gates.insert(gate[i]);
  REQUIRE(chunk_gates == std::set<std::string>{"bounded"});  // float32-chunk ran at the bounded point only
  std::size_t lines = 0;
  std::size_t p = 0;
  while ((p = r.output.find("parity: ", p)) != std::string::npos) {
    const std::size_t e = r.output.find('\n', p);
    const std::string line = r.output.substr(p, e - p);
    p = e;
    if (line.find("% (") == std::string::npos) continue;  // not a progress line
    ++lines;
    INFO(line);
    CHECK(line.find("cuda-bf16") == std::string::npos);  // was: the last line ended "[T=300 H=1 softplus one cuda-bf16]"
    CHECK(line.find("softplus one float32-chunk") == std::string::npos);  // skipped there too
  }
  CHECK(lines >= 3);
}

TEST_CASE("parity: a twin row that overflows at C = 64 is noted and its summary reads NaN", "[parity]") {
  TempDir d;
  const auto r = run_kdalab("parity --B 1 --T 40 --H 1 --dk 8 --dv 8 --C 64 --impl twin-bf16 --state-precision fp32 "
                            "--matmul-precision plan --truth f64 --quiet --out " + d.file("p.h5"));
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("NaN") != std::string::npos);
  CHECK(r.output.find("recorded in the row") != std::string::npos);
}

TEST_CASE("docs/cli.md defines matmul_precision = plan where the parity experiment is described", "[parity][docs]") {
  const std::string readme = slurp("docs/cli.md");
  const std::size_t row = readme.find("| `parity` |");
  REQUIRE(row != std::string::npos);
  const std::string line = readme.substr(row, readme.find('\n', row) - row);
  INFO(line);
  CHECK(line.find("`matmul_precision`") != std::string::npos);
  CHECK(line.find("`plan` is the CUDA kernel's own choice (`kda_plan_kernel()`") != std::string::npos);
  CHECK(line.find("intra-chunk products in fp32") != std::string::npos);
}

TEST_CASE("parity --quick writes the table, the summary and which truth each row used", "[parity]") {
  const fs::path d = tmpdir();
  const std::string out = (d / "quick.h5").string();
  const Run r = run("parity --quick --out " + out);
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("o median rRMS") != std::string::npos);  // the summary table is printed
  CHECK(r.out.find("twin-bf16") != std::string::npos);
  // without the CUDA kernels or a GPU: a note and no cuda-bf16 rows; with them (the H200 machine): the rows
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

TEST_CASE("parity with the multiprecision truth: float64 within 1e-12, float32 near u_fp32", "[parity]") {
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

TEST_CASE("bad parity configs exit 2 and leave no file", "[parity]") {
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

TEST_CASE("the full parity config is valid", "[parity]") {
  // parse only: an impossible --out folder fails after the config is read, before any work
  const Run r = run("parity --config data/configs/parity.json --out /nonexistent_dir/x.h5");
  INFO(r.out);
  CHECK(r.rc == 2);
  CHECK(r.out.find("does not exist") != std::string::npos);
  CHECK(r.out.find("unknown key") == std::string::npos);
}

TEST_CASE("parity --inputs: each input kind is its own grid point, named in the generator column; plan-hilo and "
          "plan-accurate rows",
          "[parity]") {
  TempDir d;
  const auto r = run_kdalab("parity --T 64 --dk 128 --dv 128 --inputs anchor,long-memory --impl twin-bf16 "
                            "--state-precision fp32 --matmul-precision plan,plan-hilo,plan-accurate --truth f64 --quiet "
                            "--out " + d.file("p.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto gen = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/generator");
  const auto mm = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/matmul_precision");
  const auto err = kdalab::h5read::array(d.file("p.h5"), "/parity/table/o_rel_rms");
  REQUIRE(gen.size() == 6);  // 2 input kinds x 3 matmul plans
  CHECK(gen == std::vector<std::string>{"anchor-kda", "anchor-kda", "anchor-kda", "anchor-kda(inputs=long-memory)",
                                        "anchor-kda(inputs=long-memory)", "anchor-kda(inputs=long-memory)"});
  CHECK(mm == std::vector<std::string>{"plan", "plan-hilo", "plan-accurate", "plan", "plan-hilo", "plan-accurate"});
  // long-memory inputs: the kernel plan misses the o goal, the hi/lo and accurate plans meet it (numerics/kda_twin.hpp)
  CHECK(err.data[3] > tol::kda_bf16_goal.value);
  CHECK(err.data[4] <= tol::kda_bf16_goal.value);
  CHECK(err.data[5] <= tol::kda_bf16_goal.value);
}
