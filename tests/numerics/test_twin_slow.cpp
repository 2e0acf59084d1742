// The T = 4096 anchor case of the kernel twin (slow: ~seconds of float64 work per plan).
#include "tests/catch.hpp"
#include "tests/numerics/test_twin_cases.hpp"

TEST_CASE("precision plans on the long anchor-kda case (1, 4096, 2)", "[twin][slow]") {
  twin_test::check_anchor_case({1, 4096, 2});
}
