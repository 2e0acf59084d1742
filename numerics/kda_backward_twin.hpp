#pragma once
/// The kernel twin of the CUDA KDA backward (kernels/kda_backward.hpp), and the problem form both share.
///
/// The backward kernel reads bf16 q, k, v, g, beta, dO and fp32 A_log, bias, S0, dS_T; it runs the pre-ops (L2Norm of
/// q and k, beta = Sigmoid(beta_raw), the K3 gate g = g_min Sigmoid(exp(A_log) (g_raw + bias)); K3 report Eq. 5), the
/// token-by-token reverse sweep of the recurrence (docs/equations.md, KDA recurrence and its reverse mode) and the
/// pre-ops' chain rules, everything in fp32; it rounds the per-token gradients dq, dk, dv, dg, dbeta once to bf16 and
/// writes dA_log, dbias (summed over tokens with fp64 accumulation) and dS0 in fp32.
///
/// kda_backward_kernel_form<S> is that computation at scalar S: S = double is the float64 oracle of the kernel's
/// output set, S = float the kernel's arithmetic. kda_backward_twin is the S = float form with the kernel's output
/// rounding, so its error against the oracle predicts the kernel's (tol::twin_vs_kernel: within 10% for the bf16
/// gradients; summation order is the only difference). Measured on kda_backward_problem's draws
/// (tests/numerics/test_twin_backward.cpp), relative RMS of the twin against float64:
///   D   shape (B T H HV), switches         dq       dk       dv       dg       dbeta    dA_log  dbias   dS0
///   128 1 300 1 2, fused, S0, dS_T         1.65e-3  1.65e-3  1.59e-3  1.76e-3  1.40e-3  2.1e-7  1.8e-7  9.6e-8
///   64  2 40 2 2, nothing fused, S0        1.63e-3  1.67e-3  1.68e-3  1.66e-3  1.69e-3  -       -       5.5e-8
///   64  varlen 5+64+1, 1 2, fused, dS_T    1.65e-3  1.50e-3  1.70e-3  1.67e-3  2.25e-3  2.9e-8  1.5e-7  8.6e-8
/// Each bf16 gradient equals its own bf16 rounding floor to three digits (the fp32 form without the rounding is at
/// 1e-7 .. 2.4e-7): the kernel's precision plan costs nothing above the output format. A small tensor can round worse
/// than the typical floor (dbeta of the varlen case: 2.25e-3 from 140 values).
/// Layouts (row-major): q, k [B, T, H, D]; v, g, dO [B, T, HV, D]; beta [B, T, HV]; A_log [HV]; bias [HV, D];
/// S0, dS_T [N, HV, D, D] ("KV"; N = B, or the number of packed sequences with cu). Gradients have their input's
/// shape; dq, dk of a key head sum its HV / H value heads. With a switch off the tensor is the derived one: g the
/// log-decay (fused = false), q, k unit rows (l2norm = false), beta in [0, 1] (beta_sigmoid = false).
/// Errors: kdalab::Error from the reference (reference/kda_backward.hpp) on inconsistent shapes.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "numerics/bf16.hpp"
#include "numerics/random.hpp"
#include "reference/gate_backward.hpp"
#include "reference/kda_backward.hpp"
#include "reference/layers_backward.hpp"

