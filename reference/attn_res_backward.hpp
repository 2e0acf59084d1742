#pragma once
/// Exact reverse-mode derivative (vector-Jacobian product) of Attention Residuals for one token
/// (Attention Residuals, arXiv 2603.15031; K3 report Eqs. 8-10; reference/attn_res.hpp):
///     r_i = RMSNorm(v_i) = v_i / s_i,  s_i = sqrt(||v_i||^2 / d + eps)
///     z_i = w^T r_i,  alpha = softmax(z),  h = sum_i alpha_i v_i
/// Given dh = dL/dh:
///     dz_i  = alpha_i (dh^T v_i - dh^T h)                    (softmax VJP)
///     dw    = sum_i dz_i r_i
///     dv_i  = alpha_i dh + dr_i / s_i - v_i (v_i^T dr_i) / (d s_i^3),   dr_i = dz_i w
/// The block form is the full form over the sources [b_0 .. b_{n-1}, partial sum] (its online-softmax
/// merge is exact), so its VJP is the full form's; a source inside a block sum b_n = sum f receives
/// d f = d b_n. Widths: w, v_i, h, dh: d.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "reference/attn_res.hpp"
#include "reference/error.hpp"
#include "reference/scalar.hpp"

namespace kdalab {

/// VJP of rms_normalize(v, eps): returns dv for upstream dr.
template <class S>
Vec<S> rms_normalize_backward(const Vec<S>& v, const Vec<S>& dr, const S& eps) {
  const S d = S(static_cast<double>(v.size()));
  const S s2 = v.squaredNorm() / d + eps;
  const S s = ssqrt<S>(s2);
  return Vec<S>(dr / s - v * (v.dot(dr) / (d * s2 * s)));
}

/// Gradients of one AttnRes mix: dw [d] and one d-vector per source.
template <class S>
struct AttnResGrad {
  Vec<S> dw;
  std::vector<Vec<S>> dsources;
};

/// VJP of attn_res_full(w, sources, eps) for upstream dh [d]. Errors: kdalab::Error as attn_res_full,
/// or naming 'dh' on a width mismatch.
template <class S>
AttnResGrad<S> attn_res_full_backward(const Vec<S>& w, const std::vector<Vec<S>>& sources, const S& eps,
                                      const Vec<S>& dh) {
  const Vec<S> h = attn_res_full<S>(w, sources, eps);  // checks the sources
  require(dh.size() == w.size(), "AttnRes backward: tensor 'dh' has width " + std::to_string(dh.size()) +
                                     ", expected d = " + std::to_string(w.size()));
  const std::size_t n = sources.size();
  std::vector<S> z(n);
  S m = S(0);
  for (std::size_t i = 0; i < n; ++i) {
    z[i] = attn_res_logit<S>(w, sources[i], eps);
    if (i == 0 || z[i] > m) m = z[i];
  }
  S l = S(0);
  for (std::size_t i = 0; i < n; ++i) l += sexp<S>(S(z[i] - m));
  const S dh_h = dh.dot(h);
  AttnResGrad<S> r{Vec<S>::Zero(w.size()), std::vector<Vec<S>>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    const S alpha = sexp<S>(S(z[i] - m)) / l;
    const S dz = alpha * (dh.dot(sources[i]) - dh_h);
    r.dw += dz * rms_normalize<S>(sources[i], eps);
    r.dsources[i] = alpha * dh + rms_normalize_backward<S>(sources[i], Vec<S>(dz * w), eps);
  }
  return r;
}

/// Gradients of a block AttnRes mix: dw, one vector per completed block sum, and d(partial sum)
/// (empty when there is no partial).
template <class S>
struct AttnResBlockGrad {
  Vec<S> dw;
  std::vector<Vec<S>> dblocks;
  Vec<S> dpartial;
};

/// VJP of attn_res_block(w, blocks, partial, eps) for upstream dh [d]. Errors: as attn_res_block.
template <class S>
AttnResBlockGrad<S> attn_res_block_backward(const Vec<S>& w, const std::vector<Vec<S>>& blocks, const Vec<S>* partial,
                                            const S& eps, const Vec<S>& dh) {
  require(!blocks.empty(), "AttnRes block: no completed blocks (b_0 = h_1 is always there)");
  std::vector<Vec<S>> sources = blocks;
  if (partial) sources.push_back(*partial);
  AttnResGrad<S> g = attn_res_full_backward<S>(w, sources, eps, dh);
  AttnResBlockGrad<S> r{std::move(g.dw), {}, Vec<S>()};
  if (partial) {
    r.dpartial = std::move(g.dsources.back());
    g.dsources.pop_back();
  }
  r.dblocks = std::move(g.dsources);
  return r;
}

// Explicit instantiations: compiled once, in reference/instantiate/ (the library kdalab_reference), for the
// scalars below; every other file links them instead of compiling them again. X is `extern` or empty.
#define KDALAB_TEMPLATES_ATTN_RES_BACKWARD(X, S) \
  X template Vec<S> rms_normalize_backward<S>(const Vec<S>&, const Vec<S>&, const S&); \
  X template AttnResGrad<S> attn_res_full_backward<S>(const Vec<S>&, const std::vector<Vec<S>>&, const S&, \
      const Vec<S>&); \
  X template AttnResBlockGrad<S> attn_res_block_backward<S>(const Vec<S>&, const std::vector<Vec<S>>&, const Vec<S>*, \
      const S&, const Vec<S>&);
KDALAB_TEMPLATES_ATTN_RES_BACKWARD(extern, double)
KDALAB_TEMPLATES_ATTN_RES_BACKWARD(extern, mp50)

}  // namespace kdalab
