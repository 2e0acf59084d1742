#pragma once
/// Tolerances of the reverse-mode derivatives (reference/*_backward.hpp), with their reasons.
/// Same conventions as numerics/tolerance.hpp (relative RMS unless stated).
#include "numerics/tolerance.hpp"

namespace kdalab::tol {

/// Analytic VJP <J^T dy, dx> vs the central difference (L(x + h dx) - L(x - h dx)) / 2h of
/// L = <dy, f(x)>, both in cpp_bin_float_50 with h = 1e-17: relative error of one directional derivative.
inline constexpr Tolerance backward_fd_mp{1e-25,
    "truncation h^2 L'''/6 ~ 1e-34 and rounding u_mp50 |L| / h ~ 1e-50 / 1e-17 = 1e-33 for O(1) derivatives; "
    "measured <= 1.2e-31 on the unit-test shapes (tests/unit/test_kda_backward.cpp); 1e-25 fails any wrong term (O(1)) and any float64 step (1e-16)."};
/// float64 gradients vs the cpp_bin_float_50 gradients of the same inputs, per gradient tensor.
inline constexpr Tolerance backward_f64_vs_mp{1e-13,
    "the reverse sweep repeats the forward's O(T d) dependent flops once more; measured <= 1.6e-15 on T = 64 (recurrence) and "
    "T = 40 (fused op), d_k = d_v = 8; 1e-13 leaves ~60x margin, while a wrong term gives O(1)."};

}  // namespace kdalab::tol
