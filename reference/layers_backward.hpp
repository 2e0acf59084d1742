#pragma once
/// Reverse-mode derivatives (vector-Jacobian products) of the elementwise and per-head pre-ops of
/// reference/layers.hpp that feed the KDA recurrence (K3 report Eq. 2; Kimi Linear report):
///   L2Norm   y = x / n,  n = sqrt(||x||^2 + eps)      dx = dy / n - x (x^T dy) / n^3
///   Sigmoid  y = 1 / (1 + e^-x)                        dx = dy Sigmoid(x) Sigmoid(-x)
/// (Sigmoid(x) Sigmoid(-x) = y (1 - y), evaluated without the cancellation of 1 - y near y = 1.)
/// Layouts as the forward ops: token-major matrices, per-head blocks of d columns.
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

}  // namespace kdalab
