// The JSON readers (--config option files, bench --peer-json, info --config model configs): kMaxJsonDepth levels of
// nesting are read and one more is refused, a value nested a million levels deep is one line (exit 2, no crash), and
// a file of 100000 keys is read in seconds.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
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

TEST_CASE("every JSON reader accepts kMaxJsonDepth levels of nesting and refuses deeper ones (one line, exit 2, no crash)",
          "[bench][info][config]") {
  {
    const std::string d = fresh_dir("deep");
    const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
    write_file(d + "/peer.json", "{\"kda-prefill B=1 T=8192 H=64 HV=64\": " + deep + "}");
    write_file(d + "/opts.json", "{\"iters\": " + deep + "}");
    write_file(d + "/model.json", "{\"hidden_size\": " + deep + "}");
    for (const std::string& args :
         {"bench --peer-json " + d + "/peer.json --out " + d + "/o.h5", "bench --config " + d + "/opts.json --out " + d + "/o.h5",
          "info --config " + d + "/model.json"}) {
      const RunResult r = run_kdalab(args);
      INFO(args << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, "nested more than 64 levels deep"));
      CHECK(lines(r.output) == 1);
    }
    CHECK(!std::filesystem::exists(d + "/o.h5"));
    // a shallow nesting is still read (a metadata key holding an object)
    write_file(d + "/meta.json", "{\"_meta\": {\"a\": [1, [2, {\"b\": 3}]]}, \"kda-prefill B=1 T=8192 H=64 HV=64\": 1.5}");
    const RunResult ok = run_kdalab("bench --op kda-prefill --peer-json " + d + "/meta.json --out " + d + "/o.h5");
    INFO(ok.output);
    CHECK(bench_valid_exit(ok));
  }
  // one nesting limit, kdalab::kMaxJsonDepth (reference/model_config.hpp), for model configs, --config option files
  // and --peer-json: every reader takes exactly that depth and refuses one more
  {
    TempDir d;
    for (const int n : {kMaxJsonDepth, kMaxJsonDepth + 1}) {
      const std::string v = std::string(static_cast<std::size_t>(n), '[') + std::string(static_cast<std::size_t>(n), ']');
      d.write("model.json", "{\"hidden_size\": " + v + "}");
      d.write("opts.json", "{\"T\": " + v + "}");
      d.write("peer.json", "{\"_meta\": " + v + "}");
      for (const std::string& args : {"info --config " + d.file("model.json"),
                                      "parity --config " + d.file("opts.json") + " --out " + d.file("o.h5"),
                                      "bench --peer-json " + d.file("peer.json") + " --out " + d.file("o.h5")}) {
        const RunResult r = run_kdalab(args);
        INFO(n << " levels: " << args << "\n" << r.output);
        CHECK(has(r, "nested more than " + std::to_string(kMaxJsonDepth) + " levels deep") == (n > kMaxJsonDepth));
        if (n > kMaxJsonDepth) CHECK(r.code == 2);
      }
    }
    CHECK(!std::filesystem::exists(d.file("o.h5")));
  }
}

TEST_CASE("a --peer-json file of 100000 keys is read in seconds (the repeated-key check is not quadratic)", "[bench]") {
  const std::string d = fresh_dir("many");
  std::string text = "{";
  for (int i = 0; i < 100000; ++i) {
    if (i) text += ",";
    text += "\"_m";
    text += std::to_string(i);
    text += "\": 1";
  }
  text += ", \"_m77\": 1}";  // one repeat at the end: still found
  write_file(d + "/many.json", text);
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r = run_kdalab("bench --peer-json " + d + "/many.json --out " + d + "/o.h5");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output << "\n" << s << " s");
  CHECK(r.code == 2);
  CHECK(has(r, "key '_m77' appears twice"));
  CHECK(s < 20.0);
}
