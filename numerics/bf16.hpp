#pragma once
/// Rounding to the low-precision formats of the tensor cores, in software.
///
/// round_to(x, fmt) rounds a double ONCE, round-to-nearest-even, to the value set of bf16, fp16,
/// tf32 or fp32 (with subnormals and overflow to +-Inf as IEEE 754 defines them; NaN stays NaN).
/// This avoids the double rounding of Eigen's double -> float -> bf16 path. The result
/// is returned as a double holding an exactly representable value of the format.
/// Formats: precision p (significand bits incl. the implicit one), emin (least normal exponent),
/// emax. bf16: p=8, emin=-126, emax=127; fp16: p=11, emin=-14, emax=15; tf32: p=11, emin=-126,
/// emax=127 (the tensor-core input format; we model RNE); fp32: p=24, emin=-126, emax=127.
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "reference/error.hpp"

namespace kdalab {

enum class Format { bf16, fp16, tf32, fp32, fp64 };

inline std::string format_name(Format f) {
  switch (f) {
    case Format::bf16: return "bf16";
    case Format::fp16: return "fp16";
    case Format::tf32: return "tf32";
    case Format::fp32: return "fp32";
    case Format::fp64: return "fp64";
  }
  return "?";
}
/// Parses "bf16" | "fp16" | "tf32" | "fp32" | "fp64"; throws kdalab::Error naming `what` otherwise.
inline Format parse_format(const std::string& s, const std::string& what = "format") {
  if (s == "bf16") return Format::bf16;
  if (s == "fp16") return Format::fp16;
  if (s == "tf32") return Format::tf32;
  if (s == "fp32") return Format::fp32;
  if (s == "fp64" || s == "float64") return Format::fp64;
  throw Error(what + " = '" + s + "' is not a known format; accepted: bf16, fp16, tf32, fp32, fp64");
}

struct FormatSpec {
  int p, emin, emax;
};
inline FormatSpec format_spec(Format f) {
  switch (f) {
    case Format::bf16: return {8, -126, 127};
    case Format::fp16: return {11, -14, 15};
    case Format::tf32: return {11, -126, 127};
    case Format::fp32: return {24, -126, 127};
    case Format::fp64: return {53, -1022, 1023};
  }
  return {53, -1022, 1023};
}

/// Largest finite value of a format, e.g. bf16: 3.3895e38, fp16: 65504.
inline double format_max(Format f) {
  const auto s = format_spec(f);
  return std::ldexp(2.0 - std::ldexp(1.0, 1 - s.p), s.emax);
}
/// Least positive normal value of a format, e.g. fp32/bf16: 2^-126, fp16: 2^-14.
inline double format_min_normal(Format f) { return std::ldexp(1.0, format_spec(f).emin); }

/// Rounds x once, round-to-nearest-even, to format f (see file comment). Pure function.
inline double round_to(double x, Format f) {
  if (f == Format::fp64 || std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  const auto s = format_spec(f);
  int ex = 0;
  std::frexp(x, &ex);                       // |x| = m 2^ex, m in [0.5, 1): leading bit 2^(ex-1)
  const int E = std::max(ex - 1, s.emin);   // subnormals share the quantum of emin
  const double q = std::ldexp(1.0, E - (s.p - 1));
  const double r = std::nearbyint(x / q) * q;  // default FE_TONEAREST: ties to even
  if (std::fabs(r) > format_max(f)) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}
inline double round_bf16(double x) { return round_to(x, Format::bf16); }
inline double round_fp16(double x) { return round_to(x, Format::fp16); }

/// bf16 bit pattern of a value already representable in bf16 (e.g. from round_bf16).
inline std::uint16_t bf16_bits(double bf16_value) {
  const float f = static_cast<float>(bf16_value);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}
/// Value of a bf16 bit pattern.
inline double bf16_from_bits(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// Distance in bf16 units in the last place between two bf16 values (monotone integer map of
/// the bit patterns, +0 and -0 equal). Both arguments are rounded to bf16 first.
inline std::int64_t bf16_ulp_distance(double a, double b) {
  auto ord = [](double x) -> std::int64_t {
    const std::int64_t u = bf16_bits(round_bf16(x));
    return (u & 0x8000) ? -(u & 0x7fff) : u;
  };
  const std::int64_t d = ord(a) - ord(b);
  return d < 0 ? -d : d;
}

}  // namespace kdalab
