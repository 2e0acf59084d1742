// KDA backward, the chunked pass's two chains on wgmma (KdaBackwardPass::chunked_wg; D = 128 only): the launch of
// chunked.cu's chains_kernel replaced, with the same math and the same outputs (S entering every chunk into p.Sst,
// dS leaving every chunk into p.dSst, dS0), read from the same factor slots (common.cuh ChunkFac). The factors and
// gradient kernels are chunked.cu's. Design, precision and prediction: docs/kernels/kda_backward.md, "The chains on
// wgmma".
//
// One CTA = one warpgroup (128 threads) per (role, value head, 64 value columns, sequence), as the forward's wgmma
// state pass (kernels/kda_prefill/state_wgmma.cu): warp w holds the transposed state (S^T or dS^T) for value columns
// col0 + 16 w .. + 15 and all 128 keys in fp32 registers, in the wgmma m64n128 accumulator layout
//   X[4 j + e] = X^T[col0 + 16 w + gq + 8 (e >> 1)][8 j + 2 tq + (e & 1)]   (gq = lane / 4, tq = lane % 4),
// whose k-tiles are the m16n8k16 A fragments of the products over keys (as[kt][e] packs X[8 kt + 2 e], X[.. + 1]).
// Per chunk (C = 16 tokens), with the chunk's operands staged by the CTA one chunk ahead:
//   forward chain (chunks in order; S^T from S0 or zero):
//     store S (entering the chunk) into p.Sst;
//     [1] S^T W^T: 8 wgmma m64n32k16 (A = S^T hi, B = [W hi; W lo]^T K-major) and 8 m64n16k16 (A = S^T lo, B = W hi^T):
//         S hi W hi + S hi W lo + S lo W hi, fp32 accumulation; [2] V~^T = U^T - that, split into bf16 hi / lo;
//     [3] S^T <- Diag(gamL) S^T + V~^T Kd: 3 wgmma m64n128k16 (A = V~^T hi / lo from registers, B = Kd hi / lo
//         MN-major): V~ hi Kd hi + V~ lo Kd hi + V~ hi Kd lo.
//   reverse chain (chunks last first; dS^T from dS_T or zero):
//     store dS (leaving the chunk) into p.dSst;
//     [1] dS^T Kd^T and dO^T (scale P): 8 m64n32k16 (A = dS^T hi, B = [Kd hi; Kd lo]^T), 8 m64n16k16 (A = dS^T lo,
//         B = Kd hi^T), 1 m64n32k16 (A = dO^T, B = [(scale P) hi; (scale P) lo] K-major); [2] dV~^T, their sum, split
//         (negated) into bf16 hi / lo;
//     [3] dS^T <- Diag(gamL) dS^T + dO^T (scale Qg) - dV~^T W: 5 m64n128k16 (A = dO^T, -dV~^T hi / lo; B = (scale Qg)
//         hi / lo, W hi / lo MN-major): dO Qg hi + dO Qg lo - dV~ hi W hi - dV~ lo W hi - dV~ hi W lo;
//     dS0 = dS^T's transpose at the end (where p.dS0 is given).
// The decay Diag(gamL) is applied to the state's registers after their bf16 parts are taken, before [1] is issued:
// [3] accumulates onto them, and ptxas injects a wgmma wait before any access to the registers of a pending wgmma (the
// state pass's note), so it cannot sit in [3]'s shadow; [1] does not touch them, and ptxas schedules the decay and the
// stores of the state into [1]'s shadow.
//
// Precision: every product over keys or tokens has both operands as bf16 hi + lo (split_bf16: hi = bf16(x), lo =
// bf16(x - hi)), the product hi hi + hi lo + lo hi with fp32 accumulation (the accurate forward's form, extended to
// W S): each product within ~2^-16 relative of its fp32 value, against ~2^-21 for chunked.cu's three tf32 passes.
// dO is a bf16 input, exact as one part. scale is folded into P and Qg before their split (one fp32 rounding, 2^-24;
// chunked.cu multiplies the products). U and the decay stay fp32.
//
// The factor slots are fp32: each thread copies its share of the next chunk's slot (and dO rows) with cp.async into
// a raw fp32 stage while the current chunk computes, and in the shadow of the current chunk's [3] converts that
// share into the other operand stage (bf16 hi / lo, 128-byte swizzled, 1024-byte aligned blocks, the layouts of the
// state pass; U, gamL fp32; dO transposed), then issues the copies of the chunk after. Every thread converts exactly
// the raw bytes it copied (its own cp.async data after its own wait: no barrier on the raw stage) and the copies of
// the chunk after are issued after that conversion read them. One __syncthreads a step: the converted stage visible
// to every thread and to the wgmma (fence.proxy.async before it), and every thread past the previous step's wgmma
// wait, so the stage converted next (read by the previous step) is free.
#include "kernels/common/wgmma.cuh"
#include "kernels/kda_backward/common.cuh"

