// `kdalab check --op kda-bwd | mla-bwd | attn-res-bwd` and the budget rule of every check: float64 gradients of the
// reference are within the noise of their precision; a planted wrong-sign gradient is over budget (exit 1); the
// budget does not depend on the candidate; a file whose only candidate is misspelt checks nothing (exit 4), forward
// and backward alike; a budget that overflows is bad input, never a pass; --precision with --tol is refused; an
// all-zero truth has no relative floor; a candidate of the sibling op is named as not checked.
#include <H5Cpp.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "numerics/bf16.hpp"
#include "numerics/check_ops.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab;
using namespace kdalab::testutil;

namespace {
Tensor<double> normal(std::vector<std::size_t> shape, std::mt19937_64& gen, double scale = 1, bool bf16 = false) {
  Tensor<double> t(std::move(shape));
  std::normal_distribution<double> n(0, 1);
  for (auto& x : t.data) x = bf16 ? round_bf16(scale * n(gen)) : scale * n(gen);
  return t;
}

/// Writes float64 datasets (with an optional string attribute each) and root attributes.
void write(const std::string& path, const std::map<std::string, Tensor<double>>& ds,
           const std::map<std::string, double>& num, const std::map<std::string, std::string>& str,
           const std::map<std::string, std::string>& layout = {}) {
  H5::H5File f(path, H5F_ACC_TRUNC);
  H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
  for (const auto& [name, t] : ds) {
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    H5::DataSet x = f.createDataSet(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(static_cast<int>(dims.size()), dims.data()));
    x.write(t.data.data(), H5::PredType::NATIVE_DOUBLE);
    if (layout.count(name)) x.createAttribute("layout", st, H5::DataSpace(H5S_SCALAR)).write(st, layout.at(name));
  }
  H5::Group root = f.openGroup("/");
  for (const auto& [k, v] : num)
    root.createAttribute(k, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_DOUBLE, &v);
  for (const auto& [k, v] : str) root.createAttribute(k, st, H5::DataSpace(H5S_SCALAR)).write(st, v);
}

/// A small KDA problem with every pre-op (K3 gate, beta logits, L2Norm, S0, dS) and its float64 reference gradients.
struct KdaCase {
  KdaCheckOp op;
  Tensor<double> dO, dS;
  KdaCheckGrads g;
  std::map<std::string, Tensor<double>> inputs() const {
    return {{"q", op.q}, {"k", op.k}, {"v", op.v}, {"g", op.g}, {"beta", op.beta}, {"S0", op.S0},
            {"A_log", op.A_log}, {"bias", op.bias}, {"do", dO}, {"dS", dS}};
  }
  std::map<std::string, Tensor<double>> grads() const {
    return {{"dq", g.dq}, {"dk", g.dk}, {"dv", g.dv}, {"dg", g.dg}, {"dbeta", g.dbeta},
            {"dS0", g.dS0}, {"dA_log", g.dA_log}, {"dbias", g.dbias}};
  }
};
KdaCase kda_case() {
  std::mt19937_64 gen(3);
  const std::size_t B = 1, T = 20, H = 1, HV = 2, D = 8;
  KdaCase c;
  c.op.q = normal({B, T, H, D}, gen, 1, true);
  c.op.k = normal({B, T, H, D}, gen, 1, true);
  c.op.v = normal({B, T, HV, D}, gen, 1, true);
  c.op.g = normal({B, T, HV, D}, gen, 1, true);
  c.op.beta = normal({B, T, HV}, gen, 1, true);
  c.op.A_log = normal({HV}, gen, 0.3);
  c.op.bias = normal({HV, D}, gen, 0.3);
  c.op.S0 = normal({B, HV, D, D}, gen, 0.1);
  c.op.has_S0 = c.op.l2norm = c.op.beta_logits = true;
  c.op.gate = KdaGateKind::k3;
  c.op.scale = 0.35;
  c.dO = normal({B, T, HV, D}, gen);
  c.dS = normal({B, HV, D, D}, gen, 0.1);
  c.g = kda_check_backward_truth<double>(c.op, c.dO, &c.dS);
  return c;
}
const std::map<std::string, double> kKdaNum{{"scale", 0.35}, {"l2norm_qk", 1}, {"g_min", -5}};
const std::map<std::string, std::string> kKdaStr{{"gate", "k3"}, {"beta", "logits"}, {"layout", "KV"}};

std::string cell(const std::string& report, const std::string& col, const std::string& tensor) {
  const auto names = h5read::strings(report, "/check/report/tensor"), v = h5read::strings(report, "/check/report/" + col);
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == tensor) return v[i];
  FAIL("tensor " << tensor << " not in the report");
  return "";
}
double num(const std::string& report, const std::string& col, const std::string& tensor) {
  const auto names = h5read::strings(report, "/check/report/tensor");
  const auto v = h5read::array(report, "/check/report/" + col).data;
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == tensor) return v[i];
  FAIL("tensor " << tensor << " not in the report");
  return 0;
}
}  // namespace

