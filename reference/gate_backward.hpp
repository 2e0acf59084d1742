#pragma once
/// Reverse-mode derivatives (vector-Jacobian products) of the KDA decay gates of reference/gate.hpp.
///
///   K3 bounded gate (K3 report Eq. 5):  g = g_min Sigmoid(u),  u = e^{A_h} (z + b)
///       dg/du = g_min Sigmoid(u) Sigmoid(-u);  dz = dg dg/du e^{A_h};  db += dz;
///       dA_h += dg dg/du u                      (du/dA_h = u)
///   Kimi Linear gate (Kimi Linear report):  g = -e^{A_h} Softplus(x),  x = z + dt_bias
///       dz = -dg e^{A_h} Sigmoid(x);  d dt_bias += dz;  dA_h += dg g     (dg/dA_h = g)
/// The per-head and per-(head, channel) parameters collect the sums over all tokens (and batch).
/// Layouts as gate(): z, g, dz, dg [T, HV * d_k]; A_log, dA_log [HV]; bias, dbias [HV, d_k].
#include <cmath>
#include <string>

#include "reference/gate.hpp"
#include "reference/layers_backward.hpp"

namespace kdalab {

/// Partial derivatives of one gate value g(z, A_log, b): dg/dz, dg/dA_log (dg/db = dg/dz).
template <class S>
struct GatePartials {
  S dz, dA_log;
};

/// dg/dz and dg/dA_log of bounded_gate(z, A_log, b, g_min) (K3 report Eq. 5).
template <class S>
GatePartials<S> bounded_gate_partials(const S& z, const S& A_log, const S& b, const S& g_min) {
  const S a = sexp<S>(A_log), u = a * (z + b);
  const S dgdu = g_min * sigmoid_derivative<S>(u);
  return {S(dgdu * a), S(dgdu * u)};
}

/// dg/dz and dg/dA_log of softplus_gate(z, A_log, dt_bias) (Kimi Linear report).
template <class S>
GatePartials<S> softplus_gate_partials(const S& z, const S& A_log, const S& dt_bias) {
  const S x = z + dt_bias;
  return {S(-sexp<S>(A_log) * sigmoid<S>(x)), softplus_gate<S>(z, A_log, dt_bias)};
}

/// Gradients of gate(): dz [T, HV * d_k], dA_log [HV], dbias [HV, d_k].
template <class S>
struct GateGrad {
  Mat<S> dz;
  Vec<S> dA_log;
  Mat<S> dbias;
};

/// VJP of gate(z, A_log, bias, kind, g_min) for upstream dg [T, HV * d_k].
/// Errors: kdalab::Error as gate(), naming 'dg' on a shape mismatch, or naming A_log and bias where a partial
/// derivative is not finite in float64 (the bounded gate with e^A_log (z + b) beyond float64: its derivative
/// e^A_log Sigmoid'(u) is then inf * 0, though g itself saturates at g_min or 0).
template <class S>
GateGrad<S> gate_backward(const Mat<S>& z, const Vec<S>& A_log, const Mat<S>& bias, GateKind kind, const Mat<S>& dg,
                          const S& g_min = S(-5)) {
  (void)gate<S>(z, A_log, bias, kind, g_min);  // the forward op's checks
  require(dg.rows() == z.rows() && dg.cols() == z.cols(),
          "gate_backward: tensor 'dg' is [" + std::to_string(dg.rows()) + ", " + std::to_string(dg.cols()) +
              "], expected the shape of 'z' [" + std::to_string(z.rows()) + ", " + std::to_string(z.cols()) + "]");
  const auto HV = A_log.size(), d_k = bias.cols();
  GateGrad<S> r{Mat<S>(z.rows(), z.cols()), Vec<S>::Zero(HV), Mat<S>::Zero(HV, d_k)};
  for (Eigen::Index t = 0; t < z.rows(); ++t)
    for (Eigen::Index h = 0; h < HV; ++h)
      for (Eigen::Index i = 0; i < d_k; ++i) {
        const Eigen::Index c = h * d_k + i;
        const GatePartials<S> p = kind == GateKind::bounded ? bounded_gate_partials<S>(z(t, c), A_log(h), bias(h, i), g_min)
                                                            : softplus_gate_partials<S>(z(t, c), A_log(h), bias(h, i));
        if (!std::isfinite(static_cast<double>(p.dz)) || !std::isfinite(static_cast<double>(p.dA_log)))
          throw gate_range_error("gate_backward", static_cast<double>(A_log(h)), h,
                                 static_cast<double>(z(t, c) + bias(h, i)), t, c, "a non-finite derivative of the gate",
                                 "A_log and bias that keep e^A_log (z + bias) finite in float64");
        r.dz(t, c) = dg(t, c) * p.dz;
        r.dbias(h, i) += r.dz(t, c);
        r.dA_log(h) += dg(t, c) * p.dA_log;
      }
  return r;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_GATE_BACKWARD(X, S) \
  X template GateGrad<S> gate_backward<S>(const Mat<S>&, const Vec<S>&, const Mat<S>&, GateKind, const Mat<S>&, \
      const S&);
KDALAB_TEMPLATES_GATE_BACKWARD(extern, double)
KDALAB_TEMPLATES_GATE_BACKWARD(extern, mp50)

}  // namespace kdalab
