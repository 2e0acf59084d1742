// bench/fla_kda_bwd.py (fla's KDA gradients as `kdalab check --op kda-bwd` files) follows kdalab's output rule:
// existing check files in --out-dir are never overwritten without --force (one line naming the option and path,
// exit 2, nothing written); bad arguments are one line and exit 2; --help and --dry-run import neither torch nor
// fla. Runs python3 from the PATH; skipped (with a warning) without it. The fla tree and torch here are fakes whose
// import raises, so an import would show as exit 1 and a traceback.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/peer_script_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;

TEST_CASE("fla_kda_bwd.py: --help and --dry-run need neither torch nor fla; --dry-run plans one file per case and "
          "writes nothing",
          "[fla][python]") {
  if (skip_without_python3("bench/fla_kda_bwd.py")) return;
  PeerScriptFakes f("bench/fla_kda_bwd.py");
  check_run(f.run("--help"), 0, {"--candidate", "--fla-commit"});
  // ".f64.h5": a float64 candidate file; "RuntimeError": a fake torch or fla module was imported
  check_run(f.run("--dry-run --out-dir " + f.out("bwd")), 0,
            {"(folder created)", "fla_kda_bwd_B1_T64_H16.h5", "fla_kda_bwd_B1_T300_H16.h5",
             "fla_kda_bwd_B1_T1000_H16.h5", "fla_kda_bwd_B1_T4096_H16.h5"},
            {".f64.h5", "RuntimeError"});
  // both candidates: two files per case; the float64 candidate alone does not need fla
  check_run(f.run("--dry-run --candidate both --cases 2:17:16 --out-dir " + f.out("bwd")), 0,
            {"fla_kda_bwd_B2_T17_H16.h5", "fla_kda_bwd_B2_T17_H16.f64.h5"});
  check_run(run_command("python3 bench/fla_kda_bwd.py --dry-run --candidate f64 --fla-path " + f.out("no-fla") +
                        " --out-dir " + f.out("bwd")),
            0, {"fla_kda_bwd_B1_T4096_H16.f64.h5"});
  // all three candidates (kdalab's kernels beside fla's on the same inputs); the long-memory inputs named apart;
  // kdalab's candidate alone does not need fla
  check_run(f.run("--dry-run --candidate all --inputs long-memory --cases 1:17:16 --out-dir " + f.out("bwd")), 0,
            {"fla_kda_bwd_long-memory_B1_T17_H16.h5", "fla_kda_bwd_long-memory_B1_T17_H16.f64.h5",
             "fla_kda_bwd_long-memory_B1_T17_H16.kdalab.h5", "inputs: long-memory"});
  check_run(run_command("python3 bench/fla_kda_bwd.py --dry-run --candidate kdalab --fla-path " + f.out("no-fla") +
                        " --cases 1:17:16 --out-dir " + f.out("bwd")),
            0, {"fla_kda_bwd_B1_T17_H16.kdalab.h5"}, {"fla_kda_bwd_B1_T17_H16.h5"});
  // both kernels without the float64 file (the largest: long cases); it needs fla
  check_run(f.run("--dry-run --candidate kernels --cases 1:65536:16 --out-dir " + f.out("bwd")), 0,
            {"fla_kda_bwd_B1_T65536_H16.h5", "fla_kda_bwd_B1_T65536_H16.kdalab.h5"}, {".f64.h5", "RuntimeError"});
  check_run(run_command("python3 bench/fla_kda_bwd.py --dry-run --candidate kernels --fla-path " + f.out("no-fla") +
                        " --out-dir " + f.out("bwd")),
            2, {"--fla-path"});
  CHECK(f.out_count() == 0);
}

TEST_CASE("fla_kda_bwd.py: an existing check file in --out-dir is refused without --force (exit 2, untouched), dry "
          "run or not",
          "[fla][python]") {
  if (skip_without_python3("bench/fla_kda_bwd.py")) return;
  PeerScriptFakes f("bench/fla_kda_bwd.py");
  fs::create_directories(f.out("bwd"));
  std::ofstream(f.out("bwd/fla_kda_bwd_B1_T300_H16.h5")) << "old";
  // exit 2 before torch is imported (the fake would make it exit 1 with "RuntimeError")
  check_dry_and_wet(f, "--out-dir " + f.out("bwd"), 2,
                    {"--out-dir", "fla_kda_bwd_B1_T300_H16.h5 already exists", "--force"}, {"RuntimeError"});
  CHECK(slurp(f.out("bwd/fla_kda_bwd_B1_T300_H16.h5")) == "old");
  // another candidate's file name is not in the way; --force says what it would overwrite
  check_run(f.run("--dry-run --candidate f64 --out-dir " + f.out("bwd")), 0, {"(new)"});
  check_run(f.run("--dry-run --force --out-dir " + f.out("bwd")), 0, {"1 of 4 overwritten: --force"});
  CHECK(slurp(f.out("bwd/fla_kda_bwd_B1_T300_H16.h5")) == "old");
  CHECK(f.out_count() == 2);  // bwd and the old file
}

TEST_CASE("fla_kda_bwd.py: bad arguments and output paths are usage errors (exit 2, one line, nothing written)",
          "[fla][python]") {
  if (skip_without_python3("bench/fla_kda_bwd.py")) return;
  PeerScriptFakes f("bench/fla_kda_bwd.py");
  std::ofstream(f.out("afile")) << "x";
  const std::vector<UsageCase> cases = {
      {"--cases 1:64", "is not B:T:H"},
      {"--cases 1:\xc2\xb2:16", "is not B:T:H"},  // '²': isdigit() but not an int() number
      {"--cases 1:0:16", "B, T, H >= 1"},
      {"--cases 1:64:16,1:64:16", "given twice"},
      {"--seed -1", "--seed -1"},
      {"--block 0", "--block 0"},
      {"--time-budget nan", "finite and > 0"},
      {"--device cpu", "fla's kernels need cuda"},
      {"--device cpu --candidate kdalab", "kdalab's kernels need cuda"},
      {"--device cpu --candidate all", "fla's and kdalab's kernels need cuda"},
      {"--inputs short-memory", "--inputs"},
      // options that would change nothing in the run asked for are refused, never ignored
      {"--candidate kdalab --no-safe-gate", "--no-safe-gate sets fla's chunk_kda, which --candidate kdalab does not run"},
      {"--candidate f64 --chunk-size 32", "--chunk-size 32 sets fla's chunk_kda, which --candidate f64 does not run"},
      {"--self-test --candidate kdalab", "--candidate kdalab with --self-test"},
      {"--self-test --candidate kernels", "--candidate kernels with --self-test"},
      {"--device cpu --candidate kernels", "fla's and kdalab's kernels need cuda"},
      {"--self-test --inputs long-memory", "--inputs long-memory with --self-test"},
      {"--fla-commit ''", "--fla-commit"},
      {"--out-dir " + f.out("afile"), "is not a folder"},
      {"--out-dir " + f.out("afile/sub"), "is a file, not a folder"},
      {"--out-dir " + f.out("no/such/bwd"), "does not exist"},
  };
  for (const auto& c : cases)
    check_dry_and_wet(f, "--out-dir " + f.out("bwd") + " " + c.args, 2, {c.says}, {"Traceback", "RuntimeError"});
  // --fla-path is checked whenever fla's gradients are asked for
  check_run(run_command("python3 bench/fla_kda_bwd.py --dry-run --fla-path " + f.out("no-fla") + " --out-dir " +
                        f.out("bwd")),
            2, {"--fla-path"});
  CHECK(f.out_count() == 1);  // afile only
}
