// Every file kdalab writes goes through one path (experiments/results.cpp write_file_atomically): under a full
// disk, an I/O error, a signal, a symlink, a racing writer or a read-only folder the old file stays intact, no
// temporary is left, one line names the path and errno, and the exit code is the one docs/cli.md gives
// (5: the environment failed; 2: an existing --out without --force).
#include <sys/mount.h>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/faults/faults_util.hpp"

using namespace kdalab::faults;

namespace {
// the fastest run that writes a results file
std::vector<std::string> info_to(const std::string& out, bool force) {
  std::vector<std::string> a{"info", "--out", out};
  if (force) a.push_back("--force");
  return a;
}
const std::string kOld = "old results";

bool shim_built() { return !fault_shim().empty() && fs::exists(fault_shim()); }
}  // namespace

TEST_CASE("a write that runs out of space keeps the old file, leaves no temporary and exits 5", "[faults][info][parity]") {
  if (!shim_built()) FAULTS_SKIP("the fault shim is not built (KDALAB_FAULT_SHIM)");
  TempDir d, logs;
  const std::string out = d.file("r.h5");
  put(out, kOld);
  for (const char* after : {"0", "100", "3000"}) {
    const Result r = run(info_to(out, true), {{std::string("KDALAB_FAULT_ENOSPC_AFTER=") + after}, true}, logs.file("log"));
    INFO("ENOSPC after " << after << " bytes: " << r.output);
    CHECK(r.code == 5);
    CHECK(r.has("No space left on device"));
    CHECK(r.has(out));
    CHECK(!r.has("H5Dclose"));
    CHECK(regular_with(out, kOld));
    CHECK(d.temporaries().empty());
  }
  // an experiment's file: parity --quick's grid at d_k = d_v = 16 (the same ~90 KB table as at 128, a tenth of the time)
  const Result r = run({"parity", "--quick", "--dk", "16", "--dv", "16", "--quiet", "--force", "--out", out},
                       {{"KDALAB_FAULT_ENOSPC_AFTER=2000"}, true}, logs.file("log"));
  INFO(r.output);
  CHECK(r.code == 5);
  CHECK(r.has("No space left on device"));
  CHECK(regular_with(out, kOld));
  CHECK(d.temporaries().empty());
}

TEST_CASE("no space to create the temporary exits 5 naming the path, not bad input", "[faults][info]") {
  if (!shim_built()) FAULTS_SKIP("the fault shim is not built (KDALAB_FAULT_SHIM)");
  TempDir d, logs;
  const Result r = run(info_to(d.file("r.h5"), false), {{"KDALAB_FAULT_ENOSPC_ON_CREATE=1"}, true}, logs.file("log"));
  INFO(r.output);
  CHECK(r.code == 5);
  CHECK(r.has("cannot write '" + d.file("r.h5") + "'"));
  CHECK(r.has("No space left on device (errno 28)"));
  CHECK(!fs::exists(d.file("r.h5")));
  CHECK(d.temporaries().empty());
}

TEST_CASE("an I/O error at fsync exits 5 and keeps the old file", "[faults][info]") {
  if (!shim_built()) FAULTS_SKIP("the fault shim is not built (KDALAB_FAULT_SHIM)");
  TempDir d, logs;
  const std::string out = d.file("r.h5");
  put(out, kOld);
  const Result r = run(info_to(out, true), {{"KDALAB_FAULT_EIO_ON_FSYNC=1"}, true}, logs.file("log"));
  INFO(r.output);
  CHECK(r.code == 5);
  CHECK(r.has("Input/output error"));
  CHECK(regular_with(out, kOld));
  CHECK(d.temporaries().empty());
}

TEST_CASE("a file-size limit hit while writing exits 5 and keeps the old file", "[faults][info]") {
  TempDir d, logs;
  const std::string out = d.file("r.h5");
  put(out, kOld);
  Options o;
  o.fsize_limit = 1024;
  const Result r = run(info_to(out, true), o, logs.file("log"));
  INFO(r.output);
  CHECK(r.code == 5);
  CHECK(r.has("File too large"));
  CHECK(r.has(out));
  CHECK(regular_with(out, kOld));
  CHECK(d.temporaries().empty());
}

TEST_CASE("a full tmpfs makes parity and check exit 5 without a crash or a temporary", "[faults][parity][check]") {
  TempDir d, logs;
  if (::mount("tmpfs", d.path.c_str(), "tmpfs", 0, "size=64k") != 0)
    FAULTS_SKIP("cannot mount a tmpfs here (needs root): " << std::strerror(errno));
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{d.path.string()};
  const std::string out = d.file("p.h5");
  // parity --quick's grid with d_k = d_v = 16: a ~90 KB file, past the 64 KB of the tmpfs
  const Result r = run({"parity", "--quick", "--dk", "16", "--dv", "16", "--quiet", "--out", out}, {}, logs.file("log"));
  INFO(r.output);
  CHECK(r.signal == 0);
  CHECK(r.code == 5);
  CHECK(r.has("No space left on device"));
  CHECK(!r.has("H5Dclose"));
  CHECK(!fs::exists(out));
  CHECK(d.temporaries().empty());
}

