#pragma once
/// The operations that `kdalab check` judges (docs/check-format.md), as functions of exactly the tensors of an
/// input file: their forward truths (`--op kda`, `kda-decode`, `mla`, `attn-res`) and their exact reverse-mode
/// derivatives (the truth of `--op kda-bwd`, `mla-bwd`, `attn-res-bwd`), each in scalar S (double or
/// cpp_bin_float_50). The Python budget rule (python/src/budget.cpp) takes its truths from here too.
/// Everything here composes the oracle of reference/: no new math.
///
///  * KDA (docs/equations.md, sections 1-2; K3 report Eqs. 1, 5): optional per-head L2Norm of q and k, the decay
///    gate (none: g is the log-decay; k3: g = g_min Sigmoid(e^{A_log} (z + bias)); softplus: g = -e^{A_log}
///    Softplus(z + dt_bias)), optional beta = Sigmoid(logits), then the recurrence from S0 (or zero).
///    Gradients are taken w.r.t. the tensors as stored: dq, dk w.r.t. q, k before the L2Norm, dg w.r.t. the
///    gate logits z when a gate is set, dbeta w.r.t. the logits when beta = "logits", dA_log, dbias.
///    Backward: reference/kda_backward.hpp (recurrence), reference/layers_backward.hpp (L2Norm, Sigmoid),
///    reference/gate_backward.hpp (gates).
///  * MLA as `--op mla` defines it (absorbed query q~ [B, T, H, d_c], latent cache c [B, N, d_c], optional
///    q_rope / k_rope; query t at position N - T + t): reference/mla_backward.hpp mla_attend_absorbed_backward
///    with W_UK = W_UV = I. The reference's scale is 1/sqrt(d_c + d_rope); the file's scale s is reached by
///    feeding the queries times s sqrt(d_c + d_rope) and multiplying their gradients by the same factor.
///  * AttnRes as `--op attn-res` defines it (sources v [N, T, d], pseudo-query w [d], mode full or block):
///    reference/attn_res_backward.hpp per token; a source inside a block sum receives the block's gradient.
///
/// Layouts: states [B, HV, d_k, d_v] (KV) throughout; callers convert VK files. All tensors are float64 holders of
/// the scalar S results.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "reference/attn_res.hpp"
#include "reference/attn_res_backward.hpp"
#include "reference/gate_backward.hpp"
#include "reference/kda.hpp"
#include "reference/kda_backward.hpp"
#include "reference/kda_decode.hpp"
#include "reference/kda_fused_backward.hpp"
#include "reference/layers_backward.hpp"
#include "reference/mla_backward.hpp"

