// KDA prefill, the wgmma state pass (KdaStatePass::wgmma; D = 128, the automatic rule's one-shot pass).
//
// One CTA = one warpgroup (128 threads) per (64 value columns, value head, sequence); warp w holds S^T for value
// columns vbase + 16 w .. + 15 and all 128 keys, in the wgmma m64n128 accumulator layout, which is the mma pass's
// Sacc layout. Per chunk, with W, Qg, Kd, P (hi, lo) read by wgmma from shared memory ONCE per warpgroup (the mma
// pass: once per warp):
//   [1] D^T = S^T W^T and o^T = S^T Qg^T: 2 x 8 wgmma m64n16k16, A = S^T's bf16 k-tiles from registers (the mma
//       pass's accumulator-to-A identity), B = W^T / Qg^T K-major (the slot's row-major W, Qg copied into
//       128-byte-swizzled [16 x 64] blocks);
//   [2] D^T = U^T - that (fp32), hi / lo bf16 split (the mma pass's registers and roundings);
//   [3] S^T <- Diag(gam_n) S^T + D^T Kd: one wgmma m64n128k16, A = D^T hi (registers), B = Kd MN-major (transposed);
//       o^T += D^T P^T as Phi Dhi + Phi Dlo + Plo Dhi (3 wgmma m64n16k16, B = P^T K-major);
//   [4] o = scale o^T^T, stored through a lane-pair exchange (4-byte stores).
// The prepare writes this slot layout (kda_prepare_kernel<128, true>, prepare.cu: W, Qg, Kd [16][128] and P hi / lo
// [16][16] bf16 row-major at the same slot offsets); the same bf16 operand roundings and fp32 state as the mma pass:
// only the fp32 summation order inside the tensor-core products may differ.
// The accurate precision (KdaPrecision::accurate, kHiLo; numerics/kda_twin.hpp kda_plan_state_f16()): the same steps
// with fp16 operands in the three state products (the prepare writes W, Qg, Kd as fp16), S^T packed to fp16 for [1],
// D^T fp16 for [3], and [3]'s product twice, S^T += D^T Kd_hi + D^T Kd_lo (Kd lo in two fp16 blocks laid out as Kd's,
// widened in the step from the workspace's e4m3 lo region, 2 KB a chunk: 6 KB more per stage). The values are carried scaled: S^T, U and D hold sigma times their
// value, sigma = 2^-e: e raised to the exponent of each chunk's max |U| (the prepare's U-max word, copied with the
// stage) when larger, and every kda_value_scale_period chunks (chunk 0 included, from S0) set to the larger of that
// and the exponent of max |S| over the CTA's columns, which lowers it once large values have decayed (so is the chunk
// after one whose e exceeds its own max |U| exponent by more than kda_value_scale_slack, or, off the period's chunks,
// one that raised e by more than the slack); S^T rescaled when e changes;
// o and the final state divided by sigma (KdaTwinPlan::value_scale). P D keeps D's bf16 hi + lo.
#include <algorithm>

#include "kernels/common/wgmma.cuh"
#include "kernels/kda_prefill/common.cuh"

