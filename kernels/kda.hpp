#pragma once
/// KDA (Kimi Delta Attention) CUDA kernels for sm_90a: chunked prefill and the decode step.
/// A plain host API: device pointers, shapes, strides in elements, a cudaStream_t. No Eigen, no torch.
///
/// Math (K3 report Eq. 1 and Eq. 5; EQUATIONS.md section 1), per value head, state S (d_k x d_v,
/// "KV" layout, fp32):
///   g_t = g_min Sigmoid(exp(A_log) (g_raw_t + bias))        (K3 bounded gate, fused; switchable)
///   q_t, k_t = L2Norm(q_t), L2Norm(k_t); beta_t = Sigmoid(beta_raw_t)   (fused; switchable)
///   S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T;   o_t = scale S_t^T q_t
/// The prefill runs the chunk-16 algorithm of numerics/kda_twin.hpp with its kernel plan
/// (intra-chunk products fp32, the three d_k x d_v products with bf16 operands on the tensor cores
/// and fp32 accumulation, fp32 state, bf16 output). The decode step is plain fp32.
///
/// Layouts (row-major, last dimension contiguous; strides are in elements and may be left 0 for
/// the contiguous default):
///   q, k [B, T, H, D]; v, g, o [B, T, HV, D]; beta [B, T, HV]; A_log [HV] fp32; bias [HV, D] fp32;
///   S0 / S_final / decode state [N, HV, D, D] fp32, N = number of sequences (B, or cu_seqlens
///   entries - 1). The prefill's final state is the decode step's state (same layout).
///   Value head j reads key head j / (HV / H).
/// D = d_k = d_v in {64, 128, 256} (a template parameter of every default kernel; D = 128 is the
/// original instruction path). D = 64: the same kernels as D = 128 with half the key / value tiles.
/// D = 256: the state pass is the key-split kernel (state_variant 4's, 2 warps per 16 value columns, 64
/// fp32 of S per thread; the one-warp-per-16-columns v3 step would hold 128 and spill) and the v5 segment
/// path is not taken (its d_k x d_k A_seg combine does not fit shared memory); prepare v4 and state
/// variants 2 / 4 / 5 are D = 128 only.
/// Errors: every check throws kdalab::Error naming the argument, its value and what is accepted
/// (unsupported D, misaligned pointers, T = 0, g_min outside [-5, 0), HV not a multiple of H, ...).
/// CUDA errors (launch or runtime) also throw kdalab::Error with the CUDA message.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "reference/error.hpp"

