// `kdalab info`: reports the build and never needs a GPU; --config takes a Hugging Face style model config (any other
// file is one line before any output, naming a model config); the MLA description follows the config (qk_rope width,
// Gated MLA only with an output gate).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "experiments/decode_cost_note.hpp"
#include "experiments/results.hpp"
#include "reference/model_config.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("kdalab info reports the build and never needs a GPU", "[info]") {
  const auto r = run_kdalab("info");
  INFO(r.output);
  CHECK(r.code == 0);
  for (const char* key : {"git", "compiler", "build type", "CUDA kernels", "GPU"}) CHECK(r.output.find(key) != std::string::npos);
}

// `kdalab info --config MODEL.json`: the per-layer layout and the per-token cache bytes of the hybrid vs full MLA,
// recorded with --out; the MLA layers are "Gated MLA" only when the config gates their output.
TEST_CASE("kdalab info --config kimi-linear-48b.json prints the layout and cache bytes", "[info]") {
  const RunResult r = run_kdalab("info --config data/configs/kimi-linear-48b.json");
  INFO(r.output);
  CHECK(r.code == 0);
  // Kimi Linear's MLA has no output gate (mla_use_output_gate absent): its layers are "MLA", not "Gated MLA"
  CHECK(has(r, "output gate no"));
  CHECK(has(r, "27 layers: 20 KDA + 7 MLA\n"));
  CHECK(has(r, "KKKM KKKM KKKM KKKM KKKM KKKM KKM   (K = KDA, M = MLA; groups of 4)"));
  CHECK(!has(r, "Gated MLA"));
  CHECK(has(r, "    27  MLA                    576"));
  CHECK(has(r, "7 MLA x 576 = 4032 numbers = 8064 B/token"));
  CHECK(has(r, "27 MLA x 576 = 15552 numbers = 31104 B/token  (3.86x the hybrid per token)"));
}

TEST_CASE("kdalab info --config records the layout with --out; a missing config is one line before any banner", "[info]") {
  // a scratch file outside the repository (a build folder named build/ need not exist: the GPU machine builds in /tmp)
  const std::string path =
      (std::filesystem::temp_directory_path() / ("kdalab_test_model_info_" + std::to_string(::getpid()) + ".h5")).string();
  std::remove(path.c_str());
  const RunResult r = run_kdalab("info --config data/configs/toy.json --out " + path + " --quiet");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(kdalab::h5read::attr_string(path, "model", "layout") == "KKKM KKKM M");
  // toy.json gates its MLA output (mla_use_output_gate: true, as K3): those layers are Gated MLA
  CHECK(has(r, "output gate yes"));
  CHECK(has(r, "9 layers: 6 KDA + 3 Gated MLA\n"));
  CHECK(has(r, "(K = KDA, M = Gated MLA; groups of 4)"));
  const auto ids = kdalab::h5read::array(path, "model/layers/layer");
  CHECK(ids.numel() == 9);
  CHECK(kdalab::h5read::attr_double(path, "model", "hybrid_bytes_per_token") == 2.0 * 3 * 16);
  std::remove(path.c_str());
  const RunResult bad = run_kdalab("info --config data/configs/no-such-model.json");
  CHECK(bad.code == 2);
  CHECK(has(bad, "no-such-model.json': no such file"));  // refused before the banner
  CHECK(has(bad, "data/configs/kimi-linear-48b.json"));  // where configs live
  CHECK(!has(bad, "compiler"));  // no banner
}

TEST_CASE("info --config with a file that is not a model config: one line before any output, saying once what the file is",
          "[info]") {
  // the refusal says what the file is, once: a kdalab options file, and for which subcommand (not "a model config
  // missing hidden_size"); a model config with one bad value: the reader's message alone (no "not a kdalab options
  // file").
  {
    TempDir d;
    std::string k3 = slurp("data/configs/kimi-k3.json");
    const std::string key = "\"num_hidden_layers\": 93";
    REQUIRE(k3.find(key) != std::string::npos);
    k3.replace(k3.find(key), key.size(), "\"num_hidden_layers\": 20000");
    d.write("k3_big.json", k3);
    d.write("other.json", "{\"foo\": 1}");
    struct Case {
      std::string file, want;
      std::vector<std::string> never;
    };
    for (const Case& c : std::vector<Case>{
             {d.file("k3_big.json"), "config key 'num_hidden_layers' = 20000", {"options file", "expects"}},
             {"data/configs/parity.json",
              "--config 'data/configs/parity.json' is a kdalab options file (its keys are options of kdalab parity; run it "
              "with 'kdalab parity --config data/configs/parity.json'), not a model config; info --config expects a "
              "Hugging Face style model config.json, e.g. data/configs/kimi-linear-48b.json",
              {"hidden_size", "model config '"}},
             {"data/configs/decode_cost.json", "is a kdalab options file (its keys are options of kdalab decode-cost;", {}},
             {d.file("other.json"), "config key 'hidden_size' is missing", {"options file"}}}) {
      const RunResult r = run_kdalab("info --config " + c.file);
      INFO(c.file << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
      CHECK(has(r, c.want));
      for (const auto& n : c.never) CHECK(!has(r, n));
    }
  }
  {
    const auto r = run_kdalab("info --config data/configs/parity.json");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(lines(r.output) == 1);   // the one error line, nothing before it
    CHECK(!has(r, "compiler:"));        // no banner
    CHECK(has(r, "is a kdalab options file (its keys are options of kdalab parity"));  // what it is (not
                                                                                          // "'hidden_size' is missing")
    CHECK(has(r, "info --config expects a Hugging Face style model config.json"));
    CHECK(has(r, "data/configs/kimi-linear-48b.json"));
    // a model config still prints the banner and the layout
    const auto ok = run_kdalab("info --config data/configs/kimi-linear-48b.json");
    INFO(ok.output);
    CHECK(ok.code == 0);
    CHECK(has(ok, "compiler:"));
    CHECK(has(ok, "layout:"));
  }
}

TEST_CASE("info: full_mla_bytes names the config's own MLA layer (Gated MLA only with an output gate)", "[info]") {
  TempDir d;
  const auto r = run_kdalab("info --config data/configs/kimi-linear-48b.json --quiet --out " + d.file("kl.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string kl = kdalab::h5read::attr_string(d.file("kl.h5"), "model/cache/full_mla_bytes", "description");
  INFO(kl);
  CHECK(kl.find("Gated") == std::string::npos);  // Kimi Linear's MLA has no output gate (was "every layer Gated MLA")
  CHECK(kl.rfind("every layer MLA (the config's MLA layer, no output gate)", 0) == 0);
  const auto r2 = run_kdalab("info --config data/configs/toy.json --quiet --out " + d.file("toy.h5"));
  INFO(r2.output);
  REQUIRE(r2.code == 0);
  const std::string toy = kdalab::h5read::attr_string(d.file("toy.h5"), "model/cache/full_mla_bytes", "description");
  INFO(toy);
  CHECK(toy.rfind("every layer Gated MLA (the config's MLA layer, output gate on)", 0) == 0);
}

TEST_CASE("info --config kimi-k3: the qk_rope width is described, not called NoPE without a word", "[info]") {
  const auto r = run_kdalab("info --config data/configs/kimi-k3.json");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(!has(r, "(NoPE: unrotated)"));
  CHECK(has(r, "qk_rope 64 (the config's decoupled-RoPE width; mla_use_nope: kdalab's MLA applies no rotation to "
               "these dims, NoPE, see docs/equations.md section 5)"));
}
