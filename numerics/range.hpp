#pragma once
/// Dynamic-range analysis of the factored chunk form of KDA (docs/equations.md, gates: range facts;
/// Kimi Linear report section 3-4; K3 report Eq. 3-5).
///
/// The chunked form multiplies q and k by Gamma_r = exp(c_r) and k by 1/Gamma_r = exp(-c_r), where
/// c_r = sum_{u = s..r} g_u is the cumulative log-decay from the start s of a tile to token r,
/// per key channel. The algorithm stores Gamma (rounded to the format) and K/Gamma = k_r / Gamma_r
/// (numerics/kda_twin.hpp Ki, the KDA prefill kernel's sKi: 1/Gamma alone is never formed): Gamma
/// shrinks towards underflow (first leaving the normal range: subnormals, then 0), K/Gamma grows
/// towards overflow (+Inf); for a key entry |k_i| = 1, the bound of an L2-normalised key, K/Gamma is
/// 1/Gamma. With the bounded K3 gate every g_u >= g_min, so a tile of L tokens has
/// c_r >= L g_min; the Kimi Linear softplus gate has no lower bound.
///
/// Facts this file reproduces (tests/numerics/test_range.cpp):
///   g_min = -5, L = 16: c >= -80, e^80 = 5.5e34 and e^-80 = 1.8e-35 fit bf16 and fp32;
///   L = 64 factored (no 16-token secondary tiles): c reaches -320, 1/Gamma overflows;
///   fp32 per-token limit over a 16-token tile (|k_i| = 1): 1/Gamma overflows below -88.72/16 = -5.545,
///   Gamma leaves the normal range below -87.34/16 = -5.459; fp16 cannot hold a 16-token tile.
/// Units: natural-log decays (alpha = e^g); counts are numbers of tensor elements.
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "numerics/bf16.hpp"
#include "reference/error.hpp"
#include "reference/gate.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

// GateKind, gate_kind_name and parse_gate_kind ("bounded", alias "k3", or "softplus") come from reference/gate.hpp:
// one definition, so that a file may include both headers.

/// The log-decay g of one channel from its logit z, per-head log-scale A_log and bias b
/// (b is the bias inside the sigmoid for the bounded gate, dt_bias for softplus). g_min is used
/// by the bounded gate only. Result <= 0. (The layer-level gate lives in reference/; this scalar
/// form is what the range analysis and the parity generator need.)
inline double gate_log_decay(GateKind kind, double z, double A_log, double b, double g_min) {
  if (kind == GateKind::bounded) return g_min * sigmoid<double>(std::exp(A_log) * (z + b));
  return -std::exp(A_log) * softplus<double>(z + b);
}

/// Where exp(log_value) lands in format f after one RNE rounding.
enum class RangeClass { normal, subnormal, underflow, overflow };

/// Classifies e^x in format f (x: natural log of a positive value). overflow: rounds to +Inf;
/// underflow: rounds to 0; subnormal: nonzero but below the least normal value.
inline RangeClass classify_exp(double x, Format f) {
  if (std::isnan(x)) throw Error("classify_exp: log value is NaN");
  if (x > 709.0) return RangeClass::overflow;    // beyond double; every format overflows
  if (x < -745.0) return RangeClass::underflow;  // below double's least subnormal
  const double r = round_to(std::exp(x), f);
  if (std::isinf(r)) return RangeClass::overflow;
  if (r == 0.0) return RangeClass::underflow;
  if (r < format_min_normal(f)) return RangeClass::subnormal;
  return RangeClass::normal;
}

/// Counts of one range analysis. Each tile position and channel contributes two values, as the
/// algorithm stores them in format f: Gamma = round(e^c) and K/Gamma = round(|k| / Gamma).
struct RangeCounts {
  std::size_t n = 0;          ///< values examined
  std::size_t overflow = 0;   ///< values that are not finite in the format: K/Gamma rounded to +Inf (or 0/0 = NaN)
  std::size_t underflow = 0;  ///< values that round to 0 (Gamma)
  std::size_t subnormal = 0;  ///< values left as subnormals (Gamma): precision lost
  double c_min = 0.0;         ///< most negative cumulative log-decay seen (log Gamma_min; 1/Gamma_max = e^-c_min)
  /// True when every value is a normal number of the format.
  bool fits() const { return overflow == 0 && underflow == 0 && subnormal == 0; }
  /// Adds the values of one position: cumulative log-decay c <= 0 and the key entry's magnitude `k` (1: the bound
  /// of an L2-normalised key, i.e. 1/Gamma). K/Gamma is k divided by Gamma as stored (a Gamma rounded to 0 makes it
  /// +Inf, or NaN for k = 0), then rounded: what numerics/kda_twin.hpp computes (Ki), so a count here is a non-finite
  /// value in the algorithm (a 1/Gamma beyond the format with a small |k| is not).
  void add(double c, Format f, double k = 1.0) {
    c_min = std::min(c_min, c);
    n += 2;
    switch (classify_exp(c, f)) {
      case RangeClass::overflow: ++overflow; break;  // not reached for c <= 0
      case RangeClass::underflow: ++underflow; break;
      case RangeClass::subnormal: ++subnormal; break;
      case RangeClass::normal: break;
    }
    if (!std::isfinite(round_to(std::fabs(k) / round_to(std::exp(c), f), f))) ++overflow;
  }
};

