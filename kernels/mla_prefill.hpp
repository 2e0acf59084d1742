#pragma once
/// Gated MLA causal prefill for sm_90a: appends the latents of T new tokens to the latent cache and
/// runs causal absorbed attention for them over (cached prefix of N0 tokens) + (the T new tokens).
/// A plain host API: device pointers, shapes, strides in elements, a cudaStream_t (same style as
/// kernels/kda.hpp and kernels/mla.hpp). No Eigen, no torch.
///
/// Math (DeepSeek-V2 §2.1 Eqs. 9-19 absorbed; K3 report Eq. 7; docs/equations.md, MLA section;
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
/// Naive or absorbed: mla_prefill() below is the absorbed path alone (it returns the attended latent a). The
/// entry that picks a path is mla_prefill_heads() (end of this file): it returns o_i = W_UV,i a_i [B, T, H, d_v]
/// either way, and its rule, derived there, compares the tensor-core FLOPs the two paths execute.
///
/// Precision: q~ as bf16 hi + lo (a bf16-rounded q~ alone costs 2.3-3.5e-3 relative RMS, docs/kernels/mla_decode.md);
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

// ---- per-head output o_i = W_UV,i a_i, naive or absorbed (kernels/mla_prefill/naive.cu) ----------------------

/// Which evaluation mla_prefill_heads() runs. automatic = mla_prefill_path_rule().
enum class MlaPrefillPath { automatic = 0, absorbed = 1, naive = 2 };

/// "auto", "absorbed" or "naive".
const char* mla_prefill_path_name(MlaPrefillPath p);

/// The precision plan of mla_prefill_heads(). automatic = mla_prefill_precision_rule().
///   accurate  K, V and P carried as bf16 hi + lo (the plan below): ~5e-6 relative RMS of o against float64.
///   fast      K, V rounded once to bf16 by the reconstruction GEMMs, P rounded to bf16, one tensor pass per
///             product, fp32 accumulation and softmax: a standard bf16 flash attention (the emulation below gives
///             2.4e-3 .. 4.2e-3; torch SDPA's bf16 backends are in the same range). Runs the naive path only.
enum class MlaPrefillPrecision { automatic = 0, accurate = 1, fast = 2 };

/// "auto", "accurate" or "fast".
const char* mla_prefill_precision_name(MlaPrefillPrecision p);

