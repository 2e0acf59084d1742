// kdalab bench on any build: every option is checked first (--out last), the same errors and exit 2 whatever
// the build; a build that cannot run the benchmark refuses with exit 3, --compare included (session-3 closing
// note: a CPU build checked --out first and exited 0 with --compare, so a GPU-less CI gate passed vacuously).
// Also: `bench --help` and `check --help` explain every option and state its default.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;

TEST_CASE("bench: a bad option is named before --out is looked at, exit 2, nothing written", "[cli][bench]") {
  TempDir d;
  const std::string missing_dir_out = " --out " + d.file("no/such/folder/b.h5");
  d.write("old.h5", "an existing file that must survive");
  const std::string existing_out = " --out " + d.file("old.h5");
  struct Case {
    std::string args, names;
  };
  const std::vector<Case> cases = {
      {"--op kda-prefil", "--op"},
      {"--op kda-prefill --iters 0", "--iters"},
      {"--op kda-prefill --warmup -1", "--warmup"},
      {"--op mla-prefill --prefix -3", "--prefix"},
      {"--op kda-prefill --overlap 7", "--overlap"},
      {"--op kda-prefill --segments 65", "--segments"},
      {"--op mla-decode --variant 3", "--variant"},
      {"--op mla-decode --variant 8", "--variant"},
      {"--op all --shapes 1:16:1", "--shapes"},
      {"--op kda-prefill --shapes 1:16", "--shapes"},
      {"--op kda-decode --shapes 1:2:4", "--shapes"},
      {"--op kda-prefill --peer-json " + d.file("none.json"), "--peer-json"},
      {"--op kda-prefill --compare " + d.file("none.h5"), "--compare"},
  };
  for (const auto& c : cases)
    for (const std::string& out : {missing_dir_out, existing_out}) {
      const auto r = run_kdalab("bench " + c.args + out);
      INFO(c.args << out << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, c.names));
      CHECK(!has(r, "--out"));  // the option, not the output path, is what is wrong
      CHECK(!has(r, "not available"));
    }
  CHECK(slurp(d.file("old.h5")) == "an existing file that must survive");
  CHECK(d.count() == 1);
}

TEST_CASE("bench: --out is checked after the options and before the build, exit 2 in every build", "[cli][bench]") {
  TempDir d;
  const std::string ok = "bench --op kda-prefill --shapes 1:16:1 --iters 1 --warmup 0 --compare data/baselines/h200-kda.h5";
  auto r = run_kdalab(ok + " --out " + d.file("no/such/folder/b.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--out"));
  CHECK(has(r, "does not exist"));
  d.write("old.h5", "an existing file that must survive");
  r = run_kdalab(ok + " --out " + d.file("old.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "--force"));
  CHECK(slurp(d.file("old.h5")) == "an existing file that must survive");
  r = run_kdalab(ok + " --out " + d.path.string());  // a folder
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "is a directory"));
  CHECK(d.count() == 1);
}

TEST_CASE("bench: valid options in a build that cannot run the benchmark: exit 3, never 0, --compare included",
          "[cli][bench]") {
  TempDir d;
  const std::string tiny = "bench --op kda-prefill --shapes 1:16:1 --iters 1 --warmup 0";
  for (const std::string& extra :
       {std::string(), std::string(" --compare data/baselines/h200-kda.h5 data/baselines/h200-mla.h5"),
        std::string(" --quick --force")}) {
    const auto r = run_kdalab(tiny + extra + " --out " + d.file("b.h5"));
    INFO(extra << "\n" << r.output);
    CHECK(bench_valid_exit(r));
#ifndef KDALAB_HAVE_CUDA
    CHECK(r.code == 3);
    CHECK(has(r, "--preset cuda"));
    CHECK(has(r, extra.find("--compare") != std::string::npos ? "nothing was measured, compared or written"
                                                               : "nothing was measured or written"));
    CHECK(d.count() == 0);
#endif
    std::filesystem::remove(d.file("b.h5"));  // a GPU run wrote it
  }
#ifndef KDALAB_HAVE_CUDA
  // --op all with its default shapes and a --config: the same refusal
  d.write("c.json", R"({"op": "all", "iters": 2, "compare": ["data/baselines/h200-kda.h5"]})");
  const auto r = run_kdalab("bench --config " + d.file("c.json") + " --out " + d.file("b.h5"));
  INFO(r.output);
  CHECK(r.code == 3);
  CHECK(d.count() == 1);  // c.json only
#endif
}

