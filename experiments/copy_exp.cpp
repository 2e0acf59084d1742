// `kdalab copy`: copy a length-L string over an alphabet D through each memory (Repeat After Me,
// Jelassi et al. 2024; docs/equations.md, associative-memory facts).
//
// Mechanistic, no training: token i of the string is written with key = position embedding p_i
// (random unit or orthogonal rows of width d_k) and value = symbol embedding (random unit rows of
// width d_v = d_k); after the L writes the memory is read at p_0 .. p_{L-1} in order and each read
// is decoded to the nearest symbol. A string is copied when every symbol is right. The information
// bound: a state of b bits cannot copy strings with L log2|D| > b (b = numbers held x bits per
// number; the softmax cache grows with L, so its b does too). Recurrent memories run in fp64, fp32
// or bf16 (state rounded to bf16 after every step); softmax and MLA run in fp64. Each (d_k, L) cell draws from its
// own generator (numerics/random.hpp cell_seed): its numbers are the same in any grid.
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <tuple>

#include "experiments/cli.hpp"
#include "experiments/memory_task.hpp"
#include "numerics/random.hpp"
#include "reference/error.hpp"

namespace kdalab::cli {

namespace {
using namespace kdalab::exp;

struct CopyOptions {
  std::vector<std::string> memories{"softmax", "mla", "linear", "gla", "deltanet", "gated_deltanet", "kda"};
  std::vector<std::string> precision{"fp64", "fp32", "bf16"};
  std::vector<double> d_k{16, 32, 64, 128};
  std::vector<double> L{4, 8, 16, 32, 64, 128, 256, 512};
  double alphabet = 16;
  double trials = 16;
  std::string keys = "orthogonal";
  double beta = 1.0;
  double g_min = -5.0;
  double dc_ratio = 1.0;
  double softmax_scale = 100.0;
  double decay_bias_lo = -8.0, decay_bias_hi = -2.0;
  std::vector<Memory> mems;        ///< --memories parsed (by the command's check)
  std::vector<Precision> precs;    ///< --precision parsed (by the command's check)
};
}  // namespace

/// --quick's defaults (copy's check() and its --help).
const std::vector<double> kQuickDk = {16, 32, 64};
const std::vector<double> kQuickL = {4, 8, 16, 32, 64, 128, 256};
constexpr double kQuickTrials = 8;

void register_copy(Registry& reg) {
  auto o = std::make_shared<CopyOptions>();
  auto& c = reg.add("copy",
                    "Copy a length-L string over an alphabet |D| through each memory (no training): write "
                    "(position key, symbol value) pairs, read every position back, decode to the nearest symbol; "
                    "exact-copy accuracy vs L, state size and precision, with the information bound "
                    "(state bits vs L log2|D|).",
                    "results/copy.h5");
  add_shard_option(c);
  auto* a = c.app;
  std::map<std::string, CLI::Option*> opt;
  opt["memories"] = a->add_option("--memories", o->memories, "memories to test")->delimiter(',')->capture_default_str();
  opt["precision"] = a->add_option("--precision", o->precision, "precisions of the recurrent memories: fp64, fp32, bf16")->delimiter(',')->capture_default_str();
  opt["d-k"] = a->add_option("--d-k", o->d_k, "state sizes: key dimensions d_k (d_v = d_k)")->delimiter(',')->type_name(kInt)->capture_default_str();
  opt["L"] = a->add_option("--L", o->L, "string lengths L")->delimiter(',')->type_name(kInt)->capture_default_str();
  opt["trials"] = a->add_option("--trials", o->trials, "strings per point")->type_name(kInt)->capture_default_str();
  a->add_option("--alphabet", o->alphabet, "alphabet size |D| (>= 2)")->type_name(kInt)->capture_default_str();
  a->add_option("--keys", o->keys, "position keys: random or orthogonal (orthonormal in blocks of d_k)")->capture_default_str();
  a->add_option("--beta", o->beta, "write strength of the delta memories, in (0, 1]")->capture_default_str();
  a->add_option("--g-min", o->g_min, "gate lower bound of GLA, Gated DeltaNet, KDA (< 0)")->capture_default_str();
  a->add_option("--dc-ratio", o->dc_ratio, "MLA latent width d_c as a multiple of d_k + d_v")->capture_default_str();
  a->add_option("--softmax-scale", o->softmax_scale, "inverse temperature of the softmax and MLA reads (> 0)")->capture_default_str();
  a->add_option("--decay-bias-lo", o->decay_bias_lo, "per-channel gate bias b ~ U(lo, hi): g = g_min Sigmoid(z + b)")->capture_default_str();
  a->add_option("--decay-bias-hi", o->decay_bias_hi, "upper end of the gate bias range")->capture_default_str();
  describe_quick(c, fmt::format("--d-k {}, --L {}, --trials {}", fmt::join(kQuickDk, ","), fmt::join(kQuickL, ","), kQuickTrials));
  // cli::run's order: the options (here, with --quick's defaults applied first), then --out
  c.check = [o, opt](Context& ctx) {
    if (ctx.common.quick) {
      if (!opt.at("d-k")->count()) o->d_k = kQuickDk;
      if (!opt.at("L")->count()) o->L = kQuickL;
      if (!opt.at("trials")->count()) o->trials = kQuickTrials;
    }
    o->mems.clear();
    for (const auto& m : o->memories) o->mems.push_back(parse_memory(m, "--memories"));
    o->precs.clear();
    for (const auto& p : o->precision) o->precs.push_back(parse_precision(p, "--precision"));
    for (double d : o->d_k) require(d >= 1 && d <= 4096 && d == std::floor(d), fmt::format("--d-k: {} is not an integer in [1, 4096]", d));
    for (double l : o->L) require(l >= 1 && l <= 16384 && l == std::floor(l), fmt::format("--L: {} is not an integer in [1, 16384] (softmax copy costs L^2 d)", l));
    require(o->alphabet >= 2 && o->alphabet <= 1e6 && o->alphabet == std::floor(o->alphabet),
            fmt::format("--alphabet: {} is not an integer in [2, 1e6]", o->alphabet));
    require(o->trials >= 1 && o->trials <= 1e5 && o->trials == std::floor(o->trials), fmt::format("--trials: {} is not an integer in [1, 1e5]", o->trials));
    require(o->keys == "random" || o->keys == "orthogonal", "--keys: '" + o->keys + "' is unknown; accepted: random, orthogonal");
    require(o->beta > 0 && o->beta <= 1, fmt::format("--beta: {} must be in (0, 1]", o->beta));
    require(o->g_min < 0 && std::isfinite(o->g_min), fmt::format("--g-min: {} must be a finite negative number", o->g_min));
    require(o->dc_ratio > 0 && o->dc_ratio <= 4, fmt::format("--dc-ratio: {} must be in (0, 4]", o->dc_ratio));
    require(o->softmax_scale > 0 && o->softmax_scale <= 1e6, fmt::format("--softmax-scale: {} must be in (0, 1e6]", o->softmax_scale));
    require(std::fabs(o->decay_bias_lo) <= 100 && std::fabs(o->decay_bias_hi) <= 100 && o->decay_bias_lo <= o->decay_bias_hi,
            fmt::format("--decay-bias-lo {} / --decay-bias-hi {}: each must be in [-100, 100] and lo <= hi", o->decay_bias_lo, o->decay_bias_hi));
  };
  c.run = [o](Context& ctx) {
    const std::vector<Memory>& mems = o->mems;
    const std::vector<Precision>& precs = o->precs;
    Table t;
    t.col("memory", 's', "1", "memory: softmax, mla, linear, gla, deltanet, gated_deltanet, kda")
        .col("precision", 's', "1", "precision of the memory's state and arithmetic (fp64 for softmax/MLA)")
        .col("d_k", 'i', "1", "key dimension (d_v = d_k)")
        .col("L", 'i', "1", "string length")
        .col("alphabet", 'i', "1", "alphabet size |D|")
        .col("token_accuracy", 'd', "1", "fraction of symbols read back correctly")
        .col("copy_accuracy", 'd', "1", "fraction of strings copied exactly")
        .col("rel_err", 'd', "1", "sqrt(sum ||o - v||^2 / sum ||v||^2) over all reads")
        .col("strings", 'i', "1", "strings copied (trials)")
        .col("state_numbers", 'i', "1", "numbers the memory holds after the writes")
        .col("state_bits", 'd', "1", "state_numbers x bits per number")
        .col("info_bits", 'd', "1", "L log2 |D|: bits a copy must carry")
        .col("bound_allows", 'i', "1", "1 if info_bits <= state_bits (the information bound allows an exact copy)");

    const auto Dn = static_cast<Eigen::Index>(o->alphabet);
    const auto trials = static_cast<int>(o->trials);
    // --shard: a grid point is one (d_k, L) cell; its cost is the recurrent memories' 2L d_k^2 plus softmax's L^2 d_k
    std::vector<double> cost;
    for (double dd : o->d_k)
      for (double ll : o->L) cost.push_back(2 * ll * dd * dd + ll * ll * dd);
    const ShardPlan plan(ctx.shard, cost, "2 L d_k^2 + L^2 d_k per (d_k, L) cell");
    std::vector<std::int64_t> row_keys;
    std::size_t point = 0, runs = 0;
    for (std::size_t p = 0; p < cost.size(); ++p) runs += plan.runs(p) ? 1 : 0;
    auto prog = ctx.progress("copy", runs * static_cast<std::size_t>(trials));
    for (double dd : o->d_k)
      for (double ll : o->L) {
        const std::size_t this_point = point++;
        if (!plan.runs(this_point)) continue;
        const auto d = static_cast<Eigen::Index>(dd);
        const auto Ls = static_cast<Eigen::Index>(ll);
        std::map<std::tuple<int, int>, std::array<double, 5>> acc;  // tok, exact, err2, ref2, numbers
        Rng rng(cell_seed(ctx.common.seed, fmt::format("copy d_k={} L={}", d, Ls)));  // the cell's own generator
        for (int tr = 0; tr < trials; ++tr) {
          const Mat<double> P = o->keys == "random" ? random_unit_rows(rng, Ls, d) : orthogonal_rows(rng, Ls, d);
          const Mat<double> E = random_unit_rows(rng, Dn, d);
          std::vector<Eigen::Index> sym(static_cast<std::size_t>(Ls));
          for (auto& x : sym) x = std::min<Eigen::Index>(Dn - 1, static_cast<Eigen::Index>(rng.uniform(0.0, 1.0) * static_cast<double>(Dn)));
          Sequence s;
          s.k = Mat<double>::Zero(2 * Ls, d);
          s.v = Mat<double>::Zero(2 * Ls, d);
          s.q = Mat<double>::Zero(2 * Ls, d);
          s.write.assign(static_cast<std::size_t>(2 * Ls), false);
          s.read.assign(static_cast<std::size_t>(2 * Ls), false);
          Mat<double> target(Ls, d);
          for (Eigen::Index i = 0; i < Ls; ++i) {
            s.k.row(i) = P.row(i);
            s.v.row(i) = E.row(sym[static_cast<std::size_t>(i)]);
            s.write[static_cast<std::size_t>(i)] = true;
            s.q.row(Ls + i) = P.row(i);
            s.read[static_cast<std::size_t>(Ls + i)] = true;
            target.row(i) = E.row(sym[static_cast<std::size_t>(i)]);
          }
          Vec<double> bias(d);
          for (Eigen::Index i = 0; i < d; ++i) bias(i) = rng.uniform(o->decay_bias_lo, o->decay_bias_hi);
          Mat<double> g(2 * Ls, d);
          for (Eigen::Index tt = 0; tt < 2 * Ls; ++tt)
            for (Eigen::Index i = 0; i < d; ++i) g(tt, i) = o->g_min * sigmoid<double>(rng.normal() + bias(i));
          const auto dc = std::max<Eigen::Index>(1, std::lround(o->dc_ratio * 2.0 * dd));
          Mat<double> Gm(dc, 2 * d);
          for (Eigen::Index i = 0; i < dc; ++i)
            for (Eigen::Index j = 0; j < 2 * d; ++j) Gm(i, j) = rng.normal();
          const auto codec = LatentCodec<double>::from_gaussian(Gm, d, d);
          for (Memory m : mems) {
            if (!uses_decay(m)) s.g = Mat<double>::Zero(2 * Ls, d);
            else {
              s.g = g;
              if (m == Memory::gated_deltanet)
                for (Eigen::Index tt = 0; tt < 2 * Ls; ++tt) s.g.row(tt).setConstant(s.g.row(tt).mean());
            }
            const std::vector<Precision> ps = is_recurrent(m) ? precs : std::vector<Precision>{Precision::fp64};
            for (Precision p : ps) {
              const Mat<double> out = run_memory(m, s, uses_beta(m) ? o->beta : 1.0, 1.0, o->softmax_scale,
                                                 m == Memory::mla ? &codec : nullptr, p);
              const auto pred = nearest_rows(out, E);
              double ok = 0;
              for (std::size_t i = 0; i < pred.size(); ++i) ok += pred[i] == sym[i] ? 1 : 0;
              auto& a = acc[{static_cast<int>(m), static_cast<int>(p)}];
              a[0] += ok / static_cast<double>(Ls);
              a[1] += ok == static_cast<double>(Ls) ? 1 : 0;
              a[2] += (out - target).squaredNorm();
              a[3] += target.squaredNorm();
              a[4] = m == Memory::softmax ? static_cast<double>(Ls * 2 * d)
                     : m == Memory::mla   ? static_cast<double>(Ls * dc)
                                          : static_cast<double>(d * d);
            }
          }
          prog.tick();
        }
        const double info = static_cast<double>(Ls) * std::log2(static_cast<double>(Dn));
        for (const auto& [key, a] : acc) {
          const auto p = static_cast<Precision>(std::get<1>(key));
          const double bits = a[4] * precision_bits(p);
          const std::string pname = p == Precision::fp64 ? "fp64" : p == Precision::fp32 ? "fp32" : "bf16";
          t.row({memory_name(static_cast<Memory>(std::get<0>(key))), pname, static_cast<std::int64_t>(d),
                 static_cast<std::int64_t>(Ls), static_cast<std::int64_t>(Dn), a[0] / trials, a[1] / trials,
                 std::sqrt(a[2] / a[3]), static_cast<std::int64_t>(trials), static_cast<std::int64_t>(a[4]), bits, info,
                 static_cast<std::int64_t>(info <= bits ? 1 : 0)});
          row_keys.push_back(static_cast<std::int64_t>(this_point));
        }
      }
    prog.finish();
    auto f = ctx.open_results();
    f->group("copy", "copying a length-L string through each memory without training (Repeat After Me); the "
                     "information bound is state bits vs L log2|D|");
    f->write_table("copy/accuracy", t);
    plan.record(*f, "copy");
    plan.mark_rows(*f, "copy/accuracy", row_keys);
    f->attr("copy/accuracy", "description", "one row per (memory, precision, d_k, L): copy accuracy and the bound");
    f->attr("copy", "options",
            nlohmann::json{{"memories", o->memories}, {"precision", o->precision}, {"d-k", o->d_k}, {"L", o->L},
                           {"alphabet", o->alphabet}, {"trials", o->trials}, {"keys", o->keys}, {"beta", o->beta},
                           {"g-min", o->g_min}, {"dc-ratio", o->dc_ratio}, {"softmax-scale", o->softmax_scale},
                           {"decay-bias-lo", o->decay_bias_lo}, {"decay-bias-hi", o->decay_bias_hi}}
                .dump());
    f->attr("copy", "alphabet", o->alphabet);
    f->attr("copy", "softmax_scale", o->softmax_scale);
    f->attr("copy", "beta", o->beta);
    f->attr("copy", "g_min", o->g_min);
    f->attr("copy", "keys", o->keys);
    f->commit();
    // Key numbers: the longest L each memory copies exactly in >= 90% of strings, per d_k and precision.
    std::map<std::tuple<std::string, std::string, std::int64_t>, std::int64_t> best;
    const auto& mc = std::get<std::vector<std::string>>(t.column("memory").data);
    const auto& pc = std::get<std::vector<std::string>>(t.column("precision").data);
    const auto& dcol = std::get<std::vector<std::int64_t>>(t.column("d_k").data);
    const auto& lcol = std::get<std::vector<std::int64_t>>(t.column("L").data);
    const auto& ca = std::get<std::vector<double>>(t.column("copy_accuracy").data);
    for (std::size_t i = 0; i < t.rows(); ++i) {
      auto& b = best[{mc[i], pc[i], dcol[i]}];
      if (ca[i] >= 0.9 && lcol[i] > b) b = lcol[i];
    }
    for (const auto& [key, l] : best)
      fmt::print("{:>15} {:>5} d_k={:<4} longest L copied exactly in >= 90% of strings: {}\n", std::get<0>(key),
                 std::get<1>(key), std::get<2>(key), l);
    fmt::print("wrote {}\n", ctx.common.out);
    return 0;
  };
}

}  // namespace kdalab::cli