namespace kdalab::kernels::kda_backward_detail {
namespace {

namespace cw {
constexpr int D = 128;   // d_k = d_v
constexpr int C = CHUNK;  // tokens per chunk
constexpr int SLC = 64;  // value columns per CTA
constexpr int NB = D / SLC;  // CTAs per (role, value head)
using F = ChunkFac<D>;
constexpr int UP = SLC + 4;  // fp32 row stride of the forward chain's U tile (the state pass's: conflict-free reads)
constexpr int DOP = 24;      // bf16 row stride of the reverse chain's dO^T tile (48 bytes: conflict-free fragment reads)

// Operand stages (bytes from a 1024-byte aligned stage; two per CTA, chunk parity). Swizzled blocks as the state pass:
// a row-major [16 tokens][128 keys] operand X is two [rows x 64 keys] bf16 blocks, element (token r, key i) at
// block (i / 64), byte sw(r, (i % 64) / 8) + 2 (i % 8); "[hi; lo]": per block kb a [32 x 64] block at kb * 4096, rows
// 0..15 X hi, 16..31 X lo (K-major B of N = 32, or N = 16 for hi alone); "hi", "lo": two [16 x 64] blocks each at
// kb * 2048 (MN-major B of N = 128, as the state pass's Kd).
// forward chain
constexpr int F_W = 0;       // W [hi; lo]: B of V~^T = S^T W^T
constexpr int F_KH = 8192;   // Kd hi: B of S^T += V~^T Kd
constexpr int F_KL = 12288;  // Kd lo
constexpr int F_U = 16384;   // U [16][UP] fp32, the CTA's 64 value columns
constexpr int F_G = F_U + C * UP * 4;  // gamL [128] fp32
constexpr int F_STAGE = (F_G + D * 4 + 1023) / 1024 * 1024;
// reverse chain
constexpr int R_KD = 0;      // Kd [hi; lo]: B of dS^T Kd^T
constexpr int R_P = 8192;    // (scale P)^T [hi; lo]: one [32 x 64] block, columns (tokens r) 0..15; B of dO^T (scale P)
constexpr int R_WH = 12288, R_WL = 16384;  // W hi, lo: B of -dV~^T W
constexpr int R_QH = 20480, R_QL = 24576;  // (scale Qg) hi, lo: B of dO^T (scale Qg)
constexpr int R_G = 28672;   // gamL [128] fp32
constexpr int R_DO = R_G + D * 4;  // dO^T [64 value columns][DOP] bf16 (tokens 0..15 used)
constexpr int R_STAGE = (R_DO + SLC * DOP * 2 + 1023) / 1024 * 1024;
// raw stages (one per CTA, after the two operand stages): the slot's fp32 rows as they are in memory
constexpr int FR_W = 0, FR_KD = C * D * 4, FR_U = 2 * C * D * 4, FR_G = FR_U + C * SLC * 4, FR_BYTES = FR_G + D * 4;
constexpr int RR_W = 0, RR_KD = C * D * 4, RR_QG = 2 * C * D * 4, RR_P = 3 * C * D * 4, RR_G = RR_P + C * C * 4,
              RR_DO = RR_G + D * 4, RR_BYTES = RR_DO + C * SLC * 2;
constexpr int F_BYTES = 2 * F_STAGE + FR_BYTES, R_BYTES = 2 * R_STAGE + RR_BYTES;
constexpr int SMEM = (F_BYTES > R_BYTES ? F_BYTES : R_BYTES) + 1024;  // + slack to align the base to 1024 bytes
static_assert(F_STAGE == 21504 && R_STAGE == 32768 && SMEM == 94720, "chains_wg stages (two CTAs an SM fit)");
static_assert(F::W % 4 == 0 && F::U % 4 == 0 && F::Kd % 4 == 0 && F::Qg % 4 == 0 && F::gamL % 4 == 0 &&
                  F::P % 4 == 0 && F::size % 4 == 0,
              "16-byte copies of the factor slot");

using wgmma_util::desc;
using wgmma_util::fence_async_smem;
using wgmma_util::fence_reg;
using wgmma_util::mma_n128_t;
using wgmma_util::mma_n16;
using wgmma_util::mma_n32;
using wgmma_util::sw;
using wgmma_util::wgmma_commit;
using wgmma_util::wgmma_fence;
using wgmma_util::wgmma_wait;

/// 16-byte cp.async to a shared-window address; src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp16(std::uint32_t sdst, const void* gsrc) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sdst), "l"(gsrc));
}
__device__ __forceinline__ void cp16z(std::uint32_t sdst, const void* gsrc, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sdst), "l"(gsrc), "r"(src_bytes));
}

