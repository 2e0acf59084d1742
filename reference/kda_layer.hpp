#pragma once
/// The full KDA layer (K3 report Eqs. 2, 5, 6; Kimi Linear report; docs/equations.md, gates, KDA layer):
///
///   q = L2Norm(Swish(ShortConv(W_q x)))      [T, H  d_k]   (per key head, eps l2_eps)
///   k = L2Norm(Swish(ShortConv(W_k x)))      [T, H  d_k]
///   v = Swish(ShortConv(W_v x))              [T, HV d_v]
///   beta = Sigmoid(W_beta x)                 [T, HV]
///   z = W_a_up W_a_down x  (gate_input x)  or  W_alpha v  (gate_input v, K3 report Eq. 2)
///   g = g_min Sigmoid(e^{A_h} (z + b))  (bounded, K3)  or  -e^{A_h} Softplus(z + dt_bias)  (softplus)
///   o = KDA(q, k, v, g, beta; S)  with scale = d_k^-1/2 unless set   [T, HV d_v]
///   y = W_o [ Sigmoid(W_g x) ⊙ RMSNorm(o) ]  (RMSNorm per value head, weight [d_v]) [T, hidden]
///
/// Grouped value heads: HV is a multiple of H; value head j reads key head j / (HV / H) and has its
/// own g, beta and state. Prefill runs the chunked form (reference/kda_chunk.hpp) with chunk size
/// `chunk` (0 = the recurrence); decode runs one recurrence step. The cache of a sequence is the
/// KDA state (HV matrices d_k x d_v, K3 report Eq. 1 orientation) plus the ShortConv tails of q, k
/// and v (the last K - 1 pre-convolution projections), so prefill(x[:T1]) then decode of each later
/// token equals prefill(x) up to rounding. Matrices are token-major (row t = token t); weights W
/// act as y = x W^T (W: [out, in]).
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>

#include "reference/gate.hpp"
#include "reference/kda.hpp"
#include "reference/kda_chunk.hpp"
#include "reference/layers.hpp"

namespace kdalab {

/// Shapes and options of a KDA layer. scale = 0 means d_k^-1/2; gate_rank = 0 means d_k (the
/// low-rank width of z from x); chunk = 0 runs prefill through the recurrence.
struct KdaConfig {
  std::size_t hidden = 0, H = 0, HV = 0, d_k = 0, d_v = 0;
  GateKind gate = GateKind::bounded;
  double g_min = -5.0;
  GateInput gate_input = GateInput::from_x;
  std::size_t gate_rank = 0;
  std::size_t conv_kernel = 4;
  double l2_eps = 1e-6, rms_eps = 1e-5;
  double scale = 0.0;
  std::size_t chunk = 64;
  TriInverse inverse = TriInverse::forward_substitution;

  std::size_t rank() const { return gate_rank ? gate_rank : d_k; }
  double effective_scale() const { return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(d_k)); }
  /// Throws kdalab::Error naming the option (hidden, H, HV, d_k, d_v, g_min, conv_kernel, l2_eps,
  /// rms_eps, scale) when it is out of range, and HV when it is not a multiple of H.
  void validate() const {
    for (auto [name, val] : {std::pair<const char*, std::size_t>{"hidden", hidden}, {"H", H}, {"HV", HV}, {"d_k", d_k},
                             {"d_v", d_v}, {"conv_kernel", conv_kernel}})
      require(val >= 1, std::string("KdaConfig: option '") + name + "' = 0; accepted: >= 1");
    require(HV % H == 0, "KdaConfig: option 'HV' = " + std::to_string(HV) + " value heads is not a multiple of 'H' = " +
                             std::to_string(H) + " key heads (grouped value heads need HV = m H)");
    require(gate != GateKind::bounded || g_min < 0.0,
            "KdaConfig: option 'g_min' = " + num_str(g_min) + "; accepted for the bounded gate: g_min < 0");
    require(l2_eps >= 0 && rms_eps >= 0, "KdaConfig: options 'l2_eps' and 'rms_eps' must be >= 0");
    require(scale >= 0, "KdaConfig: option 'scale' = " + num_str(scale) + "; accepted: > 0, or 0 for d_k^-1/2");
  }
};

