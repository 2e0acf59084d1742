#pragma once
/// Model shapes from a Hugging Face config.json of Kimi Linear / K3 (docs/equations.md, hybrid stack), so
/// that a real model's config.json can be pointed at directly.
///
/// Keys read (everything else is ignored, as in transformers):
///   hidden_size, num_hidden_layers, num_attention_heads, kv_lora_rank (= d_c), qk_nope_head_dim,
///   qk_rope_head_dim, v_head_dim                                   required when a layer is MLA
///   q_lora_rank (null/absent = full-rank W_Q), mla_use_nope (absent = false: RoPE on the rope part),
///   mla_use_output_gate (absent = false, Kimi Linear), rope_theta (10000), rms_norm_eps (1e-6),
///   intermediate_size, attn_res_block_size (absent = plain residuals), initializer_range (0.02)
///   linear_attn_config {num_heads, head_dim, short_conv_kernel_size (required when a layer is KDA),
///     gate_lower_bound (absent = Kimi Linear softplus gate; present = K3 bounded gate, < 0),
///     use_full_rank_gate (false), kda_layers, full_attn_layers, kda_layer_index_base (1)}
///   A config whose fields sit under "text_config" (multimodal wrappers) is read from there.
///   Without linear_attn_config every layer is full attention (an MLA-only model).
///   "kdalab": {...} (optional, kdalab's own; unknown keys inside it are an error): seed, ffn
///   ("identity" | "swiglu"), ffn_dim, residual ("plain" | "full" | "block"), granularity
///   ("sublayer" | "layer"), init_std (0 = 1/sqrt(fan_in)), pseudo_query_std (0 = the reports' init).
/// Validation (kdalab::Error naming the key, the value and what is accepted): a missing needed key,
/// a value of the wrong type or range (kv_lora_rank = d_c < 1, a size above its cap kMaxConfigLayers, ...Width,
/// ...Heads, ...HeadDim, ...ConvKernel: "is too large; accepted: MIN .. MAX"), layer lists that do not
/// partition 1..num_hidden_layers (an id out of range, in both lists, twice, or in neither).
/// Heads need not divide hidden_size (Kimi Linear projects 2304 to 32 x 128 = 4096).
///
/// Parsing is pure (nlohmann::json in, ModelConfig out); read_model_config() is the one function
/// that opens a file (text in, no results written), kept here so tests and tools share it.
#include <climits>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "reference/attn_res.hpp"
#include "reference/error.hpp"
#include "reference/mla.hpp"

namespace kdalab {

enum class LayerKind { kda, mla };
inline std::string layer_kind_name(LayerKind k) { return k == LayerKind::kda ? "KDA" : "MLA"; }

/// Feed-forward stand-in after each attention layer: identity (the FFN block maps h to h, i.e. adds
/// nothing; it is then neither a source nor a consumer of AttnRes) or a small dense SwiGLU
/// W_down (Swish(W_gate x) ⊙ W_up x) (Shazeer 2020, Eq. 6) in place of the models' MoE.
enum class FfnKind { identity, swiglu };
/// AttnRes granularity: every attention and feed-forward sublayer is a source and a consumer
/// (docs/equations.md, Attention Residuals, our reading of the released K3 configs), or one per decoder layer.
enum class AttnResGranularity { sublayer, layer };

/// KDA layer shapes (linear_attn_config).
struct KdaModelShape {
  std::size_t num_heads = 0, head_dim = 0, conv_kernel = 0;
  bool bounded_gate = false;  ///< gate_lower_bound present: K3 bounded gate; else Kimi Linear softplus gate
  double g_min = -5.0;        ///< gate_lower_bound
  bool full_rank_gate = false;
};

/// kdalab's own settings of the hybrid (from the optional "kdalab" object).
struct HybridOptions {
  std::uint64_t seed = 1;
  FfnKind ffn = FfnKind::identity;
  std::size_t ffn_dim = 0;  ///< 0 = intermediate_size, or 2 hidden when that is absent
  ResidualMode residual = ResidualMode::plain;
  AttnResGranularity granularity = AttnResGranularity::sublayer;
  double init_std = 0.0;          ///< N(0, init_std^2) weights; 0 = 1/sqrt(fan_in)
  double pseudo_query_std = 0.0;  ///< AttnRes pseudo-queries; 0 = zero init (the reports: uniform average)
};

struct ModelConfig {
  std::string source;  ///< file or label, for messages
  std::string model_type;
  std::size_t hidden = 0, num_layers = 0;
  MlaConfig mla;                 ///< valid when any layer is MLA
  KdaModelShape kda;             ///< valid when any layer is KDA
  std::vector<LayerKind> layers;  ///< 0-based, size num_layers
  std::vector<std::size_t> kda_layers, full_attn_layers;  ///< 1-based ids
  std::size_t attn_res_block_size = 0;  ///< decoder layers per AttnRes block; 0 = key absent
  std::size_t intermediate_size = 0;
  double rms_norm_eps = 1e-6, initializer_range = 0.02;
  HybridOptions opt;

