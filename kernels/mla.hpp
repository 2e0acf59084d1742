#pragma once
/// Gated MLA CUDA kernels for sm_90a: the absorbed decode step over a bf16 latent cache.
/// A plain host API: device pointers, shapes, strides in elements, a cudaStream_t (same style as
/// kernels/kda.hpp). No Eigen, no torch.
///
/// Math (DeepSeek-V2 §2.1 Eqs. 9-19 absorbed; K3 report Eq. 7; EQUATIONS.md section 5;
/// reference/mla.hpp mla_attend_absorbed / mla_attend_streaming), per sequence b and head i, one
/// query token over the len_b cached latents c_0 .. c_{len_b - 1} (each d_c = 512 wide):
///   s_tau = scale * q~_i . c_tau,   p = softmax_tau(s),   a_i = sum_tau p_tau c_tau   (in R^{d_c})
/// where q~_i = W_UK,i^T q^C_i is the absorbed query (computed by the caller). The kernel returns the
/// attended latent a [B, H, d_c] in fp32. The caller then applies W_UV per head (o_i = W_UV,i a_i), the
/// output gate (Sigmoid(W_g x) ⊙ o) and W_o: W_UV cannot fold into W_o because the gate sits between.
/// NoPE only: the decoupled-RoPE part (d_rope = 64, q^R . k^R added to the score) is refused for now.
///
/// Precision: q~ is carried as two bf16 parts, q~ = q_hi + q_lo (q_hi = bf16(q~), q_lo = bf16(q~ - q_hi),
/// ~2^-16 relative), because a bf16-rounded absorbed query alone costs 2.3-3.5e-3 relative RMS
/// (ANCHORS.md). The scores are two bf16 mma.sync products (q_hi C^T + q_lo C^T, fp32 accumulation);
/// the probabilities P (fp32 online softmax) are likewise split into bf16 hi + lo for P C. Output fp32.
/// Measured (v2, N = 4096): 3.8e-6 relative RMS vs float64; with q_lo = 0: 2.3e-3; with P_hi only
/// (MlaDecodeArgs::p_hi_only): 4.8e-4.
///
/// Algorithm: split-K over the sequence (flash-decoding). Each CTA takes one slice of split_len tokens
/// of one sequence and all H heads (the latent is read once for all heads), streams it through shared
/// memory (cp.async), runs an online softmax, and writes its partial (running max m, sum l, unnormalised
/// accumulator) to the workspace; a combine kernel merges the partials per (b, head):
///   M = max_s m_s,  L = sum_s l_s e^(m_s - M),  a = sum_s e^(m_s - M) acc_s / L
/// (variant 6 with one slice per sequence: the split kernel writes acc / l itself and no combine runs).
/// Four split kernels, five variants (MlaDecodeArgs::variant), same results to ~1e-5, same workspace size formula:
///   variant 2 (the default until session 5): warpgroup MMA (wgmma, sm_90a) on 64-token tiles; the 32 q_hi and 32 q_lo rows
///     form the M = 64 of one wgmma, so scores = 32 wgmma m64n32k16 per 32 tokens, P C = wgmma
///     m64n256k16 per 16 tokens and warpgroup; slices are whole 64-token tiles;
///   variant 1: mma.sync m16n8k16 on 32-token tiles, warp w owns latent columns [64 w, 64 w + 64) for
///     both the partial scores (summed over the 8 warps through shared memory) and P C;
///   variant 4: variant 2's kernel (64-token tiles, same math, same results) with an early refill: each
///     warpgroup reloads its column half of a 64-token buffer with tile it + 2 as soon as its own P C of
///     tile it is done, so up to two tiles (128 KB) are in flight while the next one is awaited (v2 issues
///     tile it + 1 only after tile it has landed); its own plan (least modelled time, waves x (split_len
///     + 128), 64-token tiles: N = 65536 -> 128 x 512, N = 1M -> 132 x 8000) and combine (4 CTAs per head,
///     launched with programmatic dependent launch). Measured (session 4, bench/NOTES.md): faster than v2
///     at B = 1 (N = 64K 46.9 vs 52.0 us, N = 1M 385.6 vs 400.1 us), slower for batches (B = 64 x 32K 763
///     vs 748 us, B = 256 x 4K 439 vs 399 us). Variant 3 (32-token tiles, 4-slot ring, session 3) was
///     removed: variant 4 was faster on every measured shape.
///   variant 5 (the default in session 5: its first H200 run passed every decode test and was faster than
///     v2 and v4 on every benchmark shape, e.g. N = 1M 324 us (305 us per step in a CUDA graph) vs v2's 401 us,
///     B = 64 x 32K 648 vs 777 us; bench/NOTES.md): the "seesaw" kernel, same math and
///     precision plan. q~ rows interleaved (row 2h = q_hi[h], 2h + 1 = q_lo[h]), so the hi + lo score of a head is
///     one lane shuffle and the softmax stays in registers; 64-token blocks in pairs, warpgroup 0 scores block A
///     and warpgroup 1 block B (wgmma m64n64k16, K = 512) at the same time; the running max goes from warpgroup 0
///     to 1 through shared memory; each warpgroup accumulates its 256-column half of the output over both blocks,
///     its own P straight from registers (register-A wgmma), the other's P from shared memory, so one
///     warpgroup's softmax overlaps the other's P C (schedule idea: FlashMLA's published "seesaw"; our code).
///     v4's plan and combine. Its result differs from v2's by ~1e-5 relative (P rounded at other running maxima).
///   variant 6 (the default since session 6: same results as v5 to ~2e-7, faster on every benchmark shape, e.g.
///     N = 64K 34.9 vs 36.6 us per step in a CUDA graph, B = 256 x 4K 351 vs 391 us; bench/NOTES.md): variant 5's
///     split kernel with a one-round combine: per (head, sequence, column quarter) ceil(slices / 8) warps, 1 to 16
///     (session 15; one per slice before: B = 8 x 8K 46.5 -> 35.6 us per step), each merging its slices with its own
///     running maximum, so the (m, l) pairs and the partials are loaded in one round (v4's combine reduces (m, l)
///     over all slices first, then loads the partials in rounds of 32 slices). Same result as variant 5 up to the fp32 order of the combine's sums.
///     When the plan gives one slice per sequence (num_splits = 1: large batches of short contexts, e.g. 256 x 4K,
///     128 x 8K) the split kernel normalises in its epilogue and writes the output itself, and no combine is launched
///     (session 16, FlashMLA's direct write as a fact, our code; the same float operations as the combine's
///     single-slice merge, so the same bits; 256 x 4K 339-353 -> 331-335 us per graph step, bench/NOTES.md).
/// Measured on one H200 (bench/NOTES.md, H = 32): v2 N = 1M in 399 us (2.69 TB/s, v1 565 us),
/// B = 64 x N = 32768 in 737 us (2.91 TB/s, v1 1036 us).
///
/// Latent cache layout (shared with the prefill): c [B, N_max, row] bf16, row-major; token tau of
/// sequence b is c + b * sc_b + tau * sc_t, its first d_c = 512 elements are c_tau. sc_t = 512 is the
/// plain latent cache; sc_t = 576 lets one buffer hold [c_tau ; k^R_tau] per row (d_rope = 64), the
/// per-token cache of reference/mla.hpp MlaCache. N_max = capacity (tokens per sequence).
/// Query layout: q_hi, q_lo [B, H, d_c] bf16 (batch stride sq_b, head stride d_c). Output a [B, H, d_c]
/// fp32 (contiguous).
///
/// Errors: every check throws kdalab::Error naming the argument, its value and what is accepted
/// (d_c != 512, d_rope != 0, H not in {16, 32}, max_len = 0 or > capacity, null or misaligned pointers,
/// bad strides, scale not finite and > 0, workspace too small, variant not 1, 2, 4, 5, 6 or 7, p_hi_only with
/// variant 1), before anything is launched. A per-sequence length lens[b] outside [1, max_len] cannot
/// be checked on the host (it lives on the device): that sequence's output rows are set to NaN. CUDA errors throw kdalab::Error with the CUDA message.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/kda.hpp"
#include "reference/error.hpp"

