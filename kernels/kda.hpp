#pragma once
/// KDA (Kimi Delta Attention) CUDA kernels for sm_90a: chunked prefill and the decode step.
/// A plain host API: device pointers, shapes, strides in elements, a cudaStream_t. No Eigen, no torch.
///
/// Math (K3 report Eq. 1 and Eq. 5; docs/equations.md section 1), per value head, state S (d_k x d_v,
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
/// D = d_k = d_v in {64, 128, 256} (a template parameter of every kernel). D = 64: the kernels of D = 128 with half
/// the key / value tiles (the mma state pass). D = 256: the state pass is the key-split kernel (2 warps per 16 value
/// columns, 64 fp32 of S per thread; the one-warp-per-16-columns mma step would hold 128 and spill) and the segment
/// path is not taken (its d_k x d_k A_seg combine does not fit shared memory). kda_prefill_plan states the rule;
/// kernels and measurements: kernels/kda_prefill/, docs/kernels/kda_prefill.md.
/// Errors: every check throws kdalab::Error naming the argument, its value and what is accepted
/// (unsupported D, misaligned pointers, T = 0, g_min outside [-5, 0), HV not a multiple of H, ...).
/// CUDA errors (launch or runtime) also throw kdalab::Error with the CUDA message.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/common/cuda_check.hpp"
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

/// The precision of the prefill's three d_k x d_v state products (W S, Qg S, Kd^T D; numerics/kda_twin.hpp,
/// docs/kernels/kda_prefill.md "State-product precision").
enum class KdaPrecision {
  fast,      ///< bf16 operands, fp32 accumulation (kda_plan_kernel()): ~1.7e-3 relative RMS of o on the anchor
             ///< distribution (the bf16 output floor is ~1.66e-3), but it grows where the state remembers long
             ///< (slow decay, small beta: 3.5e-3 at T = 8192) and on repeated keys; any D
  accurate,  ///< fp16 operands in the three products (11 significant bits at bf16's tensor-core cost), Kd in Kd^T D
             ///< as fp16 hi + lo (two products; lo stored as e4m3, widened exactly), the state, U and D carried
             ///< scaled by a power of two for fp16's range (kda_plan_state_f16()): o <= 1.7e-3 and the final state <= 1e-3 on every input kind of
             ///< numerics/kda_inputs.hpp up to T = 65536 in the twin. Range: S may grow to ~2^15 times the largest
             ///< |U| of the last kda_value_scale_period chunks (or its own largest value) before fp16 overflows (Inf,
             ///< then NaN in o); values more than ~2^14 below the largest of their chunk or of a state that has not
             ///< yet decayed lose bits in fp16's subnormals (a 2^24 outlier filling one of the last chunks, or
             ///< the only one, costs the final state its accuracy; docs/kernels/kda_prefill.md, "What the scale
             ///< still cannot hold"). D = 128 only (the wgmma state pass, one-shot schedule); its workspace adds
             ///< kda_slot_lo_bytes (2 KB) per 16-token chunk and value head (Kd's lo parts)
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
  /// true: every launch on `stream` itself, no side stream and no events created, e.g. for CUDA-graph capture (the
  /// side stream is created and destroyed inside the call). Same results; long fixed-length batches then run their
  /// prepare and state pass one after the other instead of overlapped (KdaPrefillPlan::overlapped).
  bool single_stream = false;
  KdaPrecision precision = KdaPrecision::fast;  ///< the state products' precision (see KdaPrecision)
};

/// The state pass of the prefill (kda_prefill_plan states which one runs). All three run the same step with the same
/// bf16 operand roundings and fp32 state (numerics/kda_twin.hpp); they differ in how the step maps onto the GPU, and
/// only the fp32 summation order inside the products may differ (o, S_final within tol::kda_state_wgmma_vs_mma of
/// the mma pass; the wgmma pass bit-identical to it on the tested shapes).
enum class KdaStatePass {
  automatic,  ///< the rule of kda_prefill_plan
  mma,        ///< one warp per 16 value columns on mma.sync, S (D / 2 fp32 per thread) in registers; D = 64, 128;
              ///< the only pass of the segment path
  key_split,  ///< the key dimension of S split over 2 warps per 16 value columns; D = 256 (the mma warp would spill)
  wgmma,      ///< one warpgroup per 64 value columns on wgmma (operands read from shared memory once per warpgroup);
              ///< D = 128, one-shot schedule
};

