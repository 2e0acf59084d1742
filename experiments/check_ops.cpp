// The operations of `kdalab check` (declared in experiments/check_ops.hpp): for each --op, read_input
// (kda, kda-decode, kda-bwd), read_mla and read_attn_res validate an input file (every malformed file is a one-line
// error, exit 2), the truth is computed in cpp_bin_float_50 (mp) or float64 (f64), the plain emulation at the
// declared precision is attached to every candidate, and the candidates with their truths are returned.
// --kernel (--op kda, CUDA build + GPU) also runs kdalab's prefill kernel (kernels/kda.hpp) on the file's
// inputs and reports its o and S as candidates o_kdalab, S_kdalab beside the file's own.
// Formats, the truth rule and the exit codes: docs/check-format.md.
#include "experiments/check_ops.hpp"

#include <H5Cpp.h>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <map>
#include <functional>
#include <optional>
#include <set>
#include "experiments/cli.hpp"
#ifdef KDALAB_HAVE_CUDA
#include <cuda_runtime.h>
#include "experiments/gpu_exp.hpp"
#endif
#include "numerics/bf16.hpp"
#include "numerics/budget.hpp"
#include "numerics/check_ops.hpp"
#include "numerics/plain_emulation.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/error.hpp"
#include "reference/attn_res.hpp"
#include "reference/kda.hpp"