/// Weights of a KDA layer (shapes for KdaConfig c, r = c.rank(), K = c.conv_kernel):
/// W_q, W_k [H d_k, hidden]; W_v [HV d_v, hidden]; conv_q, conv_k [H d_k, K]; conv_v [HV d_v, K];
/// W_beta [HV, hidden]; W_a_down [r, hidden] and W_a_up [HV d_k, r] (gate from x); W_alpha
/// [HV d_k, HV d_v] (gate from v); A_log [HV]; g_bias [HV, d_k] (b of the bounded gate, dt_bias of
/// the softplus gate); rms_w [d_v]; W_g [HV d_v, hidden]; W_o [hidden, HV d_v]. Both gate-input
/// weights are always present; the config picks which one is used.
template <class S>
struct KdaWeights {
  Mat<S> W_q, W_k, W_v, conv_q, conv_k, conv_v, W_beta, W_a_down, W_a_up, W_alpha, g_bias, W_g, W_o;
  Vec<S> A_log, rms_w;

  /// Seeded random weights: drawn in float64 with boost::random::mt19937_64(seed) and Boost's
  /// normal / uniform distributions (the engine of numerics/random.hpp's Rng) in the member
  /// order above, then cast to S (exact), so double and mp50 layers of one seed hold equal values.
  /// Linear maps ~ N(0, 1/fan_in); conv taps ~ N(0, 1/K); A_log, g_bias ~ U(0, 1) (anchor-kda);
  /// rms_w ~ 1 + 0.1 N(0, 1). Errors: KdaConfig::validate().
  static KdaWeights random(const KdaConfig& c, std::uint64_t seed) {
    c.validate();
    boost::random::mt19937_64 eng(seed);
    boost::random::normal_distribution<double> normal(0.0, 1.0);
    boost::random::uniform_real_distribution<double> unif(0.0, 1.0);
    const auto N = [&](std::size_t r, std::size_t cols, double fan_in) {
      Mat<S> m(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(cols));
      const double sd = 1.0 / std::sqrt(fan_in);
      for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = S(sd * normal(eng));
      return m;
    };
    const auto U = [&](std::size_t r, std::size_t cols) {
      Mat<S> m(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(cols));
      for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = S(unif(eng));
      return m;
    };
    const double hid = static_cast<double>(c.hidden), K = static_cast<double>(c.conv_kernel);
    const std::size_t qk = c.H * c.d_k, vw = c.HV * c.d_v, gw = c.HV * c.d_k;
    KdaWeights w;
    w.W_q = N(qk, c.hidden, hid);
    w.W_k = N(qk, c.hidden, hid);
    w.W_v = N(vw, c.hidden, hid);
    w.conv_q = N(qk, c.conv_kernel, K);
    w.conv_k = N(qk, c.conv_kernel, K);
    w.conv_v = N(vw, c.conv_kernel, K);
    w.W_beta = N(c.HV, c.hidden, hid);
    w.W_a_down = N(c.rank(), c.hidden, hid);
    w.W_a_up = N(gw, c.rank(), static_cast<double>(c.rank()));
    w.W_alpha = N(gw, vw, static_cast<double>(vw));
    w.A_log = U(c.HV, 1).col(0);
    w.g_bias = U(c.HV, c.d_k);
    w.rms_w = Vec<S>(static_cast<Eigen::Index>(c.d_v));
    for (Eigen::Index i = 0; i < w.rms_w.size(); ++i) w.rms_w(i) = S(1.0 + 0.1 * normal(eng));
    w.W_g = N(vw, c.hidden, hid);
    w.W_o = N(c.hidden, vw, static_cast<double>(vw));
    return w;
  }

  /// Random weights from a caller's N(0, 1) source (for stacks that draw every layer from one
  /// stream, e.g. reference/hybrid.hpp): `normal()` returns doubles, converted to S. Same member
  /// order and shapes as random(); linear maps std * N(0, 1) (std = 0: 1/sqrt(fan_in)); conv taps
  /// N(0, 1/K); A_log 0.3 N(0, 1); g_bias 0.5 N(0, 1); rms_w 1 + 0.1 N(0, 1).
  /// Errors: KdaConfig::validate().
  template <class Normal>
  static KdaWeights from_normal(const KdaConfig& c, Normal&& normal, double std = 0.0) {
    c.validate();
    const auto N = [&](std::size_t r, std::size_t cols, double fan_in) {
      Mat<S> m(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(cols));
      const double sd = std > 0 ? std : 1.0 / std::sqrt(fan_in);
      for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = S(sd * normal());
      return m;
    };
    const auto F = [&](std::size_t r, std::size_t cols, double sd, double mean) {
      Mat<S> m(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(cols));
      for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = S(mean + sd * normal());
      return m;
    };
    const double hid = static_cast<double>(c.hidden), K = static_cast<double>(c.conv_kernel);
    const std::size_t qk = c.H * c.d_k, vw = c.HV * c.d_v, gw = c.HV * c.d_k;
    KdaWeights w;
    w.W_q = N(qk, c.hidden, hid);
    w.W_k = N(qk, c.hidden, hid);
    w.W_v = N(vw, c.hidden, hid);
    w.conv_q = F(qk, c.conv_kernel, 1.0 / std::sqrt(K), 0.0);
    w.conv_k = F(qk, c.conv_kernel, 1.0 / std::sqrt(K), 0.0);
    w.conv_v = F(vw, c.conv_kernel, 1.0 / std::sqrt(K), 0.0);
    w.W_beta = N(c.HV, c.hidden, hid);
    w.W_a_down = N(c.rank(), c.hidden, hid);
    w.W_a_up = N(gw, c.rank(), static_cast<double>(c.rank()));
    w.W_alpha = N(gw, vw, static_cast<double>(vw));
    w.A_log = F(c.HV, 1, 0.3, 0.0).col(0);
    w.g_bias = F(c.HV, c.d_k, 0.5, 0.0);
    w.rms_w = F(c.d_v, 1, 0.1, 1.0).col(0);
    w.W_g = N(vw, c.hidden, hid);
    w.W_o = N(c.hidden, vw, static_cast<double>(vw));
    return w;
  }

