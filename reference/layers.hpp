#pragma once
/// The small layers around the KDA core (docs/equations.md, KDA layer; K3 report Eqs. 2, 6):
///   q, k = L2Norm(Swish(ShortConv(W_{q/k} x)));  v = Swish(ShortConv(W_v x));  beta = Sigmoid(W_beta x)
///   y_t  = W_o [ Sigmoid(W_g x_t) ⊙ RMSNorm(o_t) ]          (RMSNorm per head; full-rank gate)
/// Also used by Gated MLA (output gate, RMSNorm) and the hybrid stack.
///
/// Layouts: token-major matrices (Mat<S>, row t = token t, columns = channels); a linear map
/// W: [out, in] acts as y = x W^T. Per-head ops see the columns as `heads` blocks of width d.
#include <cmath>
#include <string>

#include "reference/error.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

/// Linear map y = x W^T. x: [T, in]; W: [out, in]. Returns [T, out].
/// Errors: kdalab::Error naming `name` when W's column count is not x's.
template <class S>
Mat<S> linear(const Mat<S>& x, const Mat<S>& W, const std::string& name = "W") {
  require(W.cols() == x.cols(), "linear: tensor '" + name + "' is [" + std::to_string(W.rows()) + ", " +
                                    std::to_string(W.cols()) + "], expected [out, " + std::to_string(x.cols()) +
                                    "] to match the input width");
  return x * W.transpose();
}

/// Elementwise Swish / SiLU x * Sigmoid(x). Any shape.
template <class S>
Mat<S> swish_mat(const Mat<S>& x) {
  Mat<S> y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.size(); ++i) y.data()[i] = swish<S>(x.data()[i]);
  return y;
}

/// Elementwise logistic Sigmoid. Any shape.
template <class S>
Mat<S> sigmoid_mat(const Mat<S>& x) {
  Mat<S> y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.size(); ++i) y.data()[i] = sigmoid<S>(x.data()[i]);
  return y;
}

/// The "tail" cache of a causal depthwise convolution: the last K - 1 inputs seen, oldest first.
/// x: [K - 1, channels]; zeros before the first token.
template <class S>
struct ConvTail {
  Mat<S> x;
  ConvTail() = default;
  ConvTail(Eigen::Index K, Eigen::Index channels) : x(Mat<S>::Zero(K - 1, channels)) {}
};

/// Causal depthwise convolution (ShortConv, kernel K = 4 in KDA; K3 report Eq. 2; Kimi Linear):
///     y_{t,c} = sum_{j=0}^{K-1} w_{c,j} x_{t-(K-1)+j, c}
/// so w_{c,K-1} weights the current token and x_{<0} is read from the tail (zeros for a fresh one).
/// No bias, no activation (Swish is separate). x: [T, channels]; w: [channels, K]; tail: [K-1,
/// channels], updated in place to the last K - 1 inputs, so prefill then token-by-token decode
/// equals one prefill over the concatenation. Returns y: [T, channels]. T = 0 is allowed.
/// Errors: kdalab::Error naming 'w' or 'tail' (with `name` as a prefix) on a shape mismatch.
template <class S>
Mat<S> short_conv(const Mat<S>& x, const Mat<S>& w, ConvTail<S>& tail, const std::string& name = "short_conv") {
  const Eigen::Index T = x.rows(), C = x.cols(), K = w.cols();
  require(K >= 1 && w.rows() == C, name + ": tensor 'w' is [" + std::to_string(w.rows()) + ", " + std::to_string(K) +
                                       "], expected [channels = " + std::to_string(C) + ", K >= 1]");
  require(tail.x.rows() == K - 1 && tail.x.cols() == C,
          name + ": tensor 'tail' is [" + std::to_string(tail.x.rows()) + ", " + std::to_string(tail.x.cols()) +
              "], expected [K - 1 = " + std::to_string(K - 1) + ", channels = " + std::to_string(C) + "]");
  // Extended input: the tail then x.
  Mat<S> ext(K - 1 + T, C);
  if (K > 1) ext.topRows(K - 1) = tail.x;
  if (T > 0) ext.bottomRows(T) = x;
  Mat<S> y = Mat<S>::Zero(T, C);
  for (Eigen::Index t = 0; t < T; ++t)
    for (Eigen::Index c = 0; c < C; ++c) {
      S acc = S(0);
      for (Eigen::Index j = 0; j < K; ++j) acc += w(c, j) * ext(t + j, c);
      y(t, c) = acc;
    }
  if (K > 1) tail.x = ext.bottomRows(K - 1);
  return y;
}

