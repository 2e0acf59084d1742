#pragma once
/// The chunked KDA backward twin: a CPU copy of the planned tensor-core backward (docs/kernels/kda_backward.md,
/// "Version 2: the chunked backward, planned"), the chunked reverse mode of reference/kda_chunk_backward.hpp with the
/// operand format of every matrix product a parameter, so the backward's precision plan is decided before the kernel
/// exists, as the prefill's was (numerics/kda_twin.hpp).
///
/// Problem form and outputs: those of the kernel backward (KdaBwdProblem, KdaBwdGrads; numerics/kda_backward_twin.hpp):
/// bf16 q, k, v, g, beta, dO, fp32 A_log, bias, S0, dS_T; the pre-ops (L2Norm, K3 gate, beta sigmoid) and their
/// chain rules as kda_backward_kernel_form; dq, dk, dv, dg, dbeta rounded once to bf16 (`out`), dA_log, dbias
/// (summed over tokens in fp64), dS0 fp32.
///
/// Algorithm, per sequence and value head, chunks of C tokens (reference/kda_chunk_backward.hpp; names as there):
///   forward pass (the forward's state pass at the `fwd_ws`, `fwd_kd` formats): S_n, the state entering chunk n,
///     stored as a checkpoint (`checkpoint`, fp32), S_{n+1} = Diag(gamL) S_n + Kd^T (U - W S_n).
///   per chunk, last first, with dS = dL/dS_{n+1} (fp32, from dS_T):
///     recompute  Gam, Kg, Ki, Qg, Kd (elementwise, fp32), B = Kg Ki^T ("kk"), A = StrictTril(Diag(beta) B),
///                P = Tril(Qg Ki^T) ("qk"), N = (I + A)^{-1} and [W | U] = N [Diag(beta) Kg | Diag(beta) V] by
///                forward substitution ("solve"), V~ = U - W S_n ("ws")
///     dV~  = scale P^T dO ("pdo") + Kd dS ("kds")
///     dP   = scale Tril(dO V~^T) ("dov");   dKd = V~ dS^T ("vds")
///     dQg  = scale dO S_n^T ("dos") + dP Ki ("dpk");   dKi = dP^T Qg ("dpk") + Diag(gamL) dKd
///     dgamL = rowsum(dS ⊙ S_n) + colsum(Ki ⊙ dKd)
///     dS_n = scale Qg^T dO - W^T dV~ ("qdo": one product [Qg | W]^T [scale dO ; -dV~]) + Diag(gamL) dS
///     dW   = -dV~ S_n^T ("dos": the same S_n^T operand as dQg's, one product [dO ; dV~] S_n^T)
///     [dX | dY] = N^T [dW | dV~] ("ndx");   dA = -StrictTril(dX W^T + dY U^T) ("dxw")
///                (= -StrictTril(N^T (dW X^T + dU Y^T) N^T) of the reference, since W = N X, U = N Y)
///     dB = Diag(beta) dA;  dKg = dB Ki ("dpk") + Diag(beta) dX;  dKi += dB^T Kg ("dpk")
///     dbeta = rowsum(dA ⊙ B) + rowsum(dX ⊙ Kg) + rowsum(dY ⊙ V);  dV = Diag(beta) dY
///     dK = Gam ⊙ dKg + dKi / Gam;  dQ = Gam ⊙ dQg
///     dG = Gam ⊙ (K ⊙ dKg + Q ⊙ dQg) - Ki ⊙ dKi (+ gamL ⊙ dgamL on the last row);  dg_r = sum_{s >= r} dG_s
/// Products: "intra" (a C x C operand or result: kk, qk, solve, pdo, dov, dpk, ndx, dxw) and "state" (a d_k x d_v
/// operand: ws, kds, vds, dos, qdo; fwd_ws, fwd_kd in the forward pass). Each product rounds its operands to its
/// OperandFormat (hilo: both operands as hi = rnd(x), lo = rnd(x - hi), the product hi hi + hi lo + lo hi, lo lo
/// dropped, as numerics/kda_twin.hpp KdaTwinPlan::Split) and accumulates exactly, rounded once to `accum` (fp32 on
/// the GPU; only the accumulation order differs). Every stored intermediate and the elementwise work is rounded to
/// `accum`. At every format fp64 the twin equals kda_backward_kernel_form<double> to ~1e-12
/// (tests/numerics/test_twin_chunk_backward.cpp).
///
/// The decay is factored as in the reference (Ki = K / Gam): a chunk's log-decay span must stay where e^span is
/// finite in `accum` (fp32: 80, which C = 16 with g_min = -5 reaches exactly; C = 64 on the anchor gates does not,
/// so C = 64 needs the forward kernel's 16-token sub-chunk factoring inside the chunk). Checked: kdalab::Error.
///
/// Measured precision (relative RMS against kda_backward_kernel_form<double>, D = 128, C = 16): see the table in
/// docs/kernels/kda_backward.md, "Version 2: the chunked backward, planned", repeated here:
///   input (T, H x HV)        plan      dq     dk     dv     dg     dbeta  (x bf16 floor)  dA_log   dbias    dS0
///   anchor (64, 1 x 2)       all-bf16  2.12   1.75   1.98   17.37  1.66   1.3e-02  6.5e-02  2.4e-03
///   anchor (64, 1 x 2)       mirror    1.01   1.47   1.48   1.96   1.39   1.3e-03  2.2e-03  2.4e-03
///   anchor (64, 1 x 2)       chosen    1.00   1.00   1.00   1.00   1.00   3.0e-06  6.9e-06  4.7e-06
///   anchor (300, 2 x 2)      all-bf16  1.93   1.90   2.14   24.15  2.60   3.7e-02  1.2e-01  2.6e-03
///   anchor (300, 2 x 2)      mirror    1.00   1.25   1.21   1.22   1.24   8.5e-04  1.6e-03  2.6e-03
///   anchor (300, 2 x 2)      chosen    1.00   1.00   1.00   1.00   1.00   9.0e-07  1.3e-05  5.0e-06
///   anchor (2048, 1 x 2)     all-bf16  1.93   1.95   2.26   24.16  2.42   4.4e-02  1.2e-01  2.5e-03
///   anchor (2048, 1 x 2)     mirror    1.01   1.05   1.05   1.13   1.11   1.9e-03  9.2e-04  2.5e-03
///   anchor (2048, 1 x 2)     chosen    1.00   1.00   1.00   1.00   1.00   1.7e-05  9.6e-06  4.8e-06
///   anchor (8192, 1 x 1)     chosen    1.00   1.00   1.00   1.00   1.00   2.3e-05  9.1e-06  4.1e-06
///   long memory (300, 1 x 1) all-bf16  1.42   2.05   2.23   1.22   2.31   4.2e-05  1.4e-03  1.9e-03
///   long memory (300, 1 x 1) mirror    1.42   2.03   1.99   1.22   2.14   6.1e-05  1.4e-03  1.9e-03
///   long memory (300, 1 x 1) chosen    1.00   1.01   1.00   1.00   1.00   1.0e-05  3.1e-06  3.6e-06
///   long memory (2048, 1 x 2) all-bf16  1.56   2.22   2.40   1.81   2.47   7.9e-04  2.5e-03  2.3e-03
///   long memory (2048, 1 x 2) mirror    1.56   2.21   2.19   1.80   2.20   8.2e-04  2.5e-03  2.3e-03
///   long memory (2048, 1 x 2) chosen    1.00   1.01   1.00   1.00   1.00   2.6e-06  4.7e-06  4.4e-06
///   long memory (8192, 1 x 1) all-bf16  1.77   2.24   2.42   1.93   2.56   6.4e-03  2.6e-03  2.4e-03
///   long memory (8192, 1 x 1) mirror    1.77   2.23   2.22   1.93   2.30   6.3e-03  2.6e-03  2.4e-03
///   long memory (8192, 1 x 1) chosen    1.00   1.01   1.00   1.00   1.00   1.5e-05  5.0e-06  4.6e-06
///   long memory (16384, 1 x 1) all-bf16  1.87   2.26   2.45   2.12   2.51   3.6e-04  3.3e-03  2.3e-03
///   long memory (16384, 1 x 1) mirror    1.86   2.25   2.24   2.12   2.27   7.1e-04  3.3e-03  2.3e-03
///   long memory (16384, 1 x 1) chosen    1.00   1.01   1.00   1.00   1.00   7.6e-07  6.2e-06  4.5e-06
/// (fp32 plan: every bf16 gradient 1.00x, dA_log, dbias, dS0 <= 2.6e-6; the per-product variants and the state
/// hi/lo plan, whose checkpoints keep the forward's one-product W S and miss dbias on long memory at T >= 8192, in
/// the doc.) Twin speed ~0.2-1.3 ms per token and head on one shared core.
///
/// Layouts as KdaBwdProblem (numerics/kda_backward_twin.hpp): fixed-length batches, or packed sequences (cu, B = 1;
/// S0, dS_T and dS0 per sequence).
/// Errors: kdalab::Error for chunk < 1, or a chunk's decay span beyond the factored range.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "numerics/bf16.hpp"
#include "numerics/kda_backward_twin.hpp"
#include "reference/error.hpp"
#include "reference/gate_backward.hpp"
#include "reference/layers_backward.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

