#pragma once
/// Exact reverse-mode derivative (vector-Jacobian product) of the MLA attention core of
/// reference/mla.hpp (DeepSeek-V2 §2.1 Eqs. 9-19; K3 report Eq. 7), naive and absorbed forms.
/// Per head i, queries q^C_i [T, d_nope], q^R_i [T, d_rope], latent cache C [N, d_c], shared keys
/// K_R [N, d_rope], query row t at absolute position pos0 + t (causal: keys tau <= pos0 + t):
///     K_i = C W_UK,i^T,  V_i = C W_UV,i^T
///     Z_i = scale (q^C_i K_i^T + q^R_i K_R^T),  P_i = causal softmax rows(Z_i),  O_i = P_i V_i
/// Given dO_i = dL/dO_i [T, d_v]:
///     dP = dO_i V_i^T,  dZ = scale P ⊙ (dP - rowsum(P ⊙ dP))     (masked entries: P = 0, dZ = 0)
///   naive:    dV_i = P^T dO_i,  dK_i = dZ^T q^C_i
///             dq^C_i = dZ K_i,  dC += dK_i W_UK,i + dV_i W_UV,i,  dW_UK,i = dK_i^T C,  dW_UV,i = dV_i^T C
///   absorbed: q~_i = q^C_i W_UK,i,  A_i = P C,  O_i = A_i W_UV,i^T,  dA = dO_i W_UV,i
///             dP = dA C^T (= dO_i V_i^T),  dC += P^T dA + dZ^T q~_i,  dq~ = dZ C,
///             dq^C_i = dq~ W_UK,i^T,  dW_UK,i = q^C_i^T dq~,  dW_UV,i = dO_i^T A_i
///   both:     dq^R_i = dZ K_R,  dK_R += dZ^T q^R_i
/// The two forms compute one function, so their gradients agree to rounding.
/// Layouts as mla_attend_naive: q_C [T, n_h d_nope], q_R [T, n_h d_rope], C [N, d_c], K_R [N, d_rope],
/// dO [T, n_h d_v]; W_UK [n_h d_nope, d_c], W_UV [n_h d_v, d_c].
///
/// The whole layer on a fresh cache (mla_prefill_backward, pos0 = 0, C = c = X W_DKV^T, K_R = rot(X W_KR^T)),
/// y = W_o [Sigmoid(W_g X) ⊙ O] (K3 report Eq. 7), adds the projections' VJPs:
///     dW_o = dY^T (gate ⊙ O),  dG = dY W_o,  dO = dG ⊙ gate,  dl = dG ⊙ O ⊙ Sigmoid'(l),  dW_g = dl^T X
///     RoPE is a rotation R_t per position: d(pre-rotation row) = R_t^T d(rotated row)
///     dQ = [dq^C_i ; R^T dq^R_i] per head,  dW_Q = dQ^T X  (or dW_UQ = dQ^T c_Q, dW_DQ = (dQ W_UQ)^T X)
///     dW_DKV = dC^T X,  dW_KR = (R^T dK_R)^T X,  dX = the sum of each projection's dY_p W_p
#include <cstddef>
#include <string>

#include "reference/error.hpp"
#include "reference/layers_backward.hpp"
#include "reference/mla.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

/// Gradients of the MLA attention core: dq_C [T, n_h d_nope], dq_R [T, n_h d_rope], dC [N, d_c]
/// (the latent cache), dK_R [N, d_rope], dW_UK [n_h d_nope, d_c], dW_UV [n_h d_v, d_c].
template <class S>
struct MlaAttendGrad {
  Mat<S> dq_C, dq_R, dC, dK_R, dW_UK, dW_UV;
};