/// Arguments of mla_prefill_heads(): the causal prefill of T new tokens per sequence behind a cached prefix of
/// N0 tokens, returning the per-head attention output o [B, T, H, d_v] (before the output gate and W_o).
///
/// Math (DeepSeek-V2 §2.1 Eqs. 9-19; K3 report Eq. 7; docs/equations.md, MLA section; reference/mla.hpp
/// mla_attend_naive / mla_attend_absorbed), per sequence b, new token t (absolute position N0 + t), head i:
///   k_{tau,i} = W_UK,i c_tau (d_nope), v_{tau,i} = W_UV,i c_tau (d_v) for every key tau = 0 .. N0 + t,
///   s_tau = scale q^C_{t,i} . k_{tau,i},  p = softmax_tau(s),  o_{t,i} = sum_tau p_tau v_{tau,i} = W_UV,i a_{t,i}.
///
/// The two paths (both return o; in precision accurate they agree to ~1e-5 relative RMS, see "Precision"):
///   absorbed  mla_absorb_query (q~ = W_UK,i^T q^C as bf16 hi + lo) -> mla_prefill (a [B, T, H, d_c] fp32,
///             appends c_new) -> o_i = W_UV,i a_i by an fp32 cuBLAS batched GEMM (W_UV converted to fp32).
///   naive     append c_new; reconstruct K = C W_UK^T and V = C W_UV^T for all N = N0 + T keys of every sequence
///             (cuBLAS, bf16 inputs, fp32 accumulation and output [B, N, H, 128]: one strided-batched call for
///             both where mla_kv_products_in_one_call says so, else one call each); split each
///             fp32 row in place into bf16 hi + lo; causal flash attention (mma.sync m16n8k16, 128 queries of one
///             (sequence, head) per CTA, 32-key tiles, fp32 online softmax, causal mask with the N0 offset).
///
/// Precision plan of the naive path (chosen by a CPU emulation (bench/mla_naive_emu.py), float64 truth
/// vs each plan's roundings on the reference/mla.hpp test distribution: W_UK, W_UV ~ N(0, 1/d_c) and latents
/// ~ N(0, 1) rounded to bf16, q^C ~ sigma N(0, 1) in bf16, sigma = 1, 2, 4 (logit std ~ sigma), N up to 1037;
/// docs/kernels/mla_prefill.md): relative RMS of o
///   k, v, P all bf16 (a plain bf16 flash attention)   2.4e-3 .. 4.2e-3   over the 2e-3 budget of accurate
///                                                                          (tol::mla_prefill_heads_goal): precision fast
///   k hi + lo, v bf16, P bf16                         1.75e-3 .. 1.96e-3 (no margin)
///   k hi + lo, v bf16, P hi + lo                      1.6e-3             (v's rounding alone)
///   k hi + lo, v hi + lo, P bf16                      0.59e-3 .. 1.12e-3 (P's rounding alone)
///   k hi + lo, v hi + lo, P hi + lo                   3.4e-6 .. 6.1e-6   <- precision accurate (the default)
///   (fp16 v and P would give 2.3e-4 in one P V pass, but v = W_UV c has no bound below fp16's 65504.)
/// q^C is a bf16 input (exact). k and v are carried as bf16 hi + lo of the fp32 reconstruction, P as bf16 hi + lo
/// of the fp32 probabilities: scores = q k_hi + q k_lo (2 mma passes), P V = P_hi V_hi + P_hi V_lo + P_lo V_hi
/// (3 passes; P_lo V_lo ~2^-16 dropped). MlaPrefillOverrides::p_hi_only drops P_lo V_hi (~1e-3): an ablation.
///
/// The rule (mla_prefill_path_rule). Tensor-core FLOPs each path executes per sequence and head, with
/// pairs = T N0 + T (T + 1) / 2 causal (query, key) pairs and N = N0 + T keys:
///   absorbed  8 d_c = 4096 per pair (scores and P C over d_c = 512, hi and lo rows on both);
///   naive     5 x 2 x 128 = 1280 per pair (2 score passes, 3 P V passes) plus the reconstruction
///             2 d_c (d_nope + d_v) = 262,144 per key.
/// naive iff 4096 pairs > 1280 pairs + 262,144 N, i.e. 11 pairs > 1024 N (exact in integers): with N0 = 0,
/// naive for T >= 186; behind a long prefix (pairs ~ T N) naive for T >= ~94. The rule counts FLOPs only: the
/// naive workspace is B N H 1 KB in precision accurate, 512 B in fast (a short chunk behind a 1M-token prefix would need 32 GB at H = 32: force
/// absorbed there with MlaPrefillOverrides, or decode). To be recalibrated from measured rates (kdalab bench
/// --op mla-prefill prints both paths and the rule's choice). Measured on an H200 (B = 1, N0 = 0, H = 32): naive is
/// faster at every measured T, 3.1x at T = 64 (0.040 vs 0.122 ms) to 3.6x at T = 8192 (5.2 vs 18.7 ms), so the rule is
/// conservative below T = 186; the prefix side (naive rebuilds K, V for all N0 keys) is not yet measured
/// (docs/kernels/mla_prefill.md).
///
/// Layouts: cache and c_new as MlaPrefillArgs (rows N0 .. N0 + T - 1 are written by either path); q^C
/// [B, T, H, d_nope] bf16 with token stride sqc_t (0 = H d_nope; batch stride T sqc_t); W_UK [H d_nope, d_c] and
/// W_UV [H d_v, d_c] bf16 row-major (reference/mla.hpp: head i owns rows i d_nope ..); out o [B, T, H, d_v] fp32
/// contiguous. Supported: d_c = 512, d_nope = d_v = 128, d_rope = 0 (NoPE).
struct MlaPrefillHeadsArgs {
  int B = 0;                      ///< sequences, 1 <= B <= 65535
  int T = 0;                      ///< new tokens per sequence, >= 1
  int H = 32;                     ///< heads, 1 <= H <= 256
  int d_c = 512;                  ///< latent width; supported: 512
  int d_nope = 128;               ///< per-head query/key width; supported: 128
  int d_v = 128;                  ///< per-head value width; supported: 128
  int d_rope = 0;                 ///< supported: 0 (NoPE)
  int capacity = 0;               ///< N_max: tokens the cache holds per sequence
  int prefix = 0;                 ///< N0: tokens already cached; N0 + T <= capacity
  bf16_t* c = nullptr;            ///< latent cache [B, N_max, sc_t], 16-byte aligned (as MlaPrefillArgs::c)
  std::int64_t sc_b = 0;          ///< batch stride of c (0 = N_max sc_t); multiple of 8
  std::int64_t sc_t = 0;          ///< row stride of c (0 = d_c); multiple of 8, >= d_c
  const bf16_t* c_new = nullptr;  ///< [B, T, d_c] latents of the new tokens, 16-byte aligned; null = already cached
  std::int64_t sn_b = 0;          ///< batch stride of c_new (0 = T sn_t); multiple of 8
  std::int64_t sn_t = 0;          ///< token stride of c_new (0 = d_c); multiple of 8, >= d_c
  const bf16_t* q_C = nullptr;    ///< [B, T, H, d_nope] bf16 (not absorbed), 4-byte aligned
  std::int64_t sqc_t = 0;         ///< token stride of q_C (0 = H d_nope); even, >= H d_nope
  const bf16_t* W_UK = nullptr;   ///< [H d_nope, d_c] bf16, 4-byte aligned
  const bf16_t* W_UV = nullptr;   ///< [H d_v, d_c] bf16, 4-byte aligned
  float scale = 0.0f;             ///< softmax scale, explicit: 1/sqrt(d_nope + d_rope) of the layer
  MlaPrefillPrecision precision = MlaPrefillPrecision::automatic;  ///< see MlaPrefillPrecision
  /// Packed sequences of different lengths (varlen; the naive path, either precision). Optional device int32
  /// [num_seqs + 1], cu_seqlens[0] = 0, nondecreasing, cu_seqlens[num_seqs] = T: sequence n's new tokens are the packed
  /// rows cu_seqlens[n] .. cu_seqlens[n + 1] - 1 of q_C, c_new and out (B must be 1; T = all new tokens; sqc_t and
  /// sn_t step a packed row, sn_b is unused). Its cache is sequence n of c ([num_seqs, N_max, sc_t]), with N0_n
  /// tokens cached before the call.
  const int* cu_seqlens = nullptr;
  /// With cu_seqlens: optional device int32 [num_seqs], N0_n of each sequence, each in 0 .. prefix; null: every
  /// N0_n = prefix. `prefix` is then a host-known bound on the N0_n (it sizes the workspace).
  const int* prefix_lens = nullptr;
  int num_seqs = 0;    ///< with cu_seqlens: sequences, 1 .. 65535
  int max_seqlen = 0;  ///< with cu_seqlens: a host-known bound on every sequence's new tokens, >= 1; prefix + max_seqlen <= capacity
  // The device arrays' values are not read on the host: lengths outside these bounds are undefined behaviour.
  void* workspace = nullptr;      ///< device scratch of >= mla_prefill_heads_workspace_bytes(args) bytes, 256-byte aligned
  std::size_t workspace_bytes = 0;
  float* out = nullptr;           ///< o [B, T, H, d_v] fp32, 8-byte aligned
  /// o [B, T, H, d_v] as bf16 (round to nearest even of the fp32 o) instead of `out`, which is then null: precision
  /// fast with a wgmma form only; 4-byte aligned (16-byte aligned: whole blocks leave by TMA stores). Half the bytes of
  /// the fp32 o, the format torch's attention returns; adds the bf16 rounding of o to the error.
  bf16_t* out_bf16 = nullptr;
};