/// The operands of one matrix product: their format, and whether both are carried as hi + lo of it (three products
/// hi hi + hi lo + lo hi, lo lo dropped; fp32 accumulation).
struct OperandFormat {
  Format f = Format::fp32;
  bool hilo = false;
};

/// Operand formats of every product of the chunked backward (file comment), the accumulation and storage formats, the
/// chunk size.
struct KdaBwdTwinPlan {
  OperandFormat kk, qk, solve, pdo, dov, dpk, ndx, dxw;                       ///< intra-chunk products
  OperandFormat ws{Format::bf16}, kds{Format::bf16}, vds{Format::bf16}, dos{Format::bf16}, qdo{Format::bf16};
  /// the forward's state pass that produces the checkpoints (numerics/kda_twin.hpp kda_plan_state_hilo)
  OperandFormat fwd_ws{Format::bf16}, fwd_kd{Format::bf16, true};
  Format accum = Format::fp32;       ///< accumulation, stored intermediates, elementwise work
  Format checkpoint = Format::fp32;  ///< the chunk-boundary states
  Format out = Format::bf16;         ///< dq, dk, dv, dg, dbeta
  Format out_f32 = Format::fp32;     ///< dA_log, dbias, dS0
  std::size_t chunk = 16;
};

/// Every product's operands in one format, not split, the forward's state pass too.
inline KdaBwdTwinPlan kda_bwd_plan_uniform(Format f) {
  KdaBwdTwinPlan p;
  for (OperandFormat* o : {&p.kk, &p.qk, &p.solve, &p.pdo, &p.dov, &p.dpk, &p.ndx, &p.dxw, &p.ws, &p.kds, &p.vds,
                           &p.dos, &p.qdo, &p.fwd_ws, &p.fwd_kd})
    *o = {f, false};
  return p;
}
/// Every product with bf16 operands (fla's level), the forward's state pass too.
inline KdaBwdTwinPlan kda_bwd_plan_all_bf16() { return kda_bwd_plan_uniform(Format::bf16); }
/// The forward kernel's plan mirrored (numerics/kda_twin.hpp kda_plan_kernel): intra-chunk products fp32, every
/// state product one bf16 product, the forward's state pass too.
inline KdaBwdTwinPlan kda_bwd_plan_mirror() {
  KdaBwdTwinPlan p;
  p.fwd_kd = {Format::bf16, false};
  return p;
}
/// Intra-chunk fp32, every state product with both operands as bf16 hi + lo; checkpoints from the forward's chosen
/// plan (W S bf16, Kd^T D hi + lo).
inline KdaBwdTwinPlan kda_bwd_plan_state_hilo() {
  KdaBwdTwinPlan p;
  for (OperandFormat* o : {&p.ws, &p.kds, &p.vds, &p.dos, &p.qdo}) *o = {Format::bf16, true};
  return p;
}
/// The chosen plan (docs/kernels/kda_backward.md, "Version 2"): intra-chunk products fp32-class (tf32 hi + lo, three
/// tensor-core passes, as the forward's prepare forms A and P; the forward substitution in fp32), the backward's state
/// products with both operands as bf16 hi + lo except the recompute V~ = U - W S (one bf16 product), and the
/// checkpoints from a state pass with both of its products (W S, Kd^T D) as bf16 hi + lo.
inline KdaBwdTwinPlan kda_bwd_plan_chosen() {
  KdaBwdTwinPlan p;
  for (OperandFormat* o : {&p.kk, &p.qk, &p.pdo, &p.dov, &p.dpk, &p.ndx, &p.dxw}) *o = {Format::tf32, true};
  p.solve = {Format::fp32, false};
  p.ws = {Format::bf16, false};
  for (OperandFormat* o : {&p.kds, &p.vds, &p.dos, &p.qdo, &p.fwd_ws, &p.fwd_kd}) *o = {Format::bf16, true};
  return p;
}
/// The chunked kernel as built (kernels/kda_backward/chunked.cu): the products over D or value columns as tf32 hi + lo
/// (three mma.sync passes), the products over a chunk's 16 tokens (kk, qk, dpk, the substitution) in fp32 FMA, the
/// forward chain that stores every chunk's S likewise (tf32 hi + lo).
inline KdaBwdTwinPlan kda_bwd_plan_kernel() {
  KdaBwdTwinPlan p;
  for (OperandFormat* o : {&p.ws, &p.kds, &p.vds, &p.dos, &p.qdo, &p.fwd_ws, &p.fwd_kd, &p.pdo, &p.dov, &p.ndx,
                           &p.dxw})
    *o = {Format::tf32, true};
  return p;
}
/// The chunked kernel with its chains on wgmma (KdaBackwardPass::chunked_wg, kernels/kda_backward/chains_wg.cu): the
/// chains' products over keys or tokens with both operands as bf16 hi + lo, the forward chain's (fwd_ws, fwd_kd) and
/// the reverse chain's update of dS (qdo); the rest as kda_bwd_plan_kernel. The twin forms dV~ once per chunk for the
/// update of dS and for the gradients; the kernel forms it twice, as bf16 hi + lo in the reverse chain and as tf32
/// hi + lo in the gradient kernel: kds and pdo are kept at the gradient kernel's tf32 hi + lo here, so the chain's
/// dV~ is modelled a little better than it is (its error enters dS through qdo, whose bf16 hi + lo rounding is of the
/// same size and is modelled).
inline KdaBwdTwinPlan kda_bwd_plan_kernel_wg() {
  KdaBwdTwinPlan p = kda_bwd_plan_kernel();
  for (OperandFormat* o : {&p.fwd_ws, &p.fwd_kd, &p.qdo}) *o = {Format::bf16, true};
  return p;
}
/// fp32 operands everywhere (the forward's state pass too).
inline KdaBwdTwinPlan kda_bwd_plan_fp32() { return kda_bwd_plan_uniform(Format::fp32); }
/// Every format float64: the twin then equals kda_backward_kernel_form<double> up to summation order.
inline KdaBwdTwinPlan kda_bwd_plan_fp64() {
  KdaBwdTwinPlan p = kda_bwd_plan_uniform(Format::fp64);
  p.accum = p.checkpoint = p.out = p.out_f32 = Format::fp64;
  return p;
}

