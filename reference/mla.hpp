#pragma once
/// Gated Multi-head Latent Attention (DeepSeek-V2 §2.1 Eqs. 9-19; K3 report Eq. 7;
/// docs/equations.md, Gated MLA), one sequence at a time, templated on the scalar (float, double, mp50).
///
/// Per token t with input x_t in R^d (d = hidden_size), n_h heads:
///     c_t   = W_DKV x_t                          in R^{d_c}   (the latent; d_c = kv_lora_rank)
///     k^C_t = W_UK c_t                           in R^{n_h d_nope}, split by head into k^C_{t,i}
///     v^C_t = W_UV c_t                           in R^{n_h d_v},    split by head into v^C_{t,i}
///     q_t   = W_Q x_t  or  W_UQ (W_DQ x_t)       in R^{n_h (d_nope + d_rope)}   (q_lora_rank d_cq > 0)
///             head i: q_{t,i} = [q^C_{t,i} (d_nope) ; q^R_{t,i} (d_rope)]
///     k^R_t = W_KR x_t                           in R^{d_rope}, shared by all heads (DeepSeek-V2 Eq. 15)
///     s_{t,tau,i} = (q^C_{t,i} . k^C_{tau,i} + q^R_{t,i} . k^R_tau) * scale,  scale = 1/sqrt(d_nope + d_rope)
///     o_{t,i} = sum_{tau <= t} softmax_tau(s_{t,tau,i}) v^C_{tau,i}                (causal)
///     y_t   = W_o [ Sigmoid(W_g x_t) ⊙ o_t ]      (gate elementwise over the n_h d_v channels; K3 Eq. 7)
///             y_t = W_o o_t when the output gate is off (Kimi Linear).
/// Positions: d_rope = 0 is pure latent MLA (docs/equations.md, Gated MLA, taken literally). With d_rope > 0 and
/// `rope` off ("mla_use_nope": true, Kimi Linear / K3: NoPE) the shared key part is kept but never
/// rotated; with `rope` on, q^R and k^R are rotated by the DeepSeek-V2 decoupled RoPE at the token's
/// absolute position (pairs (2j, 2j+1), frequency rope_theta^(-2j / d_rope)).
/// The per-token cache is [c_t ; k^R_t]: d_c + d_rope numbers (vs n_h (d_nope + d_rope + d_v) for MHA).
///
/// Evaluations (all must agree to rounding; tests/unit/test_mla.cpp):
///   naive      reconstruct k^C, v^C for every cached token, then softmax attention per head;
///   absorbed   fold W_UK into the query, q~_{t,i} = W_UK,i^T q^C_{t,i} (d_c wide), attend directly
///              over the latent cache (MQA with one d_c-wide head, still scaled by 1/sqrt(d_nope + d_rope)),
///              then apply W_UV,i to the attended latent per head. W_UV cannot be folded into W_o because
///              the gate sits between them;
///   streaming  the absorbed form with an online softmax over key tiles (running max, sum, accumulator):
///              never materialises a T x T (or T x N) score matrix.
/// A prefill of T tokens appends to the cache and attends over everything cached before it (so a
/// chunked prefill and a token-by-token decode are the same computation); decode is a one-token
/// absorbed step over the latent cache.
///
/// Matrices are Mat<S> (row-major); a sequence is X [T, d], one row per token. Weight matrices are
/// [out, in] (y = W x). No I/O.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "reference/error.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

/// Shapes of one Gated MLA layer (HF config.json names in brackets).
struct MlaConfig {
  std::size_t hidden = 0;   ///< d [hidden_size]
  std::size_t n_h = 0;      ///< heads [num_attention_heads]
  std::size_t d_c = 0;      ///< KV latent width [kv_lora_rank]; must be >= 1
  std::size_t d_cq = 0;     ///< query latent width [q_lora_rank]; 0 = full-rank W_Q (Kimi Linear: null)
  std::size_t d_nope = 0;   ///< per-head key/query width from the latent [qk_nope_head_dim]
  std::size_t d_rope = 0;   ///< decoupled shared key / per-head query width [qk_rope_head_dim]; 0 = none
  std::size_t d_v = 0;      ///< per-head value width [v_head_dim]
  bool rope = false;        ///< rotate the d_rope part (DeepSeek-V2) [!mla_use_nope]
  double rope_theta = 10000.0;  ///< RoPE base [rope_theta]
  bool output_gate = true;  ///< y = W_o[Sigmoid(W_g x) ⊙ o] (K3) vs y = W_o o [mla_use_output_gate]

