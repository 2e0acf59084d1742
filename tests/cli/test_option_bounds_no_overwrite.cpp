// Finds of the adversarial review of the experiments, golden and check, each turned into a test:
// values that overflowed, never finished or crashed now exit 2 with a message naming the option; every list option
// of every subcommand refuses a repeated value (one rule, cli::require_once; decode-cost --cpu-n de-duplicated
// silently, the other sweeps did neither); integer options take decimal integers only (CLI11 read 0x5 as 5, 010 as 8);
// --help names every option's type; parity's messages name the option, the value and what is accepted; decode-cost
// --cpu-n gives the range message alone when the range fails (it cited a cache size, negative for n = -1); check
// names a missing --in before a bad --out.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <regex>
#include <string>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;

namespace {
void check_says(const RunResult& r, const std::string& says) { CHECK(r.output.find(says) != std::string::npos); }

void check_says(const RunResult& r, const std::vector<std::string>& says) {
  for (const auto& s : says) CHECK(r.output.find(s) != std::string::npos);  // "...\n": the list ends the message
}

/// Runs each row {args, says} of a table of bad command lines as `kdalab <head><args><tail> --out <d>/<stem><k>.h5`
/// (k = 1, 2, ...: each row its own --out, so that a file left by one row cannot fail the next) and checks that it
/// is refused: exit 2, every text of `says` (one string or a list) in the output, then `also(r)` where given. A
/// failure names the row's args and shows the output. The caller checks that no file was left (d.count()).
template <class Says>
void check_refused_rows(const TempDir& d, const std::vector<std::pair<std::string, Says>>& rows, const std::string& head,
                        const std::string& tail, const std::string& stem,
                        const std::function<void(const RunResult&)>& also = {}) {
  int k = 0;
  for (const auto& [args, says] : rows) {
    const auto r = run_kdalab(head + args + tail + " --out " + d.file(fmt::format("{}{}.h5", stem, ++k)));
    INFO(args << ": " << r.output);
    CHECK(r.code == 2);
    check_says(r, says);
    if (also) also(r);
  }
}

/// Runs `kdalab <args>` and checks that it is accepted (exit 0; a failure shows the output).
void check_accepted(const std::string& args) {
  const auto r = run_kdalab(args);
  INFO(r.output);
  CHECK(r.code == 0);
}

/// A boolean's default as --help shows it and a results file records it ("softplus": "1") is accepted in --config.
void check_config_boolean_accepted(const TempDir& d) {
  d.write("b.json", "{\"softplus\": \"1\", \"kernel-plan\": false}");
  check_accepted("decay-range --quick --quiet --T 64 --D 16 --C 16 --g-min -5 --precision fp64 --softplus 0 "
                 "--config " + d.file("b.json") + " --out " + d.file("b.h5"));
}
}  // namespace

TEST_CASE("out-of-range experiment options exit 2 naming the option, with no file") {
  TempDir d;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"decode-cost --quick --n 1e30", "--n"},
      {"decode-cost --quick --context 1e300", "--context"},
      {"decode-cost --quick --memory-gb 1e300", "--memory-gb"},
      {"decode-cost --quick --bandwidth-gbs 1e-300", "--bandwidth-gbs"},
      {"decode-cost --quick --cpu-n 2000000 --cpu-d 512", "--cpu-n"},  // 1e6 x 512 fits: 3.8 GiB of float32
      {"recall --quick --trials 1e9", "--trials"},
      {"recall --quick --decay-bias-hi 1e300", "--decay-bias"},
      {"recall --quick --softmax-scale 1e300", "--softmax-scale"},
      {"recall --quick --span 1e9", "--span"},
      {"copy --quick --L 1000000", "--L"},
      {"copy --quick --decay-bias-lo -1e300", "--decay-bias"},
  };
  check_refused_rows(d, cases, "", " --quiet", "x");
  CHECK(d.count() == 0);
}

TEST_CASE("decode-cost --cpu-n: the range message alone when the range fails, never a cache size") {
  TempDir d;
  const auto ok = run_kdalab("decode-cost --cpu-n 1024 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 --context 1024 "
                             "--gpu-n 0 --quiet --out " + d.file("ok.h5"));
  INFO(ok.output);
  REQUIRE(ok.code == 0);
  // was "would take 0.00745 GiB" for 1000001 x 1 (the range failed, not the size) and a negative GiB for -1
  for (const auto& [n, dd] : std::vector<std::pair<double, int>>{
           {2000000, 512}, {2000000, 128}, {1000001, 1}, {-1, 64}, {-1000000000000, 64}}) {
    const auto r = run_kdalab(fmt::format("decode-cost --quick --quiet --cpu-n {} --cpu-d {} --out {}", n, dd, d.file("x.h5")));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(fmt::format("--cpu-n: {} is not accepted; accepted: integers n in [0, 1e6]", n)) != std::string::npos);
    CHECK(r.output.find("GiB") == std::string::npos);
    CHECK(r.output.find("would take") == std::string::npos);
  }
  CHECK(d.count() == 1);  // ok.h5 only
}