namespace kdalab::cli::check_detail {

namespace {

/// The truth must be finite before it is compared or written: float64 overflows on huge inputs
/// (inf - inf in the softmax max subtraction) and 0/0 appears with eps = 0 on an all-zero source.
void require_finite_truth(const Tensor<double>& t, const std::string& name, const std::string& truth, const std::string& hint) {
  for (std::size_t i = 0; i < t.numel(); ++i)
    require(std::isfinite(t.data[i]), "the " + truth + " truth of '" + name + "' is not finite at flat index " +
                                          std::to_string(i) + " (value " + fmt::format("{}", t.data[i]) + "); " + hint +
                                          "; nothing was written");
}

/// Everything read from the input file, validated.
struct CheckInput {
  std::size_t B = 0, T = 0, H = 0, HV = 0, d_k = 0, d_v = 0;
  Tensor<double> q, k, v, g, beta, S0, A_log, bias, o_cand, S_cand;
  bool has_S0 = false, has_o = false, has_S = false, l2norm = false, beta_logits = false;
  KdaGateKind gate = KdaGateKind::none;
  double scale = 0, g_min = 0;
  std::string S0_layout, S_layout, o_format = "fp32", S_format = "fp32";
};

/// [B, H, X, Y] -> [B, H, Y, X]
Tensor<double> swap_last(const Tensor<double>& t) {
  Tensor<double> r({t.dim(0), t.dim(1), t.dim(3), t.dim(2)});
  for (std::size_t b = 0; b < t.dim(0); ++b)
    for (std::size_t h = 0; h < t.dim(1); ++h)
      for (std::size_t i = 0; i < t.dim(2); ++i)
        for (std::size_t j = 0; j < t.dim(3); ++j) r(b, h, j, i) = t(b, h, i, j);
  return r;
}

/// Every input value must be finite: the error names the tensor, the value and its flat index.
void require_finite(InFile& f, const std::string& name, const Tensor<double>& t) {
  for (std::size_t i = 0; i < t.numel(); ++i)
    require(std::isfinite(t.data[i]), f.where() + ": dataset '" + name + "' holds " + fmt::format("{}", t.data[i]) +
                                          " at flat index " + std::to_string(i) + "; every input value must be finite");
}

std::string layout_of(InFile& f, const std::string& name) {
  auto l = f.attr_str(name, "layout");
  if (!l) l = f.attr_str("/", "layout");
  require(l.has_value(), f.where() + ": dataset '" + name +
                             "' has no attribute layout; give layout = \"KV\" ([B, HV, d_k, d_v]) or \"VK\" "
                             "([B, HV, d_v, d_k]) on the dataset or the file root");
  require(*l == "KV" || *l == "VK",
          f.where() + ": attribute layout of '" + name + "' = '" + *l + "' is unknown; accepted: KV, VK");
  return *l;
}

CheckInput read_input(const std::string& path, const std::string& op) {
  InFile f(path);
  CheckInput c;
  c.q = f.read("q", 4, "q [B, T, H, d_k]");
  c.B = c.q.dim(0); c.T = c.q.dim(1); c.H = c.q.dim(2); c.d_k = c.q.dim(3);
  require(f.has("k") || !f.has("c"), f.where() + ": dataset 'k' is missing and the file has a latent cache 'c': it "
                                                 "looks like an --op mla input; give --op mla (--op " + op + " needs q, k, v, g, beta)");
  c.k = f.read("k", 4, "k [B, T, H, d_k]");
  require(c.k.shape == c.q.shape, f.where() + ": dataset 'k' has shape " + shape_str(c.k.shape) +
                                      ", q has " + shape_str(c.q.shape) + "; they must agree");
  c.v = f.read("v", 4, "v [B, T, HV, d_v]");
  c.HV = c.v.dim(2); c.d_v = c.v.dim(3);
  require(c.v.dim(0) == c.B && c.v.dim(1) == c.T, f.where() + ": dataset 'v' has shape " + shape_str(c.v.shape) +
                                                       "; its B, T must equal q's " + shape_str(c.q.shape));
  require(c.B * c.T * c.H * c.d_k * c.HV * c.d_v > 0, f.where() + ": q or v has an empty dimension");
  require(c.HV % c.H == 0, f.where() + ": v has HV = " + std::to_string(c.HV) + " heads, not a multiple of q's H = " +
                               std::to_string(c.H));
  c.g = f.read("g", 4, "g [B, T, HV, d_k]");
  require(c.g.shape == std::vector<std::size_t>{c.B, c.T, c.HV, c.d_k},
          f.where() + ": dataset 'g' has shape " + shape_str(c.g.shape) + ", expected " +
              shape_str({c.B, c.T, c.HV, c.d_k}) + " [B, T, HV, d_k]");
  c.beta = f.read("beta", 3, "beta [B, T, HV]");
  require(c.beta.shape == std::vector<std::size_t>{c.B, c.T, c.HV},
          f.where() + ": dataset 'beta' has shape " + shape_str(c.beta.shape) + ", expected " +
              shape_str({c.B, c.T, c.HV}) + " [B, T, HV]");
  // attributes
  const auto scale = f.attr_num("/", "scale");
  require(scale.has_value(), f.where() + ": root attribute 'scale' is missing (the output scale, e.g. d_k^-1/2 = " +
                                 fmt::format("{:.6g}", 1.0 / std::sqrt(static_cast<double>(c.d_k))) + ")");
  require(std::isfinite(*scale) && *scale > 0, f.where() + ": attribute scale = " + fmt::format("{}", *scale) +
                                                   " is not accepted; give a finite scale > 0 (usually d_k^-1/2)");
  c.scale = *scale;
  const auto l2 = f.attr_num("/", "l2norm_qk");
  require(l2.has_value(), f.where() + ": root attribute 'l2norm_qk' is missing (1: kdalab L2-normalises q and k per "
                                      "head first, as the kernel does; 0: q and k are used as given)");
  require(*l2 == 0 || *l2 == 1, f.where() + ": attribute l2norm_qk must be 0 or 1 (or a bool)");
  c.l2norm = *l2 == 1;
  const std::string gate = f.attr_str("/", "gate").value_or("none");
  if (gate == "none") {
    c.gate = KdaGateKind::none;
  } else if (gate == "k3" || gate == "softplus") {
    c.gate = gate == "k3" ? KdaGateKind::k3 : KdaGateKind::softplus;
    const std::string bias_name = gate == "k3" ? "bias" : "dt_bias";
    c.A_log = f.read("A_log", 1, "A_log [HV] (gate = \"" + gate + "\" needs it)");
    require(c.A_log.dim(0) == c.HV, f.where() + ": dataset 'A_log' has shape " + shape_str(c.A_log.shape) +
                                        ", expected [" + std::to_string(c.HV) + "] = [HV]");
    c.bias = f.read(bias_name, 2, bias_name + " [HV, d_k] (gate = \"" + gate + "\" needs it)");
    require(c.bias.shape == std::vector<std::size_t>{c.HV, c.d_k},
            f.where() + ": dataset '" + bias_name + "' has shape " + shape_str(c.bias.shape) + ", expected " +
                shape_str({c.HV, c.d_k}) + " [HV, d_k]");
    if (c.gate == KdaGateKind::k3) {
      const auto gm = f.attr_num("/", "g_min");
      require(gm.has_value(), f.where() + ": gate = \"k3\" needs the root attribute 'g_min' (K3: -5)");
      require(std::isfinite(*gm) && *gm < 0, f.where() + ": attribute g_min = " + fmt::format("{}", *gm) +
                                                 " is not accepted; give a finite g_min < 0");
      c.g_min = *gm;
    }
  } else {
    throw Error(f.where() + ": root attribute gate = '" + gate +
                "' is unknown; accepted: none (g is the log-decay), k3, softplus");
  }
  const std::string beta = f.attr_str("/", "beta").value_or("values");
  require(beta == "values" || beta == "logits",
          f.where() + ": root attribute beta = '" + beta + "' is unknown; accepted: values, logits");
  c.beta_logits = beta == "logits";
  if (!c.beta_logits)
    for (std::size_t i = 0; i < c.beta.numel(); ++i)
      require(c.beta.data[i] >= 0 && c.beta.data[i] <= 1,
              f.where() + ": dataset 'beta' has " + fmt::format("{}", c.beta.data[i]) + " at flat index " +
                  std::to_string(i) + ", outside [0, 1]; for logits set the root attribute beta = \"logits\"");
  // states
  const std::vector<std::size_t> kv{c.B, c.HV, c.d_k, c.d_v}, vk{c.B, c.HV, c.d_v, c.d_k};
  if (f.has("S0")) {
    c.S0_layout = layout_of(f, "S0");
    c.S0 = f.read("S0", 4, "S0 [B, HV, d_k, d_v] (layout KV) or [B, HV, d_v, d_k] (layout VK)");
    const auto& want = c.S0_layout == "KV" ? kv : vk;
    require(c.S0.shape == want, f.where() + ": dataset 'S0' has shape " + shape_str(c.S0.shape) + ", layout " +
                                    c.S0_layout + " expects " + shape_str(want));
    if (c.S0_layout == "VK") c.S0 = swap_last(c.S0);
    c.has_S0 = true;
  }
  require(op != "kda-decode" || c.has_S0, f.where() + ": --op kda-decode needs the initial state S0 (decode steps "
                                                      "continue from a state); use --op kda for a prefill from zero");
  if (f.has("o")) {
    c.o_cand = f.read("o", 4, "o [B, T, HV, d_v]");
    require(c.o_cand.shape == std::vector<std::size_t>{c.B, c.T, c.HV, c.d_v},
            f.where() + ": candidate 'o' has shape " + shape_str(c.o_cand.shape) + ", expected " +
                shape_str({c.B, c.T, c.HV, c.d_v}) + " [B, T, HV, d_v]");
    c.has_o = true;
    c.o_format = f.format_of("o");
  }
  if (f.has("S")) {
    c.S_layout = layout_of(f, "S");
    c.S_cand = f.read("S", 4, "S [B, HV, d_k, d_v] (layout KV) or [B, HV, d_v, d_k] (layout VK)");
    const auto& want = c.S_layout == "KV" ? kv : vk;
    require(c.S_cand.shape == want, f.where() + ": candidate 'S' has shape " + shape_str(c.S_cand.shape) +
                                        ", layout " + c.S_layout + " expects " + shape_str(want));
    if (c.S_layout == "VK") c.S_cand = swap_last(c.S_cand);
    c.has_S = true;
    c.S_format = f.format_of("S");
  }
  const std::string bias_name = c.gate == KdaGateKind::softplus ? "dt_bias" : "bias";
  for (auto [n, p] : std::initializer_list<std::pair<std::string, const Tensor<double>*>>{
           {"q", &c.q}, {"k", &c.k}, {"v", &c.v}, {"g", &c.g}, {"beta", &c.beta}, {"A_log", &c.A_log},
           {bias_name, &c.bias}, {"S0", &c.S0}})
    require_finite(f, n, *p);
  return c;
}

// ---- --op mla: the absorbed attention over a latent cache (kernels/mla.hpp's operation) ----------

/// Inputs of --op mla, validated (docs/check-format.md, --op mla).
struct MlaInput {
  std::size_t B = 0, T = 0, H = 0, N = 0, d_c = 0, d_rope = 0;
  Tensor<double> q, c, q_rope, k_rope, o_cand;
  double scale = 0;
  bool has_o = false;
  std::string o_format = "fp32";
};

MlaInput read_mla(const std::string& path) {
  InFile f(path);
  MlaInput m;
  m.q = f.read("q", 4, "q [B, T, H, d_c] (the absorbed query q~_i = W_UK,i^T q^C_i)");
  m.B = m.q.dim(0); m.T = m.q.dim(1); m.H = m.q.dim(2); m.d_c = m.q.dim(3);
  m.c = f.read("c", 3, "c [B, N, d_c] (the latent cache)");
  m.N = m.c.dim(1);
  require(m.c.dim(0) == m.B && m.c.dim(2) == m.d_c,
          f.where() + ": dataset 'c' has shape " + shape_str(m.c.shape) + "; expected [B, N, d_c] with B = " +
              std::to_string(m.B) + " and d_c = " + std::to_string(m.d_c) + " from q " + shape_str(m.q.shape));
  require(m.B * m.T * m.H * m.d_c > 0, f.where() + ": q has an empty dimension");
  require(m.N >= m.T, f.where() + ": c holds N = " + std::to_string(m.N) + " tokens, fewer than the T = " +
                          std::to_string(m.T) + " queries; query t sits at position N - T + t, so N >= T is needed");
  const bool qr = f.has("q_rope"), kr = f.has("k_rope");
  require(qr == kr, f.where() + ": dataset '" + std::string(qr ? "q_rope" : "k_rope") + "' is given without '" +
                        (qr ? "k_rope" : "q_rope") + "'; the decoupled-RoPE part needs both (or neither)");
  if (qr) {
    m.q_rope = f.read("q_rope", 4, "q_rope [B, T, H, d_rope]");
    m.d_rope = m.q_rope.dim(3);
    require(m.q_rope.shape == std::vector<std::size_t>{m.B, m.T, m.H, m.d_rope},
            f.where() + ": dataset 'q_rope' has shape " + shape_str(m.q_rope.shape) + ", expected [B, T, H, d_rope] = " +
                shape_str({m.B, m.T, m.H, m.d_rope}));
    m.k_rope = f.read("k_rope", 3, "k_rope [B, N, d_rope]");
    require(m.k_rope.shape == std::vector<std::size_t>{m.B, m.N, m.d_rope},
            f.where() + ": dataset 'k_rope' has shape " + shape_str(m.k_rope.shape) + ", expected [B, N, d_rope] = " +
                shape_str({m.B, m.N, m.d_rope}));
  }
  const auto scale = f.attr_num("/", "scale");
  require(scale.has_value(), f.where() + ": root attribute 'scale' is missing (the softmax scale 1/sqrt(d_nope + "
                                         "d_rope) of the layer; it cannot be derived from q~)");
  require(std::isfinite(*scale) && *scale > 0,
          f.where() + ": attribute scale = " + fmt::format("{}", *scale) + " is not accepted; give a finite scale > 0");
  m.scale = *scale;
  if (f.has("o")) {
    m.o_cand = f.read("o", 4, "o [B, T, H, d_c] (the attended latent)");
    require(m.o_cand.shape == m.q.shape, f.where() + ": candidate 'o' has shape " + shape_str(m.o_cand.shape) +
                                             ", expected [B, T, H, d_c] = " + shape_str(m.q.shape));
    m.has_o = true;
    m.o_format = f.format_of("o");
  }
  for (auto [n, p] : std::initializer_list<std::pair<const char*, const Tensor<double>*>>{
           {"q", &m.q}, {"c", &m.c}, {"q_rope", &m.q_rope}, {"k_rope", &m.k_rope}})
    require_finite(f, n, *p);
  return m;
}

// ---- --op attn-res: softmax attention over depth (reference/attn_res.hpp) -----------------------

/// Inputs of --op attn-res, validated (docs/check-format.md, --op attn-res).
struct AttnResInput {
  std::size_t N = 0, T = 0, d = 0, block_sources = 1;
  Tensor<double> v, w, h_cand;
  ResidualMode mode = ResidualMode::full;
  double eps = 0;
  bool has_h = false;
  std::string h_format = "fp32";
};

AttnResInput read_attn_res(const std::string& path) {
  InFile f(path);
  AttnResInput a;
  a.v = f.read("v", 3, "v [N, T, d] (the sources: v_0 = h_1 the embedding, then the sublayer outputs in order)");
  a.N = a.v.dim(0); a.T = a.v.dim(1); a.d = a.v.dim(2);
  require(a.N * a.T * a.d > 0, f.where() + ": dataset 'v' has an empty dimension " + shape_str(a.v.shape));
  a.w = f.read("w", 1, "w [d] (the consumer's pseudo-query)");
  require(a.w.dim(0) == a.d, f.where() + ": dataset 'w' has shape " + shape_str(a.w.shape) + ", expected [d] = [" +
                                 std::to_string(a.d) + "] from v " + shape_str(a.v.shape));
  const auto mode = f.attr_str("/", "mode");
  require(mode.has_value(), f.where() + ": root attribute 'mode' is missing; accepted: full (every source), block "
                                        "(block AttnRes, with attribute block_sources)");
  if (*mode == "full") {
    a.mode = ResidualMode::full;
  } else if (*mode == "block") {
    a.mode = ResidualMode::block;
    const auto bs = f.attr_num("/", "block_sources");
    require(bs.has_value(), f.where() + ": mode = \"block\" needs the root attribute 'block_sources' (sublayer outputs "
                                        "per block, an integer in [1, 1e6])");
    require(std::isfinite(*bs) && *bs >= 1 && *bs == std::floor(*bs) && *bs <= 1e6,
            f.where() + ": attribute block_sources = " + fmt::format("{}", *bs) + " is not accepted; give an integer in [1, 1e6]");
    a.block_sources = static_cast<std::size_t>(*bs);
  } else {
    throw Error(f.where() + ": root attribute mode = '" + *mode + "' is unknown; accepted: full, block");
  }
  const auto eps = f.attr_num("/", "eps");
  require(eps.has_value(), f.where() + ": root attribute 'eps' is missing (the RMSNorm eps of the keys, e.g. 1e-6)");
  require(std::isfinite(*eps) && *eps >= 0,
          f.where() + ": attribute eps = " + fmt::format("{}", *eps) + " is not accepted; give a finite eps >= 0");
  a.eps = *eps;
  if (f.has("h")) {
    a.h_cand = f.read("h", 2, "h [T, d] (the mixed input of the consumer)");
    require(a.h_cand.shape == std::vector<std::size_t>{a.T, a.d},
            f.where() + ": candidate 'h' has shape " + shape_str(a.h_cand.shape) + ", expected [T, d] = " +
                shape_str({a.T, a.d}));
    a.has_h = true;
    a.h_format = f.format_of("h");
  }
  require_finite(f, "v", a.v);
  require_finite(f, "w", a.w);
  return a;
}

std::string pick_truth(const std::string& opt, double work) { return opt == "auto" ? (work <= 2e7 ? "mp" : "f64") : opt; }
std::string truth_label(const std::string& tk) { return tk == "mp" ? "cpp_bin_float_50" : "float64"; }
/// The declared precision: --precision, else the root attribute `precision`, else the lowest-precision storage
/// format among the candidates (a bf16 output makes a bf16 kernel). Errors: kdalab::Error on an unknown name.
void declare(Judge& j, const std::string& path, const std::vector<Outcome::Cand>& cands) {
  auto parse = [](const std::string& v, const std::string& what) {
    require(v == "bf16" || v == "fp16" || v == "fp32" || v == "fp64",
            what + " = '" + v + "' is unknown; accepted: bf16, fp16, fp32, fp64");
    return parse_format(v, what);
  };
  if (!j.precision.empty()) {
    j.p = parse(j.precision, "--precision");
    j.p_from = "--precision";
    return;
  }
  InFile f(path);
  if (const auto a = f.attr_str("/", "precision")) {
    j.p = parse(*a, f.where() + ": root attribute precision");
    j.p_from = "the file's attribute precision";
    return;
  }
  j.p = Format::fp64;
  for (const auto& c : cands) {
    const Format fc = parse_format(c.format, "format of '" + c.name + "'");
    if (static_cast<int>(fc) < static_cast<int>(j.p)) j.p = fc == Format::tf32 ? Format::fp32 : fc;
  }
  j.p_from = "the candidates' formats";
}

/// A candidate tensor `name` of the given shape, when the file has it (its format in *fmt).
std::optional<Tensor<double>> read_candidate(InFile& f, const std::string& name, const std::vector<std::size_t>& shape,
                                             const std::string& what, std::string* fmt) {
  if (!f.has(name)) return std::nullopt;
  Tensor<double> t = f.read(name, shape.size(), what);
  require(t.shape == shape, f.where() + ": candidate '" + name + "' has shape " + shape_str(t.shape) + ", expected " +
                                shape_str(shape) + " " + what);
  *fmt = f.format_of(name);
  return t;
}

/// kdalab's CUDA prefill (kernels/kda.hpp through gpu_exp::kda_prefill_on_gpu) on exactly the file's inputs.
/// Errors: kdalab::Error (exit 2) for inputs the kernel does not take (it fuses the K3 gate,
/// the beta sigmoid and the q/k L2Norm, d_k = d_v in {64, 128, 256}, HV = H); the file's values are bf16 for q, k, v, g, beta
/// (verified by read_input when declared) and fp32-rounded for A_log, bias, S0; then NotAvailable (exit 3) in a
/// build without the CUDA kernels or with no GPU visible (cudaGetDeviceCount < 1).
KdaOutput<double> run_kdalab_kernel(const CheckInput& c, const std::string& path) {
  const std::string w = "check --kernel ('" + path + "'): ";
  // the inputs are checked first, the same way in every build (bad input: exit 2); only then whether the kernel
  // can run here (NotAvailable: exit 3)
  require(c.gate == KdaGateKind::k3, w + "the kernel fuses the K3 gate; the file needs gate = \"k3\"");
  require(c.beta_logits, w + "the kernel applies the beta sigmoid; the file needs beta = \"logits\"");
  require(c.l2norm, w + "the kernel L2-normalises q and k; the file needs l2norm_qk = 1");
  require(c.d_k == c.d_v && (c.d_k == 64 || c.d_k == 128 || c.d_k == 256),
          w + fmt::format("d_k = {}, d_v = {}; the kernel takes d_k = d_v in {{64, 128, 256}}", c.d_k, c.d_v));
  require(c.H == c.HV, w + fmt::format("H = {}, HV = {}; kdalab check --kernel takes HV = H", c.H, c.HV));
  require(c.g_min >= -5.0, w + fmt::format("g_min = {}; the kernel accepts -5 <= g_min < 0", c.g_min));
  // the kernel reads q, k, v, g, beta in bf16 and A_log, bias, S0 in fp32: inputs that are not exactly such
  // numbers would be rounded for the kernel only, and kernel and truth would see different inputs
  for (auto [n, t] : std::initializer_list<std::pair<const char*, const Tensor<double>*>>{
           {"q", &c.q}, {"k", &c.k}, {"v", &c.v}, {"g", &c.g}, {"beta", &c.beta}})
    for (std::size_t i = 0; i < t->numel(); ++i)
      require(round_bf16(t->data[i]) == t->data[i],
              w + fmt::format("dataset '{}' holds {} at flat index {}, not a bf16 number; the kernel reads bf16 "
                              "inputs: round them to bf16 (and declare format = \"bf16\")", n, t->data[i], i));
  for (auto [n, t] : std::initializer_list<std::pair<const char*, const Tensor<double>*>>{
           {"A_log", &c.A_log}, {"bias", &c.bias}, {"S0", &c.S0}})
    for (std::size_t i = 0; i < t->numel(); ++i)
      require(static_cast<double>(static_cast<float>(t->data[i])) == t->data[i],
              w + fmt::format("dataset '{}' holds {} at flat index {}, not an fp32 number; the kernel reads it in "
                              "fp32: store it as float32", n, t->data[i], i));
#ifndef KDALAB_HAVE_CUDA
  throw NotAvailable("check --kernel: not available in this build: this kdalab was built without the CUDA kernels "
                     "(configure with `cmake --preset cuda` and run on a GPU); nothing was checked or written");
#else
  int ndev = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&ndev); e != cudaSuccess || ndev < 1) {
    cudaGetLastError();
    throw NotAvailable(std::string("check --kernel: not available on this machine: no GPU visible (") +
                       (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + "); nothing was checked or written");
  }
  KdaInputs in;
  in.B = c.B; in.T = c.T; in.H = c.H; in.HV = c.HV; in.d_k = c.d_k; in.d_v = c.d_v;
  in.g_min = c.g_min; in.scale = c.scale;
  in.q_raw = c.q; in.k_raw = c.k; in.v = c.v; in.g_raw = c.g; in.beta_raw = c.beta; in.A_log = c.A_log; in.bias = c.bias;
  in.S0 = c.has_S0 ? c.S0 : Tensor<double>({c.B, c.HV, c.d_k, c.d_v});  // no S0: start from zero
  return gpu_exp::kda_prefill_on_gpu(in, 0.0, false);
#endif
}

/// The KDA problem of a validated file, for numerics/check_ops.hpp and numerics/plain_emulation.hpp.
KdaCheckOp to_op(const CheckInput& c) {
  KdaCheckOp k;
  k.q = c.q; k.k = c.k; k.v = c.v; k.g = c.g; k.beta = c.beta; k.S0 = c.S0; k.A_log = c.A_log; k.bias = c.bias;
  k.has_S0 = c.has_S0; k.l2norm = c.l2norm; k.beta_logits = c.beta_logits;
  k.gate = c.gate;
  k.g_min = c.g_min; k.scale = c.scale;
  return k;
}

/// The MLA problem of a validated file.
MlaCheckOp to_op(const MlaInput& m) { return {m.q, m.c, m.q_rope, m.k_rope, m.scale}; }

/// The AttnRes problem of a validated file.
AttnResCheckOp to_op(const AttnResInput& a) { return {a.v, a.w, a.mode, a.block_sources, a.eps}; }

/// Attaches to every candidate the emulation of the same tensor (by name) at the declared precision, unless --tol
/// overrides the budget rule or there is no candidate.
void attach_emulation(Outcome& r, Judge& j, const std::string& path,
                      const std::function<std::map<std::string, Tensor<double>>(Format)>& emulate) {
  if (j.tol_override || r.cands.empty()) return;
  declare(j, path, r.cands);
  const auto e = emulate(j.p);
  for (auto& c : r.cands) {
    std::string base = c.name;
    if (base.size() > 8 && base.substr(base.size() - 8) == "_kdalab") base.resize(base.size() - 8);
    c.emulation = e.at(base);
  }
}

}  // namespace

