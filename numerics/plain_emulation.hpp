#pragma once
/// The plain reference algorithms of the checked operations, emulated at a declared precision p, forward and
/// backward: the error a straightforward implementation at p makes on given inputs. `kdalab check` scales it into
/// the verdict budget (numerics/budget.hpp). It is the budget's source, not the twin of any kernel
/// (numerics/kda_twin.hpp models kdalab's own kernel and never sets a budget).
///
/// Precision model (one rule everywhere, p in {bf16, fp16, fp32, fp64}):
///  * every matrix product reads its two operands rounded once to p and accumulates in fp32 (lowp.hpp
///    matmul_lowp: a tensor-core MMA for bf16 / fp16, an FFMA loop for fp32). Why: operand rounding is the
///    dominant, unavoidable error of a p-precision kernel; fp32 accumulation is what every such kernel does.
///  * every other intermediate (decays e^G, cumulative sums, the UT inverse, softmax, norms, gate functions, sums
///    over tokens) is fp32: each elementwise result is formed in double and rounded once to fp32, each sum is
///    rounded after every addition. Why: kernels keep these on the CUDA cores in fp32; rounding them to p would
///    model a worse algorithm than the plain one.
///  * the file's inputs are used as they are (they are what the candidate saw); an output or gradient is NOT
///    rounded to its storage format here: that term is separate in the budget.
///  * p = fp64: every operation is plain float64 (the float64 reference algorithm itself).
///
/// Algorithms:
///  * KDA: the chunked UT/WY form (reference/kda_chunk.hpp, reference/kda_chunk_backward.hpp, chunk C = 64;
///    docs/equations.md, chunked form), pre-ops (L2Norm, gate, beta sigmoid) and their backward in fp32. q and k
///    after the L2Norm are operands of every intra-chunk product, so they are rounded to p once and that one copy
///    is used everywhere after, in the products and in the elementwise gate math (dG = K ⊙ dKg Gamma - K ⊙
///    dKi / Gamma + Q ⊙ dQ). The decayed pairwise products (Gamma K)(K / Gamma)^T and the products of the
///    backward with K / Gamma are formed pair by pair: sum_c op(a_ic) op(b_jc) e^{G_ic - G_jc}, the operands
///    rounded to p and the decay e^{G_i - G_j} <= 1 an fp32 factor of their product (no e^{-G} is ever formed: fp32
///    would overflow at |G| > 88). Why not fold the decay into an operand before rounding it: then the pair (i, j)
///    enters dQ_i as op(dP_ij) op(k_j e_ij) and dK_j as op(dP_ij) op(q_i e_ij), two differently rounded numbers;
///    their contributions q_i dQ_i and k_j dK_j to dG cancel exactly in the math (the reverse cumulative sum of
///    dG keeps only pairs with i >= r > j), so the rounding residue of the chunk's largest, near-diagonal products
///    would dominate dg and the gate-parameter gradients (anchor-kda, T = 300, H = 2, d = 128, bf16: folded,
///    dg 1.3e-2, dA_log 2.8e-2, dbias 7.5e-2; as here, 3.0e-3, 1.2e-3, 2.9e-3; dq, dk, dv unchanged). The inverse (I + A)^{-1} is a forward substitution in fp32. The backward uses the
///    identity N^T dW X^T N^T = dX W^T (W = N X) for dA.
///    --op kda-decode is the same code with C = 1 (the recurrence at p).
///  * MLA (absorbed, W_UK = W_UV = I, as `--op mla`): the naive attention, scores materialised:
///    Z = scale (q c^T + q_rope k_rope^T), P = causal softmax(Z) in fp32, O = P c; backward dP = dO c^T,
///    dZ = scale P (dP - rowsum(P dP)), dq = dZ c, dc = P^T dO + dZ^T q, dq_rope = dZ k_rope, dk_rope = dZ^T q_rope.
///  * AttnRes (reference/attn_res.hpp, reference/attn_res_backward.hpp): per token, block sums in fp32, RMSNorm in
///    fp32, logits w . r_i and the mix sum_i alpha_i v_i as p-operand dot products with fp32 accumulation, softmax
///    in fp32; the backward likewise.
/// Layouts and gradient names as numerics/check_ops.hpp.
#include <cmath>
#include <vector>

