// `kdalab check`: check someone else's tensors against the truth (ISSUE 5 "Checking someone else's
// tensors"; file format in README.md "Checking your own kernel's tensors (kdalab check)").
//
//   kdalab check --op kda|kda-decode --in FILE.h5 [--truth auto|mp|f64] [--tol X] --out report.h5
//
// The input file holds, at its root: datasets q, k [B, T, H, d_k]; v [B, T, HV, d_v];
// g [B, T, HV, d_k]; beta [B, T, HV]; optional S0; optional candidates o [B, T, HV, d_v] and S
// (the final state). Root attributes: scale (number), l2norm_qk (0/1 or bool: normalise q, k per
// head first); gate = "none" (default: g is the log-decay) | "k3" (g holds logits z;
// g = g_min Sigmoid(exp(A_log) (z + bias)), datasets A_log [HV], bias [HV, d_k], attribute g_min)
// | "softplus" (g = -exp(A_log) Softplus(z + dt_bias), datasets A_log [HV], dt_bias [HV, d_k]);
// beta = "values" (default) | "logits" (beta = Sigmoid(dataset)). S0 and S need an attribute
// layout = "KV" ([B, HV, d_k, d_v]) or "VK" ([B, HV, d_v, d_k]), on the dataset or the root.
// Every dataset is float32 or float64; format = "bf16" (dataset or root attribute) declares
// float32 data holding bf16 values, which is verified (kdalab never re-rounds silently).
// --op kda-decode runs T one-token decode steps from S0 (S0 required).
// The truth is computed on exactly these inputs in cpp_bin_float_50 (mp) or float64 (f64); auto
// takes mp while B*T*HV*d_k*d_v <= 2e7 (~20 s), f64 above. Exit: 0 pass (or no candidate: the
// truth is written), 1 a candidate fails --tol, 2 bad input (any malformed file: a clear error).
#include <H5Cpp.h>
#include <filesystem>

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>

#include "experiments/cli.hpp"
#include "experiments/kda_ops.hpp"
#include "numerics/bf16.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/error.hpp"
#include "reference/kda.hpp"

namespace kdalab::cli {

namespace {

/// A reader of one input file that turns every HDF5 problem into a kdalab::Error naming it.
class InFile {
 public:
  explicit InFile(const std::string& path) : path_(path) {
    H5::Exception::dontPrint();
    require(!path.empty(), "check: --in FILE.h5 is required (the tensors to check; format in README.md)");
    try {
      f_ = H5::H5File(path, H5F_ACC_RDONLY);
    } catch (const H5::Exception&) {
      throw Error("check --in '" + path + "': not found or not a readable HDF5 file");
    }
  }
  std::string where() const { return "check --in '" + path_ + "'"; }

  bool has(const std::string& name) {
    return f_.nameExists(name) && f_.childObjType(name) == H5O_TYPE_DATASET;
  }

  /// Reads float dataset `name` of rank `rank`; `what` describes the expected shape.
  Tensor<double> read(const std::string& name, std::size_t rank, const std::string& what) {
    require(f_.nameExists(name), where() + ": dataset '" + name + "' is missing; expected " + what);
    require(f_.childObjType(name) == H5O_TYPE_DATASET, where() + ": '" + name + "' is not a dataset; expected " + what);
    H5::DataSet ds = f_.openDataSet(name);
    const H5T_class_t cls = ds.getTypeClass();
    if (cls != H5T_FLOAT) {
      const char* k = cls == H5T_INTEGER ? "an integer" : cls == H5T_STRING ? "a string" : "a non-float";
      throw Error(where() + ": dataset '" + name + "' has " + k +
                  " dtype; accepted: float32 or float64 (bf16 data as float32 holding bf16 values, attribute format = "
                  "\"bf16\")");
    }
    const std::size_t bytes = ds.getFloatType().getSize();
    require(bytes == 4 || bytes == 8, where() + ": dataset '" + name + "' is a " + std::to_string(8 * bytes) +
                                          "-bit float; accepted: float32 or float64 (store fp16/bf16 as float32)");
    H5::DataSpace sp = ds.getSpace();
    const int r = sp.getSimpleExtentNdims();
    std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(r, 0)));
    if (r > 0) sp.getSimpleExtentDims(dims.data());
    Tensor<double> t(std::vector<std::size_t>(dims.begin(), dims.end()));
    require(t.rank() == rank, where() + ": dataset '" + name + "' has rank " + std::to_string(t.rank()) + " (shape " +
                                  shape_str(t.shape) + "); expected " + what);
    if (t.numel()) ds.read(t.data.data(), H5::PredType::NATIVE_DOUBLE);
    // declared bf16 data must hold bf16 values
    const auto fmt = attr_str(name, "format").value_or(attr_str("/", "format").value_or(""));
    if (!fmt.empty()) {
      const Format f = parse_format(fmt, where() + ": attribute format of '" + name + "'");
      for (std::size_t i = 0; i < t.numel(); ++i)
        if (std::isfinite(t.data[i]) && round_to(t.data[i], f) != t.data[i])
          throw Error(where() + ": dataset '" + name + "' has format = \"" + fmt + "\" but its value " +
                      fmt::format("{:.9g}", t.data[i]) + " at flat index " + std::to_string(i) +
                      " is not representable in " + fmt + "; round it before writing (kdalab never re-rounds)");
    }
    formats_[name] = fmt.empty() ? (bytes == 4 ? "fp32" : "fp64") : fmt;
    return t;
  }

