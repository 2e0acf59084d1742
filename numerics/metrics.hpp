#pragma once
/// Error metrics of an output against a truth (docs/design.md, error metric of record).
///
/// rel_rms = ||out - ref||_2 / ||ref||_2 (the metric of record), max_abs = max |out - ref|,
/// max_ulp_bf16 = largest distance in bf16 units in the last place between out and ref rounded
/// to bf16, and NaN / Inf counts of out. Inputs are flat sequences of equal length; ref must be
/// finite. With any NaN/Inf in out, rel_rms and max_abs are +Inf and max_ulp_bf16 is INT64_MAX. Errors: kdalab::Error on length mismatch or a non-finite truth.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "numerics/bf16.hpp"
#include "reference/error.hpp"

namespace kdalab {

struct ErrorMetrics {
  double rel_rms = 0, max_abs = 0;
  std::int64_t max_ulp_bf16 = 0, nan_count = 0, inf_count = 0;
  std::size_t n = 0;
};

/// Metrics of `out` against `ref` (same length). NaN/Inf in out are counted and make rel_rms and
/// max_abs +Inf (never silently ignored).
inline ErrorMetrics compare(const std::vector<double>& out, const std::vector<double>& ref,
                            const std::string& name = "output") {
  require(out.size() == ref.size(), "compare '" + name + "': candidate has " + std::to_string(out.size()) +
                                        " elements, truth has " + std::to_string(ref.size()));
  ErrorMetrics m;
  m.n = out.size();
  long double num = 0, den = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    require(std::isfinite(ref[i]), "compare '" + name + "': the truth is not finite at flat index " + std::to_string(i));
    if (std::isnan(out[i])) { ++m.nan_count; continue; }
    if (std::isinf(out[i])) { ++m.inf_count; continue; }
    const double d = out[i] - ref[i];
    num += static_cast<long double>(d) * d;
    den += static_cast<long double>(ref[i]) * ref[i];
    m.max_abs = std::max(m.max_abs, std::fabs(d));
    m.max_ulp_bf16 = std::max(m.max_ulp_bf16, bf16_ulp_distance(out[i], ref[i]));
  }
  m.rel_rms = den > 0 ? static_cast<double>(std::sqrt(num / den)) : static_cast<double>(std::sqrt(num));
  if (m.nan_count || m.inf_count) {  // never report a clean ULP count for a broken output
    m.rel_rms = m.max_abs = INFINITY;
    m.max_ulp_bf16 = std::numeric_limits<std::int64_t>::max();
  }
  return m;
}

/// The bf16 rounding floor of `ref`: the relative RMS of round_bf16(ref) against ref, the least error of any output
/// stored in bf16 (about 1.66e-3 for normally distributed values; a few values can round worse).
inline double bf16_rounding_floor(const std::vector<double>& ref) {
  double e2 = 0, r2 = 0;
  for (double x : ref) {
    const double e = round_bf16(x) - x;
    e2 += e * e;
    r2 += x * x;
  }
  return std::sqrt(e2 / (r2 > 1e-300 ? r2 : 1e-300));
}

/// Relative RMS alone (see compare()).
inline double rel_rms(const std::vector<double>& out, const std::vector<double>& ref) {
  return compare(out, ref).rel_rms;
}

/// Relative RMS along T in windows of `window` tokens, for tensors [B, T, rest...] flattened
/// row-major: entry w is the error over tokens [w*window, (w+1)*window) of every batch row.
inline std::vector<double> rel_rms_windows(const std::vector<double>& out, const std::vector<double>& ref,
                                           std::size_t B, std::size_t T, std::size_t window) {
  require(window >= 1, "rel_rms_windows: window must be >= 1");
  require(out.size() == ref.size() && B * T > 0 && out.size() % (B * T) == 0,
          "rel_rms_windows: sizes do not match B*T*rest");
  const std::size_t rest = out.size() / (B * T), nw = (T + window - 1) / window;
  std::vector<long double> num(nw, 0), den(nw, 0);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t r = 0; r < rest; ++r) {
        const std::size_t i = (b * T + t) * rest + r;
        const long double d = static_cast<long double>(out[i]) - ref[i];
        num[t / window] += d * d;
        den[t / window] += static_cast<long double>(ref[i]) * ref[i];
      }
  std::vector<double> w(nw);
  for (std::size_t j = 0; j < nw; ++j) w[j] = den[j] > 0 ? static_cast<double>(std::sqrt(num[j] / den[j])) : 0.0;
  return w;
}

}  // namespace kdalab
