// The error metrics never report a clean figure for a broken output: a NaN or Inf makes every metric maximal.
#include <cmath>
#include <limits>

#include "numerics/metrics.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;
using namespace kdalab;


TEST_CASE("a NaN or Inf in the candidate makes every error metric maximal", "[metrics]") {
  const std::vector<double> ref{1.0, -2.0, 0.5, 3.0};
  for (double bad : {std::nan(""), static_cast<double>(INFINITY), -static_cast<double>(INFINITY)}) {
    std::vector<double> out = ref;
    out[2] = bad;
    const auto m = compare(out, ref);
    CHECK(std::isinf(m.rel_rms));
    CHECK(std::isinf(m.max_abs));
    CHECK(m.max_ulp_bf16 == std::numeric_limits<std::int64_t>::max());
    CHECK(m.nan_count + m.inf_count == 1);
  }
  const auto clean = compare(ref, ref);
  CHECK(clean.rel_rms == 0.0);
  CHECK(clean.max_ulp_bf16 == 0);
}