namespace kdalab::kernels::kda_prefill_detail {
namespace {

namespace wg {
constexpr int SLC = 64;                                  // value columns per CTA
constexpr int UP = SLC + 4;                              // fp32 row stride of the U tile (conflict-free transposed reads)
// W and Qg as one B operand [W; Qg]^T (N = 32): per 64-key block kb a swizzled [32 x 64] bf16 block at kb * 4096 (rows
// 0..15 W, 16..31 Qg); Kd: 2 swizzled [16 x 64] blocks (2048 B) at OFF_KD
constexpr int OFF_WQ = 0, OFF_KD = 8192;
constexpr int OFF_PH = 12288, OFF_PL = 14336;            // one swizzled [16 x 64] block each (columns 0..15 used)
// U [16][UP] fp32; gam_n: one 512-byte copy per warp (each warp copies the gam_n and the U columns it reads itself,
// so it reads them before the CTA's barrier)
// the accurate precision: the chunk's U-max word (16 bytes copied from the slot's P member) per warp at OFF_MU
constexpr int OFF_U = 16384, OFF_GN = OFF_U + C * UP * 4, OFF_MU = OFF_GN + 4 * 512,
              STAGE = (OFF_MU + 4 * 16 + 1023) / 1024 * 1024;
// the accurate precision's Kd lo: two swizzled [16 x 64] fp16 blocks (Kd's layout), widened in the step from the e4m3
// bytes copied to OFF_K8 ([16][128] row-major, 2 KB)
constexpr int OFF_KL = STAGE, OFF_K8 = STAGE + 4096, STAGE_HL = STAGE + 4096 + 2048;
template <bool kHiLo>
constexpr int stage_bytes = kHiLo ? STAGE_HL : STAGE;
template <bool kHiLo>
constexpr int smem_bytes = NST * stage_bytes<kHiLo> + 1024;  // + slack to align the base to 1024 bytes
static_assert(STAGE == 23552 && smem_bytes<true> <= 227 * 1024, "wgmma state stage");

// the 128-byte swizzle, descriptor, fence / commit / wait helpers: kernels/common/wgmma.cuh
using wgmma_util::desc;
using wgmma_util::fence_async_smem;
using wgmma_util::fence_reg;
using wgmma_util::sw;
using wgmma_util::wgmma_commit;
using wgmma_util::wgmma_fence;
using wgmma_util::wgmma_wait;

// D[64 x 16] / D[64 x 32] (+)= A B with A from registers, B K-major in shared memory (ACC = 0: D = A B) and
// D[64 x 128] += A B with B MN-major: kernels/common/wgmma.cuh
using wgmma_util::mma_n16;
using wgmma_util::mma_n32;
using wgmma_util::mma_n128_t;  // D[64 x 128] += A B, A in registers, B MN-major (kernels/common/wgmma.cuh)
/// The value scale's exponent x of m (fp32 bits of a non-negative float, the largest |value|): m = f 2^x with f in
/// [0.5, 1), clamped to [-125, 126]; m = 0 and subnormal m give -125 (numerics/kda_twin.hpp KdaTwinPlan::value_scale).
__device__ __forceinline__ int value_exp(std::uint32_t m) {
  return min(max(static_cast<int>(m >> 23) - 126, -125), 126);
}
/// 2^k as a float for k in [-126, 127].
__device__ __forceinline__ float exp2i(int k) { return __int_as_float((127 + k) << 23); }

/// 8-byte cp.async (through L1: .cg takes only 16 bytes) to a shared-window address.
__device__ __forceinline__ void cp8(std::uint32_t sdst, const void* gsrc) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(sdst), "l"(gsrc));
}
/// 16-byte cp.async to a shared-window address (the state pass keeps its stage addresses as 32-bit shared addresses:
/// no generic-to-shared conversion and no 64-bit arithmetic per copy in the step).
__device__ __forceinline__ void cp16(std::uint32_t sdst, const void* gsrc) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sdst), "l"(gsrc));
}
/// Thread tid's share of copying one chunk's slot (the wgmma layout) into a stage, as offsets computed once per thread:
/// destinations from the stage's shared address, sources from the slot's first byte. Per stage, 10 copies of 16 B:
/// W, Qg, Kd (6: q = tid + 128 k, slot bytes 16 q, row r = tid / 16 + 8 (k & 1), 16-byte chunk c = tid % 16 of the
/// 128-byte-swizzled blocks: [W; Qg] k < 4, Kd k = 4, 5), P hi / lo (tid < 64), U (2: lane = 4 r + c4 copies rows
/// r, r + 8, columns 16 warp + 4 c4 .. + 3: the warp's own 16 value columns), gam_n (one 16-byte part per lane into the
/// warp's own 512-byte copy).
struct CopyPlan {
  std::uint32_t d_wq, d_kd, d_p, d_u, d_g, d_kl, d_k8, d_mu;  // shared offsets from the stage base (d_kl, d_k8: Kd lo)
  std::uint32_t s_wqk, s_p, s_u, s_g;             // byte offsets into the slot (s_wqk also into the lo slot)
  __device__ __forceinline__ CopyPlan(int tid, int vbase) {
    using SL = Slot<128>;
    const int r = tid / 16, c = tid % 16;
    const std::uint32_t x = r * 128 + (((c % 8) ^ r) << 4);  // sw(r, c % 8); r < 8, so r & 7 = r
    d_wq = (c / 8) * 4096 + x;
    d_kd = OFF_KD + (c / 8) * 2048 + x;
    d_kl = OFF_KL + (c / 8) * 2048 + x;
    d_k8 = OFF_K8 + 8 * tid;
    const int h = (tid / 32) & 1, pr = (tid % 32) / 2, pc = tid % 2;
    d_p = (h ? OFF_PL : OFF_PH) + sw(pr, pc);
    const int warp = tid / 32, lane = tid % 32, ur = lane / 4, uc = 16 * warp + 4 * (lane % 4);
    d_u = OFF_U + (ur * UP + uc) * 4;
    d_g = OFF_GN + 512 * warp + 16 * lane;
    d_mu = OFF_MU + 16 * warp;
    s_wqk = 16 * tid;
    s_p = SL::Pf + 16 * (tid % 64);
    s_u = SL::U + (ur * 128 + vbase + uc) * 4;
    s_g = SL::gam_n + 16 * lane;
  }
  /// The copies of one chunk (slot) into the stage at shared address st (no commit).
  __device__ __forceinline__ void issue(std::uint32_t st, const unsigned char* slot, int tid) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) cp16(st + d_wq + (k / 2) * 2048 + (k & 1) * 1024, slot + s_wqk + 2048 * k);
