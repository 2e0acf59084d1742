// Figure footers (every scripts/fig_*.py): they name the results file, leave out the run-control options (out,
// quick, quiet) and keep the seed and the grid, and are wrapped whole (no '…'); a --quick run's title says so.
// Runs /usr/bin/python3; skipped with a warning when it lacks h5py or matplotlib.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

TEST_CASE("figure footers leave out the run-control options (out, quick, quiet) and keep the seed and the grid",
          "[figures][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // parity has no group `options`: its footer shows the root config, which records out/quick/quiet/seed
  kdalab_ok("parity --quick --quiet --seed 7 --T 17 --dk 16 --dv 16 --impl float64,float32 --out " + d.file("parity.h5"));
  const std::string root = kdalab::h5read::attr_string(d.file("parity.h5"), "/", "config");
  INFO(root);
  CHECK(root.find("\"quick\"") != std::string::npos);  // the file still records them (a replay needs them) ...
  CHECK(root.find("\"out\"") != std::string::npos);
  const json j = draw(d, "fig_parity.py", d.file("parity.h5"));
  const std::string cfg = config_text(j);
  INFO(cfg);
  REQUIRE(cfg.rfind("config ", 0) == 0);
  for (const char* key : {" out=", " quick=", " quiet=", " force="}) CHECK(cfg.find(key) == std::string::npos);  // ... the footer not
  CHECK(cfg.find(" seed=7") != std::string::npos);
  CHECK(footer(j).find("seed 7\n") != std::string::npos);  // the provenance line
  CHECK(cfg.find(" T=17") != std::string::npos);         // options that change numbers stay,
  CHECK(cfg.find(" gate=[bounded,softplus]") != std::string::npos);  // including what --quick set
  CHECK(cfg.find(" truth=f64") != std::string::npos);
}

TEST_CASE("figure footers are wrapped whole: every config value and the whole command line, no '…'",
          "[figures][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const json j = draw(d, "fig_parity.py", long_parity_file(d));
  std::string foot = footer(j);
  INFO(foot);
  CHECK(foot.find("\u2026") == std::string::npos);  // was: the config cut after two lines with " …"
  CHECK(foot.find("...") == std::string::npos);
  // wrapped lines continue with two spaces of indent: undo the wrapping, then every pair must be there whole
  std::string flat;
  for (std::size_t k = 0; k < foot.size(); ++k) {
    if (foot.compare(k, 3, "\n  ") == 0) {
      flat += ' ';
      k += 2;
    } else {
      flat += foot[k];
    }
  }
  foot = flat;
  for (int i = 0; i < 30; ++i) {
    std::string ii = i < 10 ? "0" : "";
    ii += std::to_string(i);
    std::string kv = "impl-";
    kv += ii;
    kv += "=[";
    for (int k = 0; k < 6; ++k) {
      kv += k ? ",value-" : "value-";
      kv += ii;
      kv += "-";
      kv += std::to_string(k);
    }
    kv += "]";
    CHECK(foot.find(kv) != std::string::npos);
  }
  CHECK(foot.find(" last-key=the-end\n") != std::string::npos);
  CHECK(foot.find("--opt-59 59 --out tail.h5") != std::string::npos);  // the command line's tail
  int longest = 0, len = 0;
  for (char c : footer(j)) len = (c == '\n') ? (longest = std::max(longest, len), 0) : len + 1;
  CHECK(longest <= 260);  // wrapped at the figure's width, not one endless line
}

TEST_CASE("the footer names the results file, a --quick run's title says so", "[figures][python]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string full = d.file("dc.h5"), quick = d.file("dc_quick.h5");
  make_small_decode_cost(full);
  // --quick with the same small grid given explicitly (explicit options win): the file records "quick": true
  kdalab_ok("decode-cost --quick --cpu-n 1024,2048 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 --context 1024 "
              "--gpu-n 0 --quiet --out " + quick);
  const json jf = dump_figure(d, "fig_decode_cost.py", full);
  const json jq = dump_figure(d, "fig_decode_cost.py", quick);
  INFO(footer(jf));
  CHECK(footer(jf).find("drawn from " + full + "\n") != std::string::npos);
  CHECK(footer(jq).find("drawn from " + quick + "\n") != std::string::npos);
  CHECK(footer(jf).find("seed 1\n") != std::string::npos);  // the provenance line as before
  const std::string tf = jf["suptitle"], tq = jq["suptitle"];
  INFO(tf << "\n" << tq);
  CHECK(tq == tf + " (--quick run)");
  CHECK(tf.find("quick") == std::string::npos);
  // a figure without a suptitle (parity) says it in its first panel's title
  const std::string p = d.file("parity.h5");
  kdalab_ok("parity --quick --quiet --T 17 --dk 16 --dv 16 --impl float64,float32 --out " + p);
  const json jp = dump_figure(d, "fig_parity.py", p);
  INFO(jp["axes"][0]["title"]);
  CHECK(jp["suptitle"] == "");
  CHECK(jp["axes"][0]["title"] == "KDA numeric parity by implementation and precision (--quick run)");
}

TEST_CASE("figure footers write a run of numbered arguments as one shell brace range and keep a build's -dirty mark",
          "[figures][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  // the merge of 54 shard files: one brace range in the footer, which the shell expands to the same 54 arguments
  const json z = draw(d, "fig_train_zoology.py", "data/recall_train/zoology-reduced-h100.h5");
  INFO(footer(z));
  CHECK(footer(z).find("zoology-reduced-shard-{1..54}-of-54.h5 --out zoology-reduced-h100.h5") != std::string::npos);
  CHECK(footer(z).find("shard-2-of-54") == std::string::npos);
  // a file written by a build with uncommitted changes says so
  const json k = draw(d, "fig_train_kimi.py", "data/recall_train/kimi-reduced-softmax-h100.h5");
  INFO(footer(k));
  CHECK(footer(k).find("git a6756ca539db-dirty") != std::string::npos);
  // the rule itself: three or more arguments one integer apart, no leading zeros, the rest as typed
  const auto r = python("-c \"import sys; sys.path.insert(0, 'scripts'); import figstyle as fs; "
                        "print(fs.compact_command('m s1.h5 s2.h5 s4.h5 s5.h5 s6.h5 --out o.h5')); "
                        "print(fs.compact_command('a b1 b2 c09 c10 c11 k-7-of-9 k-8-of-9 k-9-of-9')); "
                        "print(fs.short_sha('0123456789abcdef-dirty'), fs.short_sha('0123456789abcdef'))\"");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output == "m s1.h5 s2.h5 s{4..6}.h5 --out o.h5\na b1 b2 c09 c10 c11 k-{7..9}-of-9\n"
                    "0123456789ab-dirty 0123456789ab\n");
}
