// The Python module kdalab._core (nanobind): arrays in through DLPack / the buffer protocol
// (numpy arrays, torch tensors), the reference of python/src/oracle.hpp, the metrics of
// numerics/metrics.hpp with the verdict of `kdalab check`, the named input generators of
// numerics/kda_inputs.hpp and numerics/random.hpp, and the HDF5 results writer of
// experiments/results.hpp. Shapes and layouts of each function: python/kdalab/_core.pyi.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "experiments/results.hpp"
#include "numerics/kda_inputs.hpp"
#include "numerics/metrics.hpp"
#include "numerics/random.hpp"
#include "numerics/recall_tasks.hpp"
#include "numerics/tolerance.hpp"
#include "python/src/arrays.hpp"
#ifdef KDALAB_HAVE_CUDA
#include "python/src/cuda_kernels.hpp"
#endif
#include "python/src/docstrings.hpp"
#include "python/src/oracle.hpp"
#include "reference/error.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kdalab::py {

void bind_budget(nb::module_& m);  // python/src/budget.cpp

std::string shape_of(const Array& a) {
  std::vector<std::size_t> s(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) s[i] = a.shape(i);
  return shape_str(s);
}

std::string dtype_name(const nb::dlpack::dtype& d) {
  const char* kind = d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float)    ? "float"
                     : d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) ? "bfloat"
                     : d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int)    ? "int"
                     : d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt)   ? "uint"
                     : d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bool)   ? "bool"
                                                                                           : "complex";
  return std::string(kind) + std::to_string(d.bits);
}

void require_array(const Array& a, const std::string& name) {
  if (!a.given.is_valid()) return;
  // a numpy array nanobind cannot read (object dtype, non-native byte order) says its dtype
  std::string what = Py_TYPE(a.given.ptr())->tp_name;
  if (nb::hasattr(a.given, "dtype"))
    what += " of dtype " + std::string(nb::steal<nb::str>(PyObject_Str(nb::object(a.given.attr("dtype")).ptr())).c_str());
  throw Error("tensor '" + name + "' is a " + what + ", not an array kdalab reads; accepted: a numpy array or torch "
              "tensor (DLPack or the buffer protocol) of numbers in native byte order, e.g. numpy.asarray(" + name +
              ", dtype=numpy.float64)");
}

namespace {
/// Checks device, layout and dtype of array `name` and returns its shape; throws kdalab::Error naming it.
std::vector<std::size_t> checked_shape(const Array& a, const std::string& name) {
  require_array(a, name);
  require(a.device_type() == nb::device::cpu::value,
          "tensor '" + name + "' is on a GPU (DLPack device type " + std::to_string(a.device_type()) +
              "); the reference runs on the CPU: pass " + name + ".cpu()");
  std::vector<std::size_t> shape(a.ndim());
  std::int64_t expect = 1;
  bool contiguous = true;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    shape[i] = a.shape(i);
    if (a.shape(i) != 1 && a.stride(i) != expect) contiguous = false;
    expect *= static_cast<std::int64_t>(a.shape(i));
  }
  if (expect != 0)
    require(contiguous, "tensor '" + name + "' of shape " + shape_of(a) +
                            " is not C-contiguous (row-major); pass numpy.ascontiguousarray(" + name + ") or " + name +
                            ".contiguous()");
  return shape;
}

}  // namespace

Tensor<double> tensor_in(const Array& a, const std::string& name) {
  require_array(a, name);
  require(a.dtype() == nb::dtype<double>(),
          "tensor '" + name + "' has dtype " + dtype_name(a.dtype()) +
              "; accepted: float64 (the reference takes its inputs exactly: convert with " + name +
              ".astype(numpy.float64) or " + name + ".double())");
  Tensor<double> t(checked_shape(a, name));
  if (t.numel()) std::memcpy(t.data.data(), a.data(), t.numel() * sizeof(double));
  return t;
}

namespace {
/// A candidate (float64, float32 or bfloat16; CPU; C-contiguous) -> doubles, each value exact.
std::vector<double> values_in(const Array& a, const std::string& name) {
  const auto shape = checked_shape(a, name);
  std::size_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<double> out(n);
  const nb::dlpack::dtype d = a.dtype();
  if (d == nb::dtype<double>()) {
    if (n) std::memcpy(out.data(), a.data(), n * sizeof(double));
  } else if (d == nb::dtype<float>()) {
    const auto* p = static_cast<const float*>(a.data());
    for (std::size_t i = 0; i < n; ++i) out[i] = p[i];
  } else if (d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) && d.bits == 16 && d.lanes == 1) {
    const auto* p = static_cast<const std::uint16_t*>(a.data());
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t bits = static_cast<std::uint32_t>(p[i]) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      out[i] = f;
    }
  } else {
    throw Error("tensor '" + name + "' has dtype " + dtype_name(d) + "; accepted: float64, float32, bfloat16");
  }
  return out;
}

}  // namespace

Out tensor_out(Tensor<double> t) {
  auto* v = new std::vector<double>(std::move(t.data));
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  return Out(v->data(), t.shape.size(), t.shape.data(), owner);
}

