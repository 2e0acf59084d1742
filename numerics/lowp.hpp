#pragma once
/// Low-precision matrix products as tensor cores compute them, emulated on the CPU.
///
/// A tensor-core MMA (sm_80/sm_90 mma.sync / wgmma) reads its operands in bf16, fp16 or tf32,
/// forms every product exactly (a p-bit x p-bit significand product fits the accumulator's
/// datapath) and accumulates in fp32. matmul_lowp() models that: each operand element is rounded
/// ONCE, round-to-nearest-even, to its format (numerics/bf16.hpp round_to, never Eigen's
/// double -> float -> bf16 path, which rounds twice), products are formed exactly in double
/// (bf16 x bf16 = 16 significant bits, tf32 x tf32 = 22 bits: exact in double's 53), and the
/// running sum is rounded to the accumulator format after every addition, in index order.
/// Real hardware adds groups of products in a wider internal adder before one rounding, so the
/// model is slightly pessimistic (at most one extra fp32 rounding per product); it never
/// over-states precision. With every format fp64 the product is the plain float64 product
/// (same summation order), so a twin built from these blocks reproduces the reference.
///
/// Building blocks the kernel twin (numerics/kda_twin.hpp) may reuse: round_matrix, Matmul
/// (a named (operand A, operand B, accumulator) precision triple), matmul_lowp, round_vector.
/// Source: NVIDIA PTX ISA, "Matrix multiply-accumulate" (operand types, fp32 accumulation):
/// a matmul that rounds operands to bf16/fp16 and accumulates in fp32.
#include <string>

#include "numerics/bf16.hpp"
#include "reference/error.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

/// Rounds every element of a float64 matrix once (RNE) to `fmt`; fp64 returns a copy.
/// Shape unchanged. Overflow gives +-Inf, as the format defines (no error raised).
inline Mat<double> round_matrix(const Mat<double>& a, Format fmt) {
  if (fmt == Format::fp64) return a;
  Mat<double> r(a.rows(), a.cols());
  for (Eigen::Index i = 0; i < a.rows(); ++i)
    for (Eigen::Index j = 0; j < a.cols(); ++j) r(i, j) = round_to(a(i, j), fmt);
  return r;
}

/// Rounds every element of a float64 vector once (RNE) to `fmt`.
inline Vec<double> round_vector(const Vec<double>& a, Format fmt) {
  if (fmt == Format::fp64) return a;
  Vec<double> r(a.size());
  for (Eigen::Index i = 0; i < a.size(); ++i) r(i) = round_to(a(i), fmt);
  return r;
}

/// The precision of one matrix product: operand formats of A and B and the accumulator format.
/// Tensor cores: a, b in {bf16, fp16, tf32}, acc = fp32. fp32 operands mean a CUDA-core (FFMA)
/// product; fp64 everywhere means exact float64 (the reference's precision).
struct Matmul {
  Format a = Format::bf16, b = Format::bf16, acc = Format::fp32;
  /// e.g. "bf16 x bf16 -> fp32".
  std::string name() const { return format_name(a) + " x " + format_name(b) + " -> " + format_name(acc); }
  static Matmul uniform(Format operands, Format acc = Format::fp32) { return {operands, operands, acc}; }
  static Matmul fp64() { return {Format::fp64, Format::fp64, Format::fp64}; }
};

/// C = round_a(A) round_b(B), accumulated in `m.acc` (see file comment).
/// Shapes: A (n x k), B (k x m) -> C (n x m), returned as float64 holding values of m.acc.
/// Errors: kdalab::Error if A.cols() != B.rows() (names both shapes).
inline Mat<double> matmul_lowp(const Mat<double>& A, const Mat<double>& B, const Matmul& m) {
  require(A.cols() == B.rows(), "matmul_lowp: inner dimensions differ: A is " + std::to_string(A.rows()) + " x " +
                                    std::to_string(A.cols()) + ", B is " + std::to_string(B.rows()) + " x " +
                                    std::to_string(B.cols()));
  if (m.a == Format::fp64 && m.b == Format::fp64 && m.acc == Format::fp64) return A * B;
  const Mat<double> a = round_matrix(A, m.a);
  const Mat<double> b = round_matrix(B, m.b);
  Mat<double> c(A.rows(), B.cols());
  for (Eigen::Index i = 0; i < a.rows(); ++i)
    for (Eigen::Index j = 0; j < b.cols(); ++j) {
      double s = 0.0;
      if (m.acc == Format::fp32) {
        float f = 0.0f;  // fp32 add: sum formed in double (exact for these operands unless the
        // exponents are > 29 apart), then rounded to float (RNE)
        for (Eigen::Index l = 0; l < a.cols(); ++l) f = static_cast<float>(static_cast<double>(f) + a(i, l) * b(l, j));
        s = f;
      } else {
        for (Eigen::Index l = 0; l < a.cols(); ++l) s = round_to(s + a(i, l) * b(l, j), m.acc);
      }
      c(i, j) = s;
    }
  return c;
}

/// Elementwise C = round_acc(A + B): the fp32 add of two accumulator tiles (e.g. a state update).
/// Errors: kdalab::Error on a shape mismatch.
inline Mat<double> add_rounded(const Mat<double>& A, const Mat<double>& B, Format acc) {
  require(A.rows() == B.rows() && A.cols() == B.cols(), "add_rounded: shapes differ");
  Mat<double> c(A.rows(), A.cols());
  for (Eigen::Index i = 0; i < A.rows(); ++i)
    for (Eigen::Index j = 0; j < A.cols(); ++j) c(i, j) = round_to(A(i, j) + B(i, j), acc);
  return c;
}

}  // namespace kdalab