  std::size_t d_qk() const { return d_nope + d_rope; }
};

/// Checks an MlaConfig: every width >= 1 except d_cq and d_rope (>= 0), d_rope even when rope is on,
/// rope_theta > 0. Throws kdalab::Error naming the field (and its config.json key) and the value.
inline void mla_validate_config(const MlaConfig& c) {
  auto need = [](std::size_t v, const char* name) {
    require(v >= 1, std::string("MLA ") + name + " = " + std::to_string(v) + "; accepted: >= 1");
  };
  need(c.hidden, "hidden (hidden_size)");
  need(c.n_h, "n_h (num_attention_heads)");
  need(c.d_c, "d_c (kv_lora_rank)");
  need(c.d_nope, "d_nope (qk_nope_head_dim)");
  need(c.d_v, "d_v (v_head_dim)");
  require(!c.rope || c.d_rope % 2 == 0,
          "MLA d_rope (qk_rope_head_dim) = " + std::to_string(c.d_rope) + " with RoPE on; accepted: an even width");
  require(c.rope_theta > 0, "MLA rope_theta = " + std::to_string(c.rope_theta) + "; accepted: > 0");
}

/// Weights of one Gated MLA layer, each [out, in]:
///   W_DKV [d_c, d]; W_KR [d_rope, d]; W_Q [n_h d_qk, d] (d_cq = 0) or W_DQ [d_cq, d] and W_UQ [n_h d_qk, d_cq];
///   W_UK [n_h d_nope, d_c]; W_UV [n_h d_v, d_c]; W_g [n_h d_v, d] (output gate only); W_o [d, n_h d_v].
/// Head i owns rows [i d_qk, (i+1) d_qk) of W_Q/W_UQ (first d_nope of them for q^C), rows
/// [i d_nope, (i+1) d_nope) of W_UK and [i d_v, (i+1) d_v) of W_UV and W_g.
template <class S>
struct MlaWeights {
  Mat<S> W_DKV, W_KR, W_Q, W_DQ, W_UQ, W_UK, W_UV, W_g, W_o;

  template <class R>
  MlaWeights<R> cast() const {
    MlaWeights<R> r;
    r.W_DKV = W_DKV.template cast<R>(); r.W_KR = W_KR.template cast<R>(); r.W_Q = W_Q.template cast<R>();
    r.W_DQ = W_DQ.template cast<R>(); r.W_UQ = W_UQ.template cast<R>(); r.W_UK = W_UK.template cast<R>();
    r.W_UV = W_UV.template cast<R>(); r.W_g = W_g.template cast<R>(); r.W_o = W_o.template cast<R>();
    return r;
  }
};

namespace detail {
template <class S>
void require_mat(const Mat<S>& m, std::size_t rows, std::size_t cols, const std::string& name, const std::string& why) {
  if (static_cast<std::size_t>(m.rows()) != rows || static_cast<std::size_t>(m.cols()) != cols)
    throw Error("MLA weight '" + name + "' has shape [" + std::to_string(m.rows()) + ", " + std::to_string(m.cols()) +
                "], expected [" + std::to_string(rows) + ", " + std::to_string(cols) + "] (" + why + ")");
}
template <class S>
void require_finite_mat(const Mat<S>& m, const std::string& name) {
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c) {
      const double x = static_cast<double>(m(r, c));
      if (!std::isfinite(x))
        throw Error("'" + name + "' has a non-finite value (" + std::to_string(x) + ") at [" + std::to_string(r) +
                    ", " + std::to_string(c) + "]; only finite values are accepted");
    }
}
}  // namespace detail

