// `kdalab parity`: the numeric-parity sweep.
//
// For every grid point (B, T, H, d_k, d_v, gate kind, g_min, beta distribution, input kind) the inputs are
// drawn once by the named generator (numerics/kda_inputs.hpp, anchor-kda first) and the truth is
// computed once on exactly those (rounded) inputs; then every implementation runs on the same
// inputs and one table row per (implementation, C, state precision, matmul precision) records
// every metric of numerics/metrics.hpp as a column, plus the error along T in windows and which
// truth the row used. Implementations:
//   float64    the recurrence of reference/kda.hpp in double     (C / precisions: n/a)
//   float32    the same recurrence in float                       (C / precisions: n/a)
//   float64-chunk, float32-chunk  the chunked UT/WY form of reference/kda_chunk.hpp with chunk C
//              (16-token secondary tiles, forward substitution); float32 refuses a factored
//              decay span above 80 nats (softplus gates can exceed it): such rows are skipped
//              with one note per (implementation, C) naming the points (merge_point_note())
//   twin-bf16  the kernel twin numerics/kda_twin.hpp (bf16 inputs and output), per (C, state
//              precision, matmul precision); matmul "plan" is the CUDA kernel's chosen plan
//              (kda_plan_kernel(): intra-chunk products fp32, the three d_k x d_v products bf16),
//              "plan-hilo" is that plan with Qg S and Kd^T D carried as bf16 hi + lo (kda_plan_state_hilo()),
//              "plan-accurate" the kernel's accurate precision (kda_plan_state_f16()),
//              "bf16"/"fp16"/"tf32"/"fp32" put every product's operands in that format
//   cuda-bf16  the CUDA prefill kernel (kernels/kda.hpp), only when kdalab was built with CUDA and a
//              GPU is present, bounded gate, C = 16, D = 128, HV = H; other points are skipped with a note
// Truths: cpp_bin_float_50 ("mp"), x87 long double ("f80", 64-bit significand, 2^11 finer than
// float64, so a float64 row measured against it is meaningful; ~13x slower than float64) or
// float64 ("f64"; then the float64 row is the truth itself and reads 0 by construction, which its
// truth column says). --truth auto takes mp while B*T*H*d_k*d_v <= --mp-max-work, f80 while
// <= --f80-max-work, f64 above (so that T up to 1M runs on a CPU);
// tests/numerics/test_f64_vs_mp.cpp proves float64 within 1e-12 of mp at shorter T.
// Configs: data/configs/parity.json is the full grid (T up to 65,536, both gates, state fp32/bf16,
// matmul plan/bf16; measured 39 min on a loaded 2-core machine);
// data/configs/parity_long.json adds T = 1,048,576 for the float64 / float32 / twin (kernel plan) rows
// with the float64 truth (measured 7 min and 13.7 GB peak memory: every tensor is held in float64; the
// twin alone took 214 s, ~200 us per token and head, so the long grid is kept to one precision plan).
//
// --backward: the gradient-parity mode. Per grid point the inputs above plus seeded upstream gradients
// dO ~ N(0, 1) [B, T, H, d_v] and dS_T ~ N(0, 1) [B, H, d_k, d_v] (Rng(seed + 1)); each implementation runs the
// reverse sweep of the recurrence (reference/kda_backward.hpp, checkpoint ceil(sqrt(T)) tokens) and one row
// records the relative RMS of each gradient dq, dk, dv, dg, dbeta, dS0 against the truth's. Implementations:
// float64, float32 (the same backward in that scalar type), bf16-emu (the bf16 reference emulation of
// numerics/plain_emulation.hpp through experiments/parity_emul.cpp: the plain chunked algorithm, C = 64, bf16
// operands, fp32 accumulation; rows skipped with a note in a tree without that header). Truths as the
// forward mode's (--truth auto: mp50 while B*T*H*d_k*d_v <= --mp-max-work, long double while <= --f80-max-work,
// float64 above, when the float64 row reads 0 by construction and only the float32 row is measured; long double
// has 11 more significand bits than float64, so a float64 row against it still measures float64's own error).
// Defaults of the mode (each unless given): --T 16,64,256, --dk 32, --dv 32, --impl float64,float32, --out
// results/parity_backward.h5; --quick: --T 16,64. The full run of docs/cli.md: --T 16,64,256,1024,4096 --dk 64
// --dv 64 --gate bounded,softplus (the mp50 truth through T = 1024, ~70 s a point there; long double at 4096;
// measured 3.5 min on a loaded 2-core machine). Written to /parity_backward/table and /summary
// (docs/results-schema.md); the figure is scripts/fig_parity_backward.py.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "experiments/build_info.hpp"
#include "experiments/cli.hpp"
#include "experiments/parity_emul.hpp"
#include "experiments/shard.hpp"
#ifdef KDALAB_HAVE_CUDA
#include "experiments/gpu_exp.hpp"
#endif
#include "numerics/bf16.hpp"
#include "numerics/kda_inputs.hpp"
#include "numerics/kda_twin.hpp"
#include "numerics/metrics.hpp"
#include "numerics/range.hpp"
#include "reference/error.hpp"
#include "reference/kda.hpp"
#include "reference/kda_backward.hpp"
#include "reference/kda_chunk.hpp"