namespace detail {
/// dZ = scale P ⊙ (dP - rowsum(P ⊙ dP)) for a causal row softmax P (masked entries are 0 in P).
template <class S>
Mat<S> softmax_rows_backward(const Mat<S>& P, const Mat<S>& dP, const S& scale) {
  Mat<S> dZ(P.rows(), P.cols());
  for (Eigen::Index t = 0; t < P.rows(); ++t) {
    const S rs = P.row(t).dot(dP.row(t));
    for (Eigen::Index j = 0; j < P.cols(); ++j) dZ(t, j) = scale * P(t, j) * (dP(t, j) - rs);
  }
  return dZ;
}
/// Scores P_i (after the causal softmax) of head i: scale (q^C_i K_i^T + q^R_i K_R^T), K_i = C W_UK,i^T.
template <class S>
Mat<S> mla_head_probs(const MlaConfig& cfg, const MlaWeights<S>& w, const MlaProjected<S>& p, const Mat<S>& C,
                      const Mat<S>& K_R, std::size_t pos0, Eigen::Index i) {
  const Eigen::Index dn = cfg.d_nope, dr = cfg.d_rope;
  Mat<S> P = p.q_C.middleCols(i * dn, dn) * (C * w.W_UK.middleRows(i * dn, dn).transpose()).transpose();
  if (dr > 0) P += p.q_R.middleCols(i * dr, dr) * K_R.transpose();
  P *= mla_scale<S>(cfg);
  causal_softmax_rows(P, pos0);
  return P;
}
/// Checks dO against the problem's shape.
template <class S>
void mla_require_dO(const MlaConfig& cfg, const MlaProjected<S>& p, const Mat<S>& dO) {
  require(dO.rows() == p.q_C.rows() && static_cast<std::size_t>(dO.cols()) == cfg.n_h * cfg.d_v,
          "MLA backward: tensor 'dO' is [" + std::to_string(dO.rows()) + ", " + std::to_string(dO.cols()) +
              "], expected [T = " + std::to_string(p.q_C.rows()) + ", n_h d_v = " + std::to_string(cfg.n_h * cfg.d_v) + "]");
}
/// The gradients' storage, shaped like their inputs: the accumulated ones (dq_R, dC, dK_R) zeroed, the ones every
/// head writes once (dq_C, dW_UK, dW_UV) left to be filled.
template <class S>
MlaAttendGrad<S> mla_grad_shaped(const MlaWeights<S>& w, const MlaProjected<S>& p, const Mat<S>& C, const Mat<S>& K_R) {
  return {Mat<S>(p.q_C.rows(), p.q_C.cols()), Mat<S>::Zero(p.q_R.rows(), p.q_R.cols()), Mat<S>::Zero(C.rows(), C.cols()),
          Mat<S>::Zero(K_R.rows(), K_R.cols()), Mat<S>(w.W_UK.rows(), w.W_UK.cols()), Mat<S>(w.W_UV.rows(), w.W_UV.cols())};
}
}  // namespace detail

/// VJP of mla_attend_naive for upstream dO [T, n_h d_v] (file comment). No checks beyond dO's shape.
template <class S>
MlaAttendGrad<S> mla_attend_naive_backward(const MlaConfig& cfg, const MlaWeights<S>& w, const MlaProjected<S>& p,
                                           const Mat<S>& C, const Mat<S>& K_R, std::size_t pos0, const Mat<S>& dO) {
  detail::mla_require_dO(cfg, p, dO);
  const Eigen::Index nh = cfg.n_h, dn = cfg.d_nope, dr = cfg.d_rope, dv = cfg.d_v;
  const S scale = mla_scale<S>(cfg);
  MlaAttendGrad<S> g = detail::mla_grad_shaped(w, p, C, K_R);
  for (Eigen::Index i = 0; i < nh; ++i) {
    const Mat<S> Ki = C * w.W_UK.middleRows(i * dn, dn).transpose();  // [N, d_nope]
    const Mat<S> Vi = C * w.W_UV.middleRows(i * dv, dv).transpose();  // [N, d_v]
    const Mat<S> P = detail::mla_head_probs(cfg, w, p, C, K_R, pos0, i);
    const Mat<S> dOi = dO.middleCols(i * dv, dv);
    const Mat<S> dZ = detail::softmax_rows_backward<S>(P, Mat<S>(dOi * Vi.transpose()), scale);
    const Mat<S> dVi = P.transpose() * dOi;
    const Mat<S> dKi = dZ.transpose() * p.q_C.middleCols(i * dn, dn);
    g.dq_C.middleCols(i * dn, dn) = dZ * Ki;
    g.dC += dKi * w.W_UK.middleRows(i * dn, dn) + dVi * w.W_UV.middleRows(i * dv, dv);
    g.dW_UK.middleRows(i * dn, dn) = dKi.transpose() * C;
    g.dW_UV.middleRows(i * dv, dv) = dVi.transpose() * C;
    if (dr > 0) {
      g.dq_R.middleCols(i * dr, dr) = dZ * K_R;
      g.dK_R += dZ.transpose() * p.q_R.middleCols(i * dr, dr);
    }
  }
  return g;
}

