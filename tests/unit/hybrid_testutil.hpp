#pragma once
// Helpers of the hybrid tests: relative error, seeded inputs, the toy model builder.
#include <string>

#include "numerics/random.hpp"
#include "reference/hybrid.hpp"
#include "reference/kda.hpp"
#include "reference/gate.hpp"
#include "reference/layers.hpp"

namespace kdalab::testutil {

// A stand-in KDA layer (EQUATIONS.md section 3) for the hybrid tests until reference/kda_layer.hpp
// lands: q, k = L2Norm(Swish(ShortConv(W x))), v = Swish(ShortConv(W_v x)), beta = Sigmoid(W_beta x),
// g from the low-rank logit of x through the bounded (K3) or softplus (Kimi Linear) gate,
// y = W_o[Sigmoid(W_g x) ⊙ RMSNorm(o)]. Decode is a one-token prefill (state and tails carried).
template <class S>
struct StandInKda {
  std::size_t H = 0, d = 0;
  bool bounded = true;
  double g_min = -5.0;
  Mat<S> W_q, W_k, W_v, W_beta, W_down, W_up, W_g, W_o, conv_q, conv_k, conv_v, bias;
  Vec<S> A_log, norm_w;
  struct Cache {
    ConvTail<S> q, k, v;
    std::vector<Mat<S>> state;
  };
};

template <class S, class Normal>
Mat<S> draw_mat(std::size_t r, std::size_t k, Normal& normal, double std) {
  Mat<S> w(r, k);
  const double s = std > 0 ? std : 1.0 / std::sqrt(static_cast<double>(k));
  for (std::size_t i = 0; i < r; ++i)
    for (std::size_t j = 0; j < k; ++j) w(i, j) = S(s * normal());
  return w;
}

}  // namespace kdalab::testutil

namespace kdalab {
template <class S>
struct KdaLayerTraits<testutil::StandInKda<S>> {
  using L = testutil::StandInKda<S>;
  using Cache = typename L::Cache;
  template <class Normal>
  static L make(const ModelConfig& m, Normal&& normal, double std) {
    L k;
    k.H = m.kda.num_heads; k.d = m.kda.head_dim; k.bounded = m.kda.bounded_gate; k.g_min = m.kda.g_min;
    const std::size_t D = m.hidden, HD = k.H * k.d, K = m.kda.conv_kernel;
    using testutil::draw_mat;
    k.W_q = draw_mat<S>(HD, D, normal, std); k.W_k = draw_mat<S>(HD, D, normal, std); k.W_v = draw_mat<S>(HD, D, normal, std);
    k.W_beta = draw_mat<S>(k.H, D, normal, std);
    k.W_down = draw_mat<S>(k.d, D, normal, std); k.W_up = draw_mat<S>(HD, k.d, normal, std);
    k.W_g = draw_mat<S>(HD, D, normal, std); k.W_o = draw_mat<S>(D, HD, normal, std);
    k.conv_q = draw_mat<S>(HD, K, normal, 0.5); k.conv_k = draw_mat<S>(HD, K, normal, 0.5); k.conv_v = draw_mat<S>(HD, K, normal, 0.5);
    k.bias = draw_mat<S>(k.H, k.d, normal, 0.5);
    k.A_log = Vec<S>(k.H);
    for (std::size_t h = 0; h < k.H; ++h) k.A_log(h) = S(0.3 * normal());
    k.norm_w = Vec<S>::Ones(k.d);
    return k;
  }
  static Cache make_cache(const L& k) {
    const Eigen::Index K = k.conv_q.cols(), HD = k.H * k.d;
    Cache c{ConvTail<S>(K, HD), ConvTail<S>(K, HD), ConvTail<S>(K, HD), {}};
    c.state.assign(k.H, Mat<S>::Zero(k.d, k.d));
    return c;
  }
  static Mat<S> prefill(const L& k, const Mat<S>& X, Cache& c) {
    const Eigen::Index T = X.rows(), H = k.H, d = k.d;
    const Mat<S> q = l2norm<S>(swish_mat<S>(short_conv<S>(linear<S>(X, k.W_q), k.conv_q, c.q)), d);
    const Mat<S> kk = l2norm<S>(swish_mat<S>(short_conv<S>(linear<S>(X, k.W_k), k.conv_k, c.k)), d);
    const Mat<S> v = swish_mat<S>(short_conv<S>(linear<S>(X, k.W_v), k.conv_v, c.v));
    const Mat<S> beta = sigmoid_mat<S>(linear<S>(X, k.W_beta));
    const Mat<S> g = gate<S>(gate_logit_from_x<S>(X, k.W_down, k.W_up), k.A_log, k.bias,
                             k.bounded ? GateKind::bounded : GateKind::softplus, S(k.g_min));
    const S scale = S(1) / ssqrt<S>(S(static_cast<double>(d)));
    Mat<S> o(T, H * d);
    for (Eigen::Index t = 0; t < T; ++t)
      for (Eigen::Index h = 0; h < H; ++h)
        o.row(t).segment(h * d, d) =
            kda_step<S>(c.state[h], q.row(t).segment(h * d, d).transpose(), kk.row(t).segment(h * d, d).transpose(),
                        v.row(t).segment(h * d, d).transpose(), g.row(t).segment(h * d, d).transpose(), beta(t, h), scale)
                .transpose();
    return linear<S>(output_gate<S>(rmsnorm<S>(o, k.norm_w), linear<S>(X, k.W_g)), k.W_o);
  }
  static Vec<S> decode(const L& k, const Vec<S>& x, Cache& c) {
    return prefill(k, Mat<S>(x.transpose()), c).row(0).transpose();
  }
};
}  // namespace kdalab

namespace kdalab::testutil {

template <class S>
using ToyKda = StandInKda<S>;

template <class S>
using ToyHybrid = Hybrid<S, ToyKda<S>>;

/// The model of a config with its recorded seed (same weights in every scalar type).
template <class S>
ToyHybrid<S> build(const ModelConfig& cfg) {
  Rng rng(cfg.opt.seed);
  return ToyHybrid<S>::random(cfg, [&] { return rng.normal(); });
}

inline Mat<double> inputs(std::size_t T, std::size_t d, std::uint64_t seed) {
  Rng rng(seed);
  Mat<double> X(T, d);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t i = 0; i < d; ++i) X(t, i) = rng.normal();
  return X;
}

template <class A, class B>
double rel(const A& out, const B& ref) {
  const Mat<double> o = out.template cast<double>(), r = ref.template cast<double>();
  return (o - r).norm() / r.norm();
}

/// Prefill of X vs token-by-token decode of X on fresh caches: relative error.
template <class S>
double decode_vs_prefill(const ToyHybrid<S>& m, const Mat<S>& X) {
  auto cp = m.make_cache(X.rows()), cd = m.make_cache(X.rows());
  const Mat<S> Yp = m.prefill(X, cp);
  Mat<S> Yd(X.rows(), X.cols());
  for (Eigen::Index t = 0; t < X.rows(); ++t) Yd.row(t) = m.decode(Vec<S>(X.row(t).transpose()), cd).transpose();
  return rel(Yd, Yp);
}

}  // namespace kdalab::testutil
