// `kdalab decode-cost`: per-token decode cost vs context (EQUATIONS.md section 8; seed 002).
// Part (a), the analytic reads of seed 002, is here; (b) CPU-measured and (c) GPU-measured rows
// and the hybrid layouts join with the references and kernels (ISSUE 8).
#include <fmt/format.h>

#include <cmath>

#include "experiments/cli.hpp"
#include "reference/error.hpp"

namespace kdalab::cli {

namespace {
struct DecodeCostOptions {
  std::vector<double> n{1000, 128000, 1000000};
  std::vector<double> d{64, 128};
  double memory_gb = 100.0;
};
}  // namespace

void register_decode_cost(Registry& reg) {
  auto o = std::make_shared<DecodeCostOptions>();
  auto& c = reg.add("decode-cost",
                    "Per-token decode cost vs context n: (a) analytic numbers read per step per head, softmax "
                    "2 n d vs the KDA state d^2 (seed 002's table reproduced exactly), (b) measured on the CPU "
                    "reference at small n, (c) measured with the CUDA kernels up to 1M tokens when a GPU is "
                    "present, and the hybrid layouts' attention cost vs an all-MLA stack.",
                    "results/decode_cost.h5");
  c.app->add_option("--n", o->n, "context lengths n (tokens) for the analytic table")->delimiter(',')->capture_default_str();
  c.app->add_option("--d", o->d, "head dimensions d (d_k = d_v = d) for the analytic table")->delimiter(',')->capture_default_str();
  c.app->add_option("--memory-gb", o->memory_gb,
                    "memory budget (GB) for the largest batch whose caches and states fit (of the H200's 141 GB)")
      ->capture_default_str();
  c.run = [o](Context& ctx) {
    for (double n : o->n) require(n >= 1 && n == std::floor(n), fmt::format("--n: {} is not a positive integer", n));
    for (double d : o->d) require(d >= 1 && d == std::floor(d), fmt::format("--d: {} is not a positive integer", d));
    require(o->memory_gb > 0, fmt::format("--memory-gb: {} must be > 0", o->memory_gb));
    Table t;
    t.col("n", 'i', "1", "context length (tokens already cached)")
        .col("d", 'i', "1", "head dimension (d_k = d_v)")
        .col("softmax_reads", 'i', "1", "numbers a softmax head reads per decode step: 2 n d (keys and values)")
        .col("kda_reads", 'i', "1", "numbers a KDA head reads per decode step: the d x d state")
        .col("ratio", 'd', "1", "softmax_reads / kda_reads (exact)")
        .col("ratio_floor", 'i', "1", "floor of the ratio, as seed 002 prints it (integer division)");
    auto prog = ctx.progress("decode-cost", o->n.size() * o->d.size());
    fmt::print("{:>12}{:>6}{:>16}{:>12}{:>12}\n", "context n", "d", "softmax reads", "KDA reads", "speedup");
    for (double dd : o->d)
      for (double nn : o->n) {
        const auto n = static_cast<std::int64_t>(nn), d = static_cast<std::int64_t>(dd);
        const std::int64_t sm = 2 * n * d, kd = d * d;
        t.row({n, d, sm, kd, static_cast<double>(sm) / static_cast<double>(kd), sm / kd});
        fmt::print("{:>12}{:>6}{:>16}{:>12}{:>11}x\n", n, d, sm, kd, sm / kd);
        prog.tick();
      }
    prog.finish();
    auto f = ctx.open_results();
    f->group("decode_cost", "per-token decode cost vs context (EQUATIONS.md section 8)");
    f->write_table("decode_cost/analytic", t);
    f->attr("decode_cost/analytic", "description",
            "analytic numbers read per decode step per head (seed 002): softmax 2 n d vs KDA d^2");
    f->commit();
    fmt::print("wrote {}\n", ctx.common.out);
    return 0;
  };
}

}  // namespace kdalab::cli