  std::optional<std::string> attr_str(const std::string& obj, const std::string& name) {
    auto a = open_attr(obj, name);
    if (!a) return std::nullopt;
    require(a->getTypeClass() == H5T_STRING,
            where() + ": attribute '" + name + "' of '" + obj + "' must be a string");
    std::string s;
    a->read(a->getStrType(), s);
    while (!s.empty() && s.back() == '\0') s.pop_back();
    return s;
  }

  /// Numeric attribute (float, integer, a bool enum, or a string holding a number / true / false).
  std::optional<double> attr_num(const std::string& obj, const std::string& name) {
    auto a = open_attr(obj, name);
    if (!a) return std::nullopt;
    const H5T_class_t cls = a->getTypeClass();
    const std::string bad = where() + ": attribute '" + name + "' of '" + obj + "' must be a number";
    require(a->getSpace().getSimpleExtentNpoints() == 1, bad + " (a scalar, got several values)");
    if (cls == H5T_FLOAT || cls == H5T_INTEGER) {
      double v = 0;
      a->read(H5::PredType::NATIVE_DOUBLE, &v);
      return v;
    }
    if (cls == H5T_ENUM) {  // h5py writes numpy/Python bools as an int8 enum FALSE=0/TRUE=1
      H5::DataType t = a->getDataType();
      require(t.getSize() <= 8, bad);
      unsigned char buf[8] = {0};
      a->read(t, buf);
      std::int64_t v = 0;
      for (std::size_t i = t.getSize(); i-- > 0;) v = (v << 8) | buf[i];
      return static_cast<double>(v);
    }
    if (cls == H5T_STRING) {
      std::string s;
      a->read(a->getStrType(), s);
      while (!s.empty() && s.back() == '\0') s.pop_back();
      if (s == "true" || s == "True") return 1.0;
      if (s == "false" || s == "False") return 0.0;
      try {
        std::size_t used = 0;
        const double v = std::stod(s, &used);
        if (used == s.size()) return v;
      } catch (...) {
      }
      throw Error(bad + ", got the string '" + s + "'");
    }
    throw Error(bad);
  }

  const std::string& format_of(const std::string& name) { return formats_[name]; }

 private:
  std::optional<H5::Attribute> open_attr(const std::string& obj, const std::string& name) {
    if (obj == "/") {
      H5::Group g = f_.openGroup("/");
      if (!g.attrExists(name)) return std::nullopt;
      return g.openAttribute(name);
    }
    if (!f_.nameExists(obj)) return std::nullopt;
    H5::DataSet d = f_.openDataSet(obj);
    if (!d.attrExists(name)) return std::nullopt;
    return d.openAttribute(name);
  }
  std::string path_;
  H5::H5File f_;
  std::map<std::string, std::string> formats_;
};

enum class Gate { none, k3, softplus };

