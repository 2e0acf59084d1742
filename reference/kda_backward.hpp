#pragma once
/// Exact reverse-mode derivative (vector-Jacobian product) of the KDA recurrence of
/// reference/kda.hpp (K3 report Eq. 1; Kimi Linear report Eq. 1), per head:
///     S'  = Diag(alpha_t) S_{t-1},  alpha_t = e^{g_t}
///     u_t = S'^T k_t,  S_t = S' + beta_t k_t (v_t - u_t)^T = (I - beta_t k_t k_t^T) S' + beta_t k_t v_t^T
///     o_t = scale S_t^T q_t
/// Given the upstream gradients dO_t = dL/do_t (d_v) and dS_T = dL/dS_T (d_k x d_v), the reverse
/// sweep t = T..1 carries dS = dL/dS_t and, per token, with G = dS + scale q_t dO_t^T
/// (the total derivative with respect to S_t), delta_t = v_t - u_t:
///     dq_t    = scale S_t dO_t
///     dv_t    = beta_t G^T k_t
///     dbeta_t = k_t^T G delta_t
///     dk_t    = beta_t (G delta_t - S' G^T k_t)
///     dS'     = G - beta_t k_t (G^T k_t)^T          ((I - beta k k^T) is symmetric)
///     dg_t,i  = alpha_t,i sum_j dS'_ij (S_{t-1})_ij  (chain rule through alpha = e^g)
///     dS_{t-1} = Diag(alpha_t) dS'
/// The special cases of KdaVariant: gated_deltanet (one alpha = e^{g_t,0} per head: dg_t,0 is the
/// sum over the whole state, the other channels get 0), deltanet (alpha = 1, dg = 0), gla and
/// linear (no erase: S_t = S' + k_t v_t^T, so dv_t = G^T k_t, dk_t = G v_t, dS' = G, dbeta = 0).
///
/// Memory: the reverse sweep needs S_{t-1} for every t. kda_recurrent_head_backward stores the
/// state every `checkpoint` tokens on a forward pass, then per segment (last first) recomputes the
/// segment's states from its checkpoint with kda_step and runs the reverse steps over it: memory
/// (T / C + C) d_k d_v for checkpoint C, one extra forward pass in time. checkpoint = 0 keeps all T
/// states (C = T). The recomputed states are bit-identical to the forward pass's, so every C
/// gives bit-identical gradients.
///
/// kda_recurrent_varlen_backward runs it per sequence of a packed variable-length batch.
///
/// Layouts as kda_recurrent: q, k, dq, dk [B, T, H, d_k]; v, dv, dO [B, T, HV, d_v]; g, dg
/// [B, T, HV, d_k]; beta, dbeta [B, T, HV]; S0, dS0, dS_T [B, HV, d_k, d_v]. Grouped value heads
/// (HV = m H): dq and dk of key head h sum the contributions of its m value heads.
#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "reference/error.hpp"
#include "reference/kda.hpp"
#include "reference/scalar.hpp"
#include "reference/tensor.hpp"

