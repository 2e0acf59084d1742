#pragma once
/// The layer-level golden fixture files (kda_layer, mla, attn_res, hybrid, and the gradient fixtures) as seen by
/// `kdalab golden` (experiments/golden.cpp); implemented in experiments/golden_layers.cpp, case
/// layouts in experiments/golden_fixtures.hpp. This header includes no reference/ code.
#include <functional>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "reference/tensor.hpp"

namespace kdalab::golden {

/// Reads dataset `name` of a golden file as float64, refusing anything that is not a float64
/// dataset (int32, float32, ...: "has dtype int32; expected float64"), a missing dataset or a
/// dangling link ("is a dangling link"). Throws kdalab::Error naming the file and the dataset.
Tensor<double> read_f64(const std::string& file, const std::string& name);

/// One layer-level fixture file data/golden/<op>.h5: how to write its cases and how to check the
/// current float64 code against them.
struct LayerOp {
  std::string op, description;
  /// Writes every case (groups, datasets, attributes) into an open results file.
  std::function<void(ResultsFile&)> regen;
  /// Reports one comparison per call of `line(what, relative RMS, tolerance)`. Throws
  /// kdalab::Error on a missing or malformed fixture.
  std::function<void(const std::string&, const std::function<void(const std::string&, double, double)>&)> check;
  std::string cases;  ///< comma-separated case names (the file's root attribute `cases`)
};

/// kda_layer, mla, attn_res, hybrid, then the gradient fixtures of grad_ops(), in that order.
std::vector<LayerOp> layer_ops();

/// The gradient fixtures (experiments/golden_grad.cpp): kda_recurrent_grad, kda_chunked_grad,
/// kda_layer_grad, mla_grad, attn_res_grad.
std::vector<LayerOp> grad_ops();

}  // namespace kdalab::golden