namespace kdalab {

/// One backward problem as the kernel reads it (bf16 / fp32 values held in doubles) and its switches.
struct KdaBwdProblem {
  std::size_t B = 1, T = 1, H = 1, HV = 1, D = 128, N = 1;
  std::vector<std::size_t> cu;  ///< cu_seqlens [N + 1] of packed sequences (B = 1); empty: fixed length
  Tensor<double> q, k, v, g, beta, A_log, bias, dO;
  std::optional<Tensor<double>> S0, dS_T;  ///< absent: zero initial state / final state unused
  double scale = 0, g_min = -5.0;
  bool fused = true, l2norm = true, beta_sigmoid = true;
};

/// The kernel's output set (values held in doubles).
struct KdaBwdGrads {
  Tensor<double> dq, dk, dv, dg, dbeta, dA_log, dbias, dS0;
};

/// A seeded draw of a backward problem (the distribution of the backward's GPU tests): q, k, v, dO N(0, 1) in bf16
/// (q, k then normalised per row and rounded when l2norm is off); g N(0, 1) logits in bf16 (fused) or U(-5, 0);
/// beta N(0, 1) logits in bf16 (beta_sigmoid) or U(0, 1); A_log, bias U(0, 1) fp32; S0, dS_T 0.1 N(0, 1) fp32.
/// lens (not empty): packed sequences of those lengths (B = 1). Shapes: HV = H group.
inline KdaBwdProblem kda_backward_problem(std::size_t B, std::size_t T, std::size_t H, std::size_t group,
                                          std::size_t D, const std::vector<int>& lens, bool fused, bool l2norm,
                                          bool beta_sigmoid, bool S0, bool dS_T, std::uint64_t seed) {
  KdaBwdProblem p;
  p.B = lens.empty() ? B : 1;
  p.T = T;
  if (!lens.empty()) {
    p.cu.assign(1, 0);
    for (int l : lens) p.cu.push_back(p.cu.back() + static_cast<std::size_t>(l));
    p.T = p.cu.back();
  }
  p.H = H;
  p.HV = H * group;
  p.D = D;
  p.N = lens.empty() ? p.B : lens.size();
  p.fused = fused;
  p.l2norm = l2norm;
  p.beta_sigmoid = beta_sigmoid;
  p.scale = 1.0 / std::sqrt(static_cast<double>(D));
  const std::size_t Bp = p.B, Tp = p.T, HV = p.HV;
  Rng rng(seed);
  p.q = Tensor<double>({Bp, Tp, H, D});
  p.k = Tensor<double>({Bp, Tp, H, D});
  p.v = Tensor<double>({Bp, Tp, HV, D});
  p.g = Tensor<double>({Bp, Tp, HV, D});
  p.beta = Tensor<double>({Bp, Tp, HV});
  p.A_log = Tensor<double>({HV});
  p.bias = Tensor<double>({HV, D});
  p.dO = Tensor<double>({Bp, Tp, HV, D});
  Tensor<double> s0({p.N, HV, D, D}), dst({p.N, HV, D, D});
  rng.fill_normal(p.q, 1.0, Format::bf16);
  rng.fill_normal(p.k, 1.0, Format::bf16);
  if (!l2norm)  // q, k given unit-norm (then rounded), as the recurrence expects them
    for (auto* t : {&p.q, &p.k})
      for (std::size_t r = 0; r < Bp * Tp * H; ++r) {
        double n2 = 0;
        for (std::size_t i = 0; i < D; ++i) n2 += t->data[r * D + i] * t->data[r * D + i];
        for (std::size_t i = 0; i < D; ++i) t->data[r * D + i] = round_bf16(t->data[r * D + i] / std::sqrt(n2));
      }
  rng.fill_normal(p.v, 1.0, Format::bf16);
  if (fused)
    rng.fill_normal(p.g, 1.0, Format::bf16);
  else
    rng.fill_uniform(p.g, -5.0, 0.0, Format::bf16);
  if (beta_sigmoid)
    rng.fill_normal(p.beta, 1.0, Format::bf16);
  else
    rng.fill_uniform(p.beta, 0.0, 1.0, Format::bf16);
  rng.fill_uniform(p.A_log, 0.0, 1.0, Format::fp32);
  rng.fill_uniform(p.bias, 0.0, 1.0, Format::fp32);
  rng.fill_normal(s0, 0.1, Format::fp32);
  rng.fill_normal(p.dO, 1.0, Format::bf16);
  rng.fill_normal(dst, 0.1, Format::fp32);
  if (S0) p.S0 = std::move(s0);
  if (dS_T) p.dS_T = std::move(dst);
  return p;
}

/// The kernel's computation at scalar S (file comment): pre-ops, the recurrence's reverse mode
/// (kda_recurrent_backward / kda_recurrent_varlen_backward), chain rules; dA_log and dbias summed over tokens in
/// double (the kernel accumulates them in fp64). S = double: the oracle; S = float: the kernel's arithmetic.
template <class S>
KdaBwdGrads kda_backward_kernel_form(const KdaBwdProblem& p) {
  const std::size_t B = p.B, T = p.T, H = p.H, HV = p.HV, D = p.D;
  const Tensor<S> q = p.q.cast<S>(), k = p.k.cast<S>(), v = p.v.cast<S>(), graw = p.g.cast<S>(),
                  braw = p.beta.cast<S>(), dO = p.dO.cast<S>();
  Tensor<S> qn = q, kn = k, g = graw, beta = braw;
  const S g_min = static_cast<S>(p.g_min);
  if (p.l2norm)
    for (auto [src, dst] : {std::pair{&q, &qn}, {&k, &kn}})
      for (std::size_t r = 0; r < B * T * H; ++r) {
        S n2 = 0;
        for (std::size_t i = 0; i < D; ++i) n2 += src->data[r * D + i] * src->data[r * D + i];
        const S inv = n2 > S(0) ? S(S(1) / ssqrt<S>(n2)) : S(0);
        for (std::size_t i = 0; i < D; ++i) dst->data[r * D + i] = src->data[r * D + i] * inv;
      }
  for (std::size_t r = 0; r < B * T; ++r)
    for (std::size_t hv = 0; hv < HV; ++hv) {
      if (p.beta_sigmoid) beta.data[r * HV + hv] = sigmoid<S>(braw.data[r * HV + hv]);
      if (p.fused)
        for (std::size_t i = 0; i < D; ++i)
          g.data[(r * HV + hv) * D + i] = bounded_gate<S>(graw.data[(r * HV + hv) * D + i], static_cast<S>(p.A_log(hv)),
                                                          static_cast<S>(p.bias(hv, i)), g_min);
    }
  std::optional<Tensor<S>> S0, dST;
  if (p.S0) S0 = p.S0->cast<S>();
  if (p.dS_T) dST = p.dS_T->cast<S>();
  const S scale = static_cast<S>(p.scale);
  KdaGrad<S> d = p.cu.empty()
                     ? kda_recurrent_backward<S>(qn, kn, v, g, beta, S0 ? &*S0 : nullptr, scale, dO, dST ? &*dST : nullptr)
                     : kda_recurrent_varlen_backward<S>(qn, kn, v, g, beta, S0 ? &*S0 : nullptr, p.cu, scale, dO,
                                                        dST ? &*dST : nullptr);
  if (p.l2norm) {
    const auto n = static_cast<Eigen::Index>(D);
    Tensor<S> dq(q.shape), dk(k.shape);
    for (auto [x, dy, dx] : {std::tuple{&q, &d.dq, &dq}, {&k, &d.dk, &dk}})
      for (std::size_t row = 0; row < B * T * H; ++row) {
        const Vec<S> xr = Eigen::Map<const Vec<S>>(x->data.data() + row * D, n);
        const Vec<S> dyr = Eigen::Map<const Vec<S>>(dy->data.data() + row * D, n);
        Eigen::Map<Vec<S>>(dx->data.data() + row * D, n) = l2norm_vec_backward<S>(xr, dyr, S(0));
      }
    d.dq = std::move(dq);
    d.dk = std::move(dk);
  }
  KdaBwdGrads r{{}, {}, {}, {}, {}, Tensor<double>({HV}, 0.0), Tensor<double>({HV, D}, 0.0), {}};
  for (std::size_t row = 0; row < B * T; ++row)
    for (std::size_t hv = 0; hv < HV; ++hv) {
      if (p.beta_sigmoid) d.dbeta.data[row * HV + hv] *= sigmoid_derivative<S>(braw.data[row * HV + hv]);
      if (p.fused)
        for (std::size_t i = 0; i < D; ++i) {
          const std::size_t o = (row * HV + hv) * D + i;
          const GatePartials<S> gp = bounded_gate_partials<S>(graw.data[o], static_cast<S>(p.A_log(hv)),
                                                              static_cast<S>(p.bias(hv, i)), g_min);
          const S dz = d.dg.data[o] * gp.dz;
          r.dbias(hv, i) += static_cast<double>(dz);
          r.dA_log(hv) += static_cast<double>(S(d.dg.data[o] * gp.dA_log));
          d.dg.data[o] = dz;
        }
    }
  r.dq = d.dq.template cast<double>();
  r.dk = d.dk.template cast<double>();
  r.dv = d.dv.template cast<double>();
  r.dg = d.dg.template cast<double>();
  r.dbeta = d.dbeta.template cast<double>();
  r.dS0 = d.dS0.template cast<double>();
  if (!std::is_same_v<S, double>)  // the fp64 sums land in fp32 outputs
    for (auto* t : {&r.dA_log, &r.dbias})
      for (double& x : t->data) x = static_cast<double>(static_cast<float>(x));
  return r;
}

/// The kernel twin (file comment): the fp32 form with dq, dk, dv, dg, dbeta rounded once to bf16.
inline KdaBwdGrads kda_backward_twin(const KdaBwdProblem& p) {
  KdaBwdGrads r = kda_backward_kernel_form<float>(p);
  for (auto* t : {&r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta})
    for (double& x : t->data) x = round_bf16(x);
  return r;
}

}  // namespace kdalab