namespace chunk_bwd_detail {
using M = Mat<double>;
using V = Vec<double>;

/// Rounds once to f, round-to-nearest-even: numerics/bf16.hpp round_to, with a bit-level fast path for bf16 and tf32
/// normals (the twin rounds ~1e6 values per chunk) and a float cast for fp32.
inline double rnd(double x, Format f) {
  if (f == Format::fp64) return x;
  if (f == Format::fp32) return static_cast<double>(static_cast<float>(x));
  const double a = std::fabs(x);
  if ((f == Format::bf16 || f == Format::tf32) && a >= 0x1p-126 && a < 0x1p127) {
    const int drop = f == Format::bf16 ? 45 : 42;  // 52 - (p - 1) mantissa bits dropped
    std::uint64_t u;
    std::memcpy(&u, &x, 8);
    u += ((std::uint64_t{1} << (drop - 1)) - 1) + ((u >> drop) & 1);
    u &= ~((std::uint64_t{1} << drop) - 1);
    double r;
    std::memcpy(&r, &u, 8);
    return r;
  }
  return round_to(x, f);
}
inline M rnd(const M& a, Format f) {
  if (f == Format::fp64) return a;
  return a.unaryExpr([f](double x) { return rnd(x, f); });
}
/// The product a b with its operands in format o (hilo: hi hi + hi lo + lo hi), summed exactly, rounded once to fa.
inline M prod(const M& a, const M& b, OperandFormat o, Format fa) {
  if (o.f == Format::fp64) return rnd(M(a * b), fa);
  const M ah = rnd(a, o.f), bh = rnd(b, o.f);
  if (!o.hilo) return rnd(M(ah * bh), fa);
  const M al = rnd(M(a - ah), o.f), bl = rnd(M(b - bh), o.f);
  return rnd(M(ah * bh + ah * bl + al * bh), fa);
}

/// One chunk's recomputed quantities (file comment), rows [t0, t0 + L) of one head.
struct Chunk {
  M Q, K, Vv, Gam, Kg, Ki, Qg, Kd, B, N, W, U, P;
  V beta, gamL;
};
/// Forward substitution (I + A) X = R with A strictly lower (operands of A and of the rows already solved in `solve`,
/// rounded once per product term as numerics/kda_twin.hpp does), rows rounded to fa.
inline M fsub(const M& A, const M& R, OperandFormat solve, Format fa) {
  const Eigen::Index L = R.rows();
  M X(L, R.cols()), Xs(L, R.cols());
  const M As = rnd(A, solve.f);
  for (Eigen::Index r = 0; r < L; ++r) {
    V acc = R.row(r).transpose();
    for (Eigen::Index s = 0; s < r; ++s) acc -= As(r, s) * Xs.row(s).transpose();
    for (Eigen::Index c = 0; c < R.cols(); ++c) {
      X(r, c) = rnd(acc(c), fa);
      Xs(r, c) = rnd(X(r, c), solve.f);
    }
  }
  return X;
}
inline Chunk chunk(const M& q, const M& k, const M& v, const M& g, const V& beta, Eigen::Index t0, Eigen::Index L,
                   const KdaBwdTwinPlan& p) {
  const Format fa = p.accum;
  const Eigen::Index dk = q.cols();
  Chunk c;
  c.Q = q.middleRows(t0, L);
  c.K = k.middleRows(t0, L);
  c.Vv = v.middleRows(t0, L);
  c.beta = beta.segment(t0, L);
  c.Gam = M(L, dk);
  const double span = fa == Format::fp64 ? 700.0 : 80.0;
  for (Eigen::Index i = 0; i < dk; ++i) {
    double G = 0;
    for (Eigen::Index r = 0; r < L; ++r) {
      G = rnd(G + g(t0 + r, i), fa);
      require(-G <= span, "kda_chunk_backward_twin: cumulative log-decay " + std::to_string(G) +
                              " inside a chunk is beyond the factored range -" + std::to_string(span) +
                              "; use a smaller chunk");
      c.Gam(r, i) = rnd(std::exp(G), fa);
    }
  }
  c.gamL = c.Gam.row(L - 1).transpose();
  c.Kg = rnd(M(c.Gam.cwiseProduct(c.K)), fa);
  c.Ki = rnd(M(c.K.cwiseQuotient(c.Gam)), fa);
  c.Qg = rnd(M(c.Gam.cwiseProduct(c.Q)), fa);
  M dec(L, dk);
  for (Eigen::Index r = 0; r < L; ++r)
    for (Eigen::Index i = 0; i < dk; ++i) dec(r, i) = rnd(c.gamL(i) / c.Gam(r, i), fa);
  c.Kd = rnd(M(c.K.cwiseProduct(dec)), fa);
  c.B = prod(c.Kg, c.Ki.transpose(), p.kk, fa);
  M A = M::Zero(L, L);
  for (Eigen::Index r = 0; r < L; ++r)
    for (Eigen::Index s = 0; s < r; ++s) A(r, s) = rnd(c.beta(r) * c.B(r, s), fa);
  c.P = M(prod(c.Qg, c.Ki.transpose(), p.qk, fa).triangularView<Eigen::Lower>());
  M R(L, dk + v.cols());
  R << rnd(M(c.beta.asDiagonal() * c.Kg), fa), rnd(M(c.beta.asDiagonal() * c.Vv), fa);
  const M X = fsub(A, R, p.solve, fa);
  c.W = X.leftCols(dk);
  c.U = X.rightCols(v.cols());
  c.N = fsub(A, M::Identity(L, L), p.solve, fa);
  return c;
}
}  // namespace chunk_bwd_detail