/// The schedule of the state pass.
enum class KdaSchedule {
  automatic,  ///< the rule of kda_prefill_plan
  one_shot,   ///< one pass over all chunks of each sequence
  segments,   ///< the segment-parallel pass (fixed-length batches, D = 64, 128, the mma state pass): the chunks cut into
              ///< P segments run in parallel from S = 0 and S = I, a combine scan, then a second parallel pass.
              ///< Up to ~2.5x the state work; pays where the one-shot pass leaves SMs idle. Not bit-identical to the
              ///< one-shot pass (the twin's KdaTwinPlan::segments models it). Workspace: + 3 (P-1) N HV D^2 fp32.
};

/// Which kernels of the prefill run (to time the prepare and the state pass apart).
enum class KdaPhases {
  both,     ///< the prefill
  prepare,  ///< the prepare kernel only (writes the workspace slots)
  state,    ///< the state pass only, on a workspace the prepare of the same plan has written
};

/// What benchmarks and tests force; kda_prefill without overrides (nullptr) runs the rule of kda_prefill_plan.
struct KdaPrefillOverrides {
  KdaStatePass state_pass = KdaStatePass::automatic;
  KdaSchedule schedule = KdaSchedule::automatic;
  int segments = 0;  ///< with schedule = segments: P in 2..64 (fewer when T has fewer chunks); else ignored
  KdaPhases phases = KdaPhases::both;
};

/// What kda_prefill runs for given arguments (and overrides) on the current device.
struct KdaPrefillPlan {
  KdaStatePass state_pass = KdaStatePass::mma;   ///< never automatic
  KdaSchedule schedule = KdaSchedule::one_shot;  ///< never automatic
  int segments = 1;                              ///< P of the segment path; 1 for the one-shot schedule
  /// One-shot schedule of a fixed-length batch with T >= 2048 (and not single_stream): the tokens run in
  /// min(8, max(2, T / 2048)) parts whose prepare overlaps the state pass of the part before (a side stream and
  /// events, joined back to `stream`; the state crosses parts through an fp32 buffer in the workspace, which is exact:
  /// the same results as one prepare then one state pass).
  bool overlapped = false;
  /// The overlapped schedule with the wgmma state pass where its CTAs fill at most half the SMs (2 N HV D / 64 <=
  /// SMs; e.g. B = 1, H <= 33): each state CTA asks for a whole SM's shared memory, so that no prepare CTA of a later
  /// part runs beside it and slows its chunk-to-chunk chain; the prepare keeps the other SMs. Measured on the H100:
  /// 65536 x 32 fast -3%, accurate -8 .. -9%; where the state CTAs fill the GPU (8192 x 64: 128 CTAs) the same
  /// reservation costs +7%, and with 16 CTAs (32768 x 8, accurate) +2% (docs/kernels/kda_prefill.md, "The state
  /// pass's SMs reserved").
  bool state_sm_reserved = false;
  KdaPrecision precision = KdaPrecision::fast;   ///< the arguments' precision (accurate: the wgmma pass, one-shot)
};

/// Layout of one workspace slot (one 16-token chunk of one value head) for d_k = d_v = D, byte offsets
/// from the slot start; the slot of (chunk c, value head hv, sequence n) starts at ((slot0 + c) HV + hv)
/// KdaSlotOf<D>::bytes, slot0 = n ceil(T / 16) for fixed-length batches (n + cu_seqlens[n] / 16 with
/// cu_seqlens). W, Qg [16 x D] and P hi / lo (Pf, [16 x 16]): bf16 A fragments of mma.m16n8k16 (uint4 per
/// (k-tile kt, lane), kt = 0 .. D / 16 - 1); Kd [16 x D]: bf16 B fragments (k = chunk row); U [16][D] fp32;
/// P [16][16] fp32 (not written: a reserved 1 KB); gam_n [D] fp32. The wgmma state pass's slots (D = 128) hold W, Qg,
/// Kd and P hi / lo as row-major bf16 at the same offsets (fp16 in the accurate precision, below). W, Qg, Kd are adjacent (the state pass copies them as one
/// block). Sizes: D = 64: 12,544 B; D = 128: 23,040 B; D = 256: 44,032 B. For tests and diagnostics.
template <int D>
struct KdaSlotOf {
  static_assert(D == 64 || D == 128 || D == 256, "KdaSlotOf: D = d_k = d_v must be 64, 128 or 256");
  static constexpr int W = 0, Qg = 32 * D, Kd = 64 * D, U = 96 * D, P = 160 * D, gam_n = 160 * D + 1024,
                       Pf = 164 * D + 1024, bytes = 164 * D + 2048;
};
/// The D = 128 slot.
struct KdaSlot : KdaSlotOf<128> {};
static_assert(KdaSlot::W == 0 && KdaSlot::Qg == 4096 && KdaSlot::Kd == 8192 && KdaSlot::U == 12288 &&
                  KdaSlot::P == 20480 && KdaSlot::gam_n == 21504 && KdaSlot::Pf == 22016 && KdaSlot::bytes == 23040,
              "the D = 128 slot layout must not change");