namespace kdalab::cli {

namespace {

struct ParityOptions {
  std::vector<double> B{1}, T{17, 64, 300, 1000}, H{1}, dk{128}, dv{128}, C{16}, g_min{-5};
  std::vector<std::string> gate{"bounded"}, beta{"sigmoid"}, inputs{"anchor"}, impl{"float64", "float32", "float64-chunk", "float32-chunk", "twin-bf16", "cuda-bf16"},
      state{"fp32", "bf16"}, matmul{"plan", "bf16"};
  std::string truth = "auto";
  double mp_max_work = 1e7, f80_max_work = 1.1e9;
  int windows = 16;
  bool backward = false;        ///< --backward: the gradient-parity mode (file comment)
  std::vector<GateKind> gates;  ///< --gate parsed (by the command's check)
  std::vector<BetaDist> betas;  ///< --beta parsed (by the command's check)
  std::vector<InputKind> input_kinds;  ///< --inputs parsed (by the command's check)
  std::vector<Format> states;   ///< --state-precision parsed (by the command's check)
};

const std::vector<std::string> kImpls{"float64", "float32", "float64-chunk", "float32-chunk", "twin-bf16", "cuda-bf16"};
/// Implementations of the gradient-parity mode (--backward); bf16-emu: run_backward_impl().
const std::vector<std::string> kBackwardImpls{"float64", "float32", "bf16-emu"};

/// x as a count: an integer in [min, 1e12]; kdalab::Error naming --<opt>, the value and that range otherwise.
std::size_t as_count(double x, const std::string& opt, double min = 1) {
  require(std::isfinite(x) && x >= min && x == std::floor(x) && x <= 1e12,
          fmt::format("--{}: {} is not accepted; give integers in [{}, 1000000000000]", opt, x, min));
  return static_cast<std::size_t>(x);
}

/// Result of one implementation on one grid point, as float64 copies.
struct ImplOut {
  std::vector<double> o, S;
  std::string out_format;  // storage format of o
  double seconds = 0;
};

/// The recurrence kda_recurrent (reference/kda.hpp; K3 report Eq. 1) in scalar type S on the inputs cast to S;
/// o [B, T, HV, d_v] and S_final [B, HV, d_k, d_v] as float64 copies, out_format = fmt_name, wall time.
template <class S>
ImplOut run_reference(const KdaInputs& in, const std::string& fmt_name) {
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor<S> S0 = in.S0.cast<S>();
  const KdaOutput<S> r = kda_recurrent<S>(in.q.cast<S>(), in.k.cast<S>(), in.v.cast<S>(), in.g.cast<S>(),
                                          in.beta.cast<S>(), &S0, static_cast<S>(in.scale));
  ImplOut out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.o = r.o.template cast<double>().data;
  out.S = r.S_final.template cast<double>().data;
  out.out_format = fmt_name;
  return out;
}

/// The chunked UT/WY form kda_chunked (reference/kda_chunk.hpp) in scalar type S with chunk C and 16-token
/// secondary tiles; outputs as run_reference. Throws kdalab::Error (from kda_chunked) when the factored decay
/// span exceeds max_factored_span<S>() (80 nats in float32, 700 in float64).
template <class S>
ImplOut run_chunked(const KdaInputs& in, std::size_t C, const std::string& fmt_name) {
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor<S> S0 = in.S0.cast<S>();
  ChunkOptions opt;
  opt.C = C;
  opt.tile = 16;
  const KdaOutput<S> r = kda_chunked<S>(in.q.cast<S>(), in.k.cast<S>(), in.v.cast<S>(), in.g.cast<S>(),
                                        in.beta.cast<S>(), &S0, static_cast<S>(in.scale), opt);
  ImplOut out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.o = r.o.template cast<double>().data;
  out.S = r.S_final.template cast<double>().data;
  out.out_format = fmt_name;
  return out;
}

/// The kernel twin (numerics/kda_twin.hpp) on the raw inputs exactly as the kernel reads them:
/// bf16 q_raw/k_raw/v/g_raw/beta_raw, L2Norm, gate and beta sigmoid fused (the softplus gate is
/// not fused in the kernel: its rows read the derived g), chunk C, state format `state`, matmul
/// operands per `matmul` ("plan" = kda_plan_kernel(), "plan-hilo" = kda_plan_state_hilo(), "plan-accurate" =
/// kda_plan_state_f16(), else every product in that format), o bf16.
ImplOut run_twin(const KdaInputs& in, GateKind gate, std::size_t C, Format state, const std::string& matmul) {
  KdaTwinPlan p = matmul == "plan-hilo"       ? kda_plan_state_hilo()
                  : matmul == "plan-accurate" ? kda_plan_state_f16()
                                              : kda_plan_kernel();
  if (matmul != "plan" && matmul != "plan-hilo" && matmul != "plan-accurate") {
    const Format f = parse_format(matmul, "--matmul-precision");
    p.kk = p.qk = p.solve = p.ws = p.qs = p.pd = p.kd = f;
  }
  p.chunk = C;
  p.state = state;
  p.fuse_gate = gate == GateKind::bounded;
  const auto t0 = std::chrono::steady_clock::now();
  KdaOutput<double> r = kda_twin(in, p);
  ImplOut out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.o = std::move(r.o.data);
  out.S = std::move(r.S_final.data);
  out.out_format = format_name(p.out);
  return out;
}

/// Why the cuda-bf16 rows cannot run in this build on this machine ("cuda-bf16 rows skipped: ..."), or nothing when
/// they can: no GPU visible (every build), or a GPU but no CUDA kernels built. The one rule for run_cuda() and for the
/// early exit 3 of a grid that asks for cuda-bf16 alone.
std::optional<std::string> cuda_unavailable() {
  if (build_info::gpu_devices().empty()) return "cuda-bf16 rows skipped: no GPU (" + build_info::gpu_note() + ")";
#ifdef KDALAB_HAVE_CUDA
  return std::nullopt;
#else
  return "cuda-bf16 rows skipped: a GPU is present but this kdalab was built without CUDA (cmake --preset cuda)";
#endif
}

/// The CUDA prefill kernel (kernels/kda.hpp through gpu_exp::kda_prefill_on_gpu: chunk 16, fused K3
/// gate, L2Norm and beta sigmoid, fp32 state, bf16 o) on the raw inputs exactly as the twin reads them.
/// The kernel reads A_log and the gate bias in fp32 (the truth keeps them in float64: a relative
/// difference ~6e-8 in the gate, far below the ~1.7e-3 the row measures). Rows exist only when kdalab
/// was built with CUDA and a GPU is present, for the bounded gate, C = 16, d_k = d_v = 128, HV = H;
/// otherwise `why` says which condition failed and the row is skipped; `unavailable` is set when the reason is
/// this build or machine (no GPU, or no CUDA kernels built), not the point's shape.
std::optional<ImplOut> run_cuda(const KdaInputs& in, GateKind gate, std::size_t C, std::string& why,
                                bool& unavailable) {
  if (const auto no = cuda_unavailable()) {
    why = *no;
    unavailable = true;
    return std::nullopt;
  }
#ifdef KDALAB_HAVE_CUDA
  if (gate != GateKind::bounded || C != 16 || in.d_k != 128 || in.d_v != 128 || in.H != in.HV) {
    why = fmt::format("cuda-bf16 row skipped at B={} T={} H={} d_k={} d_v={} C={} gate={}: the kernel runs the bounded "
                      "(K3) gate, C = 16, d_k = d_v = 128, HV = H only",
                      in.B, in.T, in.H, in.d_k, in.d_v, C, gate == GateKind::bounded ? "bounded" : "softplus");
    return std::nullopt;
  }
  const auto t0 = std::chrono::steady_clock::now();
  KdaOutput<double> r = gpu_exp::kda_prefill_on_gpu(in, 0.0, false);
  ImplOut out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.o = std::move(r.o.data);
  out.S = std::move(r.S_final.data);
  out.out_format = "bf16";
  return out;
#else
  (void)in, (void)gate, (void)C;
  return std::nullopt;  // not reached: cuda_unavailable() says so in a build without the CUDA kernels
#endif
}

/// A truth: o and S_final as float64 copies, the scalar type it was computed in, its wall time.
struct Truth {
  std::vector<double> o, S;
  std::string name;
  double seconds = 0;
};

/// The truth on `in`: the recurrence in cpp_bin_float_50 (kind "mp"), long double ("f80") or float64 (else),
/// as float64 copies with its scalar type's name and wall time.
Truth compute_truth(const KdaInputs& in, const std::string& kind) {
  ImplOut r;
  Truth t;
  if (kind == "mp") {
    r = run_reference<mp50>(in, "cpp_bin_float_50");
    t.name = "cpp_bin_float_50";
  } else if (kind == "f80") {
    r = run_reference<long double>(in, "long double");
    t.name = "long double (x87, 64-bit significand)";
  } else {
    r = run_reference<double>(in, "float64");
    t.name = "float64";
  }
  t.o = std::move(r.o);
  t.S = std::move(r.S);
  t.seconds = r.seconds;
  return t;
}

/// Largest element of x (0 when empty); NaN when any element is NaN (std::max_element would skip it,
/// and a NaN row or window must show in the summaries).
double nan_max(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = (std::isnan(v) || std::isnan(m)) ? std::numeric_limits<double>::quiet_NaN() : std::max(m, v);
  return m;
}

/// Median of x; NaN when x is empty or holds a NaN (sorting NaN is undefined, and a NaN row must show).
double median(std::vector<double> x) {
  if (x.empty() || std::any_of(x.begin(), x.end(), [](double v) { return std::isnan(v); }))
    return std::numeric_limits<double>::quiet_NaN();
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/// One grid point a note is about: a chunked implementation refused its inputs (kdalab::Error from
/// kda_chunked), or a row's o or S holds NaN/Inf.
struct PointNote {
  std::size_t point;  ///< index of the grid point
  std::string label;  ///< "T=.. H=.. gate beta"
  std::string why;    ///< what happened there (the Error's message, or the NaN/Inf counts)
};

/// The words at one position of several notes merged: the word when all are equal; "lo .. hi" (the words of the
/// smallest and the largest number) when every distinct word is a finite number; else the distinct words joined
/// by " / ". distinct: >= 1 distinct words, in first-seen order.
std::string merge_word(const std::vector<std::string>& distinct) {
  if (distinct.size() == 1) return distinct[0];
  double lo = 0, hi = 0;
  std::string lo_w, hi_w;
  for (const auto& d : distinct) {
    char* end = nullptr;
    const double x = std::strtod(d.c_str(), &end);
    if (d.empty() || end != d.c_str() + d.size() || !std::isfinite(x)) {  // not a number: list the words
      std::string merged;
      for (const auto& w : distinct) merged += (merged.empty() ? "" : " / ") + w;
      return merged;
    }
    if (lo_w.empty() || x < lo) { lo = x; lo_w = d; }
    if (hi_w.empty() || x > hi) { hi = x; hi_w = d; }
  }
  return lo_w + " .. " + hi_w;
}

/// The one note for every point with the same `head` (e.g. "float32-chunk C=16 skipped", "twin-bf16 C=16
/// (state fp32, matmul plan) has NaN/Inf"; items: >= 1, in point order). One point: "<head> at point <p>
/// (<label>): <why>". Several: "<head> at <k> points [<p> (<label>), ...]: <why>", where the messages are
/// merged word by word when they have the same number of words (space-separated): a word they all share is
/// kept, a word that differs is replaced by its range "lo .. hi" when every message has a number there (e.g.
/// the decay span "84.7576 .. 173.205", a NaN count "12 .. 40"), else by its distinct values joined by " / ".
/// Messages of different lengths are kept whole, each after its point ("<p>: <why>; ..."). Never throws on
/// any input.
std::string merge_point_note(const std::string& head, const std::vector<PointNote>& items) {
  if (items.size() == 1)
    return fmt::format("{} at point {} ({}): {}", head, items[0].point, items[0].label, items[0].why);
  auto words = [](const std::string& text) {
    std::vector<std::string> w;
    std::size_t a = 0;
    for (std::size_t b = text.find(' '); b != std::string::npos; a = b + 1, b = text.find(' ', a))
      w.push_back(text.substr(a, b - a));
    w.push_back(text.substr(a));
    return w;
  };
  std::string where;
  for (const auto& it : items) where += fmt::format("{}{} ({})", where.empty() ? "" : ", ", it.point, it.label);
  std::vector<std::vector<std::string>> ws;
  for (const auto& it : items) ws.push_back(words(it.why));
  std::string why;
  const bool same_shape = std::all_of(ws.begin(), ws.end(), [&](const auto& w) { return w.size() == ws[0].size(); });
  if (!same_shape) {
    for (const auto& it : items) why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", it.point, it.why);
  } else {
    for (std::size_t j = 0; j < ws[0].size(); ++j) {
      std::vector<std::string> distinct;
      for (const auto& w : ws)
        if (std::find(distinct.begin(), distinct.end(), w[j]) == distinct.end()) distinct.push_back(w[j]);
      why += (j ? " " : "") + merge_word(distinct);
    }
  }
  return fmt::format("{} at {} points [{}]: {}", head, items.size(), where, why);
}

/// The notes of a parity run in the order the unsharded run makes them, and the events that made them: a shard file
/// records the events (group attribute shard_note_events, JSON [[point, note], [point, head, label, why], ...]) so that
/// kdalab merge replays every shard's events in point order and makes the unsharded run's notes (replay()).
struct NoteLog {
  std::vector<std::string> notes;
  std::map<std::string, std::pair<std::size_t, std::vector<PointNote>>> point_notes;
  nlohmann::json events = nlohmann::json::array();

  /// A note said once however often it happens (e.g. "cuda-bf16 rows skipped: no GPU"), at grid point p.
  void note(std::size_t p, const std::string& n) {
    events.push_back({p, n});
    if (std::find(notes.begin(), notes.end(), n) == notes.end()) notes.push_back(n);
  }
  /// A note about points, merged per head (merge_point_note()): a placeholder in `notes` where its first point
  /// happened, filled in by finish().
  void point_note(const std::string& head, std::size_t p, const std::string& label, const std::string& why) {
    events.push_back({p, head, label, why});
    auto [it, first] = point_notes.try_emplace(head);
    if (first) {
      it->second.first = notes.size();
      notes.emplace_back();
    }
    it->second.second.push_back({p, label, why});
  }
  std::vector<std::string> finish() const {
    std::vector<std::string> out = notes;
    for (const auto& [head, at] : point_notes) out[at.first] = merge_point_note(head, at.second);
    return out;
  }
  /// The log of the unsharded run from the shards' events (each shard's JSON text, in shard order).
  static NoteLog replay(const std::vector<std::string>& shard_events) {
    std::vector<nlohmann::json> all;
    for (const auto& text : shard_events)
      for (const auto& e : nlohmann::json::parse(text.empty() ? std::string("[]") : text)) all.push_back(e);
    std::stable_sort(all.begin(), all.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a.at(0).get<std::size_t>() < b.at(0).get<std::size_t>();
    });
    NoteLog log;
    for (const auto& e : all) {
      if (e.size() == 2) log.note(e[0].get<std::size_t>(), e[1].get<std::string>());
      else log.point_note(e[1].get<std::string>(), e[0].get<std::size_t>(), e[2].get<std::string>(), e[3].get<std::string>());
    }
    return log;
  }
};

/// The `notes` attribute: the notes one per line, "none" when there is none.
std::string notes_text(const std::vector<std::string>& notes) {
  std::string all;
  for (const auto& n : notes) all += (all.empty() ? "" : "\n") + n;
  return all.empty() ? std::string("none") : all;
}

/// /parity/summary from /parity/table: per (impl, state_precision, matmul_precision) in first-row order, the rows, the
/// median and worst relative RMS of o and of S (NaN when a row's is NaN).
Table parity_summary(const Table& t) {
  const auto& impl_c = std::get<std::vector<std::string>>(t.column("impl").data);
  const auto& st_c = std::get<std::vector<std::string>>(t.column("state_precision").data);
  const auto& mm_c = std::get<std::vector<std::string>>(t.column("matmul_precision").data);
  const auto& err_c = std::get<std::vector<double>>(t.column("o_rel_rms").data);
  const auto& errS_c = std::get<std::vector<double>>(t.column("S_rel_rms").data);
  std::vector<std::string> keys;
  std::map<std::string, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < t.rows(); ++i) {
    const std::string k = impl_c[i] + "|" + st_c[i] + "|" + mm_c[i];
    if (!groups.count(k)) keys.push_back(k);
    groups[k].push_back(i);
  }
  Table sum;
  sum.col("impl", 's', "1", "implementation").col("state_precision", 's', "1", "state format")
      .col("matmul_precision", 's', "1", "matmul operand format").col("rows", 'i', "1", "rows summarised")
      .col("o_rel_rms_median", 'd', "1", "median relative RMS of o over the rows")
      .col("o_rel_rms_worst", 'd', "1", "largest relative RMS of o over the rows")
      .col("S_rel_rms_median", 'd', "1", "median relative RMS of the final state")
      .col("S_rel_rms_worst", 'd', "1", "largest relative RMS of the final state");
  for (const auto& k : keys) {
    std::vector<double> eo, es;
    for (std::size_t i : groups[k]) {
      eo.push_back(err_c[i]);
      es.push_back(errS_c[i]);
    }
    const std::size_t i0 = groups[k].front();
    sum.row({impl_c[i0], st_c[i0], mm_c[i0], static_cast<std::int64_t>(eo.size()), median(eo), nan_max(eo), median(es),
             nan_max(es)});
  }
  return sum;
}

/// The expected cost of one grid point for --shard: its work B T H d_k d_v times the truth's weight (mp 50, f80 13,
/// f64 1: their measured slowdowns against float64, rounded) plus the point's rows (each about one float64 run).
double point_cost(const KdaGenSpec& s, const std::string& truth_kind, std::size_t rows) {
  const double work = static_cast<double>(s.B * s.T * s.H * s.d_k * s.d_v);
  const double w = truth_kind == "mp" ? 50 : truth_kind == "f80" ? 13 : 1;
  return work * (w + static_cast<double>(rows));
}
constexpr const char* kParityCostModel =
    "B T H d_k d_v x (truth weight: mp 50, f80 13, f64 1 + the point's rows) per grid point";

/// The leading columns of both parity tables (forward and --backward): the input grid point. The descriptions of
/// point, generator and seed differ between the two tables.
Table& point_columns(Table& t, const std::string& point, const std::string& generator, const std::string& seed) {
  return t.col("point", 'i', "1", point)
      .col("generator", 's', "1", generator)
      .col("seed", 'i', "1", seed)
      .col("B", 'i', "1", "batch size").col("T", 'i', "1", "sequence length (tokens)")
      .col("H", 'i', "1", "heads (HV = H)").col("d_k", 'i', "1", "key dimension").col("d_v", 'i', "1", "value dimension")
      .col("gate", 's', "1", "gate kind: bounded (K3) or softplus (Kimi Linear)")
      .col("g_min", 'd', "1", "lower bound of the bounded gate (NaN for softplus)")
      .col("beta", 's', "1", "beta distribution: sigmoid, wide, one");
}

/// The cells of point_columns for grid point p (spec s, its generated inputs in), then `rest`.
std::vector<Table::Cell> point_row(std::size_t p, const KdaInputs& in, const KdaGenSpec& s,
                                   std::initializer_list<Table::Cell> rest) {
  std::vector<Table::Cell> row{static_cast<std::int64_t>(p), in.generator, static_cast<std::int64_t>(s.seed),
                               static_cast<std::int64_t>(s.B), static_cast<std::int64_t>(s.T),
                               static_cast<std::int64_t>(s.H), static_cast<std::int64_t>(s.d_k),
                               static_cast<std::int64_t>(s.d_v), gate_kind_name(s.gate),
                               s.gate == GateKind::bounded ? s.g_min : std::numeric_limits<double>::quiet_NaN(),
                               beta_dist_name(s.beta)};
  row.insert(row.end(), rest);
  return row;
}

/// The six gradients of one backward run, as float64 copies, with its wall time.
struct GradOut {
  std::vector<std::vector<double>> g;  ///< dq, dk, dv, dg, dbeta, dS0
  double seconds = 0;
};
const char* const kGradNames[] = {"dq", "dk", "dv", "dg", "dbeta", "dS0"};

/// The reverse sweep of the recurrence (kda_recurrent_backward, reference/kda_backward.hpp) in scalar type S on the
/// inputs and upstream gradients cast to S, with checkpoint interval ceil(sqrt(T)) (memory 2 sqrt(T) states).
template <class S>
GradOut run_backward_ref(const KdaInputs& in, const Tensor<double>& dO, const Tensor<double>& dS_T) {
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor<S> S0 = in.S0.cast<S>(), dST = dS_T.cast<S>();
  const KdaGrad<S> r = kda_recurrent_backward<S>(in.q.cast<S>(), in.k.cast<S>(), in.v.cast<S>(), in.g.cast<S>(),
                                                 in.beta.cast<S>(), &S0, static_cast<S>(in.scale), dO.cast<S>(), &dST,
                                                 KdaVariant::kda, kda_sqrt_checkpoint(in.T));
  GradOut out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const Tensor<S>* t : {&r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.dS0}) out.g.push_back(t->template cast<double>().data);
  return out;
}

