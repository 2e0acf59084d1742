#pragma once
/// The KDA / Gated MLA hybrid stack (K3 report §2.1; Kimi Linear §5; docs/equations.md, Gated MLA, Attention
/// Residuals, hybrid), one sequence at a time, with a prefill over T tokens and a token-by-token decode with per-layer
/// caches (KDA: state + ShortConv tails; MLA: the latent cache).
///
/// Layout from the config's kda_layers / full_attn_layers (K3: blocks of 3 KDA + 1 Gated MLA and one
/// extra Gated MLA at the end; Kimi Linear 48B: its published list). Decoder layer l, input stream h:
///   sublayer granularity (default; each sublayer a source and a consumer; docs/equations.md, Attention Residuals):
///     a = Attn_l(RMSNorm(mix(w_l^attn)));  push a;  f = FFN_l(RMSNorm(mix(w_l^ffn)));  push f
///   layer granularity (one source/consumer per decoder layer):
///     h = mix(w_l);  a = Attn_l(RMSNorm(h));  f = FFN_l(RMSNorm(h + a));  push a + f
///   output = mix(w_out)
/// where mix(w) is the DepthMixer (reference/attn_res.hpp): plain residual (the running sum; w unused),
/// full AttnRes or block AttnRes with attn_res_block_size decoder layers per block (block_sources =
/// block size x sources per layer). The feed-forward stand-in is identity (adds nothing and is no
/// AttnRes source/consumer) or a dense SwiGLU. RMSNorm has unit gain and eps = rms_norm_eps.
/// There is no embedding table or LM head: the input X [T, hidden] is h_1, the output is [T, hidden].
///
/// KDA layers enter through KdaLayerTraits<KdaL> (the hook): make(), make_cache(), prefill(),
/// decode(). The default is reference/kda_layer.hpp's KdaLayer<S> (specialisation below); another
/// KDA implementation plugs in by specialising the traits.
#include <cstddef>
#include <string>
#include <variant>
#include <vector>

#include "reference/attn_res.hpp"
#include "reference/error.hpp"
#include "reference/kda_layer.hpp"
#include "reference/layers.hpp"
#include "reference/mla.hpp"
#include "reference/model_config.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

/// Hook for the KDA layer type. Specialise with:
///   using Cache = ...;
///   template <class Normal> static KdaL make(const ModelConfig&, std::size_t layer, Normal&& normal, double std);
///   static Cache make_cache(const KdaL&);
///   static Mat<S> prefill(const KdaL&, const Mat<S>& X, Cache&);      X [T, hidden] -> [T, hidden]
///   static Vec<S> decode(const KdaL&, const Vec<S>& x_t, Cache&);     [hidden] -> [hidden]
template <class KdaL>
struct KdaLayerTraits;

/// The KdaConfig of a model's KDA layers: H = HV = linear_attn_config.num_heads, d_k = d_v = head_dim,
/// ShortConv kernel short_conv_kernel_size, gate bounded (gate_lower_bound present, K3) or softplus
/// (Kimi Linear), decay logit low rank from x (rank d_k), RMSNorm eps rms_norm_eps, prefill in the
/// chunked form (chunk 64, KdaConfig's default). The output gate W_g is full rank in KdaLayer; a
/// Kimi Linear low-rank gate (use_full_rank_gate false) is a special case of it.
inline KdaConfig kda_config(const ModelConfig& m) {
  KdaConfig c;
  c.hidden = m.hidden;
  c.H = c.HV = m.kda.num_heads;
  c.d_k = c.d_v = m.kda.head_dim;
  c.gate = m.kda.bounded_gate ? GateKind::bounded : GateKind::softplus;
  c.g_min = m.kda.g_min;
  c.gate_input = GateInput::from_x;
  c.conv_kernel = m.kda.conv_kernel;
  c.rms_eps = m.rms_norm_eps;
  return c;
}

/// Seed of KDA layer `layer` (0-based) of a model with seed `seed` (KdaWeights::random draws from it).
inline std::uint64_t kda_layer_seed(std::uint64_t seed, std::size_t layer) {
  return seed * 1000003ull + 7919ull * (layer + 1);
}