/// Checks that every weight has the shape the config implies (projection shapes that disagree, e.g.
/// W_UK not d_c wide, are refused) and is finite. Heads need not divide the hidden size
/// (Kimi Linear: 2304 -> 32 x 192). Throws kdalab::Error naming the weight, its shape and the expected one.
template <class S>
void mla_validate(const MlaConfig& c, const MlaWeights<S>& w) {
  mla_validate_config(c);
  const std::size_t d = c.hidden, nq = c.n_h * c.d_qk(), nv = c.n_h * c.d_v;
  detail::require_mat(w.W_DKV, c.d_c, d, "W_DKV", "[d_c, hidden]");
  detail::require_mat(w.W_KR, c.d_rope, d, "W_KR", "[d_rope, hidden]");
  if (c.d_cq == 0) {
    detail::require_mat(w.W_Q, nq, d, "W_Q", "[n_h (d_nope + d_rope), hidden], q_lora_rank = 0");
  } else {
    detail::require_mat(w.W_DQ, c.d_cq, d, "W_DQ", "[q_lora_rank, hidden]");
    detail::require_mat(w.W_UQ, nq, c.d_cq, "W_UQ", "[n_h (d_nope + d_rope), q_lora_rank]");
  }
  detail::require_mat(w.W_UK, c.n_h * c.d_nope, c.d_c, "W_UK", "[n_h d_nope, d_c]");
  detail::require_mat(w.W_UV, nv, c.d_c, "W_UV", "[n_h d_v, d_c]");
  if (c.output_gate) detail::require_mat(w.W_g, nv, d, "W_g", "[n_h d_v, hidden], output gate on");
  detail::require_mat(w.W_o, d, nv, "W_o", "[hidden, n_h d_v]");
  for (auto [m, n] : {std::pair{&w.W_DKV, "W_DKV"}, {&w.W_KR, "W_KR"}, {&w.W_Q, "W_Q"}, {&w.W_DQ, "W_DQ"},
                      {&w.W_UQ, "W_UQ"}, {&w.W_UK, "W_UK"}, {&w.W_UV, "W_UV"}, {&w.W_g, "W_g"}, {&w.W_o, "W_o"}})
    detail::require_finite_mat(*m, std::string("MLA weight ") + n);
}

/// Random weights N(0, std^2) per entry, drawn in the fixed order W_DKV, W_KR, W_Q | (W_DQ, W_UQ), W_UK,
/// W_UV, W_g, W_o (row-major) from `normal` (a callable returning N(0,1) doubles, e.g. a seeded
/// kdalab::Rng). std <= 0 means 1/sqrt(fan_in) per matrix (unit-variance activations, for tests);
/// the Kimi reports use a fixed initializer_range (0.02). Throws like mla_validate_config.
template <class S, class Normal>
MlaWeights<S> mla_random_weights(const MlaConfig& c, Normal&& normal, double std = 0.0) {
  mla_validate_config(c);
  auto draw = [&](std::size_t r, std::size_t k) {
    Mat<S> m(r, k);
    const double s = std > 0 ? std : 1.0 / std::sqrt(static_cast<double>(k));
    for (std::size_t i = 0; i < r; ++i)
      for (std::size_t j = 0; j < k; ++j) m(i, j) = S(s * normal());
    return m;
  };
  const std::size_t d = c.hidden, nq = c.n_h * c.d_qk(), nv = c.n_h * c.d_v;
  MlaWeights<S> w;
  w.W_DKV = draw(c.d_c, d);
  w.W_KR = draw(c.d_rope, d);
  if (c.d_cq == 0) {
    w.W_Q = draw(nq, d);
  } else {
    w.W_DQ = draw(c.d_cq, d);
    w.W_UQ = draw(nq, c.d_cq);
  }
  w.W_UK = draw(c.n_h * c.d_nope, c.d_c);
  w.W_UV = draw(nv, c.d_c);
  if (c.output_gate) w.W_g = draw(nv, d);
  w.W_o = draw(d, nv);
  return w;
}

/// The per-sequence latent cache of one MLA layer: rows [0, len) of c [capacity, d_c] and
/// k_R [capacity, d_rope] hold c_tau and the (rotated) shared key k^R_tau of the tokens seen so far.
/// Positions are implicit: row tau is absolute position tau.
template <class S>
struct MlaCache {
  std::size_t capacity = 0, len = 0;
  Mat<S> c, k_R;

  MlaCache() = default;
  /// Empty cache for `capacity` tokens. Throws kdalab::Error if capacity is 0.
  MlaCache(const MlaConfig& cfg, std::size_t cap) : capacity(cap), c(cap, cfg.d_c), k_R(cap, cfg.d_rope) {
    require(cap >= 1, "MLA cache capacity = 0; accepted: >= 1 token");
  }
};

/// How mla_prefill evaluates attention (all equal to rounding).
enum class MlaEval { naive, absorbed, streaming };

inline std::string mla_eval_name(MlaEval e) {
  switch (e) {
    case MlaEval::naive: return "naive";
    case MlaEval::absorbed: return "absorbed";
    case MlaEval::streaming: return "streaming";
  }
  return "?";
}