/// One backward implementation of the gradient-parity mode on one point, or nothing with `why` set.
/// bf16-emu: the bf16 reference emulation of the backward (experiments/parity_emul.hpp: the plain chunked algorithm,
/// C = 64, bf16 operands, fp32 accumulation) on the same derived inputs and upstream gradients; skipped with a note
/// in a tree without numerics/plain_emulation.hpp.
std::optional<GradOut> run_backward_impl(const std::string& impl, const KdaInputs& in, const Tensor<double>& dO,
                                         const Tensor<double>& dS_T, std::string& why) {
  if (impl == "float64") return run_backward_ref<double>(in, dO, dS_T);
  if (impl == "float32") return run_backward_ref<float>(in, dO, dS_T);
  const auto t0 = std::chrono::steady_clock::now();
  auto g = kda_backward_bf16_emulation(in.q, in.k, in.v, in.g, in.beta, in.S0, in.scale, dO, dS_T, why);
  if (!g) return std::nullopt;
  GradOut out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.g = std::move(*g);
  return out;
}

/// /parity_backward/summary from /parity_backward/table: per implementation (first-row order) and gradient, the rows,
/// the median and worst relative RMS (NaN when a row's is NaN).
Table parity_backward_summary(const Table& t) {
  const auto& impl_c = std::get<std::vector<std::string>>(t.column("impl").data);
  Table sum;
  sum.col("impl", 's', "1", "implementation").col("gradient", 's', "1", "dq, dk, dv, dg, dbeta or dS0")
      .col("rows", 'i', "1", "rows summarised")
      .col("rel_rms_median", 'd', "1", "median relative RMS of the gradient over the rows")
      .col("rel_rms_worst", 'd', "1", "largest relative RMS of the gradient over the rows (NaN if any is NaN)");
  std::vector<std::string> impls;
  for (const auto& i : impl_c)
    if (std::find(impls.begin(), impls.end(), i) == impls.end()) impls.push_back(i);
  for (const auto& im : impls)
    for (const char* n : kGradNames) {
      const auto& col = std::get<std::vector<double>>(t.column(std::string(n) + "_rel_rms").data);
      std::vector<double> e;
      for (std::size_t i = 0; i < t.rows(); ++i)
        if (impl_c[i] == im) e.push_back(col[i]);
      sum.row({im, std::string(n), static_cast<std::int64_t>(e.size()), median(e), nan_max(e)});
    }
  return sum;
}

