// `kdalab golden`: golden fixtures, the regression files of the references' numbers.
//
// `kdalab golden --regen` writes data/golden/<op>.h5: small seeded inputs and the
// cpp_bin_float_50 outputs of each reference operation, stored as float64 (rounded once).
// `kdalab golden` (no --regen) recomputes every fixture with the current float64 code and
// compares (relative RMS <= tol::golden_f64 = 1e-13), and checks that the named generator still
// draws the stored raw inputs bit for bit. Exit 0: all pass; 1: a numerics change was caught;
// 2: a fixture is missing or malformed.
//
// Fixture layout: one group per case, /<case>/ with datasets
//   q_raw, k_raw [B, T, H, d_k]; v [B, T, H, d_v]; g_raw [B, T, H, d_k]; beta_raw [B, T, H];
//   A_log [H]; bias [H, d_k]; S0 [B, H, d_k, d_v] (raw: what a kernel reads, generator order);
//   q, k, g, beta (derived in float64: L2-normalised q, k; the gate; Sigmoid(beta_raw));
//   o [B, T, H, d_v], S_final [B, H, d_k, d_v] (the mp50 truth); o_<variant> for special cases;
// and attributes B, T, H, d_k, d_v, scale, seed, g_min (numbers), generator, gate, beta,
// has_S0 ("yes"/"no") (strings). Ops written now: kda_recurrent, kda_decode (T one-token steps
// from S0 through kda_step), kda_chunked (inputs + recurrent truth, attribute C = chunk sizes;
// reference/kda_chunk.hpp checked for every C with both 16x16 inverses).
// Layer-level fixtures (layouts in experiments/golden_fixtures.hpp): kda_layer (the full KDA layer,
// prefill and decode), mla (Gated MLA naive and absorbed, plus the absorbed query and attended latent
// that `kdalab check --op mla` reads), attn_res (full and block AttnRes), hybrid (data/configs/toy.json
// at T = 70). Every dataset is float64; a fixture dataset of another dtype, a dangling link or a missing
// case is refused with exit 2 (golden::read_f64).
#include <H5Cpp.h>
#include <fmt/format.h>

#include <filesystem>
#include <sstream>

#include "experiments/cli.hpp"
#include "experiments/golden_layers.hpp"
#include "reference/kda_decode.hpp"
#include "numerics/kda_inputs.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/error.hpp"
#include "reference/kda.hpp"
#include "reference/kda_chunk.hpp"