/// Runs the chunked backward (file comment) on `pr` with plan `p`. Returns the kernel backward's output set.
/// Errors: kdalab::Error (file comment).
inline KdaBwdGrads kda_chunk_backward_twin(const KdaBwdProblem& pr, const KdaBwdTwinPlan& p) {
  using namespace chunk_bwd_detail;
  require(p.chunk >= 1, "kda_chunk_backward_twin: chunk = 0; accepted: >= 1");
  const std::size_t B = pr.B, T = pr.T, H = pr.H, HV = pr.HV, D = pr.D, group = HV / H;
  const std::size_t N = pr.cu.empty() ? B : pr.cu.size() - 1;  // sequences: the batch, or the packed ones (B = 1)
  const Format fa = p.accum;
  const auto Ti = static_cast<Eigen::Index>(T), Di = static_cast<Eigen::Index>(D), C = static_cast<Eigen::Index>(p.chunk);
  const double scale = pr.scale;
  // ---- pre-ops (fp32 class): q, k normalised, beta, g ----
  Tensor<double> qn = pr.q, kn = pr.k, g = pr.g, beta = pr.beta;
  if (pr.l2norm)
    for (auto [src, dst] : {std::pair{&pr.q, &qn}, {&pr.k, &kn}})
      for (std::size_t r = 0; r < B * T * H; ++r) {
        double n2 = 0;
        for (std::size_t i = 0; i < D; ++i) n2 += src->data[r * D + i] * src->data[r * D + i];
        const double inv = n2 > 0 ? 1.0 / std::sqrt(n2) : 0.0;
        for (std::size_t i = 0; i < D; ++i) dst->data[r * D + i] = rnd(src->data[r * D + i] * inv, fa);
      }
  for (std::size_t r = 0; r < B * T; ++r)
    for (std::size_t hv = 0; hv < HV; ++hv) {
      if (pr.beta_sigmoid) beta.data[r * HV + hv] = rnd(sigmoid<double>(pr.beta.data[r * HV + hv]), fa);
      if (pr.fused)
        for (std::size_t i = 0; i < D; ++i)
          g.data[(r * HV + hv) * D + i] =
              rnd(bounded_gate<double>(pr.g.data[(r * HV + hv) * D + i], pr.A_log(hv), pr.bias(hv, i), pr.g_min), fa);
    }
  // ---- per value head: the chunked forward pass (checkpoints) and the chunked reverse pass ----
  Tensor<double> dqn({B, T, H, D}, 0.0), dkn({B, T, H, D}, 0.0), dv({B, T, HV, D}), dg({B, T, HV, D}),
      dbeta({B, T, HV});
  KdaBwdGrads r{{}, {}, {}, {}, {}, Tensor<double>({HV}, 0.0), Tensor<double>({HV, D}, 0.0),
                Tensor<double>({N, HV, D, D})};
  M q(Ti, Di), k(Ti, Di), v(Ti, Di), gl(Ti, Di), dO(Ti, Di);
  V bt(Ti);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t hv = 0; hv < HV; ++hv) {
      const std::size_t h = hv / group;
      // sequence n: batch entry b, tokens [bos, bos + len) of it
      const std::size_t b = pr.cu.empty() ? n : 0, bos = pr.cu.empty() ? 0 : pr.cu[n];
      const std::size_t len = pr.cu.empty() ? T : pr.cu[n + 1] - pr.cu[n];
      const auto Tn = static_cast<Eigen::Index>(len);
      for (std::size_t tt = 0; tt < len; ++tt) {
        const std::size_t t = bos + tt;
        for (std::size_t i = 0; i < D; ++i) {
          const auto ti = static_cast<Eigen::Index>(tt), ii = static_cast<Eigen::Index>(i);
          q(ti, ii) = qn(b, t, h, i);
          k(ti, ii) = kn(b, t, h, i);
          v(ti, ii) = pr.v(b, t, hv, i);
          gl(ti, ii) = g(b, t, hv, i);
          dO(ti, ii) = pr.dO(b, t, hv, i);
        }
        bt(static_cast<Eigen::Index>(tt)) = beta(b, t, hv);
      }
      M S = M::Zero(Di, Di), dS = M::Zero(Di, Di);
      for (std::size_t i = 0; i < D * D; ++i) {
        if (pr.S0) S.data()[i] = rnd(pr.S0->data[(n * HV + hv) * D * D + i], p.checkpoint);
        if (pr.dS_T) dS.data()[i] = rnd(pr.dS_T->data[(n * HV + hv) * D * D + i], fa);
      }
      std::vector<M> enter;
      for (Eigen::Index t0 = 0; t0 < Tn; t0 += C) {
        const Eigen::Index L = std::min(C, Tn - t0);
        enter.push_back(S);
        const Chunk c = chunk(q, k, v, gl, bt, t0, L, p);
        const M Vt = rnd(M(c.U - prod(c.W, S, p.fwd_ws, fa)), fa);
        S = rnd(M(rnd(M(c.gamL.asDiagonal() * S), fa) + prod(c.Kd.transpose(), Vt, p.fwd_kd, fa)), p.checkpoint);
      }
      for (auto m = static_cast<Eigen::Index>(enter.size()) - 1; m >= 0; --m) {
        const Eigen::Index t0 = m * C, L = std::min(C, Tn - t0);
        const M& Sin = enter[static_cast<std::size_t>(m)];
        const Chunk c = chunk(q, k, v, gl, bt, t0, L, p);
        const M Vt = rnd(M(c.U - prod(c.W, Sin, p.ws, fa)), fa);
        const M dOc = dO.middleRows(t0, L);
        const M dVt = rnd(M(scale * prod(c.P.transpose(), dOc, p.pdo, fa) + prod(c.Kd, dS, p.kds, fa)), fa);
        const M dP = rnd(M(scale * prod(dOc, Vt.transpose(), p.dov, fa)), fa).triangularView<Eigen::Lower>();
        const M dKd = prod(Vt, dS.transpose(), p.vds, fa);
        // [dO ; dV~] S^T as one product (dos)
        M dOV(2 * L, Di);
        dOV << dOc, dVt;
        const M dOVS = prod(dOV, Sin.transpose(), p.dos, fa);
        const M dQg = rnd(M(scale * dOVS.topRows(L) + prod(dP, c.Ki, p.dpk, fa)), fa);
        const M dW = -dOVS.bottomRows(L);
        M dKi = rnd(M(prod(dP.transpose(), c.Qg, p.dpk, fa) + dKd * c.gamL.asDiagonal()), fa);
        const V dgamL = dS.cwiseProduct(Sin).rowwise().sum() + c.Ki.cwiseProduct(dKd).colwise().sum().transpose();
        // dS_n = [Qg | W]^T [scale dO ; -dV~] (qdo) + Diag(gamL) dS
        M QW(2 * L, Di), R2(2 * L, Di);
        QW << c.Qg, c.W;
        R2 << rnd(M(scale * dOc), fa), -dVt;
        dS = rnd(M(prod(QW.transpose(), R2, p.qdo, fa) + rnd(M(c.gamL.asDiagonal() * dS), fa)), fa);
        M dWU(L, 2 * Di), WU(L, 2 * Di);
        dWU << dW, dVt;
        WU << c.W, c.U;
        const M dXY = prod(c.N.transpose(), dWU, p.ndx, fa);
        const M dX = dXY.leftCols(Di), dY = dXY.rightCols(Di);
        const M dA = M(-prod(dXY, WU.transpose(), p.dxw, fa)).triangularView<Eigen::StrictlyLower>();
        const M dB = rnd(M(c.beta.asDiagonal() * dA), fa);
        const M dKg = rnd(M(prod(dB, c.Ki, p.dpk, fa) + rnd(M(c.beta.asDiagonal() * dX), fa)), fa);
        dKi = rnd(M(dKi + prod(dB.transpose(), c.Kg, p.dpk, fa)), fa);
        const V dbt = dA.cwiseProduct(c.B).rowwise().sum() + dX.cwiseProduct(c.Kg).rowwise().sum() +
                      dY.cwiseProduct(c.Vv).rowwise().sum();
        const M dV = rnd(M(c.beta.asDiagonal() * dY), fa);
        const M dK = rnd(M(c.Gam.cwiseProduct(dKg) + dKi.cwiseQuotient(c.Gam)), fa);
        const M dQ = rnd(M(c.Gam.cwiseProduct(dQg)), fa);
        M dG = c.Gam.cwiseProduct(M(c.K.cwiseProduct(dKg) + c.Q.cwiseProduct(dQg))) - c.Ki.cwiseProduct(dKi);
        dG.row(L - 1) += c.gamL.cwiseProduct(dgamL).transpose();
        V acc = V::Zero(Di);
        for (Eigen::Index rr = L - 1; rr >= 0; --rr) {
          const auto t = bos + static_cast<std::size_t>(t0 + rr);
          acc = rnd(M(acc + dG.row(rr).transpose()), fa);
          for (std::size_t i = 0; i < D; ++i) {
            const auto ii = static_cast<Eigen::Index>(i);
            dg(b, t, hv, i) = acc(ii);
            dqn(b, t, h, i) += dQ(rr, ii);  // value heads of a key head summed in a fixed order
            dkn(b, t, h, i) += dK(rr, ii);
            dv(b, t, hv, i) = dV(rr, ii);
          }
          dbeta(b, t, hv) = rnd(dbt(rr), fa);
        }
      }
      for (std::size_t i = 0; i < D * D; ++i) r.dS0.data[(n * HV + hv) * D * D + i] = rnd(dS.data()[i], p.out_f32);
    }
  // ---- the pre-ops' chain rules (fp32 class), outputs rounded once ----
  r.dq = Tensor<double>({B, T, H, D});
  r.dk = Tensor<double>({B, T, H, D});
  const auto n = static_cast<Eigen::Index>(D);
  for (auto [x, dy, dx] : {std::tuple{&pr.q, &dqn, &r.dq}, {&pr.k, &dkn, &r.dk}})
    for (std::size_t row = 0; row < B * T * H; ++row) {
      const V dyr = Eigen::Map<const V>(dy->data.data() + row * D, n).unaryExpr([fa](double x) { return rnd(x, fa); });
      V dxr = dyr;
      if (pr.l2norm) dxr = l2norm_vec_backward<double>(Eigen::Map<const V>(x->data.data() + row * D, n), dyr, 0.0);
      for (std::size_t i = 0; i < D; ++i) dx->data[row * D + i] = rnd(rnd(dxr(static_cast<Eigen::Index>(i)), fa), p.out);
    }
  r.dv = dv;
  r.dg = dg;
  r.dbeta = dbeta;
  for (std::size_t row = 0; row < B * T; ++row)
    for (std::size_t hv = 0; hv < HV; ++hv) {
      if (pr.beta_sigmoid)
        r.dbeta.data[row * HV + hv] = rnd(dbeta.data[row * HV + hv] * sigmoid_derivative<double>(pr.beta.data[row * HV + hv]), fa);
      if (pr.fused)
        for (std::size_t i = 0; i < D; ++i) {
          const std::size_t o = (row * HV + hv) * D + i;
          const GatePartials<double> gp = bounded_gate_partials<double>(pr.g.data[o], pr.A_log(hv), pr.bias(hv, i), pr.g_min);
          const double dz = rnd(dg.data[o] * gp.dz, fa);
          r.dbias(hv, i) += dz;
          r.dA_log(hv) += rnd(dg.data[o] * gp.dA_log, fa);
          r.dg.data[o] = dz;
        }
    }
  for (auto* t : {&r.dv, &r.dg, &r.dbeta})
    for (double& x : t->data) x = rnd(x, p.out);
  for (auto* t : {&r.dA_log, &r.dbias})
    for (double& x : t->data) x = rnd(x, p.out_f32);
  return r;
}

