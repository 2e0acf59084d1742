// Model configs: the shipped configs load with the published shapes; a user's own
// config.json loads the same way (unknown keys ignored, text_config nesting, 0-based ids); missing
// or inconsistent keys give kdalab::Error naming the key. Cache footprint of Kimi Linear 48B.
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "reference/hybrid.hpp"
#include "reference/model_config.hpp"
#include "tests/catch.hpp"

using namespace kdalab;
using nlohmann::json;

namespace {

json kimi_linear() {
  std::ifstream f("data/configs/kimi-linear-48b.json");
  return json::parse(f);
}

std::string err(const json& j) {
  try {
    parse_model_config(j, "test.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("model config: Kimi Linear 48B has the published shapes", "[model_config]") {
  const ModelConfig m = read_model_config("data/configs/kimi-linear-48b.json");
  CHECK(m.hidden == 2304);
  CHECK(m.num_layers == 27);
  CHECK(m.count(LayerKind::kda) == 20);
  CHECK(m.count(LayerKind::mla) == 7);
  CHECK(m.full_attn_layers == std::vector<std::size_t>{4, 8, 12, 16, 20, 24, 27});
  CHECK(m.layers[3] == LayerKind::mla);
  CHECK(m.layers[26] == LayerKind::mla);
  CHECK(m.layers[25] == LayerKind::kda);
  CHECK(m.kda.num_heads == 32);
  CHECK(m.kda.head_dim == 128);  // 32 x 128 = 4096 from hidden 2304: heads need not divide hidden
  CHECK(m.kda.conv_kernel == 4);
  CHECK_FALSE(m.kda.bounded_gate);  // no gate_lower_bound: the Kimi Linear softplus gate
  CHECK(m.mla.n_h == 32);
  CHECK(m.mla.d_c == 512);
  CHECK(m.mla.d_cq == 0);  // q_lora_rank null
  CHECK(m.mla.d_nope == 128);
  CHECK(m.mla.d_rope == 64);
  CHECK(m.mla.d_v == 128);
  CHECK_FALSE(m.mla.rope);  // mla_use_nope
  CHECK_FALSE(m.mla.output_gate);
  CHECK(m.opt.residual == ResidualMode::plain);
  const CacheFootprint f = cache_footprint(m);
  CHECK(f.per_token == 7 * 576);
  CHECK(f.full_mla_per_token == 27 * 576);
  CHECK(f.mha_per_token == 27 * 32 * (192 + 128));
  CHECK(f.kda_state == 20 * 32 * 128 * 128);
  CHECK(f.kda_conv == 20 * 3 * 32 * 384);
  CHECK(f.fixed() == 20 * (32 * 128 * 128 + 3 * 32 * 384));
}

TEST_CASE("model config: K3 public widths, illustrative layer count", "[model_config]") {
  const ModelConfig m = read_model_config("data/configs/kimi-k3.json");
  CHECK(m.hidden == 7168);
  CHECK(m.num_layers == 93);
  CHECK(m.count(LayerKind::mla) == 24);  // 23 blocks of 3 KDA + 1 MLA, plus the final MLA
  CHECK(m.layers[92] == LayerKind::mla);
  CHECK(m.layers[91] == LayerKind::mla);
  CHECK(m.layers[90] == LayerKind::kda);
  CHECK(m.kda.num_heads == 96);
  CHECK(m.kda.bounded_gate);
  CHECK(m.kda.g_min == -5.0);
  CHECK(m.mla.n_h == 96);
  CHECK(m.mla.d_cq == 1536);
  CHECK(m.mla.output_gate);
  CHECK(m.attn_res_block_size == 12);
  CHECK(m.opt.residual == ResidualMode::block);
}

TEST_CASE("model config: a user's config.json loads the same way", "[model_config]") {
  json j = kimi_linear();
  j["some_future_key"] = {{"nested", 1}};
  j["kdalab"].erase("seed");
  const ModelConfig a = parse_model_config(j);
  CHECK(a.count(LayerKind::mla) == 7);
  // nested under text_config (multimodal wrappers)
  const json wrapped = {{"model_type", "wrapper"}, {"text_config", kimi_linear()}};
  CHECK(parse_model_config(wrapped).num_layers == 27);
  // 0-based ids
  json z = kimi_linear();
  z["linear_attn_config"]["kda_layer_index_base"] = 0;
  for (const char* key : {"kda_layers", "full_attn_layers"}) {
    const json old = z["linear_attn_config"][key];
    json ids = json::array();
    for (const auto& v : old) ids.push_back(v.get<int>() - 1);
    z["linear_attn_config"][key] = ids;
  }
  const ModelConfig b = parse_model_config(z);
  CHECK(b.layers == a.layers);
  CHECK(b.full_attn_layers == a.full_attn_layers);
  // no linear_attn_config: an MLA-only model
  json mla_only = kimi_linear();
  mla_only.erase("linear_attn_config");
  CHECK(parse_model_config(mla_only).count(LayerKind::mla) == 27);
}

TEST_CASE("model config: missing or inconsistent keys give errors naming the key", "[model_config][errors]") {
  auto has = [](const std::string& msg, const std::string& what) {
    INFO(msg);
    CHECK(msg.find(what) != std::string::npos);
  };
  SECTION("missing needed keys") {
    for (const char* key : {"hidden_size", "num_hidden_layers", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                            "v_head_dim", "num_attention_heads"}) {
      json j = kimi_linear();
      j.erase(key);
      const std::string e = err(j);
      has(e, std::string("'") + key + "' is missing");
      has(e, "test.json");
    }
    for (const char* key : {"num_heads", "head_dim", "short_conv_kernel_size", "kda_layers", "full_attn_layers"}) {
      json j = kimi_linear();
      j["linear_attn_config"].erase(key);
      has(err(j), std::string("'linear_attn_config.") + key + "' is missing");
    }
  }
  SECTION("d_c < 1 and other out-of-range values") {
    json j = kimi_linear();
    j["kv_lora_rank"] = 0;
    has(err(j), "'kv_lora_rank' = 0");
    j = kimi_linear();
    j["hidden_size"] = "2304";
    has(err(j), "'hidden_size' = \"2304\" (test.json) is not a non-negative integer");
    j = kimi_linear();
    j["qk_nope_head_dim"] = -1;
    has(err(j), "'qk_nope_head_dim'");
    j = kimi_linear();
    j["linear_attn_config"]["gate_lower_bound"] = 0.5;
    has(err(j), "'linear_attn_config.gate_lower_bound' = 0.5");
    j = kimi_linear();
    j["mla_use_nope"] = false;
    j["qk_rope_head_dim"] = 63;
    has(err(j), "'qk_rope_head_dim' = 63");
    j = kimi_linear();
    j["kdalab"]["residual"] = "block";
    has(err(j), "'attn_res_block_size'");
    j = kimi_linear();
    j["kdalab"]["ffn"] = "moe";
    has(err(j), "'kdalab.ffn' = 'moe'");
    j = kimi_linear();
    j["kdalab"]["typo_key"] = 1;
    has(err(j), "'kdalab.typo_key'");
  }
  SECTION("layer lists that do not partition 1..num_hidden_layers") {
    json j = kimi_linear();
    j["linear_attn_config"]["full_attn_layers"] = {4, 8, 12, 16, 20, 24};  // 27 in neither
    has(err(j), "layer 27 is in neither list");
    j = kimi_linear();
    j["linear_attn_config"]["full_attn_layers"] = {3, 4, 8, 12, 16, 20, 24, 27};  // 3 in both
    has(err(j), "layer id 3 (test.json) is in both");
    j = kimi_linear();
    j["linear_attn_config"]["full_attn_layers"] = {4, 8, 12, 16, 20, 24, 27, 28};
    has(err(j), "layer id 28");
    has(err(j), "outside 1..27");
    j = kimi_linear();
    j["linear_attn_config"]["full_attn_layers"] = {4, 4, 8, 12, 16, 20, 24, 27};
    has(err(j), "listed twice");
    j = kimi_linear();
    j["linear_attn_config"]["kda_layers"] = {0, 1, 2, 3};  // 0 with 1-based ids
    has(err(j), "layer id 0");
    j = kimi_linear();
    j["num_hidden_layers"] = 26;
    has(err(j), "layer id 27");
    j = kimi_linear();
    j["linear_attn_config"]["kda_layers"] = "1-3";
    has(err(j), "'linear_attn_config.kda_layers' = \"1-3\"");
  }
  SECTION("files") {
    try {
      read_model_config("data/configs/no-such-model.json");
      FAIL("no error");
    } catch (const Error& e) {
      has(e.what(), "no-such-model.json' cannot be opened");
    }
    // a scratch file outside the repository (a build folder named build/ need not exist: the GPU machine builds in /tmp)
    const std::string tmp =
        (std::filesystem::temp_directory_path() / ("kdalab_test_model_config_bad_" + std::to_string(::getpid()) + ".json"))
            .string();
    { std::ofstream f(tmp); f << "{\"hidden_size\": 3,"; }
    try {
      read_model_config(tmp);
      FAIL("no error");
    } catch (const Error& e) {
      has(e.what(), "is not valid JSON");
    }
    std::remove(tmp.c_str());
  }
}
