// The build's commit (cmake/gitsha.cmake, the git_sha root attribute of every results file): from git, or from
// KDALAB_GIT_SHA for a source tree whose .git is missing or does not describe it.
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;

namespace {
/// Runs cmake/gitsha.cmake for the source folder `src` into `out` with KDALAB_GIT_SHA = `env` ("" unset).
RunResult run_gitsha_script(const std::string& src, const std::string& out, const std::string& env) {
  return run_command((env.empty() ? std::string("env -u KDALAB_GIT_SHA") : "env KDALAB_GIT_SHA='" + env + "'") +
                     " cmake -DSRC=" + src + " -DOUT=" + out + " -P cmake/gitsha.cmake");
}
}  // namespace

TEST_CASE("build sha: KDALAB_GIT_SHA names the commit of a tree without git; malformed values stop the build step",
          "[cli]") {
  TempDir d;  // a folder outside any git repository
  const std::string out = d.file("git_sha.cpp");
  RunResult r = run_gitsha_script(d.path.string(), out, "");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(slurp(out).find("\"unknown\"") != std::string::npos);
  for (const std::string& ok : std::vector<std::string>{"0123456", "0123456789ab", "abcdef0-dirty", std::string(40, 'f')}) {
    r = run_gitsha_script(d.path.string(), out, ok);
    INFO(ok << ": " << r.output);
    REQUIRE(r.code == 0);
    CHECK(slurp(out).find("\"" + ok + "\"") != std::string::npos);
  }
  // the environment wins over git's own answer
  r = run_gitsha_script(".", out, "1234567");
  CHECK(r.code == 0);
  CHECK(slurp(out).find("\"1234567\"") != std::string::npos);
  for (const std::string& bad : std::vector<std::string>{"abc", "ABCDEF0", "0123456-clean", "bad sha1", std::string(41, 'a'), "-dirty"}) {
    r = run_gitsha_script(d.path.string(), out, bad);
    INFO(bad << ": " << r.output);
    CHECK(r.code != 0);
    std::string flat;  // cmake wraps its messages: the words, one space apart
    std::istringstream words(r.output);
    for (std::string w; words >> w;) flat += (flat.empty() ? "" : " ") + w;
    CHECK(flat.find("KDALAB_GIT_SHA '" + bad + "'") != std::string::npos);
    CHECK(flat.find("accepted: 7 to 40 lowercase hex digits") != std::string::npos);
    CHECK(slurp(out).find("\"1234567\"") != std::string::npos);  // the last good file is left as it was
  }
}