  std::size_t count(LayerKind k) const {
    std::size_t n = 0;
    for (auto l : layers) n += l == k;
    return n;
  }
};

/// Caps on a config's sizes (cfg_uint's max; a value above one: kdalab::Error "config key 'K' = V is too large;
/// accepted: MIN .. MAX", exit 2 in `kdalab info --config`, before anything is allocated). A config of 1e11 layers
/// allocated the layer list and ended in "not enough memory", and sizes near 2^64 wrapped the
/// cache counts. Each cap is 40x or more above the released models (Kimi K3: 93 layers, hidden 7168, 96 heads of
/// 128, kv_lora_rank 512, ShortConv 4; Kimi Linear 48B: intermediate 9216; Llama 3.1 405B, among the widest: 126
/// layers, hidden 16384, intermediate 53248, 128 heads; head dims reach 256), and small enough that every count
/// formed from them fits in 64 bits with room (layers x H d_k d_v <= 2^14 2^14 2^12 2^12 = 2^52; layers x n_h (d_qk +
/// d_v) < 2^55).
/// Decoder layers: num_hidden_layers, attn_res_block_size.
inline constexpr std::size_t kMaxConfigLayers = 16384;
/// Model widths: hidden_size, intermediate_size, kv_lora_rank (d_c), q_lora_rank, kdalab.ffn_dim.
inline constexpr std::size_t kMaxConfigWidth = 1048576;
/// Heads: num_attention_heads, linear_attn_config.num_heads.
inline constexpr std::size_t kMaxConfigHeads = 16384;
/// Per-head widths: qk_nope_head_dim, qk_rope_head_dim, v_head_dim, linear_attn_config.head_dim.
inline constexpr std::size_t kMaxConfigHeadDim = 4096;
/// linear_attn_config.short_conv_kernel_size (taps of the ShortConv; the models use 4).
inline constexpr std::size_t kMaxConfigConvKernel = 1024;

/// The deepest nesting of any JSON file kdalab reads: model configs (read_model_config), --config option files and
/// bench --peer-json (experiments/cli.hpp parse_json_once). Its files are flat or nearly flat objects; a value nested
/// a million levels deep would crash the error messages that print it (dump() recursion: SIGSEGV).
inline constexpr int kMaxJsonDepth = 64;

namespace detail {

inline std::string cfg_where(const std::string& source) { return source.empty() ? "" : " (" + source + ")"; }

inline const nlohmann::json* cfg_find(const nlohmann::json& j, const std::string& key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

/// Integer at j[key] in [min, max] (path names it in messages); nullopt when absent (or null, if null_ok).
/// Errors (kdalab::Error naming the key, the value as written and the accepted range): not a non-negative integer;
/// above max ("is too large", also for a number written as 1e11 or beyond 64 bits); below min. max = the largest
/// std::size_t means no cap (seed); the size keys pass one of the kMaxConfig* caps above.
inline std::optional<std::size_t> cfg_uint(const nlohmann::json& j, const std::string& key, const std::string& path,
                                           const std::string& source, bool required, std::size_t min = 0,
                                           bool null_ok = false, std::size_t max = SIZE_MAX) {
  const auto* v = cfg_find(j, key);
  if (!v || (null_ok && v->is_null())) {
    require(!required, "config key '" + path + "' is missing" + cfg_where(source) + "; it is needed for the model shapes");
    return std::nullopt;
  }
  const std::string range =
      "; accepted: " + (max == SIZE_MAX ? ">= " + std::to_string(min) : std::to_string(min) + " .. " + std::to_string(max));
  // nlohmann holds a non-negative integer read from text as unsigned (2^64 - 1 included), one built in code as signed;
  // a number past 2^64 - 1 or written with an exponent is a float: too large when above max, else not an integer
  const bool negative = v->is_number_integer() && !v->is_number_unsigned() && v->get<long long>() < 0;
  const bool over = v->is_number() && !negative &&
                    (v->is_number_float() ? v->get<double>() > static_cast<double>(max) : v->get<std::uint64_t>() > max);
  if (over) throw Error("config key '" + path + "' = " + v->dump() + cfg_where(source) + " is too large" + range);
  if (!v->is_number_integer() || negative)
    throw Error("config key '" + path + "' = " + v->dump() + cfg_where(source) + " is not a non-negative integer" + range);
  const auto x = static_cast<std::size_t>(v->get<std::uint64_t>());
  if (x < min) throw Error("config key '" + path + "' = " + std::to_string(x) + cfg_where(source) + range);
  return x;
}

inline std::optional<double> cfg_num(const nlohmann::json& j, const std::string& key, const std::string& path,
                                     const std::string& source) {
  const auto* v = cfg_find(j, key);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_number()) throw Error("config key '" + path + "' = " + v->dump() + cfg_where(source) + " is not a number");
  return v->get<double>();
}

inline std::optional<bool> cfg_bool(const nlohmann::json& j, const std::string& key, const std::string& path,
                                    const std::string& source) {
  const auto* v = cfg_find(j, key);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_boolean()) throw Error("config key '" + path + "' = " + v->dump() + cfg_where(source) + " is not true/false");
  return v->get<bool>();
}

inline std::vector<long long> cfg_int_list(const nlohmann::json& j, const std::string& key, const std::string& path,
                                           const std::string& source) {
  const auto* v = cfg_find(j, key);
  if (!v) throw Error("config key '" + path + "' is missing" + cfg_where(source) + "; it lists the layer ids (1-based)");
  if (!v->is_array()) throw Error("config key '" + path + "' = " + v->dump() + cfg_where(source) + " is not a list of layer ids");
  std::vector<long long> r;
  for (std::size_t i = 0; i < v->size(); ++i) {
    const auto& e = (*v)[i];
    if (!e.is_number_integer())
      throw Error("config key '" + path + "' entry " + std::to_string(i) + " = " + e.dump() + cfg_where(source) +
                  " is not an integer layer id");
    // 2^63 and above would read as a negative id, and the message would name a value not in the file
    if (e.is_number_unsigned() && e.get<unsigned long long>() > static_cast<unsigned long long>(LLONG_MAX))
      throw Error("config key '" + path + "' entry " + std::to_string(i) + " = " + e.dump() + cfg_where(source) +
                  " is too large for a layer id; the two lists must partition the layers");
    r.push_back(e.get<long long>());
  }
  return r;
}

inline std::string cfg_choice(const nlohmann::json& j, const std::string& key, const std::string& path,
                              const std::string& source, const std::vector<std::string>& accepted, const std::string& dflt) {
  const auto* v = cfg_find(j, key);
  if (!v) return dflt;
  std::string acc;
  for (const auto& a : accepted) acc += (acc.empty() ? "" : ", ") + a;
  if (!v->is_string()) throw Error("config key '" + path + "' = " + v->dump() + cfg_where(source) + "; accepted: " + acc);
  const auto s = v->get<std::string>();
  for (const auto& a : accepted)
    if (s == a) return s;
  throw Error("config key '" + path + "' = '" + s + "'" + cfg_where(source) + " is unknown; accepted: " + acc);
}

}  // namespace detail

