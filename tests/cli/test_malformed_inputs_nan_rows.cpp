// Finds of the session-2 adversarial review, each turned into a test: a shape whose element count
// overflows (was a segfault), a non-finite truth written silently (eps = 0 on a zero source; huge
// float64 scores), a group where a dataset is expected (was "absent"), bench --shapes with trailing
// garbage and a missing --compare file, and parity rows with NaN (now a note, NaN-aware summaries).
#include <H5Cpp.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;

namespace {
void write_f64(H5::H5File& f, const std::string& name, const std::vector<hsize_t>& dims, double value) {
  H5::DataSpace sp(static_cast<int>(dims.size()), dims.data());
  std::size_t n = 1;
  for (hsize_t d : dims) n *= d;
  std::vector<double> v(n, value);
  for (std::size_t i = 0; i < n; ++i) v[i] = value * (1.0 + 0.01 * static_cast<double>(i % 7));
  f.createDataSet(name, H5::PredType::NATIVE_DOUBLE, sp).write(v.data(), H5::PredType::NATIVE_DOUBLE);
}
void attr_num(H5::H5File& f, const std::string& name, double v) {
  f.openGroup("/").createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_DOUBLE, &v);
}
void attr_str(H5::H5File& f, const std::string& name, const std::string& v) {
  H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
  f.openGroup("/").createAttribute(name, st, H5::DataSpace(H5S_SCALAR)).write(st, v);
}
}  // namespace

TEST_CASE("check: a shape whose element count overflows 64 bits is bad input (exit 2), not a crash", "[cli]") {
  TempDir d;
  {
    H5::H5File f(d.file("wrap.h5"), H5F_ACC_TRUNC);
    const hsize_t dims[4] = {1, 1, (hsize_t{1} << 62) + 1, 4}, chunk[4] = {1, 1, 1, 4};
    H5::DSetCreatPropList pl;
    pl.setChunk(4, chunk);
    const double one = 1.0;
    pl.setFillValue(H5::PredType::NATIVE_DOUBLE, &one);
    f.createDataSet("q", H5::PredType::NATIVE_FLOAT, H5::DataSpace(4, dims), pl);  // stored lazily: 2 KB on disk
    write_f64(f, "c", {1, 8, 4}, 1.0);
    attr_num(f, "scale", 0.1);
  }
  for (const char* op : {"mla", "kda"}) {
    const auto r = run_kdalab(std::string("check --op ") + op + " --in " + d.file("wrap.h5") + " --out " + d.file("r.h5"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find("'q' has shape") != std::string::npos);
  }
  CHECK(d.count() == 1);  // no report file
}

TEST_CASE("check: a non-finite truth is refused with its cause, never written", "[cli]") {
  TempDir d;
  {  // attn-res: eps = 0 and an all-zero source -> RMSNorm 0/0
    H5::H5File f(d.file("ar.h5"), H5F_ACC_TRUNC);
    write_f64(f, "v", {3, 2, 4}, 0.0);
    write_f64(f, "w", {4}, 0.5);
    attr_str(f, "mode", "full");
    attr_num(f, "eps", 0.0);
  }
  auto r = run_kdalab("check --op attn-res --truth f64 --in " + d.file("ar.h5") + " --out " + d.file("r1.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("eps") != std::string::npos);
  {  // mla: float64 scores overflow (inf - inf in the max subtraction)
    H5::H5File f(d.file("mla.h5"), H5F_ACC_TRUNC);
    write_f64(f, "q", {1, 1, 1, 4}, 1e200);
    write_f64(f, "c", {1, 3, 4}, 1e200);
    attr_num(f, "scale", 1.0);
  }
  r = run_kdalab("check --op mla --truth f64 --in " + d.file("mla.h5") + " --out " + d.file("r2.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("not finite") != std::string::npos);
  CHECK(d.count() == 2);  // only the two inputs
}

TEST_CASE("check: a group where a dataset is expected is an error, not 'absent'", "[cli]") {
  TempDir d;
  {
    H5::H5File f(d.file("g.h5"), H5F_ACC_TRUNC);
    write_f64(f, "q", {1, 2, 1, 4}, 0.3);
    write_f64(f, "c", {1, 2, 4}, 0.7);
    attr_num(f, "scale", 0.5);
    f.createGroup("o");
  }
  const auto r = run_kdalab("check --op mla --in " + d.file("g.h5") + " --out " + d.file("r.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("'o' is a group") != std::string::npos);
}

TEST_CASE("bench: --shapes with trailing garbage and a missing --compare file are bad input", "[cli]") {
  TempDir d;
  auto r = run_kdalab("bench --op kda-prefill --shapes 1x:2:3 --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("'1x'") != std::string::npos);
  r = run_kdalab("bench --op kda-prefill --compare " + d.file("none.h5") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("--compare") != std::string::npos);
  // several baselines / peers: the second, missing one is named (the first exists)
  r = run_kdalab("bench --op kda-prefill --compare data/baselines/h200-kda.h5 --compare " + d.file("none2.h5") +
                 " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("none2.h5") != std::string::npos);
  {
    std::ofstream(d.file("p1.json")) << "{\"kda-prefill B=1 T=8192 H=64 HV=64\": 2.0}";
    std::ofstream(d.file("p2.json")) << "[1, 2]";
  }
  r = run_kdalab("bench --op kda-prefill --peer-json " + d.file("p1.json") + " --peer-json " + d.file("p2.json") +
                 " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("p2.json") != std::string::npos);
  CHECK(!std::filesystem::exists(d.file("b.h5")));
  // a peer file whose name starts with "inf" is a file name, not a number (adversarial find)
  std::ofstream(d.file("info.json")) << "{}";
  // (valid options: exit 3 "not available" in a CPU build; a tiny shape so that a GPU run is quick)
  const std::string tiny = " --shapes 1:16:1 --iters 1 --warmup 0";
  r = run_kdalab("bench --op kda-prefill --peer-json " + d.file("info.json") + tiny + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
  std::filesystem::remove(d.file("b.h5"));  // a GPU run wrote it
  // a peer time that is not a number, or the same key in two peer files, is bad input; _metadata is skipped
  std::ofstream(d.file("p3.json")) << R"({"kda-prefill B=1 T=8192 H=64 HV=64": "fast"})";
  r = run_kdalab("bench --op kda-prefill --peer-json " + d.file("p3.json") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("\"fast\"") != std::string::npos);
  std::ofstream(d.file("p4.json")) << R"({"kda-prefill B=1 T=8192 H=64 HV=64": 1.5, "_meta": {"x": "y"}})";
  r = run_kdalab("bench --op kda-prefill --peer-json " + d.file("p1.json") + " --peer-json " + d.file("p4.json") +
                 " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("two peer files") != std::string::npos);
  r = run_kdalab("bench --op kda-prefill --peer-json " + d.file("p4.json") + tiny + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
  std::filesystem::remove(d.file("b.h5"));
  // a --compare file that is not HDF5 is named with the option
  std::ofstream(d.file("not.h5")) << "plain text";
  r = run_kdalab("bench --op kda-prefill --compare " + d.file("not.h5") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("--compare") != std::string::npos);
}

TEST_CASE("parity: a twin row that overflows at C = 64 is noted and its summary reads NaN", "[cli]") {
  TempDir d;
  const auto r = run_kdalab("parity --B 1 --T 40 --H 1 --dk 8 --dv 8 --C 64 --impl twin-bf16 --state-precision fp32 "
                            "--matmul-precision plan --truth f64 --quiet --out " + d.file("p.h5"));
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("NaN") != std::string::npos);
  CHECK(r.output.find("recorded in the row") != std::string::npos);
}
