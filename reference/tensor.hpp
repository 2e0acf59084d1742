#pragma once
/// kdalab::Tensor: a dense row-major N-d array, the exchange type between reference, numerics,
/// experiments and files. Tensors are [B, T, H, D] unless a name says otherwise (docs/design.md, conventions).
/// No math lives here: reference/ maps slices of it into Eigen.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "reference/error.hpp"

namespace kdalab {

/// Human-readable shape, e.g. "[1, 17, 1, 128]".
inline std::string shape_str(const std::vector<std::size_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

template <class S>
struct Tensor {
  std::vector<std::size_t> shape;
  std::vector<S> data;

  Tensor() = default;
  explicit Tensor(std::vector<std::size_t> shp, S fill = S(0)) : shape(std::move(shp)) {
    data.assign(numel_of(shape), fill);
  }
  /// Product of the dims. Errors: kdalab::Error when it overflows std::size_t (a shape read from a
  /// file can be anything; a wrapped count would size a small buffer for a huge loop).
  static std::size_t numel_of(const std::vector<std::size_t>& s) {
    std::size_t n = 1;
    for (std::size_t d : s) {
      require(d == 0 || n <= SIZE_MAX / d, "tensor shape has more elements than 2^64: its element count overflows");
      n *= d;
    }
    return n;
  }
  std::size_t numel() const { return data.size(); }
  std::size_t rank() const { return shape.size(); }
  std::size_t dim(std::size_t i) const { return shape.at(i); }

  /// Flat offset of a multi-index (row-major); no bounds check beyond rank.
  template <class... I>
  std::size_t offset(I... idx) const {
    const std::size_t ix[] = {static_cast<std::size_t>(idx)...};
    std::size_t off = 0;
    for (std::size_t d = 0; d < sizeof...(I); ++d) off = off * shape[d] + ix[d];
    return off;
  }
  template <class... I> S& operator()(I... idx) { return data[offset(idx...)]; }
  template <class... I> const S& operator()(I... idx) const { return data[offset(idx...)]; }

  /// Elementwise conversion to another scalar type (rounds once per element).
  template <class R> Tensor<R> cast() const {
    Tensor<R> r;
    r.shape = shape;
    r.data.reserve(data.size());
    for (const auto& x : data) r.data.push_back(static_cast<R>(x));
    return r;
  }
};

/// Throws kdalab::Error unless t has exactly the expected shape. `name` names the tensor.
template <class S>
void require_shape(const Tensor<S>& t, const std::vector<std::size_t>& expect, const std::string& name) {
  if (t.shape != expect)
    throw Error("tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected " + shape_str(expect));
}

/// Throws kdalab::Error naming the tensor and flat index of the first NaN/Inf element.
template <class S>
void require_finite(const Tensor<S>& t, const std::string& name) {
  for (std::size_t i = 0; i < t.data.size(); ++i) {
    using std::isfinite;
    const double x = static_cast<double>(t.data[i]);
    if (!std::isfinite(x))
      throw Error("tensor '" + name + "' has a non-finite value (" + std::to_string(x) + ") at flat index " +
                  std::to_string(i) + " of shape " + shape_str(t.shape) + "; only finite values are accepted");
  }
}

}  // namespace kdalab
