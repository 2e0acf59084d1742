// The budget rule of `kdalab check` (numerics/budget.hpp; docs/check-format.md, "The budget rule") for Python:
// budget = max(F (relRMS(emulation_p, truth) + relRMS(round_fmt(truth), truth)), floor), the emulation being the
// plain algorithm at the declared precision p (numerics/plain_emulation.hpp) and the truth the float64 reference
// on the same inputs (numerics/check_ops.hpp, reference/). No math here: each function validates the inputs,
// runs the emulation and the truth, and hands both to kdalab::budget_of. Shapes of each function:
// python/kdalab/_core.pyi.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "numerics/budget.hpp"
#include "numerics/check_ops.hpp"
#include "numerics/plain_emulation.hpp"
#include "python/src/arrays.hpp"
#include "python/src/docstrings.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kdalab::py {
namespace {

/// One budget of one quantity, with the rule that made it.
struct PyBudget {
  std::string quantity, precision, output_format, rule, label;
  double emulation = 0, output_rounding = 0, value = 0;
};

/// A declared precision: bf16, fp16, fp32, fp64 (numpy names float16, float32, float64, bfloat16 accepted).
Format precision_in(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return Format::bf16;
  if (s == "fp16" || s == "float16") return Format::fp16;
  if (s == "fp32" || s == "float32") return Format::fp32;
  if (s == "fp64" || s == "float64") return Format::fp64;
  throw Error("precision = '" + s + "' is not accepted; accepted: bf16, fp16, fp32, fp64 (or bfloat16, float16, "
              "float32, float64)");
}

/// A storage format: the precisions and tf32.
Format format_in(const std::string& s, const std::string& what) {
  if (s == "tf32") return Format::tf32;
  try {
    return precision_in(s);
  } catch (const Error&) {
    throw Error(what + " = '" + s + "' is not accepted; accepted: bf16, fp16, tf32, fp32, fp64 (or bfloat16, "
                "float16, float32, float64)");
  }
}

/// The output formats of the quantities: None (each stored at the declared precision), one str for all, or a
/// dict quantity -> format (a quantity not named is stored at the declared precision; a name that is not a
/// quantity is refused).
struct Formats {
  Format p;
  std::optional<Format> all;
  std::map<std::string, Format> per;