/// The hook for reference/kda_layer.hpp's KdaLayer: weights from kda_layer_seed() with KdaWeights'
/// own initialisation (N(0, 1/fan_in), A_log and biases U(0, 1)); `normal` and `std` are not used.
template <class S>
struct KdaLayerTraits<KdaLayer<S>> {
  using Cache = KdaCache<S>;
  template <class Normal>
  static KdaLayer<S> make(const ModelConfig& m, std::size_t layer, Normal&&, double) {
    return KdaLayer<S>(kda_config(m), kda_layer_seed(m.opt.seed, layer));
  }
  static Cache make_cache(const KdaLayer<S>& k) { return k.make_cache(); }
  static Mat<S> prefill(const KdaLayer<S>& k, const Mat<S>& X, Cache& c) { return k.prefill(X, c); }
  static Vec<S> decode(const KdaLayer<S>& k, const Vec<S>& x, Cache& c) { return k.decode(x, c); }
};

/// Dense SwiGLU FFN weights (Shazeer 2020 Eq. 6): W_gate, W_up [ffn_dim, hidden]; W_down [hidden, ffn_dim].
template <class S>
struct SwiGluWeights {
  Mat<S> W_gate, W_up, W_down;
};

/// y = (Swish(x W_gate^T) ⊙ x W_up^T) W_down^T. x: [T, hidden] -> [T, hidden].
template <class S>
Mat<S> swiglu(const SwiGluWeights<S>& w, const Mat<S>& x) {
  const Mat<S> a = swish_mat<S>(linear<S>(x, w.W_gate, "W_gate"));
  const Mat<S> b = linear<S>(x, w.W_up, "W_up");
  return linear<S>(Mat<S>(a.cwiseProduct(b)), w.W_down, "W_down");
}

/// One decoder layer: an attention sublayer (MLA or KDA), an optional SwiGLU, and the AttnRes
/// pseudo-queries of its consumers (w_attn, w_ffn [hidden]; w_ffn unused at layer granularity).
template <class S, class KdaL = KdaLayer<S>>
struct HybridLayer {
  LayerKind kind = LayerKind::mla;
  std::variant<MlaLayer<S>, KdaL> attn;
  SwiGluWeights<S> ffn;
  Vec<S> w_attn, w_ffn;
};

/// Per-sequence caches of the whole stack: one entry per layer (MLA latent cache or KDA cache).
template <class S, class KdaL = KdaLayer<S>>
struct HybridCache {
  std::vector<std::variant<MlaCache<S>, typename KdaLayerTraits<KdaL>::Cache>> layer;
  std::size_t len = 0, capacity = 0;
};

/// The hybrid model. Build with Hybrid::random(config, normal); see the file comment for the math.
template <class S, class KdaL = KdaLayer<S>>
class Hybrid {
 public:
  using Traits = KdaLayerTraits<KdaL>;
  using Cache = HybridCache<S, KdaL>;

  ModelConfig cfg;
  std::vector<HybridLayer<S, KdaL>> layers;
  Vec<S> w_out;
  /// How prefill evaluates the MLA layers (decode is always the absorbed step over the latent cache).
  MlaEval mla_eval = MlaEval::naive;

