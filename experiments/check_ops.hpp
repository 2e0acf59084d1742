#pragma once
// The operations of `kdalab check` (experiments/check_ops.cpp) as the subcommand (experiments/check.cpp) calls them:
// the input-file reader, what one check computes (Outcome), how it judges (Judge), the exits other than 0 / 1 / 2,
// and one function per --op. Formats, the truth rule and the exit codes: docs/check-format.md.
#include <H5Cpp.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "experiments/cli.hpp"
#include "numerics/bf16.hpp"
#include "reference/error.hpp"
#include "reference/tensor.hpp"

namespace kdalab::cli::check_detail {


/// Largest tensor `kdalab check` reads (elements): 2^31 float64 values = 16 GiB, beyond any CPU truth
/// that finishes; also the guard against shapes whose element count overflows 64 bits.
inline constexpr double kMaxCheckElements = 2147483648.0;

/// A reader of one input file that turns every HDF5 problem into a kdalab::Error naming it.
class InFile {
 public:
  explicit InFile(const std::string& path) : path_(path) {
    H5::Exception::dontPrint();
    require(!path.empty(), "--in FILE.h5 is required (the tensors to check; format in docs/check-format.md)");
    try {
      f_ = H5::H5File(path, H5F_ACC_RDONLY);
    } catch (const H5::Exception&) {
      throw Error("--in '" + path + "': not found or not a readable HDF5 file");
    }
  }
  std::string where() const { return "--in '" + path_ + "'"; }

  /// Whether `name` is present; a link that points to nothing (a dangling soft or external link)
  /// is an error naming it, not "absent".
  bool present(const std::string& name) {
    if (!f_.nameExists(name)) return false;
    require(H5Oexists_by_name(f_.getId(), name.c_str(), H5P_DEFAULT) > 0,
            where() + ": '" + name + "' is a dangling link (a soft or external link to nothing); write the dataset itself");
    return true;
  }

  /// Whether dataset `name` is present; a group (or other object) under that name is an error naming
  /// it, never "absent" (an optional candidate or rope tensor must not be skipped silently).
  bool has(const std::string& name) {
    if (!present(name)) return false;
    require(f_.childObjType(name) == H5O_TYPE_DATASET,
            where() + ": '" + name + "' is a group (or another non-dataset object), not a dataset; write the tensor "
                                     "as a dataset");
    return true;
  }

