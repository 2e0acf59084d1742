// Option values: out-of-range, non-finite, underflowing, non-decimal and repeated values, flags given twice or given
// a value, whitespace and empty list items are refused with exit 2 and one line naming the option, the value and
// what is accepted; no file is written.
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "experiments/cli.hpp"
#include "experiments/results.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

namespace fs = std::filesystem;
using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("non-finite option values, bad seeds, unknown subcommands and over-long names exit 2", "[cli]") {
  TempDir d;
  for (const char* bad : {"--d inf", "--n nan", "--memory-gb -inf", "--memory-gb 1e400", "--seed -1",
                          "--seed 99999999999999999999999", "--seed 1.5"}) {
    const auto r = run_kdalab(std::string("decode-cost --quiet ") + bad + " --out " + d.file("x.h5"));
    INFO(bad << ": " << r.output);
    CHECK(r.code == 2);
  }
  const auto sub = run_kdalab("frobnicate --quick");
  CHECK(sub.code == 2);
  CHECK(sub.output.find("unknown subcommand 'frobnicate'") != std::string::npos);
  const auto longname = run_kdalab("decode-cost --quiet --out " + d.file(std::string(240, 'x') + ".h5"));
  CHECK(longname.code == 2);
  CHECK(longname.output.find("too long") != std::string::npos);
  CHECK(d.count() == 0);
}

TEST_CASE("a flag given twice is refused like any non-list option given twice", "[cli]") {
  TempDir d;
  for (const std::string& args : {std::string("info --quick --quick"), std::string("info --quiet --quiet"),
                                  std::string("parity --force --seed 3 --force"),
                                  kTiny + " --quick --quick"}) {
    const auto r = run_kdalab(args + " --out " + d.file("x.h5"));
    INFO(args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, ": the option is given more than once ('--"));
    CHECK(has(r, "'); give it once"));
  }
  const auto r = run_kdalab("info --quick --quiet");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(d.count() == 0);
}

TEST_CASE("a FLOAT that underflows (to 0 or a denormal) is refused, quoting the text as given", "[cli]") {
  for (const std::string& v : {std::string("1e-400"), std::string("-1e-400"), std::string("1e-310"),
                               std::string("0.00001e-305")}) {
    const auto r = run_kdalab("decode-cost --quick --min-time " + v + " --out /nonexistent/x.h5");
    INFO(v << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--min-time: '" + v + "' is not accepted: it is below the smallest normal double"));
    CHECK_FALSE(has(r, "--min-time: 0 "));
  }
  // 0 and the smallest normal double go through the parser to the subcommand's own check (here: --op first)
  for (const std::string& v : {std::string("0"), std::string("0e-500"), std::string("2.2250738585072014e-308")}) {
    const auto r = run_kdalab("check --tol " + v + " --op bogus --in none.h5");
    INFO(v << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "--op 'bogus' is unknown"));
  }
}

TEST_CASE("a flag given a bad value says what a flag takes", "[cli]") {
  const auto r = run_timed("parity --quick=banana");
  require_one_line_exit2(r);
  CHECK(has(r, "--quick: 'banana' is not accepted; give true, false, 1 or 0"));
  CHECK(!has(r, "of type \n"));
}

TEST_CASE("bad experiment options exit 2 and write no file", "[cli]") {
  TempDir d;
  const std::vector<std::string> bad{
      "recall --d-k 0",        "recall --memories foo",     "recall --beta 2",       "recall --keys diagonal",
      "recall --ratio 0",      "recall --g-min 1",          "recall --vocab 16 --d-k 64",
      "copy --precision fp8",  "copy --alphabet 1",         "copy --L 0",            "copy --keys correlated",
      "decode-cost --memory-gb -1", "decode-cost --k3-layers 90", "decode-cost --cpu-d 0",
      "decode-cost --min-time 0", "decay-range --C 0",    "decay-range --C 65",    "decay-range --g-min 0",
      "decay-range --precision fp8", "decay-range --precision tf32", "decay-range --T 0"};
  for (const auto& b : bad) {
    const auto r = run_kdalab(b + " --quick --quiet --out " + d.file("x.h5"));
    INFO(b << " -> " << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find("error") != std::string::npos);
    CHECK(d.count() == 0);
  }
}