namespace {

Named named_in(const std::map<std::string, Array>& m) {
  Named r;
  for (const auto& [k, a] : m) r.emplace(k, tensor_in(a, k));
  return r;
}

/// Layer options from a dict: int, float, bool or str values, as the text the option parsers read.
Options options_in(const nb::dict& d, const std::string& what) {
  Options o;
  for (auto [k, v] : d) {
    require(nb::isinstance<nb::str>(k), what + ": every key must be a str");
    const std::string key = nb::cast<std::string>(k);
    std::string val;
    if (nb::isinstance<nb::bool_>(v))
      val = nb::cast<bool>(v) ? "true" : "false";
    else if (nb::isinstance<nb::int_>(v) || nb::isinstance<nb::float_>(v) || nb::isinstance<nb::str>(v))
      val = nb::cast<std::string>(nb::str(v));
    else
      throw Error(what + ": option '" + key + "' has a value of type " +
                  nb::cast<std::string>(nb::str(v.type().attr("__name__"))) + "; accepted: int, float, bool, str");
    o.emplace(key, val);
  }
  return o;
}

std::optional<Tensor<double>> opt_in(const std::optional<Array>& a, const std::string& name) {
  if (!a) return std::nullopt;
  return tensor_in(*a, name);
}

nb::tuple kda_out(KdaResult r) { return nb::make_tuple(tensor_out(std::move(r.o)), tensor_out(std::move(r.S))); }

/// The result of check(): the metrics of numerics/metrics.hpp and the verdict of `kdalab check`.
struct CheckResult {
  std::string name;
  double rel_rms = 0, max_abs = 0, tol = 0;
  std::int64_t max_ulp_bf16 = 0, nan_count = 0, inf_count = 0, n = 0;
  bool passed = false;
  std::string verdict;
};

CheckResult check(const Array& x, const Array& truth, const std::string& name, double tol) {
  require(std::isfinite(tol) && tol > 0, fmt::format("tol = {} is not accepted; give a number > 0", tol));
  const std::vector<double> xv = values_in(x, name), tv = values_in(truth, "truth");
  require(x.ndim() == truth.ndim() && shape_of(x) == shape_of(truth),
          "tensor '" + name + "' has shape " + shape_of(x) + ", the truth has " + shape_of(truth) + "; they must agree");
  // an empty tensor compares nothing: a pass would say nothing about the candidate
  require(!xv.empty(), "tensor '" + name + "' has shape " + shape_of(x) + ": no elements to compare; give at least one");
  ErrorMetrics m = compare(xv, tv, name);
  // tol is relative: against an all-zero truth a nonzero candidate is infinitely far (compare() gives the absolute
  // ||x||_2 there, which a relative tol must not judge), as in experiments/check.cpp
  if (m.rel_rms > 0 && std::all_of(tv.begin(), tv.end(), [](double t) { return t == 0.0; })) m.rel_rms = INFINITY;
  CheckResult r;
  r.name = name;
  r.rel_rms = m.rel_rms;
  r.max_abs = m.max_abs;
  r.max_ulp_bf16 = m.max_ulp_bf16;
  r.nan_count = m.nan_count;
  r.inf_count = m.inf_count;
  r.n = static_cast<std::int64_t>(m.n);
  r.tol = tol;
  r.passed = m.rel_rms <= tol && m.nan_count == 0 && m.inf_count == 0;  // experiments/check.cpp's verdict
  r.verdict = fmt::format("{} {:.3e} {} {:.1e}", name, m.rel_rms, r.passed ? "<=" : ">", tol);
  return r;
}

nb::dict inputs_out(KdaInputs in) {
  nb::dict d;
  d["B"] = in.B; d["T"] = in.T; d["H"] = in.H; d["HV"] = in.HV; d["d_k"] = in.d_k; d["d_v"] = in.d_v;
  d["g_min"] = in.g_min; d["scale"] = in.scale; d["seed"] = in.seed; d["generator"] = in.generator;
  const std::pair<const char*, Tensor<double>*> ts[] = {
      {"q_raw", &in.q_raw}, {"k_raw", &in.k_raw}, {"v", &in.v}, {"g_raw", &in.g_raw}, {"beta_raw", &in.beta_raw},
      {"A_log", &in.A_log}, {"bias", &in.bias},   {"S0", &in.S0}, {"q", &in.q},         {"k", &in.k},
      {"g", &in.g},         {"beta", &in.beta}};
  for (const auto& [n, t] : ts) d[n] = tensor_out(std::move(*t));
  return d;
}

std::size_t count(std::int64_t n, const char* name) {
  require(n >= 0, std::string(name) + " = " + std::to_string(n) + " is not accepted; give an integer >= 0");
  return static_cast<std::size_t>(n);
}

/// The text of a refused argument: its repr (at most 60 characters) and, unless `expected`, its type.
std::string shown_arg(nb::handle h, bool expected) {
  std::string shown = nb::repr(h).c_str();
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  return expected ? shown : shown + " (" + Py_TYPE(h.ptr())->tp_name + ")";
}
/// An integer argument of the token tasks: a Python int or anything with __index__ (numpy integers), bool excluded,
/// in [lo, hi]. Else kdalab::Error naming the function, the argument, its value (and type when not an integer) and
/// the range: nanobind's own TypeError names neither the argument nor the value (a seed of -1 or 2^64, n = 1.5).
/// The token tasks take every argument as a handle that may be None, so that None gets this message too.
template <class T>
T integer_arg(nb::handle h, const char* fn, const char* name, T lo, T hi, const char* range) {
  PyObject* o = h.ptr();
  if (!PyBool_Check(o) && PyIndex_Check(o)) {
    nb::object i = nb::steal(PyNumber_Index(o));
    if (i.is_valid()) {
      T v{};
      bool ok;
      if constexpr (std::is_unsigned_v<T>) {
        v = static_cast<T>(PyLong_AsUnsignedLongLong(i.ptr()));
        ok = !PyErr_Occurred();
      } else {
        int overflow = 0;
        v = static_cast<T>(PyLong_AsLongLongAndOverflow(i.ptr(), &overflow));
        ok = overflow == 0 && !PyErr_Occurred();
      }
      PyErr_Clear();
      if (ok && v >= lo && v <= hi) return v;
    }
    PyErr_Clear();
  }
  throw Error(std::string(fn) + ": " + name + " = " + shown_arg(h, !PyBool_Check(o) && PyIndex_Check(o)) +
              "; accepted: an integer in " + range);
}
/// mqar's power_a: a number (int, float, numpy scalar; not bool, str, None), else kdalab::Error naming it.
double real_arg(nb::handle h, const char* fn, const char* name) {
  PyObject* o = h.ptr();
  if (!PyBool_Check(o) && PyNumber_Check(o)) {
    const double x = PyFloat_AsDouble(o);
    if (!PyErr_Occurred()) return x;
    PyErr_Clear();
  }
  throw Error(std::string(fn) + ": " + name + " = " + shown_arg(h, false) + "; accepted: a number in (0, 1]");
}
/// mqar's random_non_queries: True or False (numpy bools too), else kdalab::Error naming it (a string "no" is
/// not taken for True).
bool bool_arg(nb::handle h, const char* fn, const char* name) {
  PyObject* o = h.ptr();
  if (PyBool_Check(o)) return o == Py_True;
  if (std::string(Py_TYPE(o)->tp_name) == "numpy.bool" || std::string(Py_TYPE(o)->tp_name) == "numpy.bool_")
    return PyObject_IsTrue(o) == 1;
  throw Error(std::string(fn) + ": " + name + " = " + shown_arg(h, false) + "; accepted: True or False");
}
std::size_t size_arg(nb::handle h, const char* fn, const char* name) {
  return static_cast<std::size_t>(
      integer_arg<std::int64_t>(h, fn, name, 1, std::numeric_limits<std::int64_t>::max(), "[1, 2^63 - 1]"));
}
std::int64_t vocab_arg(nb::handle h, const char* fn) {
  return integer_arg<std::int64_t>(h, fn, "vocab", 1, std::numeric_limits<std::int64_t>::max(), "[1, 2^63 - 1]");
}
std::uint64_t seed_arg(nb::handle h, const char* fn) {
  return integer_arg<std::uint64_t>(h, fn, "seed", 0, std::numeric_limits<std::uint64_t>::max(), "[0, 2^64 - 1]");
}

/// A token task (numerics/recall_tasks.hpp) as a dict: inputs and targets as numpy int64 [n, L], and its facts.
nb::dict task_out(TokenTask d) {
  using I64 = nb::ndarray<nb::numpy, std::int64_t>;
  auto int_array = [&](std::vector<std::int64_t>&& v) {
    auto* p = new std::vector<std::int64_t>(std::move(v));
    nb::capsule owner(p, [](void* x) noexcept { delete static_cast<std::vector<std::int64_t>*>(x); });
    const std::size_t shape[2] = {d.n, d.L};
    return I64(p->data(), 2, shape, owner);
  };
  nb::dict r;
  r["task"] = d.task; r["n"] = d.n; r["seq_len"] = d.L; r["vocab"] = d.vocab; r["seed"] = d.seed;
  r["checksum"] = task_checksum(d);
  r["inputs"] = int_array(std::move(d.inputs));
  r["targets"] = int_array(std::move(d.targets));
  return r;
}

/// Named budgets of numerics/tolerance.hpp (relative RMS unless the reason says otherwise).
nb::dict budgets() {
  nb::dict d;
  const std::pair<const char*, tol::Tolerance> ts[] = {
      {"check_default", tol::check_default},   {"f64_vs_mp", tol::f64_vs_mp},
      {"f64_identity", tol::f64_identity},     {"mp_identity", tol::mp_identity},
      {"f32_vs_truth", tol::f32_vs_truth},     {"bf16_output_floor", tol::bf16_output_floor},
      {"kda_bf16_goal", tol::kda_bf16_goal},   {"golden_f64", tol::golden_f64},
      {"golden_mp", tol::golden_mp},           {"check_self", tol::check_self},
      {"mla_decode_goal", tol::mla_decode_goal}, {"mla_decode_fast", tol::mla_decode_fast},
      {"mla_prefill_goal", tol::mla_prefill_goal},
      {"attn_res_f32", tol::attn_res_f32},     {"attn_res_bf16", tol::attn_res_bf16},
      {"backward_f64_vs_mp", tol::backward_f64_vs_mp}, {"backward_fd_f64", tol::backward_fd_f64},
      {"kda_bwd_bf16", tol::kda_bwd_bf16},     {"kda_bwd_f32", tol::kda_bwd_f32}};
  for (const auto& [n, t] : ts) d[n] = nb::make_tuple(t.value, std::string(t.why));
  return d;
}

}  // namespace
}  // namespace kdalab::py