/// Parses a model config (see the file comment). `source` names the file in messages.
/// Throws kdalab::Error naming the key on any missing needed key or inconsistent value.
inline ModelConfig parse_model_config(const nlohmann::json& root, const std::string& source = "") {
  using namespace detail;
  require(root.is_object(), "model config" + cfg_where(source) + " is not a JSON object");
  const nlohmann::json* jp = &root;  // a pointer, not a reference to operator[] (g++ 13 -Wdangling-reference)
  if (!root.contains("hidden_size"))
    if (auto it = root.find("text_config"); it != root.end() && it->is_object()) jp = &*it;
  const nlohmann::json& j = *jp;
  ModelConfig m;
  m.source = source;
  if (const auto* t = cfg_find(j, "model_type"); t && t->is_string()) m.model_type = t->get<std::string>();
  m.hidden = *cfg_uint(j, "hidden_size", "hidden_size", source, true, 1, false, kMaxConfigWidth);
  m.num_layers = *cfg_uint(j, "num_hidden_layers", "num_hidden_layers", source, true, 1, false, kMaxConfigLayers);
  m.intermediate_size =
      cfg_uint(j, "intermediate_size", "intermediate_size", source, false, 0, false, kMaxConfigWidth).value_or(0);
  m.rms_norm_eps = cfg_num(j, "rms_norm_eps", "rms_norm_eps", source).value_or(1e-6);
  require(m.rms_norm_eps >= 0, "config key 'rms_norm_eps' = " + std::to_string(m.rms_norm_eps) + cfg_where(source) + "; accepted: >= 0");
  m.initializer_range = cfg_num(j, "initializer_range", "initializer_range", source).value_or(0.02);

  // ---- layer pattern ----
  const std::size_t L = m.num_layers;
  m.layers.assign(L, LayerKind::mla);
  const auto* lac = cfg_find(j, "linear_attn_config");
  if (lac) {
    require(lac->is_object(), "config key 'linear_attn_config'" + cfg_where(source) + " is not an object");
    const long long base = static_cast<long long>(
        cfg_uint(*lac, "kda_layer_index_base", "linear_attn_config.kda_layer_index_base", source, false, 0, false, 1)
            .value_or(1));
    const auto kl = cfg_int_list(*lac, "kda_layers", "linear_attn_config.kda_layers", source);
    const auto fl = cfg_int_list(*lac, "full_attn_layers", "linear_attn_config.full_attn_layers", source);
    std::vector<int> seen(L, 0);  // 0 none, 1 kda, 2 mla
    auto place = [&](const std::vector<long long>& ids, LayerKind kind, const std::string& key) {
      for (long long id : ids) {
        const long long one = id - base + 1;  // 1-based
        if (one < 1 || one > static_cast<long long>(L))
          throw Error("config key 'linear_attn_config." + key + "' has layer id " + std::to_string(id) + cfg_where(source) +
                      " outside " + std::to_string(base) + ".." + std::to_string(base + static_cast<long long>(L) - 1) +
                      " (num_hidden_layers = " + std::to_string(L) + "); the two lists must partition the layers");
        int& s = seen[static_cast<std::size_t>(one - 1)];
        if (s != 0)
          throw Error("config key 'linear_attn_config." + key + "': layer id " + std::to_string(id) + cfg_where(source) +
                      (s == (kind == LayerKind::kda ? 1 : 2) ? " is listed twice" : " is in both kda_layers and full_attn_layers") +
                      "; the two lists must partition the layers");
        s = kind == LayerKind::kda ? 1 : 2;
        m.layers[static_cast<std::size_t>(one - 1)] = kind;
        (kind == LayerKind::kda ? m.kda_layers : m.full_attn_layers).push_back(static_cast<std::size_t>(one));
      }
    };
    place(kl, LayerKind::kda, "kda_layers");
    place(fl, LayerKind::mla, "full_attn_layers");
    for (std::size_t l = 0; l < L; ++l)
      if (!seen[l])
        throw Error("config keys 'linear_attn_config.kda_layers' / 'full_attn_layers'" + cfg_where(source) + ": layer " +
                    std::to_string(static_cast<long long>(l) + base) + " is in neither list; the two lists must partition " +
                    std::to_string(base) + ".." + std::to_string(base + static_cast<long long>(L) - 1));
  } else {
    for (std::size_t l = 1; l <= L; ++l) m.full_attn_layers.push_back(l);
  }

  // ---- MLA shapes ----
  if (m.count(LayerKind::mla) > 0) {
    MlaConfig& c = m.mla;
    c.hidden = m.hidden;
    c.n_h = *cfg_uint(j, "num_attention_heads", "num_attention_heads", source, true, 1, false, kMaxConfigHeads);
    c.d_c = *cfg_uint(j, "kv_lora_rank", "kv_lora_rank", source, true, 1, false, kMaxConfigWidth);
    c.d_cq = cfg_uint(j, "q_lora_rank", "q_lora_rank", source, false, 1, true, kMaxConfigWidth).value_or(0);
    c.d_nope = *cfg_uint(j, "qk_nope_head_dim", "qk_nope_head_dim", source, true, 1, false, kMaxConfigHeadDim);
    c.d_rope = *cfg_uint(j, "qk_rope_head_dim", "qk_rope_head_dim", source, true, 0, false, kMaxConfigHeadDim);
    c.d_v = *cfg_uint(j, "v_head_dim", "v_head_dim", source, true, 1, false, kMaxConfigHeadDim);
    c.rope = !cfg_bool(j, "mla_use_nope", "mla_use_nope", source).value_or(false);
    c.rope_theta = cfg_num(j, "rope_theta", "rope_theta", source).value_or(10000.0);
    c.output_gate = cfg_bool(j, "mla_use_output_gate", "mla_use_output_gate", source).value_or(false);
    require(!c.rope || c.d_rope % 2 == 0, "config key 'qk_rope_head_dim' = " + std::to_string(c.d_rope) + cfg_where(source) +
                                              " is odd while RoPE is on (mla_use_nope false); accepted: an even width");
    require(c.rope_theta > 0, "config key 'rope_theta' = " + std::to_string(c.rope_theta) + cfg_where(source) + "; accepted: > 0");
    mla_validate_config(c);
  }

  // ---- KDA shapes ----
  if (m.count(LayerKind::kda) > 0) {
    const std::string p = "linear_attn_config.";
    m.kda.num_heads = *cfg_uint(*lac, "num_heads", p + "num_heads", source, true, 1, false, kMaxConfigHeads);
    m.kda.head_dim = *cfg_uint(*lac, "head_dim", p + "head_dim", source, true, 1, false, kMaxConfigHeadDim);
    m.kda.conv_kernel =
        *cfg_uint(*lac, "short_conv_kernel_size", p + "short_conv_kernel_size", source, true, 1, false, kMaxConfigConvKernel);
    if (const auto gl = cfg_num(*lac, "gate_lower_bound", p + "gate_lower_bound", source)) {
      require(*gl < 0, "config key '" + p + "gate_lower_bound' = " + std::to_string(*gl) + cfg_where(source) + "; accepted: < 0");
      m.kda.bounded_gate = true;
      m.kda.g_min = *gl;
    }
    m.kda.full_rank_gate = cfg_bool(*lac, "use_full_rank_gate", p + "use_full_rank_gate", source).value_or(false);
  }

  // ---- residuals / AttnRes ----
  m.attn_res_block_size =
      cfg_uint(j, "attn_res_block_size", "attn_res_block_size", source, false, 1, false, kMaxConfigLayers).value_or(0);
  m.opt.residual = m.attn_res_block_size ? ResidualMode::block : ResidualMode::plain;

  // ---- kdalab's own options ----
  if (const auto* k = cfg_find(root, "kdalab")) {
    require(k->is_object(), "config key 'kdalab'" + cfg_where(source) + " is not an object");
    static const std::set<std::string> known{"seed", "ffn", "ffn_dim", "residual", "granularity", "init_std", "pseudo_query_std"};
    for (auto it = k->begin(); it != k->end(); ++it)
      require(known.count(it.key()) == 1, "config key 'kdalab." + it.key() + "'" + cfg_where(source) +
                                              " is unknown; accepted: seed, ffn, ffn_dim, residual, granularity, init_std, "
                                              "pseudo_query_std");
    HybridOptions& o = m.opt;
    o.seed = cfg_uint(*k, "seed", "kdalab.seed", source, false).value_or(1);
    o.ffn = cfg_choice(*k, "ffn", "kdalab.ffn", source, {"identity", "swiglu"}, "identity") == "swiglu" ? FfnKind::swiglu
                                                                                                        : FfnKind::identity;
    o.ffn_dim = cfg_uint(*k, "ffn_dim", "kdalab.ffn_dim", source, false, 1, false, kMaxConfigWidth).value_or(0);
    const auto r = cfg_choice(*k, "residual", "kdalab.residual", source, {"plain", "full", "block"},
                              residual_mode_name(o.residual));
    o.residual = r == "plain" ? ResidualMode::plain : r == "full" ? ResidualMode::full : ResidualMode::block;
    o.granularity = cfg_choice(*k, "granularity", "kdalab.granularity", source, {"sublayer", "layer"}, "sublayer") == "layer"
                        ? AttnResGranularity::layer
                        : AttnResGranularity::sublayer;
    o.init_std = cfg_num(*k, "init_std", "kdalab.init_std", source).value_or(0.0);
    o.pseudo_query_std = cfg_num(*k, "pseudo_query_std", "kdalab.pseudo_query_std", source).value_or(0.0);
    require(o.init_std >= 0 && o.pseudo_query_std >= 0,
            "config keys 'kdalab.init_std' / 'kdalab.pseudo_query_std'" + cfg_where(source) + " must be >= 0");
  }
  require(m.opt.residual != ResidualMode::block || m.attn_res_block_size >= 1,
          "config key 'kdalab.residual' = 'block'" + cfg_where(source) + " needs 'attn_res_block_size' >= 1");
  if (m.opt.ffn_dim == 0) m.opt.ffn_dim = m.intermediate_size ? m.intermediate_size : 2 * m.hidden;
  return m;
}

