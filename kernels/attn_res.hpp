#pragma once
/// Block Attention Residuals CUDA kernel for sm_90a: softmax attention over depth for a batch of tokens.
/// A plain host API: device pointers, shapes, strides in elements, a cudaStream_t (same style as
/// kernels/kda.hpp and kernels/mla.hpp). No Eigen, no torch.
///
/// Math (Attention Residuals, arXiv 2603.15031; K3 report Eqs. 8-10; docs/equations.md section 6;
/// reference/attn_res.hpp attn_res_full / attn_res_block / SoftmaxPartial), per token t, for the S
/// sources h_0 .. h_{S-1} (S = N + 1: the embedding or completed block sums, and optionally the
/// current block's partial sum) and the consumer's pseudo-query w [d]:
///   z_i = w . RMSNorm(h_i) = (w . h_i) / sqrt(mean_j h_ij^2 + eps)        (RMSNorm without gain)
///   m = max_i z_i,  l = sum_i e^(z_i - m),  acc = sum_i e^(z_i - m) h_i,  out = acc / l.
/// The sources are the raw (un-normalised) vectors: only the keys are RMSNorm-ed.
/// Online-softmax merge: a softmax partial (m_in, l_in, acc_in) over other, disjoint sources (for
/// example the inter-block partial over the completed blocks, written by an earlier call through
/// partial_out) can be given; the kernel starts its running (m, l, acc) from it, which is exactly
/// SoftmaxPartial::merge (Milakov & Gimelshein 2018). So block AttnRes is either one call over
/// [b_0 .. b_{n-1}, b_n^{i-1}] or two calls: blocks -> partial_out, then the partial sum with
/// partial_in = that partial -> out.
///
/// Layouts (row-major, last dimension contiguous, strides in elements):
///   src [S, T, d] bf16: source i of token t at src + i * s_src + t * s_tok (strides: non-negative
///       multiples of 8; s_src may be larger than T * s_tok, e.g. blocks kept inside a bigger buffer);
///   w [d] fp32 pseudo-query;  out [T, d] bf16 (stride d) and/or out_f32 [T, d] fp32 (stride d);
///   partial in/out: m [T], l [T] fp32 and acc [T, d] fp32 (stride d), acc unnormalised.
/// Precision: bf16 sources read exactly, fp32 sums (squares, dot products, exponentials, accumulator).
/// A bf16 `out` adds its own rounding (~1.6e-3 relative RMS, the bf16 output floor); out_f32 does not.
///
/// Algorithm: memory-bound, a few tokens per CTA in turn (tokens_per_cta). d / 8 16-byte vectors per source are spread over the
/// CTA's threads (VPT vectors per thread: the rule's ceil(d / 2048) or vectors_per_thread, <= 8; threads =
/// ceil(d / (8 VPT)) rounded up to a warp, <= 256; d = 7168: 224 threads x 4 vectors). Each source row is read once from HBM by a bulk
/// copy into a ring of row buffers in shared memory (ring_depth, the rule's 3: two rows in flight while one is
/// reduced), its two sums (h.h, w.h) are reduced over the CTA, and the running (m, l, acc) is updated from the
/// registers: one pass over the sources, S d 2 bytes read per token.
///
/// Errors: kdalab::Error naming the argument, its value and what is accepted (T < 1, S < 1, d not a
/// positive multiple of 8 or > 16384, null or misaligned pointers, bad strides, eps not finite or < 0,
/// no output requested, a partial_in with only some of its three pointers, tokens_per_cta < 0, vectors_per_thread not
/// 0 or ceil(d / 2048) .. 8, ring_depth not 0 or 2 .. 8, or a ring_depth whose 4 d + 2 d ring_depth bytes of shared
/// memory exceed 231808: 227 KB less the kernel's static shared memory), before anything is launched.
/// CUDA errors throw kdalab::Error with the CUDA message.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/kda.hpp"
#include "reference/error.hpp"

