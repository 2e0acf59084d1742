#pragma once
/// Gated MLA causal prefill for sm_90a: appends the latents of T new tokens to the latent cache and
/// runs causal absorbed attention for them over (cached prefix of N0 tokens) + (the T new tokens).
/// A plain host API: device pointers, shapes, strides in elements, a cudaStream_t (same style as
/// kernels/kda.hpp and kernels/mla.hpp). No Eigen, no torch.
///
/// Math (DeepSeek-V2 §2.1 Eqs. 9-19 absorbed; K3 report Eq. 7; EQUATIONS.md section 5;
/// reference/mla.hpp mla_prefill with MlaEval::absorbed), per sequence b, new token t (absolute position
/// N0 + t) and head i, over the latents c_0 .. c_{N0 + t} of the cache (each d_c = 512 wide):
///   s_tau = scale * q~_{t,i} . c_tau  (tau <= N0 + t),  p = softmax_tau(s),  a_{t,i} = sum_tau p_tau c_tau
/// where q~_{t,i} = W_UK,i^T q^C_{t,i} (d_c wide) is the absorbed query. The kernel returns the attended
/// latent a [B, T, H, d_c] in fp32, BEFORE W_UV: the caller applies W_UV per head (o_i = W_UV,i a_i),
/// then the output gate (Sigmoid(W_g x) ⊙ o) and W_o. This is the decode kernel's output (kernels/mla.hpp),
/// so a prefill and a token-by-token decode return the same quantity.
/// Inputs: the latents c [B, T, d_c] of the new tokens are computed by the caller (c_t = W_DKV x_t) and
/// passed in (or already written to the cache rows N0 .. N0 + T - 1: c_new = null). The absorbed query is
/// passed in as two bf16 parts q_hi = bf16(q~), q_lo = bf16(q~ - q_hi) (as in mla_decode);
/// mla_absorb_query() computes them from q^C [.., H, d_nope] and W_UK in fp32.
/// NoPE only: d_rope = 0 (the decoupled-RoPE score part is refused, as in mla_decode).
///
/// Naive or absorbed, the rule (and why v1 runs absorbed for every T):
///   per (query, key, head), absorbed costs 8 d_c = 4096 FLOPs on the tensor cores (scores and P C over
///   the d_c-wide latent, each with a hi and a lo row); naive costs 2 (d_nope + d_v) = 512 FLOPs plus, once
///   per key and head, the reconstruction k = W_UK,i c, v = W_UV,i c: 2 d_c (d_nope + d_v) = 262,144 FLOPs,
///   and it writes/reads H (d_nope + d_v) bf16 per key (16 KB per token at H = 32, vs the 1 KB latent).
///   A key attended by n queries: absorbed 4096 n vs naive 512 n + 262,144, so
///     absorbed when T <= 64 (n <= T: reconstruction never pays back), naive when T > 64.
///   v1 implements the absorbed path only (correct for every T; the rule's naive branch is not built yet):
///   it shares its precision plan and its cache reads with the decode kernel and reaches ~1e-5. The naive
///   path rounds k and v per head to bf16 (~1.1e-3 relative each) and P to bf16 (~1.1e-3): its accuracy
///   against the 2e-3 goal must be measured (or k, v carried as hi + lo) before it is used.
///
/// Precision: q~ as bf16 hi + lo (a bf16-rounded q~ alone costs 2.3-3.5e-3 relative RMS, ANCHORS.md);
/// scores = q_hi C^T + q_lo C^T by mma.sync bf16 with fp32 accumulation; fp32 online softmax; P split into
/// bf16 hi + lo for P C; output fp32. Expected ~1e-5 relative RMS vs float64 on the exact q~.
///
/// Algorithm: the query rows are the T H pairs (t, i), t-major; each CTA (8 warps) takes 32 consecutive
/// rows (H = 32: one token's heads; H = 16: two tokens; H = 64: half a token) and streams the cache rows
/// 0 .. (largest position among its rows) in 32-token tiles through a 4-stage cp.async ring; the causal
/// mask is per row. Warp w owns latent columns [64 w, 64 w + 64) of the scores (k-split, summed through
/// shared memory) and of P C. No split over the keys: T H / 32 CTAs per sequence, launched longest first.
/// For T = 1 (or few tokens) behind a long prefix use mla_decode (split over the keys).
///
/// Latent cache layout (kernels/mla.hpp, shared with the decode): c [B, N_max, row] bf16, row-major; token
/// tau of sequence b is c + b * sc_b + tau * sc_t, its first d_c = 512 elements are c_tau; sc_t = 512 (latent
/// only) or 576 ([c ; k_R] rows). The prefill writes rows N0 .. N0 + T - 1 (the first 512 elements of each).
/// Query layout: q_hi, q_lo [B, T, H, d_c] bf16 (batch stride sq_b, token stride sq_t, head stride d_c).
/// Output a [B, T, H, d_c] fp32, contiguous.
///
/// Errors: kdalab::Error naming the argument, its value and what is accepted (d_c != 512, d_rope != 0,
/// H outside [1, 256], T < 1, N0 < 0, N0 + T > capacity, null or misaligned pointers, bad strides, scale
/// not finite and > 0), before anything is launched. CUDA errors throw kdalab::Error with the CUDA message.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/kda.hpp"
#include "reference/error.hpp"