  Formats(Format prec, const nb::object& o) : p(prec) {
    if (o.is_none()) return;
    if (nb::isinstance<nb::str>(o)) {
      all = format_in(nb::cast<std::string>(o), "output_format");
      return;
    }
    require(nb::isinstance<nb::dict>(o), "output_format must be None, a str or a dict quantity -> str");
    for (auto [k, v] : nb::cast<nb::dict>(o)) {
      require(nb::isinstance<nb::str>(k) && nb::isinstance<nb::str>(v),
              "output_format: every key and value of the dict must be a str");
      const std::string q = nb::cast<std::string>(k);
      per.emplace(q, format_in(nb::cast<std::string>(v), "output_format['" + q + "']"));
    }
  }
  Format of(const std::string& q) const {
    if (auto it = per.find(q); it != per.end()) return it->second;
    return all ? *all : p;
  }
  /// Refuses a dict key that names none of the quantities.
  void require_known(const std::vector<std::string>& quantities) const {
    for (const auto& [q, f] : per) {
      bool known = false;
      for (const auto& n : quantities) known = known || n == q;
      std::string acc;
      for (const auto& n : quantities) acc += (acc.empty() ? "" : ", ") + n;
      require(known, "output_format names '" + q + "', which is not a quantity of this call; accepted: " + acc);
    }
  }
};

PyBudget make(const std::string& quantity, const Tensor<double>& emulation, const Tensor<double>& truth, Format p,
              Format fmt) {
  const Budget b = budget_of(emulation.data, truth.data, fmt);
  PyBudget r;
  r.quantity = quantity;
  r.precision = format_name(p);
  r.output_format = format_name(fmt);
  r.emulation = b.emulation;
  r.output_rounding = b.output_rounding;
  r.value = b.value;
  r.rule = fmt::format("budget = max(F (relRMS of the plain emulation at {} + relRMS of the truth rounded to {}), "
                       "floor) with F = {:g}, floor = {:g} (numerics/budget.hpp)",
                       r.precision, r.output_format, tol::budget_factor.value, tol::budget_floor.value);
  r.label = fmt::format("rule:F={:g} emulation {}, output {}", tol::budget_factor.value, r.precision, r.output_format);
  return r;
}

std::optional<Tensor<double>> opt_in(const std::optional<Array>& a, const std::string& name) {
  if (!a) return std::nullopt;
  return tensor_in(*a, name);
}

KdaGateKind gate_in(const std::string& s) {
  if (s == "none") return KdaGateKind::none;
  if (s == "k3") return KdaGateKind::k3;
  if (s == "softplus") return KdaGateKind::softplus;
  throw Error("gate = '" + s + "' is not accepted; accepted: none (g is the log-decay), k3 (g_min Sigmoid(e^A_log "
              "(g + bias))), softplus (-e^A_log Softplus(g + bias))");
}

/// Shapes of a KDA problem before its pre-ops (the derived tensors are validated by the reference).
void require_kda_shapes(const KdaCheckOp& c) {
  require(c.q.rank() == 4, "tensor 'q' must be [B, T, H, d_k], got shape " + shape_str(c.q.shape));
  require(c.v.rank() == 4, "tensor 'v' must be [B, T, HV, d_v], got shape " + shape_str(c.v.shape));
  const std::size_t B = c.q.dim(0), T = c.q.dim(1), H = c.q.dim(2), dk = c.q.dim(3), HV = c.v.dim(2), dv = c.v.dim(3);
  require(B >= 1 && T >= 1 && H >= 1 && dk >= 1 && HV >= 1 && dv >= 1,
          "tensors 'q'/'v' have an empty dimension: q " + shape_str(c.q.shape) + ", v " + shape_str(c.v.shape));
  require(HV % H == 0, fmt::format("tensor 'v' has HV = {} value heads, not a multiple of H = {} key heads", HV, H));
  require_shape(c.k, c.q.shape, "k");
  require_shape(c.v, {B, T, HV, dv}, "v");
  require_shape(c.g, {B, T, HV, dk}, "g");
  require_shape(c.beta, {B, T, HV}, "beta");
  if (c.gate != KdaGateKind::none) {
    require_shape(c.A_log, {HV}, "A_log");
    require_shape(c.bias, {HV, dk}, "bias");
  }
}

/// Sequence [t0, t1) of a packed varlen problem (B = 1), its state slot n.
KdaCheckOp kda_sequence(const KdaCheckOp& c, std::size_t t0, std::size_t t1, std::size_t n) {
  KdaCheckOp s = c;
  s.q = slice_tokens(c.q, t0, t1);
  s.k = slice_tokens(c.k, t0, t1);
  s.v = slice_tokens(c.v, t0, t1);
  s.g = slice_tokens(c.g, t0, t1);
  s.beta = slice_tokens(c.beta, t0, t1);
  if (c.has_S0) {
    const std::size_t st = c.S0.numel() / c.S0.dim(0);
    s.S0 = Tensor<double>({1, c.S0.dim(1), c.S0.dim(2), c.S0.dim(3)});
    std::copy(c.S0.data.begin() + static_cast<std::ptrdiff_t>(n * st),
              c.S0.data.begin() + static_cast<std::ptrdiff_t>((n + 1) * st), s.S0.data.begin());
  }
  return s;
}

/// Appends the values of `part` to `all` (sequences of a varlen problem, batch rows of an MLA decode).
void append(Tensor<double>& all, const Tensor<double>& part) {
  all.data.insert(all.data.end(), part.data.begin(), part.data.end());
}

nb::dict budget_kda(const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta,
                    const std::optional<Array>& S0, double scale, const std::string& precision,
                    const nb::object& output_format, const std::string& gate, const std::optional<Array>& A_log,
                    const std::optional<Array>& bias, double g_min, bool l2norm_qk, bool beta_logits,
                    const std::optional<std::vector<std::int64_t>>& cu_seqlens, const std::optional<Array>& dO,
                    const std::optional<Array>& dS, std::int64_t chunk) {
  const Format p = precision_in(precision);
  const Formats fm(p, output_format);
  require(chunk >= 1, fmt::format("chunk = {} is not accepted; give an integer >= 1 (64: the chunked form; 1: the "
                                  "recurrence, as kda-decode)", chunk));
  KdaCheckOp c;
  c.q = tensor_in(q, "q"); c.k = tensor_in(k, "k"); c.v = tensor_in(v, "v"); c.g = tensor_in(g, "g");
  c.beta = tensor_in(beta, "beta");
  c.gate = gate_in(gate);
  require(c.gate != KdaGateKind::none || (!A_log && !bias),
          "A_log / bias are given but gate = 'none' (g is the log-decay); pass gate = 'k3' or 'softplus' to use them");
  require(c.gate == KdaGateKind::none || (A_log && bias), "gate = '" + gate + "' needs A_log [HV] and bias [HV, d_k]");
  if (A_log) c.A_log = tensor_in(*A_log, "A_log");
  if (bias) c.bias = tensor_in(*bias, "bias");
  c.g_min = g_min; c.scale = scale; c.l2norm = l2norm_qk; c.beta_logits = beta_logits;
  if (S0) {
    c.S0 = tensor_in(*S0, "S0");
    c.has_S0 = true;
  }
  require_kda_shapes(c);
  const std::size_t B = c.q.dim(0), T = c.q.dim(1), HV = c.v.dim(2), dk = c.q.dim(3), dv = c.v.dim(3);
  const auto C = static_cast<std::size_t>(chunk);
  std::vector<std::string> names{"o", "S"};
  std::map<std::string, std::pair<Tensor<double>, Tensor<double>>> et;  // quantity -> (emulation, truth)
  if (!dO) {
    require(!dS, "dS_T (the upstream gradient of the final state) is given without dO");
    if (!cu_seqlens) {
      const KdaOutput<double> t = kda_check_truth<double>(c);
      const emul::KdaEmulation e = emul::kda(c, p, C);
      et["o"] = {e.o, t.o};
      et["S"] = {e.S, t.S_final};
    } else {
      std::vector<std::size_t> cu;
      for (auto x : *cu_seqlens) {
        require(x >= 0, fmt::format("cu_seqlens holds {}; offsets are >= 0", x));
        cu.push_back(static_cast<std::size_t>(x));
      }
      require(B == 1, fmt::format("tensor 'q' has B = {}; a variable-length batch packs its sequences along T with B = 1", B));
      validate_cu_seqlens(cu, T);
      const std::size_t N = cu.size() - 1;
      if (c.has_S0) require_shape(c.S0, {N, HV, dk, dv}, "S0");
      auto& [eo, to] = et["o"];
      auto& [eS, tS] = et["S"];
      for (std::size_t n = 0; n < N; ++n) {
        if (cu[n + 1] == cu[n]) {  // an empty sequence: its state passes through, exact in both
          const Tensor<double> s0 = c.has_S0 ? kda_sequence(c, 0, 1, n).S0 : Tensor<double>({1, HV, dk, dv});
          append(eS, s0);
          append(tS, s0);
          continue;
        }
        const KdaCheckOp s = kda_sequence(c, cu[n], cu[n + 1], n);
        const KdaOutput<double> t = kda_check_truth<double>(s);
        const emul::KdaEmulation e = emul::kda(s, p, C);
        append(eo, e.o); append(to, t.o); append(eS, e.S); append(tS, t.S_final);
      }
    }
  } else {
    require(!cu_seqlens, "dO is given with cu_seqlens: the gradient budgets take no variable-length batch");
    const Tensor<double> dOt = tensor_in(*dO, "dO");
    require_shape(dOt, {B, T, HV, dv}, "dO");
    const auto dSt = opt_in(dS, "dS_T");
    if (dSt) require_shape(*dSt, {B, HV, dk, dv}, "dS_T");
    const KdaOutput<double> t = kda_check_truth<double>(c);
    const KdaCheckGrads tg = kda_check_backward_truth<double>(c, dOt, dSt ? &*dSt : nullptr);
    const emul::KdaEmulation e = emul::kda(c, p, C, &dOt, dSt ? &*dSt : nullptr);
    et["o"] = {e.o, t.o};
    et["S"] = {e.S, t.S_final};
    et["dq"] = {e.grads.dq, tg.dq};
    et["dk"] = {e.grads.dk, tg.dk};
    et["dv"] = {e.grads.dv, tg.dv};
    et["dg"] = {e.grads.dg, tg.dg};
    et["dbeta"] = {e.grads.dbeta, tg.dbeta};
    et["dS0"] = {e.grads.dS0, tg.dS0};
    names.insert(names.end(), {"dq", "dk", "dv", "dg", "dbeta", "dS0"});
    if (c.gate != KdaGateKind::none) {
      et["dA_log"] = {e.grads.dA_log, tg.dA_log};
      et["dbias"] = {e.grads.dbias, tg.dbias};
      names.insert(names.end(), {"dA_log", "dbias"});
    }
  }
  fm.require_known(names);
  nb::dict out;
  for (const auto& n : names) out[n.c_str()] = make(n, et[n].first, et[n].second, p, fm.of(n));
  return out;
}

/// Batch row b of an MLA problem over its first L cached tokens (dO row b into *dOb when given).
MlaCheckOp mla_row(const MlaCheckOp& m, std::size_t b, std::size_t L) {
  const std::size_t T = m.q.dim(1), H = m.q.dim(2), dc = m.q.dim(3), N = m.c.dim(1), dr = m.d_rope();
  MlaCheckOp r;
  r.scale = m.scale;
  r.q = Tensor<double>({1, T, H, dc});
  r.c = Tensor<double>({1, L, dc});
  std::copy_n(m.q.data.begin() + static_cast<std::ptrdiff_t>(b * T * H * dc), T * H * dc, r.q.data.begin());
  std::copy_n(m.c.data.begin() + static_cast<std::ptrdiff_t>(b * N * dc), L * dc, r.c.data.begin());
  if (dr) {
    r.q_rope = Tensor<double>({1, T, H, dr});
    r.k_rope = Tensor<double>({1, L, dr});
    std::copy_n(m.q_rope.data.begin() + static_cast<std::ptrdiff_t>(b * T * H * dr), T * H * dr, r.q_rope.data.begin());
    std::copy_n(m.k_rope.data.begin() + static_cast<std::ptrdiff_t>(b * N * dr), L * dr, r.k_rope.data.begin());
  }
  return r;
}

/// Rows [L, N) of a gradient of the cache [1, L, d] padded with zeros to [1, N, d] (tokens no query reads).
Tensor<double> pad_tokens(const Tensor<double>& x, std::size_t N) {
  Tensor<double> y({1, N, x.dim(2)});
  std::copy(x.data.begin(), x.data.end(), y.data.begin());
  return y;
}

nb::dict budget_mla(const Array& q, const Array& c, const std::optional<Array>& q_rope, const std::optional<Array>& k_rope,
                    double scale, const std::string& precision, const nb::object& output_format,
                    const std::optional<std::vector<std::int64_t>>& lens, const std::optional<Array>& dO) {
  const Format p = precision_in(precision);
  const Formats fm(p, output_format);
  MlaCheckOp m;
  m.q = tensor_in(q, "q");
  m.c = tensor_in(c, "c");
  m.scale = scale;
  require(m.q.rank() == 4, "tensor 'q' must be [B, T, H, d_c], got shape " + shape_str(m.q.shape));
  require(m.c.rank() == 3, "tensor 'c' must be [B, N, d_c], got shape " + shape_str(m.c.shape));
  const std::size_t B = m.q.dim(0), T = m.q.dim(1), H = m.q.dim(2), dc = m.q.dim(3), N = m.c.dim(1);
  require(B >= 1 && T >= 1 && H >= 1 && dc >= 1, "tensor 'q' has an empty dimension: " + shape_str(m.q.shape));
  require_shape(m.c, {B, N, dc}, "c");
  require(N >= T, fmt::format("tensor 'c' holds N = {} tokens, fewer than the T = {} queries (query t sits at "
                              "position N - T + t)", N, T));
  require(static_cast<bool>(q_rope) == static_cast<bool>(k_rope), "q_rope and k_rope are given together or not at all");
  if (q_rope) {
    m.q_rope = tensor_in(*q_rope, "q_rope");
    m.k_rope = tensor_in(*k_rope, "k_rope");
    require(m.q_rope.rank() == 4, "tensor 'q_rope' must be [B, T, H, d_rope], got shape " + shape_str(m.q_rope.shape));
    require_shape(m.q_rope, {B, T, H, m.q_rope.dim(3)}, "q_rope");
    require_shape(m.k_rope, {B, N, m.q_rope.dim(3)}, "k_rope");
  }
  for (const Tensor<double>* t : {&m.q, &m.c, &m.q_rope, &m.k_rope})
    for (double x : t->data) require(std::isfinite(x), "the MLA inputs hold a non-finite value");
  std::vector<std::size_t> L(B, N);
  if (lens) {
    require(lens->size() == B, fmt::format("lens has {} entries; give one cache length per batch row (B = {})",
                                           lens->size(), B));
    for (std::size_t b = 0; b < B; ++b) {
      require((*lens)[b] >= static_cast<std::int64_t>(T) && (*lens)[b] <= static_cast<std::int64_t>(N),
              fmt::format("lens[{}] = {}; accepted: T = {} <= length <= N = {}", b, (*lens)[b], T, N));
      L[b] = static_cast<std::size_t>((*lens)[b]);
    }
  }
  std::optional<Tensor<double>> dOt;
  if (dO) {
    dOt = tensor_in(*dO, "dO");
    require_shape(*dOt, m.q.shape, "dO");
  }
  std::vector<std::string> names{"o"};
  if (dOt) {
    names.insert(names.end(), {"dq", "dc"});
    if (m.d_rope()) names.insert(names.end(), {"dq_rope", "dk_rope"});
  }
  fm.require_known(names);
  std::map<std::string, std::pair<Tensor<double>, Tensor<double>>> et;
  for (std::size_t b = 0; b < B; ++b) {  // one row at a time: each reads its own L_b cached tokens
    const MlaCheckOp r = mla_row(m, b, L[b]);
    std::optional<Tensor<double>> dOb;
    if (dOt) {
      dOb = Tensor<double>({1, T, H, dc});
      std::copy_n(dOt->data.begin() + static_cast<std::ptrdiff_t>(b * T * H * dc), T * H * dc, dOb->data.begin());
    }
    const emul::MlaEmulation e = emul::mla(r, p, dOb ? &*dOb : nullptr);
    append(et["o"].first, e.o);
    append(et["o"].second, mla_check_truth<double>(r));
    if (dOb) {
      const MlaCheckGrads t = mla_check_backward_truth<double>(r, *dOb);
      append(et["dq"].first, e.grads.dq);
      append(et["dq"].second, t.dq);
      append(et["dc"].first, pad_tokens(e.grads.dc, N));
      append(et["dc"].second, pad_tokens(t.dc, N));
      if (m.d_rope()) {
        append(et["dq_rope"].first, e.grads.dq_rope);
        append(et["dq_rope"].second, t.dq_rope);
        append(et["dk_rope"].first, pad_tokens(e.grads.dk_rope, N));
        append(et["dk_rope"].second, pad_tokens(t.dk_rope, N));
      }
    }
  }
  nb::dict out;
  for (const auto& n : names) out[n.c_str()] = make(n, et[n].first, et[n].second, p, fm.of(n));
  return out;
}

}  // namespace

