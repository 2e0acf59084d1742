// `kdalab recall`: multi-query associative recall without training (docs/equations.md, associative-memory facts;
// Zoology MQAR layout, Arora et al. 2023).
//
// Mechanistic capacity, not Zoology's trained-model curves: N key/value pairs (key tokens from
// [1, V/2), value tokens from [V/2, V) of a vocabulary of V) are embedded with random unit keys,
// orthogonal keys (orthonormal in blocks of d_k) or correlated keys (pairwise cosine ~ overlap),
// and unit random value embeddings; they are written one per token into each memory; a query
// region of span * N tokens follows, where each key is queried once at a power-law distance
// (P(gap) ~ gap^-a) with no writes in between (decays still apply). Each read is decoded to the
// nearest value embedding; accuracy = fraction decoded to the right value token; rel_err =
// sqrt(sum ||o - v||^2 / sum ||v||^2). All reads go through reference/ (kda.hpp, softmax.hpp,
// latent_memory.hpp) in float64. Each (keys, d_k, N) cell draws from its own generator, seeded from --seed and
// the cell (numerics/random.hpp cell_seed; MLA's latent projections from one per d_c), so its numbers are the same
// in any grid, with any --memories and --dc-ratio.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>
#include <vector>

#include "experiments/cli.hpp"
#include "experiments/memory_task.hpp"
#include "numerics/random.hpp"
#include "reference/error.hpp"

