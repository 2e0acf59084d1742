// `kdalab decay-range`: error of the chunked KDA algorithm vs the gate's lower bound g_min and the
// chunk size C, in bf16 / fp16 / fp32 (and fp64 as the control), with the overflow / underflow /
// subnormal counts of the factored tile form: the figure that shows why g_min = -5 and 16-token
// tiles go together (docs/equations.md, gates "Range facts"; Kimi Linear §3-4; K3 report Eq. 3-5).
//
// Inputs: the parity generator (numerics/kda_inputs.hpp, anchor-kda draws) with the gate logit
// shifted by --gate-shift so that decays sit near their bound (the worst case the bound allows):
// g = g_min Sigmoid(e^A (z + b + shift)) for the bounded K3 gate, g = -e^A Softplus(z + b + shift)
// for the unbounded Kimi Linear gate. Truth: the float64 recurrence (reference/kda.hpp).
// Rows (impl):
//   chunked      the chunk-C tiled algorithm of numerics/kda_twin.hpp with every product operand,
//                accumulation and stored intermediate in `precision` (fp64: the chunked
//                reference in double; fp32: in float), Gamma factored over the whole chunk C;
//   kernel-plan  the same twin with the CUDA kernel's plan (kda_plan_kernel()) at chunk C;
//   cuda         the CUDA prefill kernel (chunk 16) when built and a GPU is present, launched
//                with allow_unsafe_range where g_min < -5 or the gate is unbounded.
// Range counts (numerics/range.hpp tile_range) are for Gamma = e^c and K/Gamma = k e^-c (the value the
// algorithm stores; 1/Gamma alone is never formed) over tiles of C tokens, on these inputs' keys, stored in
// `precision` (cuda / kernel-plan rows: fp32, as the kernel stores them).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "experiments/build_info.hpp"
#include "experiments/cli.hpp"
#include "numerics/kda_inputs.hpp"
#include "numerics/kda_twin.hpp"
#include "numerics/metrics.hpp"
#include "numerics/range.hpp"
#include "reference/error.hpp"
#include "reference/kda.hpp"

#ifdef KDALAB_HAVE_CUDA
#include "experiments/gpu_exp.hpp"
#endif

