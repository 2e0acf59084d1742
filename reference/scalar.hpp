#pragma once
/// Scalar types of the reference: float, double and the multiprecision oracle.
///
/// mp50 = boost::multiprecision::cpp_bin_float_50 (50 decimal digits, ~166-bit mantissa), made
/// usable in Eigen through Boost's own glue header boost/multiprecision/eigen.hpp (and only that:
/// a second NumTraits specialisation would conflict with it). Supported with Eigen 3.4 for products, solves and norms;
/// not for blueNorm or the eigen-solvers, which kdalab does not use.
///
/// Math on any Scalar goes through the free functions below (kdalab::sexp, slog, ...) so that one
/// template body works for float, double and mp50 without ADL surprises.
#include <cmath>
#include <string>

#include <Eigen/Dense>
#include <boost/multiprecision/cpp_bin_float.hpp>
#include <boost/multiprecision/eigen.hpp>

namespace kdalab {

using mp50 = boost::multiprecision::cpp_bin_float_50;

template <class S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using Vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;

/// Name of a scalar type, as written into HDF5 files and test names.
template <class S> inline std::string scalar_name();
template <> inline std::string scalar_name<float>() { return "float32"; }
template <> inline std::string scalar_name<double>() { return "float64"; }
template <> inline std::string scalar_name<mp50>() { return "cpp_bin_float_50"; }

template <class S> inline S sexp(const S& x) { using std::exp; using boost::multiprecision::exp; return S(exp(x)); }
template <class S> inline S slog(const S& x) { using std::log; using boost::multiprecision::log; return S(log(x)); }
template <class S> inline S ssqrt(const S& x) { using std::sqrt; using boost::multiprecision::sqrt; return S(sqrt(x)); }
template <class S> inline S sabs(const S& x) { using std::abs; using boost::multiprecision::abs; return S(abs(x)); }
template <class S> inline S slog1p(const S& x) { using std::log1p; using boost::multiprecision::log1p; return S(log1p(x)); }

/// Logistic sigmoid 1 / (1 + e^-x), evaluated without overflow for large |x|.
template <class S> inline S sigmoid(const S& x) {
  if (x >= S(0)) return S(1) / (S(1) + sexp<S>(S(-x)));
  const S e = sexp<S>(x);
  return e / (S(1) + e);
}
/// Softplus log(1 + e^x), stable for large |x|.
template <class S> inline S softplus(const S& x) {
  if (x > S(0)) return S(x + slog1p<S>(sexp<S>(S(-x))));
  return slog1p<S>(sexp<S>(x));
}
/// Swish / SiLU x * sigmoid(x).
template <class S> inline S swish(const S& x) { return S(x * sigmoid<S>(x)); }

/// Conversion to double for metrics and HDF5 (rounds once).
template <class S> inline double to_double(const S& x) { return static_cast<double>(x); }

}  // namespace kdalab
