// bench's own options: options and shape fields the chosen op ignores are refused naming the option and its ops;
// --shapes edge cases (trailing separators, empty, 2^31, too large, trailing garbage) are refused with what is
// accepted; option combinations the kernels cannot run are refused (exit 2).
#include <H5Cpp.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;

namespace {
struct Refusal {
  std::string args, says;
};

/// Each `bench <args>` refused with one line naming `says` and exit 2, whether --out names an existing file (with
/// and without --force) or a new one; the existing file keeps its time and no file is added.
void require_refused_before_gpu_work(const std::string& op, const std::vector<Refusal>& cases) {
  TempDir d;
  d.write("b.h5", "old");
  const auto t0 = fs::last_write_time(d.file("b.h5"));
  for (const Refusal& c : cases) {
    for (const std::string& out : {d.file("b.h5"), d.file("b.h5") + " --force", d.file("new.h5")}) {
      const auto r = run_kdalab("bench --op " + op + " " + c.args + " --iters 1 --warmup 0 --out " + out);
      INFO(c.args << " --out " << out);
      require_one_line_exit2(r);
      CHECK(has(r, c.says));
      CHECK(!has(r, "not available"));
    }
  }
  CHECK(fs::last_write_time(d.file("b.h5")) == t0);
  CHECK(d.count() == 1);
}
}  // namespace

