// `kdalab info --config MODEL.json`: the per-layer layout of a Kimi Linear / K3 config.json and the
// per-sequence cache bytes of the hybrid vs the same stack with every layer MLA (and plain MHA). The MLA layers are
// named "Gated MLA" only when the config has mla_use_output_gate (K3); Kimi Linear's MLA has no output gate.
// Element sizes: MLA latent cache bf16 (2 B), KDA state fp32 (4 B), ShortConv tails bf16 (2 B).
#include <fmt/format.h>

#include <string>

#include "experiments/cli.hpp"
#include "reference/hybrid.hpp"
#include "reference/model_config.hpp"

namespace kdalab::cli {

namespace {
constexpr double kLatentBytes = 2, kStateBytes = 4, kConvBytes = 2;

std::string mib(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }
}  // namespace

bool print_model_info(const std::string& config_path, ResultsFile* out) {
  const ModelConfig m = read_model_config(config_path);
  const std::size_t nk = m.count(LayerKind::kda), nm = m.count(LayerKind::mla);
  // "Gated MLA" only when the config gates the MLA output (mla_use_output_gate, K3); Kimi Linear's are plain MLA
  const std::string mla_name = m.mla.output_gate ? "Gated MLA" : "MLA";
  fmt::print("\nmodel:         {} ({}), hidden {}, {} layers: {} KDA + {} {}\n", config_path,
             m.model_type.empty() ? "model_type not given" : m.model_type, m.hidden, m.num_layers, nk, nm, mla_name);
  if (nk)
    fmt::print("KDA layers:    {} heads x {} (d_k = d_v), ShortConv kernel {}, gate {}, {} gate logit\n", m.kda.num_heads,
               m.kda.head_dim, m.kda.conv_kernel,
               m.kda.bounded_gate ? fmt::format("bounded (K3, g_min = {})", m.kda.g_min) : std::string("softplus (Kimi Linear)"),
               m.kda.full_rank_gate ? "full-rank" : "low-rank");
  if (nm)
    fmt::print("MLA layers:    {} heads, d_c (kv_lora_rank) {}, q_lora_rank {}, qk_nope {}, qk_rope {}{}, v {}, output gate {}\n",
               m.mla.n_h, m.mla.d_c, m.mla.d_cq ? std::to_string(m.mla.d_cq) : std::string("none"), m.mla.d_nope,
               m.mla.d_rope, m.mla.d_rope ? (m.mla.rope ? " (RoPE)"
                                         : " (the config's decoupled-RoPE width; mla_use_nope: kdalab's MLA applies no "
                                           "rotation to these dims, NoPE, see docs/equations.md section 5)")
                            : "", m.mla.d_v,
               m.mla.output_gate ? "yes" : "no");
  std::string res = residual_mode_name(m.opt.residual);
  if (m.opt.residual == ResidualMode::block)
    res = fmt::format("block AttnRes, {} decoder layers per block ({} blocks + the embedding)", m.attn_res_block_size,
                      (m.num_layers + m.attn_res_block_size - 1) / m.attn_res_block_size);
  else if (m.opt.residual == ResidualMode::full)
    res = "full AttnRes";
  fmt::print("residuals:     {}\n", res);
  std::string pattern;
  for (std::size_t l = 0; l < m.num_layers; ++l) {
    pattern += m.layers[l] == LayerKind::kda ? 'K' : 'M';
    if (l + 1 < m.num_layers && (l + 1) % 4 == 0) pattern += ' ';
  }
  fmt::print("layout:        {}   (K = KDA, M = {}; groups of 4)\n\n", pattern, mla_name);

  // per-layer table
  Table layers;
  layers.col("layer", 'i', "1", "decoder layer id (1-based, as in kda_layers / full_attn_layers)")
      .col("kind", 's', "1", "KDA or MLA")
      .col("cache_values_per_token", 'i', "1", "numbers cached per token (MLA: d_c + d_rope)")
      .col("fixed_values", 'i', "1", "numbers kept regardless of length (KDA: state H d_k d_v + ShortConv tails)");
  fmt::print("{:>6}  {:<4}{:>22}{:>18}\n", "layer", "kind", "cache/token (numbers)", "fixed (numbers)");
  for (std::size_t l = 0; l < m.num_layers; ++l) {
    const bool mla = m.layers[l] == LayerKind::mla;
    const std::size_t per = mla ? mla_cache_values_per_token(m.mla) : 0;
    const std::size_t fixed = mla ? 0 : kda_state_values(m.kda.num_heads, m.kda.head_dim, m.kda.head_dim, m.kda.conv_kernel);
    fmt::print("{:>6}  {:<4}{:>22}{:>18}\n", l + 1, layer_kind_name(m.layers[l]), per, fixed);
    layers.row({static_cast<std::int64_t>(l + 1), layer_kind_name(m.layers[l]), static_cast<std::int64_t>(per),
                static_cast<std::int64_t>(fixed)});
  }

  if (nm == 0) {
    fmt::print("\nno {} layer: no per-token cache to compare\n", mla_name);
    return true;
  }
  const CacheFootprint f = cache_footprint(m);
  const double hyb = kLatentBytes * f.per_token, full = kLatentBytes * f.full_mla_per_token,
               mha = kLatentBytes * f.mha_per_token;
  fmt::print("\ncache per token (latent bf16 = 2 B; KDA state fp32 = 4 B; ShortConv tails bf16 = 2 B):\n");
  fmt::print("  hybrid:    {} MLA x {} = {} numbers = {} B/token, plus a fixed {} ({} KDA layers)\n", nm,
             mla_cache_values_per_token(m.mla), f.per_token, hyb, mib(kStateBytes * f.kda_state + kConvBytes * f.kda_conv), nk);
  fmt::print("  full MLA:  {} MLA x {} = {} numbers = {} B/token  ({:.2f}x the hybrid per token)\n", m.num_layers,
             mla_cache_values_per_token(m.mla), f.full_mla_per_token, full, full / hyb);
  fmt::print("  full MHA:  {} x {} = {} numbers = {} B/token  ({:.1f}x full MLA)\n", m.num_layers,
             mha_cache_values_per_token(m.mla), f.mha_per_token, mha, mha / full);
  Table ctxs;
  ctxs.col("n", 'i', "1", "context length (tokens cached)")
      .col("hybrid_bytes", 'd', "B", "hybrid: MLA latents of n tokens + KDA states and tails")
      // the config's own MLA layer on every layer: "Gated MLA" only with an output gate (was "Gated MLA" for every model)
      .col("full_mla_bytes", 'd', "B",
           fmt::format("every layer {} (the config's MLA layer{}): latents of n tokens", mla_name,
                       m.mla.output_gate ? ", output gate on" : ", no output gate"))
      .col("ratio", 'd', "1", "full_mla_bytes / hybrid_bytes");
  fmt::print("\n{:>10}{:>16}{:>16}{:>9}\n", "context", "hybrid", "full MLA", "ratio");
  for (double n : {4096.0, 131072.0, 1048576.0}) {
    const double h = f.hybrid_bytes(n, kLatentBytes, kStateBytes, kConvBytes), a = f.full_mla_bytes(n, kLatentBytes);
    fmt::print("{:>10}{:>16}{:>16}{:>8.2f}x\n", static_cast<std::int64_t>(n), mib(h), mib(a), a / h);
    ctxs.row({static_cast<std::int64_t>(n), h, a, a / h});
  }
  if (out) {
    out->group("model", "per-layer layout and cache bytes of the model config (kdalab info --config)");
    out->attr("model", "config_path", config_path);
    out->attr("model", "layout", pattern);
    out->attr("model", "residual", res);
    out->write_table("model/layers", layers);
    out->write_table("model/cache", ctxs);
    out->attr("model", "hybrid_bytes_per_token", hyb);
    out->attr("model", "full_mla_bytes_per_token", full);
    out->attr("model", "mha_bytes_per_token", mha);
  }
  return true;
}

}  // namespace kdalab::cli
