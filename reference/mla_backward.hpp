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
/// dO [T, n_h d_v]; W_UK [n_h d_nope, d_c], W_UV [n_h d_v, d_c]. The projections (RoPE, W_Q, W_DKV)
/// and the output gate are outside this VJP.
#include <string>

#include "reference/error.hpp"
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

}  // namespace kdalab