namespace kdalab::kernels {

/// Arguments of the causal MLA prefill (T new tokens per sequence behind a cached prefix of N0 tokens).
struct MlaPrefillArgs {
  int B = 0;                     ///< sequences, 1 <= B <= 65535
  int T = 0;                     ///< new tokens per sequence, >= 1
  int H = 32;                    ///< query heads sharing the latent, 1 <= H <= 256
  int d_c = 512;                 ///< latent width (kv_lora_rank); supported: 512
  int d_rope = 0;                ///< decoupled RoPE width; supported: 0 (NoPE)
  int capacity = 0;              ///< N_max: tokens the cache holds per sequence
  int prefix = 0;                ///< N0: tokens already cached in every sequence; N0 + T <= capacity
  bf16_t* c = nullptr;           ///< latent cache [B, N_max, sc_t], 16-byte aligned; rows N0 .. N0+T-1 are written
  std::int64_t sc_b = 0;         ///< batch stride of c in elements (0 = N_max * sc_t); multiple of 8
  std::int64_t sc_t = 0;         ///< token (row) stride of c in elements (0 = d_c); multiple of 8, >= d_c
  const bf16_t* c_new = nullptr; ///< latents of the new tokens [B, T, d_c], 16-byte aligned; null = already in the cache
  std::int64_t sn_b = 0;         ///< batch stride of c_new (0 = T * sn_t); multiple of 8
  std::int64_t sn_t = 0;         ///< token stride of c_new (0 = d_c); multiple of 8, >= d_c
  const bf16_t* q_hi = nullptr;  ///< [B, T, H, d_c] bf16(q~), 4-byte aligned
  const bf16_t* q_lo = nullptr;  ///< [B, T, H, d_c] bf16(q~ - q_hi), 4-byte aligned
  std::int64_t sq_b = 0;         ///< batch stride of q_hi / q_lo (0 = T * sq_t); even
  std::int64_t sq_t = 0;         ///< token stride of q_hi / q_lo (0 = H * d_c); even, >= H * d_c
  float scale = 0.0f;            ///< softmax scale, explicit: 1/sqrt(d_nope + d_rope) of the layer
  float* out = nullptr;          ///< attended latent a [B, T, H, d_c] fp32, 8-byte aligned
};

/// The prefill: appends c_new to the cache (rows N0 .. N0 + T - 1 of every sequence), then
/// out = causal softmax(scale q~ C^T) C per (sequence, token, head). Asynchronous on `stream`; no
/// allocation, no host synchronisation: capturable in a CUDA graph. Errors: kdalab::Error (see file
/// comment), before anything is launched.
void mla_prefill(const MlaPrefillArgs& a, cudaStream_t stream);

/// Arguments of the query absorption q~_{t,i} = W_UK,i^T q^C_{t,i} for n tokens.
struct MlaAbsorbArgs {
  int n = 0;                      ///< tokens (e.g. B * T), >= 1
  int H = 32;                     ///< heads, 1 <= H <= 256
  int d_nope = 128;               ///< per-head query width (qk_nope_head_dim), 1 <= d_nope <= 256
  int d_c = 512;                  ///< latent width; supported: 512
  const bf16_t* q_C = nullptr;    ///< [n, H, d_nope] bf16 (token stride sqc_t, head stride d_nope)
  std::int64_t sqc_t = 0;         ///< token stride of q_C in elements (0 = H * d_nope), >= H * d_nope
  const bf16_t* W_UK = nullptr;   ///< [H * d_nope, d_c] bf16 (reference/mla.hpp layout: head i owns rows i d_nope ..), 4-byte aligned
  bf16_t* q_hi = nullptr;         ///< out [n, H, d_c] bf16(q~), 4-byte aligned
  bf16_t* q_lo = nullptr;         ///< out [n, H, d_c] bf16(q~ - q_hi), 4-byte aligned
};

/// q~ in fp32 (exact bf16 products, fp32 sums over d_nope) split into bf16 hi + lo parts, the query
/// layout of mla_prefill and mla_decode (contiguous [n, H, d_c]). Asynchronous on `stream`.
/// Errors: kdalab::Error (n < 1, H or d_nope out of range, d_c != 512, null or misaligned pointers).
void mla_absorb_query(const MlaAbsorbArgs& a, cudaStream_t stream);

}  // namespace kdalab::kernels
