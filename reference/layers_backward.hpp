#pragma once
/// Reverse-mode derivatives (vector-Jacobian products) of the elementwise and per-head pre-ops of
/// reference/layers.hpp that feed the KDA recurrence (K3 report Eq. 2; Kimi Linear report):
///   L2Norm   y = x / n,  n = sqrt(||x||^2 + eps)      dx = dy / n - x (x^T dy) / n^3
///   Sigmoid  y = 1 / (1 + e^-x)                        dx = dy Sigmoid(x) Sigmoid(-x)
///   Swish    y = x Sigmoid(x)                          dx = dy (Sigmoid(x) + x Sigmoid(x) Sigmoid(-x))
///   Linear   y = x W^T                                 dx = dy W,  dW = dy^T x
///   ShortConv y_{t,c} = sum_j w_{c,j} e_{t+j,c}, e = [tail; x]
///                                                     de_{t+j,c} += w_{c,j} dy_{t,c},  dw_{c,j} = sum_t dy_{t,c} e_{t+j,c}
///   RMSNorm  y = x r w,  r = (||x||^2 / d + eps)^-1/2  (per head block of d)
///                                                     u = dy ⊙ w:  dx = r u - x r^3 (x^T u) / d,  dw = sum dy ⊙ x r
///   Output gate  y = Sigmoid(l) ⊙ o                    do = dy ⊙ Sigmoid(l),  dl = dy ⊙ o Sigmoid(l) Sigmoid(-l)
/// (Sigmoid(x) Sigmoid(-x) = y (1 - y), evaluated without the cancellation of 1 - y near y = 1.)
/// Layouts as the forward ops: token-major matrices, per-head blocks of d columns.
#include <algorithm>
#include <limits>
#include <string>

#include "reference/error.hpp"
#include "reference/layers.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

/// Derivative of the logistic sigmoid, Sigmoid(x) Sigmoid(-x) = Sigmoid(x) (1 - Sigmoid(x)).
template <class S>
S sigmoid_derivative(const S& x) {
  return S(sigmoid<S>(x) * sigmoid<S>(S(-x)));
}

/// VJP of one L2Norm block y = x / sqrt(||x||^2 + eps): returns dx for upstream dy (same length).
/// At a zero vector with eps = 0 the forward op returns 0 (as l2norm and the fused kernel do) and is
/// not differentiable there; this returns dx = 0.
template <class S>
Vec<S> l2norm_vec_backward(const Vec<S>& x, const Vec<S>& dy, const S& eps) {
  const S n2 = x.squaredNorm() + eps;
  S m = S(0);  // the largest magnitude in x
  for (Eigen::Index i = 0; i < x.size(); ++i)
    if (sabs<S>(x(i)) > m) m = sabs<S>(x(i));
  if (eps == S(0) && m > S(0) && !(n2 >= std::numeric_limits<S>::min() && n2 <= std::numeric_limits<S>::max())) {
    // the sum of squares overflows or underflows S: the same VJP from x / m, whose squares sum to [1, length],
    // is the VJP at x times 1 / m (y = x / ||x|| does not change with the scale)
    const Vec<S> xs = x / m;
    const S ns2 = xs.squaredNorm(), ns = ssqrt<S>(ns2);
    return Vec<S>((dy / ns - xs * (xs.dot(dy) / (ns2 * ns))) / m);
  }
  if (!(n2 > S(0))) return Vec<S>::Zero(x.size());
  const S n = ssqrt<S>(n2);
  return Vec<S>(dy / n - x * (x.dot(dy) / (n2 * n)));
}

/// VJP of l2norm(x, d, eps) (reference/layers.hpp): x, dy [T, heads * d]; returns dx [T, heads * d].
/// Errors: kdalab::Error naming 'x' / 'dy' on a width that is not a multiple of d or a shape mismatch,
/// or eps < 0.
template <class S>
Mat<S> l2norm_backward(const Mat<S>& x, const Mat<S>& dy, Eigen::Index d, const S& eps = S(1e-6)) {
  require(d >= 1 && x.cols() % d == 0, "l2norm_backward: tensor 'x' has " + std::to_string(x.cols()) +
                                           " columns, not a multiple of the head dim " + std::to_string(d));
  require(dy.rows() == x.rows() && dy.cols() == x.cols(),
          "l2norm_backward: tensor 'dy' is [" + std::to_string(dy.rows()) + ", " + std::to_string(dy.cols()) +
              "], expected the shape of 'x' [" + std::to_string(x.rows()) + ", " + std::to_string(x.cols()) + "]");
  require(eps >= S(0), "l2norm_backward: eps = " + std::to_string(static_cast<double>(eps)) + " must be >= 0");
  Mat<S> dx(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t)
    for (Eigen::Index h = 0; h < x.cols() / d; ++h)
      dx.row(t).segment(h * d, d) =
          l2norm_vec_backward<S>(x.row(t).segment(h * d, d).transpose(), dy.row(t).segment(h * d, d).transpose(), eps)
              .transpose();
  return dx;
}

