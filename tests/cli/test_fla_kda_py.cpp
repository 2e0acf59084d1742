// bench/fla_kda.py (the fla peer harness) follows kdalab's output rule: --json and the check files in --check-dir
// are never overwritten without --force (one line naming the option and path, exit 2, nothing written), their
// folders must exist; --dry-run checks the same paths; --help and --dry-run import neither torch nor fla.
// Runs python3 from the PATH; skipped (with a warning) without it. The fla tree and torch here are fakes whose import
// raises, so an import would show as exit 1.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/peer_script_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;

TEST_CASE("fla_kda.py: --help and --dry-run need neither torch nor fla; --dry-run writes nothing", "[fla][python]") {
  if (skip_without_python3("bench/fla_kda.py")) return;
  PeerScriptFakes f("bench/fla_kda.py");
  check_run(f.run("--help"), 0, {"--force", "--dry-run"});
  // "RuntimeError": a fake torch or fla module was imported
  check_run(f.run("--dry-run --json " + f.out("t.json") + " --check-dir " + f.out("chk")), 0,
            {"t.json (new)", "(folder created)"}, {"RuntimeError"});
  CHECK(f.out_count() == 0);  // neither the JSON nor the check folder
  // fla's path is still checked by --dry-run
  check_run(
      run_command("python3 bench/fla_kda.py --dry-run --fla-path " + f.out("no-fla") + " --json " + f.out("t.json")), 2,
      {"--fla-path"});
}

TEST_CASE("fla_kda.py: the kda-backward rows run only with --ops kda-backward, keyed as kdalab bench keys them",
          "[fla][python]") {
  if (skip_without_python3("bench/fla_kda.py")) return;
  PeerScriptFakes f("bench/fla_kda.py");
  // the keys of `kdalab bench --op kda-backward`'s default rows (experiments/bench.cpp key_of)
  check_run(f.run("--dry-run --ops kda-backward --json " + f.out("t.json")), 0,
            {"backward shapes: kda-backward B=1 T=8192 H=64 HV=64, kda-backward B=1 T=8192 H=96 HV=96, "
             "kda-backward B=1 T=65536 H=32 HV=32", "torch.autograd.grad"},
            {"RuntimeError", "prefill shapes", "check cases"});
  // the default ops leave them out (fla's backward autotunes for minutes)
  check_run(f.run("--dry-run --json " + f.out("t.json") + " --check-dir " + f.out("chk")), 0, {"prefill shapes"},
            {"backward shapes"});
  CHECK(f.out_count() == 0);
}

TEST_CASE("fla_kda.py: an existing --json is refused without --force (exit 2, untouched), dry run or not",
          "[fla][python]") {
  if (skip_without_python3("bench/fla_kda.py")) return;
  PeerScriptFakes f("bench/fla_kda.py");
  std::ofstream(f.out("t.json")) << "{\"old\": 1}\n";
  // exit 2 before torch is imported (the fake would make it exit 1 with "RuntimeError")
  check_dry_and_wet(f, "--ops kda-decode --json " + f.out("t.json"), 2, {"--json", f.out("t.json"), "--force"},
                    {"RuntimeError"});
  CHECK(slurp(f.out("t.json")) == "{\"old\": 1}\n");
  check_run(f.run("--dry-run --ops kda-decode --force --json " + f.out("t.json")), 0, {"overwritten: --force"});
  CHECK(slurp(f.out("t.json")) == "{\"old\": 1}\n");
  // its folder must exist; a folder is not a file name
  check_run(f.run("--dry-run --ops kda-decode --json " + f.out("no/such/t.json")), 2, {"--json", "does not exist"});
  check_run(f.run("--dry-run --ops kda-decode --json " + f.out("")), 2, {"is a directory"});
  CHECK(f.out_count() == 1);
}