namespace kdalab::cli {

namespace {
struct DecayRangeOptions {
  std::vector<double> g_min{-1, -3, -5, -5.46, -5.55, -6, -8};
  bool softplus = true;
  std::vector<double> C{16, 32, 64};
  std::vector<std::string> precision{"fp64", "fp32", "bf16", "fp16"};
  double T = 1024;
  double D = 128;
  double gate_shift = 20.0;
  bool kernel_plan = true;
  std::vector<Format> precs;  ///< --precision parsed (by the command's check)
};
}  // namespace

/// --quick's defaults (decay-range's check() and its --help).
constexpr double kQuickT = 128, kQuickD = 32;

void register_decay_range(Registry& reg) {
  auto o = std::make_shared<DecayRangeOptions>();
  auto& c = reg.add("decay-range",
                    "Error of the chunked KDA algorithm vs g_min (and the unbounded softplus gate) and chunk size C "
                    "in fp64/fp32/bf16/fp16, with overflow/underflow/subnormal counts of the factored tile form: why "
                    "g_min = -5 and 16-token tiles go together.",
                    "results/decay_range.h5");
  add_shard_option(c);
  auto* a = c.app;
  std::map<std::string, CLI::Option*> opt;
  opt["g-min"] = a->add_option("--g-min", o->g_min, "lower bounds g_min (< 0) of the bounded gate")->delimiter(',')->capture_default_str();
  a->add_option("--softplus", o->softplus, "also run the unbounded Kimi Linear softplus gate (true/false)")->capture_default_str();
  opt["C"] = a->add_option("--C", o->C, "chunk sizes C (tokens; factored over the whole chunk), 1..64")->delimiter(',')->type_name(kInt)->capture_default_str();
  opt["precision"] = a->add_option("--precision", o->precision, "formats of the chunked rows: fp64, fp32, bf16, fp16")->delimiter(',')->capture_default_str();
  opt["T"] = a->add_option("--T", o->T, "sequence length (tokens), an integer in [1, 1000000]; --quick without --T: 128")->type_name(kInt)->capture_default_str();
  opt["D"] = a->add_option("--D", o->D, "head dimension d_k = d_v; --quick without --D: 32")->type_name(kInt)->capture_default_str();
  a->add_option("--gate-shift", o->gate_shift, "added to the gate logit so decays sit near their bound (0 = anchor-kda)")->capture_default_str();
  a->add_option("--kernel-plan", o->kernel_plan, "also run the twin with the CUDA kernel's plan (true/false)")->capture_default_str();
  // cli::run's order: the options (here, with --quick's defaults applied first), then --out
  describe_quick(c, fmt::format("--T {}, --D {}", kQuickT, kQuickD));
  c.check = [o, opt](Context& ctx) {
    if (ctx.common.quick) {
      if (!opt.at("T")->count()) o->T = kQuickT;
      if (!opt.at("D")->count()) o->D = kQuickD;
    }
    for (double g : o->g_min) require(g < 0 && std::isfinite(g), fmt::format("--g-min: {} must be a finite negative number", g));
    for (double cc : o->C) require(cc >= 1 && cc <= 64 && cc == std::floor(cc), fmt::format("--C: {} is not an integer in [1, 64]", cc));
    o->precs.clear();
    for (const auto& p : o->precision) {
      const Format f = parse_format(p, "--precision");
      require(f != Format::tf32, "--precision: tf32 is an operand format only; accepted: fp64, fp32, bf16, fp16");
      o->precs.push_back(f);
    }
    require(o->T >= 1 && o->T <= 1e6 && o->T == std::floor(o->T), fmt::format("--T: {} is not accepted; give an integer in [1, 1000000]", o->T));
    require(o->D >= 1 && o->D <= 256 && o->D == std::floor(o->D), fmt::format("--D: {} is not an integer in [1, 256]", o->D));
    require(std::isfinite(o->gate_shift), "--gate-shift must be finite");
  };
  c.run = [o](Context& ctx) {
    const std::vector<Format>& precs = o->precs;

    struct Gate {
      GateKind kind;
      double g_min;
    };
    std::vector<Gate> gates;
    for (double g : o->g_min) gates.push_back({GateKind::bounded, g});
    if (o->softplus) gates.push_back({GateKind::softplus, std::numeric_limits<double>::quiet_NaN()});

    Table t;
    t.col("impl", 's', "1", "chunked (twin, every format = precision), kernel-plan (twin, CUDA plan), cuda (kernel)")
        .col("precision", 's', "1", "format of operands, accumulation and stored Gamma, K/Gamma (kernel rows: their plan)")
        .col("C", 'i', "1", "chunk size: tokens the cumulative decay is factored over")
        .col("gate", 's', "1", "bounded (K3, g >= g_min) or softplus (Kimi Linear, unbounded)")
        .col("g_min", 'd', "1", "lower bound of the bounded gate (NaN: softplus, unbounded)")
        .col("g_mean", 'd', "1", "mean per-token log-decay of the inputs")
        .col("g_lowest", 'd', "1", "most negative per-token log-decay of the inputs")
        .col("c_min", 'd', "1", "most negative cumulative log-decay over a C-token tile (log of the smallest Gamma)")
        .col("rel_rms", 'd', "1", "||o - o_truth|| / ||o_truth|| against the float64 recurrence (Inf if o has NaN/Inf)")
        .col("o_nan", 'i', "1", "NaN count of o")
        .col("o_inf", 'i', "1", "Inf count of o")
        .col("values", 'i', "1", "Gamma and K/Gamma values examined by the range analysis")
        .col("overflow", 'i', "1", "values that are not finite in the format: K/Gamma = k / Gamma, as the algorithm "
             "stores it (1/Gamma alone is never formed)")
        .col("underflow", 'i', "1", "values that round to 0 (Gamma)")
        .col("subnormal", 'i', "1", "values left subnormal (Gamma): precision lost")
        .col("allow_unsafe_range", 'i', "1", "cuda rows: 1 if launched with allow_unsafe_range, 0 if not; -1 not a kernel");

    const auto T = static_cast<std::size_t>(o->T), D = static_cast<std::size_t>(o->D);
    std::string gpu_note;
    bool gpu_ok = false;
#ifdef KDALAB_HAVE_CUDA
    gpu_ok = !build_info::gpu_devices().empty() && D == 128;
    gpu_note = build_info::gpu_devices().empty() ? "cuda rows skipped: " + build_info::gpu_note()
               : D != 128 ? "cuda rows skipped: the kernel supports D = 128 only (--D)"
                          : "cuda rows: bounded gate only (the kernel fuses the K3 gate; an unfused bf16 g would change the inputs)";
#else
    gpu_note = "cuda rows skipped: kdalab was built without the CUDA kernels";
#endif
    std::size_t total = gates.size() * o->C.size() * (precs.size() + (o->kernel_plan ? 1 : 0)) + (gpu_ok ? o->g_min.size() : 0);
    // --shard: a grid point is one gate (its inputs, truth and every C and precision on them); every gate costs the same,
    // T D^2 (the recurrence and the twin per C)
    const ShardPlan plan(ctx.shard, std::vector<double>(gates.size(), static_cast<double>(T * D * D)),
                         "T D^2 per gate (equal for every gate)");
    if (plan.active()) {
      std::size_t runs = 0, bounded = 0;
      for (std::size_t gi = 0; gi < gates.size(); ++gi) {
        runs += plan.runs(gi) ? 1 : 0;
        bounded += plan.runs(gi) && gates[gi].kind == GateKind::bounded ? 1 : 0;
      }
      total = runs * o->C.size() * (precs.size() + (o->kernel_plan ? 1 : 0)) + (gpu_ok ? bounded : 0);
    }
    std::vector<std::int64_t> row_keys;
    auto prog = ctx.progress("decay-range", total);
    for (std::size_t gate_index = 0; gate_index < gates.size(); ++gate_index) {
      const Gate& gate = gates[gate_index];
      if (!plan.runs(gate_index)) continue;
      KdaGenSpec spec;
      spec.B = 1;
      spec.T = T;
      spec.H = 1;
      spec.d_k = D;
      spec.d_v = D;
      spec.gate = gate.kind;
      spec.g_min = gate.kind == GateKind::bounded ? gate.g_min : -5.0;
      spec.seed = ctx.common.seed;
      KdaInputs in = kda_inputs(spec);
      // Decays near the bound: shift the gate logit, recompute g (numerics/range.hpp gate_log_decay).
      Mat<double> gm(static_cast<Eigen::Index>(T), static_cast<Eigen::Index>(D));
      Mat<double> km(static_cast<Eigen::Index>(T), static_cast<Eigen::Index>(D));  // the keys K/Gamma divides
      double gsum = 0, glow = 0;
      for (std::size_t tt = 0; tt < T; ++tt)
        for (std::size_t i = 0; i < D; ++i) {
          const double g = gate_log_decay(gate.kind, in.g_raw(0, tt, 0, i) + o->gate_shift, in.A_log(0), in.bias(0, i),
                                          spec.g_min);
          // a huge shift drives the unbounded gate to -inf: named as the option, not as the tensor g
          require(std::isfinite(g), fmt::format("--gate-shift: {} is not accepted: the {} gate's log-decay is {} at "
                                                "token {}; accepted: a shift that keeps every log-decay finite",
                                                o->gate_shift, gate_kind_name(gate.kind), g, tt));
          in.g(0, tt, 0, i) = g;
          gm(static_cast<Eigen::Index>(tt), static_cast<Eigen::Index>(i)) = g;
          km(static_cast<Eigen::Index>(tt), static_cast<Eigen::Index>(i)) = in.k(0, tt, 0, i);
          gsum += g;
          glow = std::min(glow, g);
        }
      const double gmean = gsum / static_cast<double>(T * D);
      const auto truth = kda_recurrent<double>(in.q, in.k, in.v, in.g, in.beta, &in.S0, in.scale);
      auto score = [&](const KdaOutput<double>& out, std::int64_t& nan, std::int64_t& inf) {
        const ErrorMetrics m = compare(out.o.data, truth.o.data);
        nan = static_cast<std::int64_t>(m.nan_count);
        inf = static_cast<std::int64_t>(m.inf_count);
        return m.rel_rms;
      };
      for (double cc : o->C) {
        const auto C = static_cast<std::size_t>(cc);
        auto add_row = [&](const std::string& impl, Format prec, Format range_fmt, const KdaOutput<double>& out,
                           std::int64_t allow, std::size_t Crow) {
          std::int64_t nan = 0, inf = 0;
          const double err = score(out, nan, inf);
          const RangeCounts rc = tile_range(gm, Crow, range_fmt, &km);
          t.row({impl, format_name(prec), static_cast<std::int64_t>(Crow), gate_kind_name(gate.kind), gate.g_min, gmean,
                 glow, rc.c_min, err, nan, inf, static_cast<std::int64_t>(rc.n), static_cast<std::int64_t>(rc.overflow),
                 static_cast<std::int64_t>(rc.underflow), static_cast<std::int64_t>(rc.subnormal), allow});
          row_keys.push_back(static_cast<std::int64_t>(gate_index));
        };
        for (Format f : precs) {
          KdaTwinPlan p;
          p.kk = p.qk = p.solve = p.ws = p.qs = p.pd = p.kd = p.accum = f;
          p.state = (f == Format::fp64) ? Format::fp64 : Format::fp32;
          if (f == Format::fp32) p.state = Format::fp32;
          p.out = Format::fp64;  // measure the algorithm, not the output rounding
          p.fuse_gate = false;   // the twin reads the shifted g directly
          p.chunk = C;
          add_row("chunked", f, f, kda_twin(in, p), -1, C);
          prog.tick();
        }
        if (o->kernel_plan) {
          KdaTwinPlan p = kda_plan_kernel();
          p.fuse_gate = false;
          p.chunk = C;
          add_row("kernel-plan", Format::bf16, Format::fp32, kda_twin(in, p), -1, C);
          prog.tick();
        }
      }
#ifdef KDALAB_HAVE_CUDA
      if (gpu_ok && gate.kind == GateKind::bounded) {  // the kernel fuses the bounded K3 gate only
        const bool unsafe = gate.g_min < -5.0;
        KdaOutput<double> out = gpu_exp::kda_prefill_on_gpu(in, o->gate_shift, unsafe);
        std::int64_t nan = 0, inf = 0;
        const double err = score(out, nan, inf);
        const RangeCounts rc = tile_range(gm, 16, Format::fp32, &km);
        t.row({std::string("cuda"), std::string("bf16"), std::int64_t{16}, gate_kind_name(gate.kind), gate.g_min, gmean,
               glow, rc.c_min, err, nan, inf, static_cast<std::int64_t>(rc.n), static_cast<std::int64_t>(rc.overflow),
               static_cast<std::int64_t>(rc.underflow), static_cast<std::int64_t>(rc.subnormal),
               std::int64_t{unsafe ? 1 : 0}});
        row_keys.push_back(static_cast<std::int64_t>(gate_index));
        prog.tick();
      }
#endif
    }
    prog.finish();
    if (!gpu_note.empty()) fmt::print("{}\n", gpu_note);

    auto f = ctx.open_results();
    f->group("decay_range", "error and dynamic range of the chunked KDA algorithm vs g_min and C (docs/equations.md, gates)");
    f->write_table("decay_range/table", t);
    plan.record(*f, "decay-range");
    plan.mark_rows(*f, "decay_range/table", row_keys);
    f->attr("decay_range/table", "description", "one row per (impl, precision, C, gate, g_min)");
    f->attr("decay_range", "options",
            nlohmann::json{{"g-min", o->g_min}, {"softplus", o->softplus}, {"C", o->C}, {"precision", o->precision},
                           {"T", o->T}, {"D", o->D}, {"gate-shift", o->gate_shift}, {"kernel-plan", o->kernel_plan}}
                .dump());
    f->attr("decay_range", "gate_shift", o->gate_shift);
    f->attr("decay_range", "T", o->T);
    f->attr("decay_range", "D", o->D);
    f->attr("decay_range", "gpu_note", gpu_note);
    f->attr("decay_range", "fp32_overflow_edge_C16", per_token_overflow_limit(16, Format::fp32));
    f->attr("decay_range", "fp32_normal_edge_C16", per_token_normal_limit(16, Format::fp32));
    f->attr("decay_range", "fp32_zero_edge_C16", per_token_zero_limit(16, Format::fp32));
    f->commit();

    // Key numbers: the chunked error per (C, g_min) in fp32 (the kernels' state and accumulation format) when fp32 ran;
    // otherwise one table per --precision that ran, in the order given (an --precision fp64 run printed an empty fp32
    // table). Every precision's cells are in the file and the figure either way.
    std::vector<Format> shown;
    if (std::find(precs.begin(), precs.end(), Format::fp32) != precs.end())
      shown.push_back(Format::fp32);
    else
      shown = precs;
    const auto& impl = std::get<std::vector<std::string>>(t.column("impl").data);
    const auto& prc = std::get<std::vector<std::string>>(t.column("precision").data);
    const auto& gk = std::get<std::vector<std::string>>(t.column("gate").data);
    const auto& gmc = std::get<std::vector<double>>(t.column("g_min").data);
    const auto& Cc = std::get<std::vector<std::int64_t>>(t.column("C").data);
    const auto& er = std::get<std::vector<double>>(t.column("rel_rms").data);
    const auto& on = std::get<std::vector<std::int64_t>>(t.column("o_nan").data);
    const auto& oi = std::get<std::vector<std::int64_t>>(t.column("o_inf").data);
    for (Format pf : shown) {
      const std::string pn = format_name(pf);
      fmt::print("chunked algorithm, {}, relative RMS of o (NaN/Inf count) vs g_min and C; decays near the bound "
                 "(--gate-shift {}{}):\n{:>10}", pn, o->gate_shift,
                 pf == shown.front() ? ": added to every gate logit so the decays sit near the bound" : "", "g_min");
      for (double cc : o->C) fmt::print("{:>22}", fmt::format("C = {}", cc));
      fmt::print("\n");
      for (const Gate& g : gates) {
        fmt::print("{:>10}", g.kind == GateKind::softplus ? std::string("softplus") : fmt::format("{}", g.g_min));
        for (double cc : o->C)
          for (std::size_t i = 0; i < t.rows(); ++i)
            if (impl[i] == "chunked" && prc[i] == pn && Cc[i] == static_cast<std::int64_t>(cc) &&
                gk[i] == gate_kind_name(g.kind) && (g.kind == GateKind::softplus || gmc[i] == g.g_min))
              fmt::print("{:>22}", fmt::format("{:.2e} ({})", er[i], on[i] + oi[i]));
        fmt::print("\n");
      }
    }
    fmt::print("wrote {}\n", ctx.common.out);
    return 0;
  };
}

}  // namespace kdalab::cli