#pragma unroll
    for (int k = 4; k < 6; ++k) cp16(st + d_kd + (k & 1) * 1024, slot + s_wqk + 2048 * k);
    if (tid < 64) cp16(st + d_p, slot + s_p);
#pragma unroll
    for (int k = 0; k < 2; ++k) cp16(st + d_u + k * 8 * UP * 4, slot + s_u + k * 8 * 128 * 4);
    cp16(st + d_g, slot + s_g);
  }
  /// The accurate precision's copies: Kd lo's e4m3 bytes from the lo slot (the 8 values of rows 0..7 and of rows 8..15
  /// whose fp16 parts this thread's d_kl places hold: 2 of 8 B per thread) and the U-max word from the slot (16 B by
  /// lane 0 into its warp's own place).
  __device__ __forceinline__ void issue_lo(std::uint32_t st, const unsigned char* lo, const unsigned char* slot,
                                           int lane) const {
#pragma unroll
    for (int k = 0; k < 2; ++k) cp8(st + d_k8 + k * 1024, lo + s_wqk / 2 + 1024 * k);
    if (lane == 0) cp16(st + d_mu, slot + Slot<128>::P);
  }
  /// Kd lo widened in the stage at st (after this thread's own copies have landed, before the CTA's barrier): each
  /// e4m3 value times 2^-kda_kd_lo_e4m3_shift as fp16, exact, into its place of the swizzled fp16 blocks.
  __device__ __forceinline__ void widen_lo(unsigned char* st, std::uint32_t st_a) const {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint2 b = *reinterpret_cast<const uint2*>(st + d_k8 + k * 1024);
      const std::uint32_t w[2] = {b.x, b.y};
      std::uint32_t h[4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h[2 * j]) : "h"(static_cast<std::uint16_t>(w[j] & 0xffffu)));
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h[2 * j + 1]) : "h"(static_cast<std::uint16_t>(w[j] >> 16)));
      }
      constexpr std::uint32_t sc = (15u - kda_kd_lo_e4m3_shift) << 10;  // fp16 2^-shift
#pragma unroll
      for (int e = 0; e < 4; ++e) asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(h[e]) : "r"(sc | (sc << 16)));
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(st_a + d_kl + k * 1024), "r"(h[0]), "r"(h[1]),
                   "r"(h[2]), "r"(h[3])
                   : "memory");
    }
  }
};
}  // namespace wg