TEST_CASE("fla_kda.py: an existing check file in --check-dir is refused without --force", "[fla][python]") {
  if (skip_without_python3("bench/fla_kda.py")) return;
  PeerScriptFakes f("bench/fla_kda.py");
  fs::create_directories(f.out("chk"));
  std::ofstream(f.out("chk/fla_kda_B1_T300_H2.h5")) << "old";
  const std::string json = "--json " + f.out("t.json");
  check_dry_and_wet(f, json + " --check-dir " + f.out("chk"), 2, {"--check-dir", "fla_kda_B1_T300_H2.h5", "--force"});
  CHECK(slurp(f.out("chk/fla_kda_B1_T300_H2.h5")) == "old");
  CHECK(!fs::exists(f.out("t.json")));  // nothing written
  // without --ops check the folder is not used; with --force the plan says what is overwritten
  check_run(f.run("--dry-run --ops kda-prefill,kda-decode " + json + " --check-dir " + f.out("chk")), 0, {});
  check_run(f.run("--dry-run --force " + json + " --check-dir " + f.out("chk")), 0, {"1 of 5 overwritten: --force"});
  // a file where the folder should be; a missing parent folder
  std::ofstream(f.out("plain")) << "x";
  check_run(f.run("--dry-run " + json + " --check-dir " + f.out("plain")), 2, {"is not a folder"});
  check_run(f.run("--dry-run " + json + " --check-dir " + f.out("no/such/chk")), 2, {"--check-dir", "does not exist"});
  CHECK(f.out_count() == 3);  // chk, its old check file and plain
}

TEST_CASE("fla_kda.py: shapes, --time-budget, --seed and paths through a file are usage errors (exit 2, no traceback)",
          "[fla][python]") {
  if (skip_without_python3("bench/fla_kda.py")) return;
  PeerScriptFakes f("bench/fla_kda.py");
  std::ofstream(f.out("afile")) << "x";
  const std::vector<UsageCase> cases = {
      {"--prefill-shapes 1:\xc2\xb2:1", "is not B:T:H"},  // '²': isdigit() but not an int() number
      {"--prefill-shapes 1:8192:32:32:64", "D = d_k = d_v = 128 only"},
      {"--decode-shapes 256:1:32:32:256", "no fla peer"},
      {"--ops kda-backward --backward-shapes 1:8192:64:64:64", "--backward-shapes: '1:8192:64:64:64' has a D field"},
      {"--ops kda-backward --backward-shapes 1:64:2:3", "HV a multiple of H"},
      {"--ops kda-backward --backward-shapes 1:64:2:2147483648", "each field in [1, 2^31 - 1]"},
      {"--ops kda-backward --backward-shapes 1:64:2,1:64:2", "--backward-shapes: '1:64:2' is given more than once"},
      {"--ops kda-backward,kda-backward", "--ops 'kda-backward,kda-backward': kda-backward is given more than once"},
      {"--backward-shapes 1:64:2", "--backward-shapes applies to --ops kda-backward only"},
      {"--ops kda-backward --prefill-shapes 1:64:2", "--prefill-shapes applies to --ops kda-prefill only"},
      {"--time-budget nan", "finite and > 0"},
      {"--time-budget inf", "finite and > 0"},
      {"--time-budget 0", "finite and > 0"},
      {"--seed -1", "[0, 2^63 - 1]"},
      {"--seed 9223372036854775808", "[0, 2^63 - 1]"},
      {"--check-dir " + f.out("afile/sub"), "is a file, not a folder"},
      {"--ops kda-decode --json " + f.out("afile/t.json"), "is a file, not a folder"},
  };
  for (const auto& c : cases) {
    INFO(c.args);
    check_run(f.run("--dry-run --json " + f.out("t.json") + " " + c.args), 2, {c.says}, {"Traceback"});
  }
  check_run(f.run("--dry-run --json " + f.out("t.json") + " --check-dir " + f.out("chk") +
                  " --seed 9223372036854775807 --time-budget 30 --iters 1"),
            0, {});
  const auto h = f.run("--help");
  CHECK(has(h, "(>= 1; use 50 or more for the record)"));
  CHECK(f.out_count() == 1);  // afile only
}