  /// Random weights from `normal` (a callable returning N(0,1) doubles; pass a seeded kdalab::Rng
  /// with cfg.opt.seed), drawn as doubles and converted to S, so the same seed gives the same model
  /// in every scalar type (KDA layers: see KdaLayerTraits, seeded from cfg.opt.seed and the layer). Per layer, in order: attention weights, SwiGLU (W_gate, W_up, W_down), then
  /// the pseudo-queries w_attn, w_ffn; finally w_out. Weight std cfg.opt.init_std (0 = 1/sqrt(fan_in));
  /// pseudo-queries cfg.opt.pseudo_query_std * N(0,1) (0 = zero, the reports' init: uniform average).
  template <class Normal>
  static Hybrid random(const ModelConfig& cfg, Normal&& normal) {
    Hybrid m;
    m.cfg = cfg;
    const std::size_t d = cfg.hidden;
    const double std = cfg.opt.init_std;
    auto draw = [&](std::size_t r, std::size_t k) {
      Mat<S> w(r, k);
      const double s = std > 0 ? std : 1.0 / std::sqrt(static_cast<double>(k));
      for (std::size_t i = 0; i < r; ++i)
        for (std::size_t j = 0; j < k; ++j) w(i, j) = S(s * normal());
      return w;
    };
    auto pq = [&]() {
      Vec<S> w = Vec<S>::Zero(d);
      if (cfg.opt.pseudo_query_std > 0)
        for (std::size_t i = 0; i < d; ++i) w(i) = S(cfg.opt.pseudo_query_std * normal());
      return w;
    };
    for (std::size_t l = 0; l < cfg.num_layers; ++l) {
      HybridLayer<S, KdaL> L{cfg.layers[l], MlaLayer<S>{}, {}, {}, {}};
      if (L.kind == LayerKind::mla)
        L.attn = MlaLayer<S>{cfg.mla, mla_random_weights<S>(cfg.mla, normal, std)};
      else
        L.attn = Traits::make(cfg, l, normal, std);
      if (cfg.opt.ffn == FfnKind::swiglu) {
        L.ffn.W_gate = draw(cfg.opt.ffn_dim, d);
        L.ffn.W_up = draw(cfg.opt.ffn_dim, d);
        L.ffn.W_down = draw(d, cfg.opt.ffn_dim);
      }
      L.w_attn = pq();
      L.w_ffn = pq();
      m.layers.push_back(std::move(L));
    }
    m.w_out = pq();
    return m;
  }

  /// Empty caches for a sequence of up to `capacity` tokens (MLA latent caches of that capacity;
  /// KDA caches are constant-size). Throws kdalab::Error if capacity is 0.
  Cache make_cache(std::size_t capacity) const {
    require(capacity >= 1, "hybrid cache capacity = 0; accepted: >= 1 token");
    Cache c;
    c.capacity = capacity;
    for (const auto& L : layers) {
      if (L.kind == LayerKind::mla)
        c.layer.emplace_back(std::in_place_index<0>, std::get<0>(L.attn).make_cache(capacity));
      else
        c.layer.emplace_back(std::in_place_index<1>, Traits::make_cache(std::get<1>(L.attn)));
    }
    return c;
  }

  /// Prefill of X [T, hidden] (T >= 1) continuing the sequence in `cache` (positions cache.len ..);
  /// returns [T, hidden]. Errors (kdalab::Error): X not [T, hidden] or non-finite; the sequence
  /// would pass the cache capacity (checked before any cache is touched); layer errors.
  Mat<S> prefill(const Mat<S>& X, Cache& cache) const { return forward(X, cache, false); }

  /// Decode step of one token x_t [hidden] at position cache.len; returns [hidden]. Errors as prefill;
  /// a step past the capacity throws and leaves every cache unchanged.
  Vec<S> decode(const Vec<S>& x_t, Cache& cache) const {
    const Mat<S> X = x_t.transpose();
    return forward(X, cache, true).row(0).transpose();
  }

  /// AttnRes sources per block for the configured granularity (block mode).
  std::size_t block_sources() const {
    const std::size_t per_layer =
        cfg.opt.granularity == AttnResGranularity::layer || cfg.opt.ffn == FfnKind::identity ? 1 : 2;
    return cfg.attn_res_block_size * per_layer;
  }