/// VJP of sigmoid_mat: dx = dy ⊙ Sigmoid(x) Sigmoid(-x). x, dy of one shape (checked).
template <class S>
Mat<S> sigmoid_mat_backward(const Mat<S>& x, const Mat<S>& dy) {
  require(dy.rows() == x.rows() && dy.cols() == x.cols(), "sigmoid_mat_backward: tensor 'dy' has the wrong shape");
  Mat<S> dx(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.size(); ++i) dx.data()[i] = dy.data()[i] * sigmoid_derivative<S>(x.data()[i]);
  return dx;
}

/// Checks that an upstream gradient has the shape of the forward op's output.
template <class S>
void require_same_shape(const Mat<S>& dy, Eigen::Index rows, Eigen::Index cols, const std::string& op,
                        const std::string& name = "dy") {
  require(dy.rows() == rows && dy.cols() == cols,
          op + ": tensor '" + name + "' is [" + std::to_string(dy.rows()) + ", " + std::to_string(dy.cols()) +
              "], expected [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
}

/// Derivative of Swish x Sigmoid(x): Sigmoid(x) + x Sigmoid(x) Sigmoid(-x).
template <class S>
S swish_derivative(const S& x) {
  return S(sigmoid<S>(x) + x * sigmoid_derivative<S>(x));
}

/// VJP of swish_mat: dx = dy ⊙ (Sigmoid(x) + x Sigmoid(x) Sigmoid(-x)). x, dy of one shape (checked).
template <class S>
Mat<S> swish_mat_backward(const Mat<S>& x, const Mat<S>& dy) {
  require_same_shape(dy, x.rows(), x.cols(), "swish_mat_backward");
  Mat<S> dx(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.size(); ++i) dx.data()[i] = dy.data()[i] * swish_derivative<S>(x.data()[i]);
  return dx;
}

/// Gradients of a linear map y = x W^T: dx [T, in], dW [out, in].
template <class S>
struct LinearGrad {
  Mat<S> dx, dW;
};

/// VJP of linear(x, W): dx = dy W, dW = dy^T x. x [T, in]; W [out, in]; dy [T, out] (checked).
template <class S>
LinearGrad<S> linear_backward(const Mat<S>& x, const Mat<S>& W, const Mat<S>& dy) {
  require_same_shape(dy, x.rows(), W.rows(), "linear_backward");
  return {Mat<S>(dy * W), Mat<S>(dy.transpose() * x)};
}

/// Gradients of short_conv: dx [T, channels], dw [channels, K], dtail [K - 1, channels] (the
/// gradient of the tail the call started from).
template <class S>
struct ShortConvGrad {
  Mat<S> dx, dw, dtail;
};

/// VJP of short_conv(x, w, tail) (reference/layers.hpp; ShortConv of K3 report Eq. 2) for upstream
/// dy [T, channels]; `tail` is the tail the forward call started from (zeros for a fresh cache). The
/// loss is on y only: the updated tail the forward call leaves behind carries no gradient here.
/// Errors: kdalab::Error as short_conv, or naming 'dy' on a shape mismatch.
template <class S>
ShortConvGrad<S> short_conv_backward(const Mat<S>& x, const Mat<S>& w, const ConvTail<S>& tail, const Mat<S>& dy) {
  ConvTail<S> t = tail;
  (void)short_conv<S>(x, w, t, "short_conv_backward");  // the forward op's checks
  require_same_shape(dy, x.rows(), x.cols(), "short_conv_backward");
  const Eigen::Index T = x.rows(), C = x.cols(), K = w.cols();
  Mat<S> ext(K - 1 + T, C);
  if (K > 1) ext.topRows(K - 1) = tail.x;
  if (T > 0) ext.bottomRows(T) = x;
  Mat<S> dext = Mat<S>::Zero(K - 1 + T, C);
  ShortConvGrad<S> r{Mat<S>(), Mat<S>::Zero(C, K), Mat<S>()};
  for (Eigen::Index t0 = 0; t0 < T; ++t0)
    for (Eigen::Index c = 0; c < C; ++c)
      for (Eigen::Index j = 0; j < K; ++j) {
        dext(t0 + j, c) += w(c, j) * dy(t0, c);
        r.dw(c, j) += dy(t0, c) * ext(t0 + j, c);
      }
  r.dx = dext.bottomRows(T);
  r.dtail = dext.topRows(K - 1);
  return r;
}

/// Gradients of rmsnorm: dx [T, heads * d], dw [d] (summed over tokens and heads).
template <class S>
struct RmsNormGrad {
  Mat<S> dx;
  Vec<S> dw;
};

/// VJP of rmsnorm(x, w, eps) (reference/layers.hpp; per head block of d = w.size()) for upstream
/// dy [T, heads * d]. A zero block with eps = 0 (the forward op returns 0 there; not differentiable)
/// gets dx = 0 and adds nothing to dw. Errors: kdalab::Error as rmsnorm, or naming 'dy'.
template <class S>
RmsNormGrad<S> rmsnorm_backward(const Mat<S>& x, const Vec<S>& w, const Mat<S>& dy, const S& eps = S(1e-5)) {
  (void)rmsnorm<S>(Mat<S>(x.topRows(std::min<Eigen::Index>(x.rows(), 1))), w, eps);  // the forward op's checks
  require_same_shape(dy, x.rows(), x.cols(), "rmsnorm_backward");
  const Eigen::Index d = w.size();
  const S dd = S(static_cast<double>(d));
  RmsNormGrad<S> r{Mat<S>::Zero(x.rows(), x.cols()), Vec<S>::Zero(d)};
  for (Eigen::Index t = 0; t < x.rows(); ++t)
    for (Eigen::Index h = 0; h < x.cols() / d; ++h) {
      const Vec<S> xb = x.row(t).segment(h * d, d).transpose(), dyb = dy.row(t).segment(h * d, d).transpose();
      const S ms = xb.squaredNorm() / dd + eps;
      if (!(ms > S(0))) continue;
      const S inv = S(1) / ssqrt<S>(ms);
      const Vec<S> u = dyb.cwiseProduct(w);
      r.dx.row(t).segment(h * d, d) = (inv * u - xb * (inv * inv * inv * xb.dot(u) / dd)).transpose();
      r.dw += dyb.cwiseProduct(xb) * inv;
    }
  return r;
}

/// Gradients of output_gate: do and dgate_logit, both [T, channels].
template <class S>
struct OutputGateGrad {
  Mat<S> d_o, d_gate_logit;
};

/// VJP of output_gate(o, gate_logit) (K3 report Eq. 6): do = dy ⊙ Sigmoid(l),
/// dl = dy ⊙ o ⊙ Sigmoid(l) Sigmoid(-l). Errors: kdalab::Error as output_gate, or naming 'dy'.
template <class S>
OutputGateGrad<S> output_gate_backward(const Mat<S>& o, const Mat<S>& gate_logit, const Mat<S>& dy) {
  (void)output_gate<S>(o, gate_logit);  // the forward op's checks
  require_same_shape(dy, o.rows(), o.cols(), "output_gate_backward");
  OutputGateGrad<S> r{Mat<S>(o.rows(), o.cols()), Mat<S>(o.rows(), o.cols())};
  for (Eigen::Index i = 0; i < o.size(); ++i) {
    const S l = gate_logit.data()[i];
    r.d_o.data()[i] = dy.data()[i] * sigmoid<S>(l);
    r.d_gate_logit.data()[i] = dy.data()[i] * o.data()[i] * sigmoid_derivative<S>(l);
  }
  return r;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_LAYERS_BACKWARD(X, S) \
  X template Vec<S> l2norm_vec_backward<S>(const Vec<S>&, const Vec<S>&, const S&); \
  X template Mat<S> l2norm_backward<S>(const Mat<S>&, const Mat<S>&, Eigen::Index, const S&); \
  X template Mat<S> sigmoid_mat_backward<S>(const Mat<S>&, const Mat<S>&); \
  X template Mat<S> swish_mat_backward<S>(const Mat<S>&, const Mat<S>&); \
  X template LinearGrad<S> linear_backward<S>(const Mat<S>&, const Mat<S>&, const Mat<S>&); \
  X template ShortConvGrad<S> short_conv_backward<S>(const Mat<S>&, const Mat<S>&, const ConvTail<S>&, \
      const Mat<S>&); \
  X template RmsNormGrad<S> rmsnorm_backward<S>(const Mat<S>&, const Vec<S>&, const Mat<S>&, const S&); \
  X template OutputGateGrad<S> output_gate_backward<S>(const Mat<S>&, const Mat<S>&, const Mat<S>&);
KDALAB_TEMPLATES_LAYERS_BACKWARD(extern, double)
KDALAB_TEMPLATES_LAYERS_BACKWARD(extern, mp50)

}  // namespace kdalab
