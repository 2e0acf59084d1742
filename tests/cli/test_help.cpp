// --help: every subcommand has one that exits 0, describes the common options, states each option's type and
// default, and says which shared options have no effect; --help anywhere after the subcommand wins; the root help
// says which subcommands write a file; each experiment's --help says what --quick changes and where the values used
// are recorded.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("bench --help and check --help explain every option and state its default", "[bench][check][help]") {
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
  for (const OneOp& x : {OneOp{"--prefix", "> 0 only with --op mla-prefill or all"}, OneOp{"--segments", kda},
                         OneOp{"--overlap", kda}, OneOp{"--state-pass", kda},
                         // accurate cannot run on --op all's default D = 64 and 256 rows: the help must not offer it
                         OneOp{"--precision", "accurate: --op kda-prefill with --shapes of D = 128 only"},
                         OneOp{"--s-q", "Only with --op mla-decode or all"},
                         OneOp{"--mla-precision", "Only with --op mla-decode or all"},
                         OneOp{"--ring-depth", "Only with --op attn-res or all"}}) {
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

TEST_CASE("every subcommand has --help that exits 0 and describes the common options", "[help]") {
  for (const char* sub : {"info", "parity", "recall", "copy", "decay-range", "decode-cost", "bench", "golden", "check"}) {
    const auto r = run_kdalab(std::string(sub) + " --help");
    INFO(sub << ": " << r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("--config") != std::string::npos);
    CHECK(r.output.find("--out") != std::string::npos);
    CHECK(r.output.find("--seed") != std::string::npos);
    CHECK(r.output.find("--quick") != std::string::npos);
    CHECK(r.output.find("--force") != std::string::npos);
  }
  const auto top = run_kdalab("--help");
  CHECK(top.code == 0);
  CHECK(top.output.find("decode-cost") != std::string::npos);
}

TEST_CASE("golden --help and info --help say which shared options have no effect for them", "[golden][help][info]") {
  {
    const auto r = run_kdalab("golden --help");
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("recorded in the results file") == std::string::npos);  // golden writes no results file
    CHECK(r.output.find("no effect for golden") != std::string::npos);
  }
  {
    const RunResult r = run_kdalab("info --help");
    INFO(r.output);
    REQUIRE(r.code == 0);
    for (const char* name : {"--seed", "--quick", "--quiet"}) {
      const std::string h = option_help(r.output, name);
      INFO(name << ": " << h);
      CHECK(h.find("no effect for info") != std::string::npos);
    }
  }
}

TEST_CASE("--help anywhere after the subcommand prints the help and exits 0, whatever else the line holds", "[help]") {
  const auto plain = run_kdalab("parity --help");
  REQUIRE(plain.code == 0);
  REQUIRE(has(plain, "--T"));
  for (const std::string& args : {std::string("parity --T ,, --help"), std::string("parity --help --T ,,"),
                                  std::string("parity --quick --quick -h"), std::string("parity --T abc --help"),
                                  std::string("parity --seed 1 --seed 2 --help"), std::string("parity --g-min 1e-400 --help")}) {
    const auto r = run_kdalab(args);
    INFO(args << "\n" << r.output);
    CHECK(r.code == 0);
    CHECK(r.output == plain.output);
  }
  const auto bench = run_kdalab("bench --compare a.h5,, --help");
  CHECK(bench.code == 0);
  CHECK(bench.output == run_kdalab("bench --help").output);
}

TEST_CASE("each experiment's --help says what --quick changes and where the values used are recorded", "[help]") {
  {
    for (const char* sub : {"parity", "recall", "copy", "decay-range", "decode-cost"}) {
      const RunResult r = run_kdalab(std::string(sub) + " --help");
      INFO(sub << "\n" << r.output);
      REQUIRE(r.code == 0);
      const std::string h = option_help(r.output, "--quick");
      CHECK(h.find("recorded in the results file's root attribute `config`") != std::string::npos);
    }
  }
  {
    // each experiment's --quick help names the values it uses (not "smaller defaults for some options"), built from
    // the same constants its check applies, so a quick run's grid is told from the full one without the code
    struct Case {
      std::string cmd, says;
    };
    for (const Case& c : {Case{"recall", "--d-k 16,32,64, --trials 2, --vocab 2048, each unless given explicitly"},
                          Case{"copy", "--d-k 16,32,64, --L 4,8,16,32,64,128,256, --trials 8, each unless given"},
                          Case{"parity", "--T 17,300,1000, --gate bounded,softplus, --beta sigmoid,one, --truth f64, each"},
                          Case{"decode-cost", "--cpu-n 1024,2048,4096,8192,16384, --min-time 0.02, each unless given"},
                          Case{"decay-range", "--T 128, --D 32, each unless given explicitly"}}) {
      const RunResult r = run_kdalab(c.cmd + " --help");
      INFO(c.cmd << "\n" << r.output);
      REQUIRE(r.code == 0);
      // CLI11 wraps long descriptions: compare with the help's whitespace runs collapsed to one space
      std::string flat;
      for (char ch : r.output) {
        const bool ws = ch == ' ' || ch == '\n' || ch == '\t';
        if (ws && (flat.empty() || flat.back() == ' ')) continue;
        flat += ws ? ' ' : ch;
      }
      CHECK(flat.find(c.says) != std::string::npos);
      CHECK(flat.find("smaller defaults for some options") == std::string::npos);
    }
  }
}

