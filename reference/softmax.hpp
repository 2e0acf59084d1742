#pragma once
/// Plain causal softmax attention of one head: the "softmax memory" of the recall, copy and
/// decode-cost experiments (Vaswani et al. 2017, Eq. 1; docs/equations.md, decode cost and associative-memory facts).
///
/// A softmax head caches every key and value it has seen; reading with a query q is
///     o = sum_i softmax_i(scale * k_i^T q) v_i        over the cached tokens i,
/// and the causal (prefill) form reads, at token t, over tokens 0..t. A decode step therefore
/// reads the 2 n d numbers of the cache (n = tokens cached), the cost the KDA state (d_k x d_v)
/// replaces. The softmax is computed with the running maximum subtracted (no overflow for any
/// finite logits). scale is always explicit (1/sqrt(d_k) in a trained model; recall experiments
/// use a larger inverse temperature so that untrained unit keys give sharp lookups).
///
/// Shapes (one head, row-major Mat): q: T x d_k (or a d_k vector for a single read), K: n x d_k,
/// V: n x d_v. Output: T x d_v (or d_v). Errors: kdalab::Error on a shape mismatch or an empty
/// cache, naming the tensor and the shapes accepted. No I/O; works for float, double and mp50.
#include <string>

#include "reference/error.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

/// One decode read: o = sum_i softmax_i(scale * K_i . q) V_i over the n cached rows of K and V.
/// q: d_k; K: n x d_k; V: n x d_v (n >= 1). Returns o (d_v). Cost: 2 n d reads (docs/equations.md, decode cost).
/// Errors: kdalab::Error if n = 0 or the widths of q, K, V disagree.
template <class S>
Vec<S> softmax_read(const Vec<S>& q, const Mat<S>& K, const Mat<S>& V, const S& scale) {
  require(K.rows() >= 1, "softmax_read: the cache 'K' is empty (n = 0); accepted: n >= 1 cached tokens");
  require(K.cols() == q.size(), "softmax_read: 'K' has width " + std::to_string(K.cols()) + " but 'q' has d_k = " +
                                    std::to_string(q.size()) + "; they must agree");
  require(V.rows() == K.rows(), "softmax_read: 'V' has " + std::to_string(V.rows()) + " rows but 'K' has n = " +
                                    std::to_string(K.rows()) + "; one value per cached key is accepted");
  Vec<S> logits = (K * q) * scale;
  const S m = logits.maxCoeff();
  Vec<S> w(logits.size());
  S z(0);
  for (Eigen::Index i = 0; i < logits.size(); ++i) {
    w(i) = sexp<S>(S(logits(i) - m));
    z += w(i);
  }
  return Vec<S>((V.transpose() * w) / z);
}

/// The causal prefill of one head: row t of the result is softmax_read(q_t, K[0..t], V[0..t]).
/// q, k: T x d_k; v: T x d_v. Returns o: T x d_v. Errors: kdalab::Error on mismatched shapes or T = 0.
template <class S>
Mat<S> softmax_causal_head(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const S& scale) {
  require(q.rows() >= 1, "softmax_causal_head: 'q' has T = 0 tokens; accepted: T >= 1");
  require(k.rows() == q.rows() && k.cols() == q.cols(),
          "softmax_causal_head: 'k' must have the shape of 'q' (" + std::to_string(q.rows()) + " x " +
              std::to_string(q.cols()) + "), got " + std::to_string(k.rows()) + " x " + std::to_string(k.cols()));
  require(v.rows() == q.rows(), "softmax_causal_head: 'v' has " + std::to_string(v.rows()) + " rows, 'q' has T = " +
                                    std::to_string(q.rows()) + "; they must agree");
  Mat<S> o(q.rows(), v.cols());
  for (Eigen::Index t = 0; t < q.rows(); ++t) {
    const Mat<S> Kt = k.topRows(t + 1), Vt = v.topRows(t + 1);
    o.row(t) = softmax_read<S>(q.row(t).transpose(), Kt, Vt, scale).transpose();
  }
  return o;
}

/// A growing softmax KV cache for token-by-token decode: append(k, v) then read(q). Holds n x d_k
/// keys and n x d_v values; memory and read cost grow linearly with n (the "decode wall";
/// docs/equations.md, decode cost).
template <class S>
class SoftmaxCache {
 public:
  /// d_k, d_v >= 1; `reserve` rows are allocated up front (the cache still grows past it).
  SoftmaxCache(Eigen::Index d_k, Eigen::Index d_v, Eigen::Index reserve = 0) : K_(reserve, d_k), V_(reserve, d_v) {
    require(d_k >= 1 && d_v >= 1, "SoftmaxCache: d_k and d_v must be >= 1");
  }
  /// Appends one token's key (d_k) and value (d_v). Errors: kdalab::Error on a width mismatch.
  void append(const Vec<S>& k, const Vec<S>& v) {
    require(k.size() == K_.cols() && v.size() == V_.cols(), "SoftmaxCache::append: 'k'/'v' widths " +
                                                                std::to_string(k.size()) + "/" + std::to_string(v.size()) +
                                                                " do not match d_k/d_v " + std::to_string(K_.cols()) +
                                                                "/" + std::to_string(V_.cols()));
    if (n_ == K_.rows()) {
      const Eigen::Index cap = n_ == 0 ? 16 : 2 * n_;
      K_.conservativeResize(cap, Eigen::NoChange);
      V_.conservativeResize(cap, Eigen::NoChange);
    }
    K_.row(n_) = k.transpose();
    V_.row(n_) = v.transpose();
    ++n_;
  }
  /// Reads with query q over all n cached tokens (softmax_read). Errors as softmax_read.
  Vec<S> read(const Vec<S>& q, const S& scale) const {
    require(n_ >= 1, "SoftmaxCache::read: the cache is empty (n = 0); append a token first");
    require(q.size() == K_.cols(), "SoftmaxCache::read: 'q' has d_k = " + std::to_string(q.size()) +
                                       ", the cache has d_k = " + std::to_string(K_.cols()));
    Vec<S> logits = (K_.topRows(n_) * q) * scale;
    const S m = logits.maxCoeff();
    for (Eigen::Index i = 0; i < n_; ++i) logits(i) = sexp<S>(S(logits(i) - m));
    const S z = logits.sum();
    return Vec<S>((V_.topRows(n_).transpose() * logits) / z);
  }
  /// Number of cached tokens n.
  Eigen::Index size() const { return n_; }
  /// Numbers held: n (d_k + d_v).
  Eigen::Index numbers() const { return n_ * (K_.cols() + V_.cols()); }

 private:
  Mat<S> K_, V_;
  Eigen::Index n_ = 0;
};

}  // namespace kdalab