/// Everything read from the input file, validated.
struct CheckInput {
  std::size_t B = 0, T = 0, H = 0, HV = 0, d_k = 0, d_v = 0;
  Tensor<double> q, k, v, g, beta, S0, A_log, bias, o_cand, S_cand;
  bool has_S0 = false, has_o = false, has_S = false, l2norm = false, beta_logits = false;
  Gate gate = Gate::none;
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
  require(std::isfinite(*scale), f.where() + ": attribute scale is not finite");
  c.scale = *scale;
  const auto l2 = f.attr_num("/", "l2norm_qk");
  require(l2.has_value(), f.where() + ": root attribute 'l2norm_qk' is missing (1: kdalab L2-normalises q and k per "
                                      "head first, as the kernel does; 0: q and k are used as given)");
  require(*l2 == 0 || *l2 == 1, f.where() + ": attribute l2norm_qk must be 0 or 1 (or a bool)");
  c.l2norm = *l2 == 1;
  const std::string gate = f.attr_str("/", "gate").value_or("none");
  if (gate == "none") {
    c.gate = Gate::none;
  } else if (gate == "k3" || gate == "softplus") {
    c.gate = gate == "k3" ? Gate::k3 : Gate::softplus;
    const std::string bias_name = gate == "k3" ? "bias" : "dt_bias";
    c.A_log = f.read("A_log", 1, "A_log [HV] (gate = \"" + gate + "\" needs it)");
    require(c.A_log.dim(0) == c.HV, f.where() + ": dataset 'A_log' has shape " + shape_str(c.A_log.shape) +
                                        ", expected [" + std::to_string(c.HV) + "] = [HV]");
    c.bias = f.read(bias_name, 2, bias_name + " [HV, d_k] (gate = \"" + gate + "\" needs it)");
    require(c.bias.shape == std::vector<std::size_t>{c.HV, c.d_k},
            f.where() + ": dataset '" + bias_name + "' has shape " + shape_str(c.bias.shape) + ", expected " +
                shape_str({c.HV, c.d_k}) + " [HV, d_k]");
    if (c.gate == Gate::k3) {
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
  for (const auto* p : {&c.q, &c.k, &c.v, &c.g, &c.beta})
    for (std::size_t i = 0; i < p->numel(); ++i)
      require(std::isfinite(p->data[i]), f.where() + ": an input holds a non-finite value at flat index " +
                                             std::to_string(i) + " (q, k, v, g, beta must be finite)");
  return c;
}

/// The truth on exactly the file's inputs, in scalar type S.
template <class S>
KdaOutput<S> truth(const CheckInput& c, const std::string& op) {
  Tensor<S> q = c.q.cast<S>(), k = c.k.cast<S>(), g = c.g.cast<S>(), beta = c.beta.cast<S>();
  if (c.l2norm)
    for (Tensor<S>* t : {&q, &k})
      for (std::size_t r = 0; r < t->numel() / c.d_k; ++r) {
        S n2 = 0;
        for (std::size_t i = 0; i < c.d_k; ++i) n2 += t->data[r * c.d_k + i] * t->data[r * c.d_k + i];
        const S inv = n2 > S(0) ? S(S(1) / ssqrt<S>(n2)) : S(0);
        for (std::size_t i = 0; i < c.d_k; ++i) t->data[r * c.d_k + i] *= inv;
      }
  if (c.gate != Gate::none)
    for (std::size_t b = 0; b < c.B; ++b)
      for (std::size_t t = 0; t < c.T; ++t)
        for (std::size_t h = 0; h < c.HV; ++h)
          for (std::size_t i = 0; i < c.d_k; ++i) {
            const S a = sexp<S>(S(c.A_log(h))), x = S(g(b, t, h, i) + S(c.bias(h, i)));
            g(b, t, h, i) = c.gate == Gate::k3 ? S(S(c.g_min) * sigmoid<S>(S(a * x))) : S(-a * softplus<S>(x));
          }
  if (c.beta_logits)
    for (auto& x : beta.data) x = sigmoid<S>(x);
  const Tensor<S> S0 = c.has_S0 ? c.S0.cast<S>() : Tensor<S>({c.B, c.HV, c.d_k, c.d_v});
  if (op == "kda-decode") return kda_decode_steps<S>(q, k, c.v.cast<S>(), g, beta, S0, S(c.scale));
  return kda_recurrent<S>(q, k, c.v.cast<S>(), g, beta, c.has_S0 ? &S0 : nullptr, S(c.scale));
}

}  // namespace

void register_check(Registry& reg) {
  auto& c = reg.add("check",
                    "Check your own kernel's tensors: read q, k, v, g (or gate logits), beta (or logits), optional "
                    "S0 and the candidate o and final S from an HDF5 file (format: README.md), compute the truth on "
                    "exactly those inputs and report relative RMS, max abs, max bf16 ULP and NaN/Inf counts per "
                    "candidate, with a one-line verdict against --tol (exit 0 pass, 1 fail, 2 bad input). Without a "
                    "candidate the truth is written to --out.",
                    "results/check.h5");
  struct Opts {
    std::string op = "kda", in, truth = "auto";
    double tol = tol::check_default.value;
  };
  auto o = std::make_shared<Opts>();
  c.app->add_option("--op", o->op, "operation: kda (prefill from S0 or zero), kda-decode (T one-token steps from S0)")
      ->capture_default_str();
  c.app->add_option("--in", o->in, "input HDF5 file (format in README.md)");
  c.app->add_option("--truth", o->truth, "truth: mp (cpp_bin_float_50), f64 (float64), auto (mp while B*T*HV*d_k*d_v "
                                         "<= 2e7, f64 above)")
      ->capture_default_str();
  c.app->add_option("--tol", o->tol, std::string("verdict tolerance on relative RMS (default: ") +
                                         tol::check_default.why + ")")
      ->capture_default_str();
  c.run = [o](Context& ctx) -> int {
    require(o->op == "kda" || o->op == "kda-decode",
            "--op '" + o->op + "' is unknown or not built yet; accepted: kda, kda-decode (mla and attn-res join when "
                               "their references land)");
    require(o->truth == "auto" || o->truth == "mp" || o->truth == "f64",
            "--truth '" + o->truth + "' is unknown; accepted: auto, mp, f64");
    require(std::isfinite(o->tol) && o->tol > 0, fmt::format("--tol {} is not accepted; give a number > 0", o->tol));
    {
      std::error_code e1, e2;
      const auto a = std::filesystem::weakly_canonical(o->in, e1), b = std::filesystem::weakly_canonical(ctx.common.out, e2);
      require(e1 || e2 || a != b, "--out '" + ctx.common.out + "' is the input file --in; give another report file");
    }
    const CheckInput in = read_input(o->in, o->op);
    const double work = static_cast<double>(in.B * in.T * in.HV * in.d_k * in.d_v);
    const std::string tk = o->truth == "auto" ? (work <= 2e7 ? "mp" : "f64") : o->truth;
    KdaOutput<double> t;
    if (tk == "mp") {
      const auto r = truth<mp50>(in, o->op);
      t = {r.o.cast<double>(), r.S_final.cast<double>()};
    } else {
      t = truth<double>(in, o->op);
    }
    const std::string truth_name = tk == "mp" ? "cpp_bin_float_50" : "float64";

    Table rep;
    rep.col("tensor", 's', "1", "candidate tensor").col("format", 's', "1", "its declared format")
        .col("rel_rms", 'd', "1", "||x - x_truth||_2 / ||x_truth||_2").col("max_abs", 'd', "1", "max |x - x_truth|")
        .col("max_ulp_bf16", 'i', "1", "max bf16-ulp distance").col("nan", 'i', "1", "NaN count")
        .col("inf", 'i', "1", "Inf count").col("n", 'i', "1", "elements").col("tol", 'd', "1", "verdict tolerance")
        .col("pass", 'i', "1", "1 if rel_rms <= tol and no NaN/Inf");
    bool all = true;
    std::string verdict;
    auto judge = [&](const std::string& name, const std::string& fmt_name, const Tensor<double>& x,
                     const Tensor<double>& ref) {
      const ErrorMetrics m = compare(x.data, ref.data, name);
      const bool ok = m.rel_rms <= o->tol && m.nan_count == 0 && m.inf_count == 0;
      all = all && ok;
      rep.row({name, fmt_name, m.rel_rms, m.max_abs, m.max_ulp_bf16, m.nan_count, m.inf_count,
               static_cast<std::int64_t>(m.n), o->tol, static_cast<std::int64_t>(ok)});
      fmt::print("{:<3} rel RMS {:.3e}  max abs {:.3e}  max bf16 ulp {}  NaN {}  Inf {}  ({}, {} elements)\n", name,
                 m.rel_rms, m.max_abs, m.max_ulp_bf16, m.nan_count, m.inf_count, fmt_name, m.n);
      verdict += fmt::format("{}{} {:.3e} {} {:.1e}", verdict.empty() ? "" : "; ", name, m.rel_rms, ok ? "<=" : ">",
                             o->tol);
    };
    if (in.has_o) judge("o", in.o_format, in.o_cand, t.o);
    if (in.has_S) judge("S", in.S_format, in.S_cand, t.S_final);

    auto f = ctx.open_results();
    f->group("check", "kdalab check of " + o->in + " (--op " + o->op + ") against the " + truth_name + " truth");
    f->attr("check", "op", o->op);
    f->attr("check", "input", o->in);
    f->attr("check", "truth", truth_name);
    f->write_array("check", "o_truth", t.o, "1", "truth o [B, T, HV, d_v] on exactly the input file's tensors");
    const std::string lay = in.has_S ? in.S_layout : (in.has_S0 ? in.S0_layout : "KV");
    f->write_array("check", "S_truth", lay == "VK" ? swap_last(t.S_final) : t.S_final, "1",
                   "truth final state in layout " + lay, {{"layout", lay}});
    std::string line;
    if (!in.has_o && !in.has_S) {
      line = "check: no candidate (o, S) in the file; wrote the " + truth_name + " truth to " + ctx.common.out;
    } else {
      f->write_table("check/report", rep);
      line = fmt::format("check: {} ({}; truth {})", all ? "PASS" : "FAIL", verdict, truth_name);
    }
    f->attr("check", "verdict", line);
    f->commit();
    fmt::print("{}\n", line);
    return all ? 0 : 1;
  };
}

}  // namespace kdalab::cli