/// The gradient-parity mode (--backward; file comment): one row per grid point and implementation.
int run_parity_backward(const ParityOptions& o, Context& ctx) {
  const auto not_available = [](const std::string& why) {
    fmt::print(stderr, "kdalab parity --backward: not available in this build: no implementation produced a row ({}); "
                       "nothing was written (exit 3)\n", why);
    return 3;
  };
  // bf16-emu alone: said before any truth is computed (its rows would all be skipped)
  if (std::all_of(o.impl.begin(), o.impl.end(), [](const std::string& s) { return s == "bf16-emu"; }))
    if (const auto no = bf16_emulation_unavailable()) return not_available(*no);
  std::vector<KdaGenSpec> points;
  for (double B : o.B)
    for (double T : o.T)
      for (double H : o.H)
        for (double dk : o.dk)
          for (double dv : o.dv)
            for (GateKind g : o.gates)
              for (std::size_t gi = 0; gi < o.g_min.size(); ++gi) {
                if (g == GateKind::softplus && gi > 0) continue;
                for (BetaDist b : o.betas)
                  for (InputKind ik : o.input_kinds) {
                    KdaGenSpec s;
                    s.B = as_count(B, "B"); s.T = as_count(T, "T"); s.H = as_count(H, "H");
                    s.d_k = as_count(dk, "dk"); s.d_v = as_count(dv, "dv");
                    s.gate = g; s.g_min = o.g_min[gi]; s.beta = b; s.inputs = ik; s.seed = ctx.common.seed;
                    points.push_back(s);
                  }
              }
  Table t;
  point_columns(t, "index of the input grid point (inputs, upstream gradients and truth shared by its rows)",
                "named input generator (numerics/kda_inputs.hpp)", "generator seed (upstream gradients: Rng(seed + 1))")
      .col("impl", 's', "1", "implementation of the backward: float64, float32, bf16-emu")
      .col("truth", 's', "1", "the truth this row is measured against (scalar type of the reference backward)");
  for (const char* n : kGradNames)
    t.col(std::string(n) + "_rel_rms", 'd', "1", std::string("||") + n + " - " + n + "_truth||_2 / ||" + n + "_truth||_2");
  t.col("worst_rel_rms", 'd', "1", "largest of the six gradient relative RMS errors of the row (NaN if any is NaN)")
      .col("time_s", 'd', "s", "wall time of the implementation's backward on this point")
      .col("truth_time_s", 'd', "s", "wall time of the truth's backward on this point");
  const auto truth_kind = [&](const KdaGenSpec& s) {
    const double work = static_cast<double>(s.B * s.T * s.H * s.d_k * s.d_v);
    return o.truth != "auto" ? o.truth : (work <= o.mp_max_work ? "mp" : (work <= o.f80_max_work ? "f80" : "f64"));
  };
  std::vector<double> cost;
  for (const auto& s : points) cost.push_back(point_cost(s, truth_kind(s), o.impl.size()));
  const ShardPlan plan(ctx.shard, cost, kParityCostModel);
  std::size_t runs = 0;
  for (std::size_t p = 0; p < points.size(); ++p) runs += plan.runs(p) ? 1 : 0;
  std::vector<std::int64_t> row_keys;
  NoteLog log;
  auto prog = ctx.progress("parity --backward", runs * o.impl.size());
  // the table's header goes out with its first row: a first point that cannot be allocated (exit 2) or run is then
  // one error line, not a header and an error
  bool header = false;
  for (std::size_t p = 0; p < points.size(); ++p) {
    if (!plan.runs(p)) continue;
    const KdaGenSpec& s = points[p];
    const KdaInputs in = kda_inputs(s);
    Tensor<double> dO({s.B, s.T, s.H, s.d_v}), dS_T({s.B, s.H, s.d_k, s.d_v});
    Rng rng(s.seed + 1);
    rng.fill_normal(dO);
    rng.fill_normal(dS_T);
    const std::string tk = truth_kind(s);
    const GradOut tr = tk == "mp" ? run_backward_ref<mp50>(in, dO, dS_T)
                                  : (tk == "f80" ? run_backward_ref<long double>(in, dO, dS_T)
                                                 : run_backward_ref<double>(in, dO, dS_T));
    const std::string tname =
        tk == "mp" ? "cpp_bin_float_50" : (tk == "f80" ? "long double (x87, 64-bit significand)" : "float64");
    const std::string label = fmt::format("T={} H={} {} {}{}", s.T, s.H, gate_kind_name(s.gate), beta_dist_name(s.beta),
                                          s.inputs == InputKind::anchor ? "" : " " + input_kind_name(s.inputs));
    for (const auto& impl : o.impl) {
      std::string why;
      const auto r = run_backward_impl(impl, in, dO, dS_T, why);
      if (!r) {
        log.note(p, why);
        prog.tick(1, std::string());
        continue;
      }
      std::vector<Table::Cell> row = point_row(
          p, in, s,
          {impl, tname + (impl == "float64" && tk == "f64" ? " (the same computation: 0 by construction)" : "")});
      std::vector<double> errs;
      for (std::size_t i = 0; i < 6; ++i) errs.push_back(compare(r->g[i], tr.g[i], kGradNames[i]).rel_rms);
      for (double e : errs) row.emplace_back(e);
      row.emplace_back(nan_max(errs));
      row.emplace_back(r->seconds);
      row.emplace_back(tr.seconds);
      t.row(row);
      row_keys.push_back(static_cast<std::int64_t>(p));
      if (!std::exchange(header, true))
        fmt::print("{:<9}{:>7}{:>7}{:>6} {:<10}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}  truth  inputs\n", "impl", "T", "d_k",
                   "d_v", "gate", "dq", "dk", "dv", "dg", "dbeta", "dS0");
      fmt::print("{:<9}{:>7}{:>7}{:>6} {:<10}{:>11.2e}{:>11.2e}{:>11.2e}{:>11.2e}{:>11.2e}{:>11.2e}  {:<5}  {}\n", impl,
                 s.T, s.d_k, s.d_v, gate_kind_name(s.gate), errs[0], errs[1], errs[2], errs[3], errs[4], errs[5], tk,
                 input_kind_name(s.inputs));
      prog.tick(1, label + " " + impl);
    }
  }
  prog.finish();
  const std::vector<std::string> notes = log.finish();
  for (const auto& n : notes) fmt::print("note: {}\n", n);
  // a shard whose rows were all skipped still writes its file (as the forward mode's)
  if (t.rows() == 0 && !plan.active()) return not_available(notes.empty() ? std::string("empty grid") : notes.front());
  const Table sum = parity_backward_summary(t);
  auto f = ctx.open_results();
  f->group("parity_backward", "gradient parity of the KDA recurrence's backward against a high-precision truth on the same "
                              "rounded inputs and upstream gradients");
  f->write_table("parity_backward/table", t);
  f->attr("parity_backward/table", "description", "one row per grid point and implementation; one relative RMS per gradient");
  f->write_table("parity_backward/summary", sum);
  f->attr("parity_backward/summary", "description", "median and worst relative RMS per implementation and gradient");
  f->attr("parity_backward", "notes", notes_text(notes));
  plan.record(*f, "parity");
  plan.mark_rows(*f, "parity_backward/table", row_keys);
  if (plan.active()) f->attr("parity_backward", "shard_note_events", log.events.dump());
  f->attr("parity_backward", "truth_rule",
          "--truth " + o.truth +
              (o.truth == "auto" ? fmt::format(" (mp while B*T*H*d_k*d_v <= {}, f80 while <= {}, f64 above: then the "
                                               "float64 row is the truth itself and only float32 is measured)",
                                               o.mp_max_work, o.f80_max_work)
                                 : std::string()));
  f->attr("parity_backward", "upstream", "dO, dS_T ~ N(0, 1) from Rng(seed + 1), in that order; loss <dO, o> + <dS_T, S_T>");
  f->commit();
  fmt::print("wrote {} ({} rows)\n", ctx.common.out, t.rows());
  return 0;
}

}  // namespace