/// Waits for this thread's cp.async copies; the "memory" clobber keeps the compiler from moving the reads of the raw
/// stage above it (cp_async_wait of kda_math.cuh has none: its users read after a barrier).
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
/// Keeps the compiler from moving the conversion's reads of the raw stage below the copies that overwrite it.
__device__ __forceinline__ void compiler_fence() { asm volatile("" ::: "memory"); }

/// Eight fp32 (keys 8 kc .. 8 kc + 7 of one row) as bf16 hi and lo parts, each as one 16-byte chunk (element 8 kc in
/// the low half of the first word).
__device__ __forceinline__ void split8(const float* x, float s, uint4& hi, uint4& lo) {
  const float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(x + 4);
  split_bf16(s * a.x, s * a.y, hi.x, lo.x);
  split_bf16(s * a.z, s * a.w, hi.y, lo.y);
  split_bf16(s * b.x, s * b.y, hi.z, lo.z);
  split_bf16(s * b.z, s * b.w, hi.w, lo.w);
}
/// Byte offset of keys 8 kc .. + 7 of token row r in a [hi; lo] operand (the hi part; lo at + 2048) and in a hi or lo
/// operand (two [16 x 64] blocks).
__device__ __forceinline__ int off_hilo(int r, int kc) { return (kc / 8) * 4096 + sw(r, kc % 8); }
__device__ __forceinline__ int off_mn(int r, int kc) { return (kc / 8) * 2048 + sw(r, kc % 8); }

/// The transposed state tile of this thread from / into a [D][D] fp32 state (key rows, value columns) at `g`, already
/// offset to this thread's first element (row 2 tq, column col0 + 16 w + gq): X[4 j + e] <-> g[(8 j + (e & 1)) D +
/// 8 (e >> 1)]. Null `g` on the way in: zero.
__device__ __forceinline__ void tile_load(float (&X)[64], const float* g) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) X[4 * j + e] = g ? g[(8 * j + (e & 1)) * D + 8 * (e >> 1)] : 0.0f;
}
__device__ __forceinline__ void tile_store(float* g, const float (&X)[64]) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) g[(8 * j + (e & 1)) * D + 8 * (e >> 1)] = X[4 * j + e];
}
/// The bf16 hi and lo k-tiles of the transposed state (A operands of the products over keys).
__device__ __forceinline__ void tile_split(const float (&X)[64], std::uint32_t (&ah)[8][4], std::uint32_t (&al)[8][4]) {
#pragma unroll
  for (int kt = 0; kt < 8; ++kt)
#pragma unroll
    for (int e = 0; e < 4; ++e) split_bf16(X[8 * kt + 2 * e], X[8 * kt + 2 * e + 1], ah[kt][e], al[kt][e]);
}
/// X <- Diag(gamL) X: key 8 j + 2 tq + (e & 1) of X[4 j + e] scaled by gl (gamL at this stage, fp32).
__device__ __forceinline__ void tile_decay(float (&X)[64], const float* gl, int tq) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float2 g = *reinterpret_cast<const float2*>(gl + 8 * j + 2 * tq);
    X[4 * j + 0] *= g.x;
    X[4 * j + 1] *= g.y;
    X[4 * j + 2] *= g.x;
    X[4 * j + 3] *= g.y;
  }
}
__device__ __forceinline__ void fence_tile(float (&X)[64]) {
#pragma unroll
  for (int e = 0; e < 64; ++e) fence_reg(X[e]);
}
__device__ __forceinline__ void fence_frags(std::uint32_t (&a)[8][4]) {
#pragma unroll
  for (int kt = 0; kt < 8; ++kt)
#pragma unroll
    for (int e = 0; e < 4; ++e) fence_reg(a[kt][e]);
}

