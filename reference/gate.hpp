#pragma once
/// KDA decay gates: the log-decay g (alpha = e^g) from a decay logit z (docs/equations.md, gates).
///
///   K3 bounded gate (K3 report Eq. 5):  g = g_min * Sigmoid(exp(A_h) * (z + b))
///       in [g_min, 0] (open in exact arithmetic, closed in floating point where the sigmoid
///       saturates), g_min = -5 by default, A_h a per-head log-scale, b a per-(head, channel) bias.
///   Kimi Linear gate (Kimi Linear report, unbounded):  g = -exp(A_h) * Softplus(z + dt_bias).
///
/// The decay logit z (bias NOT included; the gate adds it) comes from one of:
///   from_x  z_t = W_up (W_down x_t)       low rank from the layer input (Kimi Linear)
///   from_v  z_t = W_alpha v_t             from the value (K3 report Eq. 2). Our reading: v_t is the
///                                         layer's value after ShortConv + Swish, all HV heads
///                                         concatenated (HV * d_v), W_alpha is [HV * d_k, HV * d_v].
///
/// Layouts: token-major matrices (Mat<S>, row t = token t). z and g: [T, HV * d_k], channel
/// h * d_k + i is channel i of value head h. A_log: [HV]; bias / dt_bias: [HV, d_k].
#include <algorithm>
#include <cmath>
#include <string>

#include "reference/error.hpp"
#include "reference/scalar.hpp"
#include "reference/tensor.hpp"

