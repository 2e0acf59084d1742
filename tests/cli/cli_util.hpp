#pragma once
// Helpers for tests that run the kdalab binary (path in env KDALAB_BIN, set by tests/CMakeLists.txt).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <sys/wait.h>

namespace kdalab::testutil {

struct RunResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

inline std::string kdalab_bin() {
  const char* b = std::getenv("KDALAB_BIN");
  return b ? b : "build/default/experiments/kdalab";
}

/// Runs the shell command line `cmd` (from the working directory, the repo root under ctest), capturing
/// stdout+stderr and the exit code (-1 when it did not exit normally).
inline RunResult run_command(const std::string& cmd_line) {
  RunResult r;
  const std::string cmd = cmd_line + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// Runs `kdalab <args>` through the shell, capturing stdout+stderr and the exit code.
inline RunResult run_kdalab(const std::string& args) { return run_command(kdalab_bin() + " " + args); }

/// Whether `r`, a `kdalab bench` run with valid options, ended as this build allows: without the CUDA kernels
/// exit 3 saying "not available in this build" (experiments/bench.cpp kExitNotAvailable); a CUDA build exit 0
/// (measured) or exit 3 saying "no GPU visible". Never 0 without a GPU: a GPU-less CI gate must not pass.
inline bool bench_valid_exit(const RunResult& r) {
#ifdef KDALAB_HAVE_CUDA
  return r.code == 0 || (r.code == 3 && r.output.find("no GPU visible") != std::string::npos);
#else
  return r.code == 3 && r.output.find("not available in this build") != std::string::npos;
#endif
}

/// True when the captured output of `r` contains `s`.
inline bool has(const RunResult& r, const std::string& s) { return r.output.find(s) != std::string::npos; }

/// The whole content of the file at `path` ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A fresh empty folder under the system temp dir, removed on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("kdalab-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
  std::size_t count() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path)) ++n;
    return n;
  }
};

}  // namespace kdalab::testutil
