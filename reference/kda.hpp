#pragma once
/// Kimi Delta Attention: the recurrence (K3 report Eq. 1; Kimi Linear Eq. 1; seed 000).
///
/// Per head, with q_t, k_t in R^{d_k}, v_t in R^{d_v}, state S_t in R^{d_k x d_v} ("KV" layout,
/// K3 report Eq. 1 orientation), alpha_t = exp(g_t) in (0, 1]^{d_k}, beta_t in [0, 1]:
///     S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T
///     o_t = scale * S_t^T q_t                       (scale explicit; fla/FlashKDA use d_k^-1/2)
/// computed as S' = Diag(alpha_t) S_{t-1};  S_t = S' + beta_t k_t (v_t - S'^T k_t)^T.
///
/// Special cases (EQUATIONS.md section 1), selected by KdaVariant:
///   kda            per-channel alpha = exp(g_t)                        (the default)
///   gated_deltanet scalar alpha per head = exp(g_t[0]); other channels of g are ignored
///   deltanet       alpha = 1 (g ignored)
///   gla            S_t = Diag(alpha_t) S_{t-1} + k_t v_t^T            (no erase, beta ignored)
///   linear         S_t = S_{t-1} + k_t v_t^T                          (no erase, beta, decay)
///
/// Batched layout (DESIGN.md): q, k [B, T, H, d_k]; v [B, T, HV, d_v]; g [B, T, HV, d_k] (log-decay,
/// g <= 0); beta [B, T, HV]; S0 and the final state [B, HV, d_k, d_v]; o [B, T, HV, d_v]. Grouped
/// value heads: HV is a multiple of H, value head j reads key head j / (HV / H).
/// The seed-002 form (S of shape d_v x d_k, S_t = S_{t-1} Diag(alpha)(I - beta k k^T) + beta v k^T,
/// o = S q) is the stated transpose of this one: S_seed = S^T (see to_seed_layout()).
#include <string>

#include "reference/error.hpp"
#include "reference/scalar.hpp"
#include "reference/tensor.hpp"