  /// Reads float dataset `name` of rank `rank`; `what` describes the expected shape.
  Tensor<double> read(const std::string& name, std::size_t rank, const std::string& what) {
    require(present(name), where() + ": dataset '" + name + "' is missing; expected " + what);
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
    {  // a shape whose element count overflows or exceeds what a CPU truth can hold is bad input
      const double n = std::accumulate(dims.begin(), dims.end(), 1.0, [](double a, hsize_t d) { return a * double(d); });
      std::string shp = "[";
      for (std::size_t i = 0; i < dims.size(); ++i) shp += (i ? ", " : "") + std::to_string(dims[i]);
      require(n <= kMaxCheckElements, where() + ": dataset '" + name + "' has shape " + shp + "] = " +
                                          fmt::format("{:.3g}", n) + " elements; accepted: at most " +
                                          fmt::format("{:.3g}", kMaxCheckElements) +
                                          " elements per tensor (the CPU truth holds every tensor in float64)");
    }
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
    // one string: an empty (null dataspace) attribute crashed the read, and of an array only the first was read
    const hssize_t n = a->getSpace().getSimpleExtentNpoints();
    require(n == 1, where() + ": attribute '" + name + "' of '" + obj + "' must be a single string, got " +
                        std::to_string(n) + " values");
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
    const hssize_t n = a->getSpace().getSimpleExtentNpoints();
    require(n == 1, bad + " (a scalar, got " + std::to_string(n) + " values)");
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

  /// Names of every object at the file root.
  std::vector<std::string> root_names() {
    std::vector<std::string> r;
    H5::Group g = f_.openGroup("/");
    for (hsize_t i = 0; i < g.getNumObjs(); ++i) r.push_back(g.getObjnameByIdx(i));
    return r;
  }

 private:
  std::optional<H5::Attribute> open_attr(const std::string& obj, const std::string& name) {
    if (obj == "/") {
      H5::Group g = f_.openGroup("/");
      if (!g.attrExists(name)) return std::nullopt;
      return g.openAttribute(name);
    }
    if (!present(obj) || f_.childObjType(obj) != H5O_TYPE_DATASET) return std::nullopt;
    H5::DataSet d = f_.openDataSet(obj);
    if (!d.attrExists(name)) return std::nullopt;
    return d.openAttribute(name);
  }
  std::string path_;
  H5::H5File f_;
  std::map<std::string, std::string> formats_;
};

/// What one check computed: the candidates with their truths, and the truth tensors to write.
struct Outcome {
  struct Cand {
    std::string name, format;
    Tensor<double> x, truth, emulation;  // emulation: numerics/plain_emulation.hpp at the declared precision
  };
  struct Out {
    std::string name, description;
    Tensor<double> t;
    std::map<std::string, std::string> attrs;
  };
  std::string truth_name;
  std::vector<Cand> cands;
  std::vector<Out> truths;
};

/// Thrown when the file has no candidate but a dataset that matches no known name (e.g. a misspelt candidate):
/// run() exits kExitNothingChecked without computing or writing anything.
struct NothingChecked : std::runtime_error {
  using std::runtime_error::runtime_error;
};
constexpr int kExitNothingChecked = 4;

/// How a check judges its candidates: the declared precision (--precision; empty: the file's root attribute
/// `precision`, else the candidates' formats), whether --tol overrides the budget rule, and the gate run after the
/// input is read and before the truth is computed (it throws NothingChecked).
struct Judge {
  std::string precision;
  bool tol_override = false;
  std::function<void(std::size_t)> before_truth;
  // filled by declare(): the precision used and where it came from
  Format p = Format::fp32;
  std::string p_from;
};

/// Exit code of `kdalab check` when the work asked for cannot run here (--kernel in a build without the CUDA
/// kernels, or with no GPU visible); as `kdalab bench`: not 2 (the input was fine), not 0 (nothing was checked).
constexpr int kExitNotAvailable = 3;

/// Thrown when the work cannot run in this build / on this machine; run() prints it and exits kExitNotAvailable.
struct NotAvailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The dataset names an op knows (its inputs, upstream gradients and candidates, and those of its forward or
/// backward sibling, which may share a file) and the names it checks.
struct OpNames {
  std::set<std::string> known, candidates;
};
/// The names of --op `op` (a name of the CLI's --op list).
OpNames op_names(const std::string& op);

/// One check per --op: read and validate the file at in_path (kdalab::Error: exit 2), call j.before_truth with the
/// number of candidates found, compute the truth (--truth truth_opt: auto, mp, f64) and, unless --tol overrides the
/// budget rule, the emulation at the declared precision (numerics/plain_emulation.hpp).
/// check_kda serves --op kda and kda-decode (op); kernel: also run kdalab's prefill kernel (NotAvailable: exit 3).
Outcome check_kda(const std::string& in_path, const std::string& op, const std::string& truth_opt, bool kernel, Judge& j);
Outcome check_kda_bwd(const std::string& in_path, const std::string& truth_opt, Judge& j);
Outcome check_mla(const std::string& in_path, const std::string& truth_opt, Judge& j);
Outcome check_mla_bwd(const std::string& in_path, const std::string& truth_opt, Judge& j);
Outcome check_attn_res(const std::string& in_path, const std::string& truth_opt, Judge& j);
Outcome check_attn_res_bwd(const std::string& in_path, const std::string& truth_opt, Judge& j);

}  // namespace kdalab::cli::check_detail