void bind_budget(nb::module_& m) {
  nb::class_<PyBudget>(m, "Budget", doc::Budget)
      .def_ro("quantity", &PyBudget::quantity)
      .def_ro("emulation", &PyBudget::emulation)
      .def_ro("output_rounding", &PyBudget::output_rounding)
      .def_ro("value", &PyBudget::value)
      .def_ro("precision", &PyBudget::precision)
      .def_ro("output_format", &PyBudget::output_format)
      .def_ro("rule", &PyBudget::rule)
      .def_ro("label", &PyBudget::label)
      .def("__repr__", [](const PyBudget& b) {
        return fmt::format("Budget({}: {:.3e} = max({:g} x ({:.3e} emulation at {} + {:.3e} rounding to {}), {:g}))",
                           b.quantity, b.value, tol::budget_factor.value, b.emulation, b.precision, b.output_rounding,
                           b.output_format, tol::budget_floor.value);
      });
  m.attr("BUDGET_FACTOR") = tol::budget_factor.value;
  m.attr("BUDGET_FLOOR") = tol::budget_floor.value;
  m.def(
      "budget_of",
      [](const Array& emulation, const Array& truth, const std::string& precision, const std::string& output_format,
         const std::string& quantity) {
        const Tensor<double> e = tensor_in(emulation, "emulation"), t = tensor_in(truth, "truth");
        require(e.shape == t.shape, "tensor 'emulation' has shape " + shape_str(e.shape) + ", the truth has " +
                                        shape_str(t.shape) + "; they must agree");
        return make(quantity, e, t, precision_in(precision), format_in(output_format, "output_format"));
      },
      "emulation"_a, "truth"_a, nb::kw_only(), "precision"_a, "output_format"_a, "quantity"_a = "x", doc::budget_of);
  m.def("budget_kda", &budget_kda, "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "S0"_a = nb::none(), nb::kw_only(), "scale"_a,
        "precision"_a, "output_format"_a = nb::none(), "gate"_a = "none", "A_log"_a = nb::none(), "bias"_a = nb::none(),
        "g_min"_a = -5.0, "l2norm_qk"_a = false, "beta_logits"_a = false, "cu_seqlens"_a = nb::none(),
        "dO"_a = nb::none(), "dS_T"_a = nb::none(), "chunk"_a = 64, doc::budget_kda);
  m.def("budget_mla", &budget_mla, "q"_a, "c"_a, "q_rope"_a = nb::none(), "k_rope"_a = nb::none(), nb::kw_only(),
        "scale"_a, "precision"_a, "output_format"_a = nb::none(), "lens"_a = nb::none(), "dO"_a = nb::none(),
        doc::budget_mla);
}

}  // namespace kdalab::py