TEST_CASE("out-of-range experiment options exit 2 naming the option, with no file", "[cli]") {
  TempDir d;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"decode-cost --quick --n 1e30", "--n"},
      {"decode-cost --quick --context 1e300", "--context"},
      {"decode-cost --quick --memory-gb 1e300", "--memory-gb"},
      {"decode-cost --quick --bandwidth-gbs 1e-300", "--bandwidth-gbs"},
      {"decode-cost --quick --cpu-n 2000000 --cpu-d 512", "--cpu-n"},  // 1e6 x 512 fits: 3.8 GiB of float32
      // 4 m + 1 but beyond an int: it was written as -2147483648 layers with exit 0
      {"decode-cost --quick --k3-layers 4000000001", "--k3-layers: 4000000001 must be 4 m + 1 (3:1 blocks plus a final MLA), in [5, 1e6]"},
      {"recall --quick --trials 1e9", "--trials"},
      {"recall --quick --decay-bias-hi 1e300", "--decay-bias"},
      {"recall --quick --softmax-scale 1e300", "--softmax-scale"},
      {"recall --quick --span 1e9", "--span"},
      {"copy --quick --L 1000000", "--L"},
      {"copy --quick --decay-bias-lo -1e300", "--decay-bias"},
      // the softplus gate's log-decay -inf: it was refused as "tensor 'g'", an option the command does not have
      {"decay-range --quick --T 16 --D 8 --C 16 --precision fp64 --kernel-plan 0 --gate-shift 1e308",
       "--gate-shift: 1e+308 is not accepted: the softplus gate's log-decay is -inf"},
  };
  check_refused_rows(d, cases, "", " --quiet", "x");
  CHECK(d.count() == 0);
}

TEST_CASE("decode-cost --cpu-n: the range message alone when the range fails, never a cache size", "[decode-cost]") {
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

TEST_CASE("every list option of every subcommand refuses a repeated value (exit 2, the option and the value, no file)",
          "[cli]") {
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

TEST_CASE("integer options take decimal integers only; numbers are decimal (exit 2 naming the option, no file)",
          "[cli]") {
  TempDir d;
  const std::string dec = "is not accepted; give a decimal integer (digits, an optional sign, no leading zero";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"bench --op kda-prefill --segments 0x5", "--segments: '0x5' " + dec},  // CLI11 read it as 5
      {"bench --op kda-prefill --segments 010", "--segments: '010' " + dec},  // and this as octal 8
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

TEST_CASE("parity messages name the option, the value and what is accepted", "[parity]") {
  TempDir d;
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      // was "tensor 'g' has a non-finite value": the gate overflowed float32 inside the run
      {"--g-min -1e39 --impl float32",
       {"--g-min: -1e+39 is not accepted with --impl float32", "3.40282e+38", "<= g_min < 0"}},
      {"--g-min -1e39 --impl float64,float32-chunk", {"--g-min: -1e+39 is not accepted with --impl float32"}},
      // was "... accepted: bf16, fp16, tf32, fp32, fp64": fp64 is refused, plan was missing
      {"--matmul-precision PLAN", {"--matmul-precision: 'PLAN' is not accepted; accepted: plan, plan-hilo, plan-accurate, "
                                   "bf16, fp16, tf32, fp32\n"}},
      {"--matmul-precision fp64", {"--matmul-precision: 'fp64' is not a tensor-core format; accepted: plan, plan-hilo, "
                                   "plan-accurate, bf16, fp16, tf32, fp32\n"}},
      {"--inputs long_memory", {"--inputs: 'long_memory' is unknown; accepted: anchor, long-memory, collinear-keys, "
                                "collinear-keys-slow-decay, identical-keys\n"}},
      {"--state-precision fp16", {"--state-precision: 'fp16' is not accepted; accepted: fp32, bf16\n"}},
      // were ignored silently: no row of these implementations has a chunk size, state or matmul format
      {"--impl float64,float32 --matmul-precision plan-hilo",
       {"--matmul-precision plan-hilo has no effect without --impl twin-bf16 (only the kernel twin's rows have a "
        "state and matmul format); add twin-bf16 to --impl, or leave the option out\n"}},
      {"--impl float64,float32-chunk --state-precision bf16", {"--state-precision bf16 has no effect without --impl "
                                                               "twin-bf16"}},
      {"--impl float64,float32 --C 32", {"--C 32 has no effect without a chunked implementation (float64-chunk, "
                                         "float32-chunk, twin-bf16, cuda-bf16)"}},
      {"--state-precision x", {"--state-precision: 'x' is not accepted; accepted: fp32, bf16\n"}},
      // was "give integers >= 1" without the cap
      {"--C 10000000000000", {"--C: 10000000000000 is not accepted; give integers in [1, 1000000000000]"}},
      {"--T 0", {"--T: 0 is not accepted; give integers in [1, 1000000000000]"}},
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

// The CLI rules on option values: each row a command line refused with exit 2, the words shown and no file. One place
// each, in experiments/cli.cpp unless said.
TEST_CASE("option values: whitespace, empty list items, options twice, booleans, messages, --prefix (exit 2, no file)",
          "[cli]") {
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