/// The rule (derived above from the tensor-core FLOPs of the two paths; measurements: docs/kernels/mla_prefill.md):
/// naive iff 11 pairs > 1024 N, else absorbed (never automatic). No checks, no CUDA calls.
MlaPrefillPath mla_prefill_path_rule(const MlaPrefillHeadsArgs& a);

/// The precision rule: accurate, whatever the shape. kdalab's default answer is the one at ~5e-6 from the truth;
/// fast (2.5x fewer tensor passes, half the workspace, and on the warpgroup MMA: 1.42-1.45 against 5.07-5.14 ms at B = 1,
/// T = 8192, H = 32 on an H100) is asked for by name. No checks, no CUDA calls.
MlaPrefillPrecision mla_prefill_precision_rule(const MlaPrefillHeadsArgs& a);

/// The precision mla_prefill_heads() runs: a.precision, or the rule's when automatic. No checks, no CUDA calls.
MlaPrefillPrecision mla_prefill_heads_precision(const MlaPrefillHeadsArgs& a);

/// What benchmarks and tests may force (passed as an optional pointer; null = everything automatic).
/// The forms of precision fast's attention (docs/kernels/mla_prefill.md, "Precision fast"):
/// - wgmma: warpgroup MMA, TMA-fed 128-key tiles, a producer warpgroup and two consumer warpgroups of 64 query rows
///   (kernels/mla_prefill/fast_wg.cu), each at its own pace;
/// - wgmma_pingpong: the same with the two consumer warpgroups issuing their products in turn;
/// - mma_sync: the first form, mma.sync with 8 warps of 16 query rows and 32-key tiles through a cp.async ring
///   (kernels/mla_prefill/naive.cu), kept as a second implementation and for timing side by side.
enum class MlaFastForm : int { automatic = 0, wgmma = 1, wgmma_pingpong = 2, mma_sync = 3 };

