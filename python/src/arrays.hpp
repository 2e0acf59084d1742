#pragma once
/// Arrays in and out of the Python module (nanobind ndarray: DLPack and the buffer protocol), shared by
/// the translation units of python/src: the checks name the tensor, its value and what is accepted,
/// as the command line's messages do (docs/cli.md).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>
#include <vector>

#include "reference/tensor.hpp"

namespace kdalab::py {

namespace nb = nanobind;

/// Any read-only array in. An argument nanobind cannot read as an array (a list, a str, an object-dtype or
/// big-endian numpy array; None where the argument accepts None only as "absent" never reaches here) is kept in
/// `given` instead of failing the call with nanobind's TypeError, which names neither the argument nor what is
/// accepted: tensor_in and the other readers below refuse it with kdalab::Error naming the tensor.
struct Array : nb::ndarray<nb::ro> {
  nb::object given;  ///< the object passed when it is no array nanobind reads (then the ndarray is empty)
};
using Out = nb::ndarray<nb::numpy, double>;        ///< a new numpy float64 array out

/// Throws kdalab::Error naming the tensor `name` unless `a` holds an array.
void require_array(const Array& a, const std::string& name);

/// "[2, 3]" of an array's shape.
std::string shape_of(const Array& a);
/// "float32", "bfloat16", "int64", ... of a DLPack dtype.
std::string dtype_name(const nb::dlpack::dtype& d);
/// A float64 C-contiguous CPU array -> Tensor<double> (copied). Errors name the tensor.
Tensor<double> tensor_in(const Array& a, const std::string& name);
/// Tensor<double> -> a numpy float64 array that owns the data.
Out tensor_out(Tensor<double> t);

}  // namespace kdalab::py

namespace nanobind::detail {

/// Array from Python: nanobind's ndarray caster, and in its second (converting) pass any other object, kept in
/// Array::given for require_array's message. The signature shown is the ndarray's.
template <>
struct type_caster<kdalab::py::Array> {
  using Inner = make_caster<ndarray<ro>>;
  NB_TYPE_CASTER(kdalab::py::Array, Inner::Name)

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    Inner inner;
    if (inner.from_python(src, flags, cleanup)) {
      static_cast<ndarray<ro>&>(value) = std::move(inner.value);
      value.given = object();
      return true;
    }
    PyErr_Clear();  // the failed import may leave the exporter's error (numpy's BufferError) set
    if (!(flags & static_cast<uint32_t>(cast_flags::convert))) return false;  // the exact pass first
    static_cast<ndarray<ro>&>(value) = ndarray<ro>();
    value.given = borrow(src);
    return true;
  }
};

}  // namespace nanobind::detail
