#pragma once
/// Gated MLA CUDA kernels for sm_90a: the absorbed decode step over a bf16 latent cache.
/// A plain host API: device pointers, shapes, strides in elements, a cudaStream_t (same style as
/// kernels/kda.hpp). No Eigen, no torch.
///
/// Math (DeepSeek-V2 §2.1 Eqs. 9-19 absorbed; K3 report Eq. 7; docs/equations.md, MLA section;
/// reference/mla.hpp mla_attend_absorbed / mla_attend_streaming), per sequence b, query token j (0 <= j < s_q) and
/// head i, over the cached latents c_0 .. c_{len_b - 1} (each d_c = 512 wide):
///   s_tau = scale * q~_{j,i} . c_tau  (tau <= len_b - s_q + j),   p = softmax_tau(s),   a_{j,i} = sum_tau p_tau c_tau
/// where q~_{j,i} = W_UK,i^T q^C_{j,i} is the absorbed query (computed by the caller). s_q = 1 is the plain decode step
/// (every cached token is read); s_q = 2..4 is multi-token decode (speculative decoding, multi-token prediction): the
/// last s_q cached tokens are the queries' own, causal among themselves, so query j does not read the s_q - 1 - j
/// tokens after its own. The kernel returns the attended latent a [B, s_q, H, d_c] in fp32. The caller then applies
/// W_UV per head (o_i = W_UV,i a_i), the output gate (Sigmoid(W_g x) ⊙ o) and W_o: W_UV cannot fold into W_o because
/// the gate sits between.
/// NoPE only: the decoupled-RoPE part (d_rope = 64, q^R . k^R added to the score) is refused for now.
///
/// Precision (MlaDecodePrecision; docs/kernels/mla_decode.md). accurate: q~ is carried as two bf16 parts, q~ = q_hi +
/// q_lo (q_hi = bf16(q~), q_lo = bf16(q~ - q_hi), ~2^-16 relative), because a bf16-rounded absorbed query alone costs
/// 2.3-3.5e-3 relative RMS (docs/kernels/mla_decode.md). The scores are bf16 warpgroup-MMA products of the
/// interleaved q_hi / q_lo rows with C (fp32 accumulation); the probabilities P (fp32 online softmax) are likewise
/// split into bf16 hi + lo for P C. Output fp32. Measured against float64 at N = 4096 (the same precision plan in a
/// tile-by-tile kernel the current one replaced; the two agree to ~1e-5): 3.8e-6 relative RMS; with q_lo = 0: 2.3e-3;
/// with P_hi only (MlaDecodeOverrides::p_hi_only): 4.8e-4. The bound the tests hold: tol::mla_decode_goal
/// (numerics/tolerance.hpp). The hi and lo rows of H = 32 heads fill the 64 rows of one warpgroup MMA, so accurate
/// runs s_q = 1 only. fast (FlashMLA's precision): the query is bf16(q~) alone (q_hi; q_lo null) and P is bf16(P),
/// fp32 accumulation; every one of the s_q H query rows is its own MMA row with its own online softmax, so 2 tokens of
/// 32 heads do the tensor work of one accurate token. Expected 2-4e-3 relative RMS (the two ablations above in
/// quadrature; FlashMLA measured 2.5-5.4e-3); the tests hold tol::mla_decode_fast. Not yet measured on a GPU.
///
/// Algorithm: split-K over the sequence (flash-decoding). Each CTA takes one slice of split_len tokens
/// of one sequence and all H heads (the latent is read once for all heads), streams it through shared
/// memory (cp.async) in pairs of 64-token blocks, one per warpgroup (the "seesaw" schedule: one warpgroup's
/// softmax overlaps the other's P C; kernels/mla_decode/split.cu), runs an online softmax, and writes its partial
/// (running max m, sum l, unnormalised accumulator) to the workspace; a combine kernel merges the partials per
/// (b, head), loading every slice's partial at once (kernels/mla_decode/combine.cu):
///   M = max_s m_s,  L = sum_s l_s e^(m_s - M),  a = sum_s e^(m_s - M) acc_s / L
/// When the plan gives one slice per sequence (large batches of short contexts) the split kernel normalises in its
/// epilogue and writes the output itself, and no combine runs (MlaDecodeOutput::direct: the same float operations
/// as the combine's single-slice merge, so the same bits). Measured on one H200 (H = 32, per step in a CUDA graph):
/// N = 1M ~305 us, N = 64K 34.9 us, B = 256 x 4K 331-335 us; docs/kernels/mla_decode.md has every shape and the
/// designs this one replaced.
/// Query rows: accurate, the 64 MMA rows of a CTA are the hi and lo rows of the H heads; fast, they are 64 of the s_q H
/// query rows (row j H + i: token j, head i), so s_q H <= 64 (H = 16 with any s_q, H = 32 with s_q <= 2) runs in one CTA
/// per slice, and H = 32 with s_q = 3, 4 in two CTAs per slice ("row groups": rows 0-63 and 64 .. s_q H - 1), side by
/// side in the grid so that the second reads the slice's latents mostly from L2. Two row groups cannot share one CTA:
/// their fp32 accumulators, 128 rows x 512 columns, would fill the SM's whole register file.
///
/// Latent cache layout (shared with the prefill): c [B, N_max, row] bf16, row-major; token tau of
/// sequence b is c + b * sc_b + tau * sc_t, its first d_c = 512 elements are c_tau. sc_t = 512 is the
/// plain latent cache; sc_t = 576 lets one buffer hold [c_tau ; k^R_tau] per row (d_rope = 64), the
/// per-token cache of reference/mla.hpp MlaCache. N_max = capacity (tokens per sequence).
/// Query layout: q_hi, q_lo [B, s_q, H, d_c] bf16 (batch stride sq_b, token stride sq_t, head stride d_c; query token j
/// of sequence b is its cached token len_b - s_q + j). Output a [B, s_q, H, d_c] fp32 (contiguous). With s_q = 1 both
/// are the [B, H, d_c] of the one-token step.
///
/// Errors: every check throws kdalab::Error naming the argument, its value and what is accepted
/// (d_c != 512, d_rope != 0, H not in {16, 32}, s_q not in 1..4, a precision that does not run this s_q, q_lo
/// given with fast or missing with accurate, max_len < s_q or > capacity, null or misaligned pointers, bad strides,
/// scale not finite and > 0, workspace too small, an override out of range), before anything is launched. A
/// per-sequence length lens[b] outside [s_q, max_len] (the s_q queries are the last s_q cached tokens) cannot be
/// checked on the host (it lives on the device): that sequence's output rows (all s_q H of them) are set to NaN.
/// CUDA errors throw kdalab::Error with the CUDA message.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/kda.hpp"
#include "reference/error.hpp"