TEST_CASE("bench: options and shape fields the chosen op ignores are refused, naming the option and its ops",
          "[bench]") {
  TempDir d;
  struct Case {
    std::string args, says;
  };
  std::vector<Case> cases = {
      {"--op kda-decode --prefix 16", "--prefix 16 applies to --op mla-prefill"},
      {"--op kda-backward --prefix 16", "--prefix 16 applies to --op mla-prefill"},
      {"--op mla-decode --prefix 16", "--prefix 16 applies to --op mla-prefill"},
      {"--op mla-decode --shapes 1:64:2:4", "HV = 4 != H = 2"},
      {"--op mla-prefill --shapes 1:64:2:4", "HV = 4 != H = 2"},
      {"--op attn-res --shapes 9:16:64:64", "S:T:d"},
  };
  // --state-pass, --segments, --overlap act on kda-prefill only: refused with every other single op
  for (const std::string op : {"kda-decode", "kda-backward", "mla-decode", "mla-prefill", "attn-res"})
    for (const std::string given : {"--state-pass mma", "--segments 2", "--segments 1", "--overlap off", "--precision accurate"})
      cases.push_back({"--op " + op + " " + given, given + " applies to --op kda-prefill (or all) only, not --op " + op});
  // --bwd-pass acts on kda-backward only; its values are named
  for (const std::string op : {"kda-prefill", "kda-decode", "mla-decode", "mla-prefill", "attn-res"})
    for (const std::string given : {"--bwd-pass sweep", "--bwd-pass chunked", "--bwd-pass chunked_wg"})
      cases.push_back({"--op " + op + " " + given, given + " applies to --op kda-backward (or all) only, not --op " + op});
  cases.push_back({"--op kda-backward --bwd-pass fast",
                   "--bwd-pass = 'fast'; accepted: auto, sweep, chunked or chunked_wg"});
  // --s-q and --mla-precision act on mla-decode only; their values and the one combination the kernel refuses
  for (const std::string op : {"kda-prefill", "kda-decode", "kda-backward", "mla-prefill", "attn-res"})
    for (const std::string given : {"--s-q 2", "--mla-precision fast", "--mla-precision accurate"})
      cases.push_back({"--op " + op + " " + given, given + " applies to --op mla-decode (or all) only, not --op " + op});
  for (const std::string given : {"--s-q 0", "--s-q 5"})
    cases.push_back({"--op mla-decode " + given, "accepted: 1 <= --s-q <= 4"});
  cases.push_back({"--op mla-decode --mla-precision hilo", "--mla-precision = 'hilo'; accepted: auto, accurate or fast"});
  // --mla-splits acts on mla-decode only, >= 0
  for (const std::string op : {"kda-prefill", "kda-decode", "kda-backward", "mla-prefill", "attn-res"})
    cases.push_back({"--op " + op + " --mla-splits 8", "--mla-splits 8 applies to --op mla-decode (or all) only, not --op " + op});
  cases.push_back({"--op mla-decode --mla-splits -1", "--mla-splits = -1; accepted: >= 0 slices per sequence"});
  // --ring-depth acts on attn-res only: 0 (the rule) or 2..8
  for (const std::string op : {"kda-prefill", "kda-decode", "kda-backward", "mla-decode", "mla-prefill"})
    cases.push_back(
        {"--op " + op + " --ring-depth 4", "--ring-depth 4 applies to --op attn-res (or all) only, not --op " + op});
  for (const std::string depth : {"1", "9", "-1"})
    for (const std::string op : {"attn-res", "all"})
      cases.push_back({"--op " + op + " --ring-depth " + depth,
                       "--ring-depth = " + depth + "; accepted: 0 (the rule: 3 row buffers) or 2..8 row buffers"});
  cases.push_back({"--op mla-decode --s-q 2 --mla-precision accurate",
                   "--mla-precision accurate with --s-q 2; accepted: accurate runs one query token"});
  cases.push_back({"--op all --s-q 3 --mla-precision accurate", "--mla-precision accurate with --s-q 3"});
  cases.push_back({"--op kda-backward --bwd-pass chunked --shapes 1:64:2:2:64,1:1024:4:4:256",
                   "--bwd-pass chunked does not run at shape 1:1024:4:4:256; accepted: D = 64 or 128"});
  cases.push_back({"--op kda-backward --bwd-pass chunked_wg --shapes 1:64:2:2,1:64:2:2:64",
                   "--bwd-pass chunked_wg does not run at shape 1:64:2:2:64; accepted: D = 128"});
  for (const auto& c : cases) {
    const auto r = run_kdalab("bench " + c.args + " --out " + d.file("b.h5"));
    INFO(c.args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, c.says));
    CHECK(!has(r, "not available"));
    CHECK(!fs::exists(d.file("b.h5")));
  }
  // what applies is still accepted (options at their defaults are not "set")
  for (const std::string& args : {std::string("--op mla-prefill --prefix 16 --shapes 1:64:2:2"),
                                  std::string("--op kda-prefill --state-pass wgmma --shapes 1:16:1:2"),
                                  std::string("--op kda-prefill --segments 1 --overlap off --shapes 4:4096:16:32"),
                                  std::string("--op kda-decode --segments 0 --overlap on --state-pass auto --shapes 1:1:2"),
                                  std::string("--op kda-backward --bwd-pass sweep --shapes 1:16:1"),
                                  std::string("--op mla-decode --s-q 4 --shapes 1:64:32"),
                                  std::string("--op mla-decode --s-q 1 --mla-precision fast --shapes 2:64:16"),
                                  std::string("--op mla-decode --s-q 2 --mla-precision auto --shapes 1:64:16"),
                                  std::string("--op mla-decode --mla-splits 2 --shapes 1:128:32"),
                                  std::string("--op attn-res --ring-depth 8 --shapes 9:16:64"),
                                  std::string("--op attn-res --ring-depth 3 --shapes 9:1:2304"),
                                  // the deepest ring that fits a d, and the rule's depth at the largest d
                                  std::string("--op attn-res --ring-depth 5 --shapes 2:4:16384"),
                                  std::string("--op attn-res --ring-depth 8 --shapes 2:4:11584"),
                                  std::string("--op attn-res --ring-depth 0 --shapes 2:4:16384")}) {
    const auto r = run_kdalab("bench " + args + " --iters 1 --warmup 0 --out " + d.file("b.h5"));
    INFO(args << "\n" << r.output);
    CHECK(bench_valid_exit(r));
    fs::remove(d.file("b.h5"));
  }
  // --op all takes every one of them (each acts on its op's rows): the run gets as far as --out, the last check,
  // in every build and without any GPU work
  // (--segments 1, not 2: forced segments are refused up front with the default D = 256 row, tested below)
  const auto r = run_kdalab("bench --op all --prefix 16 --segments 1 --overlap off --s-q 2 --mla-precision fast "
                            "--mla-splits 4 --ring-depth 4 --out " +
                            d.file("no/such/folder/b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--out"));
  CHECK(has(r, "does not exist"));
  CHECK(!has(r, "applies to"));
  // --help says which ops each takes: test_bench_cli.cpp
}