Outcome check_kda(const std::string& in_path, const std::string& op, const std::string& truth_opt, bool kernel, Judge& j) {
  const CheckInput in = read_input(in_path, op);  // (--kernel with another --op is refused in run())
  j.before_truth(static_cast<std::size_t>(in.has_o) + in.has_S + (kernel ? 2 : 0));
  std::optional<KdaOutput<double>> mine;
  if (kernel) mine = run_kdalab_kernel(in, in_path);  // before the (slow) truth: a refusal costs nothing
  const std::string tk = pick_truth(truth_opt, static_cast<double>(in.B * in.T * in.HV * in.d_k * in.d_v));
  const KdaCheckOp kop = to_op(in);
  KdaOutput<double> t;
  if (tk == "mp") {
    const auto r = kda_check_truth<mp50>(kop, op == "kda-decode");
    t = {r.o.cast<double>(), r.S_final.cast<double>()};
  } else {
    t = kda_check_truth<double>(kop, op == "kda-decode");
  }
  Outcome r;
  r.truth_name = truth_label(tk);
  const std::string kh = tk == "mp" ? "the inputs overflow even cpp_bin_float_50" : "the inputs overflow float64; try --truth mp";
  require_finite_truth(t.o, "o", r.truth_name, kh);
  require_finite_truth(t.S_final, "S", r.truth_name, kh);
  if (in.has_o) r.cands.push_back({"o", in.o_format, in.o_cand, t.o, {}});
  if (in.has_S) r.cands.push_back({"S", in.S_format, in.S_cand, t.S_final, {}});
  if (mine) {
    r.cands.push_back({"o_kdalab", "bf16", mine->o, t.o, {}});
    r.cands.push_back({"S_kdalab", "fp32", mine->S_final, t.S_final, {}});
  }
  attach_emulation(r, j, in_path, [&](Format p) {
    // kda-decode runs T one-token steps: the emulation's chunk is one token (the recurrence at p)
    const emul::KdaEmulation e = emul::kda(kop, p, op == "kda-decode" ? 1 : 64);
    return std::map<std::string, Tensor<double>>{{"o", e.o}, {"S", e.S}};
  });
  r.truths.push_back({"o_truth", "truth o [B, T, HV, d_v] on exactly the input file's tensors", t.o, {}});
  const std::string lay = in.has_S ? in.S_layout : (in.has_S0 ? in.S0_layout : "KV");
  r.truths.push_back({"S_truth", "truth final state in layout " + lay, lay == "VK" ? swap_last(t.S_final) : t.S_final,
                      {{"layout", lay}}});
  return r;
}