NB_MODULE(_core, m) {
  using namespace kdalab;
  using namespace kdalab::py;
  m.doc() = "kdalab's C++ core: the reference (oracle), metrics, input generators, HDF5 results writer";
  nb::exception<kdalab::Error>(m, "Error", PyExc_ValueError);

#ifdef KDALAB_HAVE_CUDA
  m.attr("built_with_cuda") = true;
  bind_cuda(m);
  bind_cuda_host_path(m);
#else
  m.attr("built_with_cuda") = false;
#endif
  m.attr("software_version") = software_version();

  m.def(
      "kda_recurrent",
      [](const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta,
         const std::optional<Array>& S0, double scale, const std::string& variant, const std::string& precision) {
        const Precision p = parse_precision(precision);
        const auto s0 = opt_in(S0, "S0");
        return kda_out(py::kda_recurrent(tensor_in(q, "q"), tensor_in(k, "k"), tensor_in(v, "v"), tensor_in(g, "g"),
                                         tensor_in(beta, "beta"), s0 ? &*s0 : nullptr, scale, variant, p));
      },
      "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "S0"_a = nb::none(), nb::kw_only(), "scale"_a, "variant"_a = "kda",
      "precision"_a = "float64", doc::kda_recurrent);
  m.def(
      "kda_chunked",
      [](const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta,
         const std::optional<Array>& S0, double scale, std::int64_t C, std::int64_t tile, const std::string& variant,
         const std::string& precision) {
        const Precision p = parse_precision(precision);
        const auto s0 = opt_in(S0, "S0");
        return kda_out(py::kda_chunked(tensor_in(q, "q"), tensor_in(k, "k"), tensor_in(v, "v"), tensor_in(g, "g"),
                                       tensor_in(beta, "beta"), s0 ? &*s0 : nullptr, scale, count(C, "C"),
                                       count(tile, "tile"), variant, p));
      },
      "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "S0"_a = nb::none(), nb::kw_only(), "scale"_a, "C"_a = 64, "tile"_a = 16,
      "variant"_a = "kda", "precision"_a = "float64", doc::kda_chunked);
  m.def(
      "kda_decode",
      [](const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta, const Array& S0,
         double scale, const std::string& precision) {
        const Precision p = parse_precision(precision);
        return kda_out(py::kda_decode(tensor_in(q, "q"), tensor_in(k, "k"), tensor_in(v, "v"), tensor_in(g, "g"),
                                      tensor_in(beta, "beta"), tensor_in(S0, "S0"), scale, p));
      },
      "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "S0"_a, nb::kw_only(), "scale"_a, "precision"_a = "float64", doc::kda_decode);
  m.def(
      "kda_layer",
      [](const Array& x, const std::map<std::string, Array>& weights, const nb::dict& config,
         const std::string& precision) {
        const Precision p = parse_precision(precision);
        KdaLayerResult r = py::kda_layer(tensor_in(x, "x"), named_in(weights), options_in(config, "kda_layer config"), p);
        return nb::make_tuple(tensor_out(std::move(r.y)), tensor_out(std::move(r.o_core)), tensor_out(std::move(r.S)));
      },
      "x"_a, "weights"_a, "config"_a, nb::kw_only(), "precision"_a = "float64", doc::kda_layer);
  m.def(
      "mla",
      [](const Array& x, const std::map<std::string, Array>& weights, const nb::dict& config, const std::string& eval,
         const std::string& precision) {
        const Precision p = parse_precision(precision);
        return tensor_out(py::mla(tensor_in(x, "x"), named_in(weights), options_in(config, "mla config"), eval, p));
      },
      "x"_a, "weights"_a, "config"_a, nb::kw_only(), "eval"_a = "naive", "precision"_a = "float64", doc::mla);
  m.def(
      "attn_res",
      [](const Array& v, const Array& w, const std::string& mode, std::int64_t block_sources, double eps,
         const std::string& precision) {
        const Precision p = parse_precision(precision);
        return tensor_out(py::attn_res(tensor_in(v, "v"), tensor_in(w, "w"), mode, count(block_sources, "block_sources"),
                                       eps, p));
      },
      "v"_a, "w"_a, nb::kw_only(), "mode"_a, "block_sources"_a = 1, "eps"_a = 1e-6, "precision"_a = "float64", doc::attn_res);

  // ---- gradients (vector-Jacobian products): dicts of numpy float64 arrays, shaped as the inputs
  const auto kda_grad_out = [](KdaGradResult r) {
    nb::dict d;
    d["dq"] = tensor_out(std::move(r.dq));
    d["dk"] = tensor_out(std::move(r.dk));
    d["dv"] = tensor_out(std::move(r.dv));
    d["dg"] = tensor_out(std::move(r.dg));
    d["dbeta"] = tensor_out(std::move(r.dbeta));
    d["dS0"] = tensor_out(std::move(r.dS0));
    return d;
  };
  m.def(
      "kda_recurrent_backward",
      [kda_grad_out](const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta,
                     const std::optional<Array>& S0, const Array& dO, const std::optional<Array>& dS_T, double scale,
                     const std::string& variant, std::int64_t checkpoint, const std::string& precision) {
        const Precision p = parse_precision(precision);
        const auto s0 = opt_in(S0, "S0"), dst = opt_in(dS_T, "dS_T");
        return kda_grad_out(py::kda_recurrent_backward(
            tensor_in(q, "q"), tensor_in(k, "k"), tensor_in(v, "v"), tensor_in(g, "g"), tensor_in(beta, "beta"),
            s0 ? &*s0 : nullptr, tensor_in(dO, "dO"), dst ? &*dst : nullptr, scale, variant,
            count(checkpoint, "checkpoint"), p));
      },
      "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "S0"_a.none(), "dO"_a, "dS_T"_a = nb::none(), nb::kw_only(), "scale"_a,
      "variant"_a = "kda", "checkpoint"_a = 0, "precision"_a = "float64", doc::kda_recurrent_backward);
  m.def(
      "kda_chunked_backward",
      [kda_grad_out](const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta,
                     const std::optional<Array>& S0, const Array& dO, const std::optional<Array>& dS_T, double scale,
                     std::int64_t C, const std::string& precision) {
        const Precision p = parse_precision(precision);
        const auto s0 = opt_in(S0, "S0"), dst = opt_in(dS_T, "dS_T");
        return kda_grad_out(py::kda_chunked_backward(tensor_in(q, "q"), tensor_in(k, "k"), tensor_in(v, "v"),
                                                     tensor_in(g, "g"), tensor_in(beta, "beta"), s0 ? &*s0 : nullptr,
                                                     tensor_in(dO, "dO"), dst ? &*dst : nullptr, scale, count(C, "C"), p));
      },
      "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "S0"_a.none(), "dO"_a, "dS_T"_a = nb::none(), nb::kw_only(), "scale"_a,
      "C"_a = 64, "precision"_a = "float64", doc::kda_chunked_backward);
  m.def(
      "gate",
      [](const Array& z, const Array& A_log, const Array& bias, const std::string& kind, double g_min,
         const std::string& precision) {
        const Precision p = parse_precision(precision);
        return tensor_out(py::gate(tensor_in(z, "z"), tensor_in(A_log, "A_log"), tensor_in(bias, "bias"), kind, g_min, p));
      },
      "z"_a, "A_log"_a, "bias"_a, nb::kw_only(), "kind"_a = "bounded", "g_min"_a = -5.0, "precision"_a = "float64",
      doc::gate);
  m.def(
      "gate_backward",
      [](const Array& z, const Array& A_log, const Array& bias, const Array& dg, const std::string& kind, double g_min,
         const std::string& precision) {
        const Precision p = parse_precision(precision);
        GateGradResult r = py::gate_backward(tensor_in(z, "z"), tensor_in(A_log, "A_log"), tensor_in(bias, "bias"),
                                             tensor_in(dg, "dg"), kind, g_min, p);
        nb::dict d;
        d["dz"] = tensor_out(std::move(r.dz));
        d["dA_log"] = tensor_out(std::move(r.dA_log));
        d["dbias"] = tensor_out(std::move(r.dbias));
        return d;
      },
      "z"_a, "A_log"_a, "bias"_a, "dg"_a, nb::kw_only(), "kind"_a = "bounded", "g_min"_a = -5.0,
      "precision"_a = "float64", doc::gate_backward);
  m.def(
      "attn_res_backward",
      [](const Array& v, const Array& w, const Array& dh, const std::string& mode, std::int64_t block_sources,
         double eps, const std::string& precision) {
        const Precision p = parse_precision(precision);
        AttnResGradResult r = py::attn_res_backward(tensor_in(v, "v"), tensor_in(w, "w"), tensor_in(dh, "dh"), mode,
                                                    count(block_sources, "block_sources"), eps, p);
        nb::dict d;
        d["dv"] = tensor_out(std::move(r.dv));
        d["dw"] = tensor_out(std::move(r.dw));
        return d;
      },
      "v"_a, "w"_a, "dh"_a, nb::kw_only(), "mode"_a, "block_sources"_a = 1, "eps"_a = 1e-6, "precision"_a = "float64",
      doc::attn_res_backward);
  m.def(
      "mla_attend",
      [](const Array& q_C, const Array& q_R, const Array& C, const Array& K_R, const Array& W_UK, const Array& W_UV,
         std::int64_t n_h, const std::string& eval, const std::string& precision) {
        const Precision p = parse_precision(precision);
        return tensor_out(py::mla_attend(tensor_in(q_C, "q_C"), tensor_in(q_R, "q_R"), tensor_in(C, "C"),
                                         tensor_in(K_R, "K_R"), tensor_in(W_UK, "W_UK"), tensor_in(W_UV, "W_UV"),
                                         count(n_h, "n_h"), eval, p));
      },
      "q_C"_a, "q_R"_a, "C"_a, "K_R"_a, "W_UK"_a, "W_UV"_a, nb::kw_only(), "n_h"_a, "eval"_a = "naive",
      "precision"_a = "float64", doc::mla_attend);
  m.def(
      "mla_attend_backward",
      [](const Array& q_C, const Array& q_R, const Array& C, const Array& K_R, const Array& W_UK, const Array& W_UV,
         const Array& dO, std::int64_t n_h, const std::string& eval, const std::string& precision) {
        const Precision p = parse_precision(precision);
        MlaAttendGradResult r = py::mla_attend_backward(
            tensor_in(q_C, "q_C"), tensor_in(q_R, "q_R"), tensor_in(C, "C"), tensor_in(K_R, "K_R"),
            tensor_in(W_UK, "W_UK"), tensor_in(W_UV, "W_UV"), tensor_in(dO, "dO"), count(n_h, "n_h"), eval, p);
        nb::dict d;
        d["dq_C"] = tensor_out(std::move(r.dq_C));
        d["dq_R"] = tensor_out(std::move(r.dq_R));
        d["dC"] = tensor_out(std::move(r.dC));
        d["dK_R"] = tensor_out(std::move(r.dK_R));
        d["dW_UK"] = tensor_out(std::move(r.dW_UK));
        d["dW_UV"] = tensor_out(std::move(r.dW_UV));
        return d;
      },
      "q_C"_a, "q_R"_a, "C"_a, "K_R"_a, "W_UK"_a, "W_UV"_a, "dO"_a, nb::kw_only(), "n_h"_a, "eval"_a = "naive",
      "precision"_a = "float64", doc::mla_attend_backward);

  // ---- metrics and budgets
  nb::class_<CheckResult>(m, "CheckResult", doc::CheckResult)
      .def_ro("name", &CheckResult::name)
      .def_ro("rel_rms", &CheckResult::rel_rms)
      .def_ro("max_abs", &CheckResult::max_abs)
      .def_ro("max_ulp_bf16", &CheckResult::max_ulp_bf16)
      .def_ro("nan_count", &CheckResult::nan_count)
      .def_ro("inf_count", &CheckResult::inf_count)
      .def_ro("n", &CheckResult::n)
      .def_ro("tol", &CheckResult::tol)
      .def_ro("passed", &CheckResult::passed)
      .def_ro("verdict", &CheckResult::verdict)
      .def("__repr__", [](const CheckResult& r) {
        return fmt::format("CheckResult({}: rel RMS {:.3e}, max abs {:.3e}, max bf16 ulp {}, NaN {}, Inf {}, n {}; {})",
                           r.name, r.rel_rms, r.max_abs, r.max_ulp_bf16, r.nan_count, r.inf_count, r.n,
                           r.passed ? "PASS" : "FAIL");
      });
  m.def("check", &check, "x"_a, "truth"_a, nb::kw_only(), "name"_a = "x", "tol"_a = tol::check_default.value, doc::check);
  m.def("budgets", &budgets, doc::budgets);
  m.attr("CHECK_DEFAULT_TOL") = tol::check_default.value;
  bind_budget(m);

  // ---- generators
  m.def(
      "anchor_kda",
      [](std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, std::uint64_t seed) {
        return inputs_out(anchor_kda(count(B, "B"), count(T, "T"), count(H, "H"), count(D, "D"), seed));
      },
      "B"_a, "T"_a, "H"_a, "D"_a, "seed"_a, doc::anchor_kda);
  m.def(
      "kda_inputs",
      [](std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t d_k, std::int64_t d_v, const std::string& gate,
         double g_min, const std::string& beta, std::uint64_t seed) {
        KdaGenSpec s;
        s.B = count(B, "B"); s.T = count(T, "T"); s.H = count(H, "H"); s.d_k = count(d_k, "d_k");
        s.d_v = count(d_v, "d_v");
        s.gate = parse_gate_kind(gate, "gate");
        s.g_min = g_min;
        s.beta = parse_beta_dist(beta, "beta");
        s.seed = seed;
        return inputs_out(kdalab::kda_inputs(s));
      },
      "B"_a, "T"_a, "H"_a, "d_k"_a, "d_v"_a, nb::kw_only(), "gate"_a = "bounded", "g_min"_a = -5.0,
      "beta"_a = "sigmoid", "seed"_a = 1, doc::kda_inputs);
  m.def(
      "mqar",
      [](nb::handle n, nb::handle seq_len, nb::handle num_kv_pairs, nb::handle vocab, nb::handle seed,
         nb::handle power_a, nb::handle random_non_queries) {
        const char* f = "mqar";
        return task_out(mqar(size_arg(n, f, "n"), size_arg(seq_len, f, "seq_len"),
                             size_arg(num_kv_pairs, f, "num_kv_pairs"), vocab_arg(vocab, f), seed_arg(seed, f),
                             real_arg(power_a, f, "power_a"), bool_arg(random_non_queries, f, "random_non_queries")));
      },
      nb::sig("def mqar(n: int, seq_len: int, num_kv_pairs: int, vocab: int, seed: int, *, power_a: float = 0.01, "
              "random_non_queries: bool = True) -> dict[str, typing.Any]"),
      "n"_a.none(), "seq_len"_a.none(), "num_kv_pairs"_a.none(), "vocab"_a.none(), "seed"_a.none(), nb::kw_only(),
      "power_a"_a.none() = 0.01, "random_non_queries"_a.none() = true, doc::mqar);
  m.def(
      "palindrome",
      [](nb::handle n, nb::handle seq_len, nb::handle vocab, nb::handle seed) {
        const char* f = "palindrome";
        return task_out(palindrome(size_arg(n, f, "n"), size_arg(seq_len, f, "seq_len"), vocab_arg(vocab, f),
                                   seed_arg(seed, f)));
      },
      nb::sig("def palindrome(n: int, seq_len: int, vocab: int, seed: int) -> dict[str, typing.Any]"),
      "n"_a.none(), "seq_len"_a.none(), "vocab"_a.none(), "seed"_a.none(), doc::palindrome);
  m.def(
      "stack_task",
      [](nb::handle n, nb::handle seq_len, nb::handle vocab, nb::handle num_stacks, nb::handle seed) {
        const char* f = "stack_task";
        return task_out(stack_task(size_arg(n, f, "n"), size_arg(seq_len, f, "seq_len"), vocab_arg(vocab, f),
                                   size_arg(num_stacks, f, "num_stacks"), seed_arg(seed, f)));
      },
      nb::sig("def stack_task(n: int, seq_len: int, vocab: int, num_stacks: int, seed: int) -> dict[str, typing.Any]"),
      "n"_a.none(), "seq_len"_a.none(), "vocab"_a.none(), "num_stacks"_a.none(), "seed"_a.none(),
      doc::stack_task);
  m.attr("IGNORE_INDEX") = kIgnore;
  m.attr("MAX_TASK_TOKENS") = kMaxTaskTokens;
  nb::class_<Rng>(m, "Rng", doc::Rng)
      .def(nb::init<std::uint64_t>(), "seed"_a)
      .def("normal", [](Rng& r, std::int64_t n) {
        Tensor<double> t({count(n, "n")});
        for (auto& x : t.data) x = r.normal();
        return tensor_out(std::move(t));
      }, "n"_a, doc::Rng_normal)
      .def("uniform", [](Rng& r, std::int64_t n, double a, double b) {
        // boost's draw loops until it is < b: a >= b or a NaN never ended, an infinite bound crashed
        require(std::isfinite(a) && std::isfinite(b) && a < b,
                fmt::format("Rng.uniform: a = {}, b = {} is not accepted; give finite a < b", a, b));
        Tensor<double> t({count(n, "n")});
        for (auto& x : t.data) x = r.uniform(a, b);
        return tensor_out(std::move(t));
      }, "n"_a, "a"_a = 0.0, "b"_a = 1.0, doc::Rng_uniform);
  m.def("fnv1a64", [](const Array& x) { return fnv1a64(tensor_in(x, "x").data); }, "x"_a, doc::fnv1a64);
  m.def("cell_seed", &cell_seed, "seed"_a, "cell"_a, doc::cell_seed);

  // ---- HDF5 results
  m.def("check_output_path", [](const std::string& path, bool force) { check_output_path(path, force); }, "path"_a,
        nb::kw_only(), "force"_a = false, doc::check_output_path);
  nb::class_<ResultsFile>(m, "ResultsFile", doc::ResultsFile)
      .def("__init__",
           [](ResultsFile* self, const std::string& path, bool force, const std::string& command_line,
              const std::string& config, const std::string& seed) {
             new (self) ResultsFile(path, force, RunInfo{command_line, config, seed});
           },
           "path"_a, nb::kw_only(), "force"_a = false, "command_line"_a = "", "config"_a = "{}", "seed"_a = "")
      .def("group", &ResultsFile::group, "group"_a, "description"_a)
      .def("write_array",
           [](ResultsFile& f, const std::string& group, const std::string& name, const Array& a,
              const std::string& units, const std::string& description,
              const std::map<std::string, std::string>& attrs) {
             f.write_array(group, name, tensor_in(a, name), units, description, attrs);
           },
           "group"_a, "name"_a, "array"_a, nb::kw_only(), "units"_a, "description"_a,
           "attrs"_a = std::map<std::string, std::string>{}, doc::ResultsFile_write_array)
      .def("write_table",
           [](ResultsFile& f, const std::string& group, const nb::list& columns) {
             Table t;
             std::vector<std::vector<double>> dcols;
             std::vector<std::vector<std::int64_t>> icols;
             std::vector<std::vector<std::string>> scols;
             std::vector<char> kinds;
             std::size_t rows = 0;
             for (std::size_t c = 0; c < columns.size(); ++c) {
               const nb::handle col = columns[c];
               require(nb::isinstance<nb::tuple>(col) && nb::len(col) == 4,
                       "write_table: column " + std::to_string(c) + " must be (name, units, description, values)");
               const auto spec = nb::borrow<nb::tuple>(col);
               const char* parts[3] = {"name", "units", "description"};
               for (std::size_t k = 0; k < 3; ++k)
                 require(nb::isinstance<nb::str>(spec[k]), "write_table: column " + std::to_string(c) + "'s " +
                                                               parts[k] + " = " + shown_arg(spec[k], false) +
                                                               "; accepted: a str");
               const auto name = nb::cast<std::string>(spec[0]);
               // the values, each checked against the column's kind (its first value's): ints stay int64 (a double
               // holds 2^53 exactly, not 2^53 + 1), and a value of another kind is named, not a bare std::bad_cast
               const nb::handle vals = spec[3];
               nb::object fast;
               if (!PyUnicode_Check(vals.ptr()) && !PyBytes_Check(vals.ptr()))
                 fast = nb::steal(PySequence_Fast(vals.ptr(), ""));
               if (!fast.is_valid()) {
                 PyErr_Clear();
                 throw Error("write_table: the values of column '" + name + "' are " + shown_arg(vals, false) +
                             "; accepted: a list of floats, of ints or of strs");
               }
               const std::size_t n = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
               PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
               const char kind = n > 0 && PyUnicode_Check(items[0]) ? 's' : n > 0 && PyLong_Check(items[0]) ? 'i' : 'd';
               const char* accepted = kind == 's' ? "a str, as the column's first value"
                                      : kind == 'i' ? "an int in [-2^63, 2^63 - 1], as the column's first value"
                                                    : "a float (a column's values are all floats, all ints or all strs)";
               std::vector<double> dv;
               std::vector<std::int64_t> iv;
               std::vector<std::string> sv;
               for (std::size_t r = 0; r < n; ++r) {
                 PyObject* x = items[r];
                 bool ok = false;
                 if (kind == 's' && PyUnicode_Check(x)) {
                   sv.push_back(nb::cast<std::string>(nb::handle(x)));
                   ok = true;
                 } else if (kind == 'i' && PyLong_Check(x)) {
                   int overflow = 0;
                   const long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
                   ok = overflow == 0 && !PyErr_Occurred();
                   PyErr_Clear();
                   if (ok) iv.push_back(static_cast<std::int64_t>(v));
                 } else if (kind == 'd' && !PyUnicode_Check(x) && !PyBytes_Check(x) && PyNumber_Check(x)) {
                   const double v = PyFloat_AsDouble(x);
                   ok = !PyErr_Occurred();
                   PyErr_Clear();
                   if (ok) dv.push_back(v);
                 }
                 require(ok, "write_table: column '" + name + "' value " + std::to_string(r) + " = " +
                                 shown_arg(nb::handle(x), false) + "; accepted: " + accepted);
               }
               require(c == 0 || n == rows, "write_table: column '" + name + "' has " + std::to_string(n) +
                                                " values, the first column " + std::to_string(rows) + "; they must agree");
               rows = n;
               t.col(name, kind, nb::cast<std::string>(spec[1]), nb::cast<std::string>(spec[2]));
               kinds.push_back(kind);
               dcols.push_back(std::move(dv));
               icols.push_back(std::move(iv));
               scols.push_back(std::move(sv));
             }
             for (std::size_t r = 0; r < rows; ++r) {
               std::vector<Table::Cell> cells;
               for (std::size_t c = 0; c < kinds.size(); ++c) {
                 if (kinds[c] == 's') cells.emplace_back(scols[c][r]);
                 else if (kinds[c] == 'i') cells.emplace_back(icols[c][r]);
                 else cells.emplace_back(dcols[c][r]);
               }
               t.row(cells);
             }
             f.write_table(group, t);
           },
           "group"_a, "columns"_a, doc::ResultsFile_write_table)
      .def("attr", nb::overload_cast<const std::string&, const std::string&, const std::string&>(&ResultsFile::attr),
           "object"_a, "name"_a, "value"_a)
      .def("attr", nb::overload_cast<const std::string&, const std::string&, double>(&ResultsFile::attr), "object"_a,
           "name"_a, "value"_a)
      .def("commit", &ResultsFile::commit)
      .def_prop_ro("path", &ResultsFile::path)
      .def("__enter__", [](ResultsFile& f) -> ResultsFile& { return f; }, nb::rv_policy::reference)
      .def("__exit__", [](ResultsFile& f, nb::handle type, nb::handle, nb::handle) {
        if (type.is_none()) f.commit();
      }, nb::arg().none(), nb::arg().none(), nb::arg().none());
  m.def("read_array", [](const std::string& file, const std::string& dataset) {
    return tensor_out(h5read::array(file, dataset));
  }, "file"_a, "dataset"_a, doc::read_array);
  m.def("read_attr", [](const std::string& file, const std::string& object, const std::string& name) -> nb::object {
    try {  // a string attribute as its text, a numeric one as a float
      return nb::cast(h5read::attr_string(file, object, name));
    } catch (const Error&) {
      return nb::cast(h5read::attr_double(file, object, name));
    }
  }, "file"_a, "object"_a, "name"_a, doc::read_attr);
  m.def("members", &h5read::members, "file"_a, "group"_a, doc::members);
  m.def("exists", &h5read::exists, "file"_a, "path"_a, doc::exists);
}
