#pragma once
/// An MLA latent memory of one head for the recall and copy experiments: what a Gated MLA layer's
/// d_c-wide latent cache can return (DeepSeek-V2 §2.1, Eqs. 9-11 and the absorbed form; K3 report
/// Eq. 7; docs/equations.md, Gated MLA). Small stand-in until reference/mla.hpp is used here.
///
/// A token's input x = [k_in; v_in] (d_k + d_v wide) is compressed to the latent c = W_DKV x
/// (d_c wide, the only thing cached); keys and values are read back through the up-projections
/// k^C = W_UK c, v^C = W_UV c. The absorbed read folds W_UK into the query, attends over the raw
/// latents and applies W_UV to the attended latent:
///     q~ = W_UK^T q,   a = sum_i softmax_i(scale * c_i^T q~) c_i,   o = W_UV a,
/// which equals softmax attention over (W_UK c_i, W_UV c_i). With W_DKV of orthonormal rows (or
/// columns when d_c >= d_k + d_v) and [W_UK; W_UV] = W_DKV^T (its pseudo-inverse), the memory is
/// exactly the softmax memory when d_c >= d_k + d_v and a projection onto a d_c-dimensional
/// subspace when d_c < d_k + d_v (the latent bottleneck an untrained codec has).
/// The experiments read through reference/mla.hpp (mla_config()/mla_weights() below build a
/// one-head, NoPE, ungated MlaConfig and MlaWeights from the codec); mla_latent_read() is the same
/// read written directly, kept as an independent cross-check (tests/unit/test_softmax.cpp).
#include <algorithm>
#include <string>

#include "reference/error.hpp"
#include "reference/mla.hpp"
#include "reference/scalar.hpp"
#include "reference/softmax.hpp"

namespace kdalab {

/// Down- and up-projections of one latent memory. W_DKV: d_c x (d_k + d_v); W_UK: d_k x d_c;
/// W_UV: d_v x d_c.
template <class S>
struct LatentCodec {
  Mat<S> W_DKV, W_UK, W_UV;
  Eigen::Index d_k = 0, d_v = 0, d_c = 0;

  /// Builds the codec from a Gaussian matrix G (d_c x (d_k + d_v)): W_DKV = G orthonormalised
  /// (Householder QR; orthonormal rows if d_c <= d_k + d_v, else orthonormal columns) and
  /// [W_UK; W_UV] = W_DKV^T. Errors: kdalab::Error if G's width is not d_k + d_v or d_c = 0.
  static LatentCodec from_gaussian(const Mat<S>& G, Eigen::Index d_k, Eigen::Index d_v) {
    require(G.rows() >= 1, "LatentCodec: 'G' has d_c = 0 rows; accepted: d_c >= 1");
    require(G.cols() == d_k + d_v, "LatentCodec: 'G' has " + std::to_string(G.cols()) +
                                       " columns; accepted: d_k + d_v = " + std::to_string(d_k + d_v));
    LatentCodec c;
    c.d_k = d_k;
    c.d_v = d_v;
    c.d_c = G.rows();
    const Eigen::Index dx = d_k + d_v;
    if (c.d_c <= dx) {  // orthonormal rows: QR of G^T (dx x d_c)
      Mat<S> Gt = G.transpose();
      Eigen::HouseholderQR<Mat<S>> qr(Gt);
      Mat<S> Q = qr.householderQ() * Mat<S>::Identity(dx, c.d_c);
      c.W_DKV = Q.transpose();
    } else {  // orthonormal columns: QR of G (d_c x dx)
      Eigen::HouseholderQR<Mat<S>> qr(G);
      c.W_DKV = qr.householderQ() * Mat<S>::Identity(c.d_c, dx);
    }
    const Mat<S> D = c.W_DKV.transpose();  // dx x d_c, the pseudo-inverse
    c.W_UK = D.topRows(d_k);
    c.W_UV = D.bottomRows(d_v);
    return c;
  }

  /// The latent of one token: c = W_DKV [k_in; v_in] (d_c). Errors: kdalab::Error on widths.
  Vec<S> encode(const Vec<S>& k_in, const Vec<S>& v_in) const {
    require(k_in.size() == d_k && v_in.size() == d_v, "LatentCodec::encode: 'k_in'/'v_in' widths " +
                                                          std::to_string(k_in.size()) + "/" + std::to_string(v_in.size()) +
                                                          " do not match d_k/d_v " + std::to_string(d_k) + "/" +
                                                          std::to_string(d_v));
    Vec<S> x(d_k + d_v);
    x << k_in, v_in;
    return Vec<S>(W_DKV * x);
  }

  /// The codec as one reference/mla.hpp layer: hidden = d_k + d_v (x = [k_in; v_in] for a write,
  /// [q; 0] for a read), n_h = 1, d_nope = d_k, d_rope = 0, d_v, no output gate, full-rank W_Q.
  MlaConfig mla_config() const {
    MlaConfig c;
    c.hidden = static_cast<std::size_t>(d_k + d_v);
    c.n_h = 1;
    c.d_c = static_cast<std::size_t>(d_c);
    c.d_cq = 0;
    c.d_nope = static_cast<std::size_t>(d_k);
    c.d_rope = 0;
    c.d_v = static_cast<std::size_t>(d_v);
    c.output_gate = false;
    return c;
  }
  /// MlaWeights for mla_config(): W_DKV, W_UK, W_UV from the codec; W_Q = s [I_{d_k} 0] with
  /// s = inv_temperature * sqrt(d_k), so that mla.hpp's 1/sqrt(d_k) score scale leaves the logits
  /// at inv_temperature * (k^C . q); W_KR empty (d_rope = 0); W_o = [0; I_{d_v}]... unused (o is read
  /// before the output projection); W_g empty.
  MlaWeights<S> mla_weights(const S& inv_temperature) const {
    MlaWeights<S> w;
    w.W_DKV = W_DKV;
    w.W_KR = Mat<S>(0, d_k + d_v);
    w.W_Q = Mat<S>::Zero(d_k, d_k + d_v);
    w.W_Q.leftCols(d_k) = Mat<S>::Identity(d_k, d_k) * S(inv_temperature * ssqrt<S>(S(static_cast<double>(d_k))));
    w.W_UK = W_UK;
    w.W_UV = W_UV;
    w.W_o = Mat<S>::Identity(d_k + d_v, d_v);
    return w;
  }
};

/// The absorbed MLA read of one head over a latent cache C (n x d_c): o = W_UV softmax-read of
/// (W_UK^T q) over C (see file comment). q: d_k. Returns o: d_v. Errors: as softmax_read, and
/// kdalab::Error if C's width is not the codec's d_c.
template <class S>
Vec<S> mla_latent_read(const Vec<S>& q, const Mat<S>& C, const LatentCodec<S>& codec, const S& scale) {
  require(C.cols() == codec.d_c, "mla_latent_read: latent cache 'C' has width " + std::to_string(C.cols()) +
                                     "; accepted: d_c = " + std::to_string(codec.d_c));
  require(q.size() == codec.d_k, "mla_latent_read: 'q' has d_k = " + std::to_string(q.size()) +
                                     "; accepted: " + std::to_string(codec.d_k));
  const Vec<S> q_abs = codec.W_UK.transpose() * q;
  const Vec<S> a = softmax_read<S>(q_abs, C, C, scale);
  return Vec<S>(codec.W_UV * a);
}

}  // namespace kdalab
