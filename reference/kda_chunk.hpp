#pragma once
/// KDA in chunkwise form: the UT transform / WY representation (Kimi Linear report §3-4; K3 report
/// Eqs. 3-4; docs/equations.md, chunked form). Exactly the recurrence of reference/kda.hpp, reorganised
/// into dense matrix products per chunk of C tokens.
///
/// Per head and chunk (rows r = 1..L, L <= C; the last chunk may be shorter), with the cumulative
/// log-decay G_r = sum_{s<=r} g_s inside the chunk (Gamma_r = e^{G_r}, per channel):
///   A     = StrictTril( Diag(beta) (Gamma ⊙ K) (K / Gamma)^T )          (L x L)
///   M     = (I + A)^{-1} Diag(beta)                                      (UT transform)
///   W     = M (Gamma ⊙ K),   U = M V,   V~ = U - W S                     (pseudo-values)
///   O     = scale [ (Gamma ⊙ Q) S + Tril( (Gamma ⊙ Q)(K / Gamma)^T ) V~ ] (diagonal kept)
///   S'    = Diag(e^{G_L}) S + ( e^{G_L - G_r} ⊙ K )^T V~                (decay AFTER write r)
///
/// Factored decays and secondary tiles. (Gamma ⊙ K)(K / Gamma)^T needs e^{-G_j}, which overflows
/// once the cumulative decay spans more than ~709 nats in float64 (~88 in float32). For C > tile
/// (tile = 16 by default) the chunk is cut into secondary tiles: a diagonal tile factors its decay
/// relative to the tile's own start (span <= tile * |g_min|), and an off-diagonal pair of tiles
/// (J < I) goes through the tile boundary, e^{G_i - G_j} = e^{G_i - base_I} e^{base_I - end_J}
/// e^{end_J - G_j}, every factor <= 1. The factored span is therefore F * max|g| with F = tile for
/// C > tile and F = C otherwise (or with tile = 0). kda_chunked refuses a span above
/// max_factored_span<S>() (700 in float64) with a kdalab::Error; the recurrence has no such limit.
///
/// The unit lower-triangular (I + A) is inverted tile by tile: each diagonal F x F tile by forward
/// substitution or by the Neumann product (I+N)^{-1} = (I-N)(I+N^2)(I+N^4)(I+N^8) (exact for F <= 16
/// since N^16 = 0), the off-diagonal blocks by block forward substitution.
///
/// Special cases as KdaVariant (reference/kda.hpp): gated_deltanet uses g[0] for every channel,
/// deltanet and linear use g = 0, gla and linear drop the erase (A = 0, beta = 1, W = 0, V~ = V).
/// Layouts as kda_recurrent: q, k [B, T, H, d_k]; v [B, T, HV, d_v]; g [B, T, HV, d_k];
/// beta [B, T, HV]; S0 / final state [B, HV, d_k, d_v]; o [B, T, HV, d_v].
#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "reference/kda.hpp"