 private:
  Mat<S> forward(const Mat<S>& X, Cache& cache, bool decode_step) const {
    require(X.rows() >= 1 && static_cast<std::size_t>(X.cols()) == cfg.hidden,
            "hybrid input 'x' has shape [" + std::to_string(X.rows()) + ", " + std::to_string(X.cols()) +
                "], expected [T >= 1, hidden_size = " + std::to_string(cfg.hidden) + "]");
    detail::require_finite_mat(X, "hybrid input x");
    require(cache.layer.size() == layers.size(), "hybrid cache has " + std::to_string(cache.layer.size()) +
                                                     " layers, the model " + std::to_string(layers.size()));
    const std::size_t T = X.rows();
    if (cache.len + T > cache.capacity)
      throw Error("hybrid cache is full: capacity " + std::to_string(cache.capacity) + " tokens, holds " +
                  std::to_string(cache.len) + ", cannot take " + std::to_string(T) +
                  " more (decode/prefill past capacity; allocate a larger cache)");
    const S eps = S(cfg.rms_norm_eps);
    const Vec<S> ones = Vec<S>::Ones(cfg.hidden);
    auto norm = [&](const Mat<S>& h) { return rmsnorm<S>(h, ones, eps); };
    auto attend = [&](std::size_t l, const Mat<S>& h) -> Mat<S> {
      const auto& L = layers[l];
      if (L.kind == LayerKind::mla) {
        auto& c = std::get<0>(cache.layer[l]);
        const auto& a = std::get<0>(L.attn);
        if (decode_step) return a.decode(Vec<S>(h.row(0).transpose()), c).transpose();
        return a.prefill(h, c, mla_eval);
      }
      auto& c = std::get<1>(cache.layer[l]);
      const auto& a = std::get<1>(L.attn);
      if (decode_step) return Traits::decode(a, Vec<S>(h.row(0).transpose()), c).transpose();
      return Traits::prefill(a, h, c);
    };
    const bool ffn = cfg.opt.ffn == FfnKind::swiglu;
    DepthMixer<S> mix(AttnResConfig{cfg.opt.residual, block_sources(), cfg.rms_norm_eps}, X);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const auto& L = layers[l];
      if (cfg.opt.granularity == AttnResGranularity::sublayer) {
        mix.push(attend(l, norm(mix.input(L.w_attn))));
        if (ffn) mix.push(swiglu<S>(L.ffn, norm(mix.input(L.w_ffn))));
      } else {
        const Mat<S> h = mix.input(L.w_attn);
        Mat<S> out = attend(l, norm(h));
        if (ffn) out += swiglu<S>(L.ffn, norm(Mat<S>(h + out)));
        mix.push(out);
      }
    }
    cache.len += T;
    return mix.input(w_out);
  }
};

// ---- cache footprint of a model config ------------------------------------------------------

/// Per-sequence cache of a model, in numbers (multiply by the element size for bytes):
/// per_token = sum over MLA layers of (d_c + d_rope) (DeepSeek-V2 §2.1.3); kda_state = sum over KDA
/// layers of H d_k d_v; kda_conv = sum over KDA layers of the ShortConv tails (K - 1)(2 H d_k + H d_v);
/// full_mla_per_token = the same stack with every layer MLA; mha_per_token = every layer plain MHA
/// with the MLA head shapes. Here d_k = d_v = linear_attn_config.head_dim.
struct CacheFootprint {
  std::size_t per_token = 0, kda_state = 0, kda_conv = 0, full_mla_per_token = 0, mha_per_token = 0;
  std::size_t fixed() const { return kda_state + kda_conv; }
  /// Bytes held after n tokens: latents at `latent_bytes` each, KDA state at `state_bytes`, tails at `conv_bytes`.
  double hybrid_bytes(double n, double latent_bytes, double state_bytes, double conv_bytes) const {
    return latent_bytes * static_cast<double>(per_token) * n + state_bytes * static_cast<double>(kda_state) +
           conv_bytes * static_cast<double>(kda_conv);
  }
  double full_mla_bytes(double n, double latent_bytes) const {
    return latent_bytes * static_cast<double>(full_mla_per_token) * n;
  }
};

/// Cache footprint of a parsed model config. Throws kdalab::Error when the model has no MLA layer
/// (then there are no MLA shapes to compare with).
inline CacheFootprint cache_footprint(const ModelConfig& m) {
  require(m.count(LayerKind::mla) > 0, "cache footprint" + detail::cfg_where(m.source) +
                                           ": the model has no MLA layer, so no MLA shapes to compare with");
  CacheFootprint f;
  const std::size_t H = m.kda.num_heads, d = m.kda.head_dim, K = m.kda.conv_kernel;
  for (auto k : m.layers) {
    if (k == LayerKind::mla) {
      f.per_token += mla_cache_values_per_token(m.mla);
    } else {
      f.kda_state += H * d * d;
      f.kda_conv += kda_state_values(H, d, d, K) - H * d * d;
    }
  }
  f.full_mla_per_token = m.num_layers * mla_cache_values_per_token(m.mla);
  f.mha_per_token = m.num_layers * mha_cache_values_per_token(m.mla);
  return f;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_HYBRID(X, S) \
  X template Mat<S> swiglu<S>(const SwiGluWeights<S>&, const Mat<S>&);
KDALAB_TEMPLATES_HYBRID(extern, double)
KDALAB_TEMPLATES_HYBRID(extern, mp50)

}  // namespace kdalab