  /// Elementwise conversion to another scalar type.
  template <class R>
  KdaWeights<R> cast() const {
    KdaWeights<R> r;
    r.W_q = W_q.template cast<R>(); r.W_k = W_k.template cast<R>(); r.W_v = W_v.template cast<R>();
    r.conv_q = conv_q.template cast<R>(); r.conv_k = conv_k.template cast<R>(); r.conv_v = conv_v.template cast<R>();
    r.W_beta = W_beta.template cast<R>(); r.W_a_down = W_a_down.template cast<R>(); r.W_a_up = W_a_up.template cast<R>();
    r.W_alpha = W_alpha.template cast<R>(); r.g_bias = g_bias.template cast<R>(); r.W_g = W_g.template cast<R>();
    r.W_o = W_o.template cast<R>(); r.A_log = A_log.template cast<R>(); r.rms_w = rms_w.template cast<R>();
    return r;
  }

  /// Throws kdalab::Error naming the first weight the layer reads whose shape does not match config c or
  /// that holds a non-finite value (it would reach every output as NaN).
  void validate(const KdaConfig& c) const {
    c.validate();
    const auto finite = [](const auto& m, const char* name) {
      for (Eigen::Index i = 0; i < m.size(); ++i)
        require(std::isfinite(static_cast<double>(m.data()[i])),
                std::string("KdaWeights: tensor '") + name + "' has a non-finite value (" +
                    num_str(static_cast<double>(m.data()[i])) + ") at flat index " + std::to_string(i) +
                    "; only finite values are accepted");
    };
    const auto chk = [&](const Mat<S>& m, std::size_t r, std::size_t cols, const char* name) {
      require(m.rows() == static_cast<Eigen::Index>(r) && m.cols() == static_cast<Eigen::Index>(cols),
              std::string("KdaWeights: tensor '") + name + "' is [" + std::to_string(m.rows()) + ", " +
                  std::to_string(m.cols()) + "], expected [" + std::to_string(r) + ", " + std::to_string(cols) + "]");
      finite(m, name);
    };
    const std::size_t qk = c.H * c.d_k, vw = c.HV * c.d_v, gw = c.HV * c.d_k, K = c.conv_kernel;
    chk(W_q, qk, c.hidden, "W_q"); chk(W_k, qk, c.hidden, "W_k"); chk(W_v, vw, c.hidden, "W_v");
    chk(conv_q, qk, K, "conv_q"); chk(conv_k, qk, K, "conv_k"); chk(conv_v, vw, K, "conv_v");
    chk(W_beta, c.HV, c.hidden, "W_beta"); chk(g_bias, c.HV, c.d_k, "g_bias");
    if (c.gate_input == GateInput::from_x) {
      chk(W_a_down, c.rank(), c.hidden, "W_a_down");
      chk(W_a_up, gw, c.rank(), "W_a_up");
    } else {
      chk(W_alpha, gw, vw, "W_alpha");
    }
    chk(W_g, vw, c.hidden, "W_g"); chk(W_o, c.hidden, vw, "W_o");
    require(A_log.size() == static_cast<Eigen::Index>(c.HV), "KdaWeights: tensor 'A_log' has " +
                                                                 std::to_string(A_log.size()) + " entries, expected HV = " +
                                                                 std::to_string(c.HV));
    require(rms_w.size() == static_cast<Eigen::Index>(c.d_v), "KdaWeights: tensor 'rms_w' has " +
                                                                  std::to_string(rms_w.size()) + " entries, expected d_v = " +
                                                                  std::to_string(c.d_v));
    finite(A_log, "A_log");
    finite(rms_w, "rms_w");
  }
};