/// The shared-memory base of the stages: the dynamic array's first 1024-byte aligned byte (a generic pointer into
/// the array, so the compiler keeps the shared state space: LDS / STS) and its shared-window address.
struct Smem {
  unsigned char* base;
  std::uint32_t addr;
};
__device__ __forceinline__ Smem smem_base() {
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  const std::uint32_t raw = static_cast<std::uint32_t>(__cvta_generic_to_shared(dyn_smem));
  const std::uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  return {dyn_smem + pad, raw + pad};
}

/// The units of thread tid in a [16][128] fp32 operand: u = tid + 128 m (m = 0, 1), token row u / 16, keys 8 (u % 16)
/// .. + 7 (two 16-byte copies, one conversion).
__device__ __forceinline__ int unit_row(int tid, int m) { return (tid + 128 * m) / 16; }
__device__ __forceinline__ int unit_kc(int tid, int m) { return (tid + 128 * m) % 16; }

// ---------------------------------------------------------------------------------------------------------------
// forward chain
/// Thread tid's copies of chunk slot f (fp32) into the raw stage at shared address raw: W, Kd (4 each), the U rows'
/// 64 columns from col0 (2), gamL (threads 0..31).
__device__ __forceinline__ void fwd_issue(std::uint32_t raw, const float* f, int tid, int col0) {
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int o = unit_row(tid, m) * D + 8 * unit_kc(tid, m);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      cp16(raw + FR_W + (o + 4 * h) * 4, f + F::W + o + 4 * h);
      cp16(raw + FR_KD + (o + 4 * h) * 4, f + F::Kd + o + 4 * h);
    }
    const int u = tid + 128 * m, r = u / 16, c4 = 4 * (u % 16);
    cp16(raw + FR_U + (r * SLC + c4) * 4, f + F::U + r * D + col0 + c4);
  }
  if (tid < 32) cp16(raw + FR_G + 16 * tid, f + F::gamL + 4 * tid);
}
/// Thread tid's share of the raw stage (its own copies) into the operand stage st: W as [hi; lo], Kd as hi and lo,
/// U into rows of UP, gamL.
__device__ __forceinline__ void fwd_convert(unsigned char* st, const unsigned char* raw, int tid) {
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int r = unit_row(tid, m), kc = unit_kc(tid, m), o = (r * D + 8 * kc) * 4;
    uint4 hi, lo;
    split8(reinterpret_cast<const float*>(raw + FR_W + o), 1.0f, hi, lo);
    *reinterpret_cast<uint4*>(st + F_W + off_hilo(r, kc)) = hi;
    *reinterpret_cast<uint4*>(st + F_W + off_hilo(r, kc) + 2048) = lo;
    split8(reinterpret_cast<const float*>(raw + FR_KD + o), 1.0f, hi, lo);
    *reinterpret_cast<uint4*>(st + F_KH + off_mn(r, kc)) = hi;
    *reinterpret_cast<uint4*>(st + F_KL + off_mn(r, kc)) = lo;
    const int u = tid + 128 * m, ur = u / 16, c4 = 4 * (u % 16);
    *reinterpret_cast<float4*>(st + F_U + (ur * UP + c4) * 4) =
        *reinterpret_cast<const float4*>(raw + FR_U + (ur * SLC + c4) * 4);
  }
  if (tid < 32) *reinterpret_cast<float4*>(st + F_G + 16 * tid) = *reinterpret_cast<const float4*>(raw + FR_G + 16 * tid);
}