#include "numerics/check_ops.hpp"
#include "numerics/lowp.hpp"

namespace kdalab::emul {

/// The arithmetic of one precision p (file comment): operand format p, accumulator fp32 (fp64 when p = fp64).
struct Arith {
  Format p = Format::bf16, acc = Format::fp32;
  static Arith at(Format prec) { return {prec, prec == Format::fp64 ? Format::fp64 : Format::fp32}; }
  /// One rounding to the accumulator format.
  double r(double x) const {
    if (acc == Format::fp64) return x;
    if (acc == Format::fp32) return static_cast<double>(static_cast<float>(x));
    return round_to(x, acc);
  }
  /// One rounding to the operand format.
  double op(double x) const { return p == acc ? r(x) : round_to(x, p); }
  Mat<double> rm(const Mat<double>& a) const {
    if (acc == Format::fp64) return a;
    return a.unaryExpr([this](double x) { return r(x); });
  }
  /// A product with operands rounded to p and fp32 accumulation.
  Mat<double> mm(const Mat<double>& A, const Mat<double>& B) const { return matmul_lowp(A, B, {p, p, acc}); }
  /// sum_i op(a_i) op(b_i) in the accumulator format, in index order.
  double dot(const Vec<double>& a, const Vec<double>& b) const {
    double s = 0;
    for (Eigen::Index i = 0; i < a.size(); ++i) s = r(s + op(a(i)) * op(b(i)));
    return s;
  }
  /// sum_i a_i b_i with fp32 operands (a CUDA-core reduction), rounded after every addition.
  double sum_prod(const Vec<double>& a, const Vec<double>& b) const {
    double s = 0;
    for (Eigen::Index i = 0; i < a.size(); ++i) s = r(s + r(a(i) * b(i)));
    return s;
  }
};

namespace detail {

/// One chunk of L rows of one head, with its decay tables (file comment; names as reference/kda_chunk_backward.hpp).
struct Chunk {
  Eigen::Index L = 0, dk = 0;
  Mat<double> Q, K, V, Gc, Gam, Kg, Qg, Ed, Kd, B, Nv, W, U, P;
  Vec<double> beta, gamL;
  std::vector<double> E;  // E[(i L + j) dk + c] = e^{G_ic - G_jc}, j <= i
  double e(Eigen::Index i, Eigen::Index j, Eigen::Index c) const { return E[static_cast<std::size_t>((i * L + j) * dk + c)]; }
};

/// One term op(a) op(b) e of a decayed product: operands rounded to p, their product times the fp32 decay e, rounded.
inline double decayed(const Arith& ar, double a, double b, double e) { return ar.r(ar.r(ar.op(a) * ar.op(b)) * e); }

/// sum_c op(a_ic) op(b_jc) e^{G_ic - G_jc} for j <= i (j < i when strict), fp32 accumulation.
inline Mat<double> pair(const Arith& ar, const Chunk& c, const Mat<double>& a, const Mat<double>& b, bool strict) {
  Mat<double> R = Mat<double>::Zero(c.L, c.L);
  for (Eigen::Index i = 0; i < c.L; ++i)
    for (Eigen::Index j = 0; j < (strict ? i : i + 1); ++j) {
      double s = 0;
      for (Eigen::Index x = 0; x < c.dk; ++x) s = ar.r(s + decayed(ar, a(i, x), b(j, x), c.e(i, j, x)));
      R(i, j) = s;
    }
  return R;
}
/// Left decayed product (Gamma ⊙ (M (K / Gamma))): out_ic = sum_{j <= i} op(M_ij) op(b_jc) e^{G_ic - G_jc}; M lower.
inline Mat<double> left(const Arith& ar, const Chunk& c, const Mat<double>& M, const Mat<double>& b) {
  Mat<double> R(c.L, c.dk);
  for (Eigen::Index i = 0; i < c.L; ++i)
    for (Eigen::Index x = 0; x < c.dk; ++x) {
      double s = 0;
      for (Eigen::Index j = 0; j <= i; ++j) s = ar.r(s + decayed(ar, M(i, j), b(j, x), c.e(i, j, x)));
      R(i, x) = s;
    }
  return R;
}
/// Right decayed product ((M^T (Gamma ⊙ a)) / Gamma): out_jc = sum_{i >= j} op(M_ij) op(a_ic) e^{G_ic - G_jc}; M lower.
inline Mat<double> right(const Arith& ar, const Chunk& c, const Mat<double>& M, const Mat<double>& a) {
  Mat<double> R(c.L, c.dk);
  for (Eigen::Index j = 0; j < c.L; ++j)
    for (Eigen::Index x = 0; x < c.dk; ++x) {
      double s = 0;
      for (Eigen::Index i = j; i < c.L; ++i) s = ar.r(s + decayed(ar, M(i, j), a(i, x), c.e(i, j, x)));
      R(j, x) = s;
    }
  return R;
}

/// The forward quantities of rows [t0, t0 + L) of one head (derived inputs q, k, g, beta, fp32 values).
inline Chunk make_chunk(const Arith& ar, const Mat<double>& q, const Mat<double>& k, const Mat<double>& v,
                        const Mat<double>& g, const Vec<double>& beta, Eigen::Index t0, Eigen::Index L) {
  Chunk c;
  c.L = L;
  c.dk = q.cols();
  c.Q = q.middleRows(t0, L);
  c.K = k.middleRows(t0, L);
  c.V = v.middleRows(t0, L);
  c.beta = beta.segment(t0, L);
  c.Gc = g.middleRows(t0, L);
  for (Eigen::Index r = 1; r < L; ++r)
    for (Eigen::Index x = 0; x < c.dk; ++x) c.Gc(r, x) = ar.r(c.Gc(r - 1, x) + c.Gc(r, x));
  c.Gam = c.Gc.unaryExpr([&](double G) { return ar.r(std::exp(G)); });
  c.gamL = c.Gam.row(L - 1).transpose();
  c.Kg = ar.rm(c.Gam.cwiseProduct(c.K));
  c.Qg = ar.rm(c.Gam.cwiseProduct(c.Q));
  c.Ed = Mat<double>(L, c.dk);
  for (Eigen::Index r = 0; r < L; ++r)
    for (Eigen::Index x = 0; x < c.dk; ++x) c.Ed(r, x) = ar.r(std::exp(ar.r(c.Gc(L - 1, x) - c.Gc(r, x))));
  c.Kd = ar.rm(c.K.cwiseProduct(c.Ed));
  c.E.assign(static_cast<std::size_t>(L * L * c.dk), 0.0);
  for (Eigen::Index i = 0; i < L; ++i)
    for (Eigen::Index j = 0; j <= i; ++j)
      for (Eigen::Index x = 0; x < c.dk; ++x)
        c.E[static_cast<std::size_t>((i * L + j) * c.dk + x)] = ar.r(std::exp(ar.r(c.Gc(i, x) - c.Gc(j, x))));
  c.B = pair(ar, c, c.K, c.K, true);
  // N = (I + StrictTril(beta B))^{-1}: forward substitution in fp32
  c.Nv = Mat<double>::Identity(L, L);
  for (Eigen::Index i = 1; i < L; ++i)
    for (Eigen::Index j = 0; j < i; ++j) {
      double s = 0;
      for (Eigen::Index m = j; m < i; ++m) s = ar.r(s + ar.r(c.beta(i) * c.B(i, m)) * c.Nv(m, j));
      c.Nv(i, j) = -s;
    }
  c.W = ar.mm(c.Nv, ar.rm(c.beta.asDiagonal() * c.Kg));
  c.U = ar.mm(c.Nv, ar.rm(c.beta.asDiagonal() * c.V));
  c.P = pair(ar, c, c.Q, c.K, false);
  return c;
}

/// Row sums of a ⊙ b in fp32 (a CUDA-core reduction).
inline Vec<double> rowdot(const Arith& ar, const Mat<double>& a, const Mat<double>& b) {
  Vec<double> s(a.rows());
  for (Eigen::Index i = 0; i < a.rows(); ++i) s(i) = ar.sum_prod(a.row(i).transpose(), b.row(i).transpose());
  return s;
}

}  // namespace detail

/// Chunked KDA on one head at precision ar (derived inputs q, k, g [T, d_k], v [T, d_v], beta [T]; S0 [d_k, d_v]).
/// Returns o [T, d_v]; state becomes S_T. With dO (and dS_T, zero for an unused final state) also fills *grad
/// (gradients w.r.t. the derived inputs, as reference/kda_chunk_backward.hpp).
inline Mat<double> kda_head(const Arith& ar, const Mat<double>& q, const Mat<double>& k, const Mat<double>& v,
                            const Mat<double>& g, const Vec<double>& beta, Mat<double>& state, double scale,
                            Eigen::Index C, const Mat<double>* dO = nullptr, const Mat<double>* dS_T = nullptr,
                            KdaHeadGrad<double>* grad = nullptr) {
  const Eigen::Index T = q.rows(), dk = q.cols(), dv = v.cols();
  Mat<double> o(T, dv);
  std::vector<Mat<double>> enter;
  for (Eigen::Index t0 = 0; t0 < T; t0 += C) {
    const Eigen::Index L = std::min(C, T - t0);
    const detail::Chunk c = detail::make_chunk(ar, q, k, v, g, beta, t0, L);
    enter.push_back(state);
    const Mat<double> Vt = ar.rm(c.U - ar.mm(c.W, state));
    o.middleRows(t0, L) = ar.rm(scale * ar.rm(ar.mm(c.Qg, state) + ar.mm(c.P, Vt)));
    state = ar.rm(ar.rm(c.gamL.asDiagonal() * state) + ar.mm(c.Kd.transpose(), Vt));
  }
  if (!dO || !grad) return o;
  KdaHeadGrad<double>& r = *grad;
  r = {Mat<double>(T, dk), Mat<double>(T, dk), Mat<double>(T, dv), Mat<double>(T, dk), Vec<double>(T),
       dS_T ? *dS_T : Mat<double>(Mat<double>::Zero(dk, dv))};
  Mat<double> dS = r.dS0;
  for (Eigen::Index n = static_cast<Eigen::Index>(enter.size()) - 1; n >= 0; --n) {
    const Eigen::Index t0 = n * C, L = std::min(C, T - t0);
    const Mat<double>& Sin = enter[static_cast<std::size_t>(n)];
    const detail::Chunk c = detail::make_chunk(ar, q, k, v, g, beta, t0, L);
    const Mat<double> Vt = ar.rm(c.U - ar.mm(c.W, Sin));
    const Mat<double> dOc = dO->middleRows(t0, L);
    const Mat<double> dVt = ar.rm(ar.rm(scale * ar.mm(c.P.transpose(), dOc)) + ar.mm(c.Kd, dS));
    const Mat<double> dP = ar.rm(scale * ar.mm(dOc, Vt.transpose())).triangularView<Eigen::Lower>();
    const Mat<double> dKd = ar.mm(Vt, dS.transpose());
    const Mat<double> dSin =
        ar.rm(ar.rm(ar.rm(scale * ar.mm(c.Qg.transpose(), dOc)) + ar.rm(c.gamL.asDiagonal() * dS)) -
              ar.mm(c.W.transpose(), dVt));
    const Mat<double> dW = -ar.mm(dVt, Sin.transpose());
    const Mat<double> dX = ar.mm(c.Nv.transpose(), dW), dY = ar.mm(c.Nv.transpose(), dVt);
    const Mat<double> dA =
        (-ar.rm(ar.mm(dX, c.W.transpose()) + ar.mm(dY, c.U.transpose()))).triangularView<Eigen::StrictlyLower>();
    const Mat<double> dB = ar.rm(c.beta.asDiagonal() * dA);
    const Vec<double> dbeta = (detail::rowdot(ar, dA, c.B) + detail::rowdot(ar, dX, c.Kg) + detail::rowdot(ar, dY, c.V))
                                  .unaryExpr([&](double x) { return ar.r(x); });
    const Mat<double> dV = ar.rm(c.beta.asDiagonal() * dY);
    const Mat<double> dKgG = ar.rm(detail::left(ar, c, dB, c.K) + ar.rm(c.beta.asDiagonal() * ar.rm(c.Gam.cwiseProduct(dX))));
    const Mat<double> dKiG = ar.rm(ar.rm(detail::right(ar, c, dP, c.Q) + ar.rm(dKd.cwiseProduct(c.Ed))) +
                                   detail::right(ar, c, dB, c.K));
    const Mat<double> dQ = ar.rm(ar.rm(scale * c.Gam.cwiseProduct(ar.mm(dOc, Sin.transpose()))) + detail::left(ar, c, dP, c.K));
    const Mat<double> dK = ar.rm(dKgG + dKiG);
    Mat<double> dG = ar.rm(ar.rm(c.K.cwiseProduct(dKgG)) - ar.rm(c.K.cwiseProduct(dKiG)) + ar.rm(c.Q.cwiseProduct(dQ)));
    {  // the last row also carries d(gamma_L) gamma_L = gamma_L rowsum(dS ⊙ Sin) + sum_r dKd_r ⊙ Kd_r
      const Vec<double> a = detail::rowdot(ar, dS, Sin);
      for (Eigen::Index x = 0; x < dk; ++x) {
        double s = 0;
        for (Eigen::Index rr = 0; rr < L; ++rr) s = ar.r(s + ar.r(dKd(rr, x) * c.Kd(rr, x)));
        dG(L - 1, x) = ar.r(dG(L - 1, x) + ar.r(ar.r(c.gamL(x) * a(x)) + s));
      }
    }
    Vec<double> accum = Vec<double>::Zero(dk);
    for (Eigen::Index rr = L - 1; rr >= 0; --rr) {
      for (Eigen::Index x = 0; x < dk; ++x) accum(x) = ar.r(accum(x) + dG(rr, x));
      r.dg.row(t0 + rr) = accum.transpose();
    }
    r.dq.middleRows(t0, L) = dQ;
    r.dk.middleRows(t0, L) = dK;
    r.dv.middleRows(t0, L) = dV;
    r.dbeta.segment(t0, L) = dbeta;
    dS = dSin;
  }
  r.dS0 = dS;
  return o;
}

/// Result of a KDA emulation: o [B, T, HV, d_v], final state [B, HV, d_k, d_v] (KV), and the gradients when asked.
struct KdaEmulation {
  Tensor<double> o, S;
  KdaCheckGrads grads;
};

/// KDA `--op kda` problem at precision `prec` with chunk C (64; 1 for kda-decode): forward, and with dO
/// [B, T, HV, d_v] (dS [B, HV, d_k, d_v] KV or null) the gradients w.r.t. the stored inputs.
inline KdaEmulation kda(const KdaCheckOp& c, Format prec, std::size_t C = 64, const Tensor<double>* dO = nullptr,
                        const Tensor<double>* dS = nullptr) {
  const Arith ar = Arith::at(prec);
  const std::size_t B = c.q.dim(0), T = c.q.dim(1), H = c.q.dim(2), dk = c.q.dim(3), HV = c.v.dim(2), dv = c.v.dim(3);
  // pre-ops in fp32: the exact pre-op of check_ops.hpp evaluated in double, each result rounded once
  KdaPreops<double> p = kda_check_preops<double>(c);
  for (Tensor<double>* t : {&p.q, &p.k, &p.g, &p.beta})
    for (auto& x : t->data) x = ar.r(x);
  // q and k: one copy at p, the operand of every intra-chunk product and the factor of the gate math (file comment)
  for (Tensor<double>* t : {&p.q, &p.k})
    for (auto& x : t->data) x = ar.op(x);
  KdaEmulation out{Tensor<double>({B, T, HV, dv}), Tensor<double>({B, HV, dk, dv}), {}};
  KdaGrad<double> d{Tensor<double>(c.q.shape), Tensor<double>(c.k.shape), Tensor<double>(c.v.shape),
                    Tensor<double>(c.g.shape), Tensor<double>(c.beta.shape), Tensor<double>({B, HV, dk, dv})};
  const auto Ti = static_cast<Eigen::Index>(T), dki = static_cast<Eigen::Index>(dk), dvi = static_cast<Eigen::Index>(dv);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t hv = 0; hv < HV; ++hv) {
      const std::size_t h = hv / (HV / H);
      Mat<double> q(Ti, dki), k(Ti, dki), g(Ti, dki), v(Ti, dvi), dOh(Ti, dvi), St = Mat<double>::Zero(dki, dvi),
          dST = Mat<double>::Zero(dki, dvi);
      Vec<double> bt(Ti);
      for (std::size_t t = 0; t < T; ++t) {
        const auto tt = static_cast<Eigen::Index>(t);
        for (std::size_t i = 0; i < dk; ++i) {
          q(tt, static_cast<Eigen::Index>(i)) = p.q(b, t, h, i);
          k(tt, static_cast<Eigen::Index>(i)) = p.k(b, t, h, i);
          g(tt, static_cast<Eigen::Index>(i)) = p.g(b, t, hv, i);
        }
        for (std::size_t j = 0; j < dv; ++j) {
          v(tt, static_cast<Eigen::Index>(j)) = c.v(b, t, hv, j);
          if (dO) dOh(tt, static_cast<Eigen::Index>(j)) = (*dO)(b, t, hv, j);
        }
        bt(tt) = p.beta(b, t, hv);
      }
      for (std::size_t i = 0; i < dk; ++i)
        for (std::size_t j = 0; j < dv; ++j) {
          if (c.has_S0) St(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = c.S0(b, hv, i, j);
          if (dS) dST(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = (*dS)(b, hv, i, j);
        }
      KdaHeadGrad<double> gr;
      const Mat<double> o = kda_head(ar, q, k, v, g, bt, St, c.scale, static_cast<Eigen::Index>(C), dO ? &dOh : nullptr,
                                     &dST, dO ? &gr : nullptr);
      for (std::size_t t = 0; t < T; ++t) {
        const auto tt = static_cast<Eigen::Index>(t);
        for (std::size_t j = 0; j < dv; ++j) out.o(b, t, hv, j) = o(tt, static_cast<Eigen::Index>(j));
        if (!dO) continue;
        for (std::size_t i = 0; i < dk; ++i) {
          const auto ii = static_cast<Eigen::Index>(i);
          d.dq(b, t, h, i) = ar.r(d.dq(b, t, h, i) + gr.dq(tt, ii));
          d.dk(b, t, h, i) = ar.r(d.dk(b, t, h, i) + gr.dk(tt, ii));
          d.dg(b, t, hv, i) = gr.dg(tt, ii);
        }
        for (std::size_t j = 0; j < dv; ++j) d.dv(b, t, hv, j) = gr.dv(tt, static_cast<Eigen::Index>(j));
        d.dbeta(b, t, hv) = gr.dbeta(tt);
      }
      for (std::size_t i = 0; i < dk; ++i)
        for (std::size_t j = 0; j < dv; ++j) {
          out.S(b, hv, i, j) = St(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j));
          if (dO) d.dS0(b, hv, i, j) = gr.dS0(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j));
        }
    }
  if (dO) {
    // the pre-ops' backward in fp32: the exact chain rule in double, each result rounded once (the sums over tokens
    // of dA_log and dbias are formed in double: a small optimism against fp32 sums)
    out.grads = kda_check_chain<double>(c, d);
    for (Tensor<double>* t : {&out.grads.dq, &out.grads.dk, &out.grads.dg, &out.grads.dbeta, &out.grads.dA_log,
                              &out.grads.dbias})
      for (auto& x : t->data) x = ar.r(x);
  }
  return out;
}