/// Per-head L2 normalisation with eps: x_h / sqrt(||x_h||^2 + eps) for each block of d columns
/// (the q/k normalisation of KDA; eps = 1e-6 in fla's l2norm; eps = 0 gives exact unit rows,
/// a zero row then stays zero). x: [T, heads * d]. Errors: kdalab::Error if x's width is not a
/// multiple of d or eps < 0.
template <class S>
Mat<S> l2norm(const Mat<S>& x, Eigen::Index d, const S& eps = S(1e-6)) {
  require(d >= 1 && x.cols() % d == 0, "l2norm: tensor 'x' has " + std::to_string(x.cols()) +
                                           " columns, not a multiple of the head dim " + std::to_string(d));
  require(eps >= S(0), "l2norm: eps = " + std::to_string(static_cast<double>(eps)) + " must be >= 0");
  Mat<S> y = x;
  for (Eigen::Index t = 0; t < x.rows(); ++t)
    for (Eigen::Index h = 0; h < x.cols() / d; ++h) {
      const S n2 = x.row(t).segment(h * d, d).squaredNorm() + eps;
      if (n2 > S(0)) y.row(t).segment(h * d, d) /= ssqrt<S>(n2);
    }
  return y;
}

/// Per-head RMSNorm: y_h = x_h / sqrt(mean(x_h^2) + eps) ⊙ w for each block of d columns, with one
/// weight vector w [d] shared by the heads (as Kimi Linear's gated output norm). x: [T, heads * d].
/// Errors: kdalab::Error naming 'x' or 'w' on a shape mismatch, or eps < 0.
template <class S>
Mat<S> rmsnorm(const Mat<S>& x, const Vec<S>& w, const S& eps = S(1e-5)) {
  const Eigen::Index d = w.size();
  require(d >= 1 && x.cols() % d == 0, "rmsnorm: tensor 'x' has " + std::to_string(x.cols()) +
                                           " columns, not a multiple of the length of 'w' (head dim " +
                                           std::to_string(d) + ")");
  require(eps >= S(0), "rmsnorm: eps = " + std::to_string(static_cast<double>(eps)) + " must be >= 0");
  Mat<S> y = x;
  for (Eigen::Index t = 0; t < x.rows(); ++t)
    for (Eigen::Index h = 0; h < x.cols() / d; ++h) {
      const S ms = x.row(t).segment(h * d, d).squaredNorm() / S(static_cast<double>(d)) + eps;
      const S inv = ms > S(0) ? S(S(1) / ssqrt<S>(ms)) : S(0);
      for (Eigen::Index i = 0; i < d; ++i) y(t, h * d + i) = x(t, h * d + i) * inv * w(i);
    }
  return y;
}

/// The output gate (K3 report Eq. 6; Gated MLA K3 report Eq. 7): Sigmoid(gate_logit) ⊙ o,
/// elementwise. o and gate_logit: [T, channels]. Errors: kdalab::Error naming 'gate_logit' on a
/// shape mismatch.
template <class S>
Mat<S> output_gate(const Mat<S>& o, const Mat<S>& gate_logit) {
  require(o.rows() == gate_logit.rows() && o.cols() == gate_logit.cols(),
          "output_gate: tensor 'gate_logit' is [" + std::to_string(gate_logit.rows()) + ", " +
              std::to_string(gate_logit.cols()) + "], expected the shape of 'o' [" + std::to_string(o.rows()) + ", " +
              std::to_string(o.cols()) + "]");
  Mat<S> y(o.rows(), o.cols());
  for (Eigen::Index i = 0; i < o.size(); ++i) y.data()[i] = sigmoid<S>(gate_logit.data()[i]) * o.data()[i];
  return y;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_LAYERS(X, S) \
  X template Mat<S> linear<S>(const Mat<S>&, const Mat<S>&, const std::string&); \
  X template Mat<S> swish_mat<S>(const Mat<S>&); \
  X template Mat<S> sigmoid_mat<S>(const Mat<S>&); \
  X template Mat<S> short_conv<S>(const Mat<S>&, const Mat<S>&, ConvTail<S>&, const std::string&); \
  X template Mat<S> l2norm<S>(const Mat<S>&, Eigen::Index, const S&); \
  X template Mat<S> rmsnorm<S>(const Mat<S>&, const Vec<S>&, const S&); \
  X template Mat<S> output_gate<S>(const Mat<S>&, const Mat<S>&);
KDALAB_TEMPLATES_LAYERS(extern, double)
KDALAB_TEMPLATES_LAYERS(extern, mp50)

}  // namespace kdalab