/// --op kda-bwd: the forward inputs, the upstream gradients do (and dS) and any of the candidate gradients
/// (docs/check-format.md, --op kda-bwd).
Outcome check_kda_bwd(const std::string& in_path, const std::string& truth_opt, Judge& j) {
  const CheckInput in = read_input(in_path, "kda-bwd");
  const KdaCheckOp op = to_op(in);
  InFile f(in_path);
  const Tensor<double> dO = f.read("do", 4, "do [B, T, HV, d_v] (the upstream gradient dL/do)");
  require(dO.shape == std::vector<std::size_t>{in.B, in.T, in.HV, in.d_v},
          f.where() + ": dataset 'do' has shape " + shape_str(dO.shape) + ", expected " +
              shape_str({in.B, in.T, in.HV, in.d_v}) + " [B, T, HV, d_v]");
  require_finite(f, "do", dO);
  const std::vector<std::size_t> kv{in.B, in.HV, in.d_k, in.d_v}, vk{in.B, in.HV, in.d_v, in.d_k};
  std::optional<Tensor<double>> dS;
  if (f.has("dS")) {
    const std::string lay = layout_of(f, "dS");
    Tensor<double> t = f.read("dS", 4, "dS [B, HV, d_k, d_v] (layout KV) or [B, HV, d_v, d_k] (layout VK)");
    require(t.shape == (lay == "KV" ? kv : vk), f.where() + ": dataset 'dS' has shape " + shape_str(t.shape) +
                                                    ", layout " + lay + " expects " + shape_str(lay == "KV" ? kv : vk));
    require_finite(f, "dS", t);
    dS = lay == "VK" ? swap_last(t) : t;
  }
  const std::string bias_name = in.gate == KdaGateKind::softplus ? "dt_bias" : "bias";
  struct Spec {
    std::string name;
    std::vector<std::size_t> shape;
    std::string what;
  };
  std::vector<Spec> specs{{"dq", in.q.shape, "[B, T, H, d_k]"},      {"dk", in.k.shape, "[B, T, H, d_k]"},
                          {"dv", in.v.shape, "[B, T, HV, d_v]"},     {"dg", in.g.shape, "[B, T, HV, d_k]"},
                          {"dbeta", in.beta.shape, "[B, T, HV]"}};
  if (in.gate != KdaGateKind::none) {
    specs.push_back({"dA_log", {in.HV}, "[HV]"});
    specs.push_back({"d" + bias_name, {in.HV, in.d_k}, "[HV, d_k]"});
  }
  for (const std::string n : {"dA_log", "dbias", "ddt_bias"})
    require(!f.has(n) || std::any_of(specs.begin(), specs.end(), [&](const Spec& s) { return s.name == n; }),
            f.where() + ": candidate '" + n + "' is the gradient of a gate parameter the file's gate = \"" +
                (in.gate == KdaGateKind::none ? "none" : in.gate == KdaGateKind::k3 ? "k3" : "softplus") +
                "\" does not have; accepted: dA_log and dbias with gate = \"k3\", dA_log and ddt_bias with gate = \"softplus\"");
  std::vector<std::pair<std::string, Tensor<double>>> found;
  std::vector<std::string> formats;
  for (const Spec& s : specs) {
    std::string fm;
    if (auto t = read_candidate(f, s.name, s.shape, s.what, &fm)) {
      found.emplace_back(s.name, std::move(*t));
      formats.push_back(fm);
    }
  }
  std::string dS0_layout = in.has_S0 ? in.S0_layout : "KV";
  if (f.has("dS0")) {
    dS0_layout = layout_of(f, "dS0");
    std::string fm;
    auto t = read_candidate(f, "dS0", dS0_layout == "KV" ? kv : vk, "in layout " + dS0_layout, &fm);
    found.emplace_back("dS0", dS0_layout == "VK" ? swap_last(*t) : *t);
    formats.push_back(fm);
  }
  j.before_truth(found.size());
  // the reverse sweep repeats the forward's work about twice: count it 3x in the auto rule
  const std::string tk = pick_truth(truth_opt, 3.0 * static_cast<double>(in.B * in.T * in.HV * in.d_k * in.d_v));
  const KdaCheckGrads t = tk == "mp" ? kda_check_backward_truth<mp50>(op, dO, dS ? &*dS : nullptr)
                                     : kda_check_backward_truth<double>(op, dO, dS ? &*dS : nullptr);
  Outcome r;
  r.truth_name = truth_label(tk);
  const std::map<std::string, const Tensor<double>*> by{{"dq", &t.dq},     {"dk", &t.dk},         {"dv", &t.dv},
                                                        {"dg", &t.dg},     {"dbeta", &t.dbeta},   {"dS0", &t.dS0},
                                                        {"dA_log", &t.dA_log}, {"d" + bias_name, &t.dbias}};
  const std::string kh = tk == "mp" ? "the inputs overflow even cpp_bin_float_50" : "the inputs overflow float64; try --truth mp";
  for (const auto& [n, x] : by) require_finite_truth(*x, n, r.truth_name, kh);
  for (std::size_t i = 0; i < found.size(); ++i)
    r.cands.push_back({found[i].first, formats[i], found[i].second, *by.at(found[i].first), {}});
  attach_emulation(r, j, in_path, [&](Format p) {
    const emul::KdaEmulation e = emul::kda(op, p, 64, &dO, dS ? &*dS : nullptr);
    const KdaCheckGrads& g = e.grads;
    return std::map<std::string, Tensor<double>>{{"dq", g.dq}, {"dk", g.dk}, {"dv", g.dv}, {"dg", g.dg}, {"dbeta", g.dbeta},
                                                 {"dS0", g.dS0}, {"dA_log", g.dA_log}, {"d" + bias_name, g.dbias}};
  });
  for (const auto& [n, x] : by) {
    if (x->numel() == 0) continue;  // no gate: no dA_log, dbias
    if (n == "dS0")
      r.truths.push_back({"dS0_truth", "truth dL/dS0 in layout " + dS0_layout, dS0_layout == "VK" ? swap_last(*x) : *x,
                          {{"layout", dS0_layout}}});
    else
      r.truths.push_back({n + "_truth", "truth " + n + " on exactly the input file's tensors", *x, {}});
  }
  return r;
}

