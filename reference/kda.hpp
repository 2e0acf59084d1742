#pragma once
/// Kimi Delta Attention: the recurrence (K3 report Eq. 1; Kimi Linear Eq. 1; docs/equations.md, KDA recurrence).
///
/// Per head, with q_t, k_t in R^{d_k}, v_t in R^{d_v}, state S_t in R^{d_k x d_v} ("KV" layout,
/// K3 report Eq. 1 orientation), alpha_t = exp(g_t) in (0, 1]^{d_k}, beta_t in [0, 1]:
///     S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T
///     o_t = scale * S_t^T q_t                       (scale explicit; fla/FlashKDA use d_k^-1/2)
/// computed as S' = Diag(alpha_t) S_{t-1};  S_t = S' + beta_t k_t (v_t - S'^T k_t)^T.
///
/// Special cases (docs/equations.md, KDA recurrence), selected by KdaVariant:
///   kda            per-channel alpha = exp(g_t)                        (the default)
///   gated_deltanet scalar alpha per head = exp(g_t[0]); other channels of g are ignored
///   deltanet       alpha = 1 (g ignored)
///   gla            S_t = Diag(alpha_t) S_{t-1} + k_t v_t^T            (no erase, beta ignored)
///   linear         S_t = S_{t-1} + k_t v_t^T                          (no erase, beta, decay)
///
/// Batched layout (docs/design.md, conventions): q, k [B, T, H, d_k]; v [B, T, HV, d_v]; g [B, T, HV, d_k] (log-decay,
/// g <= 0); beta [B, T, HV]; S0 and the final state [B, HV, d_k, d_v]; o [B, T, HV, d_v]. Grouped
/// value heads: HV is a multiple of H, value head j reads key head j / (HV / H).
/// The transposed form (S of shape d_v x d_k, S_t = S_{t-1} Diag(alpha)(I - beta k k^T) + beta v k^T,
/// o = S q) is the stated transpose of this one: S_seed = S^T (see to_seed_layout(), kda_step_seed();
/// docs/equations.md, KDA recurrence).
///
/// Contents: kda_step (the delta form, also the decode step), kda_step_product (Eq. 1 literally),
/// kda_step_gradient (one gradient step on 1/2 ||S^T k - v||^2), kda_step_seed (transposed
/// orientation), kda_recurrent_head / kda_recurrent (batched, initial state in, final state out),
/// kda_validate, kda_varlen / kda_recurrent_varlen (packed sequences by cu_seqlens, one state each),
/// softmax_decode_reads / kda_decode_reads (the analytic decode-cost table: docs/equations.md, decode cost).
/// The chunked form is in reference/kda_chunk.hpp, the gates in reference/gate.hpp, the full layer in
/// reference/kda_layer.hpp.
/// Range of g per gate (g in [g_min, 0] for the bounded gate): validate_gate() in reference/gate.hpp.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

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

/// One recurrence step on one head (K3 report Eq. 1, delta form), in place: S (d_k x d_v) <- S_t,
/// returns o_t (d_v).
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

/// The single-head recurrence over T tokens (K3 report Eq. 1). q, k, g: T x d_k; v: T x d_v; beta: T;
/// state: d_k x d_v, S_0 in (a zero matrix for no initial state), S_T out. Returns o (T x d_v).
/// No input checks (kda_recurrent validates).
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

/// Checks shapes, finiteness, g <= 0 and beta in [0, 1] of a batched KDA call; returns the shape.
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
  // beta is the erase strength of the delta rule, in [0, 1] (K3 report Eq. 1; docs/equations.md section 1)
  for (std::size_t i = 0; i < beta.numel(); ++i)
    if (beta.data[i] < S(0) || beta.data[i] > S(1))
      throw Error("tensor 'beta' has beta = " + num_str(static_cast<double>(beta.data[i])) + " at flat index " +
                  std::to_string(i) + "; accepted: beta in [0, 1] (logits go through a sigmoid first)");
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

/// Gradient-step form of one KDA step (docs/equations.md, KDA recurrence), per-channel decay:
/// with S' = Diag(alpha_t) S_{t-1} and the loss L_t(S) = 1/2 ||S^T k_t - v_t||^2, whose gradient is
/// grad = k_t (S^T k_t - v_t)^T, S_t = S' - beta_t grad(L_t)(S'). In place on St (d_k x d_v);
/// returns o_t = scale S_t^T q_t. Equal to kda_step(kda) up to rounding. No input checks.
template <class S>
Vec<S> kda_step_gradient(Mat<S>& St, const Vec<S>& q, const Vec<S>& k, const Vec<S>& v, const Vec<S>& g,
                         const S& beta, const S& scale) {
  Vec<S> alpha(g.size());
  for (Eigen::Index i = 0; i < g.size(); ++i) alpha(i) = sexp<S>(g(i));
  const Mat<S> Sd = alpha.asDiagonal() * St;
  const Vec<S> residual = Sd.transpose() * k - v;   // S'^T k - v
  const Mat<S> grad = k * residual.transpose();     // d L / d S at S'
  St = Sd - beta * grad;
  return Vec<S>(scale * (St.transpose() * q));
}

