#pragma once
// Running kdalab under an injected fault: a child process with extra environment (the fault shim through
// LD_PRELOAD), an optional file-size limit or user, its output captured; a temporary folder; file checks.
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

/// Ends the test case as skipped, saying why (one form for Catch2 v2 and v3).
#define FAULTS_SKIP(why)            \
  do {                              \
    WARN("skipped: " << why);       \
    return;                         \
  } while (0)

namespace kdalab::faults {

namespace fs = std::filesystem;

inline std::string kdalab_bin() {
  const char* b = std::getenv("KDALAB_BIN");
  return b ? b : "build/default/experiments/kdalab";
}

/// The fault shim (tests/faults/fault_shim.c), "" when the build did not say where it is.
inline std::string fault_shim() {
  const char* s = std::getenv("KDALAB_FAULT_SHIM");
  return s ? s : "";
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

/// A fresh folder under the system temp dir (mode 0777 & ~umask), removed on destruction.
struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("kdalab-faults-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  /// The names in the folder that hold ".tmp." (kdalab's temporaries).
  std::vector<std::string> temporaries() const {
    std::vector<std::string> t;
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) t.push_back(e.path().filename().string());
    return t;
  }
};

struct Options {
  std::vector<std::string> env;  ///< "NAME=value" added to the child's environment
  bool shim = false;             ///< LD_PRELOAD the fault shim
  long long fsize_limit = -1;    ///< RLIMIT_FSIZE in bytes (SIGXFSZ ignored: write() fails with EFBIG)
  uid_t uid = 0;                 ///< run as this user when nonzero (the caller is root)
  gid_t gid = 0;
};

struct Child {
  pid_t pid = -1;
  std::string log;
};

/// Starts kdalab with `args`; stdout and stderr go to a log file read by finish().
inline Child start(const std::vector<std::string>& args, const Options& o, const std::string& log) {
  Child c;
  c.log = log;
  c.pid = ::fork();
  if (c.pid != 0) return c;
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  for (const auto& e : o.env) ::putenv(const_cast<char*>(e.c_str()));
  if (o.shim) {
    ::setenv("LD_PRELOAD", fault_shim().c_str(), 1);
    ::setenv("ASAN_OPTIONS", "verify_asan_link_order=0", 1);
  }
  if (o.fsize_limit >= 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit r{static_cast<rlim_t>(o.fsize_limit), static_cast<rlim_t>(o.fsize_limit)};
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  if (o.uid != 0 && (::setgid(o.gid) != 0 || ::setuid(o.uid) != 0)) ::_exit(126);
  std::vector<char*> argv;
  std::string bin = kdalab_bin();
  argv.push_back(bin.data());
  std::vector<std::string> a = args;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  ::execv(bin.c_str(), argv.data());
  ::_exit(127);
}

struct Result {
  int code = -1;    ///< exit status, -1 when killed by a signal
  int signal = 0;   ///< the signal that ended it, 0 when it exited
  std::string output;
  bool has(const std::string& s) const { return output.find(s) != std::string::npos; }
};

inline Result finish(const Child& c) {
  Result r;
  int st = 0;
  ::waitpid(c.pid, &st, 0);
  if (WIFEXITED(st)) r.code = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) r.signal = WTERMSIG(st);
  r.output = slurp(c.log);
  return r;
}

inline Result run(const std::vector<std::string>& args, const Options& o, const std::string& log) {
  return finish(start(args, o, log));
}

/// Whether `path` is a regular file (not a symlink) holding exactly `text`.
inline bool regular_with(const std::string& path, const std::string& text) {
  return fs::is_regular_file(fs::symlink_status(path)) && slurp(path) == text;
}

/// The uid and gid of the user `nobody` when this process is root and can become it; {0, 0} otherwise.
inline std::pair<uid_t, gid_t> unprivileged_user() {
  if (::geteuid() != 0) return {0, 0};
  const passwd* pw = ::getpwnam("nobody");
  if (!pw || pw->pw_uid == 0) return {0, 0};
  return {pw->pw_uid, pw->pw_gid};
}

}  // namespace kdalab::faults