/// Rotates a d_rope-wide row in place by the RoPE angle of absolute position `pos`
/// (RoFormer Eq. 34 on pairs (2j, 2j+1), theta_j = base^(-2j/d_rope); DeepSeek-V2 Eq. 14-15).
template <class S, class Row>
void rope_rotate(Row&& r, std::size_t pos, double base) {
  const Eigen::Index n = r.size();
  for (Eigen::Index j = 0; j + 1 < n; j += 2) {
    // angle = pos * base^(-j/n), evaluated in S so that mp50 stays exact to its own precision
    const S ang = S(static_cast<double>(pos)) * sexp<S>(S(-static_cast<double>(j) / static_cast<double>(n)) * slog<S>(S(base)));
    using std::cos; using std::sin; using boost::multiprecision::cos; using boost::multiprecision::sin;
    const S cs = S(cos(ang)), sn = S(sin(ang));
    const S a = r(j), b = r(j + 1);
    r(j) = a * cs - b * sn;
    r(j + 1) = a * sn + b * cs;
  }
}

/// Projections of T new tokens at absolute positions pos0 .. pos0+T-1.
/// q_C [T, n_h d_nope], q_R [T, n_h d_rope] (rotated), c [T, d_c], k_R [T, d_rope] (rotated),
/// gate [T, n_h d_v] = Sigmoid(W_g x) (empty when the gate is off).
template <class S>
struct MlaProjected {
  Mat<S> q_C, q_R, c, k_R, gate;
};

/// Computes MlaProjected for X [T, hidden] (DeepSeek-V2 Eqs. 9-16). No checks (callers validate).
template <class S>
MlaProjected<S> mla_project(const MlaConfig& cfg, const MlaWeights<S>& w, const Mat<S>& X, std::size_t pos0) {
  const Eigen::Index T = X.rows();
  const Eigen::Index nh = cfg.n_h, dn = cfg.d_nope, dr = cfg.d_rope, dqk = cfg.d_qk();
  MlaProjected<S> p;
  const Mat<S> Q = cfg.d_cq == 0 ? Mat<S>(X * w.W_Q.transpose()) : Mat<S>((X * w.W_DQ.transpose()) * w.W_UQ.transpose());
  p.q_C.resize(T, nh * dn);
  p.q_R.resize(T, nh * dr);
  for (Eigen::Index i = 0; i < nh; ++i) {
    p.q_C.middleCols(i * dn, dn) = Q.middleCols(i * dqk, dn);
    p.q_R.middleCols(i * dr, dr) = Q.middleCols(i * dqk + dn, dr);
  }
  p.c = X * w.W_DKV.transpose();
  p.k_R = X * w.W_KR.transpose();
  if (cfg.rope && dr > 0)
    for (Eigen::Index t = 0; t < T; ++t) {
      rope_rotate<S>(p.k_R.row(t), pos0 + t, cfg.rope_theta);
      for (Eigen::Index i = 0; i < nh; ++i) rope_rotate<S>(p.q_R.row(t).segment(i * dr, dr), pos0 + t, cfg.rope_theta);
    }
  if (cfg.output_gate) {
    p.gate = X * w.W_g.transpose();
    p.gate = p.gate.unaryExpr([](const S& z) { return sigmoid<S>(z); });
  }
  return p;
}

/// Softmax scale 1/sqrt(d_nope + d_rope) (DeepSeek-V2 Eq. 17; = 1/sqrt(d_h) under NoPE without k^R).
template <class S>
S mla_scale(const MlaConfig& cfg) { return S(1) / ssqrt<S>(S(static_cast<double>(cfg.d_qk()))); }

namespace detail {
/// In-place causal row softmax of scores [T, N] where query row t sits at absolute position pos0+t.
template <class S>
void causal_softmax_rows(Mat<S>& P, std::size_t pos0) {
  for (Eigen::Index t = 0; t < P.rows(); ++t) {
    const Eigen::Index n = static_cast<Eigen::Index>(pos0) + t + 1;
    const S m = P.row(t).head(n).maxCoeff();
    S l = S(0);
    for (Eigen::Index j = 0; j < n; ++j) { P(t, j) = sexp<S>(S(P(t, j) - m)); l += P(t, j); }
    P.row(t).head(n) /= l;
    for (Eigen::Index j = n; j < P.cols(); ++j) P(t, j) = S(0);
  }
}
}  // namespace detail

