#pragma once
/// Golden fixtures of the layer-level references: the KDA layer
/// (reference/kda_layer.hpp), Gated MLA naive and absorbed (reference/mla.hpp), Attention Residuals
/// (reference/attn_res.hpp) and the toy hybrid (reference/hybrid.hpp, data/configs/toy.json).
///
/// Each fixture file data/golden/<op>.h5 holds one group per case with the seeded inputs, every
/// weight the op uses (so a fixture is self-contained: a change of a weight generator is told apart
/// from a change of numerics) and the cpp_bin_float_50 outputs rounded once to float64. The case
/// definitions, the loaders and the evaluation in any scalar type live here so that
/// `kdalab golden` (experiments/golden.cpp) and tests/golden/test_golden_*.cpp run the same code.
///
/// Layouts (all float64; matrices token-major, row t = token t; weights [out, in]):
///   kda_layer.h5 /<case>/: x [T, hidden]; w/<W_q ... W_o, A_log, rms_w> (KdaWeights names);
///       y [T, hidden], o_core [T, HV d_v] (KDA core output before RMSNorm), S_final [HV, d_k, d_v].
///   mla.h5 /<case>/: x [T, hidden]; w/<W_DKV, W_KR, W_Q | W_DQ, W_UQ, W_UK, W_UV, W_g, W_o>;
///       y_naive, y_absorbed [T, hidden]; c [T, d_c] (latent), k_R [T, d_rope]; q_abs [T, n_h, d_c]
///       (absorbed query q~ = W_UK,i^T q^C_i), q_R [T, n_h, d_rope]; a [T, n_h, d_c] (attended latent
///       softmax(scale (q~ C^T + q^R K_R^T)) C, causal; what kernels/mla.hpp computes).
///   attn_res.h5 /<case>/: v [N, T, d] (sources, v_0 = h_1); w [d] (pseudo-query); h_full [T, d];
///       h_block [T, d] (block_sources per block).
///   hybrid.h5 /<case>/: x [T, hidden]; y [T, hidden] (prefill, naive MLA); weights_sum [L + 1]
///       (sum of every weight of layer l, then of w_out: a fingerprint of the weight generator);
///       attribute model_config (the JSON of the model config; weights are drawn from its seed).
#include <cstdint>
#include <string>
#include <vector>

#include "experiments/golden_layers.hpp"
#include "numerics/random.hpp"
#include "reference/attn_res.hpp"
#include "reference/hybrid.hpp"
#include "reference/kda_layer.hpp"
#include "reference/mla.hpp"
#include "reference/model_config.hpp"
#include "reference/scalar.hpp"
#include "reference/tensor.hpp"