/// Product (transition-matrix) form of one KDA step, literally K3 report Eq. 1:
/// S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T, o_t = scale S_t^T q_t,
/// with the d_k x d_k transition formed explicitly. In place on St; no input checks.
template <class S>
Vec<S> kda_step_product(Mat<S>& St, const Vec<S>& q, const Vec<S>& k, const Vec<S>& v, const Vec<S>& g,
                        const S& beta, const S& scale) {
  const Eigen::Index dk = k.size();
  Vec<S> alpha(dk);
  for (Eigen::Index i = 0; i < dk; ++i) alpha(i) = sexp<S>(g(i));
  const Mat<S> erase = Mat<S>::Identity(dk, dk) - beta * (k * k.transpose());
  const Mat<S> transition = erase * alpha.asDiagonal();
  St = (transition * St + beta * (k * v.transpose())).eval();
  return Vec<S>(scale * (St.transpose() * q));
}

/// The transposed form of one step, on the transposed state S_seed = S^T (d_v x d_k):
/// S_seed,t = S_seed,t-1 Diag(alpha_t) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = scale S_seed,t q_t
/// (docs/equations.md, KDA recurrence). A stated transpose of kda_step: after any sequence of steps
/// S_seed == to_seed_layout(S) and the outputs agree. In place; no input checks.
template <class S>
Vec<S> kda_step_seed(Mat<S>& S_seed, const Vec<S>& q, const Vec<S>& k, const Vec<S>& v, const Vec<S>& g,
                     const S& beta, const S& scale) {
  const Eigen::Index dk = k.size();
  Vec<S> alpha(dk);
  for (Eigen::Index i = 0; i < dk; ++i) alpha(i) = sexp<S>(g(i));
  const Mat<S> erase = Mat<S>::Identity(dk, dk) - beta * (k * k.transpose());
  S_seed = (S_seed * alpha.asDiagonal() * erase + beta * (v * k.transpose())).eval();
  return Vec<S>(scale * (S_seed * q));
}

/// Numbers a softmax attention head reads per decode step after n cached tokens: 2 n d (keys and
/// values; docs/equations.md, decode cost).
inline std::uint64_t softmax_decode_reads(std::uint64_t n, std::uint64_t d) { return 2 * n * d; }
/// Numbers a KDA head reads per decode step: its d_k x d_v state, whatever the context
/// (docs/equations.md, decode cost).
inline std::uint64_t kda_decode_reads(std::uint64_t d_k, std::uint64_t d_v) { return d_k * d_v; }

/// Checks cumulative sequence lengths of a variable-length batch of `total` tokens:
/// cu_seqlens = [0, T_1, T_1 + T_2, ..., total], non-decreasing. Throws kdalab::Error naming
/// 'cu_seqlens', the index and value.
inline void validate_cu_seqlens(const std::vector<std::size_t>& cu, std::size_t total) {
  require(cu.size() >= 2, "tensor 'cu_seqlens' has " + std::to_string(cu.size()) +
                              " entries; accepted: [0, ..., total] with at least one sequence");
  require(cu.front() == 0, "tensor 'cu_seqlens' starts at " + std::to_string(cu.front()) + "; accepted: 0");
  for (std::size_t i = 1; i < cu.size(); ++i)
    require(cu[i] >= cu[i - 1], "tensor 'cu_seqlens' decreases at index " + std::to_string(i) + " (" +
                                    std::to_string(cu[i - 1]) + " -> " + std::to_string(cu[i]) +
                                    "); accepted: non-decreasing");
  require(cu.back() == total, "tensor 'cu_seqlens' ends at " + std::to_string(cu.back()) +
                                  ", expected the total token count " + std::to_string(total));
}

/// Tokens [t0, t1) of a [1, T, ...] tensor as a [1, t1 - t0, ...] tensor.
template <class S>
Tensor<S> slice_tokens(const Tensor<S>& x, std::size_t t0, std::size_t t1) {
  std::vector<std::size_t> shp = x.shape;
  shp[1] = t1 - t0;
  Tensor<S> y(shp);
  const std::size_t row = x.numel() / (x.shape[0] * x.shape[1]);
  std::copy(x.data.begin() + static_cast<std::ptrdiff_t>(t0 * row), x.data.begin() + static_cast<std::ptrdiff_t>(t1 * row),
            y.data.begin());
  return y;
}