Outcome check_mla(const std::string& in_path, const std::string& truth_opt, Judge& j) {
  const MlaInput m = read_mla(in_path);
  j.before_truth(m.has_o ? 1 : 0);
  const std::string tk = pick_truth(truth_opt, static_cast<double>(m.B * m.T * m.H * m.N * (m.d_c + m.d_rope)));
  const MlaCheckOp op = to_op(m);
  const Tensor<double> a = tk == "mp" ? mla_check_truth<mp50>(op) : mla_check_truth<double>(op);
  Outcome r;
  r.truth_name = truth_label(tk);
  require_finite_truth(a, "o", r.truth_name,
                       tk == "mp" ? "the scores overflow even cpp_bin_float_50; scale q or c down"
                                  : "the scores overflow float64 (|scale q . c| too large); try --truth mp or scale q or c down");
  if (m.has_o) r.cands.push_back({"o", m.o_format, m.o_cand, a, {}});
  attach_emulation(r, j, in_path, [&](Format p) {
    return std::map<std::string, Tensor<double>>{{"o", emul::mla(op, p).o}};
  });
  r.truths.push_back({"o_truth", "truth attended latent [B, T, H, d_c] on exactly the input file's tensors", a, {}});
  return r;
}

/// --op mla-bwd: the --op mla inputs, do [B, T, H, d_c] and any of dq, dc, dq_rope, dk_rope.
Outcome check_mla_bwd(const std::string& in_path, const std::string& truth_opt, Judge& j) {
  const MlaInput m = read_mla(in_path);
  const MlaCheckOp op = to_op(m);
  InFile f(in_path);
  const Tensor<double> dO = f.read("do", 4, "do [B, T, H, d_c] (the upstream gradient dL/do)");
  require(dO.shape == m.q.shape, f.where() + ": dataset 'do' has shape " + shape_str(dO.shape) + ", expected " +
                                     shape_str(m.q.shape) + " [B, T, H, d_c]");
  require_finite(f, "do", dO);
  std::vector<std::pair<std::string, std::vector<std::size_t>>> specs{{"dq", m.q.shape}, {"dc", m.c.shape}};
  if (m.d_rope) {
    specs.push_back({"dq_rope", m.q_rope.shape});
    specs.push_back({"dk_rope", m.k_rope.shape});
  }
  std::vector<Outcome::Cand> found;
  for (const auto& [n, shape] : specs) {
    std::string fm;
    if (auto t = read_candidate(f, n, shape, "(the shape of " + n.substr(1) + ")", &fm)) found.push_back({n, fm, *t, {}, {}});
  }
  for (const char* n : {"dq_rope", "dk_rope"})
    require(m.d_rope || !f.has(n), f.where() + ": candidate '" + n + "' is given but the file has no q_rope / k_rope");
  j.before_truth(found.size());
  const std::string tk = pick_truth(truth_opt, 3.0 * static_cast<double>(m.B * m.T * m.H * m.N * (m.d_c + m.d_rope)));
  const MlaCheckGrads t = tk == "mp" ? mla_check_backward_truth<mp50>(op, dO) : mla_check_backward_truth<double>(op, dO);
  Outcome r;
  r.truth_name = truth_label(tk);
  const std::map<std::string, const Tensor<double>*> by{{"dq", &t.dq}, {"dc", &t.dc}, {"dq_rope", &t.dq_rope},
                                                        {"dk_rope", &t.dk_rope}};
  for (const auto& [n, x] : by)
    require_finite_truth(*x, n, r.truth_name, "the scores overflow; try --truth mp or scale q or c down");
  for (auto& c : found) {
    c.truth = *by.at(c.name);
    r.cands.push_back(c);
  }
  attach_emulation(r, j, in_path, [&](Format p) {
    const auto e = emul::mla(op, p, &dO);
    return std::map<std::string, Tensor<double>>{{"dq", e.grads.dq}, {"dc", e.grads.dc}, {"dq_rope", e.grads.dq_rope},
                                                 {"dk_rope", e.grads.dk_rope}};
  });
  for (const auto& [n, x] : by)
    if (x->numel()) r.truths.push_back({n + "_truth", "truth " + n + " on exactly the input file's tensors", *x, {}});
  return r;
}

