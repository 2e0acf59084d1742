#pragma once
/// Conversions between Tensor<double> and the reference's Mat/Vec in any scalar type, and the
/// parsing of layer options given as text. Shared by the oracle translation units.
#include <cstdint>
#include <string>

#include "python/src/oracle.hpp"
#include "reference/attn_res.hpp"
#include "reference/scalar.hpp"

namespace kdalab::py {

/// Tensor [r, c] -> Mat<S> (row-major both; exact widening). Throws kdalab::Error naming `name`
/// unless the rank is 2.
template <class S>
Mat<S> to_mat(const Tensor<double>& t, const std::string& name) {
  require(t.rank() == 2, "tensor '" + name + "' has shape " + shape_str(t.shape) + "; expected a matrix [rows, cols]");
  Mat<S> m(static_cast<Eigen::Index>(t.dim(0)), static_cast<Eigen::Index>(t.dim(1)));
  for (std::size_t i = 0; i < t.numel(); ++i) m.data()[i] = S(t.data[i]);
  return m;
}
/// Tensor [n] -> Vec<S>. Throws kdalab::Error naming `name` unless the rank is 1.
template <class S>
Vec<S> to_vec(const Tensor<double>& t, const std::string& name) {
  require(t.rank() == 1, "tensor '" + name + "' has shape " + shape_str(t.shape) + "; expected a vector [n]");
  Vec<S> v(static_cast<Eigen::Index>(t.numel()));
  for (std::size_t i = 0; i < t.numel(); ++i) v(static_cast<Eigen::Index>(i)) = S(t.data[i]);
  return v;
}
/// Mat<S> -> Tensor [rows, cols], each element rounded once to double.
template <class S>
Tensor<double> from_mat(const Mat<S>& m) {
  Tensor<double> t({static_cast<std::size_t>(m.rows()), static_cast<std::size_t>(m.cols())});
  for (Eigen::Index i = 0; i < m.size(); ++i) t.data[static_cast<std::size_t>(i)] = static_cast<double>(m.data()[i]);
  return t;
}

/// Vec<S> -> Tensor [n], each element rounded once to double.
template <class S>
Tensor<double> from_vec(const Vec<S>& v) {
  Tensor<double> t({static_cast<std::size_t>(v.size())});
  for (Eigen::Index i = 0; i < v.size(); ++i) t.data[static_cast<std::size_t>(i)] = static_cast<double>(v(i));
  return t;
}

/// Throws kdalab::Error unless scale is finite and > 0.
void require_scale(double scale);

/// Checks the arguments of attn_res() (errors name the tensor or option) and returns the config.
AttnResConfig attn_res_config(const Tensor<double>& v, const Tensor<double>& w, const std::string& mode,
                              std::size_t block_sources, double eps);

/// Reads layer options: every key of `given` must be in `accepted` (else kdalab::Error naming the
/// key and the accepted ones); values parsed as the option's kind, errors naming the option.
class OptionReader {
 public:
  OptionReader(const Options& given, const std::string& what, const std::string& accepted);
  bool has(const std::string& key) const { return given_.count(key) > 0; }
  std::size_t size(const std::string& key, std::size_t fallback) const;
  double number(const std::string& key, double fallback) const;
  bool flag(const std::string& key, bool fallback) const;
  std::string text(const std::string& key, const std::string& fallback) const;
  /// Throws kdalab::Error naming `what` and `key` unless the key is given.
  void need(const std::string& key) const;

 private:
  const Options& given_;
  std::string what_;
};

}  // namespace kdalab::py
