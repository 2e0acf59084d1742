#pragma once
/// Exact reverse-mode derivative (vector-Jacobian product) of the full KDA layer of
/// reference/kda_layer.hpp (K3 report Eqs. 2, 5, 6; Kimi Linear report; docs/equations.md, reverse
/// mode) on a fresh cache (zero state, zero ShortConv tails):
///   y = W_o [ Sigmoid(W_g x) ⊙ RMSNorm(o) ],  o = KDA(q, k, v, g, beta; S_0 = 0)
/// The chain rule runs backwards through the op VJPs:
///   W_o, W_g, W_q, W_k, W_v, W_beta, W_a_down, W_a_up, W_alpha   linear_backward (layers_backward.hpp)
///   output gate, RMSNorm, Swish, ShortConv, L2Norm, Sigmoid       layers_backward.hpp
///   decay gate (A_log, g_bias)                                    gate_backward.hpp
///   the recurrence                                                kda_backward.hpp (checkpointed)
/// The forward runs the chunked form for prefill; it computes the same function as the recurrence,
/// so its VJP is the recurrence's (the chunked VJP equals it to rounding: test_kda_chunk_backward).
/// With the gate from v (K3 report Eq. 2) v receives the gradient of both the core and the gate logit.
/// The loss is on y only (the final state and the updated tails carry no gradient here).
/// Layouts: x, dy, dx [T, hidden]; the weight gradients have the shapes of KdaWeights; a weight the
/// config does not use (W_alpha for the gate from x, W_a_down and W_a_up for the gate from v) gets 0.
#include <cstddef>
#include <string>

#include "reference/gate_backward.hpp"
#include "reference/kda_backward.hpp"
#include "reference/kda_layer.hpp"
#include "reference/layers_backward.hpp"

