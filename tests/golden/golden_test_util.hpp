#pragma once
// Helpers of the layer-level golden tests (tests/golden/test_golden_{kda_layer,mla,attn_res,hybrid}.cpp).
#include <sstream>
#include <string>
#include <vector>

#include "experiments/golden_fixtures.hpp"
#include "experiments/results.hpp"
#include "numerics/metrics.hpp"

namespace kdalab::testutil {

/// The case names a fixture file lists in its root attribute `cases`.
inline std::vector<std::string> golden_cases(const std::string& file) {
  std::vector<std::string> r;
  std::stringstream ss(h5read::attr_string(file, "/", "cases"));
  std::string t;
  while (std::getline(ss, t, ',')) r.push_back(t);
  return r;
}

/// Relative RMS of a matrix (or vector) against a stored float64 tensor of the same element count.
template <class M>
double rel_to(const M& out, const Tensor<double>& ref) {
  return rel_rms(golden::to_tensor(out).data, ref.data);
}

}  // namespace kdalab::testutil