namespace {

/// The option lines of a CLI11 help text ("  --name TYPE=default   description"). Newer CLI11 versions (2.4.1 on
/// the GPU machine, 2.1 in Debian 12) wrap long descriptions onto indented continuation lines and print defaults
/// as "TYPE [default]": continuation lines are joined to their option line.
std::vector<std::string> option_lines(const std::string& help) {
  std::vector<std::string> r;
  std::stringstream ss(help);
  std::string line;
  bool in_option = false;
  while (std::getline(ss, line)) {
    if (line.rfind("  --", 0) == 0) {
      r.push_back(line);
      in_option = true;
    } else if (const std::size_t pos = line.find_first_not_of(' ');
               in_option && pos != std::string::npos && pos >= 4 && line[pos] != '-') {
      r.back().push_back(' ');
      r.back().append(line, pos, std::string::npos);
    } else {
      in_option = false;
    }
  }
  return r;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

TEST_CASE("bench --help and check --help explain every option and state its default", "[cli][bench]") {
  for (const char* sub : {"bench", "check"}) {
    const auto r = run_kdalab(std::string(sub) + " --help");
    INFO(sub << "\n" << r.output);
    REQUIRE(r.code == 0);
    const auto lines = option_lines(r.output);
    CHECK(lines.size() >= 10);
    for (const std::string& l : lines) {
      INFO(l);
      // "  --name [TYPE[=default]] [...] description": CLI11 pads the name column to 30 characters, or one space
      std::stringstream ls(l);
      std::string name, tok, head, text;
      ls >> name;
      bool takes_value = false;
      while (ls >> tok) {
        const bool type = text.empty() && (tok.rfind("TEXT", 0) == 0 || tok.rfind("INT", 0) == 0 ||
                                            tok.rfind("FLOAT", 0) == 0 || tok.rfind("UINT", 0) == 0);
        if (type) {
          takes_value = true;
          head += tok;
        } else if (!(text.empty() && tok == "...")) {
          text += (text.empty() ? "" : " ") + tok;
        }
      }
      CHECK(text.size() >= 20);  // explained, not just named
      if (takes_value && name != "--config")  // --config is optional and has no default (cli.cpp, every subcommand)
        CHECK((head.find('=') != std::string::npos || text.rfind("[", 0) == 0 ||
               lower(text).find("default") != std::string::npos || lower(text).find("required") != std::string::npos));
      // the common options' generic texts are replaced where they are not true for this subcommand
      CHECK(text.find("seconds to a minute on a laptop CPU") == std::string::npos);
      CHECK(text.find("no progress lines on stderr") == std::string::npos);
    }
  }
  const auto b = run_kdalab("bench --help");
  CHECK(b.output.find("exit 3") != std::string::npos);              // the refusal is documented
  CHECK(b.output.find("4:4096:16:32") != std::string::npos);        // the default shapes are listed
  CHECK(b.output.find("No GPU: says so, writes nothing, exit 0") == std::string::npos);
  const auto c = run_kdalab("check --help");
  CHECK(c.output.find("required") != std::string::npos);  // --in
  // the options that act on one op say which ops take them (bench refuses them with another op)
  struct OneOp {
    std::string option, says;
  };
  const std::string kda = "Only with --op kda-prefill or all (with all it acts on the kda-prefill rows";
  const auto blines = option_lines(b.output);
  for (const OneOp& x : {OneOp{"--variant", "Only with --op mla-decode or all"},
                         OneOp{"--prefix", "> 0 only with --op mla-prefill or all"}, OneOp{"--segments", kda},
                         OneOp{"--overlap", kda}, OneOp{"--variants", kda}}) {
    const auto it = std::find_if(blines.begin(), blines.end(), [&](const std::string& l) {
      std::stringstream ls(l);
      std::string name;
      ls >> name;
      return name == x.option;
    });
    INFO(x.option);
    REQUIRE(it != blines.end());
    INFO(*it);
    CHECK(it->find(x.says) != std::string::npos);
  }
}
