#pragma once
/// Exact reverse-mode derivative (vector-Jacobian product) of KDA in chunkwise form (Kimi Linear
/// report §3-4; K3 report Eqs. 3-4; the forward is reference/kda_chunk.hpp). Per head and chunk of
/// L <= C tokens, with S the state entering the chunk, G_r = sum_{s<=r} g_s, Gamma = e^G (per channel),
/// gamma_L = Gamma_{L-1} (the last row):
///     Kg = Gamma ⊙ K,  Ki = K / Gamma,  Qg = Gamma ⊙ Q,  Kd = gamma_L ⊙ Ki   (row r: e^{G_L - G_r} ⊙ k_r)
///     A = StrictTril(Diag(beta) Kg Ki^T),  N = (I + A)^{-1}
///     W = N Diag(beta) Kg,  U = N Diag(beta) V,  V~ = U - W S
///     P = Tril(Qg Ki^T)  (diagonal kept),  O = scale (Qg S + P V~)
///     S' = Diag(gamma_L) S + Kd^T V~
/// Reverse step, given dO [L, d_v] and dS' [d_k, d_v]:
///     dV~ = scale P^T dO + Kd dS',   dP = scale Tril(dO V~^T),   dKd = V~ dS'^T
///     dQg = scale dO S^T + dP Ki,    dKi = dP^T Qg + gamma_L ⊙ dKd,  dgamma_L = rowsum(dS' ⊙ S) + sum_r dKd_r ⊙ Ki_r
///     dS  = scale Qg^T dO + Diag(gamma_L) dS' - W^T dV~
///     dW = -dV~ S^T,  dU = dV~;  with X = Diag(beta) Kg, Y = Diag(beta) V:
///     dX = N^T dW,  dY = N^T dU,  dA = -StrictTril(N^T (dW X^T + dU Y^T) N^T)
///     dB = Diag(beta) dA  (B = Kg Ki^T):  dKg = dB Ki + Diag(beta) dX,  dKi += dB^T Kg
///     dbeta_r = (dA ⊙ B)_r. + dX_r . Kg_r + dY_r . V_r,   dV = Diag(beta) dY
///     dK = Gamma ⊙ dKg + dKi / Gamma,  dQ = Gamma ⊙ dQg
///     dGamma = K ⊙ dKg - Ki ⊙ dKi / Gamma + Q ⊙ dQg  (+ dgamma_L on the last row)
///     dG = Gamma ⊙ dGamma,  dg_r = sum_{s >= r} dG_s       (reverse cumulative sum)
/// Decays are not factored into secondary tiles here: e^{-G} must stay finite, so a chunk's
/// cumulative log-decay span is limited to max_factored_span<S>() (checked; the recurrence backward
/// in reference/kda_backward.hpp has no such limit). Per-channel decay (KdaVariant::kda) only.
/// Layouts and result as kda_recurrent_backward (reference/kda_backward.hpp).
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "reference/kda_backward.hpp"
#include "reference/kda_chunk.hpp"