namespace kdalab {

/// Gradients of a KDA layer: dx [T, hidden] and one gradient per weight, shaped as the weights.
template <class S>
struct KdaLayerGrad {
  Mat<S> dx;
  KdaWeights<S> dw;
};

/// VJP of KdaLayer(cfg, w).prefill(x) on a fresh cache for upstream dy [T, hidden] (file comment).
/// checkpoint: the recurrence backward's state checkpoint interval (kda_recurrent_head_backward; 0
/// keeps every state). Errors: kdalab::Error as KdaLayer (config, weight shapes, non-finite x), or
/// naming 'dy' on a shape mismatch.
template <class S>
KdaLayerGrad<S> kda_layer_backward(const KdaConfig& cfg, const KdaWeights<S>& w, const Mat<S>& x, const Mat<S>& dy,
                                   std::size_t checkpoint = 0) {
  w.validate(cfg);
  require(x.cols() == static_cast<Eigen::Index>(cfg.hidden),
          "kda_layer_backward: tensor 'x' has " + std::to_string(x.cols()) + " columns, expected hidden = " +
              std::to_string(cfg.hidden));
  for (Eigen::Index i = 0; i < x.size(); ++i)
    require(std::isfinite(static_cast<double>(x.data()[i])),
            "kda_layer_backward: tensor 'x' has a non-finite value at flat index " + std::to_string(i));
  require_same_shape(dy, x.rows(), x.cols(), "kda_layer_backward");
  const Eigen::Index T = x.rows(), dk = static_cast<Eigen::Index>(cfg.d_k), dv = static_cast<Eigen::Index>(cfg.d_v),
                     K = static_cast<Eigen::Index>(cfg.conv_kernel);
  const Eigen::Index HV = static_cast<Eigen::Index>(cfg.HV), group = static_cast<Eigen::Index>(cfg.HV / cfg.H);
  const S l2_eps = S(cfg.l2_eps), rms_eps = S(cfg.rms_eps), scale = S(cfg.effective_scale());
  const bool from_x = cfg.gate_input == GateInput::from_x;
  // ---- forward, keeping what the backward reads ----
  const ConvTail<S> tq(K, w.W_q.rows()), tk(K, w.W_k.rows()), tv(K, w.W_v.rows());  // fresh tails
  const auto conv = [](const Mat<S>& p, const Mat<S>& cw, ConvTail<S> tail) { return short_conv<S>(p, cw, tail); };
  const Mat<S> Pq = linear<S>(x, w.W_q), Pk = linear<S>(x, w.W_k), Pv = linear<S>(x, w.W_v);
  const Mat<S> Cq = conv(Pq, w.conv_q, tq), Ck = conv(Pk, w.conv_k, tk), Cv = conv(Pv, w.conv_v, tv);
  const Mat<S> Aq = swish_mat<S>(Cq), Ak = swish_mat<S>(Ck), v = swish_mat<S>(Cv);
  const Mat<S> q = l2norm<S>(Aq, dk, l2_eps), k = l2norm<S>(Ak, dk, l2_eps);
  const Mat<S> bl = linear<S>(x, w.W_beta), beta = sigmoid_mat<S>(bl);
  const Mat<S> low = from_x ? linear<S>(x, w.W_a_down) : Mat<S>();
  const Mat<S> z = from_x ? linear<S>(low, w.W_a_up) : linear<S>(v, w.W_alpha);
  const Mat<S> g = gate<S>(z, w.A_log, w.g_bias, cfg.gate, S(cfg.g_min));
  Mat<S> o(T, HV * dv);
  for (Eigen::Index j = 0; j < HV; ++j) {
    const Eigen::Index h = j / group;
    Mat<S> St = Mat<S>::Zero(dk, dv);
    o.middleCols(j * dv, dv) = kda_recurrent_head<S>(q.middleCols(h * dk, dk), k.middleCols(h * dk, dk),
                                                     v.middleCols(j * dv, dv), g.middleCols(j * dk, dk), beta.col(j),
                                                     St, scale);
  }
  const Mat<S> n = rmsnorm<S>(o, w.rms_w, rms_eps);
  const Mat<S> gl = linear<S>(x, w.W_g);
  const Mat<S> gated = output_gate<S>(n, gl);
  // ---- backward ----
  KdaLayerGrad<S> r;
  KdaWeights<S>& d = r.dw;
  const auto zero_like = [](const Mat<S>& m) { return Mat<S>(Mat<S>::Zero(m.rows(), m.cols())); };
  d.W_a_down = zero_like(w.W_a_down);
  d.W_a_up = zero_like(w.W_a_up);
  d.W_alpha = zero_like(w.W_alpha);
  LinearGrad<S> lo = linear_backward<S>(gated, w.W_o, dy);
  d.W_o = lo.dW;
  const OutputGateGrad<S> og = output_gate_backward<S>(n, gl, lo.dx);
  LinearGrad<S> lg = linear_backward<S>(x, w.W_g, og.d_gate_logit);
  d.W_g = lg.dW;
  r.dx = lg.dx;
  const RmsNormGrad<S> rn = rmsnorm_backward<S>(o, w.rms_w, og.d_o, rms_eps);
  d.rms_w = rn.dw;
  Mat<S> dq = Mat<S>::Zero(T, q.cols()), dkk = Mat<S>::Zero(T, k.cols()), dvv(T, v.cols()), dg(T, g.cols()),
         dbeta(T, HV);
  for (Eigen::Index j = 0; j < HV; ++j) {
    const Eigen::Index h = j / group;
    const KdaHeadGrad<S> hg = kda_recurrent_head_backward<S>(
        q.middleCols(h * dk, dk), k.middleCols(h * dk, dk), v.middleCols(j * dv, dv), g.middleCols(j * dk, dk),
        beta.col(j), Mat<S>::Zero(dk, dv), scale, rn.dx.middleCols(j * dv, dv), Mat<S>::Zero(dk, dv), KdaVariant::kda,
        static_cast<Eigen::Index>(checkpoint));
    dq.middleCols(h * dk, dk) += hg.dq;
    dkk.middleCols(h * dk, dk) += hg.dk;
    dvv.middleCols(j * dv, dv) = hg.dv;
    dg.middleCols(j * dk, dk) = hg.dg;
    dbeta.col(j) = hg.dbeta;
  }
  const LinearGrad<S> lb = linear_backward<S>(x, w.W_beta, sigmoid_mat_backward<S>(bl, dbeta));
  d.W_beta = lb.dW;
  r.dx += lb.dx;
  const GateGrad<S> gg = gate_backward<S>(z, w.A_log, w.g_bias, cfg.gate, dg, S(cfg.g_min));
  d.A_log = gg.dA_log;
  d.g_bias = gg.dbias;
  if (from_x) {
    const LinearGrad<S> lu = linear_backward<S>(low, w.W_a_up, gg.dz);
    const LinearGrad<S> ld = linear_backward<S>(x, w.W_a_down, lu.dx);
    d.W_a_up = lu.dW;
    d.W_a_down = ld.dW;
    r.dx += ld.dx;
  } else {
    const LinearGrad<S> la = linear_backward<S>(v, w.W_alpha, gg.dz);
    d.W_alpha = la.dW;
    dvv += la.dx;
  }
  // q, k, v: L2Norm (q, k) <- Swish <- ShortConv <- linear
  const auto branch = [&](const Mat<S>& P, const Mat<S>& C, const Mat<S>& cw, const ConvTail<S>& tail, const Mat<S>& W,
                          const Mat<S>& dC, Mat<S>& dconv, Mat<S>& dW) {
    const ShortConvGrad<S> sc = short_conv_backward<S>(P, cw, tail, swish_mat_backward<S>(C, dC));
    dconv = sc.dw;
    const LinearGrad<S> l = linear_backward<S>(x, W, sc.dx);
    dW = l.dW;
    r.dx += l.dx;
  };
  branch(Pq, Cq, w.conv_q, tq, w.W_q, l2norm_backward<S>(Aq, dq, dk, l2_eps), d.conv_q, d.W_q);
  branch(Pk, Ck, w.conv_k, tk, w.W_k, l2norm_backward<S>(Ak, dkk, dk, l2_eps), d.conv_k, d.W_k);
  branch(Pv, Cv, w.conv_v, tv, w.W_v, dvv, d.conv_v, d.W_v);
  return r;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_KDA_LAYER_BACKWARD(X, S) \
  X template KdaLayerGrad<S> kda_layer_backward<S>(const KdaConfig&, const KdaWeights<S>&, const Mat<S>&, \
      const Mat<S>&, std::size_t);
KDALAB_TEMPLATES_KDA_LAYER_BACKWARD(extern, double)
KDALAB_TEMPLATES_KDA_LAYER_BACKWARD(extern, mp50)

}  // namespace kdalab
