// `kdalab check --op mla` and `--op attn-res`: files written from the golden fixtures report ~0 for the truth itself
// and the expected error for a bf16-rounded candidate; every malformed variant gives its own clear error, exit 2
// and no report.
#include <H5Cpp.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>

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
const std::string kMla = "data/golden/mla.h5", kRes = "data/golden/attn_res.h5";
const std::string kMlaCase = "/gated_rope_lowrank_q", kMlaNope = "/nope_ungated_fullrank_q", kResCase = "/d32_N8_block3";

struct Ds {
  Tensor<double> t;
  bool f32 = false;
  std::map<std::string, std::string> attrs;
  bool int32 = false;
};
/// An input file: datasets, numeric and string root attributes, dangling soft links.
struct File {
  std::map<std::string, Ds> ds;
  std::map<std::string, double> num;
  std::map<std::string, std::string> str;
  std::set<std::string> dangling;
  void write(const std::string& p) const {
    H5::H5File f(p, H5F_ACC_TRUNC);
    H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
    for (const auto& [name, d] : ds) {
      std::vector<hsize_t> dims(d.t.shape.begin(), d.t.shape.end());
      H5::DataSpace sp(static_cast<int>(dims.size()), dims.data());
      const H5::PredType& ty = d.int32 ? H5::PredType::NATIVE_INT32 : d.f32 ? H5::PredType::NATIVE_FLOAT : H5::PredType::NATIVE_DOUBLE;
      H5::DataSet x = f.createDataSet(name, ty, sp);
      if (d.int32) {
        std::vector<std::int32_t> v(d.t.data.begin(), d.t.data.end());
        x.write(v.data(), ty);
      } else if (d.f32) {
        std::vector<float> v(d.t.data.begin(), d.t.data.end());
        x.write(v.data(), ty);
      } else {
        x.write(d.t.data.data(), ty);
      }
      for (const auto& [k, v] : d.attrs) x.createAttribute(k, st, H5::DataSpace(H5S_SCALAR)).write(st, v);
    }
    for (const auto& n : dangling) H5Lcreate_soft("/nowhere", f.getId(), n.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    H5::Group root = f.openGroup("/");
    for (const auto& [k, v] : num)
      root.createAttribute(k, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_DOUBLE, &v);
    for (const auto& [k, v] : str) root.createAttribute(k, st, H5::DataSpace(H5S_SCALAR)).write(st, v);
  }
};

Tensor<double> with_shape(Tensor<double> t, std::vector<std::size_t> s) {
  REQUIRE(Tensor<double>::numel_of(s) == t.numel());
  t.shape = std::move(s);
  return t;
}
/// Rows [t0, T) of a [T, ...] tensor, as [1, T - t0, ...].
Tensor<double> tail_rows(const Tensor<double>& t, std::size_t t0) {
  std::vector<std::size_t> s = t.shape;
  const std::size_t row = t.numel() / s[0];
  Tensor<double> r(s);
  r.shape[0] = s[0] - t0;
  r.data.assign(t.data.begin() + static_cast<std::ptrdiff_t>(t0 * row), t.data.end());
  r.shape.insert(r.shape.begin(), 1);
  return r;
}

/// --op mla input from a golden MLA case: B = 1, the queries of tokens t0 .. T-1 over the whole cache.
File mla_file(const std::string& c = kMlaCase, std::size_t t0 = 0) {
  File f;
  const std::size_t T = static_cast<std::size_t>(h5read::attr_double(kMla, c, "T"));
  f.ds["q"] = {tail_rows(h5read::array(kMla, c + "/q_abs"), t0), false, {}};
  f.ds["c"] = {with_shape(h5read::array(kMla, c + "/c"), {1, T, static_cast<std::size_t>(h5read::attr_double(kMla, c, "d_c"))}), false, {}};
  if (h5read::attr_double(kMla, c, "d_rope") > 0) {
    f.ds["q_rope"] = {tail_rows(h5read::array(kMla, c + "/q_R"), t0), false, {}};
    const Tensor<double> kr = h5read::array(kMla, c + "/k_R");
    f.ds["k_rope"] = {with_shape(kr, {1, kr.dim(0), kr.dim(1)}), false, {}};
  }
  f.num["scale"] = h5read::attr_double(kMla, c, "scale");
  return f;
}
Tensor<double> mla_a(const std::string& c = kMlaCase, std::size_t t0 = 0) { return tail_rows(h5read::array(kMla, c + "/a"), t0); }

/// --op attn-res input from the golden AttnRes case (block mode).
File res_file() {
  File f;
  f.ds["v"] = {h5read::array(kRes, kResCase + "/v"), false, {}};
  f.ds["w"] = {h5read::array(kRes, kResCase + "/w"), false, {}};
  f.str["mode"] = "block";
  f.num["block_sources"] = h5read::attr_double(kRes, kResCase, "block_sources");
  f.num["eps"] = h5read::attr_double(kRes, kResCase, "eps");
  return f;
}

double reported(const std::string& report, const std::string& tensor) {
  const auto names = h5read::strings(report, "/check/report/tensor");
  const auto err = h5read::array(report, "/check/report/rel_rms");
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == tensor) return err.data[i];
  FAIL("tensor " << tensor << " not in the report");
  return -1;
}

