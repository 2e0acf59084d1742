// `kdalab check` (--op kda, kda-decode): files written from the golden fixtures give ~0 for the truth itself and
// the expected error for a bf16-rounded candidate; every malformed file gives its own clear error (exit 2, no
// report): shapes whose element count overflows, non-finite truths, a group where a dataset is expected, string
// attributes that are empty or hold several strings;
// --kernel's refusals.
#include <H5Cpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "numerics/bf16.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;
using namespace kdalab;


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

const std::string kGolden = "data/golden/kda_recurrent.h5";

/// One dataset to write: data, HDF5 type, string attributes.
struct Ds {
  Tensor<double> t;
  bool f32 = false;
  std::map<std::string, std::string> attrs;
};

/// A check input file under construction: datasets and root attributes, editable per test.
struct InputFile {
  std::map<std::string, Ds> ds;
  std::map<std::string, double> num;
  std::map<std::string, std::string> str;
  std::map<std::string, std::int64_t> ints;  // int32 datasets of that length (dtype errors)
  std::set<std::string> dangling;            // soft links to nothing

  void write(const fs::path& p) const {
    H5::H5File f(p.string(), H5F_ACC_TRUNC);
    H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
    for (const auto& [name, d] : ds) {
      std::vector<hsize_t> dims(d.t.shape.begin(), d.t.shape.end());
      H5::DataSpace sp(static_cast<int>(dims.size()), dims.data());
      H5::DataSet x = f.createDataSet(name, d.f32 ? H5::PredType::NATIVE_FLOAT : H5::PredType::NATIVE_DOUBLE, sp);
      if (d.f32) {
        std::vector<float> v(d.t.data.begin(), d.t.data.end());
        x.write(v.data(), H5::PredType::NATIVE_FLOAT);
      } else {
        x.write(d.t.data.data(), H5::PredType::NATIVE_DOUBLE);
      }
      for (const auto& [k, v] : d.attrs) x.createAttribute(k, st, H5::DataSpace(H5S_SCALAR)).write(st, v);
    }
    for (const auto& [name, n] : ints) {
      hsize_t dim = static_cast<hsize_t>(n);
      std::vector<std::int32_t> v(dim, 1);
      f.createDataSet(name, H5::PredType::NATIVE_INT32, H5::DataSpace(1, &dim)).write(v.data(), H5::PredType::NATIVE_INT32);
    }
    for (const auto& n : dangling) H5Lcreate_soft("/nowhere", f.getId(), n.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    H5::Group root = f.openGroup("/");
    for (const auto& [k, v] : num)
      root.createAttribute(k, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_DOUBLE, &v);
    for (const auto& [k, v] : str) root.createAttribute(k, st, H5::DataSpace(H5S_SCALAR)).write(st, v);
  }
};

Tensor<double> golden(const std::string& file, const std::string& name) { return h5read::array(file, "/anchor" + name); }

/// The golden anchor case as derived inputs (g log-decay, beta values, q/k already normalised).
InputFile derived_file(const std::string& file = kGolden, const std::string& c = "/anchor") {
  InputFile f;
  for (const char* n : {"q", "k", "v", "g", "beta"}) f.ds[n] = {h5read::array(file, c + "/" + n), false, {}};
  f.ds["S0"] = {h5read::array(file, c + "/S0"), true, {{"layout", "KV"}}};
  f.num["scale"] = h5read::attr_double(file, c, "scale");
  f.num["l2norm_qk"] = 0;
  return f;
}

/// The same case as raw kernel inputs: bf16 q/k/v/gate logits/beta logits, K3 gate parameters.
InputFile raw_file() {
  InputFile f;
  f.ds["q"] = {golden(kGolden, "/q_raw"), true, {{"format", "bf16"}}};
  f.ds["k"] = {golden(kGolden, "/k_raw"), true, {{"format", "bf16"}}};
  f.ds["v"] = {golden(kGolden, "/v"), true, {{"format", "bf16"}}};
  f.ds["g"] = {golden(kGolden, "/g_raw"), true, {{"format", "bf16"}}};
  f.ds["beta"] = {golden(kGolden, "/beta_raw"), true, {{"format", "bf16"}}};
  f.ds["A_log"] = {golden(kGolden, "/A_log"), false, {}};
  f.ds["bias"] = {golden(kGolden, "/bias"), false, {}};
  f.ds["S0"] = {golden(kGolden, "/S0"), true, {{"layout", "KV"}}};
  f.num["scale"] = h5read::attr_double(kGolden, "/anchor", "scale");
  f.num["l2norm_qk"] = 1;
  f.num["g_min"] = -5;
  f.str["gate"] = "k3";
  f.str["beta"] = "logits";
  return f;
}

fs::path tmpdir() {
  const fs::path d = fs::temp_directory_path() / ("kdalab_test_check_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

double reported(const std::string& report, const std::string& tensor) {
  const auto names = h5read::strings(report, "/check/report/tensor");
  const auto err = h5read::array(report, "/check/report/rel_rms");
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == tensor) return err.data[i];
  FAIL("tensor " << tensor << " not in the report");
  return -1;
}
}  // namespace

TEST_CASE("check: the truth itself reports ~0; a bf16-rounded candidate reports the bf16 error", "[check]") {
  const fs::path d = tmpdir();
  const Tensor<double> o = golden(kGolden, "/o"), S = golden(kGolden, "/S_final");
  Tensor<double> o_bf16 = o;
  for (auto& x : o_bf16.data) x = round_bf16(x);
  const double expected = rel_rms(o_bf16.data, o.data);
  REQUIRE(expected > 1e-3);  // ~u_bf16 / sqrt(3)

  for (const char* truth : {"mp", "f64"}) {
    for (bool raw : {false, true}) {
      INFO("truth " << truth << (raw ? ", raw kernel inputs (K3 gate, beta logits, l2norm)" : ", derived inputs"));
      InputFile f = raw ? raw_file() : derived_file();
      f.ds["o"] = {o, false, {}};
      f.ds["S"] = {S, false, {{"layout", "KV"}}};
      f.write(d / "self.h5");
      Run r = run("check --op kda --in " + (d / "self.h5").string() + " --truth " + truth + " --force --out " +
                  (d / "r.h5").string());
      INFO(r.out);
      REQUIRE(r.rc == 0);
      CHECK(r.out.find("check: PASS") != std::string::npos);
      CHECK(reported((d / "r.h5").string(), "o") < tol::check_self.value);
      CHECK(reported((d / "r.h5").string(), "S") < tol::check_self.value);

      f.ds["o"] = {o_bf16, true, {{"format", "bf16"}}};
      f.write(d / "bf16.h5");
      r = run("check --op kda --in " + (d / "bf16.h5").string() + " --truth " + truth + " --force --out " +
              (d / "r.h5").string());
      INFO(r.out);
      REQUIRE(r.rc == 0);
      const double got = reported((d / "r.h5").string(), "o");
      CAPTURE(got, expected);
      CHECK(std::fabs(got - expected) <= tol::check_metric_agreement.value * expected);
      // a tolerance below the bf16 floor fails the verdict with exit 1
      r = run("check --op kda --in " + (d / "bf16.h5").string() + " --truth " + truth + " --tol 1e-4 --force --out " +
              (d / "r.h5").string());
      CHECK(r.rc == 1);
      CHECK(r.out.find("check: FAIL") != std::string::npos);
    }
  }
  fs::remove_all(d);
}

TEST_CASE("check: no candidate writes the truth; VK layouts; kda-decode", "[check]") {
  const fs::path d = tmpdir();
  InputFile f = derived_file();
  Tensor<double> S0 = f.ds["S0"].t, S0vk({S0.dim(0), S0.dim(1), S0.dim(3), S0.dim(2)});
  for (std::size_t b = 0; b < S0.dim(0); ++b)
    for (std::size_t h = 0; h < S0.dim(1); ++h)
      for (std::size_t i = 0; i < S0.dim(2); ++i)
        for (std::size_t j = 0; j < S0.dim(3); ++j) S0vk(b, h, j, i) = S0(b, h, i, j);
  f.ds["S0"] = {S0vk, true, {{"layout", "VK"}}};
  f.write(d / "vk.h5");
  const Run r = run("check --in " + (d / "vk.h5").string() + " --out " + (d / "truth.h5").string());
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("no candidate") != std::string::npos);
  const Tensor<double> o = golden(kGolden, "/o");
  CHECK(rel_rms(h5read::array((d / "truth.h5").string(), "/check/o_truth").data, o.data) < tol::check_self.value);
  CHECK(h5read::array((d / "truth.h5").string(), "/check/S_truth").shape == S0vk.shape);  // written back in VK