TEST_CASE("every list option of every subcommand refuses a repeated value (exit 2, the option and the value, no file)") {
  TempDir d;
  // one rule (cli::require_once): numbers compare by value, text exactly; the value shown is the repeat as given
  const std::vector<std::pair<std::string, std::string>> cases{
      {"parity --C 64,64,16", "--C: 64 is given more than once; give each value once"},
      {"parity --impl float64,float64", "--impl: float64 is given more than once"},
      {"parity --gate softplus,softplus", "--gate: softplus is given more than once"},
      {"parity --beta one,sigmoid,one", "--beta: one is given more than once"},
      {"parity --T 17,33,17", "--T: 17 is given more than once"},
      {"parity --B 1,1", "--B: 1 is given more than once"},
      {"parity --H 2 --H 2", "--H: 2 is given more than once"},  // the option repeated is the same list
      {"parity --dk 16,16", "--dk: 16 is given more than once"},
      {"parity --dv 16,16", "--dv: 16 is given more than once"},
      {"parity --g-min -5,-5.0", "--g-min: -5.0 is given more than once"},
      {"parity --state-precision fp32,fp32", "--state-precision: fp32 is given more than once"},
      {"parity --matmul-precision plan,bf16,plan", "--matmul-precision: plan is given more than once"},
      {"recall --memories kda,softmax,kda", "--memories: kda is given more than once"},
      {"recall --keys random,random", "--keys: random is given more than once"},
      {"recall --d-k 16,32,16", "--d-k: 16 is given more than once"},
      {"recall --ratio 0.5,0.50", "--ratio: 0.50 is given more than once"},
      {"recall --beta 1,1", "--beta: 1 is given more than once"},
      {"recall --g-min -5,-5", "--g-min: -5 is given more than once"},
      {"recall --dc-ratio 1,1", "--dc-ratio: 1 is given more than once"},
      {"copy --memories mla,mla", "--memories: mla is given more than once"},
      {"copy --precision fp32,fp32", "--precision: fp32 is given more than once"},
      {"copy --d-k 16,16", "--d-k: 16 is given more than once"},
      {"copy --L 4,8,4", "--L: 4 is given more than once"},
      {"decay-range --g-min -5,-5", "--g-min: -5 is given more than once"},
      {"decay-range --C 16,16", "--C: 16 is given more than once"},
      {"decay-range --precision bf16,bf16", "--precision: bf16 is given more than once"},
      {"decode-cost --n 1000,1000", "--n: 1000 is given more than once"},
      {"decode-cost --d 64,64", "--d: 64 is given more than once"},
      {"decode-cost --cpu-n 1024,2048,1024", "--cpu-n: 1024 is given more than once"},  // was de-duplicated silently
      {"decode-cost --context 1024,1024", "--context: 1024 is given more than once"},
      {"decode-cost --gpu-n 0,0", "--gpu-n: 0 is given more than once"},
      {"bench --op kda-prefill --shapes 1:64:2,1:64:2:2", "--shapes: '1:64:2:2' is given more than once"},  // HV = H
      {"bench --op mla-decode --shapes 1:64:2,2:64:2,1:64:2", "--shapes: '1:64:2' is given more than once"},
      {"bench --compare a.h5 a.h5", "--compare: a.h5 is given more than once"},
      {"bench --peer-json p.json --peer-json p.json", "--peer-json: p.json is given more than once"},
  };
  check_refused_rows(d, cases, "", " --quick --quiet", "p");
  CHECK(d.count() == 0);
}