/// "auto", "wgmma", "wgmma_pingpong" or "mma_sync".
const char* mla_fast_form_name(MlaFastForm f);

/// The form automatic picks: wgmma. Both wgmma forms are 1.5-2.1x faster than mma_sync on the bench's three larger shapes;
/// wgmma_pingpong's 1-5% lead over wgmma is within the run-to-run spread measured so far
/// (docs/kernels/mla_prefill.md, "Precision fast, version 2").
MlaFastForm mla_fast_form_rule();

/// The order in which the wgmma forms' persistent CTAs take their work items (128 query rows x head x sequence; a
/// snake deal: round j hands the next G items to the G CTAs, in reverse CTA order on odd rounds):
/// - longest_first: query tiles from the last one down, every (head, sequence) of a tile side by side;
/// - head_major: every query tile of one (head, sequence) side by side, last one first, so that the CTAs running at
///   one time share fewer heads' K and V in L2.
/// Any order gives the same o bit for bit.
enum class MlaFastOrder : int { automatic = 0, longest_first = 1, head_major = 2 };

/// "auto", "longest_first" or "head_major".
const char* mla_fast_order_name(MlaFastOrder o);

/// The order automatic picks: head_major when the prefix dominates (N0 >= 7 T: every query tile's keys within 1/8 of
/// the longest's, so the order does not change the balance) or a sequence has at most 16 query tiles (T <= 2048,
/// with packed sequences the longest: a schedule model puts the snake deal of head_major within 0-3% of
/// longest_first's balance there); else longest_first (docs/kernels/mla_prefill.md, "Precision fast, version 4").
/// No checks, no CUDA calls.
MlaFastOrder mla_fast_order_rule(const MlaPrefillHeadsArgs& a);

