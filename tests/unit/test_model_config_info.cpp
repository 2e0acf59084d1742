// `kdalab info --config MODEL.json` (ISSUE 4 "Done when"): prints the per-layer layout and the
// per-token cache bytes of the hybrid vs full MLA, records them with --out, and a bad config exits 2
// with one line naming the key; the MLA layers are "Gated MLA" only when the config gates their output.
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "experiments/results.hpp"
#include "tests/catch.hpp"

namespace {

struct Run {
  int rc;
  std::string out;
};

Run run(const std::string& args) {
  const char* bin = std::getenv("KDALAB_BIN");
  REQUIRE(bin != nullptr);
  const std::string cmd = std::string(bin) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p)) out += buf.data();
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("kdalab info --config kimi-linear-48b.json prints the layout and cache bytes", "[model_config][cli]") {
  const Run r = run("info --config data/configs/kimi-linear-48b.json");
  INFO(r.out);
  CHECK(r.rc == 0);
  // Kimi Linear's MLA has no output gate (mla_use_output_gate absent): its layers are "MLA", not "Gated MLA"
  // (session 7: the layout legend said "M = Gated MLA" under "output gate no")
  CHECK(has(r.out, "output gate no"));
  CHECK(has(r.out, "27 layers: 20 KDA + 7 MLA\n"));
  CHECK(has(r.out, "KKKM KKKM KKKM KKKM KKKM KKKM KKM   (K = KDA, M = MLA; groups of 4)"));
  CHECK(!has(r.out, "Gated MLA"));
  CHECK(has(r.out, "    27  MLA                    576"));
  CHECK(has(r.out, "7 MLA x 576 = 4032 numbers = 8064 B/token"));
  CHECK(has(r.out, "27 MLA x 576 = 15552 numbers = 31104 B/token  (3.86x the hybrid per token)"));
}

TEST_CASE("kdalab info --config records the layout with --out; bad configs exit 2", "[model_config][cli]") {
  // a scratch file outside the repository (a build folder named build/ need not exist: the GPU machine builds in /tmp)
  const std::string path =
      (std::filesystem::temp_directory_path() / ("kdalab_test_model_info_" + std::to_string(::getpid()) + ".h5")).string();
  std::remove(path.c_str());
  const Run r = run("info --config data/configs/toy.json --out " + path + " --quiet");
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(kdalab::h5read::attr_string(path, "model", "layout") == "KKKM KKKM M");
  // toy.json gates its MLA output (mla_use_output_gate: true, as K3): those layers are Gated MLA
  CHECK(has(r.out, "output gate yes"));
  CHECK(has(r.out, "9 layers: 6 KDA + 3 Gated MLA\n"));
  CHECK(has(r.out, "(K = KDA, M = Gated MLA; groups of 4)"));
  const auto ids = kdalab::h5read::array(path, "model/layers/layer");
  CHECK(ids.numel() == 9);
  CHECK(kdalab::h5read::attr_double(path, "model", "hybrid_bytes_per_token") == 2.0 * 3 * 16);
  std::remove(path.c_str());
  const Run bad = run("info --config data/configs/no-such-model.json");
  CHECK(bad.rc == 2);
  CHECK(has(bad.out, "no-such-model.json': no such file"));  // refused before the banner (session 6)
  CHECK(has(bad.out, "data/configs/kimi-linear-48b.json"));
  CHECK(!has(bad.out, "compiler:"));
}