TEST_CASE("integer options take decimal integers only; numbers are decimal (exit 2 naming the option, no file)") {
  TempDir d;
  const std::string dec = "is not accepted; give a decimal integer (digits, an optional sign, no leading zero";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"bench --op mla-decode --variant 0x5", "--variant: '0x5' " + dec},  // CLI11 read it as 5
      {"bench --op mla-decode --variant 010", "--variant: '010' " + dec},  // and this as octal 8
      {"parity --windows 0x10", "--windows: '0x10' " + dec},
      {"parity --T 17,0x11", "--T: '0x11' " + dec},  // a count held in a double: 1e3 and 16.0 are no integers
      {"decode-cost --cpu-n 999999.5", "--cpu-n: '999999.5' " + dec},
      {"decode-cost --cpu-n -1e300", "--cpu-n: '-1e300' " + dec},
      {"recall --trials 2.0", "--trials: '2.0' " + dec},
      {"copy --L 1e3", "--L: '1e3' " + dec},
      {"decay-range --T 0x400", "--T: '0x400' " + dec},
      {"decode-cost --seed 010", "--seed: '010' " + dec},
      {"check --in x.h5 --tol 0x1p-3", "--tol: '0x1p-3' is not accepted; give a decimal number (not hexadecimal)"},
  };
  check_refused_rows(d, cases, "", " --quick --quiet", "i");
  CHECK(d.count() == 0);
  // decimal integers with a sign still reach the subcommand's own range check
  check_accepted("parity --quick --quiet --T +17 --dk 16 --dv 16 --impl float64 --out " + d.file("ok.h5"));
}

TEST_CASE("--help names every option's type: INT / INT list for counts, never FLOAT") {
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
      {"bench", {"--iters INT", "--variant INT", "--shapes TEXT", "--compare TEXT list"}},
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

TEST_CASE("check outside the repo without --in names --in first, not the default --out's missing folder") {
  TempDir d;  // no results/ folder here: the default --out results/check.h5 cannot be written either
  const std::string bin = std::filesystem::absolute(kdalab_bin()).string();
  auto r = run_command("cd " + d.path.string() + " && " + bin + " check --quiet");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("--in FILE.h5 is required") != std::string::npos);
  CHECK(r.output.find("--out") == std::string::npos);
  r = run_command("cd " + d.path.string() + " && " + bin + " check --quiet --in none.h5");
  CHECK(r.code == 2);
  CHECK(r.output.find("--in 'none.h5': not found") != std::string::npos);
  CHECK(r.output.find("results") == std::string::npos);
  // with a readable --in, the --out folder is the next thing to fix
  std::filesystem::copy_file("data/golden/kda_recurrent.h5", d.file("in.h5"));
  r = run_command("cd " + d.path.string() + " && " + bin + " check --quiet --in in.h5");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("--out 'results/check.h5': folder 'results' does not exist") != std::string::npos);
  CHECK(d.count() == 1);  // in.h5 only
}

TEST_CASE("parity messages name the option, the value and what is accepted") {
  TempDir d;
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      // was "tensor 'g' has a non-finite value": the gate overflowed float32 inside the run
      {"--g-min -1e39 --impl float32",
       {"--g-min: -1e+39 is not accepted with --impl float32", "3.40282e+38", "<= g_min < 0"}},
      {"--g-min -1e39 --impl float64,float32-chunk", {"--g-min: -1e+39 is not accepted with --impl float32"}},
      // was "... accepted: bf16, fp16, tf32, fp32, fp64": fp64 is refused, plan was missing
      {"--matmul-precision PLAN", {"--matmul-precision: 'PLAN' is not accepted; accepted: plan, bf16, fp16, tf32, fp32\n"}},
      {"--matmul-precision fp64", {"--matmul-precision: 'fp64' is not a tensor-core format; accepted: plan, bf16, fp16, "
                                   "tf32, fp32\n"}},
      {"--state-precision fp16", {"--state-precision: 'fp16' is not accepted; accepted: fp32, bf16\n"}},
      {"--state-precision x", {"--state-precision: 'x' is not accepted; accepted: fp32, bf16\n"}},
      // was "give integers >= 1" without the cap
      {"--C 10000000000000", {"--C: 10000000000000 is not accepted; give integers in [1, 1e12]"}},
      {"--T 0", {"--T: 0 is not accepted; give integers in [1, 1e12]"}},
  };
  check_refused_rows(d, cases, "parity --quick --quiet --T 17 --dk 16 --dv 16 ", "", "p",
                     [](const RunResult& r) { CHECK(r.output.find("non-finite") == std::string::npos); });
  CHECK(d.count() == 0);
  // the float64 implementations compute g in float64: the same g_min runs there (with float32 it read "tensor 'g'
  // has a non-finite value")
  check_accepted("parity --quick --quiet --T 17 --dk 16 --dv 16 --g-min -1e39 --gate bounded --beta one --impl float64 "
                 "--out " + d.file("p.h5"));
  check_config_boolean_accepted(d);
}