/// Result of an MLA emulation: o [B, T, H, d_c] and, with dO, the gradients.
struct MlaEmulation {
  Tensor<double> o;
  MlaCheckGrads grads;
};

/// The naive MLA attention of an `--op mla` problem at precision `prec` (file comment); dO [B, T, H, d_c] or null.
inline MlaEmulation mla(const MlaCheckOp& m, Format prec, const Tensor<double>* dO = nullptr) {
  const Arith ar = Arith::at(prec);
  const std::size_t B = m.q.dim(0), T = m.q.dim(1), H = m.q.dim(2), dc = m.q.dim(3), N = m.c.dim(1), dr = m.d_rope();
  const auto Ti = static_cast<Eigen::Index>(T), Ni = static_cast<Eigen::Index>(N), dci = static_cast<Eigen::Index>(dc),
             dri = static_cast<Eigen::Index>(dr);
  MlaEmulation out{Tensor<double>(m.q.shape),
                   {Tensor<double>(m.q.shape), Tensor<double>(m.c.shape), Tensor<double>(m.q_rope.shape),
                    Tensor<double>(m.k_rope.shape)}};
  for (std::size_t b = 0; b < B; ++b) {
    Mat<double> C(Ni, dci), KR(Ni, dri), dC = Mat<double>::Zero(Ni, dci), dKR = Mat<double>::Zero(Ni, dri);
    for (std::size_t n = 0; n < N; ++n) {
      for (std::size_t i = 0; i < dc; ++i) C(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(i)) = m.c(b, n, i);
      for (std::size_t i = 0; i < dr; ++i) KR(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(i)) = m.k_rope(b, n, i);
    }
    for (std::size_t h = 0; h < H; ++h) {
      Mat<double> Q(Ti, dci), QR(Ti, dri), dOh(Ti, dci);
      for (std::size_t t = 0; t < T; ++t) {
        for (std::size_t i = 0; i < dc; ++i) {
          Q(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(i)) = m.q(b, t, h, i);
          if (dO) dOh(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(i)) = (*dO)(b, t, h, i);
        }
        for (std::size_t i = 0; i < dr; ++i) QR(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(i)) = m.q_rope(b, t, h, i);
      }
      Mat<double> Z = ar.mm(Q, C.transpose());
      if (dr > 0) Z = ar.rm(Z + ar.mm(QR, KR.transpose()));
      Z = ar.rm(m.scale * Z);
      Mat<double> P = Mat<double>::Zero(Ti, Ni);
      for (Eigen::Index t = 0; t < Ti; ++t) {  // causal softmax in fp32
        const Eigen::Index n = Ni - Ti + t + 1;
        const double mx = Z.row(t).head(n).maxCoeff();
        double l = 0;
        for (Eigen::Index j = 0; j < n; ++j) {
          P(t, j) = ar.r(std::exp(ar.r(Z(t, j) - mx)));
          l = ar.r(l + P(t, j));
        }
        for (Eigen::Index j = 0; j < n; ++j) P(t, j) = ar.r(P(t, j) / l);
      }
      const Mat<double> O = ar.mm(P, C);
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t i = 0; i < dc; ++i) out.o(b, t, h, i) = O(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(i));
      if (!dO) continue;
      const Mat<double> dP = ar.mm(dOh, C.transpose());
      Mat<double> dZ(Ti, Ni);
      for (Eigen::Index t = 0; t < Ti; ++t) {
        const double rs = ar.sum_prod(P.row(t).transpose(), dP.row(t).transpose());
        for (Eigen::Index j = 0; j < Ni; ++j) dZ(t, j) = ar.r(m.scale * ar.r(P(t, j) * ar.r(dP(t, j) - rs)));
      }
      const Mat<double> dQ = ar.mm(dZ, C);
      dC = ar.rm(dC + ar.rm(ar.mm(P.transpose(), dOh) + ar.mm(dZ.transpose(), Q)));
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t i = 0; i < dc; ++i) out.grads.dq(b, t, h, i) = dQ(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(i));
      if (dr > 0) {
        const Mat<double> dQR = ar.mm(dZ, KR);
        dKR = ar.rm(dKR + ar.mm(dZ.transpose(), QR));
        for (std::size_t t = 0; t < T; ++t)
          for (std::size_t i = 0; i < dr; ++i)
            out.grads.dq_rope(b, t, h, i) = dQR(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(i));
      }
    }
    if (!dO) continue;
    for (std::size_t n = 0; n < N; ++n) {
      for (std::size_t i = 0; i < dc; ++i) out.grads.dc(b, n, i) = dC(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(i));
      for (std::size_t i = 0; i < dr; ++i)
        out.grads.dk_rope(b, n, i) = dKR(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(i));
    }
  }
  return out;
}

