// Session 9 breaker's finds, one test each (each broken once on purpose and seen to fail):
// 1. a JSON value nested 1000000 levels deep in bench --peer-json, --config or info --config crashed kdalab (SIGSEGV
//    in the error message's dump()): now one line, exit 2, "nested more than 64 levels deep";
// 2. a --peer-json file of 100000 keys took 45 s (parse_json_once's repeated-key check was quadratic): now well
//    under the test's 20 s limit;
// 3. bench named a FIFO or repeated --peer-json / --compare file before a bad --op (against the order written at the
//    top of experiments/bench.cpp): now the option first, the files after (cli::check_input_files);
// 4. decode-cost's cache note given a zero timing said "inf x the time" and "inf GB/s": rows whose timing is not
//    finite and > 0 are left out and counted;
// 5. golden reported a missing or folder fixture only after ~100 "ok" lines of the others: now one line first.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "experiments/decode_cost_note.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;

namespace {

/// A fresh folder for one test (removed first).
std::string fresh_dir(const std::string& name) {
  const std::string d = (std::filesystem::temp_directory_path() / ("kdalab_breaker9_" + name)).string();
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::size_t lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST_CASE("breaker9: a JSON value nested a million levels deep is one line, exit 2, no crash") {
  const std::string d = fresh_dir("deep");
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  write(d + "/peer.json", "{\"kda-prefill B=1 T=8192 H=64 HV=64\": " + deep + "}");
  write(d + "/opts.json", "{\"iters\": " + deep + "}");
  write(d + "/model.json", "{\"hidden_size\": " + deep + "}");
  for (const std::string& args :
       {"bench --peer-json " + d + "/peer.json --out " + d + "/o.h5", "bench --config " + d + "/opts.json --out " + d + "/o.h5",
        "info --config " + d + "/model.json"}) {
    const RunResult r = run_kdalab(args);
    INFO(args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "nested more than 64 levels deep"));
    CHECK(lines(r.output) == 1);
  }
  CHECK(!std::filesystem::exists(d + "/o.h5"));
  // a shallow nesting is still read (a metadata key holding an object)
  write(d + "/meta.json", "{\"_meta\": {\"a\": [1, [2, {\"b\": 3}]]}, \"kda-prefill B=1 T=8192 H=64 HV=64\": 1.5}");
  const RunResult ok = run_kdalab("bench --op kda-prefill --peer-json " + d + "/meta.json --out " + d + "/o.h5");
  INFO(ok.output);
  CHECK(bench_valid_exit(ok));
}

TEST_CASE("breaker9: a --peer-json file of 100000 keys is read in seconds, not 45 s") {
  const std::string d = fresh_dir("many");
  std::string text = "{";
  for (int i = 0; i < 100000; ++i) {
    if (i) text += ",";
    text += "\"_m";
    text += std::to_string(i);
    text += "\": 1";
  }
  text += ", \"_m77\": 1}";  // one repeat at the end: still found
  write(d + "/many.json", text);
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r = run_kdalab("bench --peer-json " + d + "/many.json --out " + d + "/o.h5");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output << "\n" << s << " s");
  CHECK(r.code == 2);
  CHECK(has(r, "key '_m77' appears twice"));
  CHECK(s < 20.0);
}

TEST_CASE("breaker9: bench names a bad option before a FIFO or repeated --peer-json / --compare file") {
  const std::string d = fresh_dir("order");
  const std::string fifo = d + "/fifo.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  write(d + "/p.json", "{\"kda-prefill B=1 T=8192 H=64 HV=64\": 1.0}");
  const std::string p = d + "/p.json", p2 = d + "/./p.json";
  for (const std::string& files : {"--peer-json " + fifo, "--compare " + fifo, "--peer-json " + p + "," + p2,
                                   "--compare " + p + " --compare " + p2}) {
    // bad --op, then a bad number: the option is named, not the file
    for (const std::string& opt : {std::string("--op bogus"), std::string("--iters 0")}) {
      const RunResult r = run_kdalab("bench " + opt + " " + files + " --out " + d + "/o.h5");
      INFO(opt << " " << files << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, opt == "--op bogus" ? "--op = 'bogus'" : "--iters = 0"));
      CHECK(lines(r.output) == 1);
    }
    // with good options the file is named (and the FIFO never blocks)
    const RunResult r = run_kdalab("bench --op kda-prefill " + files + " --out " + d + "/o.h5");
    INFO(files << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK((has(r, "is not a regular file") || has(r, "is given more than once")));
  }
  CHECK(!std::filesystem::exists(d + "/o.h5"));
}

TEST_CASE("breaker9: decode-cost's cache note leaves out zero and NaN timings, never says inf or nan") {
  using kdalab::cli::CacheLevel;
  const std::vector<CacheLevel> caches = {{1, "Data", 32768, "0"}, {2, "Unified", 1048576, "0"}};
  const double nan = std::nan("");
  struct Case {
    std::vector<double> n, sec;
    std::string left_out;  // the count the note must give ("" = none left out)
  };
  for (const Case& c : std::vector<Case>{{{256, 512, 1024, 2048}, {0.0, 8e-6, 16e-6, 68e-6}, "1 of 4"},
                                        {{256, 512, 1024, 2048}, {4e-6, nan, 16e-6, 68e-6}, "1 of 4"},
                                        {{256, 512}, {0.0, 0.0}, "2 of 2"},
                                        {{1024}, {nan}, "1 of 1"},
                                        {{1024}, {1e-5}, ""},
                                        {{512, 1024}, {1e-5, 1e-5}, ""}}) {
    const std::string note = kdalab::cli::softmax_cache_note(c.n, c.sec, 128, caches);
    INFO(note);
    CHECK(note.find("inf") == std::string::npos);
    CHECK(note.find("nan") == std::string::npos);
    if (c.left_out.empty()) CHECK(note.find("left out") == std::string::npos);
    else CHECK(note.find(c.left_out + " timings left out") != std::string::npos);
  }
}

TEST_CASE("breaker9: golden names a missing or folder fixture before checking any (one line, no 'ok' lines)") {
  const std::string d = fresh_dir("golden");
  for (const auto& e : std::filesystem::directory_iterator("data/golden"))
    if (e.path().extension() == ".h5") std::filesystem::copy_file(e.path(), d + "/" + e.path().filename().string());
  // the last fixtures checked: attn_res (a folder in its place), then hybrid (missing)
  std::filesystem::remove(d + "/attn_res.h5");
  std::filesystem::create_directory(d + "/attn_res.h5");
  RunResult r = run_kdalab("golden --dir " + d);
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "attn_res.h5' is a folder"));
  CHECK(lines(r.output) == 1);
  std::filesystem::remove(d + "/attn_res.h5");
  r = run_kdalab("golden --dir " + d);
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "attn_res.h5' is missing"));
  CHECK(lines(r.output) == 1);
}