/// The second region of one slot in the accurate precision (D = 128), after every other workspace region (slot s at
/// s * kda_slot_lo_bytes): Kd lo [16][128] e4m3 row-major, e4m3((x - rnd(x)) 2^kda_kd_lo_e4m3_shift) (numerics/kda_twin.hpp
/// KdaTwinPlan::kd_lo_e4m3; the state pass widens it to fp16 times 2^-shift, exactly); Kd's hi parts are in the slot's Kd
/// place, also fp16, as are its W and Qg). In that precision the first 4 bytes of the slot's P member (unused by every
/// schedule) hold the chunk's max |U| as fp32 bits, read by the state pass's value scale
/// (numerics/kda_twin.hpp KdaTwinPlan::value_scale).
constexpr int kda_slot_lo_bytes = 2048;
/// The scale of the stored Kd lo parts (numerics/kda_twin.hpp kda_kd_lo_e4m3_shift, the same number).
constexpr int kda_kd_lo_e4m3_shift = 12;
/// Chunks between the accurate state pass's looks at the maximum of its state, where its value scale may come down
/// (numerics/kda_twin.hpp KdaTwinPlan::value_scale, kda_value_scale_period, the same number); the overlapped
/// schedule's parts are whole multiples of it, so that they look where one pass over the sequence would.
constexpr int kda_value_scale_period = 8;
/// Binades by which the accurate state pass's scale exponent may exceed that of a chunk's max |U| before the next
/// chunk looks at the state as well (numerics/kda_twin.hpp kda_value_scale_slack, the same number): after an outlier
/// chunk, or a large S0, has decayed, the scale comes back down within a chunk or two instead of at the next periodic
/// look, so that later values keep fp16's bits; and so does the chunk after one, off the period's chunks, that raised
/// the exponent by more than this (an outlier arrived near the end of the sequence).
constexpr int kda_value_scale_slack = 8;
/// KdaSlotOf<D>::bytes for a run-time D in {64, 128, 256}; 0 for any other D.
constexpr int kda_slot_bytes(int D) { return D == 64 || D == 128 || D == 256 ? 164 * D + 2048 : 0; }

/// Bytes of device scratch the prefill needs for these shapes and the plan (checks the shapes too).
std::size_t kda_prefill_workspace_bytes(const KdaPrefillArgs& a, const KdaPrefillOverrides* overrides = nullptr);

/// The rule: the state pass and schedule kda_prefill runs for these arguments on the current device (SM count), with
/// `overrides` applied where given. Reads only the shapes and options (no pointer checks; kda_prefill checks
/// everything). The rule, with its measured reasons (H200; docs/kernels/kda_prefill.md, "v5 step 2: the
/// segment-parallel state pass", "The wgmma state pass (v9w ...)"):
///  - D = 256: the key-split pass, one-shot (the segment path's d_k x d_k combine does not fit shared memory).
///  - Fixed-length batches at D = 64, 128 whose one-shot pass leaves SMs idle (N HV D / 32 CTAs <= the SM count: each
///    CTA alone on its SM, latency-bound) with >= 1024 chunks (T >= 16384) take the segment path with the P (2..16)
///    of a wave model of the two passes when it predicts < 0.9 of the one-shot pass.
///  - D = 128: the wgmma pass, one-shot, wherever the wave model's P is 1, 2 or 3 (measured faster than the P = 2, 3
///    segment path: T = 65536, H = 32: 3.78 vs 4.36 ms); P >= 4 keeps the segment path with the mma pass (T = 65536,
///    H = 16: P = 9). D = 64: the mma pass, one-shot or the segment path.
/// Forcing (overrides): key_split needs D = 256, wgmma D = 128 and the one-shot schedule, the segment path D = 64 or
/// 128, no cu_seqlens and the mma pass; at D = 256 only key_split. Errors: kdalab::Error naming the override (and
/// for T, B or HV < 1, unsupported D).
KdaPrefillPlan kda_prefill_plan(const KdaPrefillArgs& a, const KdaPrefillOverrides* overrides = nullptr);

/// Chunked prefill: o and (optionally) S_final from q, k, v, g, beta (and S0). Asynchronous on `stream` (the overlapped
/// schedule forks to a side stream and joins back with events; single_stream keeps everything on `stream`). T need not
/// be a multiple of 16. `overrides` (benchmarks, tests) forces a state pass, schedule or phase; nullptr runs the rule
/// of kda_prefill_plan. Errors: kdalab::Error (see file comment), before anything is launched.
void kda_prefill(const KdaPrefillArgs& a, cudaStream_t stream, const KdaPrefillOverrides* overrides = nullptr);

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

}  // namespace kdalab::kernels
