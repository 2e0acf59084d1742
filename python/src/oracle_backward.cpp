// The gradient entry points of the Python module (python/src/oracle.hpp): the reverse-mode
// derivatives of reference/kda_backward.hpp, kda_chunk_backward.hpp, gate_backward.hpp,
// attn_res_backward.hpp and mla_backward.hpp, each in float64 and cpp_bin_float_50. No math here:
// each function casts, calls the reference template and casts back.
#include <cmath>
#include <vector>

#include "python/src/convert.hpp"
#include "python/src/oracle.hpp"
#include "reference/attn_res_backward.hpp"
#include "reference/gate_backward.hpp"
#include "reference/kda_backward.hpp"
#include "reference/kda_chunk_backward.hpp"
#include "reference/mla_backward.hpp"

namespace kdalab::py {

namespace {

template <class S>
KdaGradResult narrow(const KdaGrad<S>& g) {
  return {g.dq.template cast<double>(),   g.dk.template cast<double>(),    g.dv.template cast<double>(),
          g.dg.template cast<double>(),   g.dbeta.template cast<double>(), g.dS0.template cast<double>()};
}

template <class S>
KdaGradResult recurrent_backward_in(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                                    const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0,
                                    const Tensor<double>& dO, const Tensor<double>* dS_T, double scale,
                                    KdaVariant var, std::size_t checkpoint) {
  const Tensor<S> s0 = S0 ? S0->cast<S>() : Tensor<S>(), dst = dS_T ? dS_T->cast<S>() : Tensor<S>();
  return narrow(kdalab::kda_recurrent_backward<S>(q.cast<S>(), k.cast<S>(), v.cast<S>(), g.cast<S>(), beta.cast<S>(),
                                                  S0 ? &s0 : nullptr, S(scale), dO.cast<S>(), dS_T ? &dst : nullptr,
                                                  var, checkpoint));
}

template <class S>
KdaGradResult chunked_backward_in(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                                  const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0,
                                  const Tensor<double>& dO, const Tensor<double>* dS_T, double scale, std::size_t C) {
  const Tensor<S> s0 = S0 ? S0->cast<S>() : Tensor<S>(), dst = dS_T ? dS_T->cast<S>() : Tensor<S>();
  return narrow(kdalab::kda_chunked_backward<S>(q.cast<S>(), k.cast<S>(), v.cast<S>(), g.cast<S>(), beta.cast<S>(),
                                                S0 ? &s0 : nullptr, S(scale), dO.cast<S>(), dS_T ? &dst : nullptr, C));
}

GateKind gate_kind(const std::string& kind, double g_min) {
  const GateKind k = parse_gate_kind(kind, "kind");
  require(std::isfinite(g_min), "g_min = " + num_str(g_min) + " is not accepted; give a finite g_min < 0");
  return k;
}

// ---- AttnRes: per token, the sources of the forward pass (attn_res() / DepthMixer) ------------

/// The sources of token t as the forward pass mixes them: full mode every v_i; block mode the completed
/// block sums [b_0 = v_0, b_1, ...] (summed in push order, as DepthMixer::push) and the partial sum.
template <class S>
struct TokenSources {
  std::vector<Vec<S>> blocks;
  Vec<S> partial;
  std::size_t partial_count = 0;
};

template <class S>
TokenSources<S> token_sources(const Tensor<double>& v, std::size_t t, ResidualMode mode, std::size_t bs) {
  const std::size_t N = v.dim(0), T = v.dim(1), d = v.dim(2);
  const auto row = [&](std::size_t i) {
    Vec<S> r(static_cast<Eigen::Index>(d));
    for (std::size_t j = 0; j < d; ++j) r(static_cast<Eigen::Index>(j)) = S(v.data[(i * T + t) * d + j]);
    return r;
  };
  TokenSources<S> s;
  s.blocks.push_back(row(0));
  for (std::size_t i = 1; i < N; ++i) {
    if (mode == ResidualMode::full) {
      s.blocks.push_back(row(i));
      continue;
    }
    if (s.partial_count == 0) s.partial = row(i); else s.partial += row(i);
    if (++s.partial_count == bs) {
      s.blocks.push_back(s.partial);
      s.partial_count = 0;
    }
  }
  return s;
}

template <class S>
AttnResGradResult attn_res_backward_in(const Tensor<double>& v, const Tensor<double>& w, const Tensor<double>& dh,
                                       const AttnResConfig& cfg) {
  const std::size_t N = v.dim(0), T = v.dim(1), d = v.dim(2);
  const Vec<S> wv = to_vec<S>(w, "w");
  const S eps = S(cfg.eps);
  Vec<S> dw = Vec<S>::Zero(static_cast<Eigen::Index>(d));
  AttnResGradResult r{Tensor<double>(v.shape), Tensor<double>()};
  const auto put = [&](std::size_t i, std::size_t t, const Vec<S>& g) {
    for (std::size_t j = 0; j < d; ++j) r.dv.data[(i * T + t) * d + j] = static_cast<double>(g(static_cast<Eigen::Index>(j)));
  };
  for (std::size_t t = 0; t < T; ++t) {
    Vec<S> dht(static_cast<Eigen::Index>(d));
    for (std::size_t j = 0; j < d; ++j) dht(static_cast<Eigen::Index>(j)) = S(dh.data[t * d + j]);
    const TokenSources<S> src = token_sources<S>(v, t, cfg.mode, cfg.block_sources);
    if (cfg.mode == ResidualMode::full) {
      const AttnResGrad<S> g = attn_res_full_backward<S>(wv, src.blocks, eps, dht);
      dw += g.dw;
      for (std::size_t i = 0; i < N; ++i) put(i, t, g.dsources[i]);
    } else {
      const AttnResBlockGrad<S> g =
          attn_res_block_backward<S>(wv, src.blocks, src.partial_count ? &src.partial : nullptr, eps, dht);
      dw += g.dw;
      put(0, t, g.dblocks[0]);
      for (std::size_t i = 1; i < N; ++i) {  // a source inside block sum b_n receives d b_n
        const std::size_t n = (i - 1) / cfg.block_sources + 1;
        put(i, t, n < g.dblocks.size() ? g.dblocks[n] : g.dpartial);
      }
    }
  }
  r.dw = from_vec<S>(dw);
  return r;
}

// ---- MLA attention core -------------------------------------------------------------------------

/// The MLA problem of mla_attend: config, weights and projected queries, from the tensors' shapes.
struct MlaCore {
  MlaConfig cfg;
  std::size_t T = 0, N = 0;
};

MlaCore mla_core(const Tensor<double>& q_C, const Tensor<double>& q_R, const Tensor<double>& C,
                 const Tensor<double>& K_R, const Tensor<double>& W_UK, const Tensor<double>& W_UV, std::size_t n_h) {
  require(n_h >= 1, "n_h = 0 is not accepted; give the number of heads, >= 1");
  const auto mat = [](const Tensor<double>& t, const char* name, const char* expect) {
    require(t.rank() == 2, std::string("tensor '") + name + "' has shape " + shape_str(t.shape) + "; expected " + expect);
    require_finite(t, name);
  };
  mat(q_C, "q_C", "[T, n_h d_nope]");
  mat(q_R, "q_R", "[T, n_h d_rope] (d_rope may be 0)");
  mat(C, "C", "[N, d_c]");
  mat(K_R, "K_R", "[N, d_rope]");
  mat(W_UK, "W_UK", "[n_h d_nope, d_c]");
  mat(W_UV, "W_UV", "[n_h d_v, d_c]");
  MlaCore m;
  m.T = q_C.dim(0);
  m.N = C.dim(0);
  MlaConfig& c = m.cfg;
  c.n_h = n_h;
  c.hidden = 1;  // the projections are outside the core
  c.d_c = C.dim(1);
  require(m.T >= 1 && q_C.dim(1) % n_h == 0 && q_C.dim(1) >= n_h,
          "tensor 'q_C' has shape " + shape_str(q_C.shape) + "; expected [T >= 1, n_h d_nope] with n_h = " +
              std::to_string(n_h) + ", d_nope >= 1");
  c.d_nope = q_C.dim(1) / n_h;
  require(q_R.dim(0) == m.T && q_R.dim(1) % n_h == 0,
          "tensor 'q_R' has shape " + shape_str(q_R.shape) + "; expected [T = " + std::to_string(m.T) +
              ", n_h d_rope] with n_h = " + std::to_string(n_h));
  c.d_rope = q_R.dim(1) / n_h;
  require(m.N >= m.T && c.d_c >= 1, "tensor 'C' has shape " + shape_str(C.shape) + "; expected [N >= T = " +
                                        std::to_string(m.T) + ", d_c >= 1] (the cache holds the T new tokens last)");
  require(K_R.dim(0) == m.N && K_R.dim(1) == c.d_rope,
          "tensor 'K_R' has shape " + shape_str(K_R.shape) + "; expected [N, d_rope] = " +
              shape_str({m.N, c.d_rope}));
  require(W_UK.dim(0) == n_h * c.d_nope && W_UK.dim(1) == c.d_c,
          "tensor 'W_UK' has shape " + shape_str(W_UK.shape) + "; expected [n_h d_nope, d_c] = " +
              shape_str({n_h * c.d_nope, c.d_c}));
  require(W_UV.dim(0) % n_h == 0 && W_UV.dim(0) >= n_h && W_UV.dim(1) == c.d_c,
          "tensor 'W_UV' has shape " + shape_str(W_UV.shape) + "; expected [n_h d_v, d_c] with n_h = " +
              std::to_string(n_h) + ", d_c = " + std::to_string(c.d_c));
  c.d_v = W_UV.dim(0) / n_h;
  return m;
}

template <class S>
struct MlaCoreIn {
  MlaWeights<S> w;
  MlaProjected<S> p;
  Mat<S> C, K_R;
};

template <class S>
MlaCoreIn<S> mla_core_in(const Tensor<double>& q_C, const Tensor<double>& q_R, const Tensor<double>& C,
                         const Tensor<double>& K_R, const Tensor<double>& W_UK, const Tensor<double>& W_UV,
                         const MlaCore& m) {
  MlaCoreIn<S> in;
  in.w.W_UK = to_mat<S>(W_UK, "W_UK");
  in.w.W_UV = to_mat<S>(W_UV, "W_UV");
  in.p.q_C = to_mat<S>(q_C, "q_C");
  in.p.q_R = to_mat<S>(q_R, "q_R");
  in.C = to_mat<S>(C, "C");
  in.K_R = to_mat<S>(K_R, "K_R");
  in.p.c = in.C.bottomRows(static_cast<Eigen::Index>(m.T));  // the new tokens' latents (their count is T)
  return in;
}

MlaEval mla_eval(const std::string& eval) {
  if (eval == "absorbed") return MlaEval::absorbed;
  require(eval == "naive", "eval = '" + eval + "' is unknown; accepted: naive, absorbed");
  return MlaEval::naive;
}

template <class S>
Tensor<double> mla_attend_in(const Tensor<double>& q_C, const Tensor<double>& q_R, const Tensor<double>& C,
                             const Tensor<double>& K_R, const Tensor<double>& W_UK, const Tensor<double>& W_UV,
                             const MlaCore& m, MlaEval e) {
  const MlaCoreIn<S> in = mla_core_in<S>(q_C, q_R, C, K_R, W_UK, W_UV, m);
  const std::size_t pos0 = m.N - m.T;
  return from_mat<S>(e == MlaEval::absorbed ? mla_attend_absorbed<S>(m.cfg, in.w, in.p, in.C, in.K_R, pos0)
                                            : mla_attend_naive<S>(m.cfg, in.w, in.p, in.C, in.K_R, pos0));
}

template <class S>
MlaAttendGradResult mla_attend_backward_in(const Tensor<double>& q_C, const Tensor<double>& q_R,
                                           const Tensor<double>& C, const Tensor<double>& K_R,
                                           const Tensor<double>& W_UK, const Tensor<double>& W_UV,
                                           const Tensor<double>& dO, const MlaCore& m, MlaEval e) {
  const MlaCoreIn<S> in = mla_core_in<S>(q_C, q_R, C, K_R, W_UK, W_UV, m);
  const std::size_t pos0 = m.N - m.T;
  const Mat<S> dOm = to_mat<S>(dO, "dO");
  const MlaAttendGrad<S> g = e == MlaEval::absorbed
                                 ? mla_attend_absorbed_backward<S>(m.cfg, in.w, in.p, in.C, in.K_R, pos0, dOm)
                                 : mla_attend_naive_backward<S>(m.cfg, in.w, in.p, in.C, in.K_R, pos0, dOm);
  return {from_mat<S>(g.dq_C), from_mat<S>(g.dq_R), from_mat<S>(g.dC),
          from_mat<S>(g.dK_R), from_mat<S>(g.dW_UK), from_mat<S>(g.dW_UV)};
}

}  // namespace

KdaGradResult kda_recurrent_backward(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                                     const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0,
                                     const Tensor<double>& dO, const Tensor<double>* dS_T, double scale,
                                     const std::string& variant, std::size_t checkpoint, Precision p) {
  require_scale(scale);
  const KdaVariant var = parse_variant(variant);
  return p == Precision::mp50 ? recurrent_backward_in<mp50>(q, k, v, g, beta, S0, dO, dS_T, scale, var, checkpoint)
                              : recurrent_backward_in<double>(q, k, v, g, beta, S0, dO, dS_T, scale, var, checkpoint);
}

KdaGradResult kda_chunked_backward(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                                   const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0,
                                   const Tensor<double>& dO, const Tensor<double>* dS_T, double scale, std::size_t C,
                                   Precision p) {
  require_scale(scale);
  require(C >= 1, "C = 0 is not accepted; give a chunk size >= 1");
  return p == Precision::mp50 ? chunked_backward_in<mp50>(q, k, v, g, beta, S0, dO, dS_T, scale, C)
                              : chunked_backward_in<double>(q, k, v, g, beta, S0, dO, dS_T, scale, C);
}

Tensor<double> gate(const Tensor<double>& z, const Tensor<double>& A_log, const Tensor<double>& bias,
                    const std::string& kind, double g_min, Precision p) {
  const GateKind k = gate_kind(kind, g_min);
  if (p == Precision::mp50)
    return from_mat<mp50>(kdalab::gate<mp50>(to_mat<mp50>(z, "z"), to_vec<mp50>(A_log, "A_log"),
                                             to_mat<mp50>(bias, "bias"), k, mp50(g_min)));
  return from_mat<double>(kdalab::gate<double>(to_mat<double>(z, "z"), to_vec<double>(A_log, "A_log"),
                                               to_mat<double>(bias, "bias"), k, g_min));
}

GateGradResult gate_backward(const Tensor<double>& z, const Tensor<double>& A_log, const Tensor<double>& bias,
                             const Tensor<double>& dg, const std::string& kind, double g_min, Precision p) {
  const GateKind k = gate_kind(kind, g_min);
  require_finite(dg, "dg");
  const auto run = [&](auto zero) {
    using S = decltype(zero);
    const GateGrad<S> r = kdalab::gate_backward<S>(to_mat<S>(z, "z"), to_vec<S>(A_log, "A_log"), to_mat<S>(bias, "bias"),
                                                   k, to_mat<S>(dg, "dg"), S(g_min));
    return GateGradResult{from_mat<S>(r.dz), from_vec<S>(r.dA_log), from_mat<S>(r.dbias)};
  };
  return p == Precision::mp50 ? run(mp50(0)) : run(0.0);
}

AttnResGradResult attn_res_backward(const Tensor<double>& v, const Tensor<double>& w, const Tensor<double>& dh,
                                    const std::string& mode, std::size_t block_sources, double eps, Precision p) {
  const AttnResConfig cfg = attn_res_config(v, w, mode, block_sources, eps);
  require(dh.rank() == 2 && dh.dim(0) == v.dim(1) && dh.dim(1) == v.dim(2),
          "tensor 'dh' has shape " + shape_str(dh.shape) + "; expected [T, d] = " + shape_str({v.dim(1), v.dim(2)}));
  require_finite(dh, "dh");
  return p == Precision::mp50 ? attn_res_backward_in<mp50>(v, w, dh, cfg) : attn_res_backward_in<double>(v, w, dh, cfg);
}

Tensor<double> mla_attend(const Tensor<double>& q_C, const Tensor<double>& q_R, const Tensor<double>& C,
                          const Tensor<double>& K_R, const Tensor<double>& W_UK, const Tensor<double>& W_UV,
                          std::size_t n_h, const std::string& eval, Precision p) {
  const MlaEval e = mla_eval(eval);
  const MlaCore m = mla_core(q_C, q_R, C, K_R, W_UK, W_UV, n_h);
  return p == Precision::mp50 ? mla_attend_in<mp50>(q_C, q_R, C, K_R, W_UK, W_UV, m, e)
                              : mla_attend_in<double>(q_C, q_R, C, K_R, W_UK, W_UV, m, e);
}

MlaAttendGradResult mla_attend_backward(const Tensor<double>& q_C, const Tensor<double>& q_R,
                                        const Tensor<double>& C, const Tensor<double>& K_R,
                                        const Tensor<double>& W_UK, const Tensor<double>& W_UV,
                                        const Tensor<double>& dO, std::size_t n_h, const std::string& eval,
                                        Precision p) {
  const MlaEval e = mla_eval(eval);
  const MlaCore m = mla_core(q_C, q_R, C, K_R, W_UK, W_UV, n_h);
  require(dO.rank() == 2 && dO.dim(0) == m.T && dO.dim(1) == n_h * m.cfg.d_v,
          "tensor 'dO' has shape " + shape_str(dO.shape) + "; expected [T, n_h d_v] = " +
              shape_str({m.T, n_h * m.cfg.d_v}));
  require_finite(dO, "dO");
  return p == Precision::mp50 ? mla_attend_backward_in<mp50>(q_C, q_R, C, K_R, W_UK, W_UV, dO, m, e)
                              : mla_attend_backward_in<double>(q_C, q_R, C, K_R, W_UK, W_UV, dO, m, e);
}

}  // namespace kdalab::py
