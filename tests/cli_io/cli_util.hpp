#pragma once
// Helpers for tests that run the kdalab binary (path in env KDALAB_BIN, set by tests/CMakeLists.txt).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
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

/// Runs `kdalab <args>` through the shell, capturing stdout+stderr and the exit code.
inline RunResult run_kdalab(const std::string& args) {
  RunResult r;
  const std::string cmd = kdalab_bin() + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
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