namespace kdalab {

/// The decay gate of a KDA file (docs/check-format.md, attribute `gate`).
enum class KdaGateKind { none, k3, softplus };

/// One `--op kda` problem: q, k [B, T, H, d_k]; v [B, T, HV, d_v]; g [B, T, HV, d_k] (log-decay, or gate logits z);
/// beta [B, T, HV] (values or logits); S0 [B, HV, d_k, d_v] KV (has_S0) or empty; A_log [HV] and bias [HV, d_k]
/// (the bias or dt_bias) when a gate is set.
struct KdaCheckOp {
  Tensor<double> q, k, v, g, beta, S0, A_log, bias;
  bool has_S0 = false, l2norm = false, beta_logits = false;
  KdaGateKind gate = KdaGateKind::none;
  double g_min = -5, scale = 1;
};

/// Gradients of a KDA problem, shaped as the stored inputs (dS0 in KV; dA_log, dbias empty without a gate).
struct KdaCheckGrads {
  Tensor<double> dq, dk, dv, dg, dbeta, dS0, dA_log, dbias;
};

/// The derived recurrence inputs (L2Norm with eps 0, gate, beta sigmoid) in scalar S.
template <class S>
KdaPreops<S> kda_check_preops(const KdaCheckOp& c) {
  KdaPreops<S> p{c.q.cast<S>(), c.k.cast<S>(), c.g.cast<S>(), c.beta.cast<S>()};
  const std::size_t dk = c.q.dim(3);
  if (c.l2norm)
    for (Tensor<S>* t : {&p.q, &p.k})
      for (std::size_t r = 0; r < t->numel() / dk; ++r) {
        S n2 = S(0), m = S(0);
        for (std::size_t i = 0; i < dk; ++i) {
          n2 += t->data[r * dk + i] * t->data[r * dk + i];
          if (sabs<S>(t->data[r * dk + i]) > m) m = sabs<S>(t->data[r * dk + i]);
        }
        if (m > S(0) && !(n2 >= std::numeric_limits<S>::min() && n2 <= std::numeric_limits<S>::max())) {
          // the sum of squares overflows or underflows S (|x| beyond ~1e154 or below ~1e-154 in float64): the row
          // is normalised as x / m with m its largest magnitude, whose squares sum to [1, d_k]
          n2 = S(0);
          for (std::size_t i = 0; i < dk; ++i) {
            t->data[r * dk + i] /= m;
            n2 += t->data[r * dk + i] * t->data[r * dk + i];
          }
        }
        const S inv = n2 > S(0) ? S(S(1) / ssqrt<S>(n2)) : S(0);
        for (std::size_t i = 0; i < dk; ++i) t->data[r * dk + i] *= inv;
      }
  if (c.gate != KdaGateKind::none) {
    const std::size_t HV = c.v.dim(2);
    for (std::size_t x = 0; x < p.g.numel(); ++x) {
      const std::size_t i = x % dk, h = (x / dk) % HV;
      const S z = p.g.data[x], A = S(c.A_log(h)), b = S(c.bias(h, i));
      p.g.data[x] = c.gate == KdaGateKind::k3 ? bounded_gate<S>(z, A, b, S(c.g_min)) : softplus_gate<S>(z, A, b);
    }
  }
  if (c.beta_logits)
    for (auto& x : p.beta.data) x = sigmoid<S>(x);
  return p;
}

/// Refuses a gate whose derived log-decay g [B, T, HV, d_k] is not finite (exp(A_log) (z + bias) overflows):
/// kdalab::Error naming the first such element, its value head, A_log and bias (or dt_bias).
template <class S>
void require_finite_gate(const KdaCheckOp& c, const Tensor<S>& g) {
  const std::size_t dk = c.q.dim(3), HV = c.v.dim(2), T = c.v.dim(1);
  const char* bias = c.gate == KdaGateKind::k3 ? "bias" : "dt_bias";
  for (std::size_t x = 0; x < g.numel(); ++x) {
    if (std::isfinite(static_cast<double>(g.data[x]))) continue;
    const std::size_t i = x % dk, h = (x / dk) % HV, t = (x / dk / HV) % T, b = x / dk / HV / T;
    throw Error(fmt::format("the gate of value head {} (A_log = {}, {}[{}, {}] = {}) gives a non-finite log-decay g "
                            "at [b {}, t {}, d_k {}]; A_log and {} must keep exp(A_log) (z + bias) finite",
                            h, c.A_log(h), bias, h, i, c.bias(h, i), b, t, i, bias));
  }
}

/// The forward truth of a KDA problem in scalar S: the pre-ops (kda_check_preops), then the recurrence from S0
/// or zero (reference/kda.hpp kda_recurrent) or, with decode_steps, T one-token steps from S0 (reference/kda_decode.hpp
/// kda_decode_steps; S0 absent: zero). Returns o [B, T, HV, d_v] and the final state [B, HV, d_k, d_v] (KV).
/// Errors: kdalab::Error on a gate with a non-finite log-decay (require_finite_gate), and from the reference
/// (shapes, non-finite values).
template <class S>
KdaOutput<S> kda_check_truth(const KdaCheckOp& c, bool decode_steps = false) {
  const KdaPreops<S> p = kda_check_preops<S>(c);
  if (c.gate != KdaGateKind::none) require_finite_gate<S>(c, p.g);
  const Tensor<S> S0 = c.has_S0 ? c.S0.cast<S>() : Tensor<S>({c.v.dim(0), c.v.dim(2), c.q.dim(3), c.v.dim(3)});
  if (decode_steps) return kda_decode_steps<S>(p.q, p.k, c.v.cast<S>(), p.g, p.beta, S0, S(c.scale));
  return kda_recurrent<S>(p.q, p.k, c.v.cast<S>(), p.g, p.beta, c.has_S0 ? &S0 : nullptr, S(c.scale));
}

/// Chains the gradients w.r.t. the derived inputs (d: dq, dk, dg, dbeta of the recurrence, dv, dS0) back to the
/// stored inputs of `c` (file comment), in scalar S.
template <class S>
KdaCheckGrads kda_check_chain(const KdaCheckOp& c, const KdaGrad<S>& d) {
  const std::size_t dk = c.q.dim(3), HV = c.v.dim(2);
  KdaCheckGrads r;
  r.dv = d.dv.template cast<double>();
  r.dS0 = d.dS0.template cast<double>();
  r.dq = d.dq.template cast<double>();
  r.dk = d.dk.template cast<double>();
  if (c.l2norm) {
    const auto n = static_cast<Eigen::Index>(dk);
    for (auto [x, dy, dx] : {std::tuple<const Tensor<double>*, const Tensor<S>*, Tensor<double>*>{&c.q, &d.dq, &r.dq},
                             {&c.k, &d.dk, &r.dk}})
      for (std::size_t row = 0; row < x->numel() / dk; ++row) {
        Vec<S> xr(n), dyr(n);
        for (Eigen::Index i = 0; i < n; ++i) {
          xr(i) = S(x->data[row * dk + static_cast<std::size_t>(i)]);
          dyr(i) = dy->data[row * dk + static_cast<std::size_t>(i)];
        }
        const Vec<S> g = l2norm_vec_backward<S>(xr, dyr, S(0));
        for (Eigen::Index i = 0; i < n; ++i) dx->data[row * dk + static_cast<std::size_t>(i)] = static_cast<double>(g(i));
      }
  }
  r.dbeta = Tensor<double>(c.beta.shape);
  for (std::size_t x = 0; x < c.beta.numel(); ++x)
    r.dbeta.data[x] = static_cast<double>(c.beta_logits ? S(d.dbeta.data[x] * sigmoid_derivative<S>(S(c.beta.data[x])))
                                                        : d.dbeta.data[x]);
  r.dg = Tensor<double>(c.g.shape);
  if (c.gate == KdaGateKind::none) {
    r.dg = d.dg.template cast<double>();
  } else {
    Tensor<S> dA({HV}), db({HV, dk});
    for (std::size_t x = 0; x < c.g.numel(); ++x) {
      const std::size_t i = x % dk, h = (x / dk) % HV;
      const S z = S(c.g.data[x]), A = S(c.A_log(h)), b = S(c.bias(h, i));
      const GatePartials<S> gp = c.gate == KdaGateKind::k3 ? bounded_gate_partials<S>(z, A, b, S(c.g_min))
                                                           : softplus_gate_partials<S>(z, A, b);
      const S dz = d.dg.data[x] * gp.dz;
      r.dg.data[x] = static_cast<double>(dz);
      db(h, i) += dz;
      dA(h) += d.dg.data[x] * gp.dA_log;
    }
    r.dA_log = dA.template cast<double>();
    r.dbias = db.template cast<double>();
  }
  return r;
}

/// Exact gradients of a KDA problem for upstream dO [B, T, HV, d_v] and dS [B, HV, d_k, d_v] (KV; null: the
/// final state is unused), in scalar S (double or cpp_bin_float_50). Errors: kdalab::Error from the reference
/// (shapes, non-finite values).
template <class S>
KdaCheckGrads kda_check_backward_truth(const KdaCheckOp& c, const Tensor<double>& dO, const Tensor<double>* dS) {
  const KdaPreops<S> p = kda_check_preops<S>(c);
  const Tensor<S> S0 = c.has_S0 ? c.S0.cast<S>() : Tensor<S>({c.v.dim(0), c.v.dim(2), c.q.dim(3), c.v.dim(3)});
  const Tensor<S> dOs = dO.cast<S>();
  const Tensor<S> dSs = dS ? dS->cast<S>() : Tensor<S>();
  const KdaGrad<S> d = kda_recurrent_backward<S>(p.q, p.k, c.v.cast<S>(), p.g, p.beta, &S0, S(c.scale), dOs,
                                                 dS ? &dSs : nullptr);
  return kda_check_chain<S>(c, d);
}

/// One `--op mla` problem: q [B, T, H, d_c] (absorbed query), c [B, N, d_c], q_rope [B, T, H, d_rope] and
/// k_rope [B, N, d_rope] (d_rope = 0: empty), softmax scale.
struct MlaCheckOp {
  Tensor<double> q, c, q_rope, k_rope;
  double scale = 1;
  std::size_t d_rope() const { return q_rope.numel() ? q_rope.dim(3) : 0; }
};

/// Gradients of an MLA problem: dq, dc, dq_rope, dk_rope (the last two empty when d_rope = 0).
struct MlaCheckGrads {
  Tensor<double> dq, dc, dq_rope, dk_rope;
};

/// The forward truth of an MLA problem in scalar S: the attended latent a[b, t, h] = sum_{tau <= N - T + t}
/// softmax_tau(s) c[b, tau] with s_tau = scale (q~[b, t, h] . c[b, tau] + q_rope[b, t, h] . k_rope[b, tau])
/// (DeepSeek-V2 Eqs. 17-19 absorbed; docs/equations.md, Gated MLA; reference/mla.hpp mla_attend_absorbed with
/// W_UK = W_UV = I, the scale applied as given). Returns [B, T, H, d_c].
template <class S>
Tensor<double> mla_check_truth(const MlaCheckOp& m) {
  const std::size_t B = m.q.dim(0), T = m.q.dim(1), H = m.q.dim(2), dc = m.q.dim(3), N = m.c.dim(1), dr = m.d_rope();
  Tensor<double> out({B, T, H, dc});
  const Tensor<S> q = m.q.cast<S>(), c = m.c.cast<S>(), qr = m.q_rope.cast<S>(), kr = m.k_rope.cast<S>();
  const S scale = S(m.scale);
  std::vector<S> s(N), acc(dc);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t h = 0; h < H; ++h) {
        const std::size_t n = N - T + t + 1;
        S mx = S(0);
        for (std::size_t tau = 0; tau < n; ++tau) {
          S z = S(0);
          for (std::size_t i = 0; i < dc; ++i) z += q(b, t, h, i) * c(b, tau, i);
          for (std::size_t i = 0; i < dr; ++i) z += qr(b, t, h, i) * kr(b, tau, i);
          s[tau] = S(z * scale);
          if (tau == 0 || s[tau] > mx) mx = s[tau];
        }
        S l = S(0);
        std::fill(acc.begin(), acc.end(), S(0));
        for (std::size_t tau = 0; tau < n; ++tau) {
          const S e = sexp<S>(S(s[tau] - mx));
          l += e;
          for (std::size_t i = 0; i < dc; ++i) acc[i] += e * c(b, tau, i);
        }
        for (std::size_t i = 0; i < dc; ++i) out(b, t, h, i) = static_cast<double>(S(acc[i] / l));
      }
  return out;
}

