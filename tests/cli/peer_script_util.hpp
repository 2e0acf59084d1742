#pragma once
// Shared by the tests of the fla peer scripts in bench/ (fla_kda.py, fla_kda_bwd.py): the skip without python3,
// a temp folder with a fake torch and a fake fla tree whose imports raise, so that a script that imports
// either shows it as exit 1 and "RuntimeError", and the checks of one run (exit code, what the output names).
// Catch2 (WARN, INFO, CHECK) and tests/cli/cli_util.hpp (run_command, TempDir).
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

namespace kdalab::testutil {

/// True (with a warning naming `script`) when python3 is not on the PATH: the calling test then returns early.
inline bool skip_without_python3(const std::string& script) {
  if (run_command("command -v python3 >/dev/null").code == 0) return false;
  WARN("python3 is not on the PATH: " << script << " tests skipped");
  return true;
}

/// A temp folder with fake/torch (raises on import), fla/fla/ops/kda/__init__.py (raises on import) and an empty
/// out/ for what the script under test may write.
class PeerScriptFakes {
 public:
  /// `script`: the peer script's path from the repo root, e.g. "bench/fla_kda.py"
  explicit PeerScriptFakes(std::string script) : script_(std::move(script)) {
    namespace fs = std::filesystem;
    fs::create_directories(d_.path / "fake" / "torch");
    fs::create_directories(d_.path / "fla" / "fla" / "ops" / "kda");
    fs::create_directories(d_.path / "out");
    std::ofstream(d_.path / "fake" / "torch" / "__init__.py") << "raise RuntimeError('torch was imported')\n";
    std::ofstream(d_.path / "fla" / "fla" / "ops" / "kda" / "__init__.py") << "raise RuntimeError('fla was imported')\n";
  }
  /// The path of `name` inside out/.
  std::string out(const std::string& name) const { return (d_.path / "out" / name).string(); }
  /// python3 <script> --fla-path <fake fla> <args>, with the fake torch first on the import path
  RunResult run(const std::string& args) const {
    return run_command("PYTHONPATH=" + (d_.path / "fake").string() + " python3 " + script_ + " --fla-path " +
                       (d_.path / "fla").string() + " " + args);
  }
  /// How many files and folders lie anywhere below out/.
  std::size_t out_count() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::recursive_directory_iterator(d_.path / "out")) ++n;
    return n;
  }

 private:
  TempDir d_;
  std::string script_;
};

/// One bad argument and what its one-line error must name.
struct UsageCase {
  std::string args, says;
};

/// Checks one run: exit `code`, the output names each of `says` and none of `absent` (the output is the INFO).
inline void check_run(const RunResult& r, int code, const std::vector<std::string>& says,
                      const std::vector<std::string>& absent = {}) {
  INFO(r.output);
  CHECK(r.code == code);
  for (const auto& s : says) CHECK(has(r, s));
  for (const auto& s : absent) CHECK(!has(r, s));
}

/// check_run of the script with `args`, once with --dry-run and once without: the dry run must refuse the same.
inline void check_dry_and_wet(const PeerScriptFakes& f, const std::string& args, int code,
                              const std::vector<std::string>& says, const std::vector<std::string>& absent = {}) {
  for (const std::string dry : {"--dry-run ", ""}) {
    INFO(dry << args);
    check_run(f.run(dry + args), code, says, absent);
  }
}

}  // namespace kdalab::testutil