TEST_CASE("golden --regen never replaces fixtures without --force; check never overwrites its input") {
  TempDir d;
  const std::string gdir = d.file("g");
  std::filesystem::create_directories(gdir);
  for (const auto& e : std::filesystem::directory_iterator("data/golden"))
    std::filesystem::copy_file(e.path(), gdir + "/" + e.path().filename().string());
  const auto before = std::filesystem::last_write_time(gdir + "/kda_recurrent.h5");
  const auto r = run_kdalab("golden --regen --quiet --dir " + gdir);
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("--force") != std::string::npos);
  CHECK(std::filesystem::last_write_time(gdir + "/kda_recurrent.h5") == before);
  const auto empty = run_kdalab("golden --regen --quiet --dir ''");
  CHECK(empty.code == 2);
  const std::string in = gdir + "/kda_recurrent.h5";
  const auto same = run_kdalab("check --op kda --quiet --in " + in + " --out " + in + " --force");
  INFO(same.output);
  CHECK(same.code == 2);
  CHECK(std::filesystem::last_write_time(in) == before);
}

// The breaker's finds on the CLI rules (session 7): each row a command line that was accepted (or refused in another
// shape), now exit 2 with the words shown and no file. One place each, in experiments/cli.cpp unless said.
TEST_CASE("breaker session 7: whitespace, empty list items, options twice, booleans, messages, --prefix (exit 2, no file)") {
  TempDir d;
  const std::string tab = "\"$(printf '\\tnan')\"";  // popen runs /bin/sh: no $'...'
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      // 1. surrounding whitespace in a numeric value (" inf" ran with power_a = inf, exit 0)
      {"recall --power-a ' inf'", {"kdalab recall: error: --power-a: ' inf' is not accepted; give the number without "
                                   "surrounding whitespace"}},
      {"recall --power-a " + tab, {"--power-a: '\tnan' is not accepted; give the number without surrounding whitespace"}},
      {"recall --power-a '0.5 '", {"--power-a: '0.5 ' is not accepted"}},
      {"recall --trials '5 '", {"--trials: '5 ' is not accepted; give the number without surrounding whitespace"}},
      {"parity --T '17, 300'", {"--T: ' 300' is not accepted; give the number without surrounding whitespace"}},
      // 3. an empty list item (dropped silently; "--T ," took the next argument as the list)
      {"parity --T , --impl float64", {"--T: the list ',' has an empty item"}},
      {"parity --T 17,,300", {"--T: the list '17,,300' has an empty item"}},
      {"parity --T 17,", {"--T: the list '17,' has an empty item"}},
      {"parity --T ,17", {"--T: the list ',17' has an empty item"}},
      {"parity --T=17,,300", {"--T: the list '17,,300' has an empty item"}},
      {"parity --T 17 ''", {"--T: the list '' has an empty item"}},
      {"parity --impl float64,,float32", {"--impl: the list 'float64,,float32' has an empty item"}},
      // 4. a non-list option given twice (the last one won silently)
      {"decay-range --T 17 --T 300", {"--T: the option is given more than once ('17', '300'); give it once"}},
      {"decay-range --T=17 --T 300", {"--T: the option is given more than once"}},
      {"decay-range --seed 5 --seed 6", {"--seed: the option is given more than once ('5', '6')"}},
      {"bench --op mla-decode --shapes 1:64:2 --shapes 2:64:2", {"--shapes: the option is given more than once"}},
      {"parity --config a.json --config b.json", {"--config: the option is given more than once ('a.json', 'b.json')"}},
      // 5. booleans: true, false, 1 or 0 only ("0x1" and "" read as false; --help shows the default as 1)
      {"decay-range --softplus 0x1", {"--softplus: '0x1' is not accepted; accepted: true, false, 1 or 0"}},
      {"decay-range --softplus ''", {"--softplus: '' is not accepted; accepted: true, false, 1 or 0"}},
      {"decay-range --kernel-plan 2", {"--kernel-plan: '2' is not accepted; accepted: true, false, 1 or 0"}},
      // 6. messages: the option once, the subcommand named, CLI11's conversion errors in the project's shape
      {"decode-cost --seed 0x5", {"kdalab decode-cost: error: --seed: '0x5' is not accepted; give an integer in [0, "
                                  "2^64 - 1]"}},
      {"bench --iters 9999999999999", {"kdalab bench: error: --iters: '9999999999999' is not accepted; give an integer "
                                       "in [-2^31, 2^31 - 1]"}},
      {"bench --iters 99999999999999999999", {"--iters: '99999999999999999999' is out of range"}},
      // 7. --prefix: not clamped, and prefix + T <= 2^31 - 1 in every build (exit 3 without the kernels)
      {"bench --op mla-prefill --prefix 99999999999999999999",
       {"--prefix: '99999999999999999999' is out of range; give an integer in [-2^63, 2^63 - 1]"}},
      {"bench --op mla-prefill --shapes 1:64:2 --prefix 4000000000",
       {"--prefix 4000000000 with T = 64", "accepted: 0 <= prefix and prefix + T <= 2^31 - 1"}},
      {"bench --op mla-prefill --shapes 1:64:2 --prefix 2147483584", {"--prefix 2147483584 with T = 64"}},
  };
  check_refused_rows(d, cases, "", " --quick --quiet", "b", [](const RunResult& r) {
    CHECK(r.output.find("Could not convert") == std::string::npos);
    CHECK(r.output.find("9223372036854775807") == std::string::npos);
    CHECK(std::regex_search(r.output, std::regex("(--[a-z-]+): \\1:")) == false);  // never "--seed: --seed:"
  });
  CHECK(d.count() == 0);
  // the limits themselves are accepted: prefix + T = 2^31 - 1, booleans true/false, a sign on an integer
  const auto edge = run_kdalab("bench --op mla-prefill --shapes 1:64:2 --prefix 2147483583 --quick --quiet --out " +
                               d.file("e.h5"));
  INFO(edge.output);
  // accepted by the option checks; on a GPU the 2^31-token latent cache (2 TiB) then does not fit: exit 2 saying so
  CHECK((bench_valid_exit(edge) || (edge.code == 2 && edge.output.find("not enough GPU memory") != std::string::npos)));
  check_config_boolean_accepted(d);
  check_accepted("parity --quick --quiet --T +17 --dk 16 --dv 16 --impl float64 --seed 5 --out " + d.file("ok.h5"));
}