namespace kdalab {

/// How the inverse of a unit lower-triangular diagonal tile is formed.
enum class TriInverse { forward_substitution, neumann };

inline std::string tri_inverse_name(TriInverse m) { return m == TriInverse::neumann ? "neumann" : "forward_substitution"; }

/// Options of the chunked form. C: chunk size (>= 1); tile: secondary tile size used when C > tile
/// (0 = no secondary tiles, factor over the whole chunk); inverse: method for the diagonal tiles.
struct ChunkOptions {
  std::size_t C = 64;
  std::size_t tile = 16;
  TriInverse inverse = TriInverse::forward_substitution;
};

/// Largest factored decay span (nats) that the chunked form accepts for scalar type S:
/// 700 for float64 (e^709.78 is the largest double), 80 for float32 (e^88.7; 16 tokens at g_min = -5),
/// and effectively unlimited (1e8) for cpp_bin_float_50.
template <class S> inline double max_factored_span() { return 1e8; }
template <> inline double max_factored_span<double>() { return 700.0; }
template <> inline double max_factored_span<float>() { return 80.0; }

/// Inverse of a unit lower-triangular matrix L (n x n, ones on the diagonal, zeros above; entries
/// above the diagonal are ignored). forward_substitution: X(i, j) = -sum_{m=j}^{i-1} L(i, m) X(m, j).
/// neumann: with N = StrictTril(L), (I + N)^{-1} = (I - N)(I + N^2)(I + N^4)... up to N^{2^m} with
/// 2^m >= n, exact because N^n = 0 (for n = 16: four factors; docs/equations.md, chunked form).
template <class S>
Mat<S> tri_inverse(const Mat<S>& L, TriInverse method) {
  const Eigen::Index n = L.rows();
  require(L.cols() == n, "tri_inverse: matrix 'L' must be square, got " + std::to_string(L.rows()) + " x " +
                             std::to_string(L.cols()));
  if (method == TriInverse::forward_substitution) {
    Mat<S> X = Mat<S>::Identity(n, n);
    for (Eigen::Index i = 1; i < n; ++i)
      for (Eigen::Index j = 0; j < i; ++j) {
        S acc = S(0);
        for (Eigen::Index m = j; m < i; ++m) acc += L(i, m) * X(m, j);
        X(i, j) = -acc;
      }
    return X;
  }
  Mat<S> N = Mat<S>::Zero(n, n);
  for (Eigen::Index i = 1; i < n; ++i)
    for (Eigen::Index j = 0; j < i; ++j) N(i, j) = L(i, j);
  const Mat<S> I = Mat<S>::Identity(n, n);
  Mat<S> P = I - N;
  Mat<S> Np = N;
  for (Eigen::Index p = 2; p < n; p *= 2) {
    Np = (Np * Np).eval();  // N^p
    P = (P * (I + Np)).eval();
  }
  return P;
}

/// Inverse of a unit lower-triangular L (n x n) in tiles of F (F = 0 or F >= n: one tile): diagonal
/// tiles by tri_inverse(method), off-diagonal blocks by block forward substitution
/// X_IJ = -X_II sum_{K=J}^{I-1} L_IK X_KJ.
template <class S>
Mat<S> tri_inverse_tiled(const Mat<S>& L, Eigen::Index F, TriInverse method) {
  const Eigen::Index n = L.rows();
  if (F <= 0 || F >= n) return tri_inverse<S>(L, method);
  const Eigen::Index nt = (n + F - 1) / F;
  auto beg = [&](Eigen::Index I) { return I * F; };
  auto len = [&](Eigen::Index I) { return std::min(F, n - I * F); };
  Mat<S> X = Mat<S>::Zero(n, n);
  for (Eigen::Index I = 0; I < nt; ++I)
    X.block(beg(I), beg(I), len(I), len(I)) = tri_inverse<S>(L.block(beg(I), beg(I), len(I), len(I)), method);
  for (Eigen::Index I = 1; I < nt; ++I)
    for (Eigen::Index J = I - 1; J >= 0; --J) {
      Mat<S> acc = Mat<S>::Zero(len(I), len(J));
      for (Eigen::Index Kt = J; Kt < I; ++Kt)
        acc += L.block(beg(I), beg(Kt), len(I), len(Kt)) * X.block(beg(Kt), beg(J), len(Kt), len(J));
      X.block(beg(I), beg(J), len(I), len(J)) = -(X.block(beg(I), beg(I), len(I), len(I)) * acc);
    }
  return X;
}

namespace detail {

/// Decay-weighted pairwise products inside one chunk, P(i, j) = sum_c a_ic b_jc e^{G_ic - G_jc}
/// for j <= i (j < i when strict), zero above, computed in secondary tiles of F rows so that no
/// factor exceeds e^{F max|g|} (see file comment). a, b, Gc: L x d_k (Gc inclusive cumulative).
template <class S>
Mat<S> decayed_tril(const Mat<S>& a, const Mat<S>& b, const Mat<S>& Gc, Eigen::Index F, bool strict) {
  const Eigen::Index L = a.rows(), dk = a.cols();
  if (F <= 0 || F > L) F = L;
  const Eigen::Index nt = (L + F - 1) / F;
  auto beg = [&](Eigen::Index I) { return I * F; };
  auto len = [&](Eigen::Index I) { return std::min(F, L - I * F); };
  // base_I: cumulative decay just before tile I (0 for the first); end_I: at its last row.
  auto base = [&](Eigen::Index I) -> Vec<S> {
    return I == 0 ? Vec<S>(Vec<S>::Zero(dk)) : Vec<S>(Gc.row(beg(I) - 1).transpose());
  };
  auto endv = [&](Eigen::Index I) -> Vec<S> { return Gc.row(beg(I) + len(I) - 1).transpose(); };
  Mat<S> a_in(L, dk), b_out(L, dk), b_inv(L, dk);
  for (Eigen::Index I = 0; I < nt; ++I) {
    const Vec<S> bs = base(I), es = endv(I);
    for (Eigen::Index r = beg(I); r < beg(I) + len(I); ++r)
      for (Eigen::Index c = 0; c < dk; ++c) {
        a_in(r, c) = a(r, c) * sexp<S>(S(Gc(r, c) - bs(c)));   // <= |a|: decay from the tile start to r
        b_out(r, c) = b(r, c) * sexp<S>(S(es(c) - Gc(r, c)));  // <= |b|: decay after r to the tile end
        b_inv(r, c) = b(r, c) * sexp<S>(S(bs(c) - Gc(r, c)));  // factored: up to e^{F max|g|}
      }
  }
  Mat<S> P = Mat<S>::Zero(L, L);
  for (Eigen::Index I = 0; I < nt; ++I) {
    // diagonal tile, factored relative to its own start
    Mat<S> blk = a_in.middleRows(beg(I), len(I)) * b_inv.middleRows(beg(I), len(I)).transpose();
    for (Eigen::Index i = 0; i < len(I); ++i)
      for (Eigen::Index j = 0; j <= i; ++j)
        if (!(strict && i == j)) P(beg(I) + i, beg(I) + j) = blk(i, j);
    for (Eigen::Index J = 0; J < I; ++J) {
      const Vec<S> bI = base(I), eJ = endv(J);
      Vec<S> mid(dk);  // decay from the end of tile J to the start of tile I (<= 1)
      for (Eigen::Index c = 0; c < dk; ++c) mid(c) = sexp<S>(S(bI(c) - eJ(c)));
      const Mat<S> bj = b_out.middleRows(beg(J), len(J)) * mid.asDiagonal();
      P.block(beg(I), beg(J), len(I), len(J)) = a_in.middleRows(beg(I), len(I)) * bj.transpose();
    }
  }
  return P;
}

/// Effective per-token log-decay row of a variant (see kda_step).
template <class S>
void effective_g(Mat<S>& G, KdaVariant var) {
  if (var == KdaVariant::deltanet || var == KdaVariant::linear) G.setZero();
  if (var == KdaVariant::gated_deltanet)
    for (Eigen::Index r = 0; r < G.rows(); ++r) G.row(r).setConstant(G(r, 0));
}

inline std::size_t factored_tile(const ChunkOptions& opt) {
  return (opt.tile > 0 && opt.C > opt.tile) ? opt.tile : opt.C;
}

}  // namespace detail

/// The unit lower-triangular matrix I + StrictTril(Diag(beta)(Gamma ⊙ K)(K / Gamma)^T) of one chunk
/// (Kimi Linear §3, the UT transform's left factor), from keys k (L x d_k), per-token log-decays g
/// (L x d_k, g <= 0) and beta (L), factored in secondary tiles of F (0 = one tile). Its inverse
/// entries lie in [-1, 1] when ||k_i|| <= 1 and beta_i <= 1 (docs/equations.md, chunked form).
template <class S>
Mat<S> ut_lower(const Mat<S>& k, const Mat<S>& g, const Vec<S>& beta, Eigen::Index F = 16) {
  const Eigen::Index L = k.rows();
  require(g.rows() == L && g.cols() == k.cols(), "ut_lower: tensor 'g' must be the shape of 'k'");
  require(beta.size() == L, "ut_lower: tensor 'beta' must have one entry per row of 'k'");
  Mat<S> Gc = g;
  for (Eigen::Index r = 1; r < L; ++r) Gc.row(r) += Gc.row(r - 1);
  Mat<S> A = detail::decayed_tril<S>(k, k, Gc, F, true);
  for (Eigen::Index i = 0; i < L; ++i) A.row(i) *= beta(i);
  return Mat<S>(Mat<S>::Identity(L, L) + A);
}

/// Chunked KDA on one head (see file comment). q, k, g: T x d_k; v: T x d_v; beta: T; state:
/// d_k x d_v in (S0), out (S_T). Returns o: T x d_v. No input checks beyond the factored-span
/// limit (callers validate; kda_chunked does). Errors: kdalab::Error naming 'C' and 'g' when
/// F * max|g| > max_factored_span<S>().
template <class S>
Mat<S> kda_chunked_head(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Mat<S>& g, const Vec<S>& beta,
                        Mat<S>& state, const S& scale, const ChunkOptions& opt, KdaVariant var = KdaVariant::kda) {
  require(opt.C >= 1, "kda_chunked_head: option 'C' (chunk size) = 0 is invalid; accepted: C >= 1");
  const Eigen::Index T = q.rows(), dk = q.cols(), dv = v.cols();
  const Eigen::Index C = static_cast<Eigen::Index>(opt.C);
  const Eigen::Index F = static_cast<Eigen::Index>(detail::factored_tile(opt));
  const bool erase = !(var == KdaVariant::gla || var == KdaVariant::linear);
  Mat<S> G = g;
  detail::effective_g(G, var);
  {
    S gmax = S(0);
    for (Eigen::Index i = 0; i < G.size(); ++i) gmax = std::max<S>(gmax, sabs<S>(G.data()[i]));
    const double span = static_cast<double>(std::min<Eigen::Index>(F, T)) * static_cast<double>(gmax);
    if (span > max_factored_span<S>())
      throw Error("kda_chunked: option 'C' (chunk size) = " + std::to_string(opt.C) + " (factored tile F = " +
                  std::to_string(F) + ") with tensor 'g' reaching " + num_str(-static_cast<double>(gmax)) +
                  " gives a factored decay span F * |g_min| = " + num_str(span) + " > " +
                  num_str(max_factored_span<S>()) + " nats: exp overflows in " + scalar_name<S>() +
                  "; accepted: F * |g_min| <= " + num_str(max_factored_span<S>()) +
                  " (use a smaller C or tile, or kda_recurrent, which has no such limit)");
  }
  Mat<S> o(T, dv);
  for (Eigen::Index t0 = 0; t0 < T; t0 += C) {
    const Eigen::Index L = std::min(C, T - t0);
    const Mat<S> Q = q.middleRows(t0, L), K = k.middleRows(t0, L), V = v.middleRows(t0, L);
    Mat<S> Gc = G.middleRows(t0, L);
    for (Eigen::Index r = 1; r < L; ++r) Gc.row(r) += Gc.row(r - 1);
    Mat<S> GQ(L, dk), GK(L, dk), KL(L, dk);  // Gamma ⊙ Q, Gamma ⊙ K, (gamma^C / Gamma) ⊙ K
    for (Eigen::Index r = 0; r < L; ++r)
      for (Eigen::Index c = 0; c < dk; ++c) {
        const S gam = sexp<S>(Gc(r, c));
        GQ(r, c) = Q(r, c) * gam;
        GK(r, c) = K(r, c) * gam;
        KL(r, c) = K(r, c) * sexp<S>(S(Gc(L - 1, c) - Gc(r, c)));
      }
    Mat<S> Vt;  // pseudo-values V~
    if (erase) {
      Vec<S> b = beta.segment(t0, L);
      Mat<S> A = detail::decayed_tril<S>(K, K, Gc, F, true);
      for (Eigen::Index i = 0; i < L; ++i) A.row(i) *= b(i);
      const Mat<S> Tinv = tri_inverse_tiled<S>(Mat<S>(Mat<S>::Identity(L, L) + A), F, opt.inverse);
      const Mat<S> M = Tinv * b.asDiagonal();
      const Mat<S> W = M * GK, U = M * V;
      Vt = U - W * state;
    } else {
      Vt = V;
    }
    const Mat<S> P = detail::decayed_tril<S>(Q, K, Gc, F, false);
    o.middleRows(t0, L) = scale * (GQ * state + P * Vt);
    Vec<S> dL(dk);
    for (Eigen::Index c = 0; c < dk; ++c) dL(c) = sexp<S>(Gc(L - 1, c));
    state = (dL.asDiagonal() * state + KL.transpose() * Vt).eval();
  }
  return o;
}

/// Batched multi-head chunked KDA; same layouts, variants and result as kda_recurrent (see
/// reference/kda.hpp), equal to it up to rounding for every C >= 1 and T (T need not be a multiple
/// of C; the last chunk is shorter). S0 may be null (zero state).
/// Errors: kdalab::Error from kda_validate() (shapes, NaN/Inf, g > 0); naming option 'C' when
/// opt.C = 0; naming 'C' and 'g' when the factored decay span exceeds max_factored_span<S>().
template <class S>
KdaOutput<S> kda_chunked(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                         const Tensor<S>& beta, const Tensor<S>* S0, const S& scale, const ChunkOptions& opt,
                         KdaVariant var = KdaVariant::kda) {
  require(opt.C >= 1, "option 'C' (chunk size) = 0 is invalid; accepted: C >= 1");
  const KdaShape s = kda_validate(q, k, v, g, beta, S0);
  KdaOutput<S> out{Tensor<S>({s.B, s.T, s.HV, s.d_v}), Tensor<S>({s.B, s.HV, s.d_k, s.d_v})};
  const std::size_t group = s.HV / s.H;
  for (std::size_t b = 0; b < s.B; ++b)
    for (std::size_t hv = 0; hv < s.HV; ++hv) {
      const std::size_t h = hv / group;
      Mat<S> Q(s.T, s.d_k), K(s.T, s.d_k), G(s.T, s.d_k), V(s.T, s.d_v);
      Vec<S> bt(s.T);
      for (std::size_t t = 0; t < s.T; ++t) {
        for (std::size_t i = 0; i < s.d_k; ++i) {
          Q(t, i) = q(b, t, h, i);
          K(t, i) = k(b, t, h, i);
          G(t, i) = g(b, t, hv, i);
        }
        for (std::size_t j = 0; j < s.d_v; ++j) V(t, j) = v(b, t, hv, j);
        bt(t) = beta(b, t, hv);
      }
      Mat<S> St = Mat<S>::Zero(s.d_k, s.d_v);
      if (S0)
        for (std::size_t i = 0; i < s.d_k; ++i)
          for (std::size_t j = 0; j < s.d_v; ++j) St(i, j) = (*S0)(b, hv, i, j);
      const Mat<S> O = kda_chunked_head<S>(Q, K, V, G, bt, St, scale, opt, var);
      for (std::size_t t = 0; t < s.T; ++t)
        for (std::size_t j = 0; j < s.d_v; ++j) out.o(b, t, hv, j) = O(t, j);
      for (std::size_t i = 0; i < s.d_k; ++i)
        for (std::size_t j = 0; j < s.d_v; ++j) out.S_final(b, hv, i, j) = St(i, j);
    }
  return out;
}

/// Variable-length batched chunked KDA (see kda_varlen in reference/kda.hpp for layouts and errors):
/// every sequence is chunked from its own first token, with its own state.
template <class S>
KdaOutput<S> kda_chunked_varlen(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& g,
                                const Tensor<S>& beta, const Tensor<S>* S0, const std::vector<std::size_t>& cu_seqlens,
                                const S& scale, const ChunkOptions& opt, KdaVariant var = KdaVariant::kda) {
  require(opt.C >= 1, "option 'C' (chunk size) = 0 is invalid; accepted: C >= 1");
  return kda_varlen<S>(q, k, v, g, beta, S0, cu_seqlens,
                       [&](const Tensor<S>& a, const Tensor<S>& b, const Tensor<S>& c, const Tensor<S>& d,
                           const Tensor<S>& e, const Tensor<S>* f) { return kda_chunked<S>(a, b, c, d, e, f, scale, opt, var); });
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_KDA_CHUNK(X, S) \
  X template Mat<S> tri_inverse<S>(const Mat<S>&, TriInverse); \
  X template Mat<S> tri_inverse_tiled<S>(const Mat<S>&, Eigen::Index, TriInverse); \
  X template Mat<S> detail::decayed_tril<S>(const Mat<S>&, const Mat<S>&, const Mat<S>&, Eigen::Index, bool); \
  X template void detail::effective_g<S>(Mat<S>&, KdaVariant); \
  X template Mat<S> kda_chunked_head<S>(const Mat<S>&, const Mat<S>&, const Mat<S>&, const Mat<S>&, const Vec<S>&, \
      Mat<S>&, const S&, const ChunkOptions&, KdaVariant); \
  X template KdaOutput<S> kda_chunked<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>*, const S&, const ChunkOptions&, KdaVariant);
#define KDALAB_TEMPLATES_KDA_CHUNK_DM(X, S) \
  X template Mat<S> ut_lower<S>(const Mat<S>&, const Mat<S>&, const Vec<S>&, Eigen::Index); \
  X template KdaOutput<S> kda_chunked_varlen<S>(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
      const Tensor<S>&, const Tensor<S>&, const Tensor<S>*, const std::vector<std::size_t>&, const S&, \
      const ChunkOptions&, KdaVariant);
KDALAB_TEMPLATES_KDA_CHUNK(extern, double)
KDALAB_TEMPLATES_KDA_CHUNK(extern, mp50)
KDALAB_TEMPLATES_KDA_CHUNK(extern, float)
KDALAB_TEMPLATES_KDA_CHUNK_DM(extern, double)
KDALAB_TEMPLATES_KDA_CHUNK_DM(extern, mp50)

}  // namespace kdalab