TEST_CASE("the root help says which subcommands write a file, check --tol's help reads whole", "[help][check]") {
  // not "Each subcommand writes one HDF5 results file (--out)": golden writes none, info only with --out, bench only on
  // a GPU; check --help's --tol text is whole, to its last words.
  const RunResult root = run_kdalab("--help");
  INFO(root.output);
  REQUIRE(root.code == 0);
  CHECK(root.output.find("Each subcommand writes one HDF5 results file") == std::string::npos);
  CHECK(has(root, "Each experiment (parity, recall, copy, decay-range, decode-cost) writes one HDF5 results file"));
  CHECK(has(root, "check writes a report there, bench only when it runs on a GPU, info only when --out is given, "
                  "golden never."));
  const RunResult check = run_kdalab("check --help");
  INFO(check.output);
  REQUIRE(check.code == 0);
  CHECK(has(check, "it has no NaN/Inf. Default: not given; the budget rule (docs/check-format.md) judges every "
                   "candidate"));
}

TEST_CASE("check --help's --op names every operation check accepts", "[help][check]") {
  // the accepted list is the one the refusal of an unknown --op prints
  const RunResult bad = run_kdalab("check --op nope --in x.h5");
  INFO(bad.output);
  REQUIRE(bad.code == 2);
  const std::string says = "accepted: ";
  const auto at = bad.output.find(says);
  REQUIRE(at != std::string::npos);
  std::stringstream list(bad.output.substr(at + says.size(), bad.output.find('\n', at) - at - says.size()));
  std::vector<std::string> ops;
  for (std::string op; std::getline(list, op, ',');) ops.push_back(op.substr(op.find_first_not_of(' ')));
  CHECK(ops.size() == 7);
  const RunResult help = run_kdalab("check --help");
  REQUIRE(help.code == 0);
  std::string op_text;  // the --op entry, its wrapped lines joined
  for (const std::string& l : option_lines(help.output))
    if (l.rfind("--op", l.find_first_not_of(' ')) == l.find_first_not_of(' ')) op_text = l;
  INFO(op_text);
  REQUIRE(!op_text.empty());
  for (const std::string& op : ops) {
    INFO(op);
    CHECK(std::regex_search(op_text, std::regex("(^|[^a-z-])" + op + "([^a-z-]|$)")));
  }
}

TEST_CASE("--help names every option's type: INT / INT list for counts, never FLOAT", "[help]") {
  // was "--T FLOAT=[17,64,300,1000] ...", "--trials FLOAT=2", "--seed UINT:UINT64=1". CLI11 2.1 prints a default as
  // "--T INT list=[..]", CLI11 2.4 (the GPU machine) as "--T INT list [[..]]": the type must be followed by '=', the
  // end of the line or a space that does not start " list"
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"parity", {"--B INT list", "--T INT list", "--H INT list", "--dk INT list", "--dv INT list", "--C INT list",
                  "--g-min FLOAT list", "--gate TEXT list", "--windows INT", "--mp-max-work FLOAT", "--seed UINT64"}},
      {"recall", {"--d-k INT list", "--ratio FLOAT list", "--trials INT", "--vocab INT", "--keys TEXT list"}},
      {"copy", {"--d-k INT list", "--L INT list", "--trials INT", "--alphabet INT", "--precision TEXT list"}},
      {"decay-range", {"--C INT list", "--T INT", "--D INT", "--g-min FLOAT list", "--softplus BOOLEAN"}},
      {"decode-cost", {"--n INT list", "--d INT list", "--cpu-n INT list", "--cpu-d INT", "--context INT list",
                       "--k3-layers INT", "--gpu-n INT list", "--gpu-iters INT", "--min-time FLOAT"}},
      {"bench", {"--iters INT", "--segments INT", "--shapes TEXT", "--compare TEXT list"}},
      {"check", {"--tol FLOAT", "--in TEXT"}},
  };
  auto shows = [](const std::string& out, const std::string& opt_type) {
    const std::string line = "  " + opt_type;
    for (auto pos = out.find(line); pos != std::string::npos; pos = out.find(line, pos + 1)) {
      const std::size_t end = pos + line.size();
      if (end >= out.size() || out[end] == '=' || out[end] == '\n') return true;
      if (out[end] == ' ' && out.compare(end, 5, " list") != 0) return true;
    }
    return false;
  };
  for (const auto& [sub, says] : cases) {
    const auto r = run_kdalab(sub + " --help");
    INFO(sub << " --help: " << r.output);
    CHECK(r.code == 0);
    for (const auto& s : says) {
      INFO("expected the option line '" << s << "'");
      CHECK(shows(r.output, s));
    }
    CHECK(r.output.find("UINT:") == std::string::npos);
  }
}