namespace kdalab::cli {

namespace {

struct GoldenCase {
  std::string name;
  KdaGenSpec spec;
  bool has_S0 = true;
  bool variants = false;  // also store o for the special cases
};

struct GoldenOp {
  std::string op, description;
  std::vector<GoldenCase> cases;
  std::string chunk_sizes;  // kda_chunked only
};

std::vector<GoldenOp> golden_ops() {
  KdaGenSpec a;  // anchor-kda, small
  a.B = 2; a.T = 37; a.H = 2; a.d_k = 32; a.d_v = 32; a.seed = 20261129;
  KdaGenSpec b = a;  // Kimi Linear gate, wide beta, d_v != d_k, no initial state
  b.B = 1; b.T = 33; b.d_k = 16; b.d_v = 24; b.gate = GateKind::softplus; b.beta = BetaDist::wide; b.seed = 7;
  KdaGenSpec d = a;  // decode: a few one-token steps from a given state
  d.T = 6; d.seed = 31;
  KdaGenSpec c = a;  // chunked: T not a multiple of 16 or 32
  c.B = 1; c.T = 41; c.seed = 41;
  KdaGenSpec c1 = c;  // chunked with beta = 1 and the unbounded gate (range stress)
  c1.gate = GateKind::softplus; c1.beta = BetaDist::one; c1.seed = 43;
  return {
      {"kda_recurrent", "KDA recurrence (K3 report Eq. 1), batched, mp50 truth",
       {{"anchor", a, true, true}, {"softplus_wide_dv24_noS0", b, false, false}}, ""},
      {"kda_decode", "KDA one-token decode steps from S0 (kda_step, K3 report Eq. 1), mp50 truth",
       {{"anchor_decode", d, true, false}}, ""},
      {"kda_chunked", "inputs for the chunked form (Kimi Linear sections 3-4) with the mp50 recurrent truth",
       {{"anchor_T41", c, true, false}, {"softplus_beta1_T41", c1, true, false}}, "1,16,32"},
  };
}

const std::vector<KdaVariant> kVariants{KdaVariant::gated_deltanet, KdaVariant::deltanet, KdaVariant::gla,
                                        KdaVariant::linear};

template <class S>
KdaOutput<S> run_op(const std::string& op, const KdaInputs& in, bool has_S0, KdaVariant var = KdaVariant::kda) {
  const Tensor<S> S0 = has_S0 ? in.S0.cast<S>() : Tensor<S>(in.S0.shape);
  if (op == "kda_decode")
    return kda_decode_steps<S>(in.q.cast<S>(), in.k.cast<S>(), in.v.cast<S>(), in.g.cast<S>(), in.beta.cast<S>(), S0,
                           static_cast<S>(in.scale));
  return kda_recurrent<S>(in.q.cast<S>(), in.k.cast<S>(), in.v.cast<S>(), in.g.cast<S>(), in.beta.cast<S>(),
                          has_S0 ? &S0 : nullptr, static_cast<S>(in.scale), var);
}

void regen(const std::string& dir, const Context& ctx) {
  for (const auto& op : golden_ops()) {
    const std::string path = dir + "/" + op.op + ".h5";
    ResultsFile f(path, ctx.common.force, RunInfo{ctx.command_line, ctx.config.dump(), "per case"});
    f.attr("/", "op", op.op);
    f.attr("/", "description", op.description);
    if (!op.chunk_sizes.empty()) f.attr("/", "C", op.chunk_sizes);
    std::string cases;
    for (const auto& c : op.cases) {
      cases += (cases.empty() ? "" : ",") + c.name;
      const KdaInputs in = kda_inputs(c.spec);
      const KdaOutput<mp50> t = run_op<mp50>(op.op, in, c.has_S0);
      const std::string g = c.name;
      f.group(g, "golden case " + c.name + " (" + in.generator + ")");
      auto put = [&](const std::string& n, const Tensor<double>& x, const std::string& d) { f.write_array(g, n, x, "1", d); };
      put("q_raw", in.q_raw, "raw q (bf16 values) [B, T, H, d_k]");
      put("k_raw", in.k_raw, "raw k (bf16 values) [B, T, H, d_k]");
      put("v", in.v, "v (bf16 values) [B, T, H, d_v]");
      put("g_raw", in.g_raw, "gate logits (bf16 values) [B, T, H, d_k]");
      put("beta_raw", in.beta_raw, "beta logits (bf16 values) [B, T, H]");
      put("A_log", in.A_log, "per-head log-scale of the gate [H]");
      put("bias", in.bias, "gate bias (dt_bias for softplus) [H, d_k]");
      put("S0", in.S0, "initial state (fp32 values) [B, H, d_k, d_v], KV layout; used only when has_S0 = yes");
      put("q", in.q, "L2-normalised q (float64) [B, T, H, d_k]");
      put("k", in.k, "L2-normalised k (float64) [B, T, H, d_k]");
      put("g", in.g, "log-decay g (float64) [B, T, H, d_k]");
      put("beta", in.beta, "beta = Sigmoid(beta_raw) (float64) [B, T, H]");
      put("o", t.o.cast<double>(), "output o: cpp_bin_float_50 truth rounded once to float64 [B, T, H, d_v]");
      put("S_final", t.S_final.cast<double>(), "final state: mp50 truth rounded to float64 [B, H, d_k, d_v]");
      if (c.variants)
        for (KdaVariant v : kVariants)
          put("o_" + variant_name(v), run_op<mp50>(op.op, in, c.has_S0, v).o.cast<double>(),
              "output o of the " + variant_name(v) + " special case (mp50 truth)");
      for (auto [n, x] : std::initializer_list<std::pair<const char*, double>>{
               {"B", double(in.B)}, {"T", double(in.T)}, {"H", double(in.H)}, {"d_k", double(in.d_k)},
               {"d_v", double(in.d_v)}, {"scale", in.scale}, {"seed", double(in.seed)}, {"g_min", in.g_min}})
        f.attr(g, n, x);
      f.attr(g, "generator", in.generator);
      f.attr(g, "gate", gate_kind_name(c.spec.gate));
      f.attr(g, "beta", beta_dist_name(c.spec.beta));
      f.attr(g, "has_S0", c.has_S0 ? "yes" : "no");
      f.attr(g, "variants", c.variants ? "yes" : "no");
    }
    f.attr("/", "cases", cases);
    f.commit();
    fmt::print("wrote {} ({} KiB)\n", path, std::filesystem::file_size(path) / 1024);
  }
}

/// Checks one fixture file; returns the number of failed comparisons. Prints one line per check.
int check_file(const std::string& path, const GoldenOp& op) {
  int failed = 0;
  auto line = [&](const std::string& what, double err, double tol) {
    const bool ok = err <= tol;
    if (!ok) ++failed;
    fmt::print("{:<4} {:<58} rel RMS {:9.2e} (tol {:.0e})\n", ok ? "ok" : "FAIL", what, err, tol);
  };
  for (const auto& c : op.cases) {
    const std::string g = "/" + c.name;
    require(h5read::exists(path, g), "golden file '" + path + "' has no case '" + c.name + "'; regenerate with --regen");
    KdaInputs in = kda_inputs(c.spec);
    // the generator must still draw the stored raw inputs exactly
    std::string drifted;
    for (auto [n, x] : std::initializer_list<std::pair<const char*, const Tensor<double>*>>{
             {"q_raw", &in.q_raw}, {"k_raw", &in.k_raw}, {"v", &in.v}, {"g_raw", &in.g_raw}, {"beta_raw", &in.beta_raw},
             {"A_log", &in.A_log}, {"bias", &in.bias}, {"S0", &in.S0}}) {
      const Tensor<double> st = golden::read_f64(path, g + "/" + n);
      require(st.shape == x->shape, "golden '" + path + "' " + g + "/" + n + " has shape " + shape_str(st.shape) +
                                        ", the generator gives " + shape_str(x->shape));
      if (st.data != x->data) drifted += std::string(drifted.empty() ? "" : ",") + n;
    }
    line(op.op + g + " raw inputs == generator (bit-exact)" + (drifted.empty() ? "" : ": differ in " + drifted),
         drifted.empty() ? 0.0 : 1.0, 0.0);
    // derived inputs in float64 (libm may differ by an ulp between machines: relative 1e-15)
    for (auto [n, x] : std::initializer_list<std::pair<const char*, const Tensor<double>*>>{
             {"q", &in.q}, {"k", &in.k}, {"g", &in.g}, {"beta", &in.beta}})
      line(op.op + g + "/" + n + " (derived) vs stored", rel_rms(x->data, golden::read_f64(path, g + "/" + n).data),
           tol::golden_mp.value * 10);
    // outputs: the current float64 code on the stored derived inputs vs the stored mp50 truth
    in.q = golden::read_f64(path, g + "/q");
    in.k = golden::read_f64(path, g + "/k");
    in.g = golden::read_f64(path, g + "/g");
    in.beta = golden::read_f64(path, g + "/beta");
    if (op.op == "kda_chunked") {  // the chunked form for every stored C vs the recurrent mp50 truth
      std::stringstream cs(op.chunk_sizes);
      std::string tok;
      while (std::getline(cs, tok, ',')) {
        ChunkOptions opt;
        opt.C = static_cast<std::size_t>(std::stoul(tok));
        opt.tile = 16;
        for (TriInverse inv : {TriInverse::forward_substitution, TriInverse::neumann}) {
          opt.inverse = inv;
          const KdaOutput<double> r = kda_chunked<double>(in.q, in.k, in.v, in.g, in.beta, c.has_S0 ? &in.S0 : nullptr,
                                                          in.scale, opt);
          const std::string w = op.op + g + "/o C=" + tok + " " + tri_inverse_name(inv);
          line(w, rel_rms(r.o.data, golden::read_f64(path, g + "/o").data), tol::golden_f64.value);
          line(op.op + g + "/S_final C=" + tok + " " + tri_inverse_name(inv),
               rel_rms(r.S_final.data, golden::read_f64(path, g + "/S_final").data), tol::golden_f64.value);
        }
      }
      continue;
    }
    const KdaOutput<double> r = run_op<double>(op.op, in, c.has_S0);
    line(op.op + g + "/o (float64 now vs mp50 then)", rel_rms(r.o.data, golden::read_f64(path, g + "/o").data),
         tol::golden_f64.value);
    line(op.op + g + "/S_final", rel_rms(r.S_final.data, golden::read_f64(path, g + "/S_final").data), tol::golden_f64.value);
    if (c.variants)
      for (KdaVariant v : kVariants)
        line(op.op + g + "/o_" + variant_name(v),
             rel_rms(run_op<double>(op.op, in, c.has_S0, v).o.data, golden::read_f64(path, g + "/o_" + variant_name(v)).data),
             tol::golden_f64.value);
  }
  return failed;
}

/// The message for a fixture that is not there: --dir is relative to the working directory, so the usual
/// cause is running from outside the repository root (regenerating there would write fixtures elsewhere).
std::string missing_fixture(const std::string& path) {
  return "golden file '" + path + "' is missing (--dir is relative to the working directory, " +
         std::filesystem::current_path().string() + "): run kdalab from the repository root or give --dir " +
         "<repo>/data/golden; only if the fixture really is new, create it with 'kdalab golden --regen' and commit data/golden/";
}

}  // namespace

/// What a fixture path that is a FIFO, device or socket is asked to be (cli::require_regular_input's GIVE).
constexpr const char* kGoldenFile =
    "a golden HDF5 file (move it away and restore the fixture, e.g. 'git checkout data/golden' or 'kdalab golden --regen "
    "--force')";

/// The body of `kdalab golden` (--regen or the check); see the file comment for the exit codes.
int run_golden(bool regen_flag, const std::string& dir_name, Context& ctx);

void register_golden(Registry& reg) {
  auto& c = reg.add("golden",
                    "Golden fixtures: check the current code against data/golden/*.h5 (exit 0 all pass, 1 a numerics "
                    "change was caught, 2 a fixture is missing or malformed), or with --regen rewrite them from the "
                    "cpp_bin_float_50 reference. Ops: kda_recurrent, kda_decode, kda_chunked, kda_layer, mla (naive and "
                    "absorbed), attn_res (full and block), hybrid (data/configs/toy.json).",
                    "");
  c.writes_output = false;
  c.app->get_option("--out")->description("unused by golden (the fixtures go to --dir)");
  c.app->get_option("--seed")->description("no effect for golden (each fixture's inputs come from its own fixed seed, "
                                           "recorded in the fixture file)");
  c.app->get_option("--quick")->description("no effect for golden (the check always runs every fixture in full)");
  c.app->get_option("--quiet")->description("no effect for golden (it prints one line per check and a verdict)");
  c.app->get_option("--force")->description("with --regen: overwrite existing fixture files in --dir (no effect on the check)");
  auto regen_flag = std::make_shared<bool>(false);
  auto dir = std::make_shared<std::string>("data/golden");
  c.app->add_flag("--regen", *regen_flag, "rewrite data/golden/*.h5 from the cpp_bin_float_50 reference (existing files need --force)");
  c.app->add_option("--dir", *dir, "folder of the golden files")->capture_default_str();
  c.run = [regen_flag, dir](Context& ctx) -> int {
    try {
      return run_golden(*regen_flag, *dir, ctx);
    } catch (const H5::Exception& e) {  // a broken fixture (dangling link, bad object): bad input, exit 2
      throw Error("golden: HDF5 error in a fixture under '" + *dir + "': " + e.getDetailMsg() +
                  "; regenerate with 'kdalab golden --regen --force'");
    }
  };
}

/// Runs `check` on fixture `path`; an error inside (it names only the tensor) is rethrown naming the file.
template <class F>
void naming_fixture(const std::string& path, F&& check) {
  try {
    check();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind("golden file '" + path + "'", 0) == 0) throw;  // it names the file already (and says what to do)
    throw Error("golden file '" + path + "': " + what + "; regenerate with 'kdalab golden --regen --force' if the file was damaged");
  }
}