namespace kdalab::kernels {

/// Arguments of the absorbed MLA decode step (one query token per sequence).
struct MlaDecodeArgs {
  int B = 0;                     ///< sequences, 1 <= B <= 65535
  int H = 32;                    ///< query heads sharing the latent; supported: 16, 32
  int d_c = 512;                 ///< latent width (kv_lora_rank); supported: 512
  int d_rope = 0;                ///< decoupled RoPE width; supported: 0 (NoPE) for now
  int capacity = 0;              ///< N_max: tokens the cache holds per sequence (>= max_len)
  int max_len = 0;               ///< host-known bound on every lens[b] (sizes the split); 1 <= max_len <= capacity
  const int* lens = nullptr;     ///< optional device int32 [B]: tokens of each sequence; null = all max_len
  const bf16_t* c = nullptr;     ///< latent cache [B, N_max, sc_t], 16-byte aligned
  std::int64_t sc_b = 0;         ///< batch stride of c in elements (0 = N_max * sc_t); multiple of 8
  std::int64_t sc_t = 0;         ///< token (row) stride of c in elements (0 = d_c); multiple of 8, >= d_c
  const bf16_t* q_hi = nullptr;  ///< [B, H, d_c] bf16(q~), 4-byte aligned
  const bf16_t* q_lo = nullptr;  ///< [B, H, d_c] bf16(q~ - q_hi), 4-byte aligned
  std::int64_t sq_b = 0;         ///< batch stride of q_hi / q_lo in elements (0 = H * d_c); even
  float scale = 0.0f;            ///< softmax scale, explicit: 1/sqrt(d_nope + d_rope) of the layer
  float* out = nullptr;          ///< attended latent a [B, H, d_c] fp32, 16-byte aligned
  int num_splits = 0;            ///< slices per sequence; 0 = automatic (about one CTA per SM in total)
  void* workspace = nullptr;     ///< device scratch of mla_decode_workspace_bytes() bytes, 16-byte aligned
  std::size_t workspace_bytes = 0;
  int variant = 6;               ///< split kernel: 6 = seesaw + one-round combine (v6, the default), 5 = seesaw with
                                 ///< v4's combine (v5), 1 = mma.sync (v1), 2 = wgmma (v2),
                                 ///< 4 = v2 with early per-warpgroup refill, its own plan and PDL combine,
                                 ///< (v5 uses v4's plan and combine), 6 = v5's split kernel with the one-round
                                 ///< combine (none when each sequence is one slice); 7 = v5's seesaw on 32-token blocks in a 4-slot ring filled by TMA
                                 ///< (opt-in, session 12; v6's plan and combine); 3 was removed; plan and workspace
                                 ///< follow it
  bool p_hi_only = false;        ///< ablation (variants 2, 4, 5, 6, 7): P C with P_hi = bf16(P) alone (P_lo rows zero)
};

/// Splits per sequence and tokens per split that mla_decode will use for these arguments
/// (num_splits = 0: chosen from the SM count of the current device and max_len; split_len is a multiple
/// of the variant's tile: 32 tokens for variant 1, 64 for variants 2, 4, 5, 6 and 7; variants 4 to 7 pick the count of
/// least modelled time, waves x (split_len + 128), among slices of >= 64 tokens (one tile; >= 256 before session 13:
/// N = 8192 now runs on 128 slices of 64 instead of 32 of 256, 16.2 -> 12.3 us per graph step on an H200), v1/v2 the
/// fewest slices of >= 256 tokens filling >= 95% of the last wave). Checks the shapes and the variant.
struct MlaDecodePlan {
  int num_splits = 0, split_len = 0;
};
MlaDecodePlan mla_decode_plan(const MlaDecodeArgs& a);

/// Bytes of device scratch mla_decode needs for these shapes and variant (B * num_splits * H * (d_c + 2) * 4,
/// num_splits from mla_decode_plan).
std::size_t mla_decode_workspace_bytes(const MlaDecodeArgs& a);

/// The decode step: out = softmax(scale q~ C^T) C per (sequence, head). Asynchronous on `stream`;
/// no allocation, no host synchronisation: capturable in a CUDA graph. Errors: kdalab::Error (see
/// file comment), before anything is launched.
void mla_decode(const MlaDecodeArgs& a, cudaStream_t stream);

}  // namespace kdalab::kernels