struct MlaPrefillOverrides {
  MlaPrefillPath path = MlaPrefillPath::automatic;  ///< automatic (mla_prefill_path_rule), absorbed or naive
  bool p_hi_only = false;  ///< naive path ablation: P as bf16 hi only (4 mma passes instead of 5, ~1e-3)
  /// precision fast: which form of the attention runs (mla_fast_form_rule() for automatic); every form runs the same
  /// precision plan
  MlaFastForm fast_form = MlaFastForm::automatic;
  /// precision fast, wgmma forms: CTAs of the persistent grid (each takes work items of 128 query rows x one head in
  /// turn); 0: one per SM. Any count gives the same output bit for bit (an item's arithmetic does not depend on its CTA)
  int fast_ctas = 0;
  /// precision fast, wgmma forms: the persistent CTAs' item order (mla_fast_order_rule() for automatic)
  MlaFastOrder fast_order = MlaFastOrder::automatic;
};

/// The path mla_prefill_heads() runs: naive in precision fast or with cu_seqlens; else the forced one when ov->path is
/// absorbed or naive, else mla_prefill_path_rule(a). No checks, no CUDA calls.
MlaPrefillPath mla_prefill_heads_path(const MlaPrefillHeadsArgs& a, const MlaPrefillOverrides* ov = nullptr);

/// Workspace bytes mla_prefill_heads() needs for `a` on the path mla_prefill_heads_path(a, ov) picks:
/// naive 2 B (N0 + T) H d_nope 4 (fp32 K and V, split in place into bf16 hi + lo; precision fast: 2 bytes, bf16 K
/// and V; with cu_seqlens num_seqs (prefix + max_seqlen) in place of B (N0 + T): every sequence gets the rows of the
/// longest); absorbed
/// B T H d_c (2 + 2 + 4) (q~ hi, lo, a) + H d_v d_c 4 (W_UV in fp32), each part rounded up to 256 bytes.
/// Errors: kdalab::Error on B, T, H or prefix out of range (no CUDA calls).
std::size_t mla_prefill_heads_workspace_bytes(const MlaPrefillHeadsArgs& a, const MlaPrefillOverrides* ov = nullptr);

/// Whether the naive path rebuilds K and V in one cuBLAS call (a strided batch of two products, W_UK then W_UV, over
/// all nseq nk key rows) instead of two: when the sequences' nk rows of the latent cache lie end to end (nseq = 1 or a
/// sequence stride sc_b = nk sc_t, elements), nseq nk <= 2^31 - 1 (cuBLAS's int count), and W_UV starts w_gap = W_UV - W_UK bf16 elements after W_UK with w_gap > 0
/// a multiple of 8 (16 bytes). One call or two compute the same products (docs/kernels/mla_prefill.md, "The K and V
/// products in one call"). No CUDA calls.
bool mla_kv_products_in_one_call(long long nseq, long long nk, long long sc_t, long long sc_b, long long w_gap);

/// The prefill with per-head output: appends c_new to the cache, then writes o [B, T, H, d_v] fp32 (or bf16: out_bf16) by the path
/// mla_prefill_heads_path(a, ov) picks. Asynchronous on `stream`, no allocation (cuBLAS: one handle per process, made
/// on the first call, on the device current then; not for CUDA-graph capture on its first call). Errors:
/// kdalab::Error naming the argument, its value and what is accepted (unsupported widths, T < 1, N0 < 0,
/// N0 + T > capacity, null or misaligned pointers, bad strides, scale not finite and > 0, workspace too small, an
/// override or a precision out of range, precision fast with the absorbed path or p_hi_only forced, cu_seqlens with
/// B != 1, the absorbed path forced or num_seqs, max_seqlen out of range; out_bf16 with out, with precision accurate or
/// with the mma_sync form), before anything
/// is launched; CUDA and cuBLAS errors throw kdalab::Error with their message.
void mla_prefill_heads(const MlaPrefillHeadsArgs& a, cudaStream_t stream, const MlaPrefillOverrides* ov = nullptr);

}  // namespace kdalab::kernels