__device__ __forceinline__ void fwd_chain_wg(const Params& p, int hv, int cb) {
  const int n = blockIdx.z, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
  const int col0 = cb * SLC;
  int bos, len;
  long long slot0;
  seq_of<C>(p, n, bos, len, slot0);
  const int nch = (len + C - 1) / C;
  const Smem sm = smem_base();
  const std::uint32_t raw_a = sm.addr + 2 * F_STAGE;
  const unsigned char* const raw = sm.base + 2 * F_STAGE;
  // this thread's first element of a [D][D] state: key row 2 tq, value column col0 + 16 warp + gq
  const std::size_t toff = static_cast<std::size_t>(2 * tq) * D + col0 + 16 * warp + gq;
  const std::size_t st_base = (static_cast<std::size_t>(n) * p.HV + hv) * D * D;
  float Sacc[64];
  tile_load(Sacc, p.S0 ? p.S0 + st_base + toff : nullptr);

  const auto slot = [&](int ch) { return p.fac + (static_cast<std::size_t>(slot0 + ch) * p.HV + hv) * F::size; };
  if (nch > 0) {
    fwd_issue(raw_a, slot(0), tid, col0);
    cp_async_commit();
    cp_wait_all();
    fwd_convert(sm.base, raw, tid);
    compiler_fence();
    if (nch > 1) fwd_issue(raw_a, slot(1), tid, col0);
    cp_async_commit();
  }
  // descriptors: low words of stage 0 (a stage offset >> 4 added; the shared window is below 2^18 bytes, so the
  // start-address field never carries), one shared high word (sbo 1024, 128-byte swizzle; lbo in the low word)
  const std::uint64_t dw0 = desc(sm.addr + F_W, 16, 1024);
  const std::uint32_t hi_k = static_cast<std::uint32_t>(dw0 >> 32);
  const std::uint32_t lo_w = static_cast<std::uint32_t>(dw0);
  const std::uint32_t lo_kh = static_cast<std::uint32_t>(desc(sm.addr + F_KH, 2048, 1024));
  const std::uint32_t lo_kl = static_cast<std::uint32_t>(desc(sm.addr + F_KL, 2048, 1024));
  const auto dsc = [hi_k](std::uint32_t lo) { return (static_cast<std::uint64_t>(hi_k) << 32) | lo; };

  for (int c = 0; c < nch; ++c) {
    const int s = c & 1;
    const unsigned char* const st = sm.base + s * F_STAGE;
    const std::uint32_t so = (s * F_STAGE) >> 4;  // the stage's offset in descriptor units
    fence_async_smem();
    __syncthreads();  // chunk c's operand stage converted by every thread; every thread past step c - 1's wgmma
    // S entering chunk c
    tile_store(p.Sst + (static_cast<std::size_t>(slot0 + c) * p.HV + hv) * D * D + toff, Sacc);
    float u[8];  // U^T in the m64n16 layout: u[4 nt + e] = U[8 nt + 2 tq + (e & 1)][16 warp + gq + 8 (e >> 1)]
    {
      const float* U = reinterpret_cast<const float*>(st + F_U);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) u[4 * nt + e] = U[(8 * nt + 2 * tq + (e & 1)) * UP + 16 * warp + gq + 8 * (e >> 1)];
    }
    std::uint32_t as[8][4], asl[8][4];
    tile_split(Sacc, as, asl);
    tile_decay(Sacc, reinterpret_cast<const float*>(st + F_G), tq);
    // ---- [1] S^T W^T: S hi [W hi | W lo] (m64n32, dq) + S lo W hi (m64n16, dl) ----
    float dq[16], dl[8];
    wgmma_fence();
    mma_n32<0>(dq, as[0], dsc(lo_w + so));
#pragma unroll
    for (int kt = 1; kt < 8; ++kt) mma_n32(dq, as[kt], dsc(lo_w + so + ((kt / 4) * 4096 + (kt % 4) * 32) / 16));
    mma_n16<0>(dl, asl[0], dsc(lo_w + so));
#pragma unroll
    for (int kt = 1; kt < 8; ++kt) mma_n16(dl, asl[kt], dsc(lo_w + so + ((kt / 4) * 4096 + (kt % 4) * 32) / 16));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < 16; ++e) fence_reg(dq[e]);
#pragma unroll
    for (int e = 0; e < 8; ++e) fence_reg(dl[e]);
    fence_frags(as);  // the A operands of [1]: live until its wait
    fence_frags(asl);
    // ---- [2] V~^T = U^T - S^T W^T (dq[4 nt + e]: value column gq + 8 (e >> 1), token 8 nt + 2 tq + (e & 1)) ----
    float d[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) d[e] = u[e] - ((dq[e] + dq[8 + e]) + dl[e]);
    std::uint32_t ad[4], adl[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) split_bf16(d[2 * e], d[2 * e + 1], ad[e], adl[e]);
    // ---- [3] S^T += V~^T Kd: V~ hi Kd hi + V~ lo Kd hi + V~ hi Kd lo ----
    wgmma_fence();
    mma_n128_t(Sacc, ad, dsc(lo_kh + so));
    mma_n128_t(Sacc, adl, dsc(lo_kh + so));
    mma_n128_t(Sacc, ad, dsc(lo_kl + so));
    wgmma_commit();
    // chunk c + 1's operands (own copies) into the other stage, then the copies of chunk c + 2
    if (c + 1 < nch) {
      cp_wait_all();
      fwd_convert(sm.base + (s ^ 1) * F_STAGE, raw, tid);
      compiler_fence();
      if (c + 2 < nch) fwd_issue(raw_a, slot(c + 2), tid, col0);
      cp_async_commit();
    }
    wgmma_wait<0>();
    fence_tile(Sacc);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      fence_reg(ad[e]);
      fence_reg(adl[e]);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// reverse chain