TEST_CASE("bench --op mla-decode: shapes the kernel does not run (N < --s-q, H other than 16 or 32, B > 65535) are "
          "refused before any GPU work, in every build (exit 2, an existing --out untouched)",
          "[bench]") {
  const std::string limits = "accepted: H = 16 or 32 query heads and B <= 65535 sequences";
  require_refused_before_gpu_work(
      "mla-decode", {{"--s-q 4 --shapes 1:3:16", "--s-q 4 with N = 3 (shape 1:3:16); accepted: N >= --s-q"},
                     {"--s-q 2 --shapes 2:64:32,1:1:32", "--s-q 2 with N = 1 (shape 1:1:32)"},
                     {"--s-q 3 --mla-precision fast --shapes 1:2:16", "--s-q 3 with N = 2"},
                     {"--shapes 1:64:8", "mla-decode does not run shape 1:64:8; " + limits},
                     {"--shapes 2:64:32,1:64:64", "mla-decode does not run shape 1:64:64; " + limits},
                     {"--shapes 65536:64:16", "mla-decode does not run shape 65536:64:16; " + limits}});
  TempDir d;
  // N = s_q is the smallest context: accepted (the query tokens are the whole cache)
  const auto r = run_kdalab("bench --op mla-decode --s-q 4 --shapes 1:4:16 --iters 1 --warmup 0 --out " + d.file("n.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
}

TEST_CASE("bench --op attn-res --ring-depth: a d whose pseudo-query and ring do not fit in shared memory is "
          "refused before any GPU work, in every build (exit 2, an existing --out untouched)",
          "[bench]") {
  // 4 d + 2 d n <= 231808 bytes: d = 16384 takes 5 rows (229376 bytes), d = 12288 takes 7 (221184), 8 rows d <= 11584
  require_refused_before_gpu_work(
      "attn-res",
      {{"--ring-depth 6 --shapes 9:16:16384",
        "--ring-depth 6 with d = 16384 (shape 9:16:16384) needs 262144 bytes of shared memory (4 d + 2 d n); "
        "accepted: at most 231808 (227 KB less the kernel's 640 static bytes): --ring-depth <= 5 at this d"},
       {"--ring-depth 8 --shapes 9:16:7168,2:4:12288", "--ring-depth 8 with d = 12288 (shape 2:4:12288)"},
       {"--ring-depth 8 --shapes 9:16:11592",
        "needs 231840 bytes of shared memory (4 d + 2 d n); accepted: at most 231808 (227 KB less the kernel's "
        "640 static bytes): --ring-depth <= 7 at this d"}});
}

TEST_CASE("bench --shapes: trailing ',' or ':', empty, 2^31 and too-large fields refused with what is accepted",
          "[bench]") {
  TempDir d;
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {"--op kda-prefill --shapes 1:16:1,", "ends with ','"},
      {"--op kda-prefill --shapes 1:16:1:", "ends with ':'"},
      {"--op kda-prefill --shapes ''", "leave it out for the default"},
      {"--op kda-prefill --shapes 1:2147483648:1", "too large (2^31 - 1 at most)"},
      {"--op kda-prefill --shapes 1:99999999999999999999:1", "too large"},
      {"--op kda-prefill --shapes 1:x:1", "B:T:H[:HV[:D]]"},
      {"--op kda-decode --shapes 1:1:z", "B:T:H[:HV[:D]]"},
      {"--op mla-decode --shapes 1:x:1", "B:N:H"},
  };
  for (const auto& c : cases) {
    const auto r = run_kdalab("bench " + c.args + " --out " + d.file("b.h5"));
    INFO(c.args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--shapes"));
    CHECK(has(r, c.says));
  }
  d.write("c.json", R"({"op": "kda-prefill", "shapes": ""})");
  auto r = run_kdalab("bench --config " + d.file("c.json") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "leave it out"));
  // 2^31 - 1 is the limit and accepted by the parser (a CPU build then says it cannot run: exit 3)
#ifndef KDALAB_HAVE_CUDA
  r = run_kdalab("bench --op kda-prefill --shapes 1:16:2147483647 --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 3);
#endif
}

TEST_CASE("bench --op mla-prefill: a shape's own cached prefix B:T:H+N0 (over --prefix); malformed, negative, "
          "too large or repeated prefixes and a prefix on another op's shape refused in one line (exit 2)",
          "[bench]") {
  TempDir d;
  struct Case {
    std::string args, says;
  };
  const std::string accepted = "accepted: B:T:H+N0 with N0 >= 0 cached tokens";
  for (const Case& c :
       {Case{"--op mla-prefill --shapes 1:64:2+-5", "--shapes: prefix '-5' in '1:64:2+-5' is not an integer >= 0; " + accepted},
        Case{"--op mla-prefill --shapes 1:64:2+", "--shapes: prefix '' in '1:64:2+' is not an integer >= 0"},
        Case{"--op mla-prefill --shapes 1:64:2+16x", "prefix '16x' in '1:64:2+16x' is not an integer >= 0"},
        Case{"--op mla-prefill --shapes 1:64:2+1.5", "prefix '1.5' in '1:64:2+1.5' is not an integer >= 0"},
        Case{"--op mla-prefill --shapes 1:64:2+16+4", "'2+16' in '1:64:2+16+4' is not an integer; accepted: B:T:H[+N0]"},
        Case{"--op mla-prefill --shapes 1:64:2+99999999999999999999", "prefix '99999999999999999999' in "
                                                                      "'1:64:2+99999999999999999999' is too large"},
        Case{"--op mla-prefill --shapes 1:64:2+2147483584",
             "'1:64:2+2147483584' has N0 + T = 2147483648, above 2^31 - 1; accepted: B:T:H+N0 with N0 >= 0 cached "
             "tokens and N0 + T <= 2^31 - 1 (2147483647)"},
        Case{"--op mla-prefill --shapes 1:64:2:4+16", "HV = 4 != H = 2"},
        Case{"--op kda-prefill --shapes 1:64:2+16", "'1:64:2+16' names a cached prefix (+16); only mla-prefill shapes "
                                                    "take one (B:T:H+N0); accepted: B:T:H[:HV[:D]]"},
        Case{"--op mla-decode --shapes 1:64:32+16", "only mla-prefill shapes take one (B:T:H+N0); accepted: B:N:H"},
        Case{"--op attn-res --shapes 9:16:64+16", "only mla-prefill shapes take one"},
        // one row twice: N0 = 0 written out, or --prefix giving the N0 another shape names
        Case{"--op mla-prefill --shapes 1:64:2,1:64:2+0", "--shapes: '1:64:2+0' (N0 = 0) is given more than once"},
        Case{"--op mla-prefill --prefix 16 --shapes 1:64:2+16,1:64:2", "--shapes: '1:64:2' (N0 = 16) is given more than once"},
        // --prefix still refused where it applies (a shape without its own prefix), quoted as typed
        Case{"--op mla-prefill --prefix 2147483584 --shapes 1:64:2+16,1:64:2", "--prefix 2147483584 with T = 64"}}) {
    const auto r = run_kdalab("bench " + c.args + " --out " + d.file("b.h5"));
    INFO(c.args);
    require_one_line_exit2(r);
    CHECK(has(r, c.says));
    CHECK(!has(r, "not available"));
    CHECK(d.count() == 0);
  }
  // accepted: a shape's own N0 (0 included) beside --prefix, which then applies to the others only (so a --prefix
  // that no shape takes is not checked against T); the limit N0 + T = 2^31 - 1 itself
  for (const std::string args : {"--shapes 1:64:2+16", "--shapes 1:64:2+0,2:32:2+7 --prefix 16",
                                 "--shapes 1:64:2+16,1:64:2 --prefix 8", "--shapes 1:64:2+16 --prefix 2147483647",
                                 "--shapes 1:64:2:2+16"}) {
    const auto r = run_kdalab("bench --op mla-prefill " + args + " --iters 1 --warmup 0 --out " + d.file("b.h5"));
    INFO(args << "\n" << r.output);
    CHECK(bench_valid_exit(r));
    fs::remove(d.file("b.h5"));  // a GPU run wrote it
  }
  const auto edge = run_kdalab("bench --op mla-prefill --shapes 1:64:2+2147483583 --quick --out " + d.file("b.h5"));
  INFO(edge.output);
  // on a GPU the 2^31-token latent cache (2 TiB) does not fit: exit 2 saying so
  CHECK((bench_valid_exit(edge) || (edge.code == 2 && has(edge, "not enough GPU memory"))));
  // the default shapes include 1:2048:32+32768; --prefix 32768 makes 1:2048:32 that row, timed once (not refused);
  // the run gets as far as --out, the last check, without any GPU work
  for (const std::string op : {"mla-prefill", "all"})
    for (const std::string prefix : {"0", "16", "32768"}) {
      const auto r = run_kdalab("bench --op " + op + " --prefix " + prefix + " --out " + d.file("no/such/folder/b.h5"));
      INFO(op << " --prefix " << prefix << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, "does not exist"));
    }
  const auto h = run_kdalab("bench --help");
  CHECK(has(h, "mla-prefill 1:8192:32, 1:2048:32, 8:512:32, 1:2048:32+32768"));
  CHECK(has(h, "B:T:H[+N0]"));
}

TEST_CASE("bench --op kda-backward: shapes B:T:H[:HV[:D]] as kda-prefill's, checked before any GPU work; --help lists "
          "its default shapes",
          "[bench]") {
  TempDir d;
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {Case{"--shapes 1:64:2:2:32", "D = 32 in '1:64:2:2:32'; accepted: D = 64, 128 or 256"},
                        Case{"--shapes 1:64:2:2:512", "D = 512"},
                        Case{"--shapes 1:64:2:2:64:1", "more than 5 fields"},
                        Case{"--shapes 1:64:2:3", "HV a multiple of H"},
                        Case{"--shapes 1:0:2", "B, T, H >= 1"},
                        Case{"--shapes 1:x:1", "B:T:H[:HV[:D]]"},
                        Case{"--shapes ' 1:64:2'", "' 1' in ' 1:64:2' is not an integer"},
                        Case{"--shapes '1:\t64:2'", "is not an integer"}}) {
    const auto r = run_kdalab("bench --op kda-backward " + c.args + " --out " + d.file("b.h5"));
    INFO(c.args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--shapes"));
    CHECK(has(r, c.says));
    CHECK(!has(r, "not available"));
    CHECK(d.count() == 0);
  }
  // every D, grouped heads and T not a multiple of the 64-token checkpoint reach the run (a CPU build: exit 3)
  const auto r = run_kdalab("bench --op kda-backward --shapes 1:17:1:2:64,2:64:2:2,1:100:1:1:256 --iters 1 --warmup 0 "
                            "--out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
  std::filesystem::remove(d.file("b.h5"));  // a GPU run wrote it
  const auto h = run_kdalab("bench --help");
  CHECK(has(h, "kda-backward 1:8192:64, 1:8192:96, 1:65536:32"));
}

TEST_CASE("bench: --segments >= 2 with a D = 256 kda-prefill shape and a --state-pass the shape's D lacks are refused up front",
          "[bench]") {
  // refused before any GPU work: --segments 2 on the default shapes reaches the D = 256 row, which the kernel would
  // refuse mid-run (rows lost); likewise a state pass that does not run at a shape's D
  TempDir d;
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {Case{"--op kda-prefill --segments 2", "a default shape"},
                        Case{"--op all --segments 3", "a default shape"},
                        // the hint must not send --op all to --shapes (which needs a single --op)
                        Case{"--op all --segments 2", "--op kda-prefill with --shapes without D = 256"},
                        Case{"--op kda-prefill --segments 2 --shapes 1:4096:2:2:256", "shape 1:4096:2:2:256"},
                        Case{"--op kda-prefill --state-pass wgmma --shapes 1:4096:2:2:64", "does not run at D = 64"},
                        Case{"--op kda-prefill --state-pass key-split --shapes 1:64:1", "does not run at D = 128"},
                        Case{"--op all --state-pass mma", "a default shape"},
                        Case{"--op kda-prefill --segments 2 --state-pass wgmma --shapes 1:4096:2", "the segment path runs the mma"},
                        // the accurate precision: D = 128 and the one-shot wgmma pass only
                        Case{"--op kda-prefill --precision accurate", "does not run at D = 64"},
                        Case{"--op all --precision accurate", "--op all takes only its default shapes"},
                        Case{"--op kda-prefill --precision accurate --shapes 1:64:1:1:256", "does not run at D = 256"},
                        Case{"--op kda-prefill --precision accurate --state-pass mma --shapes 1:64:1", "one-shot wgmma"},
                        Case{"--op kda-prefill --precision accurate --segments 2 --shapes 1:64:1", "one-shot wgmma"},
                        Case{"--op kda-prefill --precision hilo --shapes 1:64:1", "accepted: fast or accurate"}}) {
    const auto r = run_kdalab("bench " + c.args + " --out " + d.file("b.h5"));
    INFO(c.args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, c.says));
    CHECK(!fs::exists(d.file("b.h5")));
  }
  // what can act is accepted: forced segments without D = 256 rows, --segments 1 with them, a state pass on shapes of
  // its D (the run then gets as far as --out, the last check)
  for (const std::string args : {"--op kda-prefill --segments 2 --shapes 1:4096:2:2:64,1:4096:2", "--op all --segments 1",
                                 "--op kda-prefill --state-pass key-split --shapes 1:64:1:1:256",
                                 "--op kda-prefill --state-pass mma --segments 3 --shapes 1:64:1:1:64,1:64:1",
                                 "--op kda-prefill --precision accurate --state-pass wgmma --segments 1 --shapes 1:64:1"}) {
    const auto r = run_kdalab("bench " + args + " --out " + d.file("no/such/folder/b.h5"));
    INFO(args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "does not exist"));
  }
}