/// Decode cache of one sequence: the KDA state S[h] (d_k x d_v) of each of the HV value heads and
/// the ShortConv tails of the q, k, v projections ([K - 1, H d_k], [K - 1, H d_k], [K - 1, HV d_v]);
/// `tokens` counts the tokens seen. A fresh cache (KdaLayer::make_cache) is all zeros.
template <class Scalar>
struct KdaCache {
  std::vector<Mat<Scalar>> S;
  ConvTail<Scalar> q_tail, k_tail, v_tail;
  std::size_t tokens = 0;
};

/// What the layer feeds its KDA core, for inspection: q, k [T, H d_k]; v [T, HV d_v];
/// g [T, HV d_k]; beta [T, HV]; o (core output before RMSNorm) [T, HV d_v].
template <class S>
struct KdaActivations {
  Mat<S> q, k, v, g, beta, o;
};

/// A KDA layer: config + weights; stateless itself (the state lives in a KdaCache).
template <class S>
class KdaLayer {
 public:
  /// Random weights from `seed` (KdaWeights::random). Errors: KdaConfig::validate().
  KdaLayer(const KdaConfig& c, std::uint64_t seed) : cfg_(c), w_(KdaWeights<S>::random(c, seed)) {}
  /// Given weights. Errors: KdaWeights::validate().
  KdaLayer(const KdaConfig& c, KdaWeights<S> w) : cfg_(c), w_(std::move(w)) { w_.validate(cfg_); }

  const KdaConfig& config() const { return cfg_; }
  const KdaWeights<S>& weights() const { return w_; }

  /// A fresh (zero) cache for one sequence.
  KdaCache<S> make_cache() const {
    KdaCache<S> c;
    c.S.assign(cfg_.HV, Mat<S>::Zero(static_cast<Eigen::Index>(cfg_.d_k), static_cast<Eigen::Index>(cfg_.d_v)));
    const auto K = static_cast<Eigen::Index>(cfg_.conv_kernel);
    c.q_tail = ConvTail<S>(K, static_cast<Eigen::Index>(cfg_.H * cfg_.d_k));
    c.k_tail = ConvTail<S>(K, static_cast<Eigen::Index>(cfg_.H * cfg_.d_k));
    c.v_tail = ConvTail<S>(K, static_cast<Eigen::Index>(cfg_.HV * cfg_.d_v));
    return c;
  }

  /// Prefill: x [T, hidden] (T >= 0) continuing from `cache` (fresh or after earlier calls);
  /// returns y [T, hidden] and advances the cache. Runs the chunked form with chunk size
  /// config().chunk (0: the recurrence). Errors: kdalab::Error naming 'x' (width, NaN/Inf) or
  /// 'cache' (shapes), or from the chunked form (factored-span limit, see kda_chunk.hpp).
  Mat<S> prefill(const Mat<S>& x, KdaCache<S>& cache, KdaActivations<S>* act = nullptr) const {
    return forward(x, cache, cfg_.chunk, act);
  }

  /// One decode step: x_t [hidden] -> y_t [hidden], one recurrence step on the cache.
  /// Errors: as prefill.
  Vec<S> decode(const Vec<S>& x_t, KdaCache<S>& cache) const {
    const Mat<S> x = x_t.transpose();
    return forward(x, cache, 0, nullptr).row(0).transpose();
  }

  /// Variable-length prefill: sequences packed along the rows of x [total, hidden], sequence n is
  /// rows [cu_seqlens[n], cu_seqlens[n+1]) and runs on caches[n] (its own state and tails).
  /// Returns y [total, hidden]. Errors: kdalab::Error naming 'cu_seqlens' (see
  /// validate_cu_seqlens) or 'caches' (count), and as prefill.
  Mat<S> prefill_varlen(const Mat<S>& x, const std::vector<std::size_t>& cu_seqlens,
                        std::vector<KdaCache<S>>& caches) const {
    validate_cu_seqlens(cu_seqlens, static_cast<std::size_t>(x.rows()));
    require(caches.size() + 1 == cu_seqlens.size(), "KdaLayer: 'caches' holds " + std::to_string(caches.size()) +
                                                        " caches for " + std::to_string(cu_seqlens.size() - 1) +
                                                        " sequences in 'cu_seqlens'");
    Mat<S> y(x.rows(), static_cast<Eigen::Index>(cfg_.hidden));
    for (std::size_t n = 0; n + 1 < cu_seqlens.size(); ++n) {
      const auto t0 = static_cast<Eigen::Index>(cu_seqlens[n]), len = static_cast<Eigen::Index>(cu_seqlens[n + 1]) - t0;
      y.middleRows(t0, len) = prefill(x.middleRows(t0, len), caches[n]);
    }
    return y;
  }