/// VJP of mla_attend_absorbed for upstream dO [T, n_h d_v] (file comment): never forms K_i or V_i.
template <class S>
MlaAttendGrad<S> mla_attend_absorbed_backward(const MlaConfig& cfg, const MlaWeights<S>& w, const MlaProjected<S>& p,
                                              const Mat<S>& C, const Mat<S>& K_R, std::size_t pos0, const Mat<S>& dO) {
  detail::mla_require_dO(cfg, p, dO);
  const Eigen::Index nh = cfg.n_h, dn = cfg.d_nope, dr = cfg.d_rope, dv = cfg.d_v;
  const S scale = mla_scale<S>(cfg);
  MlaAttendGrad<S> g = detail::mla_grad_shaped(w, p, C, K_R);
  for (Eigen::Index i = 0; i < nh; ++i) {
    const Mat<S> qCi = p.q_C.middleCols(i * dn, dn);
    const Mat<S> q_abs = qCi * w.W_UK.middleRows(i * dn, dn);  // [T, d_c]
    Mat<S> P = q_abs * C.transpose();
    if (dr > 0) P += p.q_R.middleCols(i * dr, dr) * K_R.transpose();
    P *= scale;
    detail::causal_softmax_rows(P, pos0);
    const Mat<S> A = P * C;  // [T, d_c]
    const Mat<S> dOi = dO.middleCols(i * dv, dv);
    const Mat<S> dA = dOi * w.W_UV.middleRows(i * dv, dv);  // [T, d_c]
    const Mat<S> dZ = detail::softmax_rows_backward<S>(P, Mat<S>(dA * C.transpose()), scale);
    const Mat<S> dq_abs = dZ * C;  // [T, d_c]
    g.dC += P.transpose() * dA + dZ.transpose() * q_abs;
    g.dq_C.middleCols(i * dn, dn) = dq_abs * w.W_UK.middleRows(i * dn, dn).transpose();
    g.dW_UK.middleRows(i * dn, dn) = qCi.transpose() * dq_abs;
    g.dW_UV.middleRows(i * dv, dv) = dOi.transpose() * A;
    if (dr > 0) {
      g.dq_R.middleCols(i * dr, dr) = dZ * K_R;
      g.dK_R += dZ.transpose() * p.q_R.middleCols(i * dr, dr);
    }
  }
  return g;
}

/// Gradients of a Gated MLA layer prefill: dx [T, hidden] and one gradient per weight, shaped as the
/// weights (the ones the config does not use stay empty, as in mla_random_weights).
template <class S>
struct MlaLayerGrad {
  Mat<S> dx;
  MlaWeights<S> dw;
};

namespace detail {
/// The transpose of rope_rotate at position `pos`: rotates each pair (2j, 2j+1) by minus its angle.
template <class S, class Row>
void rope_rotate_transpose(Row&& r, std::size_t pos, double base) {
  const Eigen::Index n = r.size();
  for (Eigen::Index j = 0; j + 1 < n; j += 2) {
    const S ang = S(static_cast<double>(pos)) * sexp<S>(S(-static_cast<double>(j) / static_cast<double>(n)) * slog<S>(S(base)));
    using std::cos; using std::sin; using boost::multiprecision::cos; using boost::multiprecision::sin;
    const S cs = S(cos(ang)), sn = S(sin(ang));
    const S a = r(j), b = r(j + 1);
    r(j) = a * cs + b * sn;
    r(j + 1) = -a * sn + b * cs;
  }
}
}  // namespace detail

