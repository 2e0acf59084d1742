#pragma once
/// Attention Residuals (Attention Residuals, arXiv 2603.15031; K3 report Eqs. 8-10;
/// docs/equations.md, Attention Residuals): softmax attention over depth, for one token at a time.
///
/// Full form: a consumer l has a pseudo-query q_l = w_l in R^d (initialised to 0); its sources are
/// v_0 = h_1 (the embedding) and v_i = f_i(h_i), the outputs of the earlier sublayers; keys are the
/// values RMSNorm-ed (no gain: a gain would fold into w_l):
///     phi(q, k) = exp(q^T RMSNorm(k)),   alpha_{i->l} = phi(w_l, v_i) / sum_j phi(w_l, v_j),
///     h_l = sum_i alpha_{i->l} v_i.                     w_l = 0 gives the uniform average.
/// Block form: sources are grouped into blocks of `block_sources` consecutive sublayer outputs;
/// b_0 = h_1, b_n = sum of the outputs in block n; a consumer inside block n attends over
/// [b_0 .. b_{n-1}] and, when block n already has outputs, the partial sum b_n^{i-1}. The
/// inter-block part (completed blocks) and the intra-block part (the partial sum) are two softmax
/// partials (max m, normaliser l, accumulator) merged by the online-softmax rule (Milakov &
/// Gimelshein 2018). One source per block is exactly the full form.
/// Granularity (which sublayers are sources and consumers, and how `attn_res_block_size` in decoder
/// layers maps to block_sources) is the caller's choice: see reference/hybrid.hpp.
/// AttnRes keeps no state across tokens: a sequence is handled row by row (rows = tokens).
#include <cstddef>
#include <string>
#include <vector>

#include "reference/error.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

/// RMSNorm without gain, k / sqrt(mean(k^2) + eps) (Zhang & Sennrich 2019, Eq. 4 with g = 1).
template <class S>
Vec<S> rms_normalize(const Vec<S>& k, const S& eps) {
  const S ms = k.squaredNorm() / S(static_cast<double>(k.size()));
  return k / ssqrt<S>(S(ms + eps));
}

/// The AttnRes logit of source v for pseudo-query w: w^T RMSNorm(v) (log phi in K3 report Eqs. 8-10;
/// docs/equations.md, Attention Residuals).
template <class S>
S attn_res_logit(const Vec<S>& w, const Vec<S>& v, const S& eps) {
  return w.dot(rms_normalize<S>(v, eps));
}

/// A softmax partial over some of the sources: m = max logit seen, l = sum e^(logit - m),
/// acc = sum e^(logit - m) v. Empty until the first add(). merge() combines two partials over
/// disjoint source sets exactly (online softmax); result() = acc / l.
template <class S>
struct SoftmaxPartial {
  S m = S(0), l = S(0);
  Vec<S> acc;
  std::size_t count = 0;

  explicit SoftmaxPartial(std::size_t d) : acc(Vec<S>::Zero(d)) {}
  /// Adds one source with logit `z` and value v (v.size() must equal the width).
  void add(const S& z, const Vec<S>& v) {
    require(static_cast<std::size_t>(v.size()) == static_cast<std::size_t>(acc.size()),
            "AttnRes source has width " + std::to_string(v.size()) + ", expected " + std::to_string(acc.size()));
    if (count == 0) {
      m = z; l = S(1); acc = v;
    } else if (z > m) {
      const S c = sexp<S>(S(m - z));
      l = l * c + S(1);
      acc = acc * c + v;
      m = z;
    } else {
      const S e = sexp<S>(S(z - m));
      l += e;
      acc += e * v;
    }
    ++count;
  }
  /// The partial over the union of two disjoint source sets (either may be empty).
  static SoftmaxPartial merge(const SoftmaxPartial& a, const SoftmaxPartial& b) {
    if (a.count == 0) return b;
    if (b.count == 0) return a;
    SoftmaxPartial r(a.acc.size());
    r.m = a.m > b.m ? a.m : b.m;
    const S ca = sexp<S>(S(a.m - r.m)), cb = sexp<S>(S(b.m - r.m));
    r.l = a.l * ca + b.l * cb;
    r.acc = a.acc * ca + b.acc * cb;
    r.count = a.count + b.count;
    return r;
  }
  /// The softmax-weighted average of the sources added. Throws kdalab::Error when empty.
  Vec<S> result() const {
    require(count > 0, "AttnRes: a softmax over zero sources has no value (a consumer needs >= 1 source)");
    return acc / l;
  }
};

/// Full AttnRes for one token by a direct two-pass softmax: h = sum_i alpha_i v_i with
/// alpha = softmax_i(w^T RMSNorm(v_i)) (K3 report Eqs. 8-10). sources: >= 1 vectors of width d = w.size().
/// Throws kdalab::Error on no sources or a width mismatch (naming the source index).
template <class S>
Vec<S> attn_res_full(const Vec<S>& w, const std::vector<Vec<S>>& sources, const S& eps) {
  require(!sources.empty(), "AttnRes: no sources (the embedding h_1 is always source 0)");
  std::vector<S> z(sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i) {
    require(sources[i].size() == w.size(), "AttnRes source " + std::to_string(i) + " has width " +
                                               std::to_string(sources[i].size()) + ", pseudo-query w has " +
                                               std::to_string(w.size()));
    z[i] = attn_res_logit<S>(w, sources[i], eps);
  }
  S m = z[0];
  for (const S& x : z) if (x > m) m = x;
  S l = S(0);
  Vec<S> h = Vec<S>::Zero(w.size());
  for (std::size_t i = 0; i < z.size(); ++i) {
    const S e = sexp<S>(S(z[i] - m));
    l += e;
    h += e * sources[i];
  }
  return h / l;
}

