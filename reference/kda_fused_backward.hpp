#pragma once
/// The KDA op with its pre-ops fused, on the inputs of the CUDA prefill (kernels/kda.hpp), and its
/// exact reverse-mode derivative (vector-Jacobian product):
///   q_t, k_t = L2Norm(q_raw_t), L2Norm(k_raw_t)       per key head, eps l2_eps (0 in the kernel)
///   beta_t   = Sigmoid(beta_raw_t)
///   g_t      = g_min Sigmoid(e^{A_h} (g_raw_t + bias))   (bounded, K3 report Eq. 5) or
///              -e^{A_h} Softplus(g_raw_t + bias)         (softplus, Kimi Linear report; bias = dt_bias)
///   o, S_T   = KDA(q, k, v, g, beta; S0)                (K3 report Eq. 1; reference/kda.hpp)
/// The backward is the chain rule through reference/kda_backward.hpp (recurrence),
/// reference/layers_backward.hpp (L2Norm, Sigmoid) and reference/gate_backward.hpp (gates).
/// Layouts: q_raw, k_raw [B, T, H, d_k]; v [B, T, HV, d_v]; g_raw [B, T, HV, d_k]; beta_raw
/// [B, T, HV]; A_log [HV]; bias [HV, d_k]; S0 [B, HV, d_k, d_v] (null: zero state); o [B, T, HV, d_v];
/// S_final [B, HV, d_k, d_v]. Gradients have the shapes of their inputs.
#include <string>
#include <tuple>
#include <utility>

#include "reference/gate_backward.hpp"
#include "reference/kda_backward.hpp"
#include "reference/layers_backward.hpp"

namespace kdalab {

/// Gate choice of the fused op: which gate and its lower bound g_min (bounded gate only).
template <class S>
struct KdaFusedGate {
  GateKind kind = GateKind::bounded;
  S g_min = S(-5);
};

/// The recurrence inputs derived by the pre-ops: q, k [B, T, H, d_k]; g [B, T, HV, d_k]; beta [B, T, HV].
template <class S>
struct KdaPreops {
  Tensor<S> q, k, g, beta;
};

/// Runs the pre-ops (file comment). Errors: kdalab::Error naming the tensor on a shape mismatch
/// ('q_raw', 'k_raw', 'g_raw', 'beta_raw', 'A_log', 'bias'), a non-finite value, g_min >= 0 for the
/// bounded gate or l2_eps < 0.
template <class S>
KdaPreops<S> kda_fused_preops(const Tensor<S>& q_raw, const Tensor<S>& k_raw, const Tensor<S>& v,
                              const Tensor<S>& g_raw, const Tensor<S>& beta_raw, const Tensor<S>& A_log,
                              const Tensor<S>& bias, const KdaFusedGate<S>& gate, const S& l2_eps) {
  require(q_raw.rank() == 4, "tensor 'q_raw' must be [B, T, H, d_k], got shape " + shape_str(q_raw.shape));
  require(v.rank() == 4, "tensor 'v' must be [B, T, HV, d_v], got shape " + shape_str(v.shape));
  const std::size_t B = q_raw.dim(0), T = q_raw.dim(1), H = q_raw.dim(2), dk = q_raw.dim(3), HV = v.dim(2);
  require_shape(k_raw, q_raw.shape, "k_raw");
  require_shape(g_raw, {B, T, HV, dk}, "g_raw");
  require_shape(beta_raw, {B, T, HV}, "beta_raw");
  require_shape(A_log, {HV}, "A_log");
  require_shape(bias, {HV, dk}, "bias");
  for (const auto& [t, name] : {std::pair<const Tensor<S>*, const char*>{&q_raw, "q_raw"}, {&k_raw, "k_raw"},
                                {&g_raw, "g_raw"}, {&beta_raw, "beta_raw"}, {&A_log, "A_log"}, {&bias, "bias"}})
    require_finite(*t, name);
  require(gate.kind != GateKind::bounded || gate.g_min < S(0),
          "kda_fused: g_min = " + std::to_string(static_cast<double>(gate.g_min)) + " must be < 0 for the bounded gate");
  require(l2_eps >= S(0), "kda_fused: l2_eps = " + std::to_string(static_cast<double>(l2_eps)) + " must be >= 0");
  KdaPreops<S> p{Tensor<S>(q_raw.shape), Tensor<S>(k_raw.shape), Tensor<S>(g_raw.shape), Tensor<S>(beta_raw.shape)};
  for (std::size_t r = 0; r < B * T * H; ++r)
    for (auto [src, dst] : {std::pair<const Tensor<S>*, Tensor<S>*>{&q_raw, &p.q}, {&k_raw, &p.k}}) {
      S n2 = l2_eps;
      for (std::size_t i = 0; i < dk; ++i) n2 += src->data[r * dk + i] * src->data[r * dk + i];
      const S inv = n2 > S(0) ? S(S(1) / ssqrt<S>(n2)) : S(0);
      for (std::size_t i = 0; i < dk; ++i) dst->data[r * dk + i] = src->data[r * dk + i] * inv;
    }
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t hv = 0; hv < HV; ++hv) {
        p.beta(b, t, hv) = sigmoid<S>(beta_raw(b, t, hv));
        for (std::size_t i = 0; i < dk; ++i)
          p.g(b, t, hv, i) = gate.kind == GateKind::bounded
                                 ? bounded_gate<S>(g_raw(b, t, hv, i), A_log(hv), bias(hv, i), gate.g_min)
                                 : softplus_gate<S>(g_raw(b, t, hv, i), A_log(hv), bias(hv, i));
      }
  return p;
}

