// `kdalab golden` on broken fixtures: a dataset of the wrong dtype (int32, or float32 where the
// float64 mp50 truth is expected), a dangling link or a missing case is bad input (exit 2, a message
// naming the file, the dataset and the dtype), never a crash (exit 1) or a silent pass.
#include <H5Cpp.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;
namespace fs = std::filesystem;

namespace {
/// Replaces dataset `name` of `file` by `make(file handle, name)`.
void replace(const std::string& file, const std::string& name, const std::function<void(H5::H5File&, const std::string&)>& make) {
  H5::H5File f(file, H5F_ACC_RDWR);
  H5Ldelete(f.getId(), name.c_str(), H5P_DEFAULT);
  make(f, name);
}
template <class T>
void write_typed(H5::H5File& f, const std::string& name, const H5::PredType& type) {
  hsize_t dims[4] = {2, 37, 2, 32};
  std::vector<T> v(2 * 37 * 2 * 32, T(1));
  f.createDataSet(name, type, H5::DataSpace(4, dims)).write(v.data(), type);
}
}  // namespace

TEST_CASE("golden: a fixture whose o is int32 or float32, or a dangling link, exits 2 naming it") {
  struct Bad {
    const char* what;
    std::function<void(H5::H5File&, const std::string&)> make;
    const char* says;
  };
  const std::vector<Bad> bads{
      {"o as int32", [](H5::H5File& f, const std::string& n) { write_typed<std::int32_t>(f, n, H5::PredType::NATIVE_INT32); },
       "has dtype int32; expected float64"},
      {"o as float32", [](H5::H5File& f, const std::string& n) { write_typed<float>(f, n, H5::PredType::NATIVE_FLOAT); },
       "has dtype float32; expected float64"},
      {"o a dangling soft link",
       [](H5::H5File& f, const std::string& n) { H5Lcreate_soft("/nowhere", f.getId(), n.c_str(), H5P_DEFAULT, H5P_DEFAULT); },
       "is a dangling link"},
  };
  for (const Bad& b : bads) {
    INFO(b.what);
    TempDir d;
    for (const auto& e : fs::directory_iterator("data/golden")) fs::copy_file(e.path(), d.path / e.path().filename());
    replace(d.file("kda_recurrent.h5"), "/anchor/o", b.make);
    const auto r = run_kdalab("golden --dir " + d.path.string());
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(b.says) != std::string::npos);
    CHECK(r.output.find("/anchor/o") != std::string::npos);
  }
  // the same for a layer fixture, and a missing case
  TempDir d;
  for (const auto& e : fs::directory_iterator("data/golden")) fs::copy_file(e.path(), d.path / e.path().filename());
  {
    H5::H5File f(d.file("mla.h5"), H5F_ACC_RDWR);
    H5Ldelete(f.getId(), "/gated_rope_lowrank_q/y_naive", H5P_DEFAULT);
    write_typed<float>(f, "/gated_rope_lowrank_q/y_naive", H5::PredType::NATIVE_FLOAT);
  }
  auto r = run_kdalab("golden --dir " + d.path.string());
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("y_naive' has dtype float32") != std::string::npos);
  {
    H5::H5File f(d.file("mla.h5"), H5F_ACC_RDWR);
    H5Ldelete(f.getId(), "/gated_rope_lowrank_q", H5P_DEFAULT);
  }
  r = run_kdalab("golden --dir " + d.path.string());
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("has no case 'gated_rope_lowrank_q'") != std::string::npos);
}

TEST_CASE("golden: a stored output of the wrong size exits 2 naming the fixture file") {
  TempDir d;
  for (const auto& e : fs::directory_iterator("data/golden")) fs::copy_file(e.path(), d.path / e.path().filename());
  replace(d.file("attn_res.h5"), "/d32_N8_block3/h_full", [](H5::H5File& f, const std::string& n) {
    hsize_t dims[2] = {2, 3};
    std::vector<double> v(6, 0.5);
    f.createDataSet(n, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(2, dims)).write(v.data(), H5::PredType::NATIVE_DOUBLE);
  });
  const auto r = run_kdalab("golden --dir " + d.path.string());
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("golden file '") != std::string::npos);
  CHECK(r.output.find("attn_res.h5") != std::string::npos);
}

TEST_CASE("golden --regen --force refuses before rewriting anything when one target is a folder") {
  TempDir d;
  for (const auto& e : fs::directory_iterator("data/golden")) fs::copy_file(e.path(), d.path / e.path().filename());
  fs::remove(d.path / "hybrid.h5");
  fs::create_directory(d.path / "hybrid.h5");
  const auto before = fs::last_write_time(d.path / "kda_recurrent.h5");
  const auto r = run_kdalab("golden --regen --force --dir " + d.path.string());
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("not a regular file") != std::string::npos);
  CHECK(fs::last_write_time(d.path / "kda_recurrent.h5") == before);  // nothing rewritten
}
