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

using Array = nb::ndarray<nb::ro>;                 ///< any read-only array in
using Out = nb::ndarray<nb::numpy, double>;        ///< a new numpy float64 array out

/// "[2, 3]" of an array's shape.
std::string shape_of(const Array& a);
/// "float32", "bfloat16", "int64", ... of a DLPack dtype.
std::string dtype_name(const nb::dlpack::dtype& d);
/// A float64 C-contiguous CPU array -> Tensor<double> (copied). Errors name the tensor.
Tensor<double> tensor_in(const Array& a, const std::string& name);
/// Tensor<double> -> a numpy float64 array that owns the data.
Out tensor_out(Tensor<double> t);

}  // namespace kdalab::py