/// Exact gradients of an MLA problem for upstream dO [B, T, H, d_c], in scalar S (file comment).
template <class S>
MlaCheckGrads mla_check_backward_truth(const MlaCheckOp& m, const Tensor<double>& dO) {
  const std::size_t B = m.q.dim(0), T = m.q.dim(1), H = m.q.dim(2), dc = m.q.dim(3), N = m.c.dim(1), dr = m.d_rope();
  MlaConfig cfg;
  cfg.hidden = dc; cfg.n_h = H; cfg.d_c = dc; cfg.d_nope = dc; cfg.d_rope = dr; cfg.d_v = dc;
  const S fac = S(S(m.scale) / mla_scale<S>(cfg));  // file scale = fac * reference scale
  MlaWeights<S> w;
  w.W_UK = Mat<S>(static_cast<Eigen::Index>(H * dc), static_cast<Eigen::Index>(dc));
  for (std::size_t h = 0; h < H; ++h)
    w.W_UK.middleRows(static_cast<Eigen::Index>(h * dc), static_cast<Eigen::Index>(dc)).setIdentity();
  w.W_UV = w.W_UK;
  MlaCheckGrads r{Tensor<double>(m.q.shape), Tensor<double>(m.c.shape), Tensor<double>(m.q_rope.shape),
                  Tensor<double>(m.k_rope.shape)};
  const auto Ti = static_cast<Eigen::Index>(T), Ni = static_cast<Eigen::Index>(N);
  for (std::size_t b = 0; b < B; ++b) {
    MlaProjected<S> p;
    p.q_C.resize(Ti, static_cast<Eigen::Index>(H * dc));
    p.q_R.resize(Ti, static_cast<Eigen::Index>(H * dr));
    Mat<S> C(Ni, static_cast<Eigen::Index>(dc)), KR(Ni, static_cast<Eigen::Index>(dr)),
        dOb(Ti, static_cast<Eigen::Index>(H * dc));
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t i = 0; i < dc; ++i) {
          p.q_C(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(h * dc + i)) = fac * S(m.q(b, t, h, i));
          dOb(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(h * dc + i)) = S(dO(b, t, h, i));
        }
        for (std::size_t i = 0; i < dr; ++i)
          p.q_R(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(h * dr + i)) = fac * S(m.q_rope(b, t, h, i));
      }
    for (std::size_t n = 0; n < N; ++n) {
      for (std::size_t i = 0; i < dc; ++i) C(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(i)) = S(m.c(b, n, i));
      for (std::size_t i = 0; i < dr; ++i)
        KR(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(i)) = S(m.k_rope(b, n, i));
    }
    const MlaAttendGrad<S> g = mla_attend_absorbed_backward<S>(cfg, w, p, C, KR, N - T, dOb);
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t i = 0; i < dc; ++i)
          r.dq(b, t, h, i) = static_cast<double>(S(fac * g.dq_C(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(h * dc + i))));
        for (std::size_t i = 0; i < dr; ++i)
          r.dq_rope(b, t, h, i) =
              static_cast<double>(S(fac * g.dq_R(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(h * dr + i))));
      }
    for (std::size_t n = 0; n < N; ++n) {
      for (std::size_t i = 0; i < dc; ++i)
        r.dc(b, n, i) = static_cast<double>(g.dC(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(i)));
      for (std::size_t i = 0; i < dr; ++i)
        r.dk_rope(b, n, i) = static_cast<double>(g.dK_R(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(i)));
    }
  }
  return r;
}

