// Session 8 small leftovers, one test each:
// 1. bench --compare / --peer-json: a list option's value is split at its commas, so "a,b.h5" (an existing file) was
//    reported as "'a' does not exist"; the message now adds that the value was split and that such a name cannot
//    be given there (the existing message is kept);
// 2. `kdalab -x` names the unknown option and says to give a subcommand first (was only "A subcommand is required");
//    exit 2;
// 3. fig_hybrid's right panel labels its lines with the same prose as the left panel (was all-mla-27, kimi-k3);
// 4. fig_parity leaves out empty and repeated reasons of parity's `notes` (was "every row skipped: ." and "a; a.").
// The figure tests run /usr/bin/python3 with --dump and are skipped with a warning when it lacks h5py or matplotlib.
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using nlohmann::json;

namespace {

/// The strings of `parts` one after the other (GCC 12's -Wrestrict misfires on "literal" + std::string here).
std::string cat(std::initializer_list<std::string> parts) {
  std::string r;
  for (const auto& p : parts) r += p;
  return r;
}

/// Every text of axes `ax` with newlines (wrapping) made spaces, joined by " | ".
std::string axes_texts(const json& ax) {
  std::string all;
  for (const auto& t : ax["texts"]) all += std::string(t) + " | ";
  for (auto& c : all)
    if (c == '\n') c = ' ';
  return all;
}
}  // namespace

TEST_CASE("bench --compare a,b.h5 (one existing file) says the value was split at its commas", "[cli]") {
  TempDir d;
  d.write("a,b.h5", "x");
  const auto r = run_kdalab("bench --compare " + d.file("a,b.h5") + " --out " + d.file("o.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, cat({"--compare: '", d.file("a"), "' does not exist or is not a file; give a kdalab bench results file"})));
  CHECK(has(r, "the value was split at its commas"));
  CHECK(has(r, cat({"'", d.file("a,b.h5"), "' is a file: a file name containing a comma cannot be given to --compare"})));
  CHECK(d.count() == 1);  // no partial --out file
  // a comma list of files that do not exist: the message as before, no note
  const auto r2 = run_kdalab("bench --compare " + d.file("x.h5") + "," + d.file("y.h5") + " --out " + d.file("o.h5"));
  INFO(r2.output);
  CHECK(r2.code == 2);
  CHECK(has(r2, cat({"--compare: '", d.file("x.h5"), "' does not exist or is not a file"})));
  CHECK(!has(r2, "split at its commas"));
  // --peer-json, the other file list of bench: the same note
  d.write("p,q.json", "{}");
  const auto r3 = run_kdalab("bench --peer-json " + d.file("p,q.json") + " --out " + d.file("o.h5"));
  INFO(r3.output);
  CHECK(r3.code == 2);
  CHECK(has(r3, cat({"--peer-json: cannot open '", d.file("p"), "'"})));
  CHECK(has(r3, "a file name containing a comma cannot be given to --peer-json"));
}

TEST_CASE("kdalab -x names the unknown option and says to give a subcommand first", "[cli]") {
  for (const std::string opt : {"-x", "--frobnicate", "--T=5"}) {
    const auto r = run_kdalab(opt);
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, cat({"unknown option '", opt, "'"})));
    CHECK(has(r, "give a subcommand first"));
    CHECK(has(r, "bench"));  // the subcommands are listed
  }
  // kdalab's own options still work, and no argument at all is still "A subcommand is required" (exit 2)
  CHECK(run_kdalab("--version").code == 0);
  CHECK(run_kdalab("-h").code == 0);
  const auto r = run_kdalab("");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "A subcommand is required"));
}