/// Runs a batched KDA function `run(q, k, v, g, beta, S0*) -> KdaOutput` over each sequence of a
/// variable-length batch (B = 1, tokens packed along T, cu_seqlens as validate_cu_seqlens), each
/// with its own initial state S0[n] (S0: [N, HV, d_k, d_v] or null). Returns o [1, total, HV, d_v]
/// and S_final [N, HV, d_k, d_v]. Errors: kdalab::Error from kda_validate or naming 'cu_seqlens',
/// 'q' (B must be 1) or 'S0'.
template <class S, class Run>
KdaOutput<S> kda_varlen(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                        const Tensor<S>& beta, const Tensor<S>* S0, const std::vector<std::size_t>& cu_seqlens,
                        Run&& run) {
  const KdaShape s = kda_validate(q, k, v, g, beta, static_cast<const Tensor<S>*>(nullptr));
  require(s.B == 1, "tensor 'q' has B = " + std::to_string(s.B) + "; a variable-length batch packs its sequences "
                        "along T with B = 1");
  validate_cu_seqlens(cu_seqlens, s.T);
  const std::size_t N = cu_seqlens.size() - 1;
  if (S0) require_shape(*S0, {N, s.HV, s.d_k, s.d_v}, "S0");
  if (S0) require_finite(*S0, "S0");
  KdaOutput<S> out{Tensor<S>({1, s.T, s.HV, s.d_v}), Tensor<S>({N, s.HV, s.d_k, s.d_v})};
  const std::size_t st = s.HV * s.d_k * s.d_v;
  for (std::size_t n = 0; n < N; ++n) {
    const std::size_t t0 = cu_seqlens[n], t1 = cu_seqlens[n + 1];
    Tensor<S> s0({1, s.HV, s.d_k, s.d_v});
    if (S0) std::copy(S0->data.begin() + static_cast<std::ptrdiff_t>(n * st),
                      S0->data.begin() + static_cast<std::ptrdiff_t>((n + 1) * st), s0.data.begin());
    if (t1 == t0) {  // empty sequence: the state passes through
      std::copy(s0.data.begin(), s0.data.end(), out.S_final.data.begin() + static_cast<std::ptrdiff_t>(n * st));
      continue;
    }
    const KdaOutput<S> r = run(slice_tokens(q, t0, t1), slice_tokens(k, t0, t1), slice_tokens(v, t0, t1),
                               slice_tokens(g, t0, t1), slice_tokens(beta, t0, t1), &s0);
    const std::size_t orow = s.HV * s.d_v;
    std::copy(r.o.data.begin(), r.o.data.end(), out.o.data.begin() + static_cast<std::ptrdiff_t>(t0 * orow));
    std::copy(r.S_final.data.begin(), r.S_final.data.end(),
              out.S_final.data.begin() + static_cast<std::ptrdiff_t>(n * st));
  }
  return out;
}

/// Variable-length batched recurrence (see kda_varlen for layouts and errors).
template <class S>
KdaOutput<S> kda_recurrent_varlen(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                                  const Tensor<S>& beta, const Tensor<S>* S0,
                                  const std::vector<std::size_t>& cu_seqlens, const S& scale,
                                  KdaVariant var = KdaVariant::kda) {
  return kda_varlen<S>(q, k, v, g, beta, S0, cu_seqlens,
                       [&](const Tensor<S>& a, const Tensor<S>& b, const Tensor<S>& c, const Tensor<S>& d,
                           const Tensor<S>& e, const Tensor<S>* f) { return kda_recurrent<S>(a, b, c, d, e, f, scale, var); });
}

/// The transposed orientation of a state: S_seed = S^T (d_v x d_k). A stated transpose, never a
/// second convention (docs/design.md, conventions).
template <class S>
Mat<S> to_seed_layout(const Mat<S>& S_kv) { return S_kv.transpose(); }

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_KDA(X, S) \
  X template Vec<S> kda_step<S>(Mat<S>&, const Vec<S>&, const Vec<S>&, const Vec<S>&, const Vec<S>&, const S&, \
      const S&, KdaVariant); \
  X template Mat<S> kda_recurrent_head<S>(const Mat<S>&, const Mat<S>&, const Mat<S>&, const Mat<S>&, const Vec<S>&, \
      Mat<S>&, const S&, KdaVariant); \
  X template KdaShape kda_validate<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>*); \
  X template KdaOutput<S> kda_recurrent<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>*, const S&, KdaVariant);
#define KDALAB_TEMPLATES_KDA_DM(X, S) \
  X template KdaOutput<S> kda_recurrent_varlen<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>&, const Tensor<S>*, const std::vector<std::size_t>&, const S&, KdaVariant);
KDALAB_TEMPLATES_KDA(extern, double)
KDALAB_TEMPLATES_KDA(extern, mp50)
KDALAB_TEMPLATES_KDA(extern, float)
KDALAB_TEMPLATES_KDA_DM(extern, double)
KDALAB_TEMPLATES_KDA_DM(extern, mp50)

}  // namespace kdalab