  const std::string dec = "data/golden/kda_decode.h5";
  InputFile g = derived_file(dec, "/anchor_decode");
  g.ds["o"] = {h5read::array(dec, "/anchor_decode/o"), false, {}};
  g.write(d / "dec.h5");
  const Run r2 = run("check --op kda-decode --in " + (d / "dec.h5").string() + " --out " + (d / "dec_r.h5").string());
  INFO(r2.out);
  CHECK(r2.rc == 0);
  CHECK(reported((d / "dec_r.h5").string(), "o") < tol::check_self.value);
  fs::remove_all(d);
}

TEST_CASE("check: every malformed file gives its own clear error, exit 2 and no report", "[check]") {
  const fs::path d = tmpdir();
  struct Bad {
    const char* name;
    std::function<void(InputFile&)> edit;
    const char* says;
    const char* op = "kda";
  };
  const std::vector<Bad> bads = {
      {"missing q", [](InputFile& f) { f.ds.erase("q"); }, "dataset 'q' is missing"},
      {"wrong rank", [](InputFile& f) { f.ds["q"].t.shape = {f.ds["q"].t.dim(0) * f.ds["q"].t.dim(1), f.ds["q"].t.dim(2), f.ds["q"].t.dim(3)}; },
       "dataset 'q' has rank 3"},
      {"S0 without layout", [](InputFile& f) { f.ds["S0"].attrs.clear(); }, "'S0' has no attribute layout"},
      {"S0 unknown layout", [](InputFile& f) { f.ds["S0"].attrs["layout"] = "KVK"; }, "layout of 'S0' = 'KVK' is unknown"},
      {"S0 wrong shape", [](InputFile& f) { f.ds["S0"].attrs["layout"] = "VK"; f.ds["S0"].t.shape[3] = 16;
                                            f.ds["S0"].t.shape[2] = 64; }, "dataset 'S0' has shape"},
      {"candidate S without layout", [](InputFile& f) { f.ds["S"] = {f.ds["S0"].t, false, {}}; }, "'S' has no attribute layout"},
      {"k shape", [](InputFile& f) { f.ds["k"].t.shape[1] -= 1; f.ds["k"].t.data.resize(f.ds["k"].t.data.size() - 128); },
       "dataset 'k' has shape"},
      {"g shape", [](InputFile& f) { f.ds["g"] = {f.ds["beta"].t, false, {}}; }, "dataset 'g' has rank 3"},
      {"o shape", [](InputFile& f) { f.ds["o"] = {f.ds["q"].t, false, {}}; f.ds["o"].t.shape[3] = 16;
                                      f.ds["o"].t.shape[2] = 4; }, "candidate 'o' has shape"},
      {"integer dtype", [](InputFile& f) { f.ds.erase("beta"); f.ints["beta"] = 4; }, "'beta' has an integer dtype"},
      {"missing scale", [](InputFile& f) { f.num.erase("scale"); }, "attribute 'scale' is missing"},
      {"zero scale", [](InputFile& f) { f.num["scale"] = 0.0; }, "scale = 0 is not accepted"},
      {"missing l2norm_qk", [](InputFile& f) { f.num.erase("l2norm_qk"); }, "'l2norm_qk' is missing"},
      {"unknown gate", [](InputFile& f) { f.str["gate"] = "sigmoid"; }, "gate = 'sigmoid' is unknown"},
      {"k3 gate without A_log", [](InputFile& f) { f.str["gate"] = "k3"; f.num["g_min"] = -5; }, "dataset 'A_log' is missing"},
      {"k3 gate without g_min", [](InputFile& f) {
         f.str["gate"] = "k3"; f.ds["A_log"] = {Tensor<double>({2}, 0.5), false, {}};
         f.ds["bias"] = {Tensor<double>({2, 32}, 0.5), false, {}}; }, "needs the root attribute 'g_min'"},
      {"beta outside [0, 1]", [](InputFile& f) { f.ds["beta"].t.data[3] = 1.5; }, "outside [0, 1]"},
      {"bf16 claim on fp32 data", [](InputFile& f) { f.ds["q"].attrs["format"] = "bf16"; }, "is not representable in bf16"},
      {"decode without S0", [](InputFile& f) { f.ds.erase("S0"); }, "needs the initial state S0", "kda-decode"},
      // NaN names its tensor, gate parameters are blamed, dangling links, int32 o
      {"NaN in q", [](InputFile& f) { f.ds["q"].t.data[3] = std::nan(""); }, "dataset 'q' holds nan at flat index 3"},
      {"NaN in k", [](InputFile& f) { f.ds["k"].t.data[4] = std::nan(""); }, "dataset 'k' holds nan at flat index 4"},
      {"Inf in v", [](InputFile& f) { f.ds["v"].t.data[5] = HUGE_VAL; }, "dataset 'v' holds inf at flat index 5"},
      {"NaN in A_log", [](InputFile& f) {
         f.str["gate"] = "k3"; f.num["g_min"] = -5; f.ds["A_log"] = {Tensor<double>({2}, 0.5), false, {}};
         f.ds["A_log"].t.data[1] = std::nan(""); f.ds["bias"] = {Tensor<double>({2, 32}, 0.5), false, {}}; },
       "dataset 'A_log' holds nan at flat index 1"},
      {"NaN in bias", [](InputFile& f) {
         f.str["gate"] = "k3"; f.num["g_min"] = -5; f.ds["A_log"] = {Tensor<double>({2}, 0.5), false, {}};
         f.ds["bias"] = {Tensor<double>({2, 32}, 0.5), false, {}}; f.ds["bias"].t.data[9] = std::nan(""); },
       "dataset 'bias' holds nan at flat index 9"},
      {"NaN in dt_bias", [](InputFile& f) {
         f.str["gate"] = "softplus"; f.ds["A_log"] = {Tensor<double>({2}, 0.5), false, {}};
         f.ds["dt_bias"] = {Tensor<double>({2, 32}, 0.5), false, {}}; f.ds["dt_bias"].t.data[2] = std::nan(""); },
       "dataset 'dt_bias' holds nan at flat index 2"},
      {"A_log overflowing the gate", [](InputFile& f) {
         f.str["gate"] = "softplus"; f.ds["A_log"] = {Tensor<double>({2}, 800.0), false, {}};
         f.ds["dt_bias"] = {Tensor<double>({2, 32}, 0.5), false, {}}; },
       "A_log and dt_bias must keep exp(A_log)"},
      {"NaN in S0", [](InputFile& f) { f.ds["S0"].t.data[6] = std::nan(""); }, "dataset 'S0' holds nan at flat index 6"},
      {"q a dangling link", [](InputFile& f) { f.ds.erase("q"); f.dangling.insert("q"); }, "'q' is a dangling link"},
      {"S0 a dangling link", [](InputFile& f) { f.ds.erase("S0"); f.dangling.insert("S0"); }, "'S0' is a dangling link"},
      {"o as int32", [](InputFile& f) { f.ints["o"] = 16; }, "dataset 'o' has an integer dtype"},
  };
  std::set<std::string> messages;
  for (const Bad& b : bads) {
    INFO(b.name);
    InputFile f = derived_file();
    b.edit(f);
    const fs::path in = d / "bad.h5", out = d / "report.h5";
    f.write(in);
    const Run r = run(std::string("check --op ") + b.op + " --in " + in.string() + " --out " + out.string());
    INFO(r.out);
    CHECK(r.rc == 2);
    CHECK(r.out.find(b.says) != std::string::npos);
    CHECK(r.out.find("kdalab check: error:") != std::string::npos);
    CHECK_FALSE(fs::exists(out));
    messages.insert(r.out);
  }
  CHECK(messages.size() == bads.size());  // each variant has its own message
  // missing input file, unknown op
  Run r = run("check --in " + (d / "none.h5").string() + " --out " + (d / "x.h5").string());
  CHECK(r.rc == 2);
  CHECK(r.out.find("not found or not a readable HDF5 file") != std::string::npos);
  r = run("check --op mla2 --in x --out " + (d / "x.h5").string());
  CHECK(r.rc == 2);
  CHECK(r.out.find("--op 'mla2'") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("check --kernel: refused with --op kda-decode and on inputs the kernel does not take; a CPU build checks the input first",
          "[check]") {
  const fs::path d = tmpdir();
  const std::string dec = "data/golden/kda_decode.h5";
  InputFile g = derived_file(dec, "/anchor_decode");
  g.write(d / "dec.h5");
  Run r = run("check --op kda-decode --kernel --in " + (d / "dec.h5").string() + " --out " + (d / "r.h5").string());
  INFO(r.out);
  CHECK(r.rc == 2);
  CHECK(r.out.find("--kernel") != std::string::npos);
  CHECK(!fs::exists(d / "r.h5"));
  // the golden anchor holds d_k = d_v = 8 and the derived (log-decay) gate: the kernel does not take it. The input
  // is checked first in every build (a build without the kernel says so only for input it takes: exit 3, see
  // test_exit_not_available.cpp): exit 2, the reason named, no report.
  InputFile f = derived_file();
  f.write(d / "small.h5");
  r = run("check --op kda --kernel --in " + (d / "small.h5").string() + " --out " + (d / "r.h5").string());
  INFO(r.out);
  CHECK(r.rc == 2);
  CHECK(r.out.find("gate = \"k3\"") != std::string::npos);
  CHECK(!fs::exists(d / "r.h5"));
  fs::remove_all(d);
}

TEST_CASE("check: a shape whose element count overflows 64 bits is bad input (exit 2), not a crash", "[check]") {
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

TEST_CASE("check: a non-finite truth is refused with its cause, never written", "[check]") {
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

TEST_CASE("check: a group where a dataset is expected is an error, not 'absent'", "[check]") {
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

TEST_CASE("check: a string attribute that is empty or holds several strings is refused naming it (an empty one crashed)",
          "[check]") {
  TempDir d;
  H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
  struct Row {
    std::string obj, name;  // the attribute's object ("/" or a dataset) and name
    bool several;           // two strings; otherwise an empty (null dataspace) attribute
  };
  const std::vector<Row> rows = {{"/", "gate", false}, {"/", "gate", true},       {"/", "beta", false},
                                 {"/", "precision", false}, {"S0", "layout", false}, {"q", "format", false},
                                 {"q", "format", true}};
  int k = 0;
  for (const Row& row : rows) {
    const std::string in = d.file(fmt::format("in{}.h5", ++k)), out = d.file(fmt::format("r{}.h5", k));
    InputFile f = derived_file();
    if (row.name == "layout") f.ds["S0"].attrs.clear();
    f.write(in);
    {
      H5::H5File h(in, H5F_ACC_RDWR);
      H5::H5Object* o = nullptr;
      H5::Group root = h.openGroup("/");
      H5::DataSet ds;
      if (row.obj == "/") {
        o = &root;
      } else {
        ds = h.openDataSet(row.obj);
        o = &ds;
      }
      if (row.several) {
        const hsize_t two = 2;
        const char* v[2] = {"none", "k3"};
        o->createAttribute(row.name, st, H5::DataSpace(1, &two)).write(st, v);
      } else {
        o->createAttribute(row.name, st, H5::DataSpace(H5S_NULL));
      }
    }
    const auto r = run_kdalab("check --op kda --in " + in + " --out " + out);
    INFO(row.obj << " " << row.name << (row.several ? " (two strings)" : " (empty)") << "\n" << r.output);
    require_one_line_exit2(r);
    CHECK(has(r, "attribute '" + row.name + "' of '" + row.obj + "' must be a single string, got " +
                     (row.several ? "2" : "0") + " values"));
    CHECK_FALSE(fs::exists(out));
  }
  // a numeric attribute with no value says so (it said "got several values")
  InputFile f = derived_file();
  f.num.erase("scale");
  f.write(d.file("noscale.h5"));
  {
    H5::H5File h(d.file("noscale.h5"), H5F_ACC_RDWR);
    h.openGroup("/").createAttribute("scale", H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_NULL));
  }
  const auto r = run_kdalab("check --op kda --in " + d.file("noscale.h5") + " --out " + d.file("r.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "attribute 'scale' of '/' must be a number (a scalar, got 0 values)"));
  CHECK_FALSE(fs::exists(d.file("r.h5")));
}

TEST_CASE("check: float64 q and k whose squares overflow or underflow float64 are L2-normalised as at any other "
          "scale, in the truth and its gradients", "[check]") {
  const fs::path d = tmpdir();
  // q and k times 2^e (exact in float64): the normalised q and k, so o, S and the gate's gradients, do not change;
  // dq and dk scale by 2^-e. The golden o is the truth of the unscaled file.
  InputFile f = raw_file();
  for (const char* n : {"q", "k"}) f.ds[n] = {f.ds[n].t, false, {}};  // float64: 2^+-600 is no bf16 or float32
  Tensor<double> dO = golden(kGolden, "/o");
  for (std::size_t i = 0; i < dO.data.size(); ++i) dO.data[i] = std::cos(static_cast<double>(i));
  f.ds["do"] = {dO, false, {}};
  f.write(d / "unit.h5");
  const Run base = run("check --op kda-bwd --in " + (d / "unit.h5").string() + " --truth f64 --out " +
                       (d / "unit_r.h5").string());
  INFO(base.out);
  REQUIRE(base.rc == 0);
  const Tensor<double> o = golden(kGolden, "/o");
  for (int e : {600, -600}) {
    InputFile s = f;
    for (const char* n : {"q", "k"})
      for (auto& x : s.ds[n].t.data) x = std::ldexp(x, e);
    s.write(d / "scaled.h5");
    for (const char* truth : {"f64", "mp"}) {
      INFO("q, k times 2^" << e << ", truth " << truth);
      const fs::path fwd = d / "fwd.h5", bwd = d / "bwd.h5";
      Run r = run("check --op kda --in " + (d / "scaled.h5").string() + " --truth " + truth + " --force --out " +
                  fwd.string());
      INFO(r.out);
      REQUIRE(r.rc == 0);
      CHECK(rel_rms(h5read::array(fwd.string(), "/check/o_truth").data, o.data) < tol::check_self.value);
      r = run("check --op kda-bwd --in " + (d / "scaled.h5").string() + " --truth " + truth + " --force --out " +
              bwd.string());
      INFO(r.out);
      REQUIRE(r.rc == 0);
      for (const char* g : {"dq", "dk", "dv", "dg", "dbeta"}) {
        INFO(g);
        Tensor<double> got = h5read::array(bwd.string(), std::string("/check/") + g + "_truth");
        const Tensor<double> want = h5read::array((d / "unit_r.h5").string(), std::string("/check/") + g + "_truth");
        if (g[1] == 'q' || g[1] == 'k')
          for (auto& x : got.data) x = std::ldexp(x, e);
        CHECK(rel_rms(got.data, want.data) < tol::check_self.value);
      }
    }
  }
  fs::remove_all(d);
}
