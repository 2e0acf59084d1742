// The tensor-core matmul model (numerics/lowp.hpp): operands rounded once, fp32 accumulation.
#include <cmath>

#include "numerics/lowp.hpp"
#include "numerics/random.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

namespace {
Mat<double> randn(Rng& r, Eigen::Index n, Eigen::Index m) {
  Mat<double> a(n, m);
  for (Eigen::Index i = 0; i < n; ++i)
    for (Eigen::Index j = 0; j < m; ++j) a(i, j) = r.normal();
  return a;
}
double rel(const Mat<double>& a, const Mat<double>& b) { return (a - b).norm() / b.norm(); }
}  // namespace

TEST_CASE("matmul_lowp with every format fp64 is the float64 product") {
  Rng r(3);
  const Mat<double> A = randn(r, 16, 128), B = randn(r, 128, 16);
  const Mat<double> C = matmul_lowp(A, B, Matmul::fp64());
  CHECK((C - A * B).cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("matmul_lowp error grows with the operand format as unit roundoff predicts") {
  Rng r(5);
  const Mat<double> A = randn(r, 64, 128), B = randn(r, 128, 64);
  const Mat<double> exact = A * B;
  const double e_bf16 = rel(matmul_lowp(A, B, Matmul::uniform(Format::bf16)), exact);
  const double e_fp16 = rel(matmul_lowp(A, B, Matmul::uniform(Format::fp16)), exact);
  const double e_tf32 = rel(matmul_lowp(A, B, Matmul::uniform(Format::tf32)), exact);
  const double e_fp32 = rel(matmul_lowp(A, B, Matmul::uniform(Format::fp32)), exact);
  CAPTURE(e_bf16, e_fp16, e_tf32, e_fp32);
  // operand rounding of two N(0,1) factors: relative error ~ u sqrt(2/3) per product, averaged
  const double u8 = std::ldexp(1.0, -8), u11 = std::ldexp(1.0, -11), u24 = std::ldexp(1.0, -24);
  CHECK(e_bf16 > u8 / 8);
  CHECK(e_bf16 < u8 * tol::lowp_matmul_band.value);
  CHECK(e_tf32 > u11 / 8);
  CHECK(e_tf32 < u11 * tol::lowp_matmul_band.value);
  CHECK(std::fabs(e_tf32 - e_fp16) < 0.2 * e_tf32);  // same 11-bit significand in range
  CHECK(e_fp32 < u24 * tol::lowp_matmul_band.value * 16);
  CHECK(e_bf16 > 4 * e_tf32);
}

TEST_CASE("matmul_lowp accumulates in fp32, not in float64") {
  // 1 + 64 terms of 2^-25: each fp32 add of 2^-25 to 1 is a tie below half an ulp -> stays 1
  Mat<double> A = Mat<double>::Ones(1, 65), B = Mat<double>::Constant(65, 1, std::ldexp(1.0, -25));
  B(0, 0) = 1.0;
  CHECK(matmul_lowp(A, B, Matmul::uniform(Format::fp32))(0, 0) == 1.0);
  CHECK(matmul_lowp(A, B, Matmul{Format::fp32, Format::fp32, Format::fp64})(0, 0) == 1.0 + 64 * std::ldexp(1.0, -25));
  // products of bf16 operands are exact: integer matrices multiply exactly
  Mat<double> I(2, 2), J(2, 2);
  I << 3, 5, 7, 11;
  J << 13, 17, 19, 23;
  CHECK((matmul_lowp(I, J, Matmul::uniform(Format::bf16)) - I * J).cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("matmul_lowp rounds operands once and rejects mismatched shapes") {
  Mat<double> A(1, 1), B(1, 1);
  A(0, 0) = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);  // the double-rounding witness
  B(0, 0) = 1.0;
  CHECK(matmul_lowp(A, B, Matmul::uniform(Format::bf16))(0, 0) == 1.0 + std::ldexp(1.0, -7));
  CHECK(round_matrix(A, Format::bf16)(0, 0) == 1.0 + std::ldexp(1.0, -7));
  CHECK_THROWS_AS(matmul_lowp(Mat<double>(2, 3), Mat<double>(2, 3), Matmul::uniform(Format::bf16)), Error);
  CHECK(Matmul::uniform(Format::tf32).name() == "tf32 x tf32 -> fp32");
}