/// Whether `j` looks like a model config.json, right or wrong: an object holding hidden_size or num_hidden_layers (the
/// keys every model has) at its root or under text_config. Lets a caller tell a model config with a bad value from a
/// file of another kind. Never throws.
inline bool looks_like_model_config(const nlohmann::json& j) {
  const auto has_shape = [](const nlohmann::json& o) {
    return o.is_object() && (o.contains("hidden_size") || o.contains("num_hidden_layers"));
  };
  return has_shape(j) || (j.is_object() && j.contains("text_config") && has_shape(j["text_config"]));
}

/// Reads and parses a config.json file. Throws kdalab::Error naming the path when it cannot be
/// opened, is not valid JSON or is nested more than kMaxJsonDepth levels deep, and as parse_model_config() otherwise.
inline ModelConfig read_model_config(const std::string& path) {
  std::ifstream f(path);
  require(f.good(), "model config '" + path + "' cannot be opened");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str(), [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > kMaxJsonDepth)
        throw Error("model config '" + path + "' is nested more than " + std::to_string(kMaxJsonDepth) +
                    " levels deep; accepted: at most " + std::to_string(kMaxJsonDepth) + " (a config.json is nearly flat)");
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw Error("model config '" + path + "' is not valid JSON: " + e.what());
  }
  return parse_model_config(j, path);
}

}  // namespace kdalab