/// Result of an AttnRes emulation: h [T, d] and, with dh, the gradients.
struct AttnResEmulation {
  Tensor<double> h;
  AttnResCheckGrads grads;
};

/// The AttnRes mix of an `--op attn-res` problem at precision `prec` (file comment); dh [T, d] or null.
inline AttnResEmulation attn_res(const AttnResCheckOp& a, Format prec, const Tensor<double>* dh = nullptr) {
  const Arith ar = Arith::at(prec);
  const std::size_t N = a.v.dim(0), T = a.v.dim(1), d = a.v.dim(2);
  std::size_t ns = 0;
  const std::vector<std::size_t> of = attn_res_source_of(a, ns);
  const auto di = static_cast<Eigen::Index>(d);
  const double dd = static_cast<double>(d);
  AttnResEmulation out{Tensor<double>({T, d}), {Tensor<double>(a.v.shape), Tensor<double>({d})}};
  Vec<double> w(di), dw = Vec<double>::Zero(di);
  for (std::size_t i = 0; i < d; ++i) w(static_cast<Eigen::Index>(i)) = a.w.data[i];
  for (std::size_t t = 0; t < T; ++t) {
    std::vector<Vec<double>> src(ns, Vec<double>::Zero(di)), rn(ns);
    for (std::size_t n = 0; n < N; ++n)  // block sums in fp32
      for (std::size_t i = 0; i < d; ++i) src[of[n]](static_cast<Eigen::Index>(i)) = ar.r(src[of[n]](static_cast<Eigen::Index>(i)) + a.v(n, t, i));
    std::vector<double> z(ns), s(ns), alpha(ns);
    double mx = 0;
    for (std::size_t n = 0; n < ns; ++n) {
      s[n] = ar.r(std::sqrt(ar.r(ar.sum_prod(src[n], src[n]) / dd + a.eps)));
      rn[n] = src[n].unaryExpr([&](double x) { return ar.r(x / s[n]); });
      z[n] = ar.dot(w, rn[n]);
      if (n == 0 || z[n] > mx) mx = z[n];
    }
    double l = 0;
    for (std::size_t n = 0; n < ns; ++n) l = ar.r(l + (alpha[n] = ar.r(std::exp(ar.r(z[n] - mx)))));
    for (std::size_t n = 0; n < ns; ++n) alpha[n] = ar.r(alpha[n] / l);
    Vec<double> h(di);
    for (Eigen::Index i = 0; i < di; ++i) {
      double acc = 0;
      for (std::size_t n = 0; n < ns; ++n) acc = ar.r(acc + ar.op(alpha[n]) * ar.op(src[n](i)));
      h(i) = acc;
      out.h(t, static_cast<std::size_t>(i)) = acc;
    }
    if (!dh) continue;
    Vec<double> dht(di);
    for (std::size_t i = 0; i < d; ++i) dht(static_cast<Eigen::Index>(i)) = (*dh)(t, i);
    const double dh_h = ar.dot(dht, h);
    std::vector<Vec<double>> dsrc(ns);
    for (std::size_t n = 0; n < ns; ++n) {
      const double dz = ar.r(alpha[n] * ar.r(ar.dot(dht, src[n]) - dh_h));
      for (Eigen::Index i = 0; i < di; ++i) dw(i) = ar.r(dw(i) + ar.r(dz * rn[n](i)));
      const Vec<double> dr = (dz * w).unaryExpr([&](double x) { return ar.r(x); });
      // RMSNorm backward: dv = dr / s - v (v . dr) / (d s^3)
      const double vdr = ar.sum_prod(src[n], dr), s3 = ar.r(dd * ar.r(s[n] * ar.r(s[n] * s[n])));
      dsrc[n] = Vec<double>(di);
      for (Eigen::Index i = 0; i < di; ++i)
        dsrc[n](i) = ar.r(ar.r(alpha[n] * dht(i)) + ar.r(ar.r(dr(i) / s[n]) - ar.r(src[n](i) * ar.r(vdr / s3))));
    }
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t i = 0; i < d; ++i) out.grads.dv(n, t, i) = dsrc[of[n]](static_cast<Eigen::Index>(i));
  }
  for (std::size_t i = 0; i < d; ++i) out.grads.dw.data[i] = dw(static_cast<Eigen::Index>(i));
  return out;
}

}  // namespace kdalab::emul