namespace kdalab::cli {

namespace {
using namespace kdalab::exp;

/// The stdout summary of recall: accuracy and relative error at N = d_k as two pivot tables, one row per memory
/// configuration (memory; beta where it uses one, g_min where it decays, MLA's d_c as its --dc-ratio), one column per
/// (key kind, d_k), in the grid's order. Every row of the grid (every --ratio point) is in the results file.
void print_at_n_dk(const Table& t, const std::vector<std::size_t>& rows) {
  const auto& memory = std::get<std::vector<std::string>>(t.column("memory").data);
  const auto& keys = std::get<std::vector<std::string>>(t.column("keys").data);
  const auto& d_k = std::get<std::vector<std::int64_t>>(t.column("d_k").data);
  const auto& beta = std::get<std::vector<double>>(t.column("beta").data);
  const auto& g_min = std::get<std::vector<double>>(t.column("g_min").data);
  const auto& d_c = std::get<std::vector<std::int64_t>>(t.column("d_c").data);
  const auto& acc = std::get<std::vector<double>>(t.column("accuracy").data);
  const auto& rel = std::get<std::vector<double>>(t.column("rel_err").data);
  std::vector<std::string> row_names, col_names;
  std::map<std::pair<std::size_t, std::size_t>, std::size_t> cell;
  auto index_of = [](std::vector<std::string>& names, const std::string& n) {
    const auto it = std::find(names.begin(), names.end(), n);
    if (it != names.end()) return static_cast<std::size_t>(it - names.begin());
    names.push_back(n);
    return names.size() - 1;
  };
  for (std::size_t i : rows) {
    const Memory m = parse_memory(memory[i], "recall/capacity memory");
    std::string r = memory[i];
    if (uses_beta(m)) r += fmt::format(" beta={:g}", beta[i]);
    if (uses_decay(m)) r += fmt::format(" g_min={:g}", g_min[i]);
    if (d_c[i] != 0) r += fmt::format(" d_c={:g}(d_k+d_v)", static_cast<double>(d_c[i]) / (2.0 * d_k[i]));  // --dc-ratio
    const std::size_t ri = index_of(row_names, r), ci = index_of(col_names, fmt::format("{} {}", keys[i], d_k[i]));
    cell[{ri, ci}] = i;
  }
  std::size_t w = 6;
  for (const auto& r : row_names) w = std::max(w, r.size());
  std::size_t cw = 7;
  for (const auto& c : col_names) cw = std::max(cw, c.size() + 1);
  fmt::print("at N = d_k (acc: the readout decodes to the right value token, a scale-free test; rel_err also counts the "
             "magnitude a decaying memory loses, so acc = 1 with rel_err near 1 is a well-aimed but faded readout; "
             "columns: key kind and d_k; -: not in the grid):\n");
  for (const bool is_acc : {true, false}) {
    std::string line = fmt::format("  {:<{}}", is_acc ? "acc" : "rel_err", w);
    for (const auto& c : col_names) line += fmt::format("{:>{}}", c, cw);
    fmt::print("{}\n", line);
    for (std::size_t ri = 0; ri < row_names.size(); ++ri) {
      line = fmt::format("  {:<{}}", row_names[ri], w);
      for (std::size_t ci = 0; ci < col_names.size(); ++ci) {
        const auto it = cell.find({ri, ci});
        const std::string v = it == cell.end() ? "-"
                              : is_acc         ? fmt::format("{:.3f}", acc[it->second])
                                               : fmt::format("{:.1e}", rel[it->second]);
        line += fmt::format("{:>{}}", v, cw);
      }
      fmt::print("{}\n", line);
    }
  }
}

struct RecallOptions {
  std::vector<std::string> memories = memory_names();
  std::vector<std::string> keys{"random", "orthogonal", "correlated"};
  std::vector<double> d_k{16, 32, 64, 128, 256};
  std::vector<double> ratio{0.125, 0.25, 0.5, 1, 2, 4, 8};
  std::vector<double> beta{1.0, 0.5};
  std::vector<double> g_min{-5.0};
  std::vector<double> dc_ratio{1.0, 0.5};
  double overlap = 0.5;
  double vocab = 8192;
  double trials = 2;
  double power_a = 1.0;
  double span = 2.0;
  double softmax_scale = 100.0;
  double decay_bias_lo = -8.0, decay_bias_hi = -2.0;
  std::vector<Memory> mems;  ///< --memories parsed (by the command's check)
};

/// Draws the query slot of every key: gap ~ P(gap) propto gap^-a on 1..Lq, nearest free slot.
std::vector<Eigen::Index> power_law_slots(Rng& rng, Eigen::Index N, Eigen::Index Lq, double a) {
  std::vector<double> cdf(static_cast<std::size_t>(Lq));
  double acc = 0;
  for (Eigen::Index s = 1; s <= Lq; ++s) cdf[static_cast<std::size_t>(s - 1)] = acc += std::pow(static_cast<double>(s), -a);
  std::vector<bool> used(static_cast<std::size_t>(Lq), false);
  std::vector<Eigen::Index> slot(static_cast<std::size_t>(N));
  for (Eigen::Index i = N - 1; i >= 0; --i) {  // gap measured from the end of the writes
    const double u = rng.uniform(0.0, acc);
    auto s0 = static_cast<Eigen::Index>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    Eigen::Index s = -1;
    for (Eigen::Index off = 0; off < Lq && s < 0; ++off) {
      if (s0 + off < Lq && !used[static_cast<std::size_t>(s0 + off)]) s = s0 + off;
      else if (s0 - off >= 0 && !used[static_cast<std::size_t>(s0 - off)]) s = s0 - off;
    }
    used[static_cast<std::size_t>(s)] = true;
    slot[static_cast<std::size_t>(i)] = s;
  }
  return slot;
}

struct Acc {
  double correct = 0, count = 0, err2 = 0, ref2 = 0, dist = 0;
  double numbers = 0;
};
}  // namespace

/// --quick's defaults (recall's check() and its --help).
const std::vector<double> kQuickDk = {16, 32, 64};
constexpr double kQuickTrials = 2, kQuickVocab = 2048;

void register_recall(Registry& reg) {
  auto o = std::make_shared<RecallOptions>();
  auto& c = reg.add("recall",
                    "Multi-query associative recall without training (mechanistic capacity, not trained-model "
                    "curves): write N key/value pairs into each memory (softmax, MLA through its d_c latent, linear "
                    "attention, GLA, DeltaNet, Gated DeltaNet, KDA), read back each key at a power-law distance, "
                    "decode to the nearest value; accuracy and relative error vs N / d_k.",
                    "results/recall.h5");
  add_shard_option(c);
  auto* a = c.app;
  std::map<std::string, CLI::Option*> opt;
  opt["memories"] = a->add_option("--memories", o->memories, "memories to test")->delimiter(',')->capture_default_str();
  opt["keys"] = a->add_option("--keys", o->keys, "key embeddings: random, orthogonal, correlated")->delimiter(',')->capture_default_str();
  opt["d-k"] = a->add_option("--d-k", o->d_k, "key dimensions d_k (d_v = d_k)")->delimiter(',')->type_name(kInt)->capture_default_str();
  opt["ratio"] = a->add_option("--ratio", o->ratio, "N / d_k values (pairs written per key dimension)")->delimiter(',')->capture_default_str();
  opt["beta"] = a->add_option("--beta", o->beta, "write strengths beta of the delta memories, in (0, 1]")->delimiter(',')->capture_default_str();
  opt["g-min"] = a->add_option("--g-min", o->g_min, "gate lower bounds g_min (< 0) of GLA, Gated DeltaNet, KDA")->delimiter(',')->capture_default_str();
  opt["dc-ratio"] = a->add_option("--dc-ratio", o->dc_ratio, "MLA latent width d_c as a multiple of d_k + d_v")->delimiter(',')->capture_default_str();
  opt["trials"] = a->add_option("--trials", o->trials, "independent sequences per point")->type_name(kInt)->capture_default_str();
  opt["vocab"] = a->add_option("--vocab", o->vocab, "vocabulary size V (keys from [1, V/2), values from [V/2, V))")->type_name(kInt)->capture_default_str();
  a->add_option("--overlap", o->overlap, "pairwise cosine of correlated keys, in [0, 1)")->capture_default_str();
  a->add_option("--power-a", o->power_a, "exponent a of the query-gap power law P(gap) ~ gap^-a (>= 0)")->capture_default_str();
  a->add_option("--span", o->span, "query region length as a multiple of N (>= 1)")->capture_default_str();
  a->add_option("--softmax-scale", o->softmax_scale, "inverse temperature of the softmax and MLA reads (> 0)")->capture_default_str();
  a->add_option("--decay-bias-lo", o->decay_bias_lo, "per-channel gate bias b ~ U(lo, hi): g = g_min Sigmoid(z + b), z ~ N(0,1)")->capture_default_str();
  a->add_option("--decay-bias-hi", o->decay_bias_hi, "upper end of the gate bias range")->capture_default_str();
  describe_quick(c, fmt::format("--d-k {}, --trials {}, --vocab {}", fmt::join(kQuickDk, ","), kQuickTrials, kQuickVocab));
  // cli::run's order: the options (here, with --quick's defaults applied first), then --out
  c.check = [o, opt](Context& ctx) {
    if (ctx.common.quick) {  // small defaults, unless given
      if (!opt.at("d-k")->count()) o->d_k = kQuickDk;
      if (!opt.at("trials")->count()) o->trials = kQuickTrials;
      if (!opt.at("vocab")->count()) o->vocab = kQuickVocab;
    }
    o->mems.clear();
    for (const auto& m : o->memories) o->mems.push_back(parse_memory(m, "--memories"));
    for (const auto& k : o->keys)
      require(k == "random" || k == "orthogonal" || k == "correlated",
              "--keys: '" + k + "' is unknown; accepted: random, orthogonal, correlated");
    for (double d : o->d_k) require(d >= 1 && d <= 4096 && d == std::floor(d), fmt::format("--d-k: {} is not an integer in [1, 4096]", d));
    for (double r : o->ratio) require(r > 0 && r <= 64, fmt::format("--ratio: {} must be in (0, 64]", r));
    for (double b : o->beta) require(b > 0 && b <= 1, fmt::format("--beta: {} must be in (0, 1]", b));
    for (double g : o->g_min) require(g < 0 && std::isfinite(g), fmt::format("--g-min: {} must be a finite negative number", g));
    for (double r : o->dc_ratio) require(r > 0 && r <= 4, fmt::format("--dc-ratio: {} must be in (0, 4]", r));
    require(o->trials >= 1 && o->trials <= 1e5 && o->trials == std::floor(o->trials), fmt::format("--trials: {} is not an integer in [1, 1e5]", o->trials));
    require(o->vocab >= 4 && o->vocab <= 1e9 && o->vocab == std::floor(o->vocab), fmt::format("--vocab: {} is not an integer in [4, 1e9]", o->vocab));
    require(o->overlap >= 0 && o->overlap < 1, fmt::format("--overlap: {} must be in [0, 1)", o->overlap));
    require(o->power_a >= 0, fmt::format("--power-a: {} must be >= 0", o->power_a));
    require(o->span >= 1 && o->span <= 1000, fmt::format("--span: {} must be in [1, 1000]", o->span));
    require(o->softmax_scale > 0 && o->softmax_scale <= 1e6, fmt::format("--softmax-scale: {} must be in (0, 1e6]", o->softmax_scale));
    require(std::fabs(o->decay_bias_lo) <= 100 && std::fabs(o->decay_bias_hi) <= 100 && o->decay_bias_lo <= o->decay_bias_hi,
            fmt::format("--decay-bias-lo {} / --decay-bias-hi {}: each must be in [-100, 100] and lo <= hi", o->decay_bias_lo, o->decay_bias_hi));
    const auto V = static_cast<Eigen::Index>(o->vocab);
    for (double d : o->d_k)
      for (double r : o->ratio) {
        const auto N = std::max<Eigen::Index>(1, std::lround(r * d));
        require(N <= V / 2 - 1, fmt::format("--vocab: {} leaves {} key tokens, fewer than N = {} (d_k {} x ratio {})",
                                            o->vocab, V / 2 - 1, N, d, r));
      }
  };
  c.run = [o](Context& ctx) {
    const std::vector<Memory>& mems = o->mems;
    const auto V = static_cast<Eigen::Index>(o->vocab);
    Table t;
    t.col("memory", 's', "1", "memory: softmax, mla, linear, gla, deltanet, gated_deltanet, kda")
        .col("keys", 's', "1", "key embedding: random, orthogonal, correlated")
        .col("d_k", 'i', "1", "key dimension (d_v = d_k)")
        .col("N", 'i', "1", "key/value pairs written")
        .col("ratio", 'd', "1", "N / d_k")
        .col("beta", 'd', "1", "write strength (1 for memories without beta)")
        .col("g_min", 'd', "1", "gate lower bound (0 for memories without decay)")
        .col("d_c", 'i', "1", "MLA latent width (0 for other memories)")
        .col("accuracy", 'd', "1", "fraction of queries decoded to the right value token (nearest value: scale-free)")
        .col("rel_err", 'd', "1", "sqrt(sum ||o - v||^2 / sum ||v||^2) over all queries (counts lost magnitude too: "
             "near 1 for a faded readout that still decodes right)")
        .col("queries", 'i', "1", "queries read (N x trials)")
        .col("mean_distance", 'd', "1", "mean tokens between a pair's write and its query")
        .col("state_numbers", 'i', "1", "numbers the memory holds at read time (d_k d_v, N (d_k + d_v), or N d_c)");

    const auto trials = static_cast<int>(o->trials);
    // --shard: a grid point is one (keys, d_k, ratio) cell; its cost is the sequence length times the d_k x d_k state
    // each memory updates per token, (N + span N) d_k^2
    std::vector<double> cost;
    for (std::size_t i = 0; i < o->keys.size(); ++i)
      for (double dd : o->d_k)
        for (double rr : o->ratio) {
          const double N = static_cast<double>(std::max<long>(1, std::lround(rr * dd)));
          cost.push_back((N + std::ceil(o->span * N)) * dd * dd);
        }
    const ShardPlan plan(ctx.shard, cost, "(N + ceil(span N)) d_k^2 per (keys, d_k, ratio) cell");
    std::vector<std::int64_t> row_keys;
    std::size_t point = 0, runs = 0;
    for (std::size_t p = 0; p < cost.size(); ++p) runs += plan.runs(p) ? 1 : 0;
    auto prog = ctx.progress("recall", runs * static_cast<std::size_t>(trials));
    for (const auto& keymode : o->keys)
      for (double dd : o->d_k)
        for (double rr : o->ratio) {
          const std::size_t this_point = point++;
          if (!plan.runs(this_point)) continue;
          const auto d = static_cast<Eigen::Index>(dd);
          const auto N = std::max<Eigen::Index>(1, std::lround(rr * dd));
          const auto Lq = static_cast<Eigen::Index>(std::ceil(o->span * static_cast<double>(N)));
          const Eigen::Index L = N + Lq;
          // (memory, beta, g_min, d_c) -> accumulators
          std::map<std::tuple<int, double, double, Eigen::Index>, Acc> acc;
          // The cell's own generators (cell_seed): the sequences, and apart from them MLA's latent projections per d_c,
          // so that neither the rest of the grid nor --memories / --dc-ratio changes this cell's numbers.
          const std::string cell = fmt::format("recall keys={} d_k={} N={}", keymode, d, N);
          Rng rng(cell_seed(ctx.common.seed, cell));
          std::map<Eigen::Index, Rng> codec_rng;
          for (int tr = 0; tr < trials; ++tr) {
            // Tokens: N distinct keys from [1, V/2), values from [V/2, V).
            std::vector<Eigen::Index> key_ids(static_cast<std::size_t>(V / 2 - 1));
            std::iota(key_ids.begin(), key_ids.end(), 1);
            for (Eigen::Index i = 0; i < N; ++i) {  // partial Fisher-Yates with the portable engine
              const auto j = i + static_cast<Eigen::Index>(rng.uniform(0.0, 1.0) * static_cast<double>(key_ids.size() - static_cast<std::size_t>(i)));
              std::swap(key_ids[static_cast<std::size_t>(i)], key_ids[static_cast<std::size_t>(std::min<Eigen::Index>(j, static_cast<Eigen::Index>(key_ids.size()) - 1))]);
            }
            std::vector<Eigen::Index> val_idx(static_cast<std::size_t>(N));
            for (auto& x : val_idx) x = std::min<Eigen::Index>(V - V / 2 - 1, static_cast<Eigen::Index>(rng.uniform(0.0, 1.0) * static_cast<double>(V - V / 2)));
            const Mat<double> Kemb = keymode == "random"       ? random_unit_rows(rng, N, d)
                                     : keymode == "orthogonal" ? orthogonal_rows(rng, N, d)
                                                               : correlated_rows(rng, N, d, o->overlap);
            const Mat<double> Vemb = random_unit_rows(rng, V - V / 2, d);  // value-token embeddings
            const auto slot = power_law_slots(rng, N, Lq, o->power_a);
            Sequence s;
            s.k = Mat<double>::Zero(L, d);
            s.v = Mat<double>::Zero(L, d);
            s.q = Mat<double>::Zero(L, d);
            s.write.assign(static_cast<std::size_t>(L), false);
            s.read.assign(static_cast<std::size_t>(L), false);
            std::vector<Eigen::Index> read_order;  // pair index of each read, in time order
            std::vector<Eigen::Index> pair_at(static_cast<std::size_t>(Lq), -1);
            for (Eigen::Index i = 0; i < N; ++i) {
              s.k.row(i) = Kemb.row(i);
              s.v.row(i) = Vemb.row(val_idx[static_cast<std::size_t>(i)]);
              s.write[static_cast<std::size_t>(i)] = true;
              pair_at[static_cast<std::size_t>(slot[static_cast<std::size_t>(i)])] = i;
            }
            double dist = 0;
            for (Eigen::Index j = 0; j < Lq; ++j) {
              const Eigen::Index i = pair_at[static_cast<std::size_t>(j)];
              if (i < 0) continue;
              s.q.row(N + j) = Kemb.row(i);
              s.read[static_cast<std::size_t>(N + j)] = true;
              read_order.push_back(i);
              dist += static_cast<double>(N + j - i);
            }
            // Gate draws: per-channel bias b_i ~ U(lo, hi), z_t,i ~ N(0, 1); g = g_min Sigmoid(z + b).
            Vec<double> bias(d);
            for (Eigen::Index i = 0; i < d; ++i) bias(i) = rng.uniform(o->decay_bias_lo, o->decay_bias_hi);
            Mat<double> sig(L, d);
            for (Eigen::Index tt = 0; tt < L; ++tt)
              for (Eigen::Index i = 0; i < d; ++i) sig(tt, i) = sigmoid<double>(rng.normal() + bias(i));
            Mat<double> target(static_cast<Eigen::Index>(read_order.size()), d);
            std::vector<Eigen::Index> target_tok(read_order.size());
            for (std::size_t r = 0; r < read_order.size(); ++r) {
              target.row(static_cast<Eigen::Index>(r)) = Vemb.row(val_idx[static_cast<std::size_t>(read_order[r])]);
              target_tok[r] = val_idx[static_cast<std::size_t>(read_order[r])];
            }
            auto score = [&](const Mat<double>& out, Acc& a) {
              const auto pred = nearest_rows(out, Vemb);
              for (std::size_t r = 0; r < pred.size(); ++r) a.correct += pred[r] == target_tok[r] ? 1 : 0;
              a.count += static_cast<double>(pred.size());
              a.err2 += (out - target).squaredNorm();
              a.ref2 += target.squaredNorm();
              a.dist += dist;
            };
            for (Memory m : mems) {
              const int mi = static_cast<int>(m);
              if (m == Memory::mla) {
                for (double dr : o->dc_ratio) {
                  const auto dc = std::max<Eigen::Index>(1, std::lround(dr * 2.0 * dd));
                  Rng& crng = codec_rng.try_emplace(dc, cell_seed(ctx.common.seed, fmt::format("{} d_c={}", cell, dc))).first->second;
                  Mat<double> Gm(dc, 2 * d);
                  for (Eigen::Index i = 0; i < dc; ++i)
                    for (Eigen::Index j = 0; j < 2 * d; ++j) Gm(i, j) = crng.normal();
                  const auto codec = LatentCodec<double>::from_gaussian(Gm, d, d);
                  Acc& a = acc[{mi, 1.0, 0.0, dc}];
                  score(run_memory(m, s, 1.0, 1.0, o->softmax_scale, &codec), a);
                  a.numbers = static_cast<double>(N * dc);
                }
                continue;
              }
              if (m == Memory::softmax) {
                Acc& a = acc[{mi, 1.0, 0.0, 0}];
                s.g = Mat<double>::Zero(L, d);
                score(run_memory(m, s, 1.0, 1.0, o->softmax_scale, nullptr), a);
                a.numbers = static_cast<double>(N * 2 * d);
                continue;
              }
              const std::vector<double> betas = uses_beta(m) ? o->beta : std::vector<double>{1.0};
              const std::vector<double> gmins = uses_decay(m) ? o->g_min : std::vector<double>{0.0};
              for (double gm : gmins) {
                s.g = gm * sig;
                if (m == Memory::gated_deltanet)  // scalar gate per head: the channel mean of KDA's g
                  for (Eigen::Index tt = 0; tt < L; ++tt) s.g.row(tt).setConstant(s.g.row(tt).mean());
                for (double b : betas) {
                  Acc& a = acc[{mi, b, gm, 0}];
                  score(run_memory(m, s, b, 1.0, o->softmax_scale, nullptr), a);
                  a.numbers = static_cast<double>(d * d);
                }
              }
            }
            prog.tick();
          }
          for (const auto& [key, a] : acc) {
            const auto& [mi, b, gm, dc] = key;
            t.row({memory_name(static_cast<Memory>(mi)), keymode, static_cast<std::int64_t>(d), static_cast<std::int64_t>(N),
                   static_cast<double>(N) / dd, b, gm, static_cast<std::int64_t>(dc), a.correct / a.count,
                   std::sqrt(a.err2 / a.ref2), static_cast<std::int64_t>(a.count), a.dist / a.count,
                   static_cast<std::int64_t>(a.numbers)});
            row_keys.push_back(static_cast<std::int64_t>(this_point));
          }
        }
    prog.finish();
    auto f = ctx.open_results();
    f->group("recall",
             "multi-query associative recall without training: mechanistic capacity of each memory (not Zoology's "
             "trained-model curves); docs/equations.md, associative-memory facts");
    f->write_table("recall/capacity", t);
    plan.record(*f, "recall");
    plan.mark_rows(*f, "recall/capacity", row_keys);
    f->attr("recall/capacity", "description",
            "one row per (memory, keys, d_k, N, beta, g_min, d_c): accuracy of nearest-value decoding and relative "
            "read error, averaged over trials");
    f->attr("recall", "options",
            nlohmann::json{{"memories", o->memories}, {"keys", o->keys}, {"d-k", o->d_k}, {"ratio", o->ratio},
                           {"beta", o->beta}, {"g-min", o->g_min}, {"dc-ratio", o->dc_ratio}, {"trials", o->trials},
                           {"vocab", o->vocab}, {"overlap", o->overlap}, {"power-a", o->power_a}, {"span", o->span},
                           {"softmax-scale", o->softmax_scale}, {"decay-bias-lo", o->decay_bias_lo},
                           {"decay-bias-hi", o->decay_bias_hi}}
                .dump());
    f->attr("recall", "softmax_scale", o->softmax_scale);
    f->attr("recall", "vocab", o->vocab);
    f->attr("recall", "overlap", o->overlap);
    f->attr("recall", "power_a", o->power_a);
    f->attr("recall", "out_scale", 1.0);
    f->commit();
    // Key numbers on stdout: accuracy at N = d_k for each memory and key mode. A grid without such a row (no --ratio 1)
    // gets one line saying so instead of the heading over nothing (e.g. `recall --ratio 0.5`).
    const auto& ratio = std::get<std::vector<double>>(t.column("ratio").data);
    std::vector<std::size_t> at_n_dk;
    for (std::size_t i = 0; i < t.rows(); ++i)
      if (std::abs(ratio[i] - 1.0) <= 1e-9) at_n_dk.push_back(i);
    if (at_n_dk.empty())
      fmt::print("at N = d_k: no rows (--ratio has no 1); every --ratio point is in {} (recall/capacity)\n",
                 ctx.common.out);
    else
      print_at_n_dk(t, at_n_dk);
    fmt::print("wrote {}\n", ctx.common.out);
    return 0;
  };
}

}  // namespace kdalab::cli