TEST_CASE("check --op kda-bwd: the reference's float64 gradients are within; a wrong-sign dk is over budget, exit 1",
          "[check]") {
  TempDir d;
  const KdaCase c = kda_case();
  auto ds = c.inputs();
  for (const auto& [n, t] : c.grads()) ds[n] = t;
  write(d.file("in.h5"), ds, kKdaNum, kKdaStr);
  auto r = run_kdalab("check --op kda-bwd --truth mp --in " + d.file("in.h5") + " --out " + d.file("r.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  for (const auto& [n, t] : c.grads()) {
    INFO(n);
    CHECK(num(d.file("r.h5"), "rel_rms", n) <= 1e-12);
    CHECK(cell(d.file("r.h5"), "verdict", n) == "within the noise of its precision");
  }
  ds["dk"] = c.g.dk;
  for (auto& x : ds["dk"].data) x = -x;
  write(d.file("bad.h5"), ds, kKdaNum, kKdaStr);
  r = run_kdalab("check --op kda-bwd --truth f64 --precision bf16 --in " + d.file("bad.h5") + " --out " + d.file("rb.h5"));
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK(cell(d.file("rb.h5"), "verdict", "dk").rfind("over budget by x", 0) == 0);
  CHECK(cell(d.file("rb.h5"), "verdict", "dq") == "within the noise of its precision");
}

TEST_CASE("check: the budget depends on the inputs, precision and output format, never on the candidate", "[check]") {
  TempDir d;
  const KdaCase c = kda_case();
  std::map<std::string, double> budgets[2];
  for (int i = 0; i < 2; ++i) {
    auto ds = c.inputs();
    for (const auto& [n, t] : c.grads()) {
      ds[n] = t;
      if (i == 1)
        for (auto& x : ds[n].data) x *= 1.5;  // a candidate 50% off
    }
    write(d.file("in.h5"), ds, kKdaNum, kKdaStr);
    const auto r = run_kdalab("check --op kda-bwd --truth f64 --precision bf16 --force --in " + d.file("in.h5") +
                              " --out " + d.file("r.h5"));
    INFO(r.output);
    CHECK(r.code == (i == 0 ? 0 : 1));
    for (const auto& [n, t] : c.grads()) budgets[i][n] = num(d.file("r.h5"), "budget", n);
  }
  for (const auto& [n, b] : budgets[0]) {
    INFO(n);
    CHECK(b == budgets[1][n]);
    CHECK(b > tol::budget_floor.value);
  }
}

TEST_CASE("check: a file whose only candidate is misspelt checks nothing: exit 4, the name on stderr, no report",
          "[check]") {
  TempDir d;
  const KdaCase c = kda_case();
  auto ds = c.inputs();
  ds["dq_"] = c.g.dq;
  write(d.file("bwd.h5"), ds, kKdaNum, kKdaStr);
  auto r = run_kdalab("check --op kda-bwd --truth f64 --in " + d.file("bwd.h5") + " --out " + d.file("r.h5"));
  INFO(r.output);
  CHECK(r.code == 4);
  CHECK(r.output.find("dataset 'dq_' matches no name") != std::string::npos);
  CHECK(!std::filesystem::exists(d.file("r.h5")));
  ds.erase("dq_");
  ds.erase("do");
  ds.erase("dS");
  ds["O"] = c.g.dv;  // a forward output under a wrong name
  write(d.file("fwd.h5"), ds, kKdaNum, kKdaStr);
  r = run_kdalab("check --op kda --truth f64 --in " + d.file("fwd.h5") + " --out " + d.file("r.h5"));
  INFO(r.output);
  CHECK(r.code == 4);
  CHECK(r.output.find("dataset 'O' matches no name") != std::string::npos);
  CHECK(!std::filesystem::exists(d.file("r.h5")));
}

TEST_CASE("check --op mla-bwd and attn-res-bwd: the reference's float64 gradients are within", "[check]") {
  TempDir d;
  std::mt19937_64 gen(5);
  MlaCheckOp m{normal({1, 4, 2, 8}, gen, 1, true), normal({1, 6, 8}, gen, 1, true), normal({1, 4, 2, 4}, gen),
               normal({1, 6, 4}, gen), 0.3};
  const Tensor<double> dO = normal({1, 4, 2, 8}, gen);
  const MlaCheckGrads mg = mla_check_backward_truth<double>(m, dO);
  write(d.file("mla.h5"),
        {{"q", m.q}, {"c", m.c}, {"q_rope", m.q_rope}, {"k_rope", m.k_rope}, {"do", dO}, {"dq", mg.dq}, {"dc", mg.dc},
         {"dq_rope", mg.dq_rope}, {"dk_rope", mg.dk_rope}},
        {{"scale", 0.3}}, {});
  auto r = run_kdalab("check --op mla-bwd --truth mp --in " + d.file("mla.h5") + " --out " + d.file("rm.h5"));
  INFO(r.output);
  CHECK(r.code == 0);
  for (const char* n : {"dq", "dc", "dq_rope", "dk_rope"}) CHECK(num(d.file("rm.h5"), "rel_rms", n) <= 1e-12);

  AttnResCheckOp a{normal({5, 3, 16}, gen, 1, true), normal({16}, gen, 0.5), ResidualMode::block, 2, 1e-6};
  const Tensor<double> dh = normal({3, 16}, gen);
  const AttnResCheckGrads ag = attn_res_check_backward_truth<double>(a, dh);
  write(d.file("ar.h5"), {{"v", a.v}, {"w", a.w}, {"do", dh}, {"dv", ag.dv}, {"dw", ag.dw}},
        {{"block_sources", 2}, {"eps", 1e-6}}, {{"mode", "block"}});
  r = run_kdalab("check --op attn-res-bwd --truth mp --in " + d.file("ar.h5") + " --out " + d.file("ra.h5"));
  INFO(r.output);
  CHECK(r.code == 0);
  for (const char* n : {"dv", "dw"}) {
    CHECK(num(d.file("ra.h5"), "rel_rms", n) <= 1e-12);
    CHECK(cell(d.file("ra.h5"), "verdict", n) == "within the noise of its precision");
  }
}

TEST_CASE("check: a budget that overflows (the plain algorithm at the declared precision, or the truth in the "
          "candidate's format) is bad input: exit 2, nothing written, never a pass",
          "[check]") {
  TempDir d;
  std::mt19937_64 gen(7);
  // |v| ~ 1e5 > 65504, the largest fp16; the candidates are zeros: wrong by a relative RMS of 1
  const Tensor<double> v = normal({3, 2, 4}, gen, 1e5), w = normal({4}, gen), dh = normal({2, 4}, gen);
  write(d.file("ar.h5"), {{"v", v}, {"w", w}, {"h", Tensor<double>({2, 4})}}, {{"eps", 1e-6}}, {{"mode", "full"}});
  auto r = run_kdalab("check --op attn-res --precision fp16 --in " + d.file("ar.h5") + " --out " + d.file("r.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "the budget of 'h' is not finite: the plain algorithm at precision fp16"));
  CHECK(!std::filesystem::exists(d.file("r.h5")));
  {  // the same zeros declared fp16: the truth (~1e5) has no fp16 value
    H5::H5File f(d.file("ar.h5"), H5F_ACC_RDWR);
    H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
    f.openDataSet("h").createAttribute("format", st, H5::DataSpace(H5S_SCALAR)).write(st, std::string("fp16"));
  }
  r = run_kdalab("check --op attn-res --in " + d.file("ar.h5") + " --out " + d.file("r.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "the budget of 'h' is not finite: its truth overflows the candidate's format fp16"));
  CHECK(!std::filesystem::exists(d.file("r.h5")));
  write(d.file("arb.h5"), {{"v", v}, {"w", w}, {"do", dh}, {"dv", Tensor<double>({3, 2, 4})}, {"dw", Tensor<double>({4})}},
        {{"eps", 1e-6}}, {{"mode", "full"}});
  r = run_kdalab("check --op attn-res-bwd --precision fp16 --in " + d.file("arb.h5") + " --out " + d.file("r.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "the budget of 'dv' is not finite"));
  CHECK(!std::filesystem::exists(d.file("r.h5")));
}

TEST_CASE("check: --tol replaces the budget rule, so --precision with --tol is refused (exit 2, nothing written)",
          "[check]") {
  TempDir d;
  const KdaCase c = kda_case();
  auto ds = c.inputs();
  ds["dq"] = c.g.dq;
  write(d.file("in.h5"), ds, kKdaNum, kKdaStr);
  const auto r = run_kdalab("check --op kda-bwd --truth f64 --tol 1e-3 --precision bf16 --in " + d.file("in.h5") +
                            " --out " + d.file("r.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "--precision bf16 sets the budget rule's precision and --tol replaces that rule"));
  CHECK(!std::filesystem::exists(d.file("r.h5")));
}

TEST_CASE("check: an all-zero truth passes only a candidate as exact as the plain algorithm, under the budget rule "
          "and under --tol (never the relative floor applied to an absolute error)",
          "[check]") {
  TempDir d;
  std::mt19937_64 gen(9);
  // one source: h = v_0 whatever w is, so the truth dw is exactly 0 (and dv = do)
  AttnResCheckOp a{normal({1, 3, 8}, gen), normal({8}, gen), ResidualMode::full, 1, 1e-6};
  const Tensor<double> dh = normal({3, 8}, gen);
  const AttnResCheckGrads ag = attn_res_check_backward_truth<double>(a, dh);
  REQUIRE(std::all_of(ag.dw.data.begin(), ag.dw.data.end(), [](double x) { return x == 0.0; }));
  Tensor<double> dw_wrong({8});
  for (auto& x : dw_wrong.data) x = 1e-14;  // wrong, and below the relative floor 1e-12 as an absolute error
  for (const bool exact : {true, false}) {
    write(d.file("ar.h5"), {{"v", a.v}, {"w", a.w}, {"do", dh}, {"dv", ag.dv}, {"dw", exact ? ag.dw : dw_wrong}},
          {{"eps", 1e-6}}, {{"mode", "full"}});
    const auto r = run_kdalab("check --op attn-res-bwd --truth mp --force --in " + d.file("ar.h5") + " --out " +
                              d.file("r.h5"));
    INFO(r.output);
    CHECK(r.code == (exact ? 0 : 1));
    CHECK(cell(d.file("r.h5"), "verdict", "dw").rfind(exact ? "within" : "over budget", 0) == 0);
    CHECK(cell(d.file("r.h5"), "verdict", "dv") == "within the noise of its precision");
  }
  // --tol is a relative tolerance: a nonzero candidate against an all-zero truth (do = 0) is never within it
  const KdaCase c = kda_case();
  auto ds = c.inputs();
  ds["do"] = Tensor<double>(c.dO.shape);
  ds.erase("dS");
  ds["dq"] = Tensor<double>(c.g.dq.shape);
  for (auto& x : ds["dq"].data) x = 1e-6;
  write(d.file("kda.h5"), ds, kKdaNum, kKdaStr);
  const auto r = run_kdalab("check --op kda-bwd --truth f64 --tol 1e-3 --in " + d.file("kda.h5") + " --out " +
                            d.file("rk.h5"));
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK(cell(d.file("rk.h5"), "verdict", "dq").rfind("over --tol", 0) == 0);
}

TEST_CASE("check: a candidate of the forward / backward sibling is named on stderr as not checked", "[check]") {
  TempDir d;
  const KdaCase c = kda_case();
  auto ds = c.inputs();
  ds["o"] = Tensor<double>({1, 20, 2, 8});  // a forward output in a gradient check: not checked, and said so
  write(d.file("in.h5"), ds, kKdaNum, kKdaStr);
  auto r = run_kdalab("check --op kda-bwd --truth f64 --in " + d.file("in.h5") + " --out " + d.file("r.h5"));
  INFO(r.output);
  CHECK(r.code == 0);  // no gradient candidate: the truth gradients are written
  CHECK(has(r, "dataset 'o' is a candidate of --op kda, not of --op kda-bwd, and is not checked"));
  CHECK(has(r, "no candidate of --op kda-bwd in the file"));
  ds.erase("o");
  ds["dq"] = c.g.dq;
  write(d.file("fwd.h5"), ds, kKdaNum, kKdaStr);
  r = run_kdalab("check --op kda --truth f64 --in " + d.file("fwd.h5") + " --out " + d.file("rf.h5"));
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(has(r, "dataset 'dq' is a candidate of --op kda-bwd, not of --op kda, and is not checked"));
}

TEST_CASE("check: a root attribute precision that is not a precision is refused also without a candidate or with --tol",
          "[check]") {
  TempDir d;
  const KdaCase c = kda_case();
  auto str = kKdaStr;
  str["precision"] = "bf17";
  for (const bool cand : {false, true}) {
    auto ds = c.inputs();
    if (cand) ds["dq"] = c.g.dq;
    write(d.file("in.h5"), ds, kKdaNum, str);
    const auto r = run_kdalab("check --op kda-bwd --truth f64 " + std::string(cand ? "--tol 1e-3 " : "") + "--in " +
                              d.file("in.h5") + " --out " + d.file("r.h5"));
    require_one_line_exit2(r);
    CHECK(has(r, "root attribute precision = 'bf17' is unknown; accepted: bf16, fp16, fp32, fp64"));
    CHECK(!std::filesystem::exists(d.file("r.h5")));
  }
}

TEST_CASE("check: a budget >= 1 (the plain algorithm at the precision no better than zeros) is bad input, never a pass",
          "[check]") {
  TempDir d;
  std::mt19937_64 gen(11);
  // |v| ~ 1e30 is a bf16 number, but its square overflows the fp32 RMSNorm of the plain algorithm at bf16
  const Tensor<double> v = normal({3, 2, 4}, gen, 1e30, true), w = normal({4}, gen);
  write(d.file("ar.h5"), {{"v", v}, {"w", w}, {"h", Tensor<double>({2, 4})}}, {{"eps", 1e-6}}, {{"mode", "full"}});
  auto r = run_kdalab("check --op attn-res --precision bf16 --in " + d.file("ar.h5") + " --out " + d.file("r.h5"));
  require_one_line_exit2(r);
  CHECK(has(r, "the budget of 'h' is"));
  CHECK(has(r, ">= 1: the plain algorithm at precision bf16"));
  CHECK(!std::filesystem::exists(d.file("r.h5")));
  r = run_kdalab("check --op attn-res --precision fp64 --in " + d.file("ar.h5") + " --out " + d.file("r.h5"));
  INFO(r.output);
  CHECK(r.code == 1);  // at fp64 the rule judges: the zeros are over budget
}