Outcome check_attn_res(const std::string& in_path, const std::string& truth_opt, Judge& j) {
  const AttnResInput a = read_attn_res(in_path);
  j.before_truth(a.has_h ? 1 : 0);
  const std::string tk = pick_truth(truth_opt, static_cast<double>(a.N * a.T * a.d) * 100.0);
  const AttnResCheckOp op = to_op(a);
  const Tensor<double> h = tk == "mp" ? attn_res_check_truth<mp50>(op) : attn_res_check_truth<double>(op);
  Outcome r;
  r.truth_name = truth_label(tk);
  require_finite_truth(h, "h", r.truth_name,
                       "RMSNorm divides by sqrt(mean(v^2) + eps): with eps = 0 a source whose values are all 0 (or "
                       "underflow when squared) gives 0/0; give eps > 0");
  if (a.has_h) r.cands.push_back({"h", a.h_format, a.h_cand, h, {}});
  attach_emulation(r, j, in_path, [&](Format p) {
    return std::map<std::string, Tensor<double>>{{"h", emul::attn_res(op, p).h}};
  });
  r.truths.push_back({"h_truth", "truth h [T, d] (" + residual_mode_name(a.mode) + " AttnRes) on exactly the input "
                      "file's tensors", h, {}});
  return r;
}