/// The fused KDA op (file comment). Errors: kdalab::Error from kda_fused_preops or kda_validate.
template <class S>
KdaOutput<S> kda_fused(const Tensor<S>& q_raw, const Tensor<S>& k_raw, const Tensor<S>& v, const Tensor<S>& g_raw,
                       const Tensor<S>& beta_raw, const Tensor<S>& A_log, const Tensor<S>& bias, const Tensor<S>* S0,
                       const S& scale, const KdaFusedGate<S>& gate = {}, const S& l2_eps = S(0)) {
  const KdaPreops<S> p = kda_fused_preops<S>(q_raw, k_raw, v, g_raw, beta_raw, A_log, bias, gate, l2_eps);
  return kda_recurrent<S>(p.q, p.k, v, p.g, p.beta, S0, scale);
}

/// Gradients of kda_fused, shaped as its inputs.
template <class S>
struct KdaFusedGrad {
  Tensor<S> dq_raw, dk_raw, dv, dg_raw, dbeta_raw, dA_log, dbias, dS0;
};

/// Reverse-mode derivative of kda_fused: given dO = dL/do [B, T, HV, d_v] and dS_T = dL/dS_final
/// (null: unused), returns dL/d(q_raw, k_raw, v, g_raw, beta_raw, A_log, bias, S0). checkpoint as
/// kda_recurrent_head_backward. Errors: as kda_fused and kda_recurrent_backward.
template <class S>
KdaFusedGrad<S> kda_fused_backward(const Tensor<S>& q_raw, const Tensor<S>& k_raw, const Tensor<S>& v,
                                   const Tensor<S>& g_raw, const Tensor<S>& beta_raw, const Tensor<S>& A_log,
                                   const Tensor<S>& bias, const Tensor<S>* S0, const S& scale, const Tensor<S>& dO,
                                   const Tensor<S>* dS_T, const KdaFusedGate<S>& gate = {}, const S& l2_eps = S(0),
                                   std::size_t checkpoint = 0) {
  const KdaPreops<S> p = kda_fused_preops<S>(q_raw, k_raw, v, g_raw, beta_raw, A_log, bias, gate, l2_eps);
  KdaGrad<S> d = kda_recurrent_backward<S>(p.q, p.k, v, p.g, p.beta, S0, scale, dO, dS_T, KdaVariant::kda, checkpoint);
  const std::size_t B = q_raw.dim(0), T = q_raw.dim(1), H = q_raw.dim(2), dk = q_raw.dim(3), HV = v.dim(2);
  KdaFusedGrad<S> r{Tensor<S>(q_raw.shape), Tensor<S>(k_raw.shape), std::move(d.dv), Tensor<S>(g_raw.shape),
                    Tensor<S>(beta_raw.shape), Tensor<S>(A_log.shape), Tensor<S>(bias.shape), std::move(d.dS0)};
  const auto n = static_cast<Eigen::Index>(dk);
  for (std::size_t row = 0; row < B * T * H; ++row)
    for (auto [x, dy, dx] : {std::tuple<const Tensor<S>*, const Tensor<S>*, Tensor<S>*>{&q_raw, &d.dq, &r.dq_raw},
                             {&k_raw, &d.dk, &r.dk_raw}}) {
      const Vec<S> xr = Eigen::Map<const Vec<S>>(x->data.data() + row * dk, n);
      const Vec<S> dyr = Eigen::Map<const Vec<S>>(dy->data.data() + row * dk, n);
      Eigen::Map<Vec<S>>(dx->data.data() + row * dk, n) = l2norm_vec_backward<S>(xr, dyr, l2_eps);
    }
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t hv = 0; hv < HV; ++hv) {
        r.dbeta_raw(b, t, hv) = d.dbeta(b, t, hv) * sigmoid_derivative<S>(beta_raw(b, t, hv));
        for (std::size_t i = 0; i < dk; ++i) {
          const GatePartials<S> gp =
              gate.kind == GateKind::bounded ? bounded_gate_partials<S>(g_raw(b, t, hv, i), A_log(hv), bias(hv, i), gate.g_min)
                                             : softplus_gate_partials<S>(g_raw(b, t, hv, i), A_log(hv), bias(hv, i));
          const S dz = d.dg(b, t, hv, i) * gp.dz;
          r.dg_raw(b, t, hv, i) = dz;
          r.dbias(hv, i) += dz;
          r.dA_log(hv) += d.dg(b, t, hv, i) * gp.dA_log;
        }
      }
  return r;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_KDA_FUSED_BACKWARD(X, S) \
  X template KdaPreops<S> kda_fused_preops<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const KdaFusedGate<S>&, const S&); \
  X template KdaOutput<S> kda_fused<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const Tensor<S>*, const S&, const KdaFusedGate<S>&, \
      const S&); \
  X template KdaFusedGrad<S> kda_fused_backward<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const Tensor<S>*, const S&, \
      const Tensor<S>&, const Tensor<S>*, const KdaFusedGate<S>&, const S&, std::size_t);
KDALAB_TEMPLATES_KDA_FUSED_BACKWARD(extern, double)
KDALAB_TEMPLATES_KDA_FUSED_BACKWARD(extern, mp50)

}  // namespace kdalab