 private:
  void check(const Mat<S>& x, const KdaCache<S>& c) const {
    require(x.cols() == static_cast<Eigen::Index>(cfg_.hidden),
            "KdaLayer: tensor 'x' has " + std::to_string(x.cols()) + " columns, expected hidden = " + std::to_string(cfg_.hidden));
    for (Eigen::Index i = 0; i < x.size(); ++i)
      require(std::isfinite(static_cast<double>(x.data()[i])),
              "KdaLayer: tensor 'x' has a non-finite value at flat index " + std::to_string(i) + " (token " +
                  std::to_string(i / x.cols()) + "); only finite values are accepted");
    require(c.S.size() == cfg_.HV, "KdaLayer: 'cache' holds " + std::to_string(c.S.size()) + " states, expected HV = " +
                                       std::to_string(cfg_.HV) + " (use make_cache())");
    for (const auto& s : c.S)
      require(s.rows() == static_cast<Eigen::Index>(cfg_.d_k) && s.cols() == static_cast<Eigen::Index>(cfg_.d_v),
              "KdaLayer: 'cache' state is " + std::to_string(s.rows()) + " x " + std::to_string(s.cols()) +
                  ", expected d_k x d_v = " + std::to_string(cfg_.d_k) + " x " + std::to_string(cfg_.d_v));
  }

  Mat<S> forward(const Mat<S>& x, KdaCache<S>& cache, std::size_t chunk, KdaActivations<S>* act) const {
    check(x, cache);
    const auto T = x.rows();
    const auto dk = static_cast<Eigen::Index>(cfg_.d_k), dv = static_cast<Eigen::Index>(cfg_.d_v);
    const std::size_t group = cfg_.HV / cfg_.H;
    const Mat<S> q = l2norm<S>(swish_mat<S>(short_conv<S>(linear<S>(x, w_.W_q, "W_q"), w_.conv_q, cache.q_tail, "conv_q")),
                               dk, S(cfg_.l2_eps));
    const Mat<S> k = l2norm<S>(swish_mat<S>(short_conv<S>(linear<S>(x, w_.W_k, "W_k"), w_.conv_k, cache.k_tail, "conv_k")),
                               dk, S(cfg_.l2_eps));
    const Mat<S> v = swish_mat<S>(short_conv<S>(linear<S>(x, w_.W_v, "W_v"), w_.conv_v, cache.v_tail, "conv_v"));
    const Mat<S> beta = sigmoid_mat<S>(linear<S>(x, w_.W_beta, "W_beta"));
    const Mat<S> z = cfg_.gate_input == GateInput::from_x ? gate_logit_from_x<S>(x, w_.W_a_down, w_.W_a_up)
                                                          : gate_logit_from_v<S>(v, w_.W_alpha);
    const Mat<S> g = gate<S>(z, w_.A_log, w_.g_bias, cfg_.gate, S(cfg_.g_min));
    const S scale = S(cfg_.effective_scale());
    Mat<S> o(T, static_cast<Eigen::Index>(cfg_.HV) * dv);
    ChunkOptions opt;
    opt.C = chunk;
    opt.inverse = cfg_.inverse;
    for (std::size_t hv = 0; hv < cfg_.HV; ++hv) {
      const auto h = static_cast<Eigen::Index>(hv / group), j = static_cast<Eigen::Index>(hv);
      const Mat<S> Q = q.middleCols(h * dk, dk), K = k.middleCols(h * dk, dk), V = v.middleCols(j * dv, dv),
                   G = g.middleCols(j * dk, dk);
      const Vec<S> B = beta.col(j);
      o.middleCols(j * dv, dv) = chunk ? kda_chunked_head<S>(Q, K, V, G, B, cache.S[hv], scale, opt)
                                       : kda_recurrent_head<S>(Q, K, V, G, B, cache.S[hv], scale);
    }
    cache.tokens += static_cast<std::size_t>(T);
    if (act) *act = KdaActivations<S>{q, k, v, g, beta, o};
    const Mat<S> gated = output_gate<S>(rmsnorm<S>(o, w_.rms_w, S(cfg_.rms_eps)), linear<S>(x, w_.W_g, "W_g"));
    return linear<S>(gated, w_.W_o, "W_o");
  }

  KdaConfig cfg_;
  KdaWeights<S> w_;
};

}  // namespace kdalab