int run_golden(bool regen_flag, const std::string& dir_name, Context& ctx) {
  const std::string* dir = &dir_name;
  {
    require(!dir->empty(), "--dir: an empty folder name is not accepted (default data/golden)");
    if (regen_flag) {
      // Existing fixtures are replaced only with --force (checked for all before any is rewritten).
      std::vector<std::string> names;
      for (const auto& op : golden_ops()) names.push_back(op.op);
      for (const auto& op : golden::layer_ops()) names.push_back(op.op);
      for (const auto& n : names) {
        const std::string path = *dir + "/" + n + ".h5";
        // before any is rewritten: every target must be replaceable (a folder or other non-file under a fixture's
        // name would otherwise stop the regeneration half-way); said first, with or without --force (otherwise a
        // folder would be reported as "exists; pass --force", which then fails on the folder)
        const auto st = std::filesystem::status(path);  // follows a symlink; a missing file is not_found
        require(!std::filesystem::exists(st) || std::filesystem::is_regular_file(st),
                "golden file '" + path + "' is " +
                    (std::filesystem::is_directory(st) ? "a folder" : "a FIFO, device or socket") +
                    ", not a regular file; move it away (--force replaces only files); nothing was rewritten");
        require(ctx.common.force || !std::filesystem::exists(st),
                "golden file '" + path + "' exists; pass --force with --regen to rewrite the fixtures");
      }
      std::filesystem::create_directories(*dir);
      regen(*dir, ctx);
      for (const auto& op : golden::layer_ops()) {
        const std::string path = *dir + "/" + op.op + ".h5";
        ResultsFile f(path, ctx.common.force, RunInfo{ctx.command_line, ctx.config.dump(), "per case"});
        f.attr("/", "op", op.op);
        f.attr("/", "description", op.description);
        f.attr("/", "cases", op.cases);
        op.regen(f);
        f.commit();
        fmt::print("wrote {} ({} KiB)\n", path, std::filesystem::file_size(path) / 1024);
      }
      std::uintmax_t total = 0;
      for (const auto& e : std::filesystem::directory_iterator(*dir))
        if (e.path().extension() == ".h5") total += e.file_size();
      fmt::print("golden files in {}: {:.2f} MB in all (limit 5 MB)\n", *dir, static_cast<double>(total) / 1e6);
      require(total < 5'000'000, fmt::format("golden files total {} bytes, over the 5 MB limit", total));
      return 0;
    }
    // every fixture is there and a regular file before any is checked: a missing last fixture, or a folder under a
    // fixture's name, is reported first, not after ~100 "ok" lines of the others
    {
      std::vector<std::string> names;
      for (const auto& op : golden_ops()) names.push_back(op.op);
      for (const auto& op : golden::layer_ops()) names.push_back(op.op);
      for (const auto& n : names) {
        const std::string path = *dir + "/" + n + ".h5";
        require(std::filesystem::exists(path), missing_fixture(path));
        require(!std::filesystem::is_directory(path), "golden file '" + path + "' is a folder; give " + kGoldenFile);
        require_regular_input("golden file", path, kGoldenFile);
      }
    }
    int failed = 0;
    for (const auto& op : golden_ops()) {
      const std::string path = *dir + "/" + op.op + ".h5";
      require(std::filesystem::exists(path),
              missing_fixture(path));
      require_regular_input("golden file", path, kGoldenFile);  // a FIFO blocked HDF5's open forever
      naming_fixture(path, [&] { failed += check_file(path, op); });
    }
    for (const auto& op : golden::layer_ops()) {
      const std::string path = *dir + "/" + op.op + ".h5";
      require(std::filesystem::exists(path),
              missing_fixture(path));
      require_regular_input("golden file", path, kGoldenFile);  // a FIFO blocked HDF5's open forever
      const std::string cases = h5read::attr_string(path, "/", "cases");
      require(cases == op.cases, "golden file '" + path + "' holds the cases '" + cases + "', this build expects '" +
                                     op.cases + "'; regenerate with 'kdalab golden --regen --force'");
      naming_fixture(path, [&] {
        op.check(path, [&](const std::string& what, double err, double tol) {
          const bool ok = err <= tol;
          if (!ok) ++failed;
          fmt::print("{:<4} {:<58} rel RMS {:9.2e} (tol {:.0e})\n", ok ? "ok" : "FAIL", what, err, tol);
        });
      });
    }
    fmt::print("golden: {}\n", failed ? fmt::format("{} check(s) FAILED: the numerics changed", failed) : "all checks pass");
    return failed ? 1 : 0;
  }
}

}  // namespace kdalab::cli