/// Naive attention: reconstructs k^C = C W_UK^T and v^C = C W_UV^T for all N cached latents
/// (C [N, d_c], K_R [N, d_rope], N = pos0 + T) and runs causal softmax per head.
/// Returns o [T, n_h d_v] (ungated). Forms a T x N score matrix per head.
template <class S>
Mat<S> mla_attend_naive(const MlaConfig& cfg, const MlaWeights<S>& w, const MlaProjected<S>& p, const Mat<S>& C,
                        const Mat<S>& K_R, std::size_t pos0) {
  const Eigen::Index T = p.c.rows(), nh = cfg.n_h, dn = cfg.d_nope, dr = cfg.d_rope, dv = cfg.d_v;
  const Mat<S> K = C * w.W_UK.transpose();  // [N, n_h d_nope]
  const Mat<S> V = C * w.W_UV.transpose();  // [N, n_h d_v]
  const S scale = mla_scale<S>(cfg);
  Mat<S> O(T, nh * dv);
  for (Eigen::Index i = 0; i < nh; ++i) {
    Mat<S> P = p.q_C.middleCols(i * dn, dn) * K.middleCols(i * dn, dn).transpose();
    if (dr > 0) P += p.q_R.middleCols(i * dr, dr) * K_R.transpose();
    P *= scale;
    detail::causal_softmax_rows(P, pos0);
    O.middleCols(i * dv, dv) = P * V.middleCols(i * dv, dv);
  }
  return O;
}

/// Absorbed attention (docs/equations.md, Gated MLA): q~_i = q^C_i W_UK,i ([T, d_c]), scores over the latent
/// cache C [N, d_c] plus q^R_i K_R^T, causal softmax, attended latent a_i = P C, o_i = a_i W_UV,i^T.
/// Returns o [T, n_h d_v] (ungated).
template <class S>
Mat<S> mla_attend_absorbed(const MlaConfig& cfg, const MlaWeights<S>& w, const MlaProjected<S>& p, const Mat<S>& C,
                           const Mat<S>& K_R, std::size_t pos0) {
  const Eigen::Index T = p.c.rows(), nh = cfg.n_h, dn = cfg.d_nope, dr = cfg.d_rope, dv = cfg.d_v;
  const S scale = mla_scale<S>(cfg);
  Mat<S> O(T, nh * dv);
  for (Eigen::Index i = 0; i < nh; ++i) {
    const Mat<S> q_abs = p.q_C.middleCols(i * dn, dn) * w.W_UK.middleRows(i * dn, dn);  // [T, d_c]
    Mat<S> P = q_abs * C.transpose();
    if (dr > 0) P += p.q_R.middleCols(i * dr, dr) * K_R.transpose();
    P *= scale;
    detail::causal_softmax_rows(P, pos0);
    const Mat<S> A = P * C;                                                // [T, d_c]
    O.middleCols(i * dv, dv) = A * w.W_UV.middleRows(i * dv, dv).transpose();
  }
  return O;
}

/// Streaming absorbed attention: for each head and query, an online softmax over key tiles of
/// `tile` tokens (running max m, normaliser l, d_c-wide accumulator; rescaled by e^(m_old - m_new)
/// when the max grows; Milakov & Gimelshein 2018; FlashAttention Alg. 1). Holds at most one tile
/// of scores: never a T x T matrix. Returns o [T, n_h d_v]. Throws kdalab::Error if tile is 0.
template <class S>
Mat<S> mla_attend_streaming(const MlaConfig& cfg, const MlaWeights<S>& w, const MlaProjected<S>& p, const Mat<S>& C,
                            const Mat<S>& K_R, std::size_t pos0, std::size_t tile) {
  require(tile >= 1, "MLA streaming tile = 0; accepted: >= 1 token");
  const Eigen::Index T = p.c.rows(), nh = cfg.n_h, dn = cfg.d_nope, dr = cfg.d_rope, dv = cfg.d_v, dc = cfg.d_c;
  const S scale = mla_scale<S>(cfg);
  Mat<S> O(T, nh * dv);
  for (Eigen::Index i = 0; i < nh; ++i) {
    const Mat<S> q_abs = p.q_C.middleCols(i * dn, dn) * w.W_UK.middleRows(i * dn, dn);
    for (Eigen::Index t = 0; t < T; ++t) {
      const Eigen::Index n = static_cast<Eigen::Index>(pos0) + t + 1;
      S m = S(0), l = S(0);
      bool first = true;
      Vec<S> acc = Vec<S>::Zero(dc);
      for (Eigen::Index j0 = 0; j0 < n; j0 += static_cast<Eigen::Index>(tile)) {
        const Eigen::Index b = std::min<Eigen::Index>(static_cast<Eigen::Index>(tile), n - j0);
        Vec<S> s = C.middleRows(j0, b) * q_abs.row(t).transpose();
        if (dr > 0) s += K_R.middleRows(j0, b) * p.q_R.row(t).segment(i * dr, dr).transpose();
        s *= scale;
        const S m_tile = s.maxCoeff();
        const S m_new = first || m_tile > m ? m_tile : m;
        const S corr = first ? S(0) : sexp<S>(S(m - m_new));
        acc *= corr;
        l *= corr;
        for (Eigen::Index j = 0; j < b; ++j) {
          const S e = sexp<S>(S(s(j) - m_new));
          l += e;
          acc.noalias() += e * C.row(j0 + j).transpose();
        }
        m = m_new;
        first = false;
      }
      acc /= l;
      O.row(t).segment(i * dv, dv) = (w.W_UV.middleRows(i * dv, dv) * acc).transpose();
    }
  }
  return O;
}

