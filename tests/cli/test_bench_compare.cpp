// bench --compare and --peer-json files: each file is checked fully (layout, units, repeated keys, non-finite or
// non-positive times, numbers quoted as typed) before any GPU work; list values are split at commas like every
// list option, and a name holding a comma says so. Exit 2 naming the file and the fault.
#include <H5Cpp.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;
using nlohmann::json;

TEST_CASE("bench --compare: each file is checked fully before any GPU work, exit 2 naming file and fault", "[bench]") {
  TempDir d;
  const std::string key = "kda-prefill B=1 T=16 H=1 HV=1";
  struct Case {
    std::string name, says;
    std::function<void(H5::H5File&)> fill;
  };
  const std::vector<Case> cases = {
      {"bench_dataset.h5", "/bench is not a group",
       [](H5::H5File& f) {
         H5::Group root = f.openGroup("/");
         num_col(root, "bench", {1.0});
       }},
      {"op_dataset.h5", "/bench/kda_prefill is not a group",
       [](H5::H5File& f) {
         H5::Group b = f.createGroup("bench");
         num_col(b, "kda_prefill", {1.0});
       }},
      {"key_float.h5", "/bench/kda_prefill/key is not a string dataset",
       [](H5::H5File& f) {
         f.createGroup("bench");
         H5::Group g = f.createGroup("bench/kda_prefill");
         num_col(g, "key", {1.0});
         num_col(g, "time_ms", {1.0});
       }},
      {"no_time.h5", "has no dataset 'time_ms'",
       [&](H5::H5File& f) {
         f.createGroup("bench");
         H5::Group g = f.createGroup("bench/kda_prefill");
         str_col(g, "key", {key});
       }},
      {"no_key.h5", "has no dataset 'key'",
       [&](H5::H5File& f) {
         f.createGroup("bench");
         H5::Group g = f.createGroup("bench/kda_prefill");
         num_col(g, "time_ms", {1.0});
       }},
      {"time_string.h5", "/bench/kda_prefill/time_ms is not a numeric dataset",
       [&](H5::H5File& f) {
         f.createGroup("bench");
         H5::Group g = f.createGroup("bench/kda_prefill");
         str_col(g, "key", {key});
         str_col(g, "time_ms", {"1.0"});
       }},
      {"mismatch.h5", "'key' has 2 rows and 'time_ms' 1",
       [&](H5::H5File& f) {
         f.createGroup("bench");
         H5::Group g = f.createGroup("bench/kda_prefill");
         str_col(g, "key", {key, "kda-prefill B=2 T=16 H=1 HV=1"});
         num_col(g, "time_ms", {1.0});
       }},
      {"time_neg.h5", "finite and > 0",
       [&](H5::H5File& f) {
         f.createGroup("bench");
         H5::Group g = f.createGroup("bench/kda_prefill");
         str_col(g, "key", {key});
         num_col(g, "time_ms", {-1.0});
       }},
      {"no_bench.h5", "has no group /bench",
       [](H5::H5File& f) { f.createGroup("other"); }},
  };
  for (const auto& c : cases) {
    write_h5(d.file(c.name), c.fill);
    for (const std::string& first : {std::string(), std::string(" data/baselines/h200.h5")}) {
      const auto r = run_kdalab(kTiny + " --compare" + first + " " + d.file(c.name) + " --out " + d.file("b.h5"));
      INFO(c.name << first << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, "--compare"));
      CHECK(has(r, c.name));
      CHECK(has(r, c.says));
      CHECK(!has(r, "unexpected failure"));
      CHECK(!has(r, "not available"));
      CHECK(!fs::exists(d.file("b.h5")));
    }
  }
  // a bad group of an op bench does not time is not read: --op mla-decode does not look at bench/kda_prefill
  const auto r = run_kdalab("bench --op mla-decode --shapes 1:64:16 --iters 1 --warmup 0 --compare " +
                            d.file("key_float.h5") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
  fs::remove(d.file("b.h5"));
  // a directory, and a file HDF5 cannot open (the HDF5 library error is a kdalab::Error, not exit 1)
  auto r2 = run_kdalab(kTiny + " --compare " + d.path.string() + " --out " + d.file("b.h5"));
  INFO(r2.output);
  CHECK(r2.code == 2);
  CHECK(has(r2, "is a directory"));
  d.write("text.h5", "not an HDF5 file");
  r2 = run_kdalab(kTiny + " --compare " + d.file("text.h5") + " --out " + d.file("b.h5"));
  INFO(r2.output);
  CHECK(r2.code == 2);
  CHECK(has(r2, "not a readable HDF5"));
  // the checked-in baselines (H200, H100) pass the check, and a fixed-length string key column is read too
  write_h5(d.file("fixed.h5"), [&](H5::H5File& f) {
    f.createGroup("bench");
    H5::Group g = f.createGroup("bench/kda_prefill");
    H5::StrType st(H5::PredType::C_S1, 40);
    const hsize_t n = 1;
    H5::DataSpace sp(1, &n);
    char buf[40] = {0};
    key.copy(buf, key.size());
    g.createDataSet("key", st, sp).write(buf, st);
    num_col(g, "time_ms", {1.0e6});  // a baseline no GPU run is slower than (a flagged row would exit 1)
  });
  r2 = run_kdalab(kTiny + " --compare data/baselines/h200.h5 --compare data/baselines/h100/all.h5 " +
                  "--compare data/baselines/h100/kda-backward.h5 --compare data/baselines/h100/kda-prefill-accurate.h5 " +
                  "--compare data/baselines/h100/mla-prefill.h5 " +
                  "--compare data/baselines/h200/kda-backward.h5 " +
                  d.file("fixed.h5") + " --out " + d.file("b.h5"));
  INFO(r2.output);
  CHECK(bench_valid_exit(r2));
#ifdef KDALAB_HAVE_CUDA
  if (r2.code == 0) CHECK(has(r2, "rows have no baseline row"));
#endif
}

