// The research experiments (ISSUE 8): each --quick run writes a file with the expected groups and
// columns; bad options exit 2 and write nothing; the known curves appear (EQUATIONS.md section 9):
// delta rule with beta = 1 exact up to d_k orthonormal keys, linear attention's relative error
// ~ sqrt(N / d), softmax exact; seed 002's decode table reproduced exactly.
#include <cmath>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab;
using namespace kdalab::testutil;

namespace {
std::vector<double> col(const std::string& f, const std::string& ds) { return h5read::array(f, ds).data; }
std::vector<std::string> scol(const std::string& f, const std::string& ds) { return h5read::strings(f, ds); }
void require_columns(const std::string& f, const std::string& table, const std::vector<std::string>& cols) {
  for (const auto& c : cols) {
    INFO(table << "/" << c);
    CHECK(h5read::exists(f, table + "/" + c));
  }
}
}  // namespace

TEST_CASE("recall --quick: table, known curves") {
  TempDir d;
  const auto r = run_kdalab("recall --quick --quiet --out " + d.file("r.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string f = d.file("r.h5");
  const std::string t = "recall/capacity";
  require_columns(f, t, {"memory", "keys", "d_k", "N", "ratio", "beta", "g_min", "d_c", "accuracy", "rel_err", "queries",
                         "mean_distance", "state_numbers"});
  const auto mem = scol(f, t + "/memory"), keys = scol(f, t + "/keys");
  const auto dk = col(f, t + "/d_k"), N = col(f, t + "/N"), beta = col(f, t + "/beta"), acc = col(f, t + "/accuracy"),
             err = col(f, t + "/rel_err");
  int n_delta = 0, n_lin = 0, n_soft = 0;
  for (std::size_t i = 0; i < mem.size(); ++i) {
    CAPTURE(i, mem[i], keys[i], dk[i], N[i], beta[i], acc[i], err[i]);
    if (mem[i] == "deltanet" && keys[i] == "orthogonal" && beta[i] == 1.0 && N[i] <= dk[i]) {
      CHECK(acc[i] == 1.0);
      CHECK(err[i] <= tol::f64_identity.value);
      ++n_delta;
    }
    if (mem[i] == "deltanet" && keys[i] == "orthogonal" && beta[i] == 1.0 && N[i] >= 2 * dk[i]) CHECK(err[i] > 0.1);
    // beta = 0.5 on orthonormal keys writes half of each value (linear attention would write all of it).
    if (mem[i] == "deltanet" && keys[i] == "orthogonal" && beta[i] == 0.5 && N[i] <= dk[i]) {
      CHECK(std::abs(err[i] - 0.5) <= tol::f64_identity.value);
      ++n_delta;
    }
    if (mem[i] == "linear" && keys[i] == "random" && N[i] >= 4) {
      const double pred = std::sqrt((N[i] - 1) / dk[i]), f_ = tol::recall_linear_sqrt_factor.value;
      CHECK(err[i] <= f_ * pred);
      CHECK(err[i] >= pred / f_);
      ++n_lin;
    }
    if (mem[i] == "softmax" && keys[i] != "correlated") {
      CHECK(acc[i] == 1.0);
      CHECK(err[i] <= tol::recall_softmax_exact.value);
      ++n_soft;
    }
  }
  CHECK(n_delta >= 8);
  CHECK(n_lin >= 4);
  CHECK(n_soft >= 8);
  CHECK(h5read::attr_string(f, "/", "software") == "kdalab");
}

TEST_CASE("copy --quick: table, the information bound, and the capacity of the delta rule") {
  TempDir d;
  const auto r = run_kdalab("copy --quick --quiet --out " + d.file("c.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string f = d.file("c.h5"), t = "copy/accuracy";
  require_columns(f, t, {"memory", "precision", "d_k", "L", "alphabet", "token_accuracy", "copy_accuracy", "rel_err",
                         "strings", "state_numbers", "state_bits", "info_bits", "bound_allows"});
  const auto mem = scol(f, t + "/memory"), prec = scol(f, t + "/precision");
  const auto dk = col(f, t + "/d_k"), L = col(f, t + "/L"), D = col(f, t + "/alphabet"), ca = col(f, t + "/copy_accuracy"),
             info = col(f, t + "/info_bits"), bits = col(f, t + "/state_bits"), allow = col(f, t + "/bound_allows");
  int n = 0;
  for (std::size_t i = 0; i < mem.size(); ++i) {
    CAPTURE(i, mem[i], prec[i], dk[i], L[i], ca[i]);
    CHECK(info[i] == L[i] * std::log2(D[i]));
    CHECK(allow[i] == (info[i] <= bits[i] ? 1.0 : 0.0));
    if (mem[i] == "softmax") CHECK(ca[i] == 1.0);
    if (mem[i] == "deltanet" && prec[i] == "fp64") {  // orthogonal position keys (the default)
      if (L[i] <= dk[i]) CHECK(ca[i] == 1.0);
      if (L[i] >= 2 * dk[i]) CHECK(ca[i] == 0.0);
      ++n;
    }
    if (mem[i] == "kda" && prec[i] == "fp32") CHECK(bits[i] == dk[i] * dk[i] * 32);
  }
  CHECK(n >= 6);
}

TEST_CASE("decode-cost --quick: seed 002's table, CPU rows, the hybrid model and its bound") {
  TempDir d;
  const auto r = run_kdalab("decode-cost --quick --quiet --out " + d.file("d.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string f = d.file("d.h5");
  const auto n = col(f, "decode_cost/analytic/n"), dd = col(f, "decode_cost/analytic/d"),
             rf = col(f, "decode_cost/analytic/ratio_floor"), sm = col(f, "decode_cost/analytic/softmax_reads");
  // Seed 002 (d = 64): 1,000 -> 128,000 (31x); 128,000 -> 16,384,000 (4,000x); 1,000,000 -> 128,000,000 (31,250x).
  const std::vector<std::vector<double>> seed{{1000, 64, 128000, 31}, {128000, 64, 16384000, 4000}, {1000000, 64, 128000000, 31250},
                                              {1000000, 128, 256000000, 15625}};
  for (const auto& s : seed) {
    bool found = false;
    for (std::size_t i = 0; i < n.size(); ++i)
      if (n[i] == s[0] && dd[i] == s[1]) {
        found = true;
        CHECK(sm[i] == s[2]);
        CHECK(rf[i] == s[3]);
      }
    CHECK(found);
  }
  require_columns(f, "decode_cost/cpu", {"impl", "n", "d", "seconds_per_token", "numbers_read"});
  const auto impl = scol(f, "decode_cost/cpu/impl");
  const auto sec = col(f, "decode_cost/cpu/seconds_per_token"), cn = col(f, "decode_cost/cpu/n");
  double soft_small = 0, soft_big = 0;
  for (std::size_t i = 0; i < impl.size(); ++i) {
    CHECK(sec[i] > 0);
    if (impl[i] == "softmax" && cn[i] == 1024) soft_small = sec[i];
    if (impl[i] == "softmax" && cn[i] == 16384) soft_big = sec[i];
  }
  CHECK(soft_big > 4 * soft_small);  // 16x the cache: the read grows with n (loose: a shared CPU)
  require_columns(f, "decode_cost/hybrid", {"layout", "n", "batch", "batch_kind", "bytes_per_token", "seconds_per_token",
                                            "step_seconds", "memory_bytes", "speedup_vs_mla"});
  const double s48 = h5read::attr_double(f, "decode_cost/hybrid", "attention_speedup_1m_48b");
  CHECK(s48 > 3.7);
  CHECK(s48 < 27.0 / 7.0);  // the attention-only limit L / L_MLA
  CHECK(h5read::attr_double(f, "decode_cost/hybrid", "reported_speedup") == 11.48 / 1.84);
  CHECK(h5read::attr_string(f, "decode_cost/hybrid", "bound").find("EQUAL batch") != std::string::npos);
  CHECK(h5read::exists(f, "decode_cost/gpu"));
}

TEST_CASE("decay-range --quick: fp32 chunk-16 survives g_min = -5, fails past the edges and for C = 32 at -3") {
  TempDir d;
  const auto r = run_kdalab("decay-range --quick --quiet --out " + d.file("dr.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string f = d.file("dr.h5"), t = "decay_range/table";
  require_columns(f, t, {"impl", "precision", "C", "gate", "g_min", "g_mean", "g_lowest", "c_min", "rel_rms", "o_nan", "o_inf",
                         "values", "overflow", "underflow", "subnormal", "allow_unsafe_range"});
  const auto impl = scol(f, t + "/impl"), prec = scol(f, t + "/precision"), gate = scol(f, t + "/gate");
  const auto C = col(f, t + "/C"), gm = col(f, t + "/g_min"), err = col(f, t + "/rel_rms"), nan = col(f, t + "/o_nan"),
             inf = col(f, t + "/o_inf"), ovf = col(f, t + "/overflow");
  int seen = 0;
  for (std::size_t i = 0; i < impl.size(); ++i) {
    CAPTURE(i, impl[i], prec[i], C[i], gate[i], gm[i], err[i]);
    if (impl[i] != "chunked" || gate[i] != "bounded") continue;
    if (prec[i] == "fp64") CHECK(err[i] <= tol::f64_identity.value);  // the chunked reference in double
    if (prec[i] == "fp32" && C[i] == 16 && gm[i] >= -5) {
      CHECK(err[i] <= tol::f32_vs_truth.value);
      CHECK(ovf[i] == 0);
      ++seen;
    }
    if (prec[i] == "fp32" && C[i] == 16 && gm[i] <= -6) CHECK(nan[i] + inf[i] > 0);
    if (prec[i] == "fp32" && C[i] == 32 && gm[i] <= -3) CHECK(nan[i] + inf[i] > 0);  // 32 x 3 = 96 > 88.7
    if (prec[i] == "fp16" && C[i] == 16 && gm[i] <= -1) CHECK(ovf[i] > 0);           // fp16 cannot hold a tile
  }
  CHECK(seen >= 3);
  CHECK(std::abs(h5read::attr_double(f, "decay_range", "fp32_overflow_edge_C16") + 5.545) < 1e-3);
}

TEST_CASE("bad experiment options exit 2 and write no file") {
  TempDir d;
  const std::vector<std::string> bad{
      "recall --d-k 0",        "recall --memories foo",     "recall --beta 2",       "recall --keys diagonal",
      "recall --ratio 0",      "recall --g-min 1",          "recall --vocab 16 --d-k 64",
      "copy --precision fp8",  "copy --alphabet 1",         "copy --L 0",            "copy --keys correlated",
      "decode-cost --memory-gb -1", "decode-cost --k3-layers 90", "decode-cost --cpu-d 0",
      "decode-cost --min-time 0", "decay-range --C 0",    "decay-range --C 65",    "decay-range --g-min 0",
      "decay-range --precision fp8", "decay-range --precision tf32", "decay-range --T 0"};
  for (const auto& b : bad) {
    const auto r = run_kdalab(b + " --quick --quiet --out " + d.file("x.h5"));
    INFO(b << " -> " << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find("error") != std::string::npos);
    CHECK(d.count() == 0);
  }
}
