// The CLI finds of the session-5 adversarial run, one TEST_CASE per find: bench --compare files checked fully
// before any GPU work, --out never one of the --compare files, exit 3 for "not available here" (check --kernel,
// parity --impl cuda-bf16), --peer-json read strictly, bench options the chosen op ignores refused, --shapes
// edge cases. Each case runs the kdalab binary (KDALAB_BIN) on files it writes into a temp folder.
#include <H5Cpp.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli_io/cli_util.hpp"

using namespace kdalab::testutil;
namespace fs = std::filesystem;

namespace {

bool has(const RunResult& r, const std::string& s) { return r.output.find(s) != std::string::npos; }

/// Writes an HDF5 file at `path` whose content `fill` makes.
void write_h5(const std::string& path, const std::function<void(H5::H5File&)>& fill) {
  H5::H5File f(path, H5F_ACC_TRUNC);
  fill(f);
}

/// A 1-D variable-length string dataset `name` in `g`.
void str_col(H5::Group& g, const std::string& name, const std::vector<std::string>& v) {
  H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
  const hsize_t n = v.size();
  H5::DataSpace sp(1, &n);
  std::vector<const char*> p;
  for (const auto& s : v) p.push_back(s.c_str());
  g.createDataSet(name, st, sp).write(p.data(), st);
}

/// A 1-D float64 dataset `name` in `g`.
void num_col(H5::Group& g, const std::string& name, const std::vector<double>& v) {
  const hsize_t n = v.size();
  H5::DataSpace sp(1, &n);
  g.createDataSet(name, H5::PredType::NATIVE_DOUBLE, sp).write(v.data(), H5::PredType::NATIVE_DOUBLE);
}

const std::string kTiny = "bench --op kda-prefill --shapes 1:16:1 --iters 1 --warmup 0";

}  // namespace

TEST_CASE("bench --compare: each file is checked fully before any GPU work, exit 2 naming file and fault", "[cli][bench]") {
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
    for (const std::string& first : {std::string(), std::string(" data/baselines/h200-kda.h5")}) {
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
  const auto r = run_kdalab("bench --op mla-decode --shapes 1:64:1 --iters 1 --warmup 0 --compare " +
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
  // the checked-in baselines pass the check, and a fixed-length string key column is read too
  write_h5(d.file("fixed.h5"), [&](H5::H5File& f) {
    f.createGroup("bench");
    H5::Group g = f.createGroup("bench/kda_prefill");
    H5::StrType st(H5::PredType::C_S1, 40);
    const hsize_t n = 1;
    H5::DataSpace sp(1, &n);
    char buf[40] = {0};
    key.copy(buf, key.size());
    g.createDataSet("key", st, sp).write(buf, st);
    num_col(g, "time_ms", {1.0});
  });
  r2 = run_kdalab(kTiny + " --compare data/baselines/h200-kda.h5 data/baselines/h200-mla.h5 " + d.file("fixed.h5") +
                  " --out " + d.file("b.h5"));
  INFO(r2.output);
  CHECK(bench_valid_exit(r2));
#ifdef KDALAB_HAVE_CUDA
  if (r2.code == 0) CHECK(has(r2, "rows have no baseline row"));
#endif
}

TEST_CASE("bench --out is never one of the --compare files (same path, symlink, other spelling), exit 2", "[cli][bench]") {
  TempDir d;
  fs::copy_file("data/baselines/h200-kda.h5", d.file("base.h5"));
  fs::create_directories(d.path / "sub");
  fs::create_symlink(d.file("base.h5"), d.file("link.h5"));
  const std::string before = [&] {
    std::ifstream f(d.file("base.h5"), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }();
  for (const std::string& out : {d.file("base.h5"), d.file("link.h5"), (d.path / "sub" / ".." / "base.h5").string()})
    for (const std::string& force : {std::string(), std::string(" --force")}) {
      const auto r = run_kdalab(kTiny + " --compare data/baselines/h200-mla.h5 " + d.file("base.h5") + " --out " + out + force);
      INFO(out << force << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, "--out"));
      CHECK(has(r, "is the --compare file"));
    }
  // the other way round: --compare through the link, --out the file itself
  const auto r = run_kdalab(kTiny + " --compare " + d.file("link.h5") + " --out " + d.file("base.h5") + " --force");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "is the --compare file"));
  std::ifstream f(d.file("base.h5"), std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  CHECK(ss.str() == before);
}
