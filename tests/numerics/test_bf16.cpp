// bf16 / fp16 rounding: round-to-nearest-even on ties, NaN/Inf, overflow, subnormals, and the
// double-rounding hazard of the double -> float -> bf16 path.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "numerics/bf16.hpp"
#include "numerics/random.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

namespace {
// Independent definition of float -> bf16 RNE on the IEEE bit pattern (valid for every finite
// float and Inf, including subnormals; NaN is handled separately).
double bf16_by_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  const std::uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}
float float_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

TEST_CASE("bf16 rounds ties to even") {
  const double u = std::ldexp(1.0, -8);  // half a bf16 ulp at 1
  CHECK(round_bf16(1.0 + u) == 1.0);                           // tie between 1 (even) and 1+2^-7
  CHECK(round_bf16(1.0 + 3 * u) == 1.0 + 4 * u);               // tie between 1+2^-7 (odd) and 1+2^-6
  CHECK(round_bf16(-(1.0 + u)) == -1.0);
  CHECK(round_bf16(1.0 + u + std::ldexp(1.0, -40)) == 1.0 + 2 * u);  // just above the tie: up
  CHECK(round_bf16(1.0 + u - std::ldexp(1.0, -40)) == 1.0);          // just below: down
}

TEST_CASE("bf16 matches the bit-level RNE definition on random and edge floats") {
  Rng rng(11);
  std::size_t n = 0;
  for (int i = 0; i < 200000; ++i) {
    // random bit patterns cover normals, subnormals and the largest finite values
    const auto bits = static_cast<std::uint32_t>(rng.engine()());
    const float x = float_from_bits(bits);
    if (std::isnan(x)) continue;
    INFO("bits " << bits);
    REQUIRE(round_bf16(x) == bf16_by_bits(x));
    ++n;
  }
  CHECK(n > 190000);
  for (std::uint32_t bits : {0x00000001u, 0x00008000u, 0x00018000u, 0x00007fffu, 0x007fffffu, 0x00800000u,
                             0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0x7f800000u, 0x80000001u, 0xff7fffffu}) {
    INFO("bits " << bits);
    CHECK(round_bf16(float_from_bits(bits)) == bf16_by_bits(float_from_bits(bits)));
  }
}

TEST_CASE("bf16 and fp16: NaN, Inf, overflow and subnormals") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(std::isnan(round_bf16(std::nan(""))));
  CHECK(std::isnan(round_fp16(std::nan(""))));
  CHECK(round_bf16(inf) == inf);
  CHECK(round_bf16(-inf) == -inf);
  CHECK(std::signbit(round_bf16(-0.0)));
  // overflow: bf16 max = 0x7f7f = 3.3895e38; the tie above it goes to even = Inf
  CHECK(round_bf16(format_max(Format::bf16)) == format_max(Format::bf16));
  CHECK(round_bf16(std::numeric_limits<float>::max()) == inf);
  CHECK(round_fp16(65504.0) == 65504.0);
  CHECK(round_fp16(65519.99) == 65504.0);
  CHECK(round_fp16(65520.0) == inf);  // the tie between 65504 (odd) and 65536 (even, out of range)
  CHECK(round_fp16(-1e6) == -inf);
  // subnormals: bf16 least subnormal 2^-133, fp16 2^-24
  const double s = std::ldexp(1.0, -133);
  CHECK(round_bf16(s) == s);
  CHECK(round_bf16(s / 2) == 0.0);          // tie between 0 (even) and 2^-133
  CHECK(round_bf16(0.75 * s) == s);
  CHECK(round_bf16(1.5 * s) == 2 * s);      // tie between 1 and 2 units: even = 2
  CHECK(round_bf16(std::ldexp(1.0, -126) * (1 + std::ldexp(1.0, -9))) == std::ldexp(1.0, -126));
  const double h = std::ldexp(1.0, -24);
  CHECK(round_fp16(h) == h);
  CHECK(round_fp16(h / 2) == 0.0);
  CHECK(round_fp16(3 * h / 2) == 2 * h);
  CHECK(round_fp16(5 * h / 2) == 2 * h);    // tie between 2 (even) and 3
  CHECK(format_min_normal(Format::fp16) == std::ldexp(1.0, -14));
  CHECK(format_max(Format::fp16) == 65504.0);
}

TEST_CASE("rounding a double once differs from Eigen's double -> float -> bf16 path") {
  // 1 + 2^-8 + 2^-30: above the bf16 tie, so RNE goes up; through float the 2^-30 is lost first,
  // the value lands exactly on the tie and rounds down to even.
  const double x = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  CHECK(round_bf16(x) == 1.0 + std::ldexp(1.0, -7));
  CHECK(round_bf16(static_cast<float>(x)) == 1.0);
  const Eigen::bfloat16 e(static_cast<float>(x));
  CHECK(static_cast<float>(e) == 1.0f);  // the twice-rounded answer: why kdalab never uses that path
}

TEST_CASE("tf32 and fp32 rounding") {
  CHECK(round_to(1.0 + std::ldexp(1.0, -11), Format::tf32) == 1.0);                  // tie -> even
  CHECK(round_to(1.0 + std::ldexp(3.0, -11), Format::tf32) == 1.0 + std::ldexp(1.0, -9));
  CHECK(round_to(0.1, Format::fp32) == static_cast<double>(0.1f));
  CHECK(round_to(std::ldexp(1.0, -149), Format::fp32) == std::ldexp(1.0, -149));
  CHECK(round_to(std::ldexp(1.0, -150), Format::fp32) == 0.0);
}

TEST_CASE("bf16 ULP distance") {
  CHECK(bf16_ulp_distance(1.0, 1.0) == 0);
  CHECK(bf16_ulp_distance(1.0, 1.0 + std::ldexp(1.0, -7)) == 1);
  CHECK(bf16_ulp_distance(1.0, 2.0) == 128);
  CHECK(bf16_ulp_distance(std::ldexp(1.0, -133), -std::ldexp(1.0, -133)) == 2);
  CHECK(bf16_ulp_distance(0.0, -0.0) == 0);
}