/// One `--op attn-res` problem: sources v [N, T, d] (v_0 = the embedding), pseudo-query w [d], mode (full or
/// block) with block_sources, RMSNorm eps.
struct AttnResCheckOp {
  Tensor<double> v, w;
  ResidualMode mode = ResidualMode::full;
  std::size_t block_sources = 1;
  double eps = 1e-6;
};

/// Gradients of an AttnRes problem: dv [N, T, d], dw [d].
struct AttnResCheckGrads {
  Tensor<double> dv, dw;
};

/// Which mixed source each v_i feeds (full: source i; block: v_0 is b_0, v_i (i >= 1) is in block
/// 1 + (i - 1) / block_sources, the last, incomplete one being the partial sum), and the number of sources.
inline std::vector<std::size_t> attn_res_source_of(const AttnResCheckOp& a, std::size_t& n_sources) {
  const std::size_t N = a.v.dim(0);
  std::vector<std::size_t> of(N);
  for (std::size_t i = 0; i < N; ++i) of[i] = a.mode == ResidualMode::full || i == 0 ? i : 1 + (i - 1) / a.block_sources;
  n_sources = of.back() + 1;
  return of;
}

/// The forward truth of an AttnRes problem in scalar S: h [T, d], the DepthMixer (reference/attn_res.hpp) started
/// at v_0, after pushing v_1 .. v_{N-1}, read with w.
template <class S>
Tensor<double> attn_res_check_truth(const AttnResCheckOp& a) {
  const std::size_t N = a.v.dim(0), T = a.v.dim(1), d = a.v.dim(2);
  auto mat = [&](std::size_t i) {
    Mat<S> m(static_cast<Eigen::Index>(T), static_cast<Eigen::Index>(d));
    for (Eigen::Index j = 0; j < m.size(); ++j) m.data()[j] = S(a.v.data[i * T * d + static_cast<std::size_t>(j)]);
    return m;
  };
  DepthMixer<S> mix(AttnResConfig{a.mode, a.block_sources, a.eps}, mat(0));
  for (std::size_t i = 1; i < N; ++i) mix.push(mat(i));
  Vec<S> w(static_cast<Eigen::Index>(d));
  for (std::size_t i = 0; i < d; ++i) w(static_cast<Eigen::Index>(i)) = S(a.w.data[i]);
  const Mat<S> h = mix.input(w);
  Tensor<double> out({T, d});
  for (Eigen::Index j = 0; j < h.size(); ++j) out.data[static_cast<std::size_t>(j)] = static_cast<double>(h.data()[j]);
  return out;
}