/// Block AttnRes for one token: the inter-block partial over the completed block sums
/// blocks = [b_0 = h_1, b_1, ..., b_{n-1}] merged with the intra-block partial over the current block's
/// partial sum (`partial`, null when the block has no outputs yet). Throws kdalab::Error when
/// blocks is empty or a width differs from w.
template <class S>
Vec<S> attn_res_block(const Vec<S>& w, const std::vector<Vec<S>>& blocks, const Vec<S>* partial, const S& eps) {
  require(!blocks.empty(), "AttnRes block: no completed blocks (b_0 = h_1 is always there)");
  SoftmaxPartial<S> inter(w.size()), intra(w.size());
  for (const auto& b : blocks) inter.add(attn_res_logit<S>(w, b, eps), b);
  if (partial) intra.add(attn_res_logit<S>(w, *partial, eps), *partial);
  return SoftmaxPartial<S>::merge(inter, intra).result();
}

/// How the residual stream is formed.
///   plain: h <- h + f(h) (standard pre-norm residual);
///   full:  every consumer mixes all earlier sources (full AttnRes);
///   block: block AttnRes with `block_sources` sources per block.
enum class ResidualMode { plain, full, block };

inline std::string residual_mode_name(ResidualMode m) {
  switch (m) {
    case ResidualMode::plain: return "plain";
    case ResidualMode::full: return "full";
    case ResidualMode::block: return "block";
  }
  return "?";
}

/// Residual/AttnRes settings. block_sources: sources per block (block mode; >= 1). eps: RMSNorm eps of the keys.
struct AttnResConfig {
  ResidualMode mode = ResidualMode::plain;
  std::size_t block_sources = 1;
  double eps = 1e-6;
};

/// The depth state of one forward pass over T tokens (rows): the sources seen so far (full), the
/// completed block sums and the current partial (block), or the running sum (plain).
/// Usage: construct with h_1 [T, d]; for each consumer call input(w_l) (the sublayer's input), run the
/// sublayer, then push(f_l) with its output [T, d]. Nothing is kept across forward passes.
template <class S>
class DepthMixer {
 public:
  /// Starts from the embedding h1 [T, d]. Throws kdalab::Error if block_sources is 0 in block mode.
  DepthMixer(const AttnResConfig& cfg, const Mat<S>& h1) : cfg_(cfg), eps_(S(cfg.eps)), sum_(h1) {
    require(cfg.mode != ResidualMode::block || cfg.block_sources >= 1,
            "AttnRes block size = 0 sources per block; accepted: >= 1");
    if (cfg.mode != ResidualMode::plain) blocks_.push_back(h1);
  }
  /// The input of a consumer with pseudo-query w [d] (ignored in plain mode): [T, d].
  Mat<S> input(const Vec<S>& w) const {
    if (cfg_.mode == ResidualMode::plain) return sum_;
    require(static_cast<Eigen::Index>(w.size()) == sum_.cols(),
            "AttnRes pseudo-query has width " + std::to_string(w.size()) + ", hidden is " + std::to_string(sum_.cols()));
    Mat<S> h(sum_.rows(), sum_.cols());
    for (Eigen::Index t = 0; t < sum_.rows(); ++t) {
      std::vector<Vec<S>> rows;
      for (const auto& b : blocks_) rows.push_back(b.row(t).transpose());
      if (cfg_.mode == ResidualMode::full) {
        h.row(t) = attn_res_full<S>(w, rows, eps_).transpose();
      } else {
        const Vec<S> p = partial_count_ ? Vec<S>(partial_.row(t).transpose()) : Vec<S>();
        h.row(t) = attn_res_block<S>(w, rows, partial_count_ ? &p : nullptr, eps_).transpose();
      }
    }
    return h;
  }
  /// Records a source's output f [T, d].
  void push(const Mat<S>& f) {
    require(f.rows() == sum_.rows() && f.cols() == sum_.cols(), "AttnRes source output has shape [" +
                std::to_string(f.rows()) + ", " + std::to_string(f.cols()) + "], expected [" +
                std::to_string(sum_.rows()) + ", " + std::to_string(sum_.cols()) + "]");
    ++pushed_;
    switch (cfg_.mode) {
      case ResidualMode::plain: sum_ += f; break;
      case ResidualMode::full: blocks_.push_back(f); break;
      case ResidualMode::block:
        if (partial_count_ == 0) partial_ = f; else partial_ += f;
        if (++partial_count_ == cfg_.block_sources) {
          blocks_.push_back(partial_);
          partial_count_ = 0;
        }
        break;
    }
  }
  /// Number of sources pushed (the embedding not counted).
  std::size_t sources() const { return pushed_; }

 private:
  AttnResConfig cfg_;
  S eps_;
  Mat<S> sum_;                 // plain: the residual stream (other modes: h_1, for the shape)
  std::vector<Mat<S>> blocks_;  // full: every source; block: b_0 .. b_{n-1}
  Mat<S> partial_;             // block: b_n^{i-1}
  std::size_t partial_count_ = 0, pushed_ = 0;
};

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_ATTN_RES(X, S) \
  X template Vec<S> rms_normalize<S>(const Vec<S>&, const S&); \
  X template Vec<S> attn_res_full<S>(const Vec<S>&, const std::vector<Vec<S>>&, const S&); \
  X template Vec<S> attn_res_block<S>(const Vec<S>&, const std::vector<Vec<S>>&, const Vec<S>*, const S&);
KDALAB_TEMPLATES_ATTN_RES(extern, double)
KDALAB_TEMPLATES_ATTN_RES(extern, mp50)

}  // namespace kdalab