namespace kdalab {

/// Which gate turns the decay logit into g: the K3 bounded gate g = g_min Sigmoid(e^A (z + b)) in [g_min, 0] (K3
/// report Eq. 5) or the Kimi Linear unbounded gate g = -e^A Softplus(z + dt_bias) (docs/equations.md, gates).
enum class GateKind { bounded, softplus };
/// Where the decay logit z comes from.
enum class GateInput { from_x, from_v };

inline std::string gate_kind_name(GateKind k) { return k == GateKind::bounded ? "bounded" : "softplus"; }
inline std::string gate_input_name(GateInput i) { return i == GateInput::from_x ? "x" : "v"; }
/// Parses "bounded" (alias "k3") or "softplus"; throws kdalab::Error naming `what` otherwise.
inline GateKind parse_gate_kind(const std::string& s, const std::string& what = "gate") {
  if (s == "bounded" || s == "k3") return GateKind::bounded;
  if (s == "softplus") return GateKind::softplus;
  throw Error(what + " = '" + s + "' is unknown; accepted: bounded (alias k3), softplus");
}
/// Parses "x" / "v"; throws kdalab::Error naming `what` otherwise.
inline GateInput parse_gate_input(const std::string& s, const std::string& what = "gate_input") {
  if (s == "x") return GateInput::from_x;
  if (s == "v") return GateInput::from_v;
  throw Error(what + " = '" + s + "' is unknown; accepted: x, v");
}

/// Scalar K3 bounded gate g = g_min * Sigmoid(exp(A_log) * (z + b)) (K3 report Eq. 5).
/// Units: natural-log decay per token; result in [g_min, 0]. No checks (see gate()).
template <class S>
S bounded_gate(const S& z, const S& A_log, const S& b, const S& g_min) {
  return S(g_min * sigmoid<S>(S(sexp<S>(A_log) * (z + b))));
}

/// Scalar Kimi Linear gate g = -exp(A_log) * Softplus(z + dt_bias) (Kimi Linear report), in (-inf, 0].
template <class S>
S softplus_gate(const S& z, const S& A_log, const S& dt_bias) {
  return S(-sexp<S>(A_log) * softplus<S>(S(z + dt_bias)));
}

/// Applies a gate to a logit matrix. z: [T, HV * d_k]; A_log: [HV]; bias: [HV, d_k] (b inside the
/// sigmoid for `bounded`, dt_bias for `softplus`); g_min < 0 (used by `bounded` only).
/// Returns g: [T, HV * d_k]. Errors: kdalab::Error naming 'z', 'A_log', 'bias' or 'g_min' on a shape
/// mismatch, a non-finite value or g_min >= 0, and naming A_log and bias where the log-decay g would not be
/// finite in float64 (e^A_log overflows: the bounded gate's e^A_log (z + b) is then NaN at z + b = 0, the
/// softplus gate's g is -inf), as `kdalab check` refuses such a gate (experiments/check_ops.hpp).
/// The error of a gate element outside float64's range: `fn` names the caller, `what` what is not finite; names A_log
/// at head h, z + bias, token t and column c.
inline Error gate_range_error(const char* fn, double A_log, Eigen::Index h, double zb, Eigen::Index t, Eigen::Index c,
                              const std::string& what, const std::string& accepted) {
  return Error(std::string(fn) + ": tensor 'A_log' = " + num_str(A_log) + " at head " + std::to_string(h) +
               " with z + bias = " + num_str(zb) + " at token " + std::to_string(t) + ", column " + std::to_string(c) +
               " gives " + what + "; accepted: " + accepted);
}

template <class S>
Mat<S> gate(const Mat<S>& z, const Vec<S>& A_log, const Mat<S>& bias, GateKind kind, const S& g_min = S(-5)) {
  const auto HV = A_log.size(), d_k = bias.cols();
  require(bias.rows() == HV, "gate: tensor 'bias' has " + std::to_string(bias.rows()) + " rows, expected HV = " +
                                 std::to_string(HV) + " (one per value head, from 'A_log')");
  require(z.cols() == HV * d_k, "gate: tensor 'z' has " + std::to_string(z.cols()) + " columns, expected HV * d_k = " +
                                    std::to_string(HV * d_k));
  require(kind != GateKind::bounded || g_min < S(0),
          "gate: g_min = " + std::to_string(static_cast<double>(g_min)) + " must be < 0 for the bounded gate");
  for (Eigen::Index i = 0; i < z.size(); ++i)
    require(std::isfinite(static_cast<double>(z.data()[i])),
            "gate: tensor 'z' has a non-finite value at flat index " + std::to_string(i));
  for (Eigen::Index h = 0; h < HV; ++h)
    require(std::isfinite(static_cast<double>(A_log(h))), "gate: tensor 'A_log' is not finite at head " + std::to_string(h));
  for (Eigen::Index i = 0; i < bias.size(); ++i)
    require(std::isfinite(static_cast<double>(bias.data()[i])),
            "gate: tensor 'bias' has a non-finite value at flat index " + std::to_string(i));
  Mat<S> g(z.rows(), z.cols());
  for (Eigen::Index t = 0; t < z.rows(); ++t)
    for (Eigen::Index h = 0; h < HV; ++h)
      for (Eigen::Index i = 0; i < d_k; ++i) {
        const Eigen::Index c = h * d_k + i;
        g(t, c) = kind == GateKind::bounded ? bounded_gate<S>(z(t, c), A_log(h), bias(h, i), g_min)
                                            : softplus_gate<S>(z(t, c), A_log(h), bias(h, i));
        if (!std::isfinite(static_cast<double>(g(t, c))))
          throw gate_range_error("gate", static_cast<double>(A_log(h)), h, static_cast<double>(z(t, c) + bias(h, i)), t, c,
                                 "a non-finite log-decay g (" + num_str(static_cast<double>(g(t, c))) + ")",
                                 "A_log and bias that keep e^A_log (z + bias) and g finite in float64");
      }
  return g;
}

/// Low-rank decay logit from the layer input (Kimi Linear): z = (x W_down^T) W_up^T.
/// x: [T, hidden]; W_down: [r, hidden]; W_up: [HV * d_k, r]. Returns z: [T, HV * d_k] (no bias).
/// Errors: kdalab::Error naming 'W_down' or 'W_up' on a shape mismatch.
template <class S>
Mat<S> gate_logit_from_x(const Mat<S>& x, const Mat<S>& W_down, const Mat<S>& W_up) {
  require(W_down.cols() == x.cols(), "gate_logit_from_x: tensor 'W_down' has " + std::to_string(W_down.cols()) +
                                         " columns, expected hidden = " + std::to_string(x.cols()));
  require(W_up.cols() == W_down.rows(), "gate_logit_from_x: tensor 'W_up' has " + std::to_string(W_up.cols()) +
                                            " columns, expected the rank r = " + std::to_string(W_down.rows()));
  const Mat<S> low = x * W_down.transpose();
  return low * W_up.transpose();
}

/// Decay logit from the value (K3 report Eq. 2): z = v W_alpha^T. v: [T, HV * d_v] (after ShortConv
/// and Swish); W_alpha: [HV * d_k, HV * d_v]. Returns z: [T, HV * d_k] (no bias).
/// Errors: kdalab::Error naming 'W_alpha' on a shape mismatch.
template <class S>
Mat<S> gate_logit_from_v(const Mat<S>& v, const Mat<S>& W_alpha) {
  require(W_alpha.cols() == v.cols(), "gate_logit_from_v: tensor 'W_alpha' has " + std::to_string(W_alpha.cols()) +
                                          " columns, expected HV * d_v = " + std::to_string(v.cols()));
  return v * W_alpha.transpose();
}

/// Checks a log-decay tensor g (any layout): finite, g <= 0 for every gate, and g in the closed
/// interval [g_min, 0] for the bounded gate. Throws kdalab::Error naming `name`, the flat index,
/// the value and the accepted range.
template <class S>
void validate_gate(const Tensor<S>& g, GateKind kind, const S& g_min = S(-5), const std::string& name = "g") {
  require_finite(g, name);
  for (std::size_t i = 0; i < g.numel(); ++i) {
    const S x = g.data[i];
    if (x > S(0))
      throw Error("tensor '" + name + "' (log-decay) has g = " + std::to_string(static_cast<double>(x)) +
                  " > 0 at flat index " + std::to_string(i) + "; accepted: g <= 0 (alpha = e^g in (0, 1])");
    if (kind == GateKind::bounded && x < g_min)
      throw Error("tensor '" + name + "' (log-decay) has g = " + std::to_string(static_cast<double>(x)) +
                  " < g_min = " + std::to_string(static_cast<double>(g_min)) + " at flat index " + std::to_string(i) +
                  "; accepted for the bounded gate: [g_min, 0]");
  }
}

/// Smallest cumulative log-decay over any window of `tile` consecutive tokens of one channel,
/// min over (t0, c) of sum_{t=t0}^{t0+tile-1} g(t, c) (windows clipped at T). g: [T, channels].
/// With the bounded gate this is >= tile * g_min (= -80 for tile 16, g_min = -5; docs/equations.md, gates).
template <class S>
S min_tile_log_decay(const Mat<S>& g, Eigen::Index tile = 16) {
  S lo = S(0);
  for (Eigen::Index c = 0; c < g.cols(); ++c)
    for (Eigen::Index t0 = 0; t0 < g.rows(); ++t0) {
      S acc = S(0);
      for (Eigen::Index t = t0; t < std::min<Eigen::Index>(g.rows(), t0 + tile); ++t) acc += g(t, c);
      if (acc < lo) lo = acc;
    }
  return lo;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_GATE(X, S) \
  X template Mat<S> gate<S>(const Mat<S>&, const Vec<S>&, const Mat<S>&, GateKind, const S&); \
  X template Mat<S> gate_logit_from_x<S>(const Mat<S>&, const Mat<S>&, const Mat<S>&); \
  X template Mat<S> gate_logit_from_v<S>(const Mat<S>&, const Mat<S>&);
KDALAB_TEMPLATES_GATE(extern, double)
KDALAB_TEMPLATES_GATE(extern, mp50)

}  // namespace kdalab