namespace kdalab {

enum class KdaVariant { kda, gated_deltanet, deltanet, gla, linear };

inline std::string variant_name(KdaVariant v) {
  switch (v) {
    case KdaVariant::kda: return "kda";
    case KdaVariant::gated_deltanet: return "gated_deltanet";
    case KdaVariant::deltanet: return "deltanet";
    case KdaVariant::gla: return "gla";
    case KdaVariant::linear: return "linear";
  }
  return "?";
}
/// Parses a variant name; throws kdalab::Error naming `what` and the accepted names.
inline KdaVariant parse_variant(const std::string& s, const std::string& what = "variant") {
  for (auto v : {KdaVariant::kda, KdaVariant::gated_deltanet, KdaVariant::deltanet, KdaVariant::gla, KdaVariant::linear})
    if (variant_name(v) == s) return v;
  throw Error(what + " = '" + s + "' is unknown; accepted: kda, gated_deltanet, deltanet, gla, linear");
}

/// One recurrence step on one head, in place: S (d_k x d_v) <- S_t, returns o_t (d_v).
/// q, k, g: d_k; v: d_v; beta scalar. This is also the one-token decode step.
/// Units: g is a natural-log decay (alpha = e^g). No input checks (callers validate).
template <class S>
Vec<S> kda_step(Mat<S>& St, const Vec<S>& q, const Vec<S>& k, const Vec<S>& v, const Vec<S>& g, const S& beta,
                const S& scale, KdaVariant var = KdaVariant::kda) {
  switch (var) {
    case KdaVariant::kda:
    case KdaVariant::gla:
      for (Eigen::Index i = 0; i < St.rows(); ++i) St.row(i) *= sexp<S>(g(i));
      break;
    case KdaVariant::gated_deltanet:
      St *= sexp<S>(g(0));
      break;
    case KdaVariant::deltanet:
    case KdaVariant::linear:
      break;
  }
  if (var == KdaVariant::gla || var == KdaVariant::linear) {
    St.noalias() += k * v.transpose();
  } else {
    const Vec<S> u = St.transpose() * k;  // what the decayed state returns for k
    const Vec<S> delta = v - u;
    St.noalias() += (beta * k) * delta.transpose();
  }
  return Vec<S>(scale * (St.transpose() * q));
}

/// The single-head recurrence over T tokens. q, k, g: T x d_k; v: T x d_v; beta: T; S0: d_k x d_v
/// (pass a zero matrix for no initial state). Returns o (T x d_v); S0 is replaced by S_T.
template <class S>
Mat<S> kda_recurrent_head(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Mat<S>& g, const Vec<S>& beta,
                          Mat<S>& state, const S& scale, KdaVariant var = KdaVariant::kda) {
  const Eigen::Index T = q.rows();
  Mat<S> o(T, v.cols());
  for (Eigen::Index t = 0; t < T; ++t) {
    o.row(t) = kda_step<S>(state, q.row(t).transpose(), k.row(t).transpose(), v.row(t).transpose(),
                           g.row(t).transpose(), beta(t), scale, var)
                   .transpose();
  }
  return o;
}

/// Validated problem shapes of a batched KDA call.
struct KdaShape {
  std::size_t B, T, H, HV, d_k, d_v;
};

/// Checks shapes, finiteness and g <= 0 of a batched KDA call; returns the shape.
/// Throws kdalab::Error naming the tensor, index and value, and what is accepted.
template <class S>
KdaShape kda_validate(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                      const Tensor<S>& beta, const Tensor<S>* S0) {
  require(q.rank() == 4, "tensor 'q' must be [B, T, H, d_k], got shape " + shape_str(q.shape));
  require(v.rank() == 4, "tensor 'v' must be [B, T, HV, d_v], got shape " + shape_str(v.shape));
  KdaShape s{q.dim(0), q.dim(1), q.dim(2), v.dim(2), q.dim(3), v.dim(3)};
  require(s.B >= 1 && s.T >= 1 && s.H >= 1 && s.d_k >= 1 && s.d_v >= 1 && s.HV >= 1,
          "tensors 'q'/'v' have an empty dimension: q " + shape_str(q.shape) + ", v " + shape_str(v.shape));
  require(s.HV % s.H == 0, "tensor 'v' has HV = " + std::to_string(s.HV) + " value heads, not a multiple of H = " +
                               std::to_string(s.H) + " key heads");
  require_shape(k, q.shape, "k");
  require_shape(v, {s.B, s.T, s.HV, s.d_v}, "v");
  require_shape(g, {s.B, s.T, s.HV, s.d_k}, "g");
  require_shape(beta, {s.B, s.T, s.HV}, "beta");
  if (S0) require_shape(*S0, {s.B, s.HV, s.d_k, s.d_v}, "S0");
  require_finite(q, "q");
  require_finite(k, "k");
  require_finite(v, "v");
  require_finite(g, "g");
  require_finite(beta, "beta");
  if (S0) require_finite(*S0, "S0");
  for (std::size_t i = 0; i < g.numel(); ++i)
    if (g.data[i] > S(0))
      throw Error("tensor 'g' (log-decay) has g = " + std::to_string(static_cast<double>(g.data[i])) +
                  " > 0 at flat index " + std::to_string(i) + "; accepted: g <= 0 (alpha = e^g in (0, 1])");
  return s;
}

/// Result of a batched call: o [B, T, HV, d_v] and the final state S [B, HV, d_k, d_v].
template <class S>
struct KdaOutput {
  Tensor<S> o, S_final;
};

/// Batched multi-head recurrence (see file comment for layouts). S0 may be null (zero state).
/// Errors: kdalab::Error from kda_validate().
template <class S>
KdaOutput<S> kda_recurrent(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                           const Tensor<S>& beta, const Tensor<S>* S0, const S& scale,
                           KdaVariant var = KdaVariant::kda) {
  const KdaShape s = kda_validate(q, k, v, g, beta, S0);
  KdaOutput<S> out{Tensor<S>({s.B, s.T, s.HV, s.d_v}), Tensor<S>({s.B, s.HV, s.d_k, s.d_v})};
  const std::size_t group = s.HV / s.H;
  for (std::size_t b = 0; b < s.B; ++b)
    for (std::size_t hv = 0; hv < s.HV; ++hv) {
      const std::size_t h = hv / group;
      Mat<S> St = Mat<S>::Zero(s.d_k, s.d_v);
      if (S0)
        for (std::size_t i = 0; i < s.d_k; ++i)
          for (std::size_t j = 0; j < s.d_v; ++j) St(i, j) = (*S0)(b, hv, i, j);
      Vec<S> qt(s.d_k), kt(s.d_k), vt(s.d_v), gt(s.d_k);
      for (std::size_t t = 0; t < s.T; ++t) {
        for (std::size_t i = 0; i < s.d_k; ++i) {
          qt(i) = q(b, t, h, i);
          kt(i) = k(b, t, h, i);
          gt(i) = g(b, t, hv, i);
        }
        for (std::size_t j = 0; j < s.d_v; ++j) vt(j) = v(b, t, hv, j);
        const Vec<S> ot = kda_step<S>(St, qt, kt, vt, gt, beta(b, t, hv), scale, var);
        for (std::size_t j = 0; j < s.d_v; ++j) out.o(b, t, hv, j) = ot(j);
      }
      for (std::size_t i = 0; i < s.d_k; ++i)
        for (std::size_t j = 0; j < s.d_v; ++j) out.S_final(b, hv, i, j) = St(i, j);
    }
  return out;
}

/// The seed-002 orientation of a state: S_seed = S^T (d_v x d_k). A stated transpose, never a
/// second convention (DESIGN.md).
template <class S>
Mat<S> to_seed_layout(const Mat<S>& S_kv) { return S_kv.transpose(); }

}  // namespace kdalab