/// The element offset of token row 0 of sequence n's dO rows for value head hv (rows of one sequence are consecutive
/// at the token stride p.sdo.t).
__device__ __forceinline__ std::int64_t dO_row0(const Params& p, int bos, int hv) {
  int b, t;
  row_bt(p, bos, b, t);
  return at(p.sdo, b, t, hv);
}
/// Thread tid's copies of chunk ch (slot f) into the raw stage: W, Kd, Qg (4 each), P (threads 0..63), gamL (threads
/// 0..31) and one 16-byte piece of the dO rows (token row tid % 16, value columns col0 + 8 (tid / 16) .. + 7; zeros
/// past the sequence end).
__device__ __forceinline__ void rev_issue(std::uint32_t raw, const float* f, const bf16_t* dO0, std::int64_t st_t,
                                          int t0, int len, int tid) {
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int o = unit_row(tid, m) * D + 8 * unit_kc(tid, m);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      cp16(raw + RR_W + (o + 4 * h) * 4, f + F::W + o + 4 * h);
      cp16(raw + RR_KD + (o + 4 * h) * 4, f + F::Kd + o + 4 * h);
      cp16(raw + RR_QG + (o + 4 * h) * 4, f + F::Qg + o + 4 * h);
    }
  }
  if (tid < 64) cp16(raw + RR_P + 16 * tid, f + F::P + 4 * tid);
  if (tid < 32) cp16(raw + RR_G + 16 * tid, f + F::gamL + 4 * tid);
  const int r = tid % 16, q = tid / 16;
  const bool in = t0 + r < len;
  cp16z(raw + RR_DO + (r * SLC + 8 * q) * 2, in ? dO0 + (t0 + r) * st_t + 8 * q : dO0, in ? 16 : 0);
}
/// Thread tid's share of the raw stage into the operand stage st: Kd as [hi; lo], W and scale Qg as hi and lo, scale
/// P transposed as [hi; lo] (threads 0..63: row r = tid / 4, columns 4 (tid % 4) .. + 3), gamL, dO transposed.
__device__ __forceinline__ void rev_convert(unsigned char* st, const unsigned char* raw, int tid, float scale) {
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int r = unit_row(tid, m), kc = unit_kc(tid, m), o = (r * D + 8 * kc) * 4;
    uint4 hi, lo;
    split8(reinterpret_cast<const float*>(raw + RR_KD + o), 1.0f, hi, lo);
    *reinterpret_cast<uint4*>(st + R_KD + off_hilo(r, kc)) = hi;
    *reinterpret_cast<uint4*>(st + R_KD + off_hilo(r, kc) + 2048) = lo;
    split8(reinterpret_cast<const float*>(raw + RR_W + o), 1.0f, hi, lo);
    *reinterpret_cast<uint4*>(st + R_WH + off_mn(r, kc)) = hi;
    *reinterpret_cast<uint4*>(st + R_WL + off_mn(r, kc)) = lo;
    split8(reinterpret_cast<const float*>(raw + RR_QG + o), scale, hi, lo);
    *reinterpret_cast<uint4*>(st + R_QH + off_mn(r, kc)) = hi;
    *reinterpret_cast<uint4*>(st + R_QL + off_mn(r, kc)) = lo;
  }
  if (tid < 64) {  // (scale P)^T: B[k = r][n = t] = scale P[r][t] stored K-major, row t, column r
    const int r = tid / 4, t4 = 4 * (tid % 4);
    const float4 x = *reinterpret_cast<const float4*>(raw + RR_P + 16 * tid);
    const float xs[4] = {scale * x.x, scale * x.y, scale * x.z, scale * x.w};
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      std::uint32_t hi, lo;
      split_bf16(xs[m], 0.0f, hi, lo);
      const int t = t4 + m, o = sw(t, r / 8) + 2 * (r % 8);
      *reinterpret_cast<std::uint16_t*>(st + R_P + o) = static_cast<std::uint16_t>(hi);
      *reinterpret_cast<std::uint16_t*>(st + R_P + 2048 + o) = static_cast<std::uint16_t>(lo);
    }
  }
  if (tid < 32) *reinterpret_cast<float4*>(st + R_G + 16 * tid) = *reinterpret_cast<const float4*>(raw + RR_G + 16 * tid);
  {  // dO^T[v][r] = dO[r][v]: token row r, value columns 8 q .. + 7
    const int r = tid % 16, q = tid / 16;
    const uint4 x = *reinterpret_cast<const uint4*>(raw + RR_DO + (r * SLC + 8 * q) * 2);
    const std::uint32_t w4[4] = {x.x, x.y, x.z, x.w};
    std::uint16_t* dst = reinterpret_cast<std::uint16_t*>(st + R_DO) + (8 * q) * DOP + r;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      dst[(2 * m) * DOP] = static_cast<std::uint16_t>(w4[m] & 0xffffu);
      dst[(2 * m + 1) * DOP] = static_cast<std::uint16_t>(w4[m] >> 16);
    }
  }
}

