#pragma once
/// The named KDA input generators of the parity sweep: "anchor-kda" (numerics/random.hpp) and its
/// variations along the sweep's axes (gate kind, g_min, beta distribution, d_k != d_v).
///
/// kda_inputs(spec) draws in exactly anchor_kda()'s order (q_raw, k_raw, v, g_raw, beta_raw,
/// A_log, bias, S0; numerics/random.hpp), so with the anchor settings (bounded gate, g_min = -5,
/// beta = sigmoid, d_k = d_v) it returns anchor_kda(B, T, H, D, seed) bit for bit
/// (tests/numerics/test_kda_inputs.cpp). Variations change only how the draws are used:
///   gate  bounded:  g = g_min Sigmoid(exp(A_log) (g_raw + bias))      (K3 report Eq. 5)
///         softplus: g = -exp(A_log) Softplus(g_raw + bias)            (Kimi Linear gate; bias = dt_bias)
///   beta  sigmoid:  beta_raw ~ N(0, 1) bf16, beta = Sigmoid(beta_raw)  (anchor)
///         wide:     beta_raw ~ N(0, 16) bf16 (betas near 0 and 1)
///         one:      beta_raw = 88, beta = 1 exactly in float64 (the exact-write case)
/// Shapes as KdaInputs (HV = H); v is [B, T, H, d_v], S0 [B, H, d_k, d_v].
#include <cmath>
#include <cstdint>
#include <string>

#include "numerics/random.hpp"
#include "numerics/range.hpp"

namespace kdalab {

enum class BetaDist { sigmoid, wide, one };

inline std::string beta_dist_name(BetaDist b) {
  switch (b) {
    case BetaDist::sigmoid: return "sigmoid";
    case BetaDist::wide: return "wide";
    case BetaDist::one: return "one";
  }
  return "?";
}
/// Parses "sigmoid" | "wide" | "one"; throws kdalab::Error naming `what` otherwise.
inline BetaDist parse_beta_dist(const std::string& s, const std::string& what = "beta") {
  if (s == "sigmoid") return BetaDist::sigmoid;
  if (s == "wide") return BetaDist::wide;
  if (s == "one") return BetaDist::one;
  throw Error(what + " = '" + s + "' is unknown; accepted: sigmoid, wide, one");
}

/// One grid point's generator settings.
struct KdaGenSpec {
  std::size_t B = 1, T = 1, H = 1, d_k = 128, d_v = 128;
  GateKind gate = GateKind::bounded;
  double g_min = -5.0;  ///< bounded gate only
  BetaDist beta = BetaDist::sigmoid;
  std::uint64_t seed = 1;
};

/// Name of the generator a spec describes: "anchor-kda" for the anchor settings, otherwise
/// "anchor-kda(gate=softplus, beta=wide, ...)" listing the settings that differ.
inline std::string generator_name(const KdaGenSpec& s) {
  std::string extra;
  auto add = [&](const std::string& x) { extra += (extra.empty() ? "" : ", ") + x; };
  if (s.gate != GateKind::bounded) add("gate=" + gate_kind_name(s.gate));
  if (s.gate == GateKind::bounded && s.g_min != -5.0) add("g_min=" + std::to_string(s.g_min));
  if (s.beta != BetaDist::sigmoid) add("beta=" + beta_dist_name(s.beta));
  if (s.d_k != s.d_v) add("d_v=" + std::to_string(s.d_v));
  return extra.empty() ? "anchor-kda" : "anchor-kda(" + extra + ")";
}

/// Draws the inputs of one grid point (see file comment). scale = d_k^-1/2.
/// Errors: kdalab::Error if a dimension is 0 or g_min >= 0 for the bounded gate.
inline KdaInputs kda_inputs(const KdaGenSpec& s) {
  require(s.B > 0 && s.T > 0 && s.H > 0 && s.d_k > 0 && s.d_v > 0,
          "kda_inputs: B, T, H, d_k, d_v must all be >= 1 (got B=" + std::to_string(s.B) + ", T=" + std::to_string(s.T) +
              ", H=" + std::to_string(s.H) + ", d_k=" + std::to_string(s.d_k) + ", d_v=" + std::to_string(s.d_v) + ")");
  require(s.gate != GateKind::bounded || (s.g_min < 0.0 && std::isfinite(s.g_min)),
          "g_min = " + std::to_string(s.g_min) + " is not accepted; the bounded gate needs a finite g_min < 0");
  KdaInputs in;
  in.B = s.B; in.T = s.T; in.H = s.H; in.HV = s.H; in.d_k = s.d_k; in.d_v = s.d_v;
  in.g_min = s.g_min;
  in.scale = 1.0 / std::sqrt(static_cast<double>(s.d_k));
  in.seed = s.seed;
  in.generator = generator_name(s);
  Rng rng(s.seed);
  in.q_raw = Tensor<double>({s.B, s.T, s.H, s.d_k});
  in.k_raw = Tensor<double>({s.B, s.T, s.H, s.d_k});
  in.v = Tensor<double>({s.B, s.T, s.H, s.d_v});
  in.g_raw = Tensor<double>({s.B, s.T, s.H, s.d_k});
  in.beta_raw = Tensor<double>({s.B, s.T, s.H});
  in.A_log = Tensor<double>({s.H});
  in.bias = Tensor<double>({s.H, s.d_k});
  in.S0 = Tensor<double>({s.B, s.H, s.d_k, s.d_v});
  rng.fill_normal(in.q_raw, 1.0, Format::bf16);
  rng.fill_normal(in.k_raw, 1.0, Format::bf16);
  rng.fill_normal(in.v, 1.0, Format::bf16);
  rng.fill_normal(in.g_raw, 1.0, Format::bf16);
  rng.fill_normal(in.beta_raw, s.beta == BetaDist::wide ? 4.0 : 1.0, Format::bf16);
  if (s.beta == BetaDist::one)
    for (auto& x : in.beta_raw.data) x = 88.0;
  rng.fill_uniform(in.A_log, 0.0, 1.0);
  rng.fill_uniform(in.bias, 0.0, 1.0);
  rng.fill_normal(in.S0, 0.1, Format::fp32);
  derive_kda(in);  // q, k L2-normalised, beta = Sigmoid(beta_raw), bounded g
  if (s.gate == GateKind::softplus)
    for (std::size_t b = 0; b < s.B; ++b)
      for (std::size_t t = 0; t < s.T; ++t)
        for (std::size_t h = 0; h < s.H; ++h)
          for (std::size_t i = 0; i < s.d_k; ++i)
            in.g(b, t, h, i) = gate_log_decay(GateKind::softplus, in.g_raw(b, t, h, i), in.A_log(h), in.bias(h, i), 0.0);
  return in;
}

}  // namespace kdalab