// The step's code shape, from an ncu source profile (T = 65536, H = 32: 409 -> ~330 instructions per warp-step, one
// warp per scheduler; docs/kernels/kda_prefill.md, "v10w: the wgmma step rearranged"): (1) the wgmma descriptors are
// formed once (a stage or block offset adds to the start-address field; rebuilding each from the address put 5
// dependent uniform instructions before each of the 8 chained wgmma, ~13% of the stall samples); (2) the stage is
// addressed from the shared array itself, so U and gam_n are read by LDS (generic LD.E's long scoreboard held 5.5% of
// the samples); each warp copies the gam_n and U values it reads itself and reads them before the CTA's barrier (step
// 2); (3) the copies and the o stores use offsets computed once per thread (else ~95 and ~50 instructions of 64-bit
// address arithmetic per step). (Storing chunk c's o during chunk c + 1's chain, or the decay there, is not possible:
// ptxas then injects a wgmma wait right after the chain's issue, see the note at the decay.)
template <bool kHiLo>
__global__ void __launch_bounds__(128) kda_state_wg_kernel(Params p) {
  constexpr int D = 128;
  using SL = Slot<D>;
  const int hv = blockIdx.y, n = blockIdx.z, vbase = blockIdx.x * wg::SLC;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
  const Seq sq = seq_info(p, n);
  const int nch = (sq.len + C - 1) / C;
  const int v0 = vbase + warp * 16;  // this warp's 16 value columns

  // the stages from a 1024-byte aligned offset of the shared array (pointer arithmetic on the array keeps the shared
  // state space visible to the compiler: LDS, not generic loads)
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  const std::uint32_t raw_a = static_cast<std::uint32_t>(__cvta_generic_to_shared(dyn_smem));
  const std::uint32_t pad = (1024u - (raw_a & 1023u)) & 1023u;
  unsigned char* const sbase = dyn_smem + pad;
  const std::uint32_t sbase_a = raw_a + pad;

  // S^T accumulators (wgmma m64n128 layout = the mma pass's): Sacc[4 j + e] = S[8 j + 2 tq + (e & 1)][v0 + gq + 8 (e >> 1)]
  float Sacc[64];
  const long long sb = (static_cast<long long>(n) * p.HV + hv) * D * D;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      Sacc[4 * j + e] = p.S0 ? p.S0[sb + (8 * j + 2 * tq + (e & 1)) * D + v0 + gq + 8 * (e >> 1)] : 0.0f;
  // the accurate precision's value scale: S^T holds sigma S^T, sigma = 2^-ex (0 until chunk 0 sets it). smax: each
  // warp's max |S^T| (fp32 bits), taken before the chunks that are multiples of kda_value_scale_period (here for
  // chunk 0, from S0) and read after that chunk's barrier
  int ex = 0;
  float sig = 1.0f, oscale = p.scale;  // sigma, and scale / sigma for o
  __shared__ std::uint32_t smax[kHiLo ? 4 : 1];
  const auto take_smax = [&] {
    std::uint32_t m = 0;
#pragma unroll
    for (int e = 0; e < 64; ++e) m = max(m, __float_as_uint(fabsf(Sacc[e])));
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0) smax[warp] = m;
  };
  if constexpr (kHiLo) take_smax();

  const long long slot_stride = static_cast<long long>(p.HV) * SL::bytes;
  const unsigned char* slot_next = p.ws + (static_cast<long long>(sq.slot0) * p.HV + hv) * SL::bytes;
  constexpr int STG = wg::stage_bytes<kHiLo>;
  const long long lo_stride = static_cast<long long>(p.HV) * kda_slot_lo_bytes;
  const unsigned char* lo_next =
      kHiLo ? p.ws_lo + (static_cast<long long>(sq.slot0) * p.HV + hv) * kda_slot_lo_bytes : nullptr;
  const wg::CopyPlan cpl(tid, vbase);