TEST_CASE("bench: --shapes with trailing garbage and a missing --compare file are bad input", "[bench]") {
  TempDir d;
  auto r = run_kdalab("bench --op kda-prefill --shapes 1x:2:3 --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("'1x'") != std::string::npos);
  r = run_kdalab("bench --op kda-prefill --compare " + d.file("none.h5") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("--compare") != std::string::npos);
  // several baselines / peers: the second, missing one is named (the first exists)
  r = run_kdalab("bench --op kda-prefill --compare data/baselines/h200.h5 --compare " + d.file("none2.h5") +
                 " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("none2.h5") != std::string::npos);
  {
    std::ofstream(d.file("p1.json")) << "{\"kda-prefill B=1 T=8192 H=64 HV=64\": 2.0}";
    std::ofstream(d.file("p2.json")) << "[1, 2]";
  }
  r = run_kdalab("bench --op kda-prefill --peer-json " + d.file("p1.json") + " --peer-json " + d.file("p2.json") +
                 " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("p2.json") != std::string::npos);
  CHECK(!std::filesystem::exists(d.file("b.h5")));
  // a peer file whose name starts with "inf" is a file name, not a number
  std::ofstream(d.file("info.json")) << "{}";
  // (valid options: exit 3 "not available" in a CPU build; a tiny shape so that a GPU run is quick)
  const std::string tiny = " --shapes 1:16:1 --iters 1 --warmup 0";
  r = run_kdalab("bench --op kda-prefill --peer-json " + d.file("info.json") + tiny + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
  std::filesystem::remove(d.file("b.h5"));  // a GPU run wrote it
  // a peer time that is not a number, or the same key in two peer files, is bad input; _metadata is skipped
  std::ofstream(d.file("p3.json")) << R"({"kda-prefill B=1 T=8192 H=64 HV=64": "fast"})";
  r = run_kdalab("bench --op kda-prefill --peer-json " + d.file("p3.json") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("\"fast\"") != std::string::npos);
  std::ofstream(d.file("p4.json")) << R"({"kda-prefill B=1 T=8192 H=64 HV=64": 1.5, "_meta": {"x": "y"}})";
  r = run_kdalab("bench --op kda-prefill --peer-json " + d.file("p1.json") + " --peer-json " + d.file("p4.json") +
                 " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("two peer files") != std::string::npos);
  r = run_kdalab("bench --op kda-prefill --peer-json " + d.file("p4.json") + tiny + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(bench_valid_exit(r));
  std::filesystem::remove(d.file("b.h5"));
  // a --compare file that is not HDF5 is named with the option
  std::ofstream(d.file("not.h5")) << "plain text";
  r = run_kdalab("bench --op kda-prefill --compare " + d.file("not.h5") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("--compare") != std::string::npos);
}