/// The long-memory variant of a backward problem, in place (numerics/kda_inputs.hpp make_long_memory): A_log = 0,
/// bias = -12 (fused gate: g ~ -5 e^-12 ~ -3e-5 per token), beta logits - 5 (rounded to bf16; beta ~ 0.007), so the
/// state and its gradient carry information over thousands of tokens. Needs the fused gate and the beta sigmoid.
/// Errors: kdalab::Error otherwise.
inline void make_long_memory(KdaBwdProblem& p) {
  require(p.fused && p.beta_sigmoid, "make_long_memory: the backward problem needs the fused gate and beta sigmoid");
  for (auto& x : p.A_log.data) x = 0.0;
  for (auto& x : p.bias.data) x = -12.0;
  for (auto& x : p.beta.data) x = round_bf16(x - 5.0);
}

/// The near-collinear-keys variant of a backward problem, in place (numerics/kda_inputs.hpp make_collinear_keys): per
/// (sequence, key head) one random unit direction u and raw keys k = bf16(u + noise z / sqrt(D)), z ~ N(0, 1) entries
/// (noise 0: every token the same key); decay: the long-memory gate (A_log = 0, bias = -12), else none (bias = -1e4:
/// g = 0 exactly). Draws from Rng(seed). Needs the fused gate and the L2Norm (keys given raw). Errors: kdalab::Error
/// otherwise, or on noise < 0 or not finite.
inline void make_collinear_keys(KdaBwdProblem& p, double noise, bool decay, std::uint64_t seed) {
  require(p.fused && p.l2norm, "make_collinear_keys: the backward problem needs the fused gate and the L2Norm");
  require(std::isfinite(noise) && noise >= 0,
          "make_collinear_keys: noise = " + std::to_string(noise) + " is not accepted; give a finite value >= 0");
  Rng rng(seed);
  const std::size_t D = p.D, B = p.B, T = p.T, H = p.H;
  std::vector<double> u(D);
  for (std::size_t b = 0; b < B; ++b)  // packed sequences (B = 1): one direction for the whole pack
    for (std::size_t h = 0; h < H; ++h) {
      double n2 = 0;
      for (auto& x : u) {
        x = rng.normal();
        n2 += x * x;
      }
      for (auto& x : u) x /= std::sqrt(n2);
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t i = 0; i < D; ++i)
          p.k.data[((b * T + t) * H + h) * D + i] =
              round_bf16(u[i] + (noise > 0 ? noise * rng.normal() / std::sqrt(static_cast<double>(D)) : 0.0));
    }
  for (auto& x : p.A_log.data) x = decay ? 0.0 : x;
  for (auto& x : p.bias.data) x = decay ? -12.0 : -1e4;
}

}  // namespace kdalab
