// Dynamic-range analysis of the factored chunk form (numerics/range.hpp; docs/equations.md section 2).
#include <cmath>

#include "numerics/random.hpp"
#include "numerics/range.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

TEST_CASE("g_min = -5 with 16-token tiles stays inside bf16 and fp32") {
  for (Format f : {Format::bf16, Format::fp32}) {
    const RangeCounts rc = constant_tile_range(-5.0, 16, f);
    INFO(format_name(f));
    CHECK(rc.fits());
    CHECK(rc.n == 32);
    CHECK(rc.c_min == -80.0);
  }
  // and fp16 cannot hold a 16-token tile at all: e^80 overflows, e^-80 underflows
  const RangeCounts h = constant_tile_range(-5.0, 16, Format::fp16);
  CHECK(h.overflow > 0);
  CHECK(h.underflow > 0);
}

TEST_CASE("a 64-token chunk in the factored form overflows fp32 and bf16") {
  for (Format f : {Format::bf16, Format::fp32}) {
    const RangeCounts rc = constant_tile_range(-5.0, 64, f);
    INFO(format_name(f));
    CHECK(rc.overflow > 0);   // 1/Gamma = e^320
    CHECK(rc.underflow > 0);  // Gamma = e^-320
    CHECK(rc.c_min == -320.0);
    // with 16-token secondary tiles the same chunk fits
    CHECK(tile_range(Mat<double>::Constant(64, 1, -5.0), 16, f).fits());
  }
}

TEST_CASE("fp32 per-token limits over a 16-token tile: -5.545 (overflow) and -5.459 (normal range)") {
  const double lo = per_token_overflow_limit(16, Format::fp32);
  const double ln = per_token_normal_limit(16, Format::fp32);
  CAPTURE(lo, ln);
  CHECK(std::fabs(lo - (-5.545)) < 5e-4);
  CHECK(std::fabs(ln - (-5.459)) < 5e-4);
  // the analysis agrees with the closed forms on either side of each edge
  CHECK(constant_tile_range(lo + 1e-4, 16, Format::fp32).overflow == 0);
  CHECK(constant_tile_range(lo - 1e-4, 16, Format::fp32).overflow == 1);
  CHECK(constant_tile_range(ln + 1e-4, 16, Format::fp32).subnormal == 0);
  CHECK(constant_tile_range(ln - 1e-4, 16, Format::fp32).subnormal == 1);
  // between the edges Gamma is subnormal but 1/Gamma still finite
  const RangeCounts mid = constant_tile_range(-5.5, 16, Format::fp32);
  CHECK(mid.overflow == 0);
  CHECK(mid.subnormal == 1);
  // bf16 shares fp32's exponent range; its largest value is a little lower
  CHECK(std::fabs(per_token_overflow_limit(16, Format::bf16) - lo) < 1e-3);
  CHECK(per_token_zero_limit(16, Format::fp32) < ln);
}

TEST_CASE("sampled gates: bounded fits at C = 16; unbounded softplus can leave the range") {
  Rng rng(7);
  const Eigen::Index T = 256, dk = 32;
  Mat<double> gb(T, dk), gs(T, dk);
  for (Eigen::Index i = 0; i < dk; ++i) {
    const double A = rng.uniform(0.0, 1.0), b = rng.uniform(0.0, 1.0);
    for (Eigen::Index t = 0; t < T; ++t) {
      const double z = 4.0 * rng.normal();
      gb(t, i) = gate_log_decay(GateKind::bounded, z, A, b, -5.0);
      gs(t, i) = gate_log_decay(GateKind::softplus, z, A + 1.0, b, -5.0);  // Kimi Linear: no lower bound
    }
  }
  CHECK(gb.minCoeff() >= -5.0);
  CHECK(tile_range(gb, 16, Format::fp32).fits());
  CHECK(tile_range(gb, 16, Format::bf16).fits());
  CHECK(gs.minCoeff() < -5.545);
  CHECK_FALSE(tile_range(gs, 16, Format::fp32).fits());
  CHECK_FALSE(tile_range(gb, 64, Format::fp32).fits());
}

TEST_CASE("range analysis rejects bad input") {
  CHECK_THROWS_AS(tile_range(Mat<double>::Constant(4, 1, -1.0), 0, Format::fp32), Error);
  CHECK_THROWS_AS(tile_range(Mat<double>::Constant(4, 1, 0.5), 16, Format::fp32), Error);
  CHECK_THROWS_AS(parse_gate_kind("sigmoid"), Error);
  CHECK(parse_gate_kind("k3") == GateKind::bounded);
}

TEST_CASE("overflow counts K/Gamma as the algorithm stores it: k / Gamma, not 1/Gamma") {
  // one fp32 tile of 16 tokens at g = -5.55 per token: c = -88.8, e^88.8 = 3.7e38 > FLT_MAX (1/Gamma overflows), but
  // Gamma = e^-88.8 is a (subnormal) fp32 number and k / Gamma with |k| = 0.5 is 1.9e38: finite, as in kda_twin (Ki)
  const Mat<double> g = Mat<double>::Constant(16, 1, -5.55);
  CHECK(tile_range(g, 16, Format::fp32).overflow == 1);  // no keys: |k| = 1, the worst case
  const Mat<double> half = Mat<double>::Constant(16, 1, 0.5), one = Mat<double>::Constant(16, 1, 1.0);
  const RangeCounts rc = tile_range(g, 16, Format::fp32, &half);
  CHECK(rc.overflow == 0);
  CHECK(rc.subnormal == 1);
  CHECK(rc.n == 32);
  CHECK(tile_range(g, 16, Format::fp32, &one).overflow == 1);
  // Gamma rounded to 0 (fp16 at c = -80) makes every K/Gamma infinite, whatever |k| (0 / 0: NaN, counted too)
  const Mat<double> g5 = Mat<double>::Constant(16, 1, -5.0), tiny = Mat<double>::Constant(16, 1, 1e-3);
  CHECK(tile_range(g5, 16, Format::fp16, &tiny).overflow > 0);
  const Mat<double> short_k = Mat<double>::Constant(8, 1, 0.5);  // keys of another shape than g
  CHECK_THROWS_AS(tile_range(g, 16, Format::fp32, &short_k), Error);
}