TEST_CASE("bench --peer-json: the whole file, no repeated key, times > 0 and finite or null, a directory named",
          "[bench]") {
  TempDir d;
  const std::string key = "\"kda-prefill B=1 T=16 H=1 HV=1\"";
  struct Case {
    std::string text, says;
  };
  const std::vector<Case> cases = {
      {"{" + key + ": 1.5} trailing", "not valid JSON"},
      {"{" + key + ": 1.5}{}", "not valid JSON"},
      {"{" + key + ": 1.5, " + key + ": 2.5}", "appears twice"},
      {"{" + key + ": 0}", "finite number > 0"},
      {"{" + key + ": -1.5}", "finite number > 0"},
      {"{" + key + ": 1e999}", "--peer-json"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string name = std::string("p") + std::to_string(i) + std::string(".json");
    d.write(name, cases[i].text);
    const auto r = run_kdalab(kTiny + " --peer-json " + d.file(name) + " --out " + d.file("b.h5"));
    INFO(cases[i].text << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--peer-json"));
    CHECK(has(r, name));
    CHECK(has(r, cases[i].says));
    CHECK(!fs::exists(d.file("b.h5")));
  }
  fs::create_directories(d.path / "dir.json");
  auto r = run_kdalab(kTiny + " --peer-json " + (d.path / "dir.json").string() + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "is a directory"));
  // valid: trailing white space, null, a repeated key inside _metadata's own objects is still refused elsewhere
  d.write("ok.json", "{" + key + ": 1.5, \"kda-prefill B=2 T=16 H=1 HV=1\": null, \"_meta\": {\"a\": 1}}\n\n");
  r = run_kdalab(kTiny + " --peer-json " + d.file("ok.json") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
}

TEST_CASE("bench --compare and --peer-json split on commas like every list option; a file name holding a comma says so",
          "[bench]") {
  {
    TempDir d;
    d.write("p1.json", "{\"kda-prefill B=1 T=16 H=1 HV=1\": 1.5}");
    d.write("p2.json", "{\"kda-prefill B=2 T=16 H=1 HV=1\": 2.5}");
    fs::copy_file(kBaseline, d.file("base2.h5"));  // a second, distinct baseline file
    // two valid files in one value: checked, then a build without a GPU says it cannot run (exit 3)
    auto r = run_kdalab(kTiny + " --compare " + kBaseline + "," + d.file("base2.h5") + " --peer-json " + d.file("p1.json") + "," +
                        d.file("p2.json") + " --out " + d.file("b.h5"));
    INFO(r.output);
    CHECK(bench_valid_exit(r));
    // a build without the kernels (or without a GPU) measures nothing; a GPU build measures, compares with both files
    // and writes b.h5 (the later runs use other --out names)
    if (r.code == 3) CHECK(has(r, "nothing was measured, compared or written"));
    else CHECK(has(r, "bench --compare: "));
    const std::size_t written = r.code == 0 ? 1 : 0;
    // a missing file in a comma list is named alone, exit 2, before the build's exit 3
    r = run_kdalab(kTiny + " --compare " + kBaseline + "," + d.file("none.h5") + " --out " + d.file("b1.h5"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--compare: '" + d.file("none.h5") + "'"));
    CHECK_FALSE(has(r, kBaseline + ","));
    r = run_kdalab(kTiny + " --peer-json " + d.file("p1.json") + "," + d.file("none.json") + " --out " + d.file("b1.h5"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--peer-json: cannot open '" + d.file("none.json") + "'"));
    // an empty item is refused as in every list option
    r = run_kdalab(kTiny + " --compare " + kBaseline + ", --out " + d.file("b1.h5"));
    CHECK(r.code == 2);
    CHECK(has(r, "--compare: the list '" + kBaseline + ",' has an empty item"));
    // --config: one string holding two files is two files too
    d.write("c.json", "{\"compare\": \"" + kBaseline + "," + d.file("base2.h5") + "\"}");
    r = run_kdalab(kTiny + " --config " + d.file("c.json") + " --out " + d.file("b2.h5"));
    INFO(r.output);
    CHECK(bench_valid_exit(r));
    // p1.json, p2.json, base2.h5, c.json, and b.h5 / b2.h5 only where a GPU ran them; the refused runs wrote nothing (no b1.h5)
    CHECK(d.count() == 4 + written + (r.code == 0 ? 1 : 0));
    CHECK_FALSE(fs::exists(d.file("b1.h5")));
    // --help says so for both options
    r = run_kdalab("bench --help");
    CHECK(r.code == 0);
    CHECK(count(r.output, "comma-separated like every list option") == 2);
  }
  {
    TempDir d;
    d.write("a,b.h5", "x");
    const auto r = run_kdalab("bench --compare " + d.file("a,b.h5") + " --out " + d.file("o.h5"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, cat({"--compare: '", d.file("a"), "' does not exist or is not a file; give a kdalab bench results file"})));
    CHECK(has(r, "the value was split at its commas"));
    CHECK(has(r, cat({"'", d.file("a,b.h5"), "' is a file: a file name containing a comma cannot be given to --compare"})));
    CHECK(d.count() == 1);  // no partial --out file
    // a comma list of files that do not exist: the message as before, no note
    const auto r2 = run_kdalab("bench --compare " + d.file("x.h5") + "," + d.file("y.h5") + " --out " + d.file("o.h5"));
    INFO(r2.output);
    CHECK(r2.code == 2);
    CHECK(has(r2, cat({"--compare: '", d.file("x.h5"), "' does not exist or is not a file"})));
    CHECK(!has(r2, "split at its commas"));
    // --peer-json, the other file list of bench: the same note
    d.write("p,q.json", "{}");
    const auto r3 = run_kdalab("bench --peer-json " + d.file("p,q.json") + " --out " + d.file("o.h5"));
    INFO(r3.output);
    CHECK(r3.code == 2);
    CHECK(has(r3, cat({"--peer-json: cannot open '", d.file("p"), "'"})));
    CHECK(has(r3, "a file name containing a comma cannot be given to --peer-json"));
  }
}

TEST_CASE("bench --peer-json quotes a number that underflows a double as typed, not as 0.0", "[bench]") {
  TempDir d;
  const std::string key = "kda-prefill B=1 T=8192 H=64 HV=64";
  for (const std::string typed : {"1e-400", "-2.5E-999", "0.0"}) {
    d.write("p.json", "{\"_meta\": \"x\", \"" + key + "\": " + typed + "}");
    const auto r = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("o.h5"));
    INFO(typed << ": " << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "key '" + key + "' has the value " + typed + "; accepted: a time in milliseconds"));
    if (typed != "0.0") CHECK(!has(r, "has the value 0.0"));
    CHECK(d.count() == 1);  // no output file, no temporary
  }
  // a non-number keeps its JSON spelling (a string stays quoted, so "0.9" is not taken for the number 0.9)
  d.write("p.json", "{\"" + key + "\": \"0.9\"}");
  auto r = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("o.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "has the value \"0.9\"; accepted"));
  // a good time is still accepted (the run then ends as this build allows)
  d.write("p.json", "{\"" + key + "\": 0.9, \"mla-decode B=1 T=65536 H=128 HV=128\": null}");
  r = run_timed("bench --peer-json " + d.file("p.json") + " --out " + d.file("o.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
}
