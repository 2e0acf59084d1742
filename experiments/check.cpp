// `kdalab check`: check another kernel's tensors against the truth, recomputed on exactly the file's inputs.
//
//   kdalab check --op kda|kda-decode|mla|attn-res|kda-bwd|mla-bwd|attn-res-bwd --in FILE.h5 [--truth auto|mp|f64]
//                [--precision P] [--tol X] [--kernel] --out report.h5
//
// The input and report file formats, the truth rule, the budget rule and the exit codes are described once, in
// docs/check-format.md. This file is the subcommand: its options, the names of the file's datasets, the budget and
// verdict of every candidate and the report; the operations themselves are experiments/check_ops.cpp.
#include <H5Cpp.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "experiments/check_ops.hpp"
#include "experiments/cli.hpp"
#include "numerics/budget.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/error.hpp"

namespace kdalab::cli {

using namespace check_detail;

namespace {
/// Whether every truth value is exactly zero (the relative error of a candidate is then undefined).
bool zero_truth(const Tensor<double>& t) {
  return std::all_of(t.data.begin(), t.data.end(), [](double x) { return x == 0.0; });
}
}  // namespace

void register_check(Registry& reg) {
  auto& c = reg.add("check",
                    "Check your own kernel's tensors: read the inputs and your candidate outputs from an HDF5 file "
                    "(format: docs/check-format.md), compute the truth on exactly those inputs and report relative RMS, max abs, "
                    "max bf16 ULP and NaN/Inf counts per candidate, with a budget fixed from the inputs and the declared precision (F x (error of the plain algorithm "
                    "at that precision + output rounding)) and a verdict per candidate (exit 0 "
                    "pass, 1 fail, 2 bad input, 3 --kernel without the CUDA kernels or a GPU, 4 nothing was checked). Ops: kda (q, k, v, g or gate logits, beta, S0 -> o, S), kda-decode, "
                    "mla (absorbed query q~, latent cache c -> attended latent o), attn-res (sources v, pseudo-query "
                    "w -> h), and their gradients kda-bwd, mla-bwd, attn-res-bwd (upstream do -> dq, dk, ...). Without a candidate the truth is written to --out.",
                    "results/check.h5");
  // cli::run's order: c.check (the options, then --in), --out not the --in file (c.inputs), then --out itself: a missing
  // --in is named before a bad --out
  c.inputs = {"in"};
  struct Opts {
    std::string op = "kda", in, truth = "auto", precision;
    double tol = tol::check_default.value;
    CLI::Option* tol_opt = nullptr;
    bool kernel = false;
  };
  auto o = std::make_shared<Opts>();
  // the common options, described as they apply to check (the generic texts would promise what check does not do)
  c.app->get_option("--out")->description("HDF5 report to write: group /check with the truth tensors, the table "
                                          "/check/report (one row per candidate) and the verdict; written atomically, "
                                          "also on FAIL; an existing file only with --force; not the --in file");
  c.app->get_option("--seed")->description("no effect for check (nothing random: the truth is computed on the file's "
                                           "inputs); recorded in the report");
  c.app->get_option("--quick")->description("no effect for check (the truth is always computed in full; --truth f64 "
                                            "is the fast one)");
  c.app->get_option("--quiet")->description("no effect for check (it prints no progress lines)");
  c.app->add_option("--op", o->op,
                    "operation: kda (prefill from S0 or zero), kda-decode (T one-token steps from S0), mla (absorbed "
                    "attention over a latent cache), attn-res (Attention Residuals over depth), or the gradients of "
                    "kda, mla and attn-res: kda-bwd, mla-bwd, attn-res-bwd (the upstream do in the file)")
      ->capture_default_str();
  c.app->add_option("--in", o->in, "input HDF5 file with the inputs and your candidates (format in docs/check-format.md); required");
  c.app->add_option("--truth", o->truth, "truth: mp (cpp_bin_float_50, slow: ~20 s at the auto limit), f64 (float64), auto (mp while the work "
                                         "(kda: B*T*HV*d_k*d_v; mla: B*T*H*N*(d_c + d_rope); attn-res: 100*N*T*d) <= 2e7, f64 above)")
      ->capture_default_str();
  o->tol_opt = c.app->add_option("--tol", o->tol, "a constant verdict tolerance on relative RMS, > 0, that overrides the "
                                                  "budget rule (the report says so): a candidate passes when its "
                                                  "relative RMS <= tol and it has no NaN/Inf. Default: not given; the budget rule "
                                                  "(docs/check-format.md) judges every candidate");
  c.app->add_option("--precision", o->precision,
                    "declared precision of the candidate kernel: bf16, fp16, fp32 or fp64; the budget is the error of the "
                    "plain algorithm at it. Default: the file's root attribute precision, else the lowest-precision format "
                    "among the candidates");
  c.app->add_flag("--kernel", o->kernel,
                  "--op kda: also run kdalab's CUDA prefill kernel on exactly the file's inputs and report its o and S "
                  "as candidates o_kdalab, S_kdalab beside the file's (e.g. a peer's): both against one truth. Needs a "
                  "CUDA build and a GPU (without either: exit 3, after the input is checked), gate = \"k3\", beta = \"logits\", l2norm_qk = 1, d_k = d_v in {64, 128, 256}, "
                  "HV = H, and inputs that are bf16 (q, k, v, g, beta) / fp32 (A_log, bias, S0) numbers. Default: off");
  c.check = [o](Context& ctx) {
    require(o->op == "kda" || o->op == "kda-decode" || o->op == "mla" || o->op == "attn-res" || o->op == "kda-bwd" ||
                o->op == "mla-bwd" || o->op == "attn-res-bwd",
            "--op '" + o->op + "' is unknown; accepted: kda, kda-decode, mla, attn-res, kda-bwd, mla-bwd, attn-res-bwd");
    require(o->precision.empty() || o->precision == "bf16" || o->precision == "fp16" || o->precision == "fp32" ||
                o->precision == "fp64",
            "--precision '" + o->precision + "' is unknown; accepted: bf16, fp16, fp32, fp64");
    require(!o->kernel || o->op == "kda", "--kernel runs kdalab's KDA prefill kernel: it needs --op kda, not --op " + o->op);
    require(o->truth == "auto" || o->truth == "mp" || o->truth == "f64",
            "--truth '" + o->truth + "' is unknown; accepted: auto, mp, f64");
    require(std::isfinite(o->tol) && o->tol > 0, fmt::format("--tol {} is not accepted; give a number > 0", o->tol));
    // --tol replaces the budget rule, whose only input --precision is: both given, one would be ignored silently
    require(o->tol_opt->count() == 0 || o->precision.empty(),
            "--precision " + o->precision + " sets the budget rule's precision and --tol replaces that rule; give "
            "one of them, not both");
    // --in before --out: without an input there is nothing to report (run outside the repository, a missing --in
    // would otherwise be reported as "--out 'results/check.h5': folder 'results' does not exist"). InFile refuses an
    // empty --in and opens it as HDF5, so a directory or a text file given as --in is named before a bad --out.
    check_input_files(ctx, "in");  // a FIFO --in would block the open forever (cli::check_input_files)
    InFile probe(o->in);
    // the root attribute precision is validated in every run: also without a candidate or with --tol, where the budget
    // rule does not read it (a misspelt value would otherwise pass unnoticed until a candidate is added)
    if (const auto p = probe.attr_str("/", "precision"))
      require(*p == "bf16" || *p == "fp16" || *p == "fp32" || *p == "fp64",
              probe.where() + ": root attribute precision = '" + *p + "' is unknown; accepted: bf16, fp16, fp32, fp64");
  };
  c.run = [o](Context& ctx) -> int {
    Outcome res;
    Judge judge;
    judge.precision = o->precision;
    judge.tol_override = o->tol_opt->count() > 0;
    // a dataset no name of the op matches is named on stderr; with no candidate at all, nothing was checked (exit 4)
    const OpNames names = op_names(o->op);
    std::vector<std::string> unknown;
    for (const auto& n : InFile(o->in).root_names())
      if (!names.known.count(n)) unknown.push_back(n);
    std::string accepted;
    for (const auto& n : names.known) accepted += (accepted.empty() ? "" : ", ") + n;
    for (const auto& n : unknown)
      fmt::print(stderr, "kdalab check: dataset '{}' matches no name of --op {} and is not checked; accepted: {}\n", n,
                 o->op, accepted);
    // a candidate of the forward / backward sibling (which may share the file) is not checked by this --op: say so,
    // or a file of forward outputs run with --op kda-bwd would read "no candidate" with exit 0 and nothing said
    const bool bwd = o->op.size() > 4 && o->op.substr(o->op.size() - 4) == "-bwd";
    const std::string sibling = bwd ? o->op.substr(0, o->op.size() - 4) : (o->op == "kda-decode" ? "kda" : o->op) + "-bwd";
    for (const auto& n : InFile(o->in).root_names())
      if (op_names(sibling).candidates.count(n) && !names.candidates.count(n))
        fmt::print(stderr, "kdalab check: dataset '{}' is a candidate of --op {}, not of --op {}, and is not checked\n",
                   n, sibling, o->op);
    judge.before_truth = [&](std::size_t n_cands) {
      if (n_cands == 0 && !unknown.empty()) {
        std::string cands;
        for (const auto& n : names.candidates) cands += (cands.empty() ? "" : ", ") + n;
        throw NothingChecked("check: nothing was checked: the file has no candidate of --op " + o->op + " (" + cands +
                             ") but " + std::to_string(unknown.size()) + " dataset(s) matching no known name (first: '" +
                             unknown.front() + "'); nothing was written");
      }
    };
    try {
      res = o->op == "mla"            ? check_mla(o->in, o->truth, judge)
            : o->op == "attn-res"     ? check_attn_res(o->in, o->truth, judge)
            : o->op == "kda-bwd"      ? check_kda_bwd(o->in, o->truth, judge)
            : o->op == "mla-bwd"      ? check_mla_bwd(o->in, o->truth, judge)
            : o->op == "attn-res-bwd" ? check_attn_res_bwd(o->in, o->truth, judge)
                                      : check_kda(o->in, o->op, o->truth, o->kernel, judge);
    } catch (const NothingChecked& e) {
      fmt::print(stderr, "kdalab {} (exit {})\n", e.what(), kExitNothingChecked);
      return kExitNothingChecked;
    } catch (const H5::Exception& e) {  // anything HDF5 refuses to read is a malformed input: exit 2
      throw Error("--in '" + o->in + "': HDF5 cannot read it (" + e.getDetailMsg() + ")");
    } catch (const NotAvailable& e) {  // --kernel in a CPU build or without a GPU: exit 3, nothing written
      fmt::print(stderr, "kdalab {} (exit {})\n", e.what(), kExitNotAvailable);
      return kExitNotAvailable;
    }

    Table rep;
    rep.col("tensor", 's', "1", "candidate tensor").col("format", 's', "1", "its declared format")
        .col("rel_rms", 'd', "1", "||x - x_truth||_2 / ||x_truth||_2").col("max_abs", 'd', "1", "max |x - x_truth|")
        .col("max_ulp_bf16", 'i', "1", "max bf16-ulp distance").col("nan", 'i', "1", "NaN count")
        .col("inf", 'i', "1", "Inf count").col("n", 'i', "1", "elements")
        .col("tol", 'd', "1", "the threshold applied: the budget, or --tol when given")
        .col("pass", 'i', "1", "1 if rel_rms <= tol and no NaN/Inf")
        .col("precision", 's', "1", "declared precision of the budget (--tol: none)")
        .col("emulation_rel_rms", 'd', "1", "relRMS of the plain algorithm at the declared precision (--tol: NaN)")
        .col("output_rounding", 'd', "1", "relRMS of the truth rounded to the candidate's format (--tol: NaN)")
        .col("budget", 'd', "1", "max(F (emulation_rel_rms + output_rounding), floor), or --tol")
        .col("ratio", 'd', "1", "rel_rms / budget").col("verdict", 's', "1", "the candidate's verdict");
    bool all = true;
    std::string verdict;
    const std::string threshold =
        judge.tol_override ? fmt::format("--tol {:g} (an explicit constant; the budget rule is not used)", o->tol)
                           : fmt::format("budget rule: F = {:g} x (emulation at {} + output rounding), floor {:g}; "
                                         "precision from {}",
                                         tol::budget_factor.value, format_name(judge.p), tol::budget_floor.value,
                                         judge.p_from);
    // every budget before any line is printed: a budget that cannot be formed is bad input (one line, exit 2)
    std::vector<Budget> budgets;
    for (const auto& cand : res.cands) {
      Budget b{NAN, NAN, o->tol};
      if (!judge.tol_override) {
        b = budget_of(cand.emulation.data, cand.truth.data, parse_format(cand.format, "format of '" + cand.name + "'"));
        // an overflow in the emulation at p or in the truth stored in the candidate's format gives an infinite
        // budget, which every finite candidate (even all zeros) would pass: no verdict can be formed, bad input
        require(std::isfinite(b.value),
                "the budget of '" + cand.name + "' is not finite: " +
                    (std::isfinite(b.output_rounding)
                         ? "the plain algorithm at precision " + format_name(judge.p) + " (from " + judge.p_from +
                               ") overflows on the file's inputs; give a --precision whose range holds them (fp32, "
                               "fp64) or a constant --tol X"
                         : "its truth overflows the candidate's format " + cand.format +
                               "; store '" + cand.name + "' as float32 (or give a constant --tol X)") +
                    "; nothing was written");
        // an emulation term >= 1 admits an all-zero candidate (relative RMS 1): the plain algorithm at p does not
        // compute this tensor on these inputs (e.g. fp32 squares of |v| ~ 1e30 overflow inside it), so no verdict can
        // be formed. (The rounding term alone may reach 1 honestly: a truth below the smallest value of the
        // candidate's format is stored as zeros.)
        require(zero_truth(cand.truth) || tol::budget_factor.value * b.emulation < 1,
                fmt::format("the budget of '{}' is {:.3g} >= 1: the plain algorithm at precision {} (from {}) is off by "
                            "{:.0f}% on the file's inputs, so even an all-zero candidate would be within it; give a "
                            "wider --precision (fp32, fp64) or a constant --tol X; nothing was written",
                            cand.name, b.value, format_name(judge.p), judge.p_from, 100 * b.emulation));
        // an all-zero truth (e.g. do = 0, or dw with one source) has no relative error: compare() then measures the
        // absolute ||x||_2 and the emulation's absolute error is the budget, without the relative floor 1e-12 (an
        // absolute 1e-12 would pass a wrong candidate of small magnitude; an exact zero stays within)
        if (zero_truth(cand.truth)) b.value = tol::budget_factor.value * (b.emulation + b.output_rounding);
      }
      budgets.push_back(b);
    }
    std::size_t ci = 0;
    if (!res.cands.empty()) fmt::print("threshold: {}\n", threshold);
    for (const auto& cand : res.cands) {
      ErrorMetrics m = compare(cand.x.data, cand.truth.data, cand.name);
      // --tol is relative: against an all-zero truth any nonzero candidate is infinitely far (compare() would give
      // the absolute ||x||_2, which a relative --tol must not judge)
      if (judge.tol_override && zero_truth(cand.truth) && m.rel_rms > 0) m.rel_rms = INFINITY;
      const Budget& b = budgets[ci++];
      const bool ok = within(m, b.value);
      const double ratio = m.rel_rms == 0 ? 0.0 : m.rel_rms / b.value;  // 0 / 0: an exact zero against a zero budget
      std::string v = verdict_text(m, b.value);
      if (judge.tol_override && m.nan_count + m.inf_count == 0)
        v = ok ? "within --tol" : fmt::format("over --tol by x{:.3g}", m.rel_rms / b.value);
      all = all && ok;
      rep.row({cand.name, cand.format, m.rel_rms, m.max_abs, m.max_ulp_bf16, m.nan_count, m.inf_count,
               static_cast<std::int64_t>(m.n), b.value, static_cast<std::int64_t>(ok),
               judge.tol_override ? std::string("none") : format_name(judge.p), b.emulation, b.output_rounding, b.value,
               ratio, v});
      fmt::print("{:<8} rel RMS {:.3e}  max abs {:.3e}  max bf16 ulp {}  NaN {}  Inf {}  ({}, {} elements)  budget "
                 "{:.3e}  ratio {:.3g}  {}\n",
                 cand.name, m.rel_rms, m.max_abs, m.max_ulp_bf16, m.nan_count, m.inf_count, cand.format, m.n, b.value,
                 ratio, v);
      verdict += fmt::format("{}{} {:.3e} {} {:.1e}", verdict.empty() ? "" : "; ", cand.name, m.rel_rms,
                             ok ? "<=" : ">", b.value);
    }

    auto f = ctx.open_results();
    f->group("check", "kdalab check of " + o->in + " (--op " + o->op + ") against the " + res.truth_name + " truth");
    f->attr("check", "op", o->op);
    f->attr("check", "input", o->in);
    f->attr("check", "truth", res.truth_name);
    if (!res.cands.empty()) f->attr("check", "threshold", threshold);
    for (const auto& t : res.truths) f->write_array("check", t.name, t.t, "1", t.description, t.attrs);
    std::string line;
    if (res.cands.empty()) {
      line = "check: no candidate of --op " + o->op + " in the file; wrote the " + res.truth_name + " truth to " +
             ctx.common.out;
    } else {
      f->write_table("check/report", rep);
      line = fmt::format("check: {} ({}; truth {})", all ? "PASS" : "FAIL", verdict, res.truth_name);
    }
    f->attr("check", "verdict", line);
    f->commit();
    fmt::print("{}\n", line);
    return all ? 0 : 1;
  };
}

}  // namespace kdalab::cli

