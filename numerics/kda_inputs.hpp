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
///   inputs (InputKind; applied to the raw tensors after the anchor draw, before the derived ones):
///         anchor:          as drawn
///         long-memory:     make_long_memory(): A_log = 0, bias = -12 (bounded gate: g ~ -5 e^-12 = -3e-5 per
///                          token), beta_raw - 5 (beta ~ 0.007 for the sigmoid distribution): the state carries
///                          information over thousands of tokens
///         collinear-keys:  make_collinear_keys() with key_noise (default 1e-2) and no decay (bias = -1e4:
///                          g = 0 exactly in float64 and fp32): near-collinear keys, the state never forgotten
///         collinear-keys-slow-decay: the same keys with the long-memory gate (A_log = 0, bias = -12)
///         identical-keys:  make_collinear_keys() with noise 0 (every token the same key), no decay
///   The key kinds leave beta to the beta distribution: with --beta one (beta = 1) each token overwrites
///   the state along the shared direction, the regime where the kernel's state products lose most.
/// Shapes as KdaInputs (HV = H); v is [B, T, H, d_v], S0 [B, H, d_k, d_v].
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "numerics/random.hpp"
#include "numerics/range.hpp"

namespace kdalab {

enum class BetaDist { sigmoid, wide, one };
/// The input kind of a grid point (file comment): the anchor draw, or a variation of its keys / gate / beta.
enum class InputKind { anchor, long_memory, collinear_keys, collinear_keys_slow_decay, identical_keys };

inline std::string input_kind_name(InputKind k) {
  switch (k) {
    case InputKind::anchor: return "anchor";
    case InputKind::long_memory: return "long-memory";
    case InputKind::collinear_keys: return "collinear-keys";
    case InputKind::collinear_keys_slow_decay: return "collinear-keys-slow-decay";
    case InputKind::identical_keys: return "identical-keys";
  }
  return "?";
}
/// The accepted names of parse_input_kind(), comma-separated (error messages and --help).
inline const char* input_kind_names() {
  return "anchor, long-memory, collinear-keys, collinear-keys-slow-decay, identical-keys";
}
/// Parses an input_kind_name(); throws kdalab::Error naming `what`, the value and the accepted names otherwise.
inline InputKind parse_input_kind(const std::string& s, const std::string& what = "inputs") {
  for (InputKind k : {InputKind::anchor, InputKind::long_memory, InputKind::collinear_keys,
                      InputKind::collinear_keys_slow_decay, InputKind::identical_keys})
    if (s == input_kind_name(k)) return k;
  throw Error(what + ": '" + s + "' is unknown; accepted: " + input_kind_names());
}

/// The long-memory variant of `in`, in place: A_log = 0, bias = -12 (the bounded gate's
/// g = g_min Sigmoid(g_raw - 12) ~ -5 e^-12 ~ -3e-5 per token: a decay time of ~3e4 tokens) and beta_raw - 5
/// (rounded to bf16; beta = Sigmoid(N(0,1) - 5) ~ 0.007), so the state carries information over thousands of
/// tokens (on the anchor gates it is forgotten within a few). Raw values stay bf16 / fp32 representable; q, k, g,
/// beta re-derived (bounded gate: derive_kda).
inline void make_long_memory(KdaInputs& in) {
  for (auto& x : in.A_log.data) x = 0.0;
  for (auto& x : in.bias.data) x = -12.0;
  for (auto& x : in.beta_raw.data) x = round_bf16(x - 5.0);
  derive_kda(in);
}

/// Near-collinear keys, in place: per (sequence, key head) one random unit direction u (N(0, 1) entries,
/// normalised) and k_raw[b, t, h] = bf16(u + noise z_t / sqrt(d_k)) with z_t ~ N(0, 1) entries, so that the
/// perturbation's norm is ~noise relative to the key (noise 0: every token the same key, exactly). Draws from
/// Rng(cell_seed(seed, "collinear-keys")), so the other tensors keep the anchor draw. decay: the long-memory
/// gate (A_log = 0, bias = -12, g ~ -3e-5 per token); else no decay (bias = -1e4: Sigmoid(-1e4 exp(A_log))
/// = 0 in float64 and fp32, g = 0). beta untouched. q, k, g, beta re-derived (bounded gate: derive_kda).
/// Errors: kdalab::Error if noise < 0 or not finite.
inline void make_collinear_keys(KdaInputs& in, double noise, bool decay, std::uint64_t seed) {
  require(std::isfinite(noise) && noise >= 0, "make_collinear_keys: noise = " + std::to_string(noise) +
                                                  " is not accepted; give a finite value >= 0");
  Rng rng(cell_seed(seed, "collinear-keys"));
  const std::size_t D = in.d_k;
  std::vector<double> u(D);
  for (std::size_t b = 0; b < in.B; ++b)
    for (std::size_t h = 0; h < in.H; ++h) {
      double n2 = 0;
      for (auto& x : u) {
        x = rng.normal();
        n2 += x * x;
      }
      for (auto& x : u) x /= std::sqrt(n2);
      for (std::size_t t = 0; t < in.T; ++t)
        for (std::size_t i = 0; i < D; ++i)
          in.k_raw(b, t, h, i) = round_bf16(u[i] + (noise > 0 ? noise * rng.normal() / std::sqrt(double(D)) : 0.0));
    }
  if (decay)
    for (auto& x : in.A_log.data) x = 0.0;
  for (auto& x : in.bias.data) x = decay ? -12.0 : -1e4;
  derive_kda(in);
}

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
  InputKind inputs = InputKind::anchor;
  double key_noise = 1e-2;  ///< collinear-keys kinds: relative norm of the key perturbation
  std::uint64_t seed = 1;
};

/// Name of the generator a spec describes: "anchor-kda" for the anchor settings, otherwise
/// "anchor-kda(gate=softplus, beta=wide, ..., inputs=long-memory)" listing the settings that differ.
inline std::string generator_name(const KdaGenSpec& s) {
  std::string extra;
  auto add = [&](const std::string& x) { extra += (extra.empty() ? "" : ", ") + x; };
  if (s.gate != GateKind::bounded) add("gate=" + gate_kind_name(s.gate));
  if (s.gate == GateKind::bounded && s.g_min != -5.0) add("g_min=" + std::to_string(s.g_min));
  if (s.beta != BetaDist::sigmoid) add("beta=" + beta_dist_name(s.beta));
  if (s.d_k != s.d_v) add("d_v=" + std::to_string(s.d_v));
  if (s.inputs != InputKind::anchor) add("inputs=" + input_kind_name(s.inputs));
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
  switch (s.inputs) {
    case InputKind::anchor: break;
    case InputKind::long_memory: make_long_memory(in); break;
    case InputKind::collinear_keys: make_collinear_keys(in, s.key_noise, false, s.seed); break;
    case InputKind::collinear_keys_slow_decay: make_collinear_keys(in, s.key_noise, true, s.seed); break;
    case InputKind::identical_keys: make_collinear_keys(in, 0.0, false, s.seed); break;
  }
  if (s.gate == GateKind::softplus)
    for (std::size_t b = 0; b < s.B; ++b)
      for (std::size_t t = 0; t < s.T; ++t)
        for (std::size_t h = 0; h < s.H; ++h)
          for (std::size_t i = 0; i < s.d_k; ++i)
            in.g(b, t, h, i) = gate_log_decay(GateKind::softplus, in.g_raw(b, t, h, i), in.A_log(h), in.bias(h, i), 0.0);
  return in;
}

}  // namespace kdalab