namespace kdalab::golden {


// ---- conversions --------------------------------------------------------------------------------

/// Mat [r, c] -> Tensor [r, c] (row-major both), rounded to double.
template <class S>
Tensor<double> to_tensor(const Mat<S>& m) {
  Tensor<double> t({static_cast<std::size_t>(m.rows()), static_cast<std::size_t>(m.cols())});
  for (Eigen::Index i = 0; i < m.size(); ++i) t.data[static_cast<std::size_t>(i)] = static_cast<double>(m.data()[i]);
  return t;
}
template <class S>
Tensor<double> to_tensor(const Vec<S>& v) {
  Tensor<double> t({static_cast<std::size_t>(v.size())});
  for (Eigen::Index i = 0; i < v.size(); ++i) t.data[static_cast<std::size_t>(i)] = static_cast<double>(v(i));
  return t;
}
/// Tensor [r, c] -> Mat<double>. Throws kdalab::Error naming `what` if the rank is not 2.
inline Mat<double> to_mat(const Tensor<double>& t, const std::string& what) {
  require(t.rank() == 2, "golden '" + what + "' has rank " + std::to_string(t.rank()) + ", expected a matrix [rows, cols]");
  Mat<double> m(static_cast<Eigen::Index>(t.dim(0)), static_cast<Eigen::Index>(t.dim(1)));
  for (std::size_t i = 0; i < t.numel(); ++i) m.data()[i] = t.data[i];
  return m;
}
inline Vec<double> to_vec(const Tensor<double>& t, const std::string& what) {
  require(t.rank() == 1, "golden '" + what + "' has rank " + std::to_string(t.rank()) + ", expected a vector");
  Vec<double> v(static_cast<Eigen::Index>(t.numel()));
  for (std::size_t i = 0; i < t.numel(); ++i) v(static_cast<Eigen::Index>(i)) = t.data[i];
  return v;
}
/// Seeded N(0, 1) matrix [r, c] (numerics/random.hpp's engine and distribution, row-major draws).
Mat<double> normal_mat(std::size_t r, std::size_t c, std::uint64_t seed);

// ---- KDA layer ------------------------------------------------------------------------------------

struct KdaLayerCase {
  std::string name;
  KdaConfig cfg;
  std::size_t T = 0;
  std::uint64_t seed = 0;  ///< weights: KdaWeights::random(cfg, seed); x: normal_mat(T, hidden, seed + 1)
};
std::vector<KdaLayerCase> kda_layer_cases();

/// A case read back from its file: config (attributes), x, weights.
struct KdaLayerFixture {
  KdaLayerCase c;
  Mat<double> x;
  KdaWeights<double> w;
};
KdaLayerFixture load_kda_layer(const std::string& file, const std::string& case_name);

template <class S>
struct KdaLayerOut {
  Mat<S> y, o_core;
  std::vector<Mat<S>> S_final;
};
/// Prefill of x on a fresh cache in scalar S. decode_from = T: one prefill; k < T: prefill of the
/// first k tokens then one decode step per later token (o_core then holds the prefill part only).
template <class S>
KdaLayerOut<S> run_kda_layer(const KdaConfig& cfg, const KdaWeights<S>& w, const Mat<S>& x, std::size_t decode_from) {
  const KdaLayer<S> layer(cfg, w);
  auto cache = layer.make_cache();
  KdaActivations<S> act;
  KdaLayerOut<S> r;
  const auto k = static_cast<Eigen::Index>(decode_from);
  r.y = Mat<S>(x.rows(), x.cols());
  r.y.topRows(k) = layer.prefill(Mat<S>(x.topRows(k)), cache, &act);
  for (Eigen::Index t = k; t < x.rows(); ++t) r.y.row(t) = layer.decode(Vec<S>(x.row(t).transpose()), cache).transpose();
  r.o_core = act.o;
  r.S_final = cache.S;
  return r;
}
/// [HV, d_k, d_v] tensor of per-head states.
template <class S>
Tensor<double> states_tensor(const std::vector<Mat<S>>& st) {
  Tensor<double> t({st.size(), static_cast<std::size_t>(st.at(0).rows()), static_cast<std::size_t>(st.at(0).cols())});
  std::size_t i = 0;
  for (const auto& m : st)
    for (Eigen::Index j = 0; j < m.size(); ++j) t.data[i++] = static_cast<double>(m.data()[j]);
  return t;
}

// ---- MLA ------------------------------------------------------------------------------------------

struct MlaCase {
  std::string name;
  MlaConfig cfg;
  std::size_t T = 0;
  std::uint64_t seed = 0;  ///< weights: mla_random_weights(cfg, Rng(seed).normal); x: normal_mat(T, hidden, seed + 1)
};
std::vector<MlaCase> mla_cases();

struct MlaFixture {
  MlaCase c;
  Mat<double> x;
  MlaWeights<double> w;
};
MlaFixture load_mla(const std::string& file, const std::string& case_name);

template <class S>
struct MlaOut {
  Mat<S> y_naive, y_absorbed, y_streaming, y_decode, c, k_R, q_abs, q_R, a;
};
/// Every evaluation of one MLA case in scalar S: naive / absorbed / streaming (tile 4) prefill,
/// token-by-token decode, and the kernel-level pieces: latent c, k_R, absorbed query q~ [T, n_h d_c],
/// q^R [T, n_h d_rope] and the attended latent a [T, n_h d_c] (mla_attend_absorbed with W_UV = I).
template <class S>
MlaOut<S> run_mla(const MlaConfig& cfg, const MlaWeights<S>& w, const Mat<S>& x) {
  const std::size_t T = static_cast<std::size_t>(x.rows());
  MlaOut<S> r;
  MlaCache<S> c0(cfg, T), c1(cfg, T), c2(cfg, T), c3(cfg, T);
  r.y_naive = mla_prefill(cfg, w, x, c0, MlaEval::naive);
  r.y_absorbed = mla_prefill(cfg, w, x, c1, MlaEval::absorbed);
  r.y_streaming = mla_prefill(cfg, w, x, c2, MlaEval::streaming, 4);
  r.y_decode = Mat<S>(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) r.y_decode.row(t) = mla_decode(cfg, w, Vec<S>(x.row(t).transpose()), c3).transpose();
  const MlaProjected<S> p = mla_project(cfg, w, x, 0);
  r.c = p.c;
  r.k_R = p.k_R;
  r.q_R = p.q_R;
  const auto nh = static_cast<Eigen::Index>(cfg.n_h), dn = static_cast<Eigen::Index>(cfg.d_nope),
             dc = static_cast<Eigen::Index>(cfg.d_c);
  r.q_abs = Mat<S>(x.rows(), nh * dc);
  for (Eigen::Index i = 0; i < nh; ++i)
    r.q_abs.middleCols(i * dc, dc) = p.q_C.middleCols(i * dn, dn) * w.W_UK.middleRows(i * dn, dn);
  MlaConfig ci = cfg;  // W_UV = I per head: the absorbed attention returns the attended latent itself
  ci.d_v = cfg.d_c;
  MlaWeights<S> wi = w;
  wi.W_UV = Mat<S>(nh * dc, dc);
  for (Eigen::Index i = 0; i < nh; ++i) wi.W_UV.middleRows(i * dc, dc) = Mat<S>::Identity(dc, dc);
  r.a = mla_attend_absorbed(ci, wi, p, p.c, p.k_R, 0);
  return r;
}

// ---- AttnRes ----------------------------------------------------------------------------------------

struct AttnResCase {
  std::string name;
  std::size_t d = 0, T = 0, N = 0, block_sources = 1;
  double w_std = 0.5, eps = 1e-6;
  std::uint64_t seed = 0;
};
std::vector<AttnResCase> attn_res_cases();

struct AttnResFixture {
  AttnResCase c;
  std::vector<Mat<double>> v;  ///< N sources [T, d]; v[0] = h_1
  Vec<double> w;
};
/// The seeded inputs of a case: source i ~ (1 + 0.3 i) N(0, 1) (so RMSNorm of the keys matters),
/// w ~ w_std N(0, 1); drawn with numerics/random.hpp's Rng(seed) in the order v_0 .. v_{N-1}, w.
AttnResFixture make_attn_res(const AttnResCase& c);
AttnResFixture load_attn_res(const std::string& file, const std::string& case_name);

/// h = mix(w) after pushing v_1 .. v_{N-1} onto a DepthMixer started at v_0, in mode full or block.
template <class S>
Mat<S> run_attn_res(const std::vector<Mat<S>>& v, const Vec<S>& w, ResidualMode mode, std::size_t block_sources,
                    double eps) {
  DepthMixer<S> mix(AttnResConfig{mode, block_sources, eps}, v.at(0));
  for (std::size_t i = 1; i < v.size(); ++i) mix.push(v[i]);
  return mix.input(w);
}

// ---- hybrid -----------------------------------------------------------------------------------------

struct HybridCase {
  std::string name, config_path;
  std::size_t T = 0;
  std::uint64_t x_seed = 0;
};
std::vector<HybridCase> hybrid_cases();

struct HybridFixture {
  HybridCase c;
  ModelConfig cfg;
  std::string config_json;
  Mat<double> x;
};
HybridFixture load_hybrid(const std::string& file, const std::string& case_name);

/// The model of a config with its recorded seed (same weights in every scalar type).
template <class S>
Hybrid<S> build_hybrid(const ModelConfig& cfg) {
  Rng rng(cfg.opt.seed);
  return Hybrid<S>::random(cfg, [&] { return rng.normal(); });
}
/// Sum of every weight of each layer (attention, FFN, pseudo-queries), then of w_out: [L + 1].
Tensor<double> hybrid_weights_sum(const Hybrid<double>& m);

}  // namespace kdalab::golden