namespace kdalab::kernels {

/// The precision plan of the decode step (docs/kernels/mla_decode.md, "Multi-token decode"). automatic =
/// mla_decode_precision_rule(s_q).
///   accurate  q~ = q_hi + q_lo and P = P_hi + P_lo in bf16, fp32 accumulation: ~1e-5 relative RMS against float64
///             (tol::mla_decode_goal). s_q = 1 only: the hi and lo rows of the heads fill the MMA rows.
///   fast      q~ = bf16(q~) (q_hi; q_lo must be null) and P = bf16(P), fp32 accumulation (FlashMLA's precision):
///             2-4e-3 expected (tol::mla_decode_fast). Any s_q in 1..4; half the tensor work per query row.
enum class MlaDecodePrecision { automatic = 0, accurate = 1, fast = 2 };

/// "auto", "accurate" or "fast".
const char* mla_decode_precision_name(MlaDecodePrecision p);

/// The rule: accurate for s_q = 1 (the lo rows fill MMA rows that one token's heads leave empty, at no extra tensor
/// work), fast for s_q > 1 (the MMA rows carry more query tokens instead; only the fast plan meets the multi-token time
/// goals: 2 tokens <= 1.2x and 4 tokens <= 1.6x the one-token step at N = 1M, docs/kernels/mla_decode.md).
MlaDecodePrecision mla_decode_precision_rule(int s_q);

/// Arguments of the absorbed MLA decode step (s_q query tokens per sequence).
struct MlaDecodeArgs {
  int B = 0;                     ///< sequences, 1 <= B <= 65535
  int H = 32;                    ///< query heads sharing the latent; supported: 16, 32
  int d_c = 512;                 ///< latent width (kv_lora_rank); supported: 512
  int d_rope = 0;                ///< decoupled RoPE width; supported: 0 (NoPE) for now
  int capacity = 0;              ///< N_max: tokens the cache holds per sequence (>= max_len)
  int max_len = 0;               ///< host-known bound on every lens[b] (sizes the split); s_q <= max_len <= capacity
  const int* lens = nullptr;     ///< optional device int32 [B]: tokens of each sequence, its s_q queries included;
                                 ///< null = all max_len
  const bf16_t* c = nullptr;     ///< latent cache [B, N_max, sc_t], 16-byte aligned
  std::int64_t sc_b = 0;         ///< batch stride of c in elements (0 = N_max * sc_t); multiple of 8
  std::int64_t sc_t = 0;         ///< token (row) stride of c in elements (0 = d_c); multiple of 8, >= d_c
  int s_q = 1;                   ///< query tokens per sequence, the last s_q cached ones (causal); 1 <= s_q <= 4
  MlaDecodePrecision precision = MlaDecodePrecision::automatic;  ///< see MlaDecodePrecision
  const bf16_t* q_hi = nullptr;  ///< [B, s_q, H, d_c] bf16(q~), 4-byte aligned
  const bf16_t* q_lo = nullptr;  ///< [B, s_q, H, d_c] bf16(q~ - q_hi), 4-byte aligned; accurate only (fast: null)
  std::int64_t sq_b = 0;         ///< batch stride of q_hi / q_lo in elements (0 = s_q * sq_t); even
  std::int64_t sq_t = 0;         ///< token stride of q_hi / q_lo in elements (0 = H * d_c); even, >= H * d_c
  float scale = 0.0f;            ///< softmax scale, explicit: 1/sqrt(d_nope + d_rope) of the layer
  float* out = nullptr;          ///< attended latent a [B, s_q, H, d_c] fp32, 16-byte aligned
  void* workspace = nullptr;     ///< device scratch of mla_decode_workspace_bytes() bytes, 16-byte aligned
  std::size_t workspace_bytes = 0;
};

/// Where the output of a decode step is formed. automatic = mla_decode_output_rule().
///   direct   the split kernel normalises its slice and writes the output (one slice per sequence only);
///   combine  the split kernel writes partials to the workspace and the combine kernel merges them.
enum class MlaDecodeOutput { automatic = 0, direct = 1, combine = 2 };

/// "auto", "direct" or "combine".
const char* mla_decode_output_name(MlaDecodeOutput o);

/// The rule: direct iff the plan gives one slice per sequence (num_splits = 1), else combine. With one slice the
/// combine would only divide the partial by its own l, after the partial went to the workspace and back in a second
/// launch; the direct output does the same float operations in the split kernel's epilogue (same bits), and measured
/// faster on an H200 (B = 256 x 4K 339-353 -> 331-335 us per graph step, 128 x 8K -2.5%, 132 x 4K -4.5%;
/// docs/kernels/mla_decode.md). With several slices only the combine can merge them.
MlaDecodeOutput mla_decode_output_rule(int num_splits);

/// What benchmarks and tests may force (passed as an optional pointer; null = everything automatic).
struct MlaDecodeOverrides {
  int num_splits = 0;  ///< slices per sequence; 0 = the plan's choice (about one CTA per SM in total)
  MlaDecodeOutput output = MlaDecodeOutput::automatic;  ///< direct needs one slice per sequence
  bool p_hi_only = false;  ///< ablation of accurate: P C with P_hi = bf16(P) alone (P_lo rows zero), ~5e-4 instead of ~4e-6
};

/// Splits per sequence, tokens per split and the output path that mla_decode will use for these arguments.
/// Automatic split count: among slices of >= 64 tokens (one block) the count of least modelled time,
/// waves x (split_len + 128) with the SM count of the current device (split_len rounded up to whole 64-token
/// blocks; the 128 tokens model a slice's fixed cost: the q~ load and the partial written and read back):
/// N = 65536 -> 128 x 512, N = 1M -> 132 x 8000, N = 8192 -> 128 x 64 on an H200's 132 SMs
/// (docs/kernels/mla_decode.md). split_len is a multiple of 64. With two row groups (fast, H = 32, s_q = 3 or 4) a
/// slice is two CTAs and the wave model counts both. Checks the shapes, the precision and the overrides.
struct MlaDecodePlan {
  int num_splits = 0, split_len = 0;
  MlaDecodeOutput output = MlaDecodeOutput::combine;  ///< never automatic
  MlaDecodePrecision precision = MlaDecodePrecision::accurate;  ///< the precision that runs; never automatic
  int row_groups = 1;  ///< CTAs per slice: ceil(s_q H / 64) with fast, 1 with accurate
};
MlaDecodePlan mla_decode_plan(const MlaDecodeArgs& a, const MlaDecodeOverrides* ov = nullptr);

/// Bytes of device scratch mla_decode needs for these shapes: one partial (m, l, d_c accumulators, fp32) per (sequence,
/// slice, query token, head), B * num_splits * s_q * H * (d_c + 2) * 4 with num_splits from mla_decode_plan; the same
/// with the direct output, which does not use it.
std::size_t mla_decode_workspace_bytes(const MlaDecodeArgs& a, const MlaDecodeOverrides* ov = nullptr);

/// The decode step: out = softmax(scale q~ C^T) C per (sequence, query token, head), query token j masked past its own
/// position. Asynchronous on `stream`; no allocation, no host synchronisation: capturable in a CUDA graph. Errors:
/// kdalab::Error (see file comment), before anything is launched.
void mla_decode(const MlaDecodeArgs& a, cudaStream_t stream, const MlaDecodeOverrides* ov = nullptr);

}  // namespace kdalab::kernels