/// Output projection y = W_o [gate ⊙ o] (K3 report Eq. 7), or W_o o without the gate. [T, hidden].
template <class S>
Mat<S> mla_output(const MlaConfig& cfg, const MlaWeights<S>& w, const MlaProjected<S>& p, const Mat<S>& O) {
  if (cfg.output_gate) return Mat<S>(p.gate.cwiseProduct(O) * w.W_o.transpose());
  return Mat<S>(O * w.W_o.transpose());
}

/// Prefill: runs Gated MLA on X [T, hidden] as the tokens at positions cache.len .. cache.len+T-1,
/// appending their latents to `cache` and attending over everything in it. Returns y [T, hidden].
/// `tile` is the key-tile length of MlaEval::streaming. Errors (kdalab::Error, cache unchanged):
/// X not [T >= 1, hidden] or non-finite; the cache would pass its capacity; bad weight shapes.
template <class S>
Mat<S> mla_prefill(const MlaConfig& cfg, const MlaWeights<S>& w, const Mat<S>& X, MlaCache<S>& cache,
                   MlaEval eval = MlaEval::naive, std::size_t tile = 16) {
  mla_validate(cfg, w);
  require(X.rows() >= 1 && static_cast<std::size_t>(X.cols()) == cfg.hidden,
          "MLA input 'x' has shape [" + std::to_string(X.rows()) + ", " + std::to_string(X.cols()) +
              "], expected [T >= 1, hidden = " + std::to_string(cfg.hidden) + "]");
  detail::require_finite_mat(X, "MLA input x");
  require(eval != MlaEval::streaming || tile >= 1, "MLA streaming tile = 0; accepted: >= 1 token");
  require(static_cast<std::size_t>(cache.c.cols()) == cfg.d_c && static_cast<std::size_t>(cache.k_R.cols()) == cfg.d_rope,
          "MLA cache has widths d_c = " + std::to_string(cache.c.cols()) + ", d_rope = " + std::to_string(cache.k_R.cols()) +
              "; this layer needs d_c = " + std::to_string(cfg.d_c) + ", d_rope = " + std::to_string(cfg.d_rope));
  const std::size_t T = X.rows(), pos0 = cache.len;
  if (pos0 + T > cache.capacity)
    throw Error("MLA latent cache is full: capacity " + std::to_string(cache.capacity) + " tokens, holds " +
                std::to_string(pos0) + ", cannot take " + std::to_string(T) +
                " more (decode/prefill past capacity; allocate a larger cache)");
  const MlaProjected<S> p = mla_project(cfg, w, X, pos0);
  cache.c.middleRows(pos0, T) = p.c;
  cache.k_R.middleRows(pos0, T) = p.k_R;
  cache.len = pos0 + T;
  const Mat<S> C = cache.c.topRows(cache.len), K_R = cache.k_R.topRows(cache.len);
  Mat<S> O;
  switch (eval) {
    case MlaEval::naive: O = mla_attend_naive(cfg, w, p, C, K_R, pos0); break;
    case MlaEval::absorbed: O = mla_attend_absorbed(cfg, w, p, C, K_R, pos0); break;
    case MlaEval::streaming: O = mla_attend_streaming(cfg, w, p, C, K_R, pos0, tile); break;
  }
  return mla_output(cfg, w, p, O);
}