TEST_CASE("fig_hybrid: both panels label the layouts in prose, the right one as the left one", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("dc.h5");
  make_small_decode_cost(h5);
  const json j = dump_figure(d, "fig_hybrid.py", h5);
  // the speedup panel ("left" before session 13 added the time-per-token panel in front) and the batch panel
  const auto& left = panel_titled(j, "Attention reads per token, any batch")["legend"];
  const auto& right = panel_titled(j, "Batch under ")["legend"];
  INFO(left.dump() << "\n" << right.dump());
  REQUIRE(right.size() == 4);  // two hybrids and their all-MLA stacks
  for (const auto& lab : right) {
    const std::string s = lab;
    CHECK(s.rfind("all-mla", 0) != 0);  // no internal config name
    CHECK(s.rfind("kimi-", 0) != 0);
  }
  // every hybrid label of the left panel is on the right panel too, word for word
  int hybrids = 0;
  for (const auto& lab : left) {
    const std::string s = lab;
    if (s.find("measured") != std::string::npos) continue;  // the GPU points (left panel only)
    ++hybrids;
    bool found = false;
    for (const auto& x : right) found = found || x == lab;
    CHECK(found);
  }
  CHECK(hybrids == 2);
  CHECK(right.dump().find("all-MLA, Kimi Linear 48B shapes") != std::string::npos);
  CHECK(right.dump().find("all-MLA, K3 shapes") != std::string::npos);
}

TEST_CASE("fig_parity leaves out empty and repeated reasons of parity's notes", "[cli][python]") {
  if (skip_without_plotting()) return;
  TempDir d;
  const std::string h5 = d.file("p.h5");
  // no cuda-bf16 row; one empty reason, one reason twice (CPU-build style and shape style)
  python_h5("f = h5py.File('" + h5 + "', 'w')\n"
         "g = f.create_group('parity/table')\n"
         "g['impl'] = np.array([b'float64', b'float64'])\n"
         "g['point'] = np.array([0, 1])\n"
         "g['T'] = np.array([64, 64])\n"
         "g['o_rel_rms'] = np.array([1e-16, 2e-16])\n"
         "f['parity'].attrs['notes'] = 'cuda-bf16 rows skipped: \\ncuda-bf16 rows skipped: no GPU visible\\n"
         "cuda-bf16 row skipped at B=1 T=64 C=16: no GPU visible\\n'\n");
  json j = dump_figure(d, "fig_parity.py", h5);
  std::string t = axes_texts(j["axes"][0]);
  INFO(t);
  CHECK(t.find("cuda-bf16 (the CUDA kernel): not drawn, every row skipped: no GPU visible. |") != std::string::npos);
  CHECK(t.find("skipped: .") == std::string::npos);
  CHECK(t.find("skipped: ;") == std::string::npos);
  CHECK(t.find("no GPU visible; no GPU visible") == std::string::npos);
  // only empty reasons: the skip is still said, without ": ."
  python_h5("f = h5py.File('" + h5 + "', 'a')\n"
         "f['parity'].attrs['notes'] = 'cuda-bf16 rows skipped: \\ncuda-bf16 rows skipped:'\n");
  j = dump_figure(d, "fig_parity.py", h5);
  t = axes_texts(j["axes"][0]);
  INFO(t);
  CHECK(t.find("cuda-bf16 (the CUDA kernel): not drawn, every row skipped. |") != std::string::npos);
  CHECK(t.find("skipped: .") == std::string::npos);
  // a GPU run: two points outside the kernel's shapes with the same reason, and an empty one
  python_h5("f = h5py.File('" + h5 + "', 'w')\n"
         "g = f.create_group('parity/table')\n"
         "g['impl'] = np.array([b'float64', b'float64', b'float64', b'cuda-bf16'])\n"
         "g['point'] = np.array([0, 1, 2, 0])\n"
         "g['T'] = np.array([64, 64, 64, 64])\n"
         "g['o_rel_rms'] = np.array([1e-16, 2e-16, 2e-16, 1.7e-3])\n"
         "f['parity'].attrs['notes'] = 'cuda-bf16 row skipped at B=1 C=16 gate=softplus: the kernel runs d_k = 128\\n"
         "cuda-bf16 row skipped at B=1 C=32 gate=softplus: the kernel runs d_k = 128\\n"
         "cuda-bf16 row skipped at B=1 C=64 gate=softplus: '\n");
  j = dump_figure(d, "fig_parity.py", h5);
  t = axes_texts(j["axes"][0]);
  INFO(t);
  CHECK(t.find("cuda-bf16: 1 of the 3 grid points plotted; its rows at the others skipped: the kernel runs d_k = 128. |") !=
        std::string::npos);
}