Tensor<double> bf16(Tensor<double> t) {
  for (auto& x : t.data) x = round_bf16(x);
  return t;
}

/// Runs check on f: the truth itself (~0), a bf16-rounded candidate (its own rounding error), and
/// the same candidate with a tolerance below that error (FAIL, exit 1).
void truth_and_bf16(File f, const std::string& op, const std::string& cand, const Tensor<double>& truth) {
  TempDir d;
  const double expected = rel_rms(bf16(truth).data, truth.data);
  REQUIRE(expected > 1e-3);
  for (const char* tk : {"mp", "f64"}) {
    INFO(op << " truth " << tk);
    f.ds[cand] = {truth, false, {}};
    f.write(d.file("self.h5"));
    auto r = run_kdalab("check --op " + op + " --in " + d.file("self.h5") + " --truth " + tk + " --force --out " + d.file("r.h5"));
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK(r.output.find("check: PASS") != std::string::npos);
    CHECK(reported(d.file("r.h5"), cand) < tol::check_self.value);
    f.ds[cand] = {bf16(truth), true, {{"format", "bf16"}}};
    f.write(d.file("bf16.h5"));
    r = run_kdalab("check --op " + op + " --in " + d.file("bf16.h5") + " --truth " + tk + " --force --out " + d.file("r.h5"));
    INFO(r.output);
    REQUIRE(r.code == 0);
    const double got = reported(d.file("r.h5"), cand);
    CAPTURE(got, expected);
    CHECK(std::fabs(got - expected) <= tol::check_metric_agreement.value * expected);
    r = run_kdalab("check --op " + op + " --in " + d.file("bf16.h5") + " --truth " + tk + " --tol 1e-4 --force --out " +
                   d.file("r.h5"));
    CHECK(r.code == 1);
    CHECK(r.output.find("check: FAIL") != std::string::npos);
  }
}

struct Bad {
  const char* name;
  std::function<void(File&)> edit;
  const char* says;
};
void all_bad(const std::function<File()>& base, const std::string& op, const std::vector<Bad>& bads) {
  TempDir d;
  std::set<std::string> messages;
  for (const Bad& b : bads) {
    INFO(op << ": " << b.name);
    File f = base();
    b.edit(f);
    f.write(d.file("bad.h5"));
    const auto r = run_kdalab("check --op " + op + " --in " + d.file("bad.h5") + " --out " + d.file("report.h5"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(b.says) != std::string::npos);
    CHECK(r.output.find("kdalab check: error:") != std::string::npos);
    CHECK_FALSE(fs::exists(d.file("report.h5")));
    messages.insert(r.output);
  }
  CHECK(messages.size() == bads.size());  // each variant has its own message
}
}  // namespace

TEST_CASE("check --op mla: the golden attended latent reports ~0; a bf16-rounded one reports the bf16 error",
          "[check]") {
  truth_and_bf16(mla_file(), "mla", "o", mla_a());                        // prefill: every query, causal
  truth_and_bf16(mla_file(kMlaCase, 8), "mla", "o", mla_a(kMlaCase, 8));  // decode: the last query over the cache
  truth_and_bf16(mla_file(kMlaNope), "mla", "o", mla_a(kMlaNope));        // no rope part
}