#pragma unroll
  for (int i = 0; i < NST - 1; ++i) {
    if (i < nch) {
      cpl.issue(sbase_a + i * STG, slot_next, tid);
      if constexpr (kHiLo) cpl.issue_lo(sbase_a + i * STG, lo_next, slot_next, lane);
    }
    cp_async_commit();
    slot_next += slot_stride;
    if constexpr (kHiLo) lo_next += lo_stride;
  }
  // descriptors of stage 0 (start address >> 4 in the low 14 bits; the shared window is below 2^18 bytes, so adding a
  // stage or block offset >> 4 to the low word never carries into the next field): low words, one shared high word
  const std::uint64_t dwq0 = wg::desc(sbase_a + wg::OFF_WQ, 16, 1024);
  const std::uint32_t hi_k = static_cast<std::uint32_t>(dwq0 >> 32);  // sbo 1024, 128-byte swizzle
  const std::uint32_t lo_wq = static_cast<std::uint32_t>(dwq0);
  const std::uint32_t lo_kd = static_cast<std::uint32_t>(wg::desc(sbase_a + wg::OFF_KD, 2048, 1024));
  const std::uint32_t lo_ph = static_cast<std::uint32_t>(wg::desc(sbase_a + wg::OFF_PH, 16, 1024));
  const std::uint32_t lo_pl = static_cast<std::uint32_t>(wg::desc(sbase_a + wg::OFF_PL, 16, 1024));
  // the accurate precision: Kd lo (MN-major, as Kd)
  const std::uint32_t lo_kl = static_cast<std::uint32_t>(wg::desc(sbase_a + wg::OFF_KL, 2048, 1024));
  auto dsc = [hi_k](std::uint32_t lo) { return (static_cast<std::uint64_t>(hi_k) << 32) | lo; };

  // o: this thread's rows 2 tq + odd (+ 8) and columns v0 + (gq & ~1) (+ 8) of each chunk, as 4-byte bf16 pairs
  const bool odd = gq & 1;
  const int orow = 2 * tq + (odd ? 1 : 0);
  bf16_t* o_next = p.o + sq.bidx * p.so.b + static_cast<long long>(sq.bos) * p.so.t + hv * p.so.h +
                   static_cast<long long>(orow) * p.so.t + v0 + (gq & ~1);
  const long long o8 = 8 * p.so.t, o_chunk = C * p.so.t;
  int s_cur = 0;
  bool look = false;  // the accurate precision: chunk c looks at max |S| off the period (kda_value_scale_slack)
  for (int c = 0; c < nch; ++c) {
    cp_async_wait<NST - 2>();
    const int s_next = s_cur == 0 ? NST - 1 : s_cur - 1;
    const unsigned char* const st = sbase + s_cur * STG;
    if constexpr (kHiLo) cpl.widen_lo(sbase + s_cur * STG, sbase_a + s_cur * STG);
    const std::uint32_t so = (s_cur * STG) >> 4;  // the stage's offset in descriptor units
    // this warp's gam_n and U^T (its own copies: visible to the warp after its wait and a __syncwarp), read before the
    // CTA's barrier so that their latency runs under it
    __syncwarp();
    float2 g2[16];
    {
      const float* gn = reinterpret_cast<const float*>(st + wg::OFF_GN + 512 * warp);
#pragma unroll
      for (int j = 0; j < 16; ++j) g2[j] = *reinterpret_cast<const float2*>(&gn[8 * j + 2 * tq]);
    }
    float u[8];
    {
      const float* U = reinterpret_cast<const float*>(st + wg::OFF_U);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) u[4 * nt + e] = U[(8 * nt + 2 * tq + (e & 1)) * wg::UP + warp * 16 + gq + 8 * (e >> 1)];
    }
    // the CTA's barrier: every thread's W, Qg, Kd, P copies of this chunk, for the wgmma
    const auto barrier = [] {
      wg::fence_async_smem();
      __syncthreads();
    };
    // the accurate precision's value scale (CTA-uniform): the exponent of this chunk's max |U| (the warp's own copy,
    // read before the barrier), and every kda_value_scale_period chunks that of max |S| (smax, written by every warp at
    // the end of the last step: read after the barrier), which may lower it; S^T rescaled by the change
    const auto rescale_to = [&](int xn) {
      if (xn != ex) {  // S^T times 2^(ex - xn), in two exact halves (each within fp32's exponents)
        const int dx = ex - xn;
        const float r1 = wg::exp2i(dx / 2), r2 = wg::exp2i(dx - dx / 2);
#pragma unroll
        for (int e = 0; e < 64; ++e) Sacc[e] = Sacc[e] * r1 * r2;
        ex = xn;
        sig = wg::exp2i(-ex);
        oscale = p.scale * wg::exp2i(ex);
      }
    };
    // ---- [1] D^T and o^T's Qg part: one m64n32 chain over [W; Qg]^T, A = S^T's bf16 (fp16) k-tiles ----
    const auto pack = [](float a, float b) { return kHiLo ? pack_f16(a, b) : pack_bf16(a, b); };
    std::uint32_t as[8][4];
    // the A k-tiles from S^T, then the decay of S^T: ptxas injects a wgmma wait before any access to a wgmma
    // accumulator register (Sacc, ot) while a wgmma is pending, so nothing of S^T or o^T can run in the chain's
    // shadow: it runs before the chain is issued (the chain reads the packed copy, undecayed)
    const auto pack_and_decay = [&] {
#pragma unroll
      for (int kt = 0; kt < 8; ++kt) {
        as[kt][0] = pack(Sacc[8 * kt + 0], Sacc[8 * kt + 1]);
        as[kt][1] = pack(Sacc[8 * kt + 2], Sacc[8 * kt + 3]);
        as[kt][2] = pack(Sacc[8 * kt + 4], Sacc[8 * kt + 5]);
        as[kt][3] = pack(Sacc[8 * kt + 6], Sacc[8 * kt + 7]);
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float2 g = g2[j];
        Sacc[4 * j + 0] *= g.x;
        Sacc[4 * j + 1] *= g.y;
        Sacc[4 * j + 2] *= g.x;
        Sacc[4 * j + 3] *= g.y;
      }
    };
    if constexpr (kHiLo) {
      // a chunk without the look at max |S| scales, packs and decays before the barrier, as the fast precision's
      // code does (ptxas moves register work above the barrier there, but not past the value scale's branch)
      const int xu = wg::value_exp(*reinterpret_cast<const std::uint32_t*>(st + wg::OFF_MU + 16 * warp));
      const int ex_in = ex;
      const bool period = c % kda_value_scale_period == 0;
      if (period || look) {
        barrier();
        const std::uint32_t m = max(max(smax[0], smax[1]), max(smax[2], smax[3]));  // of sigma S: exponent + ex
        rescale_to(max(xu, m == 0 ? -125 : min(max(static_cast<int>(m >> 23) - 126 + ex, -125), 126)));
        pack_and_decay();
      } else {
        rescale_to(max(xu, ex));
        pack_and_decay();
        barrier();
      }
      // the next chunk looks when the scale sits more than the slack above this chunk's U, or (off the period's
      // chunks, where a part of the overlapped schedule starts from ex = 0) when this chunk raised it by more than the
      // slack. The same value in every thread; taken through a vote so that ptxas sees a warp-uniform branch and keeps
      // the step's wgmma descriptors in uniform registers (a plain compare cost the state pass 5.5% at 65536 x 32)
      look = __any_sync(0xffffffffu, ex > xu + kda_value_scale_slack || (!period && ex > ex_in + kda_value_scale_slack));
    } else {
      barrier();
      pack_and_decay();
    }
    float dq[16];  // dq[0..7] = S^T W^T (r = 0..15), dq[8..15] = S^T Qg^T; written by the first wgmma
    wg::wgmma_fence();
    wg::mma_n32<0, kHiLo>(dq, as[0], dsc(lo_wq + so));