/// --op attn-res-bwd: the --op attn-res inputs, do [T, d] (dL/dh) and any of dv, dw.
Outcome check_attn_res_bwd(const std::string& in_path, const std::string& truth_opt, Judge& j) {
  const AttnResInput a = read_attn_res(in_path);
  const AttnResCheckOp op = to_op(a);
  InFile f(in_path);
  const Tensor<double> dh = f.read("do", 2, "do [T, d] (the upstream gradient dL/dh)");
  require(dh.shape == std::vector<std::size_t>{a.T, a.d}, f.where() + ": dataset 'do' has shape " + shape_str(dh.shape) +
                                                              ", expected " + shape_str({a.T, a.d}) + " [T, d]");
  require_finite(f, "do", dh);
  std::vector<Outcome::Cand> found;
  for (const auto& [n, shape] : {std::pair<std::string, std::vector<std::size_t>>{"dv", a.v.shape}, {"dw", a.w.shape}}) {
    std::string fm;
    if (auto t = read_candidate(f, n, shape, "(the shape of " + n.substr(1) + ")", &fm)) found.push_back({n, fm, *t, {}, {}});
  }
  j.before_truth(found.size());
  const std::string tk = pick_truth(truth_opt, 300.0 * static_cast<double>(a.N * a.T * a.d));
  const AttnResCheckGrads t =
      tk == "mp" ? attn_res_check_backward_truth<mp50>(op, dh) : attn_res_check_backward_truth<double>(op, dh);
  Outcome r;
  r.truth_name = truth_label(tk);
  const std::map<std::string, const Tensor<double>*> by{{"dv", &t.dv}, {"dw", &t.dw}};
  for (const auto& [n, x] : by) require_finite_truth(*x, n, r.truth_name, "give eps > 0");
  for (auto& c : found) {
    c.truth = *by.at(c.name);
    r.cands.push_back(c);
  }
  attach_emulation(r, j, in_path, [&](Format p) {
    const auto e = emul::attn_res(op, p, &dh);
    return std::map<std::string, Tensor<double>>{{"dv", e.grads.dv}, {"dw", e.grads.dw}};
  });
  for (const auto& [n, x] : by) r.truths.push_back({n + "_truth", "truth " + n + " on exactly the input file's tensors", *x, {}});
  return r;
}