TEST_CASE("a signal during the write removes the temporary and ends the run by that signal", "[faults][info]") {
  if (!shim_built()) FAULTS_SKIP("the fault shim is not built (KDALAB_FAULT_SHIM)");
  for (const int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) {
    TempDir d, logs;
    const std::string out = d.file("r.h5");
    put(out, kOld);
    const Child c = start(info_to(out, true), {{"KDALAB_FAULT_SLOW_WRITE_MS=20000"}, true}, logs.file("log"));
    bool seen = false;
    for (int i = 0; i < 600 && !seen; ++i) {  // up to 60 s for the temporary to appear
      seen = !d.temporaries().empty();
      if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(c.pid, sig);
    const Result r = finish(c);
    INFO("signal " << sig << ": " << r.output);
    CHECK(seen);
    CHECK(r.signal == sig);
    CHECK(regular_with(out, kOld));
    CHECK(d.temporaries().empty());
  }
}

TEST_CASE("a symlink planted at the temporary's name is never followed", "[faults][info]") {
  TempDir d, logs;
  const std::string out = d.file("r.h5"), victim = d.file("victim");
  put(victim, "victim");
  // the child plants "<out>.tmp.<its pid>" (the name an attacker could predict) before it starts kdalab
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string link = out + ".tmp." + std::to_string(::getpid());
    if (::symlink(victim.c_str(), link.c_str()) != 0) ::_exit(126);
    const int fd = ::open(logs.file("log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const std::string bin = kdalab_bin();
    ::execl(bin.c_str(), bin.c_str(), "info", "--out", out.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  INFO(slurp(logs.file("log")));
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(regular_with(victim, "victim"));
  CHECK(fs::is_regular_file(fs::symlink_status(out)));
  CHECK(kdalab::h5read::attr_string(out, "/", "software") == "kdalab");
}

TEST_CASE("a symlink at --out is replaced only with --force and its target is never written", "[faults][info]") {
  TempDir d, logs;
  const std::string out = d.file("r.h5"), target = d.file("target");
  for (const bool dangling : {true, false}) {
    INFO((dangling ? "dangling" : "to a file"));
    fs::remove(out);
    fs::remove(target);
    if (!dangling) put(target, "target");
    fs::create_symlink(target, out);
    Result r = run(info_to(out, false), {}, logs.file("log"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.has("already exists (a symbolic link); pass --force"));
    CHECK(fs::is_symlink(fs::symlink_status(out)));
    CHECK(fs::exists(target) == !dangling);
    if (!dangling) CHECK(regular_with(target, "target"));
    r = run(info_to(out, true), {}, logs.file("log"));
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(fs::is_regular_file(fs::symlink_status(out)));
    CHECK(fs::exists(target) == !dangling);
    if (!dangling) CHECK(regular_with(target, "target"));
    CHECK(d.temporaries().empty());
  }
}

TEST_CASE("a file created at --out while the run goes is not replaced without --force", "[faults][info]") {
  if (!shim_built()) FAULTS_SKIP("the fault shim is not built (KDALAB_FAULT_SHIM)");
  TempDir d, logs;
  const std::string out = d.file("r.h5");
  Result r = run(info_to(out, false), {{"KDALAB_FAULT_CREATE_BEFORE_RENAME=1"}, true}, logs.file("log"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.has("--out '" + out + "' appeared while the run was going"));
  CHECK(regular_with(out, "racer"));
  CHECK(d.temporaries().empty());
  // with --force the run's file replaces it
  r = run(info_to(out, true), {{"KDALAB_FAULT_CREATE_BEFORE_RENAME=1"}, true}, logs.file("log"));
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(kdalab::h5read::attr_string(out, "/", "software") == "kdalab");
  CHECK(d.temporaries().empty());
}

TEST_CASE("a read-only folder exits 5 naming the folder and the permission", "[faults][info]") {
  auto [uid, gid] = unprivileged_user();
  if (::geteuid() == 0 && uid == 0) FAULTS_SKIP("running as root without a user 'nobody' to run as: a permission cannot be denied");
  TempDir d, logs;
  const std::string out = d.file("r.h5");
  put(out, kOld);
  fs::permissions(d.path, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(logs.path, fs::perms::all);
  Options o;
  o.uid = uid;
  o.gid = gid;
  const Result r = run(info_to(out, true), o, logs.file("log"));
  INFO(r.output);
  if (r.code == 126) FAULTS_SKIP("cannot switch to user 'nobody'");
  CHECK(r.code == 5);
  CHECK(r.has("folder '" + d.path.string() + "' is not writable"));
  CHECK(r.has("Permission denied"));
  CHECK(regular_with(out, kOld));
  CHECK(d.temporaries().empty());
}

TEST_CASE("temporaries left by processes that no longer run are removed and reported", "[faults][info]") {
  TempDir d, logs;
  const std::string out = d.file("r.h5");
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string stale = out + ".tmp." + std::to_string(dead) + ".0badc0de";
  put(stale, "partial");
  const Result r = run(info_to(out, false), {}, logs.file("log"));
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.has("removed '" + stale + "', a temporary left by process " + std::to_string(dead)));
  CHECK(d.temporaries().empty());
}