#pragma unroll
    for (int kt = 1; kt < 8; ++kt)
      wg::mma_n32<1, kHiLo>(dq, as[kt], dsc(lo_wq + so + ((kt / 4) * 4096 + (kt % 4) * 32) / 16));
    wg::wgmma_commit();
    wg::wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < 16; ++e) wg::fence_reg(dq[e]);
    float ot[8];  // o^T (a copy: accumulating the P D wgmma onto dq[8..15] in place makes ptxas serialise every wgmma
                  // for lack of registers (C7511); the copy costs one injected warpgroup.arrive, as with descriptors rebuilt per wgmma)
#pragma unroll
    for (int e = 0; e < 8; ++e) ot[e] = dq[8 + e];
    // ---- [2] D^T = U^T - S^T W^T (dq[4 nt + e]: v = gq + 8 (e >> 1), r = 8 nt + 2 tq + (e & 1)), hi / lo ----
    float d[8];  // (the accurate precision: sigma U^T - S^T W^T, sigma U exact)
#pragma unroll
    for (int e = 0; e < 8; ++e) d[e] = kHiLo ? fmaf(sig, u[e], -dq[e]) : u[e] - dq[e];
    std::uint32_t ad[4], adl[4], ad16[kHiLo ? 4 : 1];
    if constexpr (kHiLo)