/// VJP of mla_prefill(cfg, w, X, fresh cache, eval) (positions 0 .. T-1) for upstream dY [T, hidden]:
/// gradients of X and of every weight (file comment). eval picks the attention core's VJP (naive or
/// absorbed; streaming computes the absorbed function and takes its VJP). Errors: kdalab::Error as
/// mla_prefill (weights, X), or naming 'dY' on a shape mismatch.
template <class S>
MlaLayerGrad<S> mla_prefill_backward(const MlaConfig& cfg, const MlaWeights<S>& w, const Mat<S>& X, const Mat<S>& dY,
                                     MlaEval eval = MlaEval::naive) {
  mla_validate(cfg, w);
  require(X.rows() >= 1 && static_cast<std::size_t>(X.cols()) == cfg.hidden,
          "MLA backward: input 'x' has shape [" + std::to_string(X.rows()) + ", " + std::to_string(X.cols()) +
              "], expected [T >= 1, hidden = " + std::to_string(cfg.hidden) + "]");
  detail::require_finite_mat(X, "MLA input x");
  require(dY.rows() == X.rows() && dY.cols() == X.cols(),
          "MLA backward: tensor 'dY' is [" + std::to_string(dY.rows()) + ", " + std::to_string(dY.cols()) +
              "], expected the shape of 'x' [" + std::to_string(X.rows()) + ", " + std::to_string(X.cols()) + "]");
  const Eigen::Index T = X.rows(), nh = cfg.n_h, dn = cfg.d_nope, dr = cfg.d_rope, dqk = cfg.d_qk();
  const MlaProjected<S> p = mla_project(cfg, w, X, 0);
  const Mat<S> O = eval == MlaEval::naive ? mla_attend_naive(cfg, w, p, p.c, p.k_R, 0)
                                          : mla_attend_absorbed(cfg, w, p, p.c, p.k_R, 0);
  MlaLayerGrad<S> r;
  MlaWeights<S>& d = r.dw;
  Mat<S> dO;
  if (cfg.output_gate) {
    d.W_o = dY.transpose() * p.gate.cwiseProduct(O);
    const Mat<S> dG = dY * w.W_o;
    dO = dG.cwiseProduct(p.gate);
    const Mat<S> logit = X * w.W_g.transpose();  // Sigmoid'(l) = Sigmoid(l) Sigmoid(-l): no 1 - gate cancellation
    Mat<S> dl(T, dG.cols());
    for (Eigen::Index i = 0; i < dl.size(); ++i) dl.data()[i] = dG.data()[i] * O.data()[i] * sigmoid_derivative<S>(logit.data()[i]);
    d.W_g = dl.transpose() * X;
    r.dx = dl * w.W_g;
  } else {
    d.W_o = dY.transpose() * O;
    dO = dY * w.W_o;
    r.dx = Mat<S>::Zero(T, X.cols());
  }
  const MlaAttendGrad<S> a = eval == MlaEval::naive ? mla_attend_naive_backward(cfg, w, p, p.c, p.k_R, 0, dO)
                                                    : mla_attend_absorbed_backward(cfg, w, p, p.c, p.k_R, 0, dO);
  d.W_UK = a.dW_UK;
  d.W_UV = a.dW_UV;
  Mat<S> dQ(T, nh * dqk), dkR = a.dK_R;
  for (Eigen::Index i = 0; i < nh; ++i) {
    dQ.middleCols(i * dqk, dn) = a.dq_C.middleCols(i * dn, dn);
    dQ.middleCols(i * dqk + dn, dr) = a.dq_R.middleCols(i * dr, dr);
  }
  if (cfg.rope && dr > 0)
    for (Eigen::Index t = 0; t < T; ++t) {
      detail::rope_rotate_transpose<S>(dkR.row(t), static_cast<std::size_t>(t), cfg.rope_theta);
      for (Eigen::Index i = 0; i < nh; ++i)
        detail::rope_rotate_transpose<S>(dQ.row(t).segment(i * dqk + dn, dr), static_cast<std::size_t>(t),
                                         cfg.rope_theta);
    }
  if (cfg.d_cq == 0) {
    d.W_Q = dQ.transpose() * X;
    r.dx += dQ * w.W_Q;
  } else {
    const Mat<S> cQ = X * w.W_DQ.transpose();
    d.W_UQ = dQ.transpose() * cQ;
    const Mat<S> dcQ = dQ * w.W_UQ;
    d.W_DQ = dcQ.transpose() * X;
    r.dx += dcQ * w.W_DQ;
  }
  d.W_DKV = a.dC.transpose() * X;
  r.dx += a.dC * w.W_DKV;
  d.W_KR = dkR.transpose() * X;
  if (dr > 0) r.dx += dkR * w.W_KR;
  return r;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_MLA_BACKWARD(X, S) \
  X template Mat<S> detail::softmax_rows_backward<S>(const Mat<S>&, const Mat<S>&, const S&); \
  X template Mat<S> detail::mla_head_probs<S>(const MlaConfig&, const MlaWeights<S>&, const MlaProjected<S>&, \
      const Mat<S>&, const Mat<S>&, std::size_t, Eigen::Index); \
  X template MlaAttendGrad<S> detail::mla_grad_shaped<S>(const MlaWeights<S>&, const MlaProjected<S>&, const Mat<S>&, \
      const Mat<S>&); \
  X template MlaAttendGrad<S> mla_attend_naive_backward<S>(const MlaConfig&, const MlaWeights<S>&, \
      const MlaProjected<S>&, const Mat<S>&, const Mat<S>&, std::size_t, const Mat<S>&); \
  X template MlaAttendGrad<S> mla_attend_absorbed_backward<S>(const MlaConfig&, const MlaWeights<S>&, \
      const MlaProjected<S>&, const Mat<S>&, const Mat<S>&, std::size_t, const Mat<S>&); \
  X template MlaLayerGrad<S> mla_prefill_backward<S>(const MlaConfig&, const MlaWeights<S>&, const Mat<S>&, \
      const Mat<S>&, MlaEval);
KDALAB_TEMPLATES_MLA_BACKWARD(extern, double)
KDALAB_TEMPLATES_MLA_BACKWARD(extern, mp50)

}  // namespace kdalab