namespace kdalab {

/// Per-token gradients of one reverse step (see file comment).
template <class S>
struct KdaStepGrad {
  Vec<S> dq, dk, dv, dg;
  S dbeta = S(0);
};

/// One reverse step of kda_step on one head. S_prev: S_{t-1} (d_k x d_v). dS: in, dL/dS_t from the
/// later tokens (and dS_T); out, dL/dS_{t-1}. dO: dL/do_t (d_v). q, k, g: d_k; v: d_v.
/// Returns dq_t, dk_t, dv_t, dg_t, dbeta_t. No input checks (callers validate).
template <class S>
KdaStepGrad<S> kda_step_backward(const Mat<S>& S_prev, Mat<S>& dS, const Vec<S>& q, const Vec<S>& k,
                                 const Vec<S>& v, const Vec<S>& g, const S& beta, const S& scale, const Vec<S>& dO,
                                 KdaVariant var = KdaVariant::kda) {
  const Eigen::Index dk = k.size();
  Vec<S> alpha = Vec<S>::Ones(dk);
  if (var == KdaVariant::kda || var == KdaVariant::gla)
    for (Eigen::Index i = 0; i < dk; ++i) alpha(i) = sexp<S>(g(i));
  else if (var == KdaVariant::gated_deltanet)
    alpha.setConstant(sexp<S>(g(0)));
  const bool erase = var != KdaVariant::gla && var != KdaVariant::linear;

  Mat<S> St = S_prev;  // S_t exactly as the forward pass computes it
  kda_step<S>(St, q, k, v, g, beta, scale, var);
  const Mat<S> Sd = alpha.asDiagonal() * S_prev;  // S'

  KdaStepGrad<S> r;
  r.dq = scale * (St * dO);
  const Mat<S> G = dS + (scale * q) * dO.transpose();  // dL/dS_t, total
  const Vec<S> Gk = G.transpose() * k;                 // G^T k_t
  Mat<S> dSd;
  if (erase) {
    const Vec<S> delta = v - Sd.transpose() * k;  // v_t - u_t
    const Vec<S> Gdelta = G * delta;
    r.dv = beta * Gk;
    r.dbeta = k.dot(Gdelta);
    r.dk = beta * (Gdelta - Sd * Gk);
    dSd = G - (beta * k) * Gk.transpose();
  } else {
    r.dv = Gk;
    r.dk = G * v;
    dSd = G;
  }
  r.dg = Vec<S>::Zero(dk);
  if (var == KdaVariant::kda || var == KdaVariant::gla) {
    for (Eigen::Index i = 0; i < dk; ++i) r.dg(i) = alpha(i) * dSd.row(i).dot(S_prev.row(i));
  } else if (var == KdaVariant::gated_deltanet) {
    r.dg(0) = alpha(0) * dSd.cwiseProduct(S_prev).sum();
  }
  dS = alpha.asDiagonal() * dSd;
  return r;
}

/// Gradients of one head: dq, dk, dg [T, d_k]; dv [T, d_v]; dbeta [T]; dS0 [d_k, d_v].
template <class S>
struct KdaHeadGrad {
  Mat<S> dq, dk, dv, dg;
  Vec<S> dbeta;
  Mat<S> dS0;
};

/// Reverse-mode derivative of kda_recurrent_head over T tokens. q, k, g: T x d_k; v: T x d_v;
/// beta: T; S0: d_k x d_v; dO: T x d_v (dL/do); dS_T: d_k x d_v (dL/dS_T, zero when the final state
/// is not used). checkpoint: states kept every `checkpoint` tokens (0 = all T; see file comment).
/// states_held (optional, out): the largest number of d_k x d_v states held at once (checkpoints
/// plus one recomputed segment), ceil(T / C) + min(C, T) for interval C: the memory the sweep needs.
/// No input checks (kda_recurrent_backward validates).
template <class S>
KdaHeadGrad<S> kda_recurrent_head_backward(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Mat<S>& g,
                                           const Vec<S>& beta, const Mat<S>& S0, const S& scale, const Mat<S>& dO,
                                           const Mat<S>& dS_T, KdaVariant var = KdaVariant::kda,
                                           Eigen::Index checkpoint = 0, std::size_t* states_held = nullptr) {
  const Eigen::Index T = q.rows(), dk = q.cols(), dv = v.cols();
  const Eigen::Index C = checkpoint > 0 ? std::min(checkpoint, T) : T;
  const auto step = [&](Mat<S>& St, Eigen::Index t) {
    kda_step<S>(St, q.row(t).transpose(), k.row(t).transpose(), v.row(t).transpose(), g.row(t).transpose(), beta(t),
                scale, var);
  };
  // Forward pass: the state entering tokens 0, C, 2C, ...
  std::vector<Mat<S>> ckpt;
  Mat<S> St = S0;
  for (Eigen::Index t = 0; t < T; ++t) {
    if (t % C == 0) ckpt.push_back(St);
    step(St, t);
  }
  KdaHeadGrad<S> r{Mat<S>(T, dk), Mat<S>(T, dk), Mat<S>(T, dv), Mat<S>(T, dk), Vec<S>(T), dS_T};
  Mat<S>& dS = r.dS0;  // carried dL/dS_t, ends as dL/dS_0
  std::vector<Mat<S>> seg;
  if (states_held) *states_held = 0;
  for (Eigen::Index n = static_cast<Eigen::Index>(ckpt.size()) - 1; n >= 0; --n) {
    const Eigen::Index t0 = n * C, t1 = std::min(T, t0 + C);
    seg.assign(1, ckpt[static_cast<std::size_t>(n)]);  // seg[r] = S_{t0 + r - 1}, the state before token t0 + r
    for (Eigen::Index t = t0; t + 1 < t1; ++t) {
      seg.push_back(seg.back());
      step(seg.back(), t);
    }
    if (states_held) *states_held = std::max(*states_held, ckpt.size() + seg.size());
    for (Eigen::Index t = t1 - 1; t >= t0; --t) {
      const KdaStepGrad<S> s = kda_step_backward<S>(seg[static_cast<std::size_t>(t - t0)], dS, q.row(t).transpose(),
                                                    k.row(t).transpose(), v.row(t).transpose(), g.row(t).transpose(),
                                                    beta(t), scale, dO.row(t).transpose(), var);
      r.dq.row(t) = s.dq.transpose();
      r.dk.row(t) = s.dk.transpose();
      r.dv.row(t) = s.dv.transpose();
      r.dg.row(t) = s.dg.transpose();
      r.dbeta(t) = s.dbeta;
    }
  }
  return r;
}

/// The checkpoint interval that minimises the states held, ceil(T / C) + C: C = ceil(sqrt(T))
/// (2 sqrt(T) states instead of T; at T = 65,536 and d_k = d_v = 128, 512 states = 32 MiB in float64
/// instead of 8 GiB). T = 0 gives 1.
inline std::size_t kda_sqrt_checkpoint(std::size_t T) {
  std::size_t c = 1;
  while (c * c < T) ++c;
  return c;
}

/// Gradients of a batched KDA call, shaped as its inputs (see file comment).
template <class S>
struct KdaGrad {
  Tensor<S> dq, dk, dv, dg, dbeta, dS0;
};

/// Runs a per-head backward `head_backward(q, k, v, g, beta, S0, dO, dS_T) -> KdaHeadGrad` (one head's
/// token-major matrices, as kda_recurrent_head_backward takes them) over every (batch, value head)
/// of a batched call, and gathers the gradients (dq, dk summed over a key head's value heads).
/// Errors: kdalab::Error from kda_validate(), or naming 'dO' / 'dS_T' on a shape mismatch or a
/// non-finite value.
template <class S, class HeadBackward>
KdaGrad<S> kda_backward_per_head(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                                 const Tensor<S>& beta, const Tensor<S>* S0, const Tensor<S>& dO, const Tensor<S>* dS_T,
                                 HeadBackward&& head_backward) {
  const KdaShape s = kda_validate(q, k, v, g, beta, S0);
  require_shape(dO, {s.B, s.T, s.HV, s.d_v}, "dO");
  require_finite(dO, "dO");
  if (dS_T) {
    require_shape(*dS_T, {s.B, s.HV, s.d_k, s.d_v}, "dS_T");
    require_finite(*dS_T, "dS_T");
  }
  const auto T = static_cast<Eigen::Index>(s.T), dk = static_cast<Eigen::Index>(s.d_k),
             dv = static_cast<Eigen::Index>(s.d_v);
  KdaGrad<S> r{Tensor<S>(q.shape), Tensor<S>(k.shape), Tensor<S>(v.shape), Tensor<S>(g.shape), Tensor<S>(beta.shape),
               Tensor<S>({s.B, s.HV, s.d_k, s.d_v})};
  const std::size_t group = s.HV / s.H;
  for (std::size_t b = 0; b < s.B; ++b)
    for (std::size_t hv = 0; hv < s.HV; ++hv) {
      const std::size_t h = hv / group;
      Mat<S> qh(T, dk), kh(T, dk), vh(T, dv), gh(T, dk), dOh(T, dv), S0h = Mat<S>::Zero(dk, dv),
          dST = Mat<S>::Zero(dk, dv);
      Vec<S> bh(T);
      for (std::size_t t = 0; t < s.T; ++t) {
        const auto tt = static_cast<Eigen::Index>(t);
        for (std::size_t i = 0; i < s.d_k; ++i) {
          const auto ii = static_cast<Eigen::Index>(i);
          qh(tt, ii) = q(b, t, h, i);
          kh(tt, ii) = k(b, t, h, i);
          gh(tt, ii) = g(b, t, hv, i);
        }
        for (std::size_t j = 0; j < s.d_v; ++j) {
          vh(tt, static_cast<Eigen::Index>(j)) = v(b, t, hv, j);
          dOh(tt, static_cast<Eigen::Index>(j)) = dO(b, t, hv, j);
        }
        bh(tt) = beta(b, t, hv);
      }
      for (std::size_t i = 0; i < s.d_k; ++i)
        for (std::size_t j = 0; j < s.d_v; ++j) {
          if (S0) S0h(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = (*S0)(b, hv, i, j);
          if (dS_T) dST(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = (*dS_T)(b, hv, i, j);
        }
      const KdaHeadGrad<S> gr = head_backward(qh, kh, vh, gh, bh, S0h, dOh, dST);
      for (std::size_t t = 0; t < s.T; ++t) {
        const auto tt = static_cast<Eigen::Index>(t);
        for (std::size_t i = 0; i < s.d_k; ++i) {
          const auto ii = static_cast<Eigen::Index>(i);
          r.dq(b, t, h, i) += gr.dq(tt, ii);
          r.dk(b, t, h, i) += gr.dk(tt, ii);
          r.dg(b, t, hv, i) = gr.dg(tt, ii);
        }
        for (std::size_t j = 0; j < s.d_v; ++j) r.dv(b, t, hv, j) = gr.dv(tt, static_cast<Eigen::Index>(j));
        r.dbeta(b, t, hv) = gr.dbeta(tt);
      }
      for (std::size_t i = 0; i < s.d_k; ++i)
        for (std::size_t j = 0; j < s.d_v; ++j)
          r.dS0(b, hv, i, j) = gr.dS0(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j));
    }
  return r;
}

/// Reverse-mode derivative of kda_recurrent: given dO = dL/do [B, T, HV, d_v] and dS_T = dL/dS_final
/// [B, HV, d_k, d_v] (null: the final state is not used), returns dL/d(q, k, v, g, beta, S0).
/// S0 null means the zero initial state (dS0 is still returned). checkpoint as in
/// kda_recurrent_head_backward. Errors: as kda_backward_per_head.
template <class S>
KdaGrad<S> kda_recurrent_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                                  const Tensor<S>& beta, const Tensor<S>* S0, const S& scale, const Tensor<S>& dO,
                                  const Tensor<S>* dS_T, KdaVariant var = KdaVariant::kda,
                                  std::size_t checkpoint = 0) {
  return kda_backward_per_head<S>(q, k, v, g, beta, S0, dO, dS_T,
                                  [&](const Mat<S>& qh, const Mat<S>& kh, const Mat<S>& vh, const Mat<S>& gh,
                                      const Vec<S>& bh, const Mat<S>& S0h, const Mat<S>& dOh, const Mat<S>& dST) {
                                    return kda_recurrent_head_backward<S>(qh, kh, vh, gh, bh, S0h, scale, dOh, dST, var,
                                                                          static_cast<Eigen::Index>(checkpoint));
                                  });
}

/// Reverse-mode derivative of kda_recurrent_varlen: B = 1, sequences packed along T by cu_seqlens
/// (validate_cu_seqlens), each with its own state. S0 [N, HV, d_k, d_v] or null (zero states);
/// dO [1, T, HV, d_v]; dS_T [N, HV, d_k, d_v] or null (final states unused). Returns gradients shaped
/// as the inputs, dS0 [N, HV, d_k, d_v]; an empty sequence passes its state through, so its dS0 is
/// its dS_T. Errors: kdalab::Error as kda_recurrent_varlen, or naming 'dO' / 'dS_T'.
template <class S>
KdaGrad<S> kda_recurrent_varlen_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                                         const Tensor<S>& beta, const Tensor<S>* S0,
                                         const std::vector<std::size_t>& cu_seqlens, const S& scale,
                                         const Tensor<S>& dO, const Tensor<S>* dS_T, KdaVariant var = KdaVariant::kda,
                                         std::size_t checkpoint = 0) {
  const KdaShape s = kda_validate(q, k, v, g, beta, static_cast<const Tensor<S>*>(nullptr));
  require(s.B == 1, "tensor 'q' has B = " + std::to_string(s.B) + "; a variable-length batch packs its sequences "
                        "along T with B = 1");
  validate_cu_seqlens(cu_seqlens, s.T);
  const std::size_t N = cu_seqlens.size() - 1, st = s.HV * s.d_k * s.d_v;
  if (S0) require_shape(*S0, {N, s.HV, s.d_k, s.d_v}, "S0");
  if (S0) require_finite(*S0, "S0");
  require_shape(dO, {1, s.T, s.HV, s.d_v}, "dO");
  if (dS_T) require_shape(*dS_T, {N, s.HV, s.d_k, s.d_v}, "dS_T");
  KdaGrad<S> r{Tensor<S>(q.shape), Tensor<S>(k.shape), Tensor<S>(v.shape), Tensor<S>(g.shape), Tensor<S>(beta.shape),
               Tensor<S>({N, s.HV, s.d_k, s.d_v})};
  const auto state_of = [&](const Tensor<S>* src, std::size_t n) {
    Tensor<S> x({1, s.HV, s.d_k, s.d_v});
    if (src) std::copy(src->data.begin() + static_cast<std::ptrdiff_t>(n * st),
                       src->data.begin() + static_cast<std::ptrdiff_t>((n + 1) * st), x.data.begin());
    return x;
  };
  const auto put_tokens = [](const Tensor<S>& part, Tensor<S>& whole, std::size_t t0) {
    const std::size_t row = whole.numel() / whole.dim(1);  // B = 1
    std::copy(part.data.begin(), part.data.end(), whole.data.begin() + static_cast<std::ptrdiff_t>(t0 * row));
  };
  for (std::size_t n = 0; n < N; ++n) {
    const std::size_t t0 = cu_seqlens[n], t1 = cu_seqlens[n + 1];
    const Tensor<S> s0 = state_of(S0, n), dST = state_of(dS_T, n);
    Tensor<S> dS0n = dST;  // an empty sequence: S_final = S0
    if (t1 > t0) {
      KdaGrad<S> gr = kda_recurrent_backward<S>(slice_tokens(q, t0, t1), slice_tokens(k, t0, t1), slice_tokens(v, t0, t1),
                                                slice_tokens(g, t0, t1), slice_tokens(beta, t0, t1), &s0, scale,
                                                slice_tokens(dO, t0, t1), &dST, var, checkpoint);
      put_tokens(gr.dq, r.dq, t0);
      put_tokens(gr.dk, r.dk, t0);
      put_tokens(gr.dv, r.dv, t0);
      put_tokens(gr.dg, r.dg, t0);
      put_tokens(gr.dbeta, r.dbeta, t0);
      dS0n = std::move(gr.dS0);
    }
    std::copy(dS0n.data.begin(), dS0n.data.end(), r.dS0.data.begin() + static_cast<std::ptrdiff_t>(n * st));
  }
  return r;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_KDA_BACKWARD(X, S) \
  X template KdaStepGrad<S> kda_step_backward<S>(const Mat<S>&, Mat<S>&, const Vec<S>&, const Vec<S>&, const Vec<S>&, \
      const Vec<S>&, const S&, const S&, const Vec<S>&, KdaVariant); \
  X template KdaHeadGrad<S> kda_recurrent_head_backward<S>(const Mat<S>&, const Mat<S>&, const Mat<S>&, \
      const Mat<S>&, const Vec<S>&, const Mat<S>&, const S&, const Mat<S>&, const Mat<S>&, KdaVariant, Eigen::Index, \
      std::size_t*); \
  X template KdaGrad<S> kda_recurrent_backward<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>&, const Tensor<S>*, const S&, const Tensor<S>&, const Tensor<S>*, KdaVariant, \
      std::size_t);
#define KDALAB_TEMPLATES_KDA_BACKWARD_DM(X, S) \
  X template KdaGrad<S> kda_recurrent_varlen_backward<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>&, const Tensor<S>*, const std::vector<std::size_t>&, const S&, \
      const Tensor<S>&, const Tensor<S>*, KdaVariant, std::size_t);
KDALAB_TEMPLATES_KDA_BACKWARD(extern, double)
KDALAB_TEMPLATES_KDA_BACKWARD(extern, mp50)
KDALAB_TEMPLATES_KDA_BACKWARD(extern, float)
KDALAB_TEMPLATES_KDA_BACKWARD_DM(extern, double)
KDALAB_TEMPLATES_KDA_BACKWARD_DM(extern, mp50)

}  // namespace kdalab