/// Exact gradients of an AttnRes problem for upstream dh [T, d], in scalar S (file comment).
template <class S>
AttnResCheckGrads attn_res_check_backward_truth(const AttnResCheckOp& a, const Tensor<double>& dh) {
  const std::size_t N = a.v.dim(0), T = a.v.dim(1), d = a.v.dim(2);
  std::size_t ns = 0;
  const std::vector<std::size_t> of = attn_res_source_of(a, ns);
  AttnResCheckGrads r{Tensor<double>(a.v.shape), Tensor<double>({d})};
  const auto di = static_cast<Eigen::Index>(d);
  Vec<S> w(di), dw = Vec<S>::Zero(di);
  for (std::size_t i = 0; i < d; ++i) w(static_cast<Eigen::Index>(i)) = S(a.w.data[i]);
  for (std::size_t t = 0; t < T; ++t) {
    std::vector<Vec<S>> src(ns, Vec<S>::Zero(di));
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t i = 0; i < d; ++i) src[of[n]](static_cast<Eigen::Index>(i)) += S(a.v(n, t, i));
    Vec<S> dht(di);
    for (std::size_t i = 0; i < d; ++i) dht(static_cast<Eigen::Index>(i)) = S(dh(t, i));
    const AttnResGrad<S> g = attn_res_full_backward<S>(w, src, S(a.eps), dht);
    dw += g.dw;
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t i = 0; i < d; ++i) r.dv(n, t, i) = static_cast<double>(g.dsources[of[n]](static_cast<Eigen::Index>(i)));
  }
  for (std::size_t i = 0; i < d; ++i) r.dw.data[i] = static_cast<double>(dw(static_cast<Eigen::Index>(i)));
  return r;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_CHECK_OPS(X, S) \
  X template KdaPreops<S> kda_check_preops<S>(const KdaCheckOp&); \
  X template void require_finite_gate<S>(const KdaCheckOp&, const Tensor<S>&); \
  X template KdaOutput<S> kda_check_truth<S>(const KdaCheckOp&, bool); \
  X template KdaCheckGrads kda_check_chain<S>(const KdaCheckOp&, const KdaGrad<S>&); \
  X template KdaCheckGrads kda_check_backward_truth<S>(const KdaCheckOp&, const Tensor<double>&, \
      const Tensor<double>*); \
  X template Tensor<double> mla_check_truth<S>(const MlaCheckOp&); \
  X template MlaCheckGrads mla_check_backward_truth<S>(const MlaCheckOp&, const Tensor<double>&); \
  X template Tensor<double> attn_res_check_truth<S>(const AttnResCheckOp&); \
  X template AttnResCheckGrads attn_res_check_backward_truth<S>(const AttnResCheckOp&, const Tensor<double>&);
KDALAB_TEMPLATES_CHECK_OPS(extern, double)
KDALAB_TEMPLATES_CHECK_OPS(extern, mp50)

}  // namespace kdalab