__device__ __forceinline__ void rev_chain_wg(const Params& p, int hv, int cb) {
  const int n = blockIdx.z, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
  const int col0 = cb * SLC;
  const float scale = p.scale;
  int bos, len;
  long long slot0;
  seq_of<C>(p, n, bos, len, slot0);
  const int nch = (len + C - 1) / C;
  const Smem sm = smem_base();
  const std::uint32_t raw_a = sm.addr + 2 * R_STAGE;
  const unsigned char* const raw = sm.base + 2 * R_STAGE;
  const std::size_t toff = static_cast<std::size_t>(2 * tq) * D + col0 + 16 * warp + gq;
  const std::size_t st_base = (static_cast<std::size_t>(n) * p.HV + hv) * D * D;
  float dS[64];
  tile_load(dS, p.dS_T ? p.dS_T + st_base + toff : nullptr);

  const bf16_t* const dO0 = p.dO + dO_row0(p, bos, hv) + col0;
  const std::int64_t st_t = p.sdo.t;
  const auto slot = [&](int ch) { return p.fac + (static_cast<std::size_t>(slot0 + ch) * p.HV + hv) * F::size; };
  if (nch > 0) {
    rev_issue(raw_a, slot(nch - 1), dO0, st_t, (nch - 1) * C, len, tid);
    cp_async_commit();
    cp_wait_all();
    rev_convert(sm.base, raw, tid, scale);
    compiler_fence();
    if (nch > 1) rev_issue(raw_a, slot(nch - 2), dO0, st_t, (nch - 2) * C, len, tid);
    cp_async_commit();
  }
  const std::uint64_t dk0 = desc(sm.addr + R_KD, 16, 1024);
  const std::uint32_t hi_k = static_cast<std::uint32_t>(dk0 >> 32);
  const std::uint32_t lo_kd = static_cast<std::uint32_t>(dk0);
  const std::uint32_t lo_p = static_cast<std::uint32_t>(desc(sm.addr + R_P, 16, 1024));
  const std::uint32_t lo_wh = static_cast<std::uint32_t>(desc(sm.addr + R_WH, 2048, 1024));
  const std::uint32_t lo_wl = static_cast<std::uint32_t>(desc(sm.addr + R_WL, 2048, 1024));
  const std::uint32_t lo_qh = static_cast<std::uint32_t>(desc(sm.addr + R_QH, 2048, 1024));
  const std::uint32_t lo_ql = static_cast<std::uint32_t>(desc(sm.addr + R_QL, 2048, 1024));
  const auto dsc = [hi_k](std::uint32_t lo) { return (static_cast<std::uint64_t>(hi_k) << 32) | lo; };

  for (int i = 0; i < nch; ++i) {
    const int ch = nch - 1 - i, s = i & 1;
    const unsigned char* const st = sm.base + s * R_STAGE;
    const std::uint32_t so = (s * R_STAGE) >> 4;
    fence_async_smem();
    __syncthreads();  // chunk ch's operand stage converted by every thread; every thread past the last step's wgmma
    // dS leaving chunk ch
    tile_store(p.dSst + (static_cast<std::size_t>(slot0 + ch) * p.HV + hv) * D * D + toff, dS);
    // dO^T's A fragment (value column 16 warp + gq (+ 8), tokens 2 tq, 2 tq + 1 (+ 8)): one word each
    std::uint32_t ao[4];
    {
      const std::uint16_t* dt = reinterpret_cast<const std::uint16_t*>(st + R_DO) + (16 * warp + gq) * DOP + 2 * tq;
      ao[0] = *reinterpret_cast<const std::uint32_t*>(dt);
      ao[1] = *reinterpret_cast<const std::uint32_t*>(dt + 8 * DOP);
      ao[2] = *reinterpret_cast<const std::uint32_t*>(dt + 8);
      ao[3] = *reinterpret_cast<const std::uint32_t*>(dt + 8 * DOP + 8);
    }
    std::uint32_t as[8][4], asl[8][4];
    tile_split(dS, as, asl);
    tile_decay(dS, reinterpret_cast<const float*>(st + R_G), tq);
    // ---- [1] dS^T Kd^T: dS hi [Kd hi | Kd lo] (m64n32, y) + dS lo Kd hi (m64n16, yl); dO^T [(sP) hi | (sP) lo] (x) ----
    float y[16], yl[8], x[16];
    wgmma_fence();
    mma_n32<0>(x, ao, dsc(lo_p + so));
    mma_n32<0>(y, as[0], dsc(lo_kd + so));
#pragma unroll
    for (int kt = 1; kt < 8; ++kt) mma_n32(y, as[kt], dsc(lo_kd + so + ((kt / 4) * 4096 + (kt % 4) * 32) / 16));
    mma_n16<0>(yl, asl[0], dsc(lo_kd + so));
#pragma unroll
    for (int kt = 1; kt < 8; ++kt) mma_n16(yl, asl[kt], dsc(lo_kd + so + ((kt / 4) * 4096 + (kt % 4) * 32) / 16));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      fence_reg(x[e]);
      fence_reg(y[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) fence_reg(yl[e]);
    fence_frags(as);  // the A operands of [1] over keys: live until its wait (dO^T, which [3] reads too, at the end)
    fence_frags(asl);
    // ---- [2] dV~^T (value column gq + 8 (e >> 1), token 8 nt + 2 tq + (e & 1) of element 4 nt + e), negated: the A
    // operand of -dV~^T W ----
    float d[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) d[e] = -((x[e] + x[8 + e]) + ((y[e] + y[8 + e]) + yl[e]));
    std::uint32_t ad[4], adl[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) split_bf16(d[2 * e], d[2 * e + 1], ad[e], adl[e]);
    // ---- [3] dS^T += dO^T (scale Qg) - dV~^T W ----
    wgmma_fence();
    mma_n128_t(dS, ao, dsc(lo_qh + so));
    mma_n128_t(dS, ao, dsc(lo_ql + so));
    mma_n128_t(dS, ad, dsc(lo_wh + so));
    mma_n128_t(dS, adl, dsc(lo_wh + so));
    mma_n128_t(dS, ad, dsc(lo_wl + so));
    wgmma_commit();
    if (i + 1 < nch) {
      cp_wait_all();
      rev_convert(sm.base + (s ^ 1) * R_STAGE, raw, tid, scale);
      compiler_fence();
      if (i + 2 < nch) rev_issue(raw_a, slot(ch - 2), dO0, st_t, (ch - 2) * C, len, tid);
      cp_async_commit();
    }
    wgmma_wait<0>();
    fence_tile(dS);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      fence_reg(ao[e]);
      fence_reg(ad[e]);
      fence_reg(adl[e]);
    }
  }
  if (p.dS0) tile_store(p.dS0 + st_base + toff, dS);
}
}  // namespace cw