/// --quick's defaults (parity's check() and its --help).
const std::vector<double> kQuickT = {17, 300, 1000};
const std::vector<std::string> kQuickGate = {"bounded", "softplus"}, kQuickBeta = {"sigmoid", "one"};
const std::string kQuickTruth = "f64";
/// --backward's defaults (each unless given) and its --quick lengths.
const std::vector<double> kBackwardT = {16, 64, 256}, kBackwardQuickT = {16, 64}, kBackwardD = {32};
const std::vector<std::string> kBackwardImplDefault = {"float64", "float32"};

/// Registers `kdalab parity` (the numeric-parity sweep described at the top of this file) with `reg`.
void register_parity(Registry& reg) {
  auto o = std::make_shared<ParityOptions>();
  auto& c = reg.add(
      "parity",
      "Numeric-parity sweep: every implementation of KDA (float64, float32, the bf16 kernel twin, the CUDA kernel "
      "when a GPU is present) against a high-precision truth on the same rounded inputs, over a grid of shapes, "
      "gates and precisions; one table row per grid point and implementation, every metric a column "
      "(group /parity/table), a summary per implementation and precision (/parity/summary). The full grid is "
      "data/configs/parity.json; --quick runs a small grid with the float64 truth in seconds.",
      "results/parity.h5");
  add_shard_option(c);
  // kdalab merge: the summaries and notes are rebuilt from the merged rows and every shard's note events
  merge_hooks()["parity"] = [](MergedData& m) {
    for (const std::string g : {"/parity", "/parity_backward"}) {
      if (!m.nodes.count(g + "/table")) continue;
      const Table t = m.table(g + "/table");
      m.set_table(g + "/summary", g == "/parity" ? parity_summary(t) : parity_backward_summary(t));
      m.nodes[g].attrs["notes"] = notes_text(NoteLog::replay(m.per_shard_attr[g]).finish());
    }
  };
  auto* a = c.app;
  a->add_option("--B", o->B, "batch sizes (list)")->delimiter(',')->type_name(kInt)->capture_default_str();
  a->add_option("--T", o->T, "sequence lengths in tokens (list), integers in [1, 1000000000000]")->delimiter(',')->type_name(kInt)->capture_default_str();
  a->add_option("--H", o->H, "heads (list; HV = H)")->delimiter(',')->type_name(kInt)->capture_default_str();
  a->add_option("--dk", o->dk, "key dimensions d_k (list)")->delimiter(',')->type_name(kInt)->capture_default_str();
  a->add_option("--dv", o->dv, "value dimensions d_v (list)")->delimiter(',')->type_name(kInt)->capture_default_str();
  a->add_option("--C", o->C, "chunk sizes C >= 1 of the chunked implementations (list; n/a for the recurrences)")
      ->delimiter(',')
      ->type_name(kInt)->capture_default_str();
  a->add_option("--gate", o->gate, "gate kinds: bounded (K3, g = g_min Sigmoid(...)), softplus (Kimi Linear, unbounded)")
      ->delimiter(',')
      ->capture_default_str();
  a->add_option("--g-min", o->g_min, "lower bounds g_min < 0 of the bounded gate (list)")->delimiter(',')->capture_default_str();
  a->add_option("--beta", o->beta, "beta distributions: sigmoid (anchor), wide (Sigmoid(N(0,16))), one (beta = 1)")
      ->delimiter(',')
      ->capture_default_str();
  a->add_option("--inputs", o->inputs,
                "input kinds (numerics/kda_inputs.hpp), each a variation of the anchor draw: anchor; long-memory (A_log 0, "
                "bias -12: decay ~3e-5 per token; beta_raw - 5: beta ~ 0.007); collinear-keys (one unit key per head + 1e-2 "
                "relative noise, no decay); collinear-keys-slow-decay (those keys, the long-memory gate); identical-keys "
                "(one key, no decay). beta follows --beta (the key kinds are hardest with --beta one)")
      ->delimiter(',')
      ->capture_default_str();
  a->add_option("--impl", o->impl,
                "implementations: float64, float32 (recurrences), float64-chunk, float32-chunk (chunked form, C), "
                "twin-bf16 (kernel twin), cuda-bf16 (GPU only)")->delimiter(',')->capture_default_str();
  a->add_option("--state-precision", o->state, "state storage formats of the twin/kernel rows: fp32, bf16")
      ->delimiter(',')
      ->capture_default_str();
  a->add_option("--matmul-precision", o->matmul,
                "matmul operand formats of the twin rows: plan (the CUDA kernel's plan: intra-chunk fp32, d_k x d_v "
                "products bf16), plan-hilo (the plan with both operands of Qg S and Kd^T D as bf16 hi + lo: "
                "kda_plan_state_hilo()), plan-accurate (the CUDA kernel's accurate precision: the d_k x d_v products "
                "with fp16 operands, Kd as fp16 hi + lo, values scaled: kda_plan_state_f16()), or bf16, fp16, tf32, "
                "fp32 for every product")
      ->delimiter(',')
      ->capture_default_str();
  a->add_option("--truth", o->truth,
                "truth: mp (cpp_bin_float_50), f64 (float64), f80 (long double), auto (mp while "
                "B*T*H*d_k*d_v <= --mp-max-work, f80 while <= --f80-max-work, f64 above)")
      ->capture_default_str();
  a->add_option("--mp-max-work", o->mp_max_work, "largest B*T*H*d_k*d_v whose truth --truth auto computes in mp50")
      ->capture_default_str();
  a->add_option("--f80-max-work", o->f80_max_work, "largest B*T*H*d_k*d_v whose truth --truth auto computes in long double")
      ->capture_default_str();
  a->add_option("--windows", o->windows, "number of windows along T for the error-growth columns (1..1024)")
      ->capture_default_str();
  a->add_flag("--backward", o->backward,
              "gradient parity: the backward of the recurrence (dq, dk, dv, dg, dbeta, dS0) in float64 and float32 "
              "(bf16-emu: the bf16 reference emulation, where the tree has numerics/plain_emulation.hpp) against the truth's backward; defaults --T 16,64,256 --dk 32 --dv 32 "
              "--impl float64,float32 --out results/parity_backward.h5 (--quick: --T 16,64); writes /parity_backward");

  // cli::run's order: the options (here, with --quick's defaults applied first), then --out; run does the work
  describe_quick(c, fmt::format("--T {}, --gate {}, --beta {}, --truth {}", fmt::join(kQuickT, ","),
                                 fmt::join(kQuickGate, ","), fmt::join(kQuickBeta, ","), kQuickTruth));
  c.check = [o](Context& ctx) {
    auto given = [&](const char* name) { return ctx.app->get_option(name)->count() > 0; };
    if (o->backward) {  // the gradient mode's own defaults; options given explicitly still win
      // options of the forward sweep that the gradient mode does not read: set to other than their default, they
      // would be ignored silently. At their default they are accepted (as bench's one-op options): a results file's
      // config records every option, so its --config replay gives them
      const ParityOptions def;
      for (const auto& [n, set] : {std::pair<const char*, bool>{"--C", o->C != def.C},
                                   {"--state-precision", o->state != def.state},
                                   {"--matmul-precision", o->matmul != def.matmul},
                                   {"--windows", o->windows != def.windows}})
        require(!set, std::string(n) + " has no effect with --backward (the gradient mode runs the recurrence's "
                                       "backward in float64 / float32 / bf16-emu, with no chunk size, state or "
                                       "matmul format, and no error windows); leave it out");
      if (!given("--T")) o->T = ctx.common.quick ? kBackwardQuickT : kBackwardT;
      if (!given("--dk")) o->dk = kBackwardD;
      if (!given("--dv")) o->dv = kBackwardD;
      if (!given("--impl")) o->impl = kBackwardImplDefault;
      if (!given("--out")) ctx.common.out = "results/parity_backward.h5";
    } else if (ctx.common.quick) {  // a small grid, float64 truth; options given explicitly still win
      if (!given("--T")) o->T = kQuickT;
      if (!given("--gate")) o->gate = kQuickGate;
      if (!given("--beta")) o->beta = kQuickBeta;
      if (!given("--truth")) o->truth = kQuickTruth;
    }
    // ---- validate everything before any work (a bad config writes no file) ----
    for (const auto* l : {&o->B, &o->T, &o->H, &o->dk, &o->dv, &o->C, &o->g_min})
      require(!l->empty(), "parity: an empty list was given; every grid axis needs at least one value");
    for (const auto* l : {&o->gate, &o->beta, &o->inputs, &o->impl, &o->state, &o->matmul})
      require(!l->empty(), "parity: an empty list was given; every grid axis needs at least one value");
    for (double x : o->B) as_count(x, "B");
    for (double x : o->T) as_count(x, "T");
    for (double x : o->H) as_count(x, "H");
    for (double x : o->dk) as_count(x, "dk");
    for (double x : o->dv) as_count(x, "dv");
    for (double x : o->C) as_count(x, "C");
    for (double x : o->g_min)
      require(std::isfinite(x) && x < 0, fmt::format("--g-min: {} is not accepted; give finite values < 0", x));
    o->gates.clear();
    for (const auto& s : o->gate) o->gates.push_back(parse_gate_kind(s, "--gate"));
    o->betas.clear();
    for (const auto& s : o->beta) o->betas.push_back(parse_beta_dist(s, "--beta"));
    o->input_kinds.clear();
    for (const auto& s : o->inputs) o->input_kinds.push_back(parse_input_kind(s, "--inputs"));
    for (const auto& s : o->impl)
      if (o->backward)
        require(std::find(kBackwardImpls.begin(), kBackwardImpls.end(), s) != kBackwardImpls.end(),
                "--impl: '" + s + "' is not an implementation of --backward; accepted with --backward: float64, float32, "
                "bf16-emu");
      else
        require(std::find(kImpls.begin(), kImpls.end(), s) != kImpls.end(),
                "--impl: '" + s + "' is unknown; accepted: float64, float32, float64-chunk, float32-chunk, twin-bf16, "
                "cuda-bf16");
    o->states.clear();
    for (const auto& s : o->state) {
      require(s == "fp32" || s == "bf16", "--state-precision: '" + s + "' is not accepted; accepted: fp32, bf16");
      o->states.push_back(parse_format(s, "--state-precision"));
    }
    for (const auto& s : o->matmul) {
      require(s != "fp64" && s != "float64",
              "--matmul-precision: '" + s + "' is not a tensor-core format; accepted: plan, plan-hilo, plan-accurate, bf16, fp16, tf32, fp32");
      require(s == "plan" || s == "plan-hilo" || s == "plan-accurate" || s == "bf16" || s == "fp16" || s == "tf32" || s == "fp32",
              "--matmul-precision: '" + s + "' is not accepted; accepted: plan, plan-hilo, plan-accurate, bf16, fp16, tf32, fp32");
    }
    // A repeated value in a list option (it would give duplicate rows) is refused by cli::run (require_once).
    // The float32 implementations compute the bounded gate g = g_min Sigmoid(...) in float32: a g_min beyond its
    // largest finite value would read as -inf there (reported as "tensor 'g' has a non-finite value").
    const bool float32_impl = std::any_of(o->impl.begin(), o->impl.end(),
                                          [](const std::string& s) { return s == "float32" || s == "float32-chunk"; });
    if (float32_impl && std::find(o->gates.begin(), o->gates.end(), GateKind::bounded) != o->gates.end())
      for (double x : o->g_min)
        require(x >= -static_cast<double>(std::numeric_limits<float>::max()),
                fmt::format("--g-min: {} is not accepted with --impl float32 / float32-chunk: the bounded gate "
                            "g = g_min Sigmoid(...) is computed in float32, whose largest finite magnitude is {:.6g}; "
                            "give {:.6g} <= g_min < 0", x, std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max()));
    const bool twin = std::find(o->impl.begin(), o->impl.end(), "twin-bf16") != o->impl.end();
    if (twin)
      for (double C : o->C)
        require(C <= 64, fmt::format("--C: {} is not accepted with the twin-bf16 implementation (1 <= C <= 64)", C));
    // options no row of the chosen implementations reads, set to other than their default, would be ignored silently
    // (at their default they are accepted, as --backward's: a results file's config records every option)
    if (!o->backward) {
      const ParityOptions def;
      for (const auto& [n, set, vals] :
           {std::tuple<const char*, bool, std::string>{"--state-precision", o->state != def.state,
                                                       fmt::format("{}", fmt::join(o->state, ","))},
            {"--matmul-precision", o->matmul != def.matmul, fmt::format("{}", fmt::join(o->matmul, ","))}})
        require(!set || twin, fmt::format("{} {} has no effect without --impl twin-bf16 (only the kernel twin's rows have "
                                          "a state and matmul format); add twin-bf16 to --impl, or leave the option out",
                                          n, vals));
      const bool chunked = std::any_of(o->impl.begin(), o->impl.end(), [](const std::string& s) {
        return s == "float64-chunk" || s == "float32-chunk" || s == "twin-bf16" || s == "cuda-bf16";
      });
      require(o->C == def.C || chunked,
              fmt::format("--C {} has no effect without a chunked implementation (float64-chunk, float32-chunk, "
                          "twin-bf16, cuda-bf16); add one to --impl, or leave the option out", fmt::join(o->C, ",")));
    }
    require(o->truth == "auto" || o->truth == "mp" || o->truth == "f64" || o->truth == "f80",
            "--truth: '" + o->truth + "' is unknown; accepted: auto, mp, f64, f80");
    require(o->mp_max_work > 0, fmt::format("--mp-max-work: {} must be > 0", o->mp_max_work));
    require(o->f80_max_work > 0, fmt::format("--f80-max-work: {} must be > 0", o->f80_max_work));
    require(o->windows >= 1 && o->windows <= 1024, fmt::format("--windows: {} is not in 1..1024", o->windows));
  };
  c.run = [o](Context& ctx) -> int {
    if (o->backward) return run_parity_backward(*o, ctx);
    const std::vector<GateKind>& gates = o->gates;
    const std::vector<BetaDist>& betas = o->betas;
    const std::vector<Format>& states = o->states;
    // exit 3 (docs/cli.md: "the work cannot run in this build or on this machine"), with the note that says why
    const auto not_available = [](const std::string& why) {
      fmt::print(stderr, "kdalab parity: not available in this build / on this machine: no implementation produced a "
                         "row ({}); nothing was written (exit 3)\n", why);
      return 3;
    };
    // cuda-bf16 alone where it cannot run: said before any truth is computed (otherwise `parity --impl cuda-bf16` on a
    // CPU build computes every point's truth, 15 s for one T = 300 point in mp, before it exits 3)
    if (std::all_of(o->impl.begin(), o->impl.end(), [](const std::string& s) { return s == "cuda-bf16"; }))
      if (const auto no = cuda_unavailable()) return not_available(*no);

    // ---- the grid of input points ----
    std::vector<KdaGenSpec> points;
    for (double B : o->B)
      for (double T : o->T)
        for (double H : o->H)
          for (double dk : o->dk)
            for (double dv : o->dv)
              for (GateKind g : gates)
                for (std::size_t gi = 0; gi < o->g_min.size(); ++gi) {
                  if (g == GateKind::softplus && gi > 0) continue;  // g_min only shapes the bounded gate
                  for (BetaDist b : betas)
                    for (InputKind ik : o->input_kinds) {
                      KdaGenSpec s;
                      s.B = as_count(B, "B"); s.T = as_count(T, "T"); s.H = as_count(H, "H");
                      s.d_k = as_count(dk, "dk"); s.d_v = as_count(dv, "dv");
                      s.gate = g; s.g_min = o->g_min[gi]; s.beta = b; s.inputs = ik; s.seed = ctx.common.seed;
                      points.push_back(s);
                    }
                }
    std::size_t per_point = 0;
    for (const auto& s : o->impl)
      per_point += (s == "float64" || s == "float32") ? 1 : (s == "twin-bf16" ? o->C.size() * states.size() * o->matmul.size()
                                                                              : o->C.size());
    const auto truth_kind = [&](const KdaGenSpec& s) {
      const double work = static_cast<double>(s.B * s.T * s.H * s.d_k * s.d_v);
      return o->truth != "auto" ? o->truth : (work <= o->mp_max_work ? "mp" : (work <= o->f80_max_work ? "f80" : "f64"));
    };
    std::vector<double> cost;
    for (const auto& s : points) cost.push_back(point_cost(s, truth_kind(s), per_point));
    const ShardPlan plan(ctx.shard, cost, kParityCostModel);
    std::size_t runs = 0;
    for (std::size_t p = 0; p < points.size(); ++p) runs += plan.runs(p) ? 1 : 0;
    const std::size_t total = runs * per_point;
    std::vector<std::int64_t> row_keys;

    Table t;
    point_columns(t, "index of the input grid point (inputs and truth shared by its rows)",
                  "named input generator (numerics/kda_inputs.hpp; anchor-kda: numerics/random.hpp)", "generator seed")
        .col("impl", 's', "1", "implementation: float64, float32, float64-chunk, float32-chunk, twin-bf16, cuda-bf16")
        .col("C", 'i', "1", "chunk size of a chunked implementation (0: not applicable, a recurrence)")
        .col("state_precision", 's', "1", "format the state is kept in")
        .col("matmul_precision", 's', "1",
             "operand format of the matmuls (plan: kda_plan_kernel(), kk/qk/solve/pd fp32, ws/qs/kd bf16; plan-hilo: "
             "kda_plan_state_hilo(), qs and kd with bf16 hi + lo operands; plan-accurate: kda_plan_state_f16(), ws/qs/kd "
             "fp16, Kd hi + lo, values scaled)")
        .col("out_format", 's', "1", "format o is delivered in")
        .col("truth", 's', "1", "the truth this row is measured against (scalar type of the reference recurrence)")
        .col("o_rel_rms", 'd', "1", "||o - o_truth||_2 / ||o_truth||_2 (metric of record)")
        .col("o_max_abs", 'd', "1", "max |o - o_truth|")
        .col("o_max_ulp_bf16", 'i', "1", "max distance in bf16 ulps between o and o_truth (both rounded to bf16)")
        .col("o_nan", 'i', "1", "NaN count of o").col("o_inf", 'i', "1", "Inf count of o")
        .col("S_rel_rms", 'd', "1", "relative RMS of the final state S [B, H, d_k, d_v]")
        .col("S_max_abs", 'd', "1", "max abs error of the final state")
        .col("S_max_ulp_bf16", 'i', "1", "max bf16-ulp distance of the final state")
        .col("S_nan", 'i', "1", "NaN count of S").col("S_inf", 'i', "1", "Inf count of S")
        .col("window", 'i', "1", "tokens per window of the error-along-T columns")
        .col("o_rel_rms_first_window", 'd', "1", "relative RMS of o over the first window of tokens")
        .col("o_rel_rms_last_window", 'd', "1", "relative RMS of o over the last window of tokens (NaN if o has NaN/Inf there)")
        .col("o_rel_rms_max_window", 'd', "1", "largest window relative RMS of o (NaN if any window is NaN)")
        .col("time_s", 'd', "s", "wall time of the implementation on this point")
        .col("truth_time_s", 'd', "s", "wall time of the truth on this point");
    Tensor<double> windows({total, static_cast<std::size_t>(o->windows)}, std::numeric_limits<double>::quiet_NaN());
    bool cuda_skipped_here = false;  // a cuda-bf16 row was skipped because this build / machine cannot run it
    // Notes collected once each and printed once, after the summary table (and kept in the file's `notes`); notes about
    // points merged per head: skipped chunked rows, one per (implementation, C) ("<impl> C=<C> skipped"), and rows
    // whose o or S holds NaN/Inf, one per (implementation, C, state precision, matmul precision) ("<impl> C=<C> (state
    // <st>, matmul <mm>) has NaN/Inf", the row's own columns, so a note matches its rows): NoteLog.
    NoteLog log;

    auto prog = ctx.progress("parity", total);
    std::size_t row = 0;
    for (std::size_t p = 0; p < points.size(); ++p) {
      if (!plan.runs(p)) continue;
      const KdaGenSpec& s = points[p];
      const KdaInputs in = kda_inputs(s);
      const std::string tk = truth_kind(s);
      const Truth tr = compute_truth(in, tk);
      const std::size_t win = std::max<std::size_t>(1, (s.T + static_cast<std::size_t>(o->windows) - 1) /
                                                           static_cast<std::size_t>(o->windows));
      const std::string label = fmt::format("T={} H={} {} {}{}", s.T, s.H, gate_kind_name(s.gate), beta_dist_name(s.beta),
                                            s.inputs == InputKind::anchor ? "" : " " + input_kind_name(s.inputs));
      auto record = [&](const std::string& impl, std::int64_t C, const std::string& st, const std::string& mm,
                        const ImplOut& r) {
        const ErrorMetrics mo = compare(r.o, tr.o, "o"), ms = compare(r.S, tr.S, "S");
        const auto w = rel_rms_windows(r.o, tr.o, s.B, s.T, win);
        for (std::size_t j = 0; j < w.size() && j < static_cast<std::size_t>(o->windows); ++j) windows(row, j) = w[j];
        const double wmax = nan_max(w);
        if (mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count > 0)
          log.point_note(fmt::format("{} C={} (state {}, matmul {}) has NaN/Inf", impl, C, st, mm), p, label,
                     fmt::format("o has {} NaN / {} Inf, S has {} NaN / {} Inf (recorded in the rows{})", mo.nan_count,
                                 mo.inf_count, ms.nan_count, ms.inf_count,
                                 C > 0 ? "; the factored chunk form overflows at this C and gate: see kdalab decay-range"
                                       : ""));
        std::string truth_name = tr.name;
        if (impl == "float64" && tk == "f64") truth_name += " (the same computation: 0 by construction)";
        t.row(point_row(p, in, s,
                        {impl, C, st, mm, r.out_format, truth_name, mo.rel_rms, mo.max_abs, mo.max_ulp_bf16,
                         mo.nan_count, mo.inf_count, ms.rel_rms, ms.max_abs, ms.max_ulp_bf16, ms.nan_count,
                         ms.inf_count, static_cast<std::int64_t>(win), w.front(), w.back(), wmax, r.seconds,
                         tr.seconds}));
        row_keys.push_back(static_cast<std::int64_t>(p));
        ++row;
      };
      for (const auto& impl : o->impl) {
        if (impl == "float64") {
          record(impl, 0, "fp64", "fp64", run_reference<double>(in, "fp64"));
          prog.tick(1, label + " " + impl);
        } else if (impl == "float32") {
          record(impl, 0, "fp32", "fp32", run_reference<float>(in, "fp32"));
          prog.tick(1, label + " " + impl);
        } else if (impl == "float64-chunk" || impl == "float32-chunk") {
          for (double C : o->C) {
            const std::size_t Cn = as_count(C, "C");
            const bool f64 = impl == "float64-chunk";
            bool ran = true;
            try {
              record(impl, static_cast<std::int64_t>(Cn), f64 ? "fp64" : "fp32", f64 ? "fp64" : "fp32",
                     f64 ? run_chunked<double>(in, Cn, "fp64") : run_chunked<float>(in, Cn, "fp32"));
            } catch (const Error& e) {  // factored decay span over the scalar type's limit
              log.point_note(fmt::format("{} C={} skipped", impl, Cn), p, label, e.what());
              ran = false;
            }
            prog.tick(1, ran ? label + " " + impl : std::string());  // a skipped row is counted, not named
          }
        } else if (impl == "twin-bf16") {
          for (double C : o->C)
            for (Format st : states)
              for (const std::string& mm : o->matmul) {
                record(impl, static_cast<std::int64_t>(C), format_name(st), mm,
                       run_twin(in, s.gate, as_count(C, "C"), st, mm));
                prog.tick(1, label + " " + impl);
              }
        } else {  // cuda-bf16
          for (double C : o->C) {
            std::string why;
            const auto r = run_cuda(in, s.gate, as_count(C, "C"), why, cuda_skipped_here);
            if (r)
              record(impl, static_cast<std::int64_t>(C), "fp32", "plan", *r);
            else
              log.note(p, why);
            // the progress line names only implementations that ran (a CPU build's line ended "[... cuda-bf16]")
            prog.tick(1, r ? label + " " + impl : std::string());
          }
        }
      }
    }
    prog.finish();
    const std::vector<std::string> notes = log.finish();
    // a shard whose points' rows were all skipped still writes its file, its notes saying why: merge needs every shard
    const bool no_rows = t.rows() == 0 && !plan.active();
    if (no_rows)  // the first note goes into the one-line error below; the others are printed here, once
      for (std::size_t i = 1; i < notes.size(); ++i) fmt::print(stderr, "parity: note: {}\n", notes[i]);
    if (no_rows && cuda_skipped_here)  // no row, and the cuda-bf16 rows could not run here: not bad input, exit 3
      return not_available(notes.empty() ? std::string("cuda-bf16") : notes.front());
    require(!no_rows, "parity: no implementation produced a row (" +
                          (notes.empty() ? std::string("empty grid") : notes.front()) + "); nothing was written");
    windows.shape[0] = t.rows();
    windows.data.resize(t.rows() * static_cast<std::size_t>(o->windows));

    // ---- summary: one row per implementation and precision ----
    const Table sum = parity_summary(t);
    fmt::print("\n{:<15}{:>7}{:>11}{:>6}{:>16}{:>16}{:>16}{:>16}\n", "impl", "state", "matmul", "rows", "o median rRMS",
               "o worst rRMS", "S median rRMS", "S worst rRMS");
    {
      const auto& si = std::get<std::vector<std::string>>(sum.column("impl").data);
      const auto& ss = std::get<std::vector<std::string>>(sum.column("state_precision").data);
      const auto& sm = std::get<std::vector<std::string>>(sum.column("matmul_precision").data);
      const auto& sr = std::get<std::vector<std::int64_t>>(sum.column("rows").data);
      const auto& c1 = std::get<std::vector<double>>(sum.column("o_rel_rms_median").data);
      const auto& c2 = std::get<std::vector<double>>(sum.column("o_rel_rms_worst").data);
      const auto& c3 = std::get<std::vector<double>>(sum.column("S_rel_rms_median").data);
      const auto& c4 = std::get<std::vector<double>>(sum.column("S_rel_rms_worst").data);
      for (std::size_t i = 0; i < sum.rows(); ++i)
        fmt::print("{:<15}{:>7}{:>11}{:>6}{:>16.3e}{:>16.3e}{:>16.3e}{:>16.3e}\n", si[i], ss[i], sm[i], sr[i], c1[i], c2[i],
                   c3[i], c4[i]);
    }
    for (const auto& n : notes) fmt::print("note: {}\n", n);

    auto f = ctx.open_results();
    f->group("parity", "numeric parity of KDA implementations against a high-precision truth on the same rounded inputs");
    f->write_table("parity/table", t);
    f->attr("parity/table", "description", "one row per grid point and implementation; every metric a column");
    f->write_table("parity/summary", sum);
    f->attr("parity/summary", "description", "median and worst relative RMS per implementation and precision");
    f->write_array("parity", "o_rel_rms_windows", windows, "1",
                   "relative RMS of o per window along T, one row per table row (NaN where T has fewer windows)");
    f->attr("parity", "notes", notes_text(notes));
    plan.record(*f, "parity");
    plan.mark_rows(*f, "parity/table", row_keys);
    plan.mark_rows(*f, "parity/o_rel_rms_windows", row_keys);
    if (plan.active()) f->attr("parity", "shard_note_events", log.events.dump());
    f->attr("parity", "truth_rule",
            "--truth " + o->truth +
                (o->truth == "auto" ? fmt::format(" (mp while B*T*H*d_k*d_v <= {}, f80 while <= {}, f64 above)",
                                                  o->mp_max_work, o->f80_max_work)
                                    : std::string()));
    f->commit();
    // rows the grid planned but did not run (a skipped implementation or chunk size): the notes above say why
    const std::size_t skipped = total > t.rows() ? total - t.rows() : 0;
    fmt::print("wrote {} ({} rows{})\n", ctx.common.out, t.rows(),
               skipped ? fmt::format("; {} of the {} planned skipped, the notes above say why", skipped, total)
                       : std::string());
    return 0;
  };
}

}  // namespace kdalab::cli