namespace kdalab::kernels {

/// bf16 values are passed as raw 16-bit patterns (the upper half of an IEEE fp32).
using bf16_t = std::uint16_t;

/// Element strides of a [B, T, heads, D] (or [B, T, heads]) tensor. 0 = contiguous default.
struct Strides {
  std::int64_t b = 0, t = 0, h = 0;
};

/// The bounded K3 gate g = g_min Sigmoid(exp(A_log) (g_raw + bias)) and the safety switch.
struct KdaGate {
  const float* A_log = nullptr;  ///< [HV], device
  const float* bias = nullptr;   ///< [HV, D], device
  float g_min = -5.0f;           ///< accepted: -5 <= g_min < 0 (fp32 range of a 16-token chunk)
  bool fused = true;             ///< false: the g input is the log-decay itself (needs allow_unsafe_range)
  /// Lets g_min < -5 (or an unfused gate, whose range cannot be checked) through, for the
  /// decay-range experiment: exp of the cumulative decay may then overflow.
  bool allow_unsafe_range = false;
};

/// Arguments of the chunked prefill (forward).
struct KdaPrefillArgs {
  int B = 0;            ///< batch; must be 1 when cu_seqlens is given (packed sequences)
  int T = 0;            ///< tokens per sequence (total tokens when cu_seqlens is given), >= 1
  int H = 0, HV = 0;    ///< key heads, value heads (HV a multiple of H)
  int D = 128;          ///< d_k = d_v; supported: 64, 128, 256 (see the file comment for what differs)
  const bf16_t *q = nullptr, *k = nullptr, *v = nullptr;
  const bf16_t* g = nullptr;     ///< raw gate logits (gate.fused) or the log-decay g
  const bf16_t* beta = nullptr;  ///< raw beta logits (beta_sigmoid) or beta in [0, 1]
  KdaGate gate;
  float scale = 0.0f;            ///< explicit; usually D^-1/2
  bool l2norm_qk = true, beta_sigmoid = true;
  const float* S0 = nullptr;     ///< optional initial state [N, HV, D, D]
  float* S_final = nullptr;      ///< optional final state [N, HV, D, D]
  const int* cu_seqlens = nullptr;  ///< optional device int32 [N + 1], cu_seqlens[0] = 0, cu_seqlens[N] = T
  int num_seqs = 0;              ///< N when cu_seqlens is given
  int max_seqlen = 0;            ///< longest sequence when cu_seqlens is given (host-known)
  bf16_t* o = nullptr;           ///< output [B, T, HV, D]
  Strides sq, sk, sv, sg, so, sbeta;
  void* workspace = nullptr;     ///< device scratch of kda_prefill_workspace_bytes() bytes, 16-byte aligned
  std::size_t workspace_bytes = 0;
  /// State pass: 3 (default) = P D on the tensor cores (hi/lo bf16), state update first; 2 = v2 (P D in fp32
  /// FMAs); 4 = v4 (opt-in; run on the H200 since session 3): v3's step with the key dimension of S split over 2 warps per
  /// 16 value columns (4 warps per CTA, same grid; partial W S and Qg S reduced through shared memory, each
  /// warp updates its own 64 key rows); 5 = the same with 4 warps per 16 value columns (8 per CTA). Same slot,
  /// same bf16 operand roundings as v3; only the fp32 summation order of W S and Qg S differs (o, S_final within
  /// tol::kda_state_v4_vs_v3 of v3). 4 and 5 run the one-shot state pass (and the v4 overlapped schedule); the v5
  /// segment path needs 3 (auto never takes it for 4 / 5; a forced segment_state >= 2 is refused).
  /// 6 (session 9) = the state step on wgmma (D = 128, one-shot pass and the v4 overlapped schedule): one warpgroup per
  /// 64 value columns, W, Qg, Kd, P read by the warpgroup MMA from shared memory once per 64 columns instead of once
  /// per warp; the prepare writes W, Qg, Kd, P hi / lo row-major for it (same slot offsets and size). Same bf16
  /// operand roundings and fp32 state as v3 (o, S_final within tol::kda_state_wg_vs_v3 of v3; bit-identical on the
  /// tested shapes). Session 10 (v10w, same slot, same products: bit-identical to v9w): the step rearranged after an
  /// ncu profile, 409 -> ~330 instructions per step (bench/NOTES.md "KDA state pass v10w").
  /// The AUTO RULE (segment_state = 0 with state_variant = 3 at D = 128, prepare_variant 6, no pair
  /// step) runs 6 wherever the plan is one-shot or a 2- or 3-segment path; kda_prefill_state_kernel() says which
  /// kernel runs; segment_state = 1 with state_variant = 3 runs v3 itself.
  /// D != 128: only 3 is accepted; at D = 256 it runs the key-split kernel of variant 4 (same numerics as 4).
  /// Errors: other values (6 with prepare_variant 4) -> kdalab::Error.
  int state_variant = 3;
  /// v4 schedule: fixed-length batches with T >= 2048 run in min(8, max(2, T / 2048)) segments whose prepare kernel
  /// overlaps the previous segment's state pass (a side stream + events, joined back to `stream`).
  /// Numerically identical to the unsegmented schedule; false = one prepare then one state pass.
  bool overlap_segments = true;
  /// v5: the fp32 copy of P (1 KB per chunk and value head), which only state_variant 2 reads, is
  /// neither written nor loaded; false = the v4 workspace traffic (bit-identical results either way).
  /// Default true since the v5 GPU tests passed on the H200 (session 3: o and S_final bit-identical to
  /// the v4 layout; see bench/NOTES.md).
  bool compact_workspace = true;
  /// v5 segment-parallel state pass (fixed-length batches, state_variant 3): 0 = auto, 1 = off,
  /// P >= 2 = forced P segments (at most 64; fewer when T has fewer chunks). The chunk sequence is cut
  /// into P segments; pass 1 runs, in parallel, segment 0's full pass from S0 (o; its end state is
  /// S_start(1)) and segments 1..P-2 from S = 0 (-> B_seg) and from S = I with v = 0 (-> A_seg,
  /// d_k x d_k); a combine kernel scans S_start(s + 1) = A_seg S_start(s) + B_seg in fp32; pass 2 runs
  /// segments 1..P-1 in parallel from their S_start (o, S_final). It does up to ~2.5x the state
  /// work, so it pays only when the one-shot pass leaves SMs idle: auto takes it
  /// when N * HV * 4 CTAs <= the SM count (each CTA alone on its SM, latency-bound) and T >= 16384,
  /// choosing P by a wave model (H = 32, T = 65536: P = 3, replaced by the one-shot key-split pass in session 6 and by
  /// the one-shot wgmma pass (state_variant 6) since session 9, see below). With overlap_segments (and run_phases
  /// 3) the prepare runs per segment and overlaps pass 1 of the segments before it (a side stream, as
  /// v4); bit-identical to the serial order.
  /// Not bit-identical to the one-shot pass (A_seg carries its own bf16 operand roundings; the
  /// twin's KdaTwinPlan::segments models it). Workspace: + 3 (P-1) N HV D^2 fp32.
  /// Default 0 (auto) since the v5 GPU tests passed on the H200 (session 3); other ANCHORS shapes keep one shot.
  /// Auto at D = 128 since session 6: where the wave model's best P is 2 or 3 (e.g. H = 32, T >= 16384 on 132
  /// SMs) it takes the ONE-SHOT schedule with the key-split state kernel (state_variant 4's, KS = 2) instead of
  /// the segment path, when state_variant is 3 (the default): measured on the H200 (session 6, bench/NOTES.md)
  /// 0.96 .. 1.00 of the P = 3 segment path's whole prefill on the 4 measured shapes where the model picks P = 3
  /// (T = 65536, H = 32: 5.94 vs 6.13 ms);
  /// P >= 4 keeps the segment path (T = 65536, H = 16: P = 9, 3.24 ms vs 5.11 ms one-shot key-split).
  /// Since session 9 the auto rule runs the one-shot wgmma state pass (state_variant 6) instead of the key split there
  /// (T = 65536, H = 32: 3.78 vs 4.36 ms) and for every one-shot plan at D = 128 (see state_variant).
  /// kda_prefill_state_kernel() says which state kernel runs. D = 64: the same segment path (D / 32 = 2
  /// column slices per head in the auto rule's CTA count), no key-split switch. D = 256: refused when forced
  /// (>= 2), auto takes 1.
  int segment_state = 0;
  /// v5 segment path only: true = the prepare of segment k runs beside pass 1 of the segments before it
  /// (a side stream, bit-identical to the serial order); false (default) = prepare, pass 1, combine,
  /// pass 2 in order. The overlap measured slower on the H200 (session 3, T = 65536, H = 32: 7.30 ms
  /// overlapped vs 6.92 ms serial; prepare 2.9 + state 4.0 ms apart): the two compete for the SMs.
  bool overlap_segment_pass = false;
  int run_phases = 3;            ///< diagnostics: 1 = prepare kernel only, 2 = state pass only (on a prepared workspace), 3 = both
  /// Prepare kernel: 4 = v4 (fp32 FMAs from shared memory), 6 = v6 (the default) (A = Diag(beta)
  /// Kg Ki^T and P = Qg Ki^T on the tensor cores as tf32 3-pass products with fp32 accumulation, ~2^-21
  /// relative per product term instead of fp32 FMAs' 2^-24; fragments written from registers; ~2.4x less
  /// shared-memory traffic). Same slot layout (KdaSlot) and consumers; Qg, Kd, gam_n bit-identical to
  /// v4 (Kd rarely one bf16 ulp apart), A, P, W, U within the 3-pass rounding. Default 6 since its H200 run
  /// (session 3): 1.13x faster than v4 (0.730 -> 0.645 ms at T = 8192, H = 64), o within 3e-5 of v4's,
  /// twin agreement unchanged, S_final identical (bench/NOTES.md). D != 128: only 6.
  int prepare_variant = 6;
  /// Two-chunk ("pair") state step, opt-in (default false; run on the H200 since session 5, slower than the default:
  /// bench/NOTES.md). The state pass advances S by
  /// 32 tokens per step with every decay factor inside one 16-token chunk: the two chunks c = 2p, c + 1 of a pair
  /// are combined in the prepare (the cross terms M = W_{c+1} Kd_c^T, Wb = W_{c+1} Diag(gam_n(c)) - M W_c,
  /// Ub = U_{c+1} - M U_c, Qb = Qg_{c+1} Diag(gam_n(c)), Pbl = Qg_{c+1} Kd_c^T, Kt = Kd_c Diag(gam_n(c+1)) in
  /// fp32-class arithmetic, nothing rounded to bf16 before them), and the state pass runs per pair
  /// D2 = U2 - W2 S, o = scale (Qg2 S + P2 D2), S <- Diag(gam_n(c) gam_n(c+1)) S + Kd2^T bf16(D2) on the
  /// 32-row operands W2 = [W_c; Wb], Qg2 = [Qg_c; Qb], Kd2 = [Kt; Kd_{c+1}], U2 = [U_c; Ub],
  /// P2 = [[P_c, 0], [Pbl, P_{c+1}]] (each of W2, Qg2, Kd2 rounded to bf16 once; U2, gam_n2 fp32; P2 as bf16
  /// hi + lo). A chunk past the sequence end is an all-padding chunk (q = k = v = g = beta = 0). Half as many
  /// dependent steps as the one-chunk pass; the bf16 operand roundings differ from it (o, S_final within the
  /// ~1e-3 class of the bf16 plan, not bit-identical; at T <= 16 the same operations as the one-chunk pass plus
  /// exact zero terms, so expected identical there). Source: the pair
  /// specification (bench/NOTES.md "KDA pair step (kernel)"); the twin runs the same algorithm
  /// (KdaTwinPlan::pair_chunks). Workspace: KdaPairSlot per (pair, value head).
  /// Supported in this first version: D = 128, fixed-length batches and cu_seqlens (pairs per sequence =
  /// ceil(len / 32)), S0 / S_final, HV = group H, every fusion; the schedule is serial (one pair prepare
  /// kernel, then one pair state pass: overlap_segments, overlap_segment_pass and compact_workspace are
  /// ignored; run_phases 1 / 2 / 3 time the two kernels). Errors (kdalab::Error naming pair_chunks and the
  /// value): D != 128, segment_state >= 2, state_variant != 3, prepare_variant != 6.
  bool pair_chunks = false;
};

/// Layout of one pair workspace slot (KdaPrefillArgs::pair_chunks; two 16-token chunks c = 2p, c + 1 of one
/// value head, D = 128), byte offsets from the slot start; the slot of (pair p, value head hv, sequence n)
/// starts at ((pslot0 + p) HV + hv) KdaPairSlot::bytes, pslot0 = n ceil(T / 32) for fixed-length batches
/// (n + cu_seqlens[n] / 32 with cu_seqlens). Rows 0..15 belong to chunk c, rows 16..31 to chunk c + 1.
///   W2, Qg2 [32 x 128]: bf16 A fragments of mma.m16n8k16, uint4 per (m-tile mt, k-tile kt, lane) at index
///     (mt 8 + kt) 32 + lane, each m-tile in KdaSlot's W / Qg fragment order (mt 0 = W_c / Qg_c, mt 1 = Wb / Qb);
///   Kd2 [32 x 128]: bf16 B fragments (k = pair row), uint4 per (k-step ks, n-pair kt, lane) at
///     (ks 8 + kt) 32 + lane, each k-step in KdaSlot's Kd order (ks 0 = Kt, ks 1 = Kd_{c+1});
///   U2 [32][128] fp32 (rows 0..15 U_c, 16..31 Ub);
///   Pf2: P2's three non-zero 16 x 16 blocks as bf16 hi + lo A fragments, block b at Pf2 + 1024 b (hi: 32
///     uint4, then lo: 32 uint4, KdaSlot::Pf's order): b = 0 P_c (rows 0..15, cols 0..15), b = 1 Pbl (rows
///     16..31, cols 0..15, full block), b = 2 P_{c+1} (rows 16..31, cols 16..31); the zero block is not stored;
///   gam_n2 [128] fp32 = gam_n(c) gam_n(c + 1).
/// W2, Qg2, Kd2 are adjacent (the state pass copies them as one block). 44,544 B (two KdaSlot: 46,080 B).
struct KdaPairSlot {
  static constexpr int W2 = 0, Qg2 = 8192, Kd2 = 16384, U2 = 24576, Pf2 = 40960, gam_n2 = 44032, bytes = 44544;
};

/// Layout of one workspace slot (one 16-token chunk of one value head) for d_k = d_v = D, byte offsets
/// from the slot start; the slot of (chunk c, value head hv, sequence n) starts at ((slot0 + c) HV + hv)
/// KdaSlotOf<D>::bytes, slot0 = n ceil(T / 16) for fixed-length batches (n + cu_seqlens[n] / 16 with
/// cu_seqlens). W, Qg [16 x D] and P hi / lo (Pf, [16 x 16]): bf16 A fragments of mma.m16n8k16 (uint4 per
/// (k-tile kt, lane), kt = 0 .. D / 16 - 1); Kd [16 x D]: bf16 B fragments (k = chunk row); U [16][D] fp32;
/// P [16][16] fp32 (written only for state_variant 2 or compact_workspace = false); gam_n [D] fp32.
/// W, Qg, Kd are adjacent (the state pass copies them as one block). Sizes: D = 64: 12,544 B; D = 128:
/// 23,040 B (the original layout, unchanged); D = 256: 44,032 B. For tests and diagnostics.
template <int D>
struct KdaSlotOf {
  static_assert(D == 64 || D == 128 || D == 256, "KdaSlotOf: D = d_k = d_v must be 64, 128 or 256");
  static constexpr int W = 0, Qg = 32 * D, Kd = 64 * D, U = 96 * D, P = 160 * D, gam_n = 160 * D + 1024,
                       Pf = 164 * D + 1024, bytes = 164 * D + 2048;
};
/// The D = 128 slot (the layout before D became a parameter).
struct KdaSlot : KdaSlotOf<128> {};
static_assert(KdaSlot::W == 0 && KdaSlot::Qg == 4096 && KdaSlot::Kd == 8192 && KdaSlot::U == 12288 &&
                  KdaSlot::P == 20480 && KdaSlot::gam_n == 21504 && KdaSlot::Pf == 22016 && KdaSlot::bytes == 23040,
              "the D = 128 slot layout must not change");
/// KdaSlotOf<D>::bytes for a run-time D in {64, 128, 256}; 0 for any other D.
constexpr int kda_slot_bytes(int D) { return D == 64 || D == 128 || D == 256 ? 164 * D + 2048 : 0; }

/// Bytes of device scratch the prefill needs for these shapes (checks the shapes too).
std::size_t kda_prefill_workspace_bytes(const KdaPrefillArgs& a);

/// The number of segments the v5 segment-parallel state pass will use for these arguments on the
/// current device (1 = the one-shot state pass; see KdaPrefillArgs::segment_state). Reads only the
/// shapes and options (no pointer checks; kda_prefill checks everything). Errors: kdalab::Error for
/// T, B or HV < 1.
int kda_prefill_segments(const KdaPrefillArgs& a);

/// The state pass kda_prefill will run for these arguments on the current device: 2 .. 6 as
/// KdaPrefillArgs::state_variant, except that the auto rule (segment_state = 0, state_variant = 3, D = 128) returns
/// 6 where it takes the one-shot wgmma pass (one-shot plans and 2- or 3-segment plans; see state_variant). D = 256:
/// 3 (its state pass is the key-split kernel under that name). Reads only the shapes and options; errors as
/// kda_prefill_segments.
int kda_prefill_state_kernel(const KdaPrefillArgs& a);

/// Chunked prefill: o and (optionally) S_final from q, k, v, g, beta (and S0). Asynchronous on
/// `stream` (with overlap_segments it forks to a side stream and joins back with events; turn it
/// off for CUDA-graph capture). T need not be a multiple of 16. Errors: kdalab::Error (see file
/// comment), before anything is launched.
void kda_prefill(const KdaPrefillArgs& a, cudaStream_t stream);

/// Arguments of the decode step: one token per sequence, B sequences, state updated in place.
struct KdaDecodeArgs {
  int B = 0, H = 0, HV = 0, D = 128;          ///< D = d_k = d_v: 64, 128 or 256
  const bf16_t *q = nullptr, *k = nullptr;   ///< [B, H, D]
  const bf16_t *v = nullptr, *g = nullptr;   ///< [B, HV, D]
  const bf16_t* beta = nullptr;              ///< [B, HV]
  KdaGate gate;
  float scale = 0.0f;
  bool l2norm_qk = true, beta_sigmoid = true;
  float* state = nullptr;                    ///< [B, HV, D, D] fp32, in place (the prefill's S_final layout)
  bf16_t* o = nullptr;                       ///< [B, HV, D]
  std::int64_t sq_b = 0, sk_b = 0, sv_b = 0, sg_b = 0, so_b = 0, sbeta_b = 0;  ///< batch strides (0 = contiguous)
};

/// One decode step (no allocation, no host synchronisation: capturable in a CUDA graph).
/// Errors: kdalab::Error (see file comment), before anything is launched.
void kda_decode(const KdaDecodeArgs& a, cudaStream_t stream);

/// Throws kdalab::Error with the CUDA message when e != cudaSuccess; `what` names the call.
void cuda_check(cudaError_t e, const char* what);

}  // namespace kdalab::kernels