TEST_CASE("breaker session 7: --config values obey the command line's rules; a key twice is refused") {
  TempDir d;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"{\"power-a\": \" inf\"}", "--power-a: ' inf' is not accepted; give the number without surrounding whitespace"},
      {"{\"T\": [17], \"T\": [300]}", "key 'T' appears twice; give each key once"},  // the last one won silently
      {"{\"seed\": 5, \"seed\": 5}", "key 'seed' appears twice"},
      {"{\"T\": \"17,,300\"}", "--T: the list '17,,300' has an empty item"},
      {"{\"T\": [17, \"\"]}", "--T: the list '' has an empty item"},
      {"{\"softplus\": \"0x1\"}", "--softplus: '0x1' is not accepted; accepted: true, false, 1 or 0"},
  };
  int k = 0;
  for (const auto& [json, says] : cases) {
    const std::string name = fmt::format("c{}.json", ++k);
    d.write(name, json);
    const std::string sub = json.find("power-a") != std::string::npos ? "recall"
                            : json.find("softplus") != std::string::npos ? "decay-range"
                                                                          : "parity";
    const auto r = run_kdalab(sub + " --quick --quiet --config " + d.file(name) + " --out " + d.file(name + ".h5"));
    INFO(json << ": " << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(says) != std::string::npos);
    if (says.find("twice") != std::string::npos) CHECK(r.output.find("--config '" + d.file(name) + "'") != std::string::npos);
    CHECK(!std::filesystem::exists(d.file(name + ".h5")));
  }
}

TEST_CASE("breaker session 7: check names a bad --in (a folder, not HDF5) before a bad --out, and 'check' once") {
  TempDir d;
  d.write("text.h5", "not an HDF5 file\n");
  std::filesystem::create_directories(d.file("dir"));
  for (const std::string& in : {d.file("dir"), d.file("text.h5")}) {
    const auto r = run_kdalab("check --quiet --in " + in + " --out " + d.file("no/such/folder/r.h5"));
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find("kdalab check: error: --in '" + in + "': not found or not a readable HDF5 file") != std::string::npos);
    CHECK(r.output.find("--out") == std::string::npos);
  }
  const auto r = run_kdalab("check --quiet --out " + d.file("r.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("kdalab check: error: --in FILE.h5 is required") != std::string::npos);
  CHECK(r.output.find("check: check") == std::string::npos);
  CHECK(d.count() == 2);  // text.h5 and dir only
}