#pragma unroll
      for (int e = 0; e < 4; ++e) ad16[e] = pack_f16(d[2 * e], d[2 * e + 1]);
    split_bf16(d[0], d[1], ad[0], adl[0]);
    split_bf16(d[2], d[3], ad[1], adl[1]);
    split_bf16(d[4], d[5], ad[2], adl[2]);
    split_bf16(d[6], d[7], ad[3], adl[3]);
    // ---- [3] S^T <- Diag(gam_n) S^T + D^T Kd; o^T += D^T P^T (Phi Dhi + Phi Dlo + Plo Dhi) ----
    wg::wgmma_fence();
    if constexpr (kHiLo) {
      wg::mma_n128_t<true>(Sacc, ad16, dsc(lo_kd + so));
      wg::mma_n128_t<true>(Sacc, ad16, dsc(lo_kl + so));
    } else {
      wg::mma_n128_t(Sacc, ad, dsc(lo_kd + so));
    }
    wg::mma_n16(ot, ad, dsc(lo_ph + so));
    wg::mma_n16(ot, adl, dsc(lo_ph + so));
    wg::mma_n16(ot, ad, dsc(lo_pl + so));
    wg::wgmma_commit();
    // the next chunk's copies (into the stage of chunk c - 1: every wgmma that read it was waited for in step c - 1,
    // and every thread is past this step's barrier)
    if (c + NST - 1 < nch) {
      cpl.issue(sbase_a + s_next * STG, slot_next, tid);
      if constexpr (kHiLo) cpl.issue_lo(sbase_a + s_next * STG, lo_next, slot_next, lane);
    }
    cp_async_commit();
    slot_next += slot_stride;
    if constexpr (kHiLo) lo_next += lo_stride;
    wg::wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < 64; ++e) wg::fence_reg(Sacc[e]);
#pragma unroll
    for (int e = 0; e < 8; ++e) wg::fence_reg(ot[e]);
#pragma unroll
    for (int kt = 0; kt < 8; ++kt)
#pragma unroll
      for (int e = 0; e < 4; ++e) wg::fence_reg(as[kt][e]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      wg::fence_reg(ad[e]);
      wg::fence_reg(adl[e]);
      if constexpr (kHiLo) wg::fence_reg(ad16[e]);
    }
    if constexpr (kHiLo)
      if ((c + 1) % kda_value_scale_period == 0 || look) take_smax();  // for chunk c + 1's value scale
    // ---- [4] o rows 8 nt + 2 tq (+ 1), columns v0 + gq (+ 8): lane pairs (gq, gq ^ 1) exchange so that the even-gq
    // lane stores row 8 nt + 2 tq and the odd one row 8 nt + 2 tq + 1, each as (v, v + 1) bf16 pairs ----
    const int nvalid = min(C, sq.len - c * C);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int vh = 0; vh < 2; ++vh) {
        const float x0 = oscale * ot[4 * nt + 2 * vh], x1 = oscale * ot[4 * nt + 2 * vh + 1];  // rows r0, r0 + 1
        const float recv = __shfl_xor_sync(0xffffffffu, odd ? x0 : x1, 4);
        const std::uint32_t val = odd ? pack_bf16(recv, x1) : pack_bf16(x0, recv);
        if (8 * nt + orow < nvalid) *reinterpret_cast<std::uint32_t*>(o_next + nt * o8 + 8 * vh) = val;
      }
    o_next += o_chunk;
    s_cur = s_cur == NST - 1 ? 0 : s_cur + 1;
  }
  if (p.S_final) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        p.S_final[sb + (8 * j + 2 * tq + (e & 1)) * D + v0 + gq + 8 * (e >> 1)] = kHiLo ? Sacc[4 * j + e] * wg::exp2i(ex)
                                                                                       : Sacc[4 * j + e];
  }
}
}  // namespace

template <bool kHiLo>
void launch_wg(const Params& p, int HV, int N, cudaStream_t stream, bool reserve_sm) {
  int smem = wg::smem_bytes<kHiLo>;
  if (reserve_sm) {  // the SM's whole shared memory less the static smax words and a margin: no other CTA fits
    int dev = 0, optin = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
    smem = std::max(smem, optin - 1024);
  }
  cuda_check(cudaFuncSetAttribute(kda_state_wg_kernel<kHiLo>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute(kda_state_wg_kernel)");
  kda_state_wg_kernel<kHiLo><<<dim3(128 / wg::SLC, HV, N), 128, smem, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_state_wg_kernel launch");
}

void launch_state_wgmma(const Params& p, int HV, int N, cudaStream_t stream, bool reserve_sm) {
  if (p.ws_lo) launch_wg<true>(p, HV, N, stream, reserve_sm);
  else launch_wg<false>(p, HV, N, stream, reserve_sm);
}

}  // namespace kdalab::kernels::kda_prefill_detail