namespace kdalab::kernels {

/// A softmax partial over some sources, per token: running max m [T], normaliser l [T], unnormalised
/// accumulator acc [T, d] (all fp32, contiguous). All three null = no partial.
struct AttnResPartial {
  float* m = nullptr;    ///< [T], 4-byte aligned
  float* l = nullptr;    ///< [T], 4-byte aligned
  float* acc = nullptr;  ///< [T, d], 16-byte aligned
};

/// Arguments of one Block AttnRes call (one consumer, T tokens).
struct AttnResArgs {
  int T = 0;                    ///< tokens, >= 1
  int S = 0;                    ///< sources in src (N + 1), >= 1
  int d = 0;                    ///< hidden width, a multiple of 8, 8 <= d <= 16384 (K3: 7168)
  const bf16_t* src = nullptr;  ///< [S, T, d] bf16, 16-byte aligned
  std::int64_t s_src = 0;       ///< source stride in elements (0 = T * s_tok); multiple of 8
  std::int64_t s_tok = 0;       ///< token stride in elements (0 = d); multiple of 8, >= d
  const float* w = nullptr;     ///< pseudo-query [d] fp32, 16-byte aligned
  float eps = 1e-6f;            ///< RMSNorm eps (reference AttnResConfig::eps), finite, >= 0
  AttnResPartial partial_in;    ///< optional partial over other sources to merge with (read only)
  AttnResPartial partial_out;   ///< optional: the merged partial (m, l, acc) is written here
  bf16_t* out = nullptr;        ///< optional out = acc / l [T, d] bf16, 16-byte aligned
  float* out_f32 = nullptr;     ///< optional out = acc / l [T, d] fp32, 16-byte aligned
  /// tokens each CTA takes in turn (its ring of source rows runs on across them, w is loaded once): 0 = the rule
  /// (attn_res_tokens_per_cta), n >= 1: n. Any count gives the same output bit for bit.
  int tokens_per_cta = 0;
  /// row buffers in the ring of source rows a CTA keeps in shared memory (ring_depth - 1 rows in flight while one is
  /// reduced; 4 d + 2 d ring_depth bytes, <= 231808): 0 = the rule (3), n in 2 .. 8: n. The rule's depth runs kernels
  /// with the depth compiled in; any other depth runs kernels that read it at run time (a division per source, for
  /// timing deeper rings). Any depth gives the same output bit for bit.
  int ring_depth = 0;
  /// 16-byte vectors (8 bf16) of a source row each thread owns: 0 = the rule (ceil(d / 2048): as many threads as d / 8
  /// allows up to 256), n in ceil(d / 2048) .. 8: n, with ceil(d / (8 n)) threads rounded up to a warp. Fewer threads
  /// a token means fewer per-source reductions and softmax updates for the same bytes. The count sets which elements a
  /// thread sums, so outputs of different counts differ in the last bits of the fp32 sums; any count is within the
  /// same budget against float64, and for one count every tokens_per_cta and ring_depth gives the same bits.
  int vectors_per_thread = 0;
};

/// The rule's tokens per CTA for d > 4096: T / (2 resident) clamped to 1 .. 4, so that the grid is about two waves of
/// the `resident` CTAs the GPU holds at once at this d; d <= 4096 takes one token a CTA (docs/kernels/attn_res.md,
/// "Version 3": measured). No CUDA calls.
int attn_res_tokens_per_cta(int T, int resident);

/// Runs Block AttnRes for a batch of tokens (see the file comment). At least one of out, out_f32,
/// partial_out must be given. partial_out may alias partial_in (each token's entries are read
/// before they are written, by the same CTA). Asynchronous on `stream`; no allocation, no host
/// synchronisation: capturable in a CUDA graph. Errors: kdalab::Error before anything is launched.
void attn_res(const AttnResArgs& a, cudaStream_t stream);

}  // namespace kdalab::kernels