namespace kdalab {

namespace detail {
/// The per-chunk quantities of the file comment, for one head and chunk rows [t0, t0 + L).
template <class S>
struct KdaChunkFwd {
  Mat<S> Q, K, V, Gam, Kg, Ki, Qg, Kd, N, W, U, P;
  Vec<S> beta, gamL;
};
template <class S>
KdaChunkFwd<S> kda_chunk_quantities(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Mat<S>& g,
                                    const Vec<S>& beta, Eigen::Index t0, Eigen::Index L) {
  const Eigen::Index dk = q.cols();
  KdaChunkFwd<S> c;
  c.Q = q.middleRows(t0, L);
  c.K = k.middleRows(t0, L);
  c.V = v.middleRows(t0, L);
  c.beta = beta.segment(t0, L);
  c.Gam = Mat<S>(L, dk);
  for (Eigen::Index i = 0; i < dk; ++i) {
    S G = S(0);
    for (Eigen::Index r = 0; r < L; ++r) {
      G += g(t0 + r, i);
      require(-G <= max_factored_span<S>(),
              "kda_chunked_backward: tensor 'g' (log-decay) sums to " + num_str(static_cast<double>(G)) +
                  " inside a chunk, beyond the factored range; accepted: a cumulative log-decay >= -" +
                  num_str(max_factored_span<S>()) + " per chunk (use a smaller chunk or kda_recurrent_backward)");
      c.Gam(r, i) = sexp<S>(G);
    }
  }
  c.gamL = c.Gam.row(L - 1).transpose();
  c.Kg = c.Gam.cwiseProduct(c.K);
  c.Ki = c.K.cwiseQuotient(c.Gam);
  c.Qg = c.Gam.cwiseProduct(c.Q);
  c.Kd = c.Ki * c.gamL.asDiagonal();
  Mat<S> A = (c.beta.asDiagonal() * (c.Kg * c.Ki.transpose())).template triangularView<Eigen::StrictlyLower>();
  const Mat<S> IA = Mat<S>::Identity(L, L) + A;
  c.N = IA.template triangularView<Eigen::UnitLower>().solve(Mat<S>::Identity(L, L));
  c.W = c.N * (c.beta.asDiagonal() * c.Kg);
  c.U = c.N * (c.beta.asDiagonal() * c.V);
  c.P = (c.Qg * c.Ki.transpose()).template triangularView<Eigen::Lower>();
  return c;
}
}  // namespace detail

/// Reverse-mode derivative of the chunked KDA forward (chunk size C >= 1) on one head; same
/// arguments and result as kda_recurrent_head_backward. Memory: the forward keeps only the state
/// entering each chunk (ceil(T / C) states of d_k x d_v); the backward recomputes one chunk's
/// quantities (O(C^2 + C d) numbers) from its entering state, so it needs O(T / C d_k d_v), not
/// O(T d_k d_v). states_held (optional, out): the number of d_k x d_v states held, ceil(T / C).
/// Errors: kdalab::Error when C = 0 or a chunk's decay span is out of range (file comment).
template <class S>
KdaHeadGrad<S> kda_chunked_head_backward(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Mat<S>& g,
                                         const Vec<S>& beta, const Mat<S>& S0, const S& scale, const Mat<S>& dO,
                                         const Mat<S>& dS_T, Eigen::Index C, std::size_t* states_held = nullptr) {
  require(C >= 1, "kda_chunked_backward: chunk = 0; accepted: >= 1");
  const Eigen::Index T = q.rows(), dk = q.cols(), dv = v.cols();
  // Forward over the chunks: the state entering each chunk.
  std::vector<Mat<S>> enter;
  Mat<S> St = S0;
  for (Eigen::Index t0 = 0; t0 < T; t0 += C) {
    const Eigen::Index L = std::min(C, T - t0);
    enter.push_back(St);
    const detail::KdaChunkFwd<S> c = detail::kda_chunk_quantities<S>(q, k, v, g, beta, t0, L);
    const Mat<S> Vt = c.U - c.W * St;
    St = (c.gamL.asDiagonal() * St + c.Kd.transpose() * Vt).eval();
  }
  if (states_held) *states_held = enter.size();
  KdaHeadGrad<S> r{Mat<S>(T, dk), Mat<S>(T, dk), Mat<S>(T, dv), Mat<S>(T, dk), Vec<S>(T), dS_T};
  Mat<S>& dS = r.dS0;  // dL/d(state leaving the chunk), ends as dL/dS_0
  for (Eigen::Index n = static_cast<Eigen::Index>(enter.size()) - 1; n >= 0; --n) {
    const Eigen::Index t0 = n * C, L = std::min(C, T - t0);
    const Mat<S>& Sin = enter[static_cast<std::size_t>(n)];
    const detail::KdaChunkFwd<S> c = detail::kda_chunk_quantities<S>(q, k, v, g, beta, t0, L);
    const Mat<S> Vt = c.U - c.W * Sin;
    const Mat<S> dOc = dO.middleRows(t0, L);
    const Mat<S> dVt = scale * (c.P.transpose() * dOc) + c.Kd * dS;
    const Mat<S> dP = (scale * (dOc * Vt.transpose())).template triangularView<Eigen::Lower>();
    const Mat<S> dKd = Vt * dS.transpose();
    const Mat<S> dQg = scale * (dOc * Sin.transpose()) + dP * c.Ki;
    Mat<S> dKi = dP.transpose() * c.Qg + dKd * c.gamL.asDiagonal();
    Vec<S> dgamL = dS.cwiseProduct(Sin).rowwise().sum() + c.Ki.cwiseProduct(dKd).colwise().sum().transpose();
    const Mat<S> dSin = scale * (c.Qg.transpose() * dOc) + c.gamL.asDiagonal() * dS - c.W.transpose() * dVt;
    const Mat<S> dW = -dVt * Sin.transpose(), &dU = dVt;
    const Mat<S> X = c.beta.asDiagonal() * c.Kg, Y = c.beta.asDiagonal() * c.V;
    const Mat<S> dX = c.N.transpose() * dW, dY = c.N.transpose() * dU;
    const Mat<S> dA = (-(c.N.transpose() * (dW * X.transpose() + dU * Y.transpose()) * c.N.transpose()))
                          .template triangularView<Eigen::StrictlyLower>();
    const Mat<S> B = c.Kg * c.Ki.transpose();
    const Mat<S> dB = c.beta.asDiagonal() * dA;
    const Mat<S> dKg = dB * c.Ki + c.beta.asDiagonal() * dX;
    dKi += dB.transpose() * c.Kg;
    const Vec<S> dbeta = dA.cwiseProduct(B).rowwise().sum() + dX.cwiseProduct(c.Kg).rowwise().sum() +
                         dY.cwiseProduct(c.V).rowwise().sum();
    const Mat<S> dV = c.beta.asDiagonal() * dY;
    const Mat<S> dK = c.Gam.cwiseProduct(dKg) + dKi.cwiseQuotient(c.Gam);
    const Mat<S> dQ = c.Gam.cwiseProduct(dQg);
    Mat<S> dGam = c.K.cwiseProduct(dKg) - c.Ki.cwiseProduct(dKi).cwiseQuotient(c.Gam) + c.Q.cwiseProduct(dQg);
    dGam.row(L - 1) += dgamL.transpose();
    const Mat<S> dG = c.Gam.cwiseProduct(dGam);
    Vec<S> acc = Vec<S>::Zero(dk);
    for (Eigen::Index rr = L - 1; rr >= 0; --rr) {
      acc += dG.row(rr).transpose();
      r.dg.row(t0 + rr) = acc.transpose();
    }
    r.dq.middleRows(t0, L) = dQ;
    r.dk.middleRows(t0, L) = dK;
    r.dv.middleRows(t0, L) = dV;
    r.dbeta.segment(t0, L) = dbeta;
    dS = dSin;
  }
  return r;
}

/// Reverse-mode derivative of kda_chunked (KdaVariant::kda) with chunk size `chunk`: same arguments,
/// layouts and result as kda_recurrent_backward (reference/kda_backward.hpp).
/// Errors: kdalab::Error as kda_recurrent_backward, or from kda_chunked_head_backward.
template <class S>
KdaGrad<S> kda_chunked_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                                const Tensor<S>& beta, const Tensor<S>* S0, const S& scale, const Tensor<S>& dO,
                                const Tensor<S>* dS_T, std::size_t chunk) {
  return kda_backward_per_head<S>(q, k, v, g, beta, S0, dO, dS_T,
                                  [&](const Mat<S>& qh, const Mat<S>& kh, const Mat<S>& vh, const Mat<S>& gh,
                                      const Vec<S>& bh, const Mat<S>& S0h, const Mat<S>& dOh, const Mat<S>& dST) {
                                    return kda_chunked_head_backward<S>(qh, kh, vh, gh, bh, S0h, scale, dOh, dST,
                                                                        static_cast<Eigen::Index>(chunk));
                                  });
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_KDA_CHUNK_BACKWARD(X, S) \
  X template detail::KdaChunkFwd<S> detail::kda_chunk_quantities<S>(const Mat<S>&, const Mat<S>&, const Mat<S>&, \
      const Mat<S>&, const Vec<S>&, Eigen::Index, Eigen::Index); \
  X template KdaHeadGrad<S> kda_chunked_head_backward<S>(const Mat<S>&, const Mat<S>&, const Mat<S>&, const Mat<S>&, \
      const Vec<S>&, const Mat<S>&, const S&, const Mat<S>&, const Mat<S>&, Eigen::Index, std::size_t*); \
  X template KdaGrad<S> kda_chunked_backward<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>&, const Tensor<S>*, const S&, const Tensor<S>&, const Tensor<S>*, \
      std::size_t);
KDALAB_TEMPLATES_KDA_CHUNK_BACKWARD(extern, double)
KDALAB_TEMPLATES_KDA_CHUNK_BACKWARD(extern, mp50)

}  // namespace kdalab
