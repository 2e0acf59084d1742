// Model configs (info --config): every size key has a cap (reference/model_config.hpp kMaxConfig*), refused before any
// allocation naming the key, the value and the accepted range (exit 2, one line); a size of 2^64 - 1 or beyond is
// "too large".
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "reference/model_config.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

TEST_CASE("every size key of a model config has a cap, refused before any allocation (exit 2, one line)",
          "[info][config]") {
  TempDir d;
  using namespace kdalab;
  struct Key {
    std::string name;
    std::size_t min, max;
  };
  const std::vector<Key> keys = {
      {"num_hidden_layers", 1, kMaxConfigLayers},
      {"attn_res_block_size", 1, kMaxConfigLayers},
      {"hidden_size", 1, kMaxConfigWidth},
      {"intermediate_size", 0, kMaxConfigWidth},
      {"kv_lora_rank", 1, kMaxConfigWidth},
      {"q_lora_rank", 1, kMaxConfigWidth},
      {"kdalab.ffn_dim", 1, kMaxConfigWidth},
      {"num_attention_heads", 1, kMaxConfigHeads},
      {"linear_attn_config.num_heads", 1, kMaxConfigHeads},
      {"qk_nope_head_dim", 1, kMaxConfigHeadDim},
      {"qk_rope_head_dim", 0, kMaxConfigHeadDim},
      {"v_head_dim", 1, kMaxConfigHeadDim},
      {"linear_attn_config.head_dim", 1, kMaxConfigHeadDim},
      {"linear_attn_config.short_conv_kernel_size", 1, kMaxConfigConvKernel},
      {"linear_attn_config.kda_layer_index_base", 0, 1},
  };
  for (const Key& k : keys) {
    const std::string range = "accepted: " + std::to_string(k.min) + " .. " + std::to_string(k.max);
    // 1e11 as an integer and as JSON's 1e11 (a float), and one above the cap
    for (const json& v : {json(std::uint64_t{100000000000}), json(1e11), json(std::uint64_t{k.max + 1})}) {
      const RunResult r = info_with(d, k.name, v);
      INFO(k.name << " = " << v.dump() << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, "config key '" + k.name + "' = " + v.dump()));
      CHECK(has(r, "is too large; " + range));
      CHECK(lines(r.output) == 1);
      CHECK(!has(r, "memory"));
    }
  }
  // a model at the caps is still read: 16384 decoder layers (every layer MLA), the widest widths
  const RunResult ok = run_kdalab("info --config " + model_config(d, [](json& j) {
                                    j.erase("linear_attn_config");
                                    j["num_hidden_layers"] = kMaxConfigLayers;
                                    j["hidden_size"] = kMaxConfigWidth;
                                    j["num_attention_heads"] = kMaxConfigHeads;
                                    j["v_head_dim"] = kMaxConfigHeadDim;
                                  }));
  INFO(ok.output.substr(0, 2000));
  CHECK(ok.code == 0);
  CHECK(has(ok, "hidden 1048576, 16384 layers: 0 KDA + 16384 MLA"));
}

TEST_CASE("a size of 2^64 - 1 or beyond is 'too large' with the accepted range, not 'not a non-negative integer'",
          "[info][config]") {
  TempDir d;
  const std::string range = "accepted: 1 .. " + std::to_string(kdalab::kMaxConfigWidth);
  for (const json& v : {json(UINT64_MAX), json(1e20)}) {  // 1e20: JSON's 99999999999999999999 is a float too
    const RunResult r = info_with(d, "hidden_size", v);
    INFO(v.dump() << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "config key 'hidden_size' = " + v.dump()));
    CHECK(has(r, "is too large; " + range));
    CHECK(!has(r, "not a non-negative integer"));
  }
  CHECK(has(info_with(d, "hidden_size", UINT64_MAX), "18446744073709551615"));
  // below the range, or not an integer: that, with the range
  RunResult r = info_with(d, "hidden_size", -1);
  CHECK(has(r, "'hidden_size' = -1 (" + d.file("model.json") + ") is not a non-negative integer; " + range));
  r = info_with(d, "hidden_size", 2304.5);
  CHECK(has(r, "'hidden_size' = 2304.5 (" + d.file("model.json") + ") is not a non-negative integer; " + range));
  r = info_with(d, "hidden_size", 0);
  CHECK(has(r, "'hidden_size' = 0 (" + d.file("model.json") + "); " + range));
  // a key without a cap takes every 64-bit value (a seed): 2^64 - 1 is read, not refused
  r = info_with(d, "kdalab.seed", UINT64_MAX);
  INFO(r.output);
  CHECK(r.code == 0);
}

TEST_CASE("a layer id of 2^63 or beyond is named as given, too large, not as a negative id", "[info][config]") {
  TempDir d;
  for (const std::uint64_t id : {std::uint64_t{1} << 63, UINT64_MAX}) {
    const RunResult r = run_kdalab("info --config " + model_config(d, [&](json& j) {
                                     j["linear_attn_config"]["kda_layers"][0] = id;
                                   }));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(lines(r.output) == 1);
    CHECK(has(r, "config key 'linear_attn_config.kda_layers' entry 0 = " + std::to_string(id)));
    CHECK(has(r, "is too large for a layer id"));
    CHECK(!has(r, "-9223372036854775808"));
    CHECK(!has(r, "layer id -"));
  }
}