/// Decode step: one token x_t [hidden] at position cache.len, absorbed attention over the latent
/// cache (docs/equations.md, Gated MLA). Returns y_t [hidden]. Errors as mla_prefill; in particular a
/// step past the cache capacity throws kdalab::Error and leaves the cache unchanged.
template <class S>
Vec<S> mla_decode(const MlaConfig& cfg, const MlaWeights<S>& w, const Vec<S>& x_t, MlaCache<S>& cache) {
  const Mat<S> X = x_t.transpose();
  return mla_prefill(cfg, w, X, cache, MlaEval::absorbed).row(0).transpose();
}

/// One Gated MLA layer (config + weights) with the prefill/decode interface the hybrid stack uses.
template <class S>
struct MlaLayer {
  MlaConfig cfg;
  MlaWeights<S> w;
  using Cache = MlaCache<S>;
  /// A fresh cache for `capacity` tokens.
  Cache make_cache(std::size_t capacity) const { return Cache(cfg, capacity); }
  Mat<S> prefill(const Mat<S>& X, Cache& cache, MlaEval eval = MlaEval::naive) const { return mla_prefill(cfg, w, X, cache, eval); }
  Vec<S> decode(const Vec<S>& x_t, Cache& cache) const { return mla_decode(cfg, w, x_t, cache); }
};

// ---- cache footprint (numbers, not bytes: multiply by the element size) -----------------------

/// Numbers cached per token by one MLA layer: d_c + d_rope (DeepSeek-V2 §2.1.3: (d_c + d_h^R) per layer).
inline std::size_t mla_cache_values_per_token(const MlaConfig& c) { return c.d_c + c.d_rope; }
/// Numbers cached per token by the same layer as plain MHA: keys n_h (d_nope + d_rope) plus values
/// n_h d_v (= 2 n_h d_h when the widths agree; DeepSeek-V2 Table 1).
inline std::size_t mha_cache_values_per_token(const MlaConfig& c) { return c.n_h * (c.d_qk() + c.d_v); }
/// Numbers a KDA layer keeps per sequence regardless of its length: the state H d_k d_v plus the
/// ShortConv tails of q, k and v ((kernel - 1) inputs of widths H d_k, H d_k, H d_v). Constant in T.
inline std::size_t kda_state_values(std::size_t H, std::size_t d_k, std::size_t d_v, std::size_t conv_kernel) {
  return H * d_k * d_v + (conv_kernel > 0 ? conv_kernel - 1 : 0) * H * (2 * d_k + d_v);
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_MLA(X, S) \
  X template void mla_validate<S>(const MlaConfig&, const MlaWeights<S>&); \
  X template MlaProjected<S> mla_project<S>(const MlaConfig&, const MlaWeights<S>&, const Mat<S>&, std::size_t); \
  X template void detail::causal_softmax_rows<S>(Mat<S>&, std::size_t); \
  X template Mat<S> mla_attend_naive<S>(const MlaConfig&, const MlaWeights<S>&, const MlaProjected<S>&, \
      const Mat<S>&, const Mat<S>&, std::size_t); \
  X template Mat<S> mla_attend_absorbed<S>(const MlaConfig&, const MlaWeights<S>&, const MlaProjected<S>&, \
      const Mat<S>&, const Mat<S>&, std::size_t); \
  X template Mat<S> mla_attend_streaming<S>(const MlaConfig&, const MlaWeights<S>&, const MlaProjected<S>&, \
      const Mat<S>&, const Mat<S>&, std::size_t, std::size_t); \
  X template Mat<S> mla_output<S>(const MlaConfig&, const MlaWeights<S>&, const MlaProjected<S>&, const Mat<S>&); \
  X template Mat<S> mla_prefill<S>(const MlaConfig&, const MlaWeights<S>&, const Mat<S>&, MlaCache<S>&, MlaEval, \
      std::size_t); \
  X template Vec<S> mla_decode<S>(const MlaConfig&, const MlaWeights<S>&, const Vec<S>&, MlaCache<S>&);
KDALAB_TEMPLATES_MLA(extern, double)
KDALAB_TEMPLATES_MLA(extern, mp50)

}  // namespace kdalab