/// Range of the factored tile form on a given decay tensor.
/// g: T x d_k log-decays (rows = tokens, g <= 0); L: tile length in tokens (C for a factored
/// chunk, 16 with secondary tiles); the cumulative sum restarts at every tile start 0, L, 2L, ...
/// (a final partial tile included). f: the storage format of Gamma and K/Gamma.
/// k: the keys the algorithm divides by Gamma (T x d_k, L2-normalised rows: the values of K/Gamma),
/// or nullptr for the worst case |k_i| = 1 (K/Gamma = 1/Gamma).
/// Errors: kdalab::Error if L = 0, g is empty, g has a NaN or a positive entry (names index), or k
/// is not of g's shape.
inline RangeCounts tile_range(const Mat<double>& g, std::size_t L, Format f, const Mat<double>* k = nullptr) {
  require(L >= 1, "tile_range: tile length L = 0; accepted: L >= 1 tokens");
  require(g.rows() >= 1 && g.cols() >= 1, "tile_range: tensor 'g' is empty");
  require(!k || (k->rows() == g.rows() && k->cols() == g.cols()),
          "tile_range: tensor 'k' has shape " + std::to_string(k ? k->rows() : 0) + " x " +
              std::to_string(k ? k->cols() : 0) + "; accepted: the shape of 'g', " + std::to_string(g.rows()) + " x " +
              std::to_string(g.cols()));
  RangeCounts rc;
  for (Eigen::Index i = 0; i < g.cols(); ++i) {
    double c = 0.0;
    for (Eigen::Index t = 0; t < g.rows(); ++t) {
      const double gt = g(t, i);
      if (!(gt <= 0.0))
        throw Error("tile_range: tensor 'g' has g = " + std::to_string(gt) + " at (t=" + std::to_string(t) +
                    ", i=" + std::to_string(i) + "); accepted: finite g <= 0");
      if (static_cast<std::size_t>(t) % L == 0) c = 0.0;
      c += gt;
      rc.add(c, f, k ? (*k)(t, i) : 1.0);
    }
  }
  return rc;
}

/// Worst case of one tile of L tokens whose every decay is g (e.g. g = g_min for the bounded gate):
/// the cumulative log-decays L g, ..., g of one channel.
inline RangeCounts constant_tile_range(double g, std::size_t L, Format f) {
  return tile_range(Mat<double>::Constant(static_cast<Eigen::Index>(L), 1, g), L, f);
}

/// The per-token decay g below which 1/Gamma = e^{-L g} (K/Gamma for |k_i| = 1) overflows format f over an L-token tile:
/// -ln(max_f) / L. fp32, L = 16: -88.72 / 16 = -5.545.
inline double per_token_overflow_limit(std::size_t L, Format f) {
  require(L >= 1, "per_token_overflow_limit: L = 0");
  return -std::log(format_max(f)) / static_cast<double>(L);
}
/// The per-token decay g below which Gamma = e^{L g} leaves the normal range of f:
/// ln(min_normal_f) / L. fp32, L = 16: -87.34 / 16 = -5.459.
inline double per_token_normal_limit(std::size_t L, Format f) {
  require(L >= 1, "per_token_normal_limit: L = 0");
  return std::log(format_min_normal(f)) / static_cast<double>(L);
}
/// The per-token decay g below which Gamma = e^{L g} rounds to 0 in f (half the least subnormal):
/// fp32, L = 16: ln(2^-150) / 16 = -6.50.
inline double per_token_zero_limit(std::size_t L, Format f) {
  require(L >= 1, "per_token_zero_limit: L = 0");
  const auto s = format_spec(f);
  return std::log(std::ldexp(1.0, s.emin - (s.p - 1) - 1)) / static_cast<double>(L);
}

}  // namespace kdalab