TEST_CASE("check --op mla without a candidate writes the truth", "[check]") {
  TempDir d;
  mla_file(kMlaCase, 3).write(d.file("in.h5"));
  const auto r = run_kdalab("check --op mla --in " + d.file("in.h5") + " --out " + d.file("t.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output.find("no candidate") != std::string::npos);
  CHECK(rel_rms(h5read::array(d.file("t.h5"), "/check/o_truth").data, mla_a(kMlaCase, 3).data) < tol::check_self.value);
}

TEST_CASE("check --op kda on an MLA file says to use --op mla", "[check]") {
  TempDir d;
  mla_file(kMlaCase, 3).write(d.file("in.h5"));
  const auto r = run_kdalab("check --op kda --in " + d.file("in.h5") + " --out " + d.file("t.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("give --op mla") != std::string::npos);
  // --kernel is a KDA-only option: with --op mla it is refused, not ignored
  const auto r2 = run_kdalab("check --op mla --kernel --in " + d.file("in.h5") + " --out " + d.file("t2.h5"));
  INFO(r2.output);
  CHECK(r2.code == 2);
  CHECK(r2.output.find("--kernel") != std::string::npos);
  CHECK(!std::filesystem::exists(d.file("t2.h5")));
}

TEST_CASE("check --op mla: every malformed file gives its own clear error, exit 2 and no report", "[check]") {
  all_bad([] { return mla_file(); }, "mla",
          {
              {"missing q", [](File& f) { f.ds.erase("q"); }, "dataset 'q' is missing"},
              {"missing c", [](File& f) { f.ds.erase("c"); }, "dataset 'c' is missing"},
              {"q of rank 3", [](File& f) { auto& t = f.ds["q"].t; t.shape = {t.dim(1), t.dim(2), t.dim(3)}; },
               "dataset 'q' has rank 3"},
              {"c with another d_c", [](File& f) { auto& t = f.ds["c"].t; t.shape = {1, t.dim(1) * 2, t.dim(2) / 2}; },
               "dataset 'c' has shape"},
              {"fewer cached tokens than queries", [](File& f) { auto& t = f.ds["c"].t; t.shape[1] -= 2;
                 t.data.resize(t.data.size() - 2 * t.dim(2)); auto& k = f.ds["k_rope"].t; k.shape[1] -= 2;
                 k.data.resize(k.data.size() - 2 * k.dim(2)); }, "fewer than the T"},
              {"q_rope without k_rope", [](File& f) { f.ds.erase("k_rope"); }, "'q_rope' is given without 'k_rope'"},
              {"q_rope of another shape", [](File& f) { auto& t = f.ds["q_rope"].t; t.shape[2] *= 2; t.shape[3] /= 2; },
               "dataset 'q_rope' has shape"},
              {"missing scale", [](File& f) { f.num.erase("scale"); }, "root attribute 'scale' is missing"},
              {"negative scale", [](File& f) { f.num["scale"] = -0.5; }, "attribute scale = -0.5"},
              {"o of another shape", [](File& f) { f.ds["o"] = {f.ds["c"].t, false, {}}; }, "dataset 'o' has rank 3"},
              {"o as int32", [](File& f) { f.ds["o"] = {f.ds["q"].t, false, {}, true}; }, "'o' has an integer dtype"},
              {"NaN in c", [](File& f) { f.ds["c"].t.data[5] = std::nan(""); }, "dataset 'c' holds nan at flat index 5"},
              {"NaN in q", [](File& f) { f.ds["q"].t.data[7] = std::nan(""); }, "dataset 'q' holds nan at flat index 7"},
              {"c a dangling link", [](File& f) { f.ds.erase("c"); f.dangling.insert("c"); }, "'c' is a dangling link"},
              {"bf16 claim on fp64 data", [](File& f) { f.ds["q"].attrs["format"] = "bf16"; }, "is not representable in bf16"},
          });
}

TEST_CASE("check --op attn-res: the golden h reports ~0; a bf16-rounded one reports the bf16 error", "[check]") {
  truth_and_bf16(res_file(), "attn-res", "h", h5read::array(kRes, kResCase + "/h_block"));
  File full = res_file();
  full.str["mode"] = "full";
  full.num.erase("block_sources");
  truth_and_bf16(full, "attn-res", "h", h5read::array(kRes, kResCase + "/h_full"));
}

TEST_CASE("check --op attn-res: every malformed file gives its own clear error, exit 2 and no report", "[check]") {
  all_bad(res_file, "attn-res",
          {
              {"missing v", [](File& f) { f.ds.erase("v"); }, "dataset 'v' is missing"},
              {"v of rank 2", [](File& f) { auto& t = f.ds["v"].t; t.shape = {t.dim(0) * t.dim(1), t.dim(2)}; },
               "dataset 'v' has rank 2"},
              {"w of another width", [](File& f) { f.ds["w"].t = Tensor<double>({7}, 0.5); }, "dataset 'w' has shape [7]"},
              {"missing mode", [](File& f) { f.str.erase("mode"); }, "root attribute 'mode' is missing"},
              {"unknown mode", [](File& f) { f.str["mode"] = "plain"; }, "mode = 'plain' is unknown"},
              {"block without block_sources", [](File& f) { f.num.erase("block_sources"); }, "needs the root attribute 'block_sources'"},
              {"block_sources 0", [](File& f) { f.num["block_sources"] = 0; }, "block_sources = 0 is not accepted"},
              {"missing eps", [](File& f) { f.num.erase("eps"); }, "root attribute 'eps' is missing"},
              {"h of another shape", [](File& f) { f.ds["h"] = {f.ds["w"].t, false, {}}; }, "dataset 'h' has rank 1"},
              {"NaN in w", [](File& f) { f.ds["w"].t.data[2] = std::nan(""); }, "dataset 'w' holds nan at flat index 2"},
              {"w a dangling link", [](File& f) { f.ds.erase("w"); f.dangling.insert("w"); }, "'w' is a dangling link"},
          });
}