/// The two chains in one launch (as chunked.cu's chains_kernel): blockIdx.x enumerates (role, value head, column
/// block of 64), the reverse chains first; `forward_only` launches the forward chains alone.
__global__ void __launch_bounds__(128) chains_wg_kernel(Params p, bool forward_only) {
  const int per_role = cw::NB * p.HV, x = static_cast<int>(blockIdx.x);
  const int r = x < per_role ? x : x - per_role, hv = r / cw::NB, cb = r - hv * cw::NB;
  if (forward_only || x >= per_role) cw::fwd_chain_wg(p, hv, cb);
  else cw::rev_chain_wg(p, hv, cb);
}

}  // namespace

void launch_chains_wg(const Params& p, cudaStream_t stream, bool forward_only) {
  cuda_check(cudaFuncSetAttribute(chains_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, cw::SMEM),
             "cudaFuncSetAttribute (kda_backward chains_wg)");
  // two CTAs an SM need 2 x (92.5 + 1) KB of shared memory: the largest carveout (this kernel only; it reads the
  // factor slots with cp.async.cg, which bypasses L1, and L1 keeps nothing else it reads twice)
  cuda_check(cudaFuncSetAttribute(chains_wg_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared),
             "cudaFuncSetAttribute (kda_backward chains_wg carveout)");
  const dim3 grid((forward_only ? 1 : 2) * cw::NB * p.HV, 1, p.N);
  chains_wg_kernel<<<grid, 128, cw::SMEM, stream>>>(p, forward_only);
  cuda_check(cudaGetLastError(), "kda_backward chains_wg launch");
}

}  // namespace kdalab::kernels::kda_backward_detail