OpNames op_names(const std::string& op) {
  const bool bwd = op.size() > 4 && op.substr(op.size() - 4) == "-bwd";
  const std::string base = bwd ? op.substr(0, op.size() - 4) : op;
  OpNames r;
  std::set<std::string> fwd_c, bwd_c, inputs;
  if (base == "kda" || base == "kda-decode") {
    inputs = {"q", "k", "v", "g", "beta", "S0", "A_log", "bias", "dt_bias", "do", "dS"};
    fwd_c = {"o", "S"};
    bwd_c = {"dq", "dk", "dv", "dg", "dbeta", "dS0", "dA_log", "dbias", "ddt_bias"};
  } else if (base == "mla") {
    inputs = {"q", "c", "q_rope", "k_rope", "do"};
    fwd_c = {"o"};
    bwd_c = {"dq", "dc", "dq_rope", "dk_rope"};
  } else {
    inputs = {"v", "w", "do"};
    fwd_c = {"h"};
    bwd_c = {"dv", "dw"};
  }
  r.candidates = bwd ? bwd_c : fwd_c;
  r.known = inputs;
  r.known.insert(fwd_c.begin(), fwd_c.end());
  r.known.insert(bwd_c.begin(), bwd_c.end());
  return r;
}

}  // namespace kdalab::cli::check_detail
