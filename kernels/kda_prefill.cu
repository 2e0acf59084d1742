// KDA chunked prefill, bf16 in/out, fp32 state, chunk 16, D = d_k = d_v in {64, 128, 256} (sm_90a;
// mma.sync bf16). D is a template parameter of the default kernels; D = 128 is the original path.
//
// Two kernels, the algorithm and precision plan of numerics/kda_twin.hpp (kda_plan_kernel()):
//  1. kda_prepare_kernel, token-parallel, one CTA (256 threads) per (16-token chunk, value head,
//     sequence): fused gate, L2Norm, beta sigmoid; cumulative decay gam = exp(G); Qg, Kg, Ki, Kd;
//     A = StrictLower(Diag(beta) Kg Ki^T) and P = Lower(Qg Ki^T) in fp32; [W | U] by fp32 forward
//     substitution. Writes to the workspace slot of the chunk: W, Qg (bf16, in the A-operand
//     fragment order of mma.m16n8k16), Kd (bf16, B-operand fragment order), U (fp32), P (fp32),
//     gam_n (fp32).
//  2. kda_state_kernel, chunk-sequential, one CTA of 2 warps per (32-column slice of d_v, value
//     head, sequence), so H = 32 heads give 128 CTAs. Each warp keeps S^T for 16 value columns x
//     128 key rows in mma accumulator registers (fp32); its C-fragment layout is exactly the
//     B-fragment layout Qg S needs and the A-fragment layout of S^T, so no shuffles. Per chunk: D^T = U^T -
//     S^T W^T (in registers, in the layout the update takes), o = scale (Qg S + P D), S^T <- Diag(gam_n) S^T
//     + D^T Kd. The next chunks' slots stream in by cp.async (NST stages, straight-line copies issued after
//     the update: v8, bench/NOTES.md) while the current one is computed. v3 (state_variant 3, default): the state update
//     is issued first and P D runs on the tensor cores with hi/lo bf16 splits; v2: P D in fp32 FMAs.
//  v9w state pass (state_variant 6; kda_state_wg_kernel, session 9; the auto rule's choice at D = 128): the same
//     step on wgmma, one warpgroup per 64 value columns, W, Qg, Kd, P read from shared memory once per warpgroup
//     (mma.sync: once per warp); the prepare writes W, Qg, Kd, P row-major for it (kda_prepare_v6_kernel<128, true>).
//     v10w (session 10, same slot and products): descriptors formed once, LDS instead of generic loads, per-thread copy
//     offsets, each warp's own gam_n / U copies read before the barrier (see the kernel's comment).
//  v6 prepare (prepare_variant 6; kda_prepare_v6_kernel): the same slot, A and P on the tensor cores
//     (tf32 3-pass), fragments written from registers, ~2.4x less shared-memory traffic (see below).
//  v4 schedule (overlap_segments): long fixed-length batches run in segments so that the prepare
//     of segment k+1 overlaps the state pass of segment k (see segments_of()).
//  D (KdaPrefillArgs::D): the text above is written for D = 128 (8 k-tiles, 128 key rows). D = 64 and
//     256 run the same kernels with D / 16 k-tiles and D / 32 column slices per head; at D = 256 the
//     state pass is kda_state_ks_kernel<256, 2> (64 fp32 of S per thread; the v3 warp would hold 128),
//     prepare v6 takes its 66.6 KB of tiles from dynamic shared memory, and the segment path is refused.
//  pair step (KdaPrefillArgs::pair_chunks, opt-in, D = 128): checked and dispatched here, kernels in
//     kernels/kda_pair.cu (a pair prepare writing a KdaPairSlot per two chunks, a state pass of 32 tokens per step).
// Versions, predictions and H200 timings: bench/NOTES.md.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/kda_common.cuh"
#include "kernels/kda_pair.cuh"
#include "kernels/kda_prepare_phases.cuh"
#include "kernels/kda_state_update.cuh"
#include "kernels/common/wgmma.cuh"

namespace kdalab::kernels {

namespace {
using namespace detail;

constexpr int C = 16;     // chunk
constexpr int D128 = 128; // d_k = d_v of the D = 128-only kernels (prepare v4, state v2)
constexpr int SLICE = 32; // value columns per state CTA
constexpr int NST = 3;    // cp.async pipeline depth of the state pass (v2: 6 gave no gain and cost occupancy)

// Workspace slot per (chunk, value head), bytes (KdaSlotOf<D>, kernels/kda.hpp). W, Qg, Kd are bf16
// (mma operand fragments) since v1; U, gam_n stay fp32 (used in fp32). P in fp32 (P) is read only by
// state_variant 2: v5 writes it only when that variant (or the v4 layout, compact_workspace = false)
// asks for it; the slot stride is unchanged, so a workspace is valid for every variant.
// Pf: P as hi + lo bf16 A fragments (2 x 32 x 16 B).
template <int D>
using Slot = KdaSlotOf<D>;
static_assert(Slot<128>::W == 0 && Slot<128>::Qg == 4096 && Slot<128>::Kd == 8192 && Slot<128>::U == 12288 &&
                  Slot<128>::P == 20480 && Slot<128>::gam_n == 21504 && Slot<128>::Pf == 22016 &&
                  Slot<128>::bytes == 23040,
              "slot layout (the state kernel's Stage copy relies on it)");

struct Params {
  int B, T, H, HV, group, N, nchunk_fixed;
  const bf16_t *q, *k, *v, *g, *beta;
  Strides sq, sk, sv, sg, so, sbeta;
  const float *A_log, *bias;
  float g_min, scale;
  bool fuse_gate, l2norm, beta_sigmoid;
  bool write_p;  // the prepare writes fp32 P and the state pass loads it (state_variant 2, or the v4 layout)
  const float* S0;
  float* S_final;
  const int* cu;
  bf16_t* o;
  unsigned char* ws;
  // v5 segment-parallel state pass (the segment path of kda_prefill()): grid.z = N * nseg_grid, segment
  // sg = seg_base + blockIdx.z % nseg_grid covers chunks [sg * seg_chunks, min(nch, (sg + 1) * seg_chunks)).
  // One-shot pass: nseg_grid = 1, seg_chunks = 1 << 30.
  int nseg_grid, seg_chunks;
  int seg_base;    // first segment of this launch (pass 1 launched per segment in the overlapped schedule)
  int chunk_base;  // first chunk of this prepare launch (the overlapped segment schedule)
  float* seg_S;  // [P - 1][N][HV][D][D] fp32: S_start of segments 1 .. P-1
  float* seg_A;  // [P - 1][N][HV][D][D] fp32: A_seg (d_k x d_k) of segments 0 .. P-2
  float* seg_B;  // [P - 1][N][HV][D][D] fp32: B_seg of segments 0 .. P-2
};

using prep::Seq;
/// Sequence n's tokens and its first slot (16-token chunks): kernels/kda_prepare_phases.cuh seq_of.
__device__ __forceinline__ Seq seq_info(const Params& p, int n) { return prep::seq_of<C, &Params::nchunk_fixed>(p, n); }

__global__ void __launch_bounds__(256) kda_prepare_kernel(Params p) {
  constexpr int D = D128, DP = D128 + 4;  // v4 is D = 128 only
  constexpr int OFF_W = Slot<D>::W, OFF_QG = Slot<D>::Qg, OFF_KD = Slot<D>::Kd, OFF_U = Slot<D>::U, OFF_P = Slot<D>::P,
                OFF_GN = Slot<D>::gam_n, OFF_PF = Slot<D>::Pf, SLOT_BYTES = Slot<D>::bytes;
  const int c = blockIdx.x + p.chunk_base, hv = blockIdx.y, n = blockIdx.z, tid = threadIdx.x;
  const Seq sq = seq_info(p, n);
  const int t0 = c * C;
  if (t0 >= sq.len) return;
  const int nvalid = min(C, sq.len - t0);
  const int h = hv / p.group;

  __shared__ __align__(16) float sQ[C][DP];   // q -> Qg
  __shared__ __align__(16) float sK[C][DP];   // k -> Kg -> W
  __shared__ __align__(16) float sKi[C][DP];  // Ki
  __shared__ __align__(16) float sV[C][DP];   // v
  __shared__ __align__(16) float sG[C][DP];   // g -> gam -> Kd
  __shared__ float sA[C][C + 1], sP[C][C + 1], sBeta[C], sGn[D];

  // ---- load (16-byte loads), fusions ----
  {
    const int r = tid / 16, c8 = (tid % 16) * 8;
    const bool ok = r < nvalid;
    const long long t = sq.bos + t0 + r;
    float fq[8], fk[8], fv[8], fg[8];
    if (ok) {
      unpack8(*reinterpret_cast<const uint4*>(p.q + sq.bidx * p.sq.b + t * p.sq.t + h * p.sq.h + c8), fq);
      unpack8(*reinterpret_cast<const uint4*>(p.k + sq.bidx * p.sk.b + t * p.sk.t + h * p.sk.h + c8), fk);
      unpack8(*reinterpret_cast<const uint4*>(p.v + sq.bidx * p.sv.b + t * p.sv.t + hv * p.sv.h + c8), fv);
      unpack8(*reinterpret_cast<const uint4*>(p.g + sq.bidx * p.sg.b + t * p.sg.t + hv * p.sg.h + c8), fg);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) fq[i] = fk[i] = fv[i] = fg[i] = 0.0f;
    }
    if (p.l2norm) prep::l2norm_row16(fq, fk);
    if (p.fuse_gate && ok) {
      const float ea = expf(p.A_log[hv]);
      const float4 b0 = *reinterpret_cast<const float4*>(p.bias + hv * D + c8);
      const float4 b1 = *reinterpret_cast<const float4*>(p.bias + hv * D + c8 + 4);
      const float bb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) fg[i] = k3_gate(fg[i], ea, bb[i], p.g_min);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      sQ[r][c8 + i] = fq[i];
      sK[r][c8 + i] = fk[i];
      sV[r][c8 + i] = fv[i];
      sG[r][c8 + i] = fg[i];
    }
    prep::load_beta(p, sq, t0, nvalid, hv, tid, sBeta);
  }
  __syncthreads();
  // ---- cumulative decay per channel; Qg, Kg, Ki, Kd (thread = channel) ----
  if (tid < D) {
    const int i = tid;
    float G = 0.0f, gam[C];
#pragma unroll
    for (int r = 0; r < C; ++r) {
      G += sG[r][i];  // rows past nvalid carry g = 0: gam stays, gam[C-1] = gam_n
      gam[r] = fast_exp(G);  // as prep::decay_gamma (v6): gam_n bit-identical across the two prepares
    }
    const float gn = gam[C - 1];
    sGn[i] = gn;
#pragma unroll
    for (int r = 0; r < C; ++r) {
      const float kk = sK[r][i];
      sQ[r][i] *= gam[r];
      sK[r][i] = kk * gam[r];
      sKi[r][i] = kk / gam[r];
      sG[r][i] = kk * (gn / gam[r]);
    }
  }
  __syncthreads();
  // ---- A and P (thread = (r, s)) ----
  {
    const int r = tid / C, s = tid % C;
    float a = 0.0f, pp = 0.0f;
    const float4* kr = reinterpret_cast<const float4*>(&sK[r][0]);
    const float4* qr = reinterpret_cast<const float4*>(&sQ[r][0]);
    const float4* ks = reinterpret_cast<const float4*>(&sKi[s][0]);
    if (s <= r) {
#pragma unroll 8
      for (int i = 0; i < D / 4; ++i) {
        const float4 x = ks[i], y = kr[i], z = qr[i];
        a += y.x * x.x + y.y * x.y + y.z * x.z + y.w * x.w;
        pp += z.x * x.x + z.y * x.y + z.z * x.z + z.w * x.w;
      }
    }
    sA[r][s] = s < r ? sBeta[r] * a : 0.0f;
    sP[r][s] = pp;
  }
  __syncthreads();
  unsigned char* slot = p.ws + ((sq.slot0 + c) * p.HV + hv) * static_cast<long long>(SLOT_BYTES);
  // ---- [W | U] = (I + A)^{-1} [Diag(beta) Kg | Diag(beta) V] (thread = column) ----
  {
    const int col = tid;
    float x[C];
#pragma unroll
    for (int r = 0; r < C; ++r) {
      float acc = sBeta[r] * (col < D ? sK[r][col] : sV[r][col - D]);
#pragma unroll
      for (int s = 0; s < r; ++s) acc -= sA[r][s] * x[s];
      x[r] = acc;
    }
    if (col < D) {
#pragma unroll
      for (int r = 0; r < C; ++r) sK[r][col] = x[r];  // W (each thread owns its column)
    } else {
      float* U = reinterpret_cast<float*>(slot + OFF_U);
#pragma unroll
      for (int r = 0; r < C; ++r) U[r * D + (col - D)] = x[r];
    }
  }
  __syncthreads();
  // ---- fragment-ordered bf16 operands, P, gam_n ----
  {
    const int kt = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
    const int c0 = 16 * kt + 2 * tq;
    uint4 w, qg, kd;
    w.x = pack_bf16(sK[gq][c0], sK[gq][c0 + 1]);
    w.y = pack_bf16(sK[gq + 8][c0], sK[gq + 8][c0 + 1]);
    w.z = pack_bf16(sK[gq][c0 + 8], sK[gq][c0 + 9]);
    w.w = pack_bf16(sK[gq + 8][c0 + 8], sK[gq + 8][c0 + 9]);
    qg.x = pack_bf16(sQ[gq][c0], sQ[gq][c0 + 1]);
    qg.y = pack_bf16(sQ[gq + 8][c0], sQ[gq + 8][c0 + 1]);
    qg.z = pack_bf16(sQ[gq][c0 + 8], sQ[gq][c0 + 9]);
    qg.w = pack_bf16(sQ[gq + 8][c0 + 8], sQ[gq + 8][c0 + 9]);
    // Kd as the B operand (k = chunk row, n = key channel) of n-tiles 2kt and 2kt+1
    const int n0 = 16 * kt + gq, n1 = n0 + 8;
    kd.x = pack_bf16(sG[2 * tq][n0], sG[2 * tq + 1][n0]);
    kd.y = pack_bf16(sG[2 * tq + 8][n0], sG[2 * tq + 9][n0]);
    kd.z = pack_bf16(sG[2 * tq][n1], sG[2 * tq + 1][n1]);
    kd.w = pack_bf16(sG[2 * tq + 8][n1], sG[2 * tq + 9][n1]);
    reinterpret_cast<uint4*>(slot + OFF_W)[tid] = w;
    reinterpret_cast<uint4*>(slot + OFF_QG)[tid] = qg;
    reinterpret_cast<uint4*>(slot + OFF_KD)[tid] = kd;
    if (p.write_p) reinterpret_cast<float*>(slot + OFF_P)[tid] = sP[tid / C][tid % C];
    if (tid < D) reinterpret_cast<float*>(slot + OFF_GN)[tid] = sGn[tid];
    if (tid < 32) {  // P = hi + lo, both bf16, A-fragment order (m16 x k16)
      const float pv[8] = {sP[gq][2 * tq],     sP[gq][2 * tq + 1],     sP[gq + 8][2 * tq],     sP[gq + 8][2 * tq + 1],
                           sP[gq][2 * tq + 8], sP[gq][2 * tq + 9],     sP[gq + 8][2 * tq + 8], sP[gq + 8][2 * tq + 9]};
      std::uint32_t hi[4], lo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) split_bf16(pv[2 * i], pv[2 * i + 1], hi[i], lo[i]);
      reinterpret_cast<uint4*>(slot + OFF_PF)[tid] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      reinterpret_cast<uint4*>(slot + OFF_PF)[32 + tid] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
  }
}

// ---- prepare v6 (KdaPrefillArgs::prepare_variant = 6) ------------------------------------------
// The same slot contents as kda_prepare_kernel (v4) with ~2.4x less shared-memory traffic (v4 is
// bound by it: ncu L1/smem 79%, DRAM 22%). Per CTA (one chunk, one value head), v4 -> v6:
//  - loads: 8-byte loads of channels 4j.. and 64 + 4j.. so each quarter-warp's float4 store covers
//    128 contiguous bytes (v4's 8-channel split made 2-way bank conflicts);
//  - decay phase (thread = channel): Qg and Kd go from registers straight to their global fragments
//    (Qg: channels i, i^1 swap 8 values by shuffle; Kd: no exchange), no fp32 Kd copy in smem and
//    no strided fragment packing pass;
//  - A = Kg Ki^T and P = Qg Ki^T on the tensor cores (mma.m16n8k8, tf32 3-pass: a_hi b_hi +
//    a_hi b_lo + a_lo b_hi, fp32 accumulation; ~2^-21 relative per product term, against 2^-24 for the
//    v4 fp32 FMAs), K = 128 split over the 8 warps (16 channels each), the 8 partial 16 x 16 tiles
//    summed through shared memory in fixed order; v4 streamed three 128-float rows per (r, s) thread;
//  - forward substitution: the A row as float4 broadcasts (v4: one scalar load per A entry);
//  - W from the substitution registers straight to its fragments (as Qg).
// Bit-identical to v4: Qg, Kd, gam_n. Within the tf32 3-pass rounding of v4: A, P (fp32 and hi/lo),
// hence W, U (GPU test "prepare v6 slots vs prepare v4" prints the differences).

// store_afrag_col / store_bfrag_col (the Qg, W and Kd fragment stores): kernels/kda_prepare_phases.cuh.

/// Shared-memory plan of prepare v6 for d_k = d_v = D: four 16 x (D + 4) fp32 tiles (static up to D = 128;
/// dynamic at D = 256, where they are 66.6 KB, above the 48 KB static limit), A (1 KB), beta; the 8 warps'
/// partial A / P tiles (16 KB) go over tiles [0] and [1] when those are large enough (D >= 128), else into
/// their own static buffer (D = 64).
template <int D>
struct PrepV6 {
  static constexpr int DP = D + 4;                             // padded row (floats), keeps float4 alignment
  static constexpr int tile_bytes = 4 * C * DP * 4;            // sT
  static constexpr bool dyn = tile_bytes > 48 * 1024;          // D = 256
  static constexpr int dyn_bytes = dyn ? tile_bytes : 0;
  static constexpr bool red_in_tiles = 2 * C * DP * 4 >= 8 * 256 * 8;
  static constexpr int static_bytes = (dyn ? 0 : tile_bytes) + (red_in_tiles ? 0 : 8 * 256 * 8) + C * C * 4 + C * 4;
  static_assert(static_bytes <= 48 * 1024, "prepare v6: static shared memory above 48 KB");
  static_assert(static_bytes + dyn_bytes <= 227 * 1024, "prepare v6: shared memory per CTA above 227 KB");

};

// 4 CTAs (32 warps) per SM at D = 64 / 128 need <= 64 registers: the minimum-blocks bound keeps ptxas there
// (session 5's cheaper gate / reciprocal code took 72 without it, i.e. 3 CTAs per SM); D = 256 is held to 3 CTAs
// by its 66.6 KB of dynamic shared memory (and now by this bound: <= 85 registers; it took 96 before session 5).
template <int D, bool kWg = false>
__global__ void __launch_bounds__(256, D == 256 ? 3 : 4) kda_prepare_v6_kernel(Params p) {
  static_assert(!kWg || D == 128, "the wgmma slot layout: D = 128");
  static_assert(D == 64 || D == 128 || D == 256, "prepare v6: D = 64, 128 or 256");
  constexpr int DP = PrepV6<D>::DP;
  constexpr int CPW = D / 8;   // channels per warp in the A / P products (8 per k-step)
  using SL = Slot<D>;  // (static members, not local constants: a lambda's capture of those changed the D = 128 PTX)
  const int c = blockIdx.x + p.chunk_base, hv = blockIdx.y, n = blockIdx.z, tid = threadIdx.x;
  const Seq sq = seq_info(p, n);
  const int t0 = c * C;
  if (t0 >= sq.len) return;
  const int nvalid = min(C, sq.len - t0);
  const int h = p.group == 1 ? hv : hv / p.group;  // (the integer division: ~20 instructions per thread)

  // [0] q -> Qg, [1] g -> Ki, [2] k -> Kg, [3] v; [0] and [1] (16896 B at D = 128, contiguous) then hold
  // the 8 warps' partial A / P tiles (8 x 256 float2 = 16384 B; own buffer at D = 64)
  float(*sT)[C][DP];
  if constexpr (PrepV6<D>::dyn) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    sT = reinterpret_cast<float(*)[C][DP]>(dyn_smem);
  } else {
    __shared__ __align__(16) float sT_static[4][C][DP];
    sT = sT_static;
  }
  __shared__ __align__(16) float sA[C][C];
  __shared__ float sBeta[C];
  float(*sQ)[DP] = sT[0];
  float(*sKi)[DP] = sT[1];
  float(*sK)[DP] = sT[2];
  float(*sV)[DP] = sT[3];
  unsigned char* slot = p.ws + ((sq.slot0 + c) * p.HV + hv) * static_cast<long long>(SL::bytes);

  // ---- load (8-byte loads of channels 4j..4j+3, 64+4j.., ...), fusions (as v4) ----
  prep::load_fuse<D>(p, sq, t0, nvalid, h, hv, tid, sQ, sK, sV, sKi, sBeta);
  __syncthreads();
  // ---- cumulative decay per channel (thread = channel, as v4); Qg, Kd fragments and gam_n to the slot ----
  if (tid < D) {
    const int i = tid;
    float gam[C];
    const float gn = prep::decay_gamma(sKi, i, gam);  // sKi holds g here
    reinterpret_cast<float*>(slot + SL::gam_n)[i] = gn;
    float qg[C], kd[C];
    prep::decay_apply(sQ, sK, sKi, i, gam, gn, qg, kd);
    if constexpr (kWg) {  // state_variant 6: Qg, Kd row-major (kda_state_wg_kernel's layout)
      prep::store_rowmajor_col<D>(reinterpret_cast<std::uint16_t*>(slot + SL::Qg), qg, i);
      prep::store_rowmajor_col<D>(reinterpret_cast<std::uint16_t*>(slot + SL::Kd), kd, i);
    } else {
      prep::store_afrag_col(reinterpret_cast<uint4*>(slot + SL::Qg), qg, i);
      prep::store_bfrag_col(reinterpret_cast<uint4*>(slot + SL::Kd), kd, i);
    }
  }
  __syncthreads();
  // ---- A = Kg Ki^T and P = Qg Ki^T: tf32 3-pass mma, warp w sums channels [CPW w, CPW w + CPW) ----
  {
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    float acc[2][2][4] = {};  // [A | P][n-tile: s in 8 nt ..][C fragment]
    prep::ap_mma<CPW / 8>(sK, sQ, sKi, CPW * warp, g, t, acc);
    __syncthreads();  // every warp is done reading Qg and Ki: their space takes the partial tiles
    float2* red;
    if constexpr (PrepV6<D>::red_in_tiles) {
      red = reinterpret_cast<float2*>(&sT[0][0][0]);
    } else {
      __shared__ __align__(16) float2 red_static[8 * 256];
      red = red_static;
    }
    prep::ap_store_partial(red, warp, lane, acc);
    __syncthreads();
    // thread tid sums fragment slot tid over the warps; A -> sA; P: fp32 (write_p) and hi + lo bf16 A fragments
    prep::ap_finish(red, tid, g, t, sA, sBeta, [&](int r, int s0, int nt, int hf, float p0, float p1) {
      if (p.write_p) *reinterpret_cast<float2*>(slot + SL::P + (r * C + s0) * 4) = make_float2(p0, p1);
      if constexpr (kWg) {  // P hi then P lo, each [16][16] bf16 row-major
        std::uint32_t hi, lo;
        split_bf16(p0, p1, hi, lo);
        reinterpret_cast<std::uint32_t*>(slot + SL::Pf)[(r * C + s0) / 2] = hi;
        reinterpret_cast<std::uint32_t*>(slot + SL::Pf + 512)[(r * C + s0) / 2] = lo;
      } else {
        prep::store_Pf(slot, SL::Pf, 0, lane, nt, hf, p0, p1);
      }
    });
  }
  __syncthreads();
  // ---- [W | U] = (I + A)^{-1} [Diag(beta) Kg | Diag(beta) V] (thread = column, v4's order) ----
  // 2 D columns: thread tid takes column tid (D = 128), tid < 128 (D = 64; whole warps idle past it),
  // tid and tid + 256 (D = 256). W columns (< D) cover whole warps, as store_afrag_col's shuffles need.
  auto subst = [&](const int col) {
    float x[C];
    prep::subst<D>(x, sBeta, sK, sV, sA, col);
    if (col < D) {
      if constexpr (kWg) prep::store_rowmajor_col<D>(reinterpret_cast<std::uint16_t*>(slot + SL::W), x, col);
      else prep::store_afrag_col(reinterpret_cast<uint4*>(slot + SL::W), x, col);
    } else {
      float* U = reinterpret_cast<float*>(slot + SL::U);
#pragma unroll
      for (int r = 0; r < C; ++r) U[r * D + (col - D)] = x[r];
    }
  };
  if constexpr (2 * D == 256) {
    subst(tid);
  } else if constexpr (2 * D < 256) {
    if (tid < 2 * D) subst(tid);
  } else {
    static_assert(2 * D == 512, "D = 256: two columns per thread");
    // one after the other: interleaved (unrolled) the two chains took 168 registers (1 CTA per SM)
#pragma unroll 1
    for (int col = tid; col < 2 * D; col += 256) subst(col);
  }
}

// Shared stage of one chunk for one state CTA (32 value columns), d_k = d_v = D. W, Qg, Kd adjacent (as
// in the slot): one block copy.
// U rows are padded by UPAD floats: v3 reads U transposed (U[r][v] for r = 2 tq + .., v = gq + ..), and a row stride
// of 36 floats puts the 32 lanes' reads in 32 different banks (stride 32: 4-way conflicts).
constexpr int UPAD = 4;
template <int D>
struct Stage {
  uint4 W[2 * D], Qg[2 * D], Kd[2 * D];
  float U[C][SLICE + UPAD];
  float P[C][C];
  float gn[D];
  uint4 Pf[64];  // P hi (32 lanes) then P lo (32 lanes)
};
static_assert(sizeof(Stage<128>) == 17152, "the D = 128 stage (51,456 B for NST = 3)");

/// What issue_stage copies besides W, Qg, Kd (all flags uniform over the CTA).
struct StageParts {
  bool qg;  // false: W and Kd only (v5 pass 1 past segment 0: no o, so no Qg)
  bool u;   // the CTA's U slice (false: the A_seg columns of pass 1, which run with U = 0)
  bool p;   // fp32 P (state_variant 2, or write_p)
  bool pf;  // P as hi + lo bf16 A fragments (v3 and the key split)
};

/// One chunk's workspace slot -> one state stage, by 16-byte cp.async (no commit: the caller commits). NT threads
/// (tid < NT); every trip count is a compile-time constant and each thread's copies are straight-line code with
/// immediate offsets: the runtime-bounded copy loops this replaces held ~35% of the v3 step's warp-stall samples on the
/// H200 (ncu source counters, session 8; bench/NOTES.md "KDA state pass v8"). slot: the chunk's slot (Slot<D> layout);
/// vbase: the CTA's first value column (U slice [C][SLICE] of columns vbase ..).
template <int D, int NT>
__device__ __forceinline__ void issue_stage(Stage<D>& st, const unsigned char* slot, int vbase, int tid,
                                            StageParts parts) {
  using SL = Slot<D>;
  static_assert((6 * D) % NT == 0 && (4 * D) % NT == 0 && D / 4 <= NT && 64 <= NT, "copy counts per thread");
  const uint4* src = reinterpret_cast<const uint4*>(slot) + tid;
  uint4* dst = st.W + tid;  // W, Qg, Kd are adjacent in the slot and in Stage
  if (parts.qg) {
#pragma unroll
    for (int k = 0; k < 6 * D / NT; ++k) cp_async16(dst + k * NT, src + k * NT);
  } else {
#pragma unroll
    for (int k = 0; k < 4 * D / NT; ++k) {  // W (2 D) then Kd (2 D), skipping Qg
      const int off = k * NT < 2 * D ? k * NT : k * NT + 2 * D;
      cp_async16(dst + off, src + off);
    }
  }
  if (parts.u) {
    constexpr int NU = C * SLICE / 4;  // 16-byte copies of the U slice
#pragma unroll
    for (int k = 0; k < (NU + NT - 1) / NT; ++k) {
      const int i = tid + k * NT, r = i / (SLICE / 4), c4 = i % (SLICE / 4);
      if (NU % NT == 0 || i < NU) cp_async16(&st.U[r][c4 * 4], slot + SL::U + (r * D + vbase + c4 * 4) * 4);
    }
  }
  if (tid < 64) {
    if (parts.p) cp_async16(&st.P[0][0] + 4 * tid, slot + SL::P + 16 * tid);
    if (parts.pf) cp_async16(&st.Pf[tid], slot + SL::Pf + 16 * tid);
  }
  if (tid < D / 4) cp_async16(&st.gn[0] + 4 * tid, slot + SL::gam_n + 16 * tid);
}

// kMmaPD = true (v3, the default): after D, the state update is issued first, then P D on the
// tensor cores as Phi Dhi + Phi Dlo + Plo Dhi (bf16 hi/lo splits, fp32 accumulate: ~2^-16 relative,
// i.e. fp32-class as the plan asks), accumulated straight onto Qg S. kMmaPD = false (v2): P D by
// fp32 FMAs from shared memory, o before the state update.
//
// kPass1 (v5 segment path, pass 1; kMmaPD only), segments 1..: no o; slices 0..3 run the segment
// from S = 0 with the true U (-> B_seg columns), slices 4..7 from S = I with U = 0 (-> A_seg
// columns: D = -W S); the end state goes to seg_B / seg_A. Segment 0 in pass 1 is the full state
// pass from S0 (o written; slices 4..7 exit) whose end state is S_start(1) (seg_S[0]). Without
// kPass1 the kernel is the state pass of one segment (all chunks when nseg_grid = 1), starting from
// S0 (segment 0) or seg_S.
//
// D: 64 or 128 (D / 16 k-tiles of W S and Qg S, D / 8 n-tiles of the update, D / 2 fp32 of S per thread);
// kMmaPD = false (v2) only at D = 128. D = 256 uses kda_state_ks_kernel<256, 2> (128 fp32 per thread here).
template <int D, bool kMmaPD, bool kPass1 = false>
__global__ void __launch_bounds__(64) kda_state_kernel(Params p) {
  static_assert(kMmaPD || !kPass1, "pass 1 exists only for the v3 state step");
  static_assert(D == 64 || D == 128, "the one-warp-per-16-columns state step: D = 64 or 128");
  static_assert(kMmaPD || D == 128, "state pass v2: D = 128 only");
  using SL = Slot<D>;  // (static members, not local constants: a lambda's capture of those changed the D = 128 PTX)
  constexpr int NJ = D / 8, NKT = D / 16;  // n-tiles (8 key rows) of S^T, k-tiles (16 key rows) of W S
  const int hv = blockIdx.y, n = blockIdx.z / p.nseg_grid, sgi = p.seg_base + blockIdx.z % p.nseg_grid;
  const bool acols = kPass1 && blockIdx.x >= D / SLICE;  // A_seg columns (pass 1)
  if (kPass1 && sgi == 0 && acols) return;  // segment 0 needs no A_seg (it starts from the known S0)
  // the full state step (o, Qg S, P D): the state pass, and segment 0 in pass 1 (its end state is S_start(1))
  const bool full = !kPass1 || sgi == 0;
  const int slice = acols ? blockIdx.x - D / SLICE : blockIdx.x;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
  const Seq sq = seq_info(p, n);
  const int nch_all = (sq.len + C - 1) / C;
  const int c_begin = sgi * p.seg_chunks, nch = min(nch_all, c_begin + p.seg_chunks);
  const int vbase = slice * SLICE, v0 = vbase + warp * 16;  // this warp's 16 value (or A_seg) columns

  extern __shared__ __align__(16) unsigned char dyn_smem[];
  Stage<D>* st = reinterpret_cast<Stage<D>*>(dyn_smem);  // NST stages

  // S^T accumulators: Sacc[j][e] = S[8j + 2tq + (e&1)][v0 + gq + 8(e>>1)]
  float Sacc[NJ][4];
  const long long sbase = (static_cast<long long>(n) * p.HV + hv) * D * D;
  const long long seg_stride = static_cast<long long>(p.N) * p.HV * D * D;
  const float* S_in = sgi == 0 ? p.S0 : kPass1 ? nullptr : p.seg_S + (sgi - 1) * seg_stride;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 8 * j + 2 * tq + (e & 1), col = v0 + gq + 8 * (e >> 1);
      Sacc[j][e] = S_in ? S_in[sbase + row * D + col] : (acols && row == col) ? 1.0f : 0.0f;
    }

  // chunk c's slot = slot_c0 + c slot_stride; what the stages hold (uniform over the CTA)
  const unsigned char* slot_c0 = p.ws + (static_cast<long long>(sq.slot0) * p.HV + hv) * SL::bytes;
  const long long slot_stride = static_cast<long long>(p.HV) * SL::bytes;
  const StageParts parts{full, !acols, !kMmaPD || (p.write_p && full), kMmaPD && full};
  // o rows gq and gq + 8 of a chunk: o_c0 + t0 so.t + o_row[hh] + 8 nt (columns v0 + 8 nt + 2 tq, + 1)
  bf16_t* const o_c0 = p.o + sq.bidx * p.so.b + static_cast<long long>(sq.bos) * p.so.t + hv * p.so.h + v0 + 2 * tq;
  const long long o_row[2] = {gq * p.so.t, (gq + 8) * p.so.t};

  // prologue: chunks 0 .. NST-2 in flight (one commit group per chunk, empty groups past the end)
#pragma unroll
  for (int i = 0; i < NST - 1; ++i) {
    if (c_begin + i < nch) issue_stage<D, 64>(st[i], slot_c0 + (c_begin + i) * slot_stride, vbase, tid, parts);
    cp_async_commit();
  }
  int s_cur = 0;  // the stage of chunk c: (c - c_begin) % NST; chunk c + NST - 1 goes to the stage of c - 1
  for (int c = c_begin; c < nch; ++c) {
    cp_async_wait<NST - 2>();  // the group of chunk c has landed (for this thread)
    __syncthreads();           // ... for every thread; and every warp is done with chunk c - 1
    const Stage<D>& S = st[s_cur];
    const int s_next = s_cur == 0 ? NST - 1 : s_cur - 1;  // (c - c_begin + NST - 1) % NST
    const int t0 = c * C, nvalid = min(C, sq.len - t0);
    if constexpr (kMmaPD) {
      // ---- D^T = U^T - S^T W^T and Qg S. S^T's k-tile is the A fragment (the accumulator layout of S^T is the
      // A layout), W's stored A fragment read as the B fragment of W^T, so D^T lands in registers in the layout
      // the update (A = D^T) and P D (B = D) take: no shared-memory transpose. W S is on the chunk-to-chunk
      // critical path: two independent accumulation chains (even / odd k-tiles), added at the end ----
      float dt[2][4] = {}, dt2[2][4] = {}, qs[2][4] = {};
#pragma unroll
      for (int kt = 0; kt < NKT; ++kt) {
        const uint4 wa = S.W[kt * 32 + lane], qa = full ? S.Qg[kt * 32 + lane] : uint4{};  // pass 1 loads no Qg
        const std::uint32_t aq[4] = {qa.x, qa.y, qa.z, qa.w};
        // S^T rows gq, gq + 8 x key columns 16 kt + 2 tq (+ 8): A fragment of S^T; {as[nt], as[nt + 2]} is the B
        // fragment of S (keys x value columns 8 nt ..) for Qg S
        const std::uint32_t as[4] = {pack_bf16(Sacc[2 * kt][0], Sacc[2 * kt][1]),
                                     pack_bf16(Sacc[2 * kt][2], Sacc[2 * kt][3]),
                                     pack_bf16(Sacc[2 * kt + 1][0], Sacc[2 * kt + 1][1]),
                                     pack_bf16(Sacc[2 * kt + 1][2], Sacc[2 * kt + 1][3])};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const std::uint32_t bw[2] = {nt ? wa.y : wa.x, nt ? wa.w : wa.z};  // W^T, chunk rows 8 nt ..
          mma_bf16((kt & 1) ? dt2[nt] : dt[nt], as, bw);
          const std::uint32_t bs[2] = {as[nt], as[nt + 2]};
          if (full) mma_bf16(qs[nt], aq, bs);
        }
      }
      // dt[nt][e] = (S^T W^T)[v = gq + 8 (e >> 1)][r = 8 nt + 2 tq + (e & 1)]; D^T = U^T - that (U = 0: A_seg columns)
      float d[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          d[nt][e] = (acols ? 0.0f : S.U[8 * nt + 2 * tq + (e & 1)][warp * 16 + gq + 8 * (e >> 1)]) -
                     (dt[nt][e] + dt2[nt][e]);
      // D^T as an A fragment (hi and lo parts); the same registers are the B fragments of P D
      std::uint32_t ad[4], adl[4];
      split_bf16(d[0][0], d[0][1], ad[0], adl[0]);
      split_bf16(d[0][2], d[0][3], ad[1], adl[1]);
      split_bf16(d[1][0], d[1][1], ad[2], adl[2]);
      split_bf16(d[1][2], d[1][3], ad[3], adl[3]);
      // ---- S^T <- Diag(gam_n) S^T + D^T Kd (first: it is the chunk-to-chunk critical path) ----
      state_decay_update<NJ, 1>(Sacc, S.gn, S.Kd, &ad, lane, tq);
      // the next chunk's copies, here so that they fill the update's tensor-core latency (the stage they overwrite
      // was last read in chunk c - 1, which every warp finished before the barrier above)
      if (c + NST - 1 < nch) issue_stage<D, 64>(st[s_next], slot_c0 + (c + NST - 1) * slot_stride, vbase, tid, parts);
      cp_async_commit();
      if (full) {
        // ---- o = scale (Qg S + P D), P D = Phi Dhi + Phi Dlo + Plo Dhi ----
        const uint4 ph = S.Pf[lane], pl = S.Pf[32 + lane];
        const std::uint32_t aph[4] = {ph.x, ph.y, ph.z, ph.w}, apl[4] = {pl.x, pl.y, pl.z, pl.w};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const std::uint32_t bh[2] = {ad[nt], ad[nt + 2]}, bl[2] = {adl[nt], adl[nt + 2]};
          mma_bf16(qs[nt], aph, bh);
          mma_bf16(qs[nt], aph, bl);
          mma_bf16(qs[nt], apl, bh);
        }
        bf16_t* const oc = o_c0 + static_cast<long long>(t0) * p.so.t;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            std::uint32_t* const dst = reinterpret_cast<std::uint32_t*>(oc + o_row[hh] + 8 * nt);
            const std::uint32_t val = pack_bf16(p.scale * qs[nt][2 * hh], p.scale * qs[nt][2 * hh + 1]);
            if (gq + 8 * hh < nvalid) *dst = val;
          }
      }
    } else {
      __shared__ float Dsh[2][C][C + 1];
      if (c + NST - 1 < nch) issue_stage<D, 64>(st[s_next], slot_c0 + (c + NST - 1) * slot_stride, vbase, tid, parts);
      cp_async_commit();
      // ---- W S and Qg S (A from the stage, B from the S^T accumulators) ----
      float ws[2][4] = {}, ws2[2][4] = {}, qs[2][4] = {};
#pragma unroll
      for (int kt = 0; kt < NKT; ++kt) {
        const uint4 wa = S.W[kt * 32 + lane], qa = S.Qg[kt * 32 + lane];
        const std::uint32_t aw[4] = {wa.x, wa.y, wa.z, wa.w}, aq[4] = {qa.x, qa.y, qa.z, qa.w};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const std::uint32_t b[2] = {pack_bf16(Sacc[2 * kt][2 * nt], Sacc[2 * kt][2 * nt + 1]),
                                      pack_bf16(Sacc[2 * kt + 1][2 * nt], Sacc[2 * kt + 1][2 * nt + 1])};
          mma_bf16((kt & 1) ? ws2[nt] : ws[nt], aw, b);
          mma_bf16(qs[nt], aq, b);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) ws[nt][e] += ws2[nt][e];
      // ---- D = U - W S (fp32) into the warp's shared tile ----
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = gq + 8 * (e >> 1), v = 8 * nt + 2 * tq + (e & 1);
          Dsh[warp][r][v] = S.U[r][warp * 16 + v] - ws[nt][e];
        }
      __syncwarp();
      // ---- o = scale (Qg S + P D) ----
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = gq + 8 * hh, v = 8 * nt + 2 * tq;
          float pd0 = 0.0f, pd1 = 0.0f;
#pragma unroll
          for (int s2 = 0; s2 < C; ++s2) {
            if (s2 <= r) {
              const float pr = S.P[r][s2];
              pd0 += pr * Dsh[warp][s2][v];
              pd1 += pr * Dsh[warp][s2][v + 1];
            }
          }
          if (r < nvalid) {
            const float o0 = p.scale * (qs[nt][2 * hh] + pd0), o1 = p.scale * (qs[nt][2 * hh + 1] + pd1);
            *reinterpret_cast<std::uint32_t*>(o_c0 + static_cast<long long>(t0) * p.so.t + o_row[hh] + 8 * nt) =
                pack_bf16(o0, o1);
          }
        }
      // ---- S^T <- Diag(gam_n) S^T + D^T Kd ----
      static_assert(NJ == 16, "v2: D = 128");
      const std::uint32_t ad[4] = {pack_bf16(Dsh[warp][2 * tq][gq], Dsh[warp][2 * tq + 1][gq]),
                                   pack_bf16(Dsh[warp][2 * tq][gq + 8], Dsh[warp][2 * tq + 1][gq + 8]),
                                   pack_bf16(Dsh[warp][2 * tq + 8][gq], Dsh[warp][2 * tq + 9][gq]),
                                   pack_bf16(Dsh[warp][2 * tq + 8][gq + 8], Dsh[warp][2 * tq + 9][gq + 8])};
      state_decay_update<NJ, 1>(Sacc, S.gn, S.Kd, &ad, lane, tq);
      __syncwarp();  // Dsh is rewritten next chunk
    }
    s_cur = s_cur == NST - 1 ? 0 : s_cur + 1;
  }
  float* S_out = kPass1 ? (sgi == 0 ? p.seg_S : (acols ? p.seg_A : p.seg_B) + sgi * seg_stride)
                        : sgi == p.seg_base + p.nseg_grid - 1 ? p.S_final : nullptr;  // pass 2: the last segment
  if (S_out) {
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        S_out[sbase + (8 * j + 2 * tq + (e & 1)) * D + v0 + gq + 8 * (e >> 1)] = Sacc[j][e];
  }
}

// ---- state pass v4 (state_variant 4: KS = 2; state_variant 5: KS = 4) ---------------------------
// The v3 state step (same slot, same bf16 operand roundings, fp32 state) with the KEY dimension of S
// split over KS warps per 16 value columns: one CTA of 2 KS warps per (32 value columns, value head,
// sequence), the same grid as v3. Warp (vw = warp & 1, kw = warp >> 1) holds S^T for the value columns
// v0 = 32 slice + 16 vw .. + 15 and the key rows k0 = kw 128 / KS .. + 128 / KS - 1 (64 / KS fp32
// accumulator registers instead of 64). Per chunk:
//  1. partial W S and Qg S over the warp's key rows (8 / KS k-tiles each instead of 8), stored to
//     shared memory (Wp transposed [v][r], XOR-swizzled; Qp [r][v] for the o columns other warps own);
//  2. a named barrier of the KS warps of the same value half;
//  3. every warp forms D = U - (sum over kw' = 0..KS-1 of the W S partials, in that fixed order) for
//     its 16 value columns directly in the D^T A-fragment layout (all KS warps compute bit-identical
//     D: same operands, same order), hi/lo bf16 split as v3;
//  4. S^T <- Diag(gam_n) S^T + D^T Kd on its own key rows only (16 / KS mma);
//  5. warps kw = 0 and 1 each finish 8 of the 16 o columns (n-tile nt = kw): Qg S summed over the KS
//     partials (fixed order kw' = 0..KS-1), + P D (Phi Dhi + Phi Dlo + Plo Dhi, as v3), o stored.
// Versus v3 only the fp32 summation order of W S and Qg S changes (v3: two chains over even / odd
// k-tiles, then one add; v4: one chain per key part, then the parts added in order). Per-warp issue per
// step drops from ~54 to ~27 mma (KS = 2), the warps per SM double: the v3 step is latency-bound with
// one warp per scheduler (bench/NOTES.md, "KDA state pass v7"). One-shot pass only (nseg_grid = 1):
// the v5 segment path keeps state_variant 3 kernels.
//
// D = 256 (kda_state_ks_kernel<256, 2>, the D = 256 state pass for state_variant 3): key rows 0..127 and
// 128..255 per warp pair, 16 n-tiles (64 fp32 of S) per thread as v3 at D = 128; 8 k-tiles of partial W S.
template <int D, int KS>
__global__ void __launch_bounds__(64 * KS) kda_state_ks_kernel(Params p) {
  static_assert(KS == 2 || KS == 4, "key split of 2 or 4 warps");
  static_assert(D == 128 || (D == 256 && KS == 2), "key split: D = 128 (KS = 2, 4) or D = 256 (KS = 2)");
  using SL = Slot<D>;  // (static members, not local constants: a lambda's capture of those changed the D = 128 PTX)
  constexpr int NT = 64 * KS;      // threads
  constexpr int KR = D / KS;       // key rows per warp
  constexpr int NJ = KR / 8;       // n-tiles of the S^T update (8 key rows each)
  constexpr int NKT = KR / 16;     // k-tiles of W S and Qg S (16 key rows each)
  constexpr int QSL = KS == 2 ? 1 : 2;  // Qp slots per warp: KS = 2 stores only the n-tile the partner owns
  const int hv = blockIdx.y, n = blockIdx.z, slice = blockIdx.x;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
  const int vw = warp & 1, kw = warp >> 1;
  const Seq sq = seq_info(p, n);
  const int nch = (sq.len + C - 1) / C;
  const int vbase = slice * SLICE, v0 = vbase + vw * 16, k0 = kw * KR;

  extern __shared__ __align__(16) unsigned char dyn_smem[];
  Stage<D>* st = reinterpret_cast<Stage<D>*>(dyn_smem);  // NST stages
  // W S partials, transposed: Wp[vw][kw][v][r ^ 8 ((v >> 1) & 1)] (conflict-free float2 reads of D^T pairs)
  __shared__ __align__(16) float Wp[2][KS][16][16];
  // Qg S partials: Qp[vw][kw][slot][r][v'] for the n-tile nt (v = 8 nt + v'); slot = nt (KS = 4) or 0
  // (KS = 2: warp kw stores n-tile 1 - kw only, the one its partner finishes)
  __shared__ __align__(16) float Qp[2][KS][QSL][16][8];

  // S^T accumulators: Sacc[jj][e] = S[k0 + 8jj + 2tq + (e&1)][v0 + gq + 8(e>>1)]
  float Sacc[NJ][4];
  const long long sbase = (static_cast<long long>(n) * p.HV + hv) * D * D;
#pragma unroll
  for (int jj = 0; jj < NJ; ++jj)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = k0 + 8 * jj + 2 * tq + (e & 1), col = v0 + gq + 8 * (e >> 1);
      Sacc[jj][e] = p.S0 ? p.S0[sbase + row * D + col] : 0.0f;
    }

  const unsigned char* slot_c0 = p.ws + (static_cast<long long>(sq.slot0) * p.HV + hv) * SL::bytes;
  const long long slot_stride = static_cast<long long>(p.HV) * SL::bytes;
  constexpr StageParts parts{true, true, false, true};
  // o rows gq and gq + 8 of a chunk: o_c0 + t0 so.t + o_row[hh] + 8 nt (columns v0 + 8 nt + 2 tq, + 1)
  bf16_t* const o_c0 = p.o + sq.bidx * p.so.b + static_cast<long long>(sq.bos) * p.so.t + hv * p.so.h + v0 + 2 * tq;
  const long long o_row[2] = {gq * p.so.t, (gq + 8) * p.so.t};

  // prologue: chunks 0 .. NST-2 in flight (one commit group per chunk, empty groups past the end)
#pragma unroll
  for (int i = 0; i < NST - 1; ++i) {
    if (i < nch) issue_stage<D, NT>(st[i], slot_c0 + i * slot_stride, vbase, tid, parts);
    cp_async_commit();
  }
  const int sw_r = ((gq >> 1) & 1) << 3;  // Wp swizzle of the rows this lane reads (v = gq, gq + 8)
  int s_cur = 0;                          // the stage of chunk c (c % NST)
  for (int c = 0; c < nch; ++c) {
    cp_async_wait<NST - 2>();  // the group of chunk c has landed (for this thread)
    __syncthreads();           // ... for every thread; and every warp is done with chunk c - 1 (Wp, Qp free)
    const int s_next = s_cur == 0 ? NST - 1 : s_cur - 1;  // (c + NST - 1) % NST
    const Stage<D>& S = st[s_cur];
    // ---- 1. partial W S and Qg S over key rows [k0, k0 + KR) ----
    float ws[2][4] = {}, ws2[2][4] = {}, qs[2][4] = {};
#pragma unroll
    for (int kl = 0; kl < NKT; ++kl) {
      const int kt = kw * NKT + kl;
      const uint4 wa = S.W[kt * 32 + lane], qa = S.Qg[kt * 32 + lane];
      const std::uint32_t aw[4] = {wa.x, wa.y, wa.z, wa.w}, aq[4] = {qa.x, qa.y, qa.z, qa.w};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const std::uint32_t b[2] = {pack_bf16(Sacc[2 * kl][2 * nt], Sacc[2 * kl][2 * nt + 1]),
                                    pack_bf16(Sacc[2 * kl + 1][2 * nt], Sacc[2 * kl + 1][2 * nt + 1])};
        mma_bf16((kl & 1) ? ws2[nt] : ws[nt], aw, b);
        mma_bf16(qs[nt], aq, b);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // ws[nt][e] is (r = gq + 8 (e >> 1), v = 8 nt + 2 tq + (e & 1)); swizzle bit from (v >> 1) & 1 = tq & 1
        const int r = gq + 8 * (e >> 1), v = 8 * nt + 2 * tq + (e & 1);
        Wp[vw][kw][v][r ^ ((tq & 1) << 3)] = NKT > 1 ? ws[nt][e] + ws2[nt][e] : ws[nt][e];
      }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      if (KS == 2 && nt == kw) continue;  // finished by this warp from its registers
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        *reinterpret_cast<float2*>(&Qp[vw][kw][KS == 2 ? 0 : nt][gq + 8 * hh][2 * tq]) =
            make_float2(qs[nt][2 * hh], qs[nt][2 * hh + 1]);
    }
    // ---- 2. the KS warps of this value half meet (named barrier 1 + vw; 0 is __syncthreads) ----
    if (vw == 0) asm volatile("bar.sync 1, %0;\n" ::"n"(32 * KS) : "memory");
    else asm volatile("bar.sync 2, %0;\n" ::"n"(32 * KS) : "memory");
    // ---- 3. D = U - W S in the D^T A-fragment layout, hi / lo bf16 ----
    // ad[2 rh + vh] = (D[8 rh + 2 tq][8 vh + gq], D[8 rh + 2 tq + 1][8 vh + gq]) (v3's layout)
    std::uint32_t ad[4], adl[4];
#pragma unroll
    for (int rh = 0; rh < 2; ++rh)
#pragma unroll
      for (int vh = 0; vh < 2; ++vh) {
        const int r = 8 * rh + 2 * tq, v = 8 * vh + gq;
        float2 w = *reinterpret_cast<const float2*>(&Wp[vw][0][v][r ^ sw_r]);
#pragma unroll
        for (int kp = 1; kp < KS; ++kp) {
          const float2 x = *reinterpret_cast<const float2*>(&Wp[vw][kp][v][r ^ sw_r]);
          w.x += x.x;
          w.y += x.y;
        }
        split_bf16(S.U[r][vw * 16 + v] - w.x, S.U[r + 1][vw * 16 + v] - w.y, ad[2 * rh + vh], adl[2 * rh + vh]);
      }
    // ---- 4. S^T <- Diag(gam_n) S^T + D^T Kd on this warp's key rows (the critical path: first) ----
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
      const int j = kw * NJ + jj;  // global n-tile of 8 key rows (NJ even: j & 1 == jj & 1)
      const float2 g = *reinterpret_cast<const float2*>(&S.gn[8 * j + 2 * tq]);
      Sacc[jj][0] *= g.x;
      Sacc[jj][1] *= g.y;
      Sacc[jj][2] *= g.x;
      Sacc[jj][3] *= g.y;
      const uint4 kb = S.Kd[(j / 2) * 32 + lane];
      const std::uint32_t b[2] = {(jj & 1) ? kb.z : kb.x, (jj & 1) ? kb.w : kb.y};
      mma_bf16(Sacc[jj], ad, b);
    }
    // the next chunk's copies (into the stage of chunk c - 1, which every warp finished before the barrier above),
    // here so that they fill the update's tensor-core latency
    if (c + NST - 1 < nch) issue_stage<D, NT>(st[s_next], slot_c0 + (c + NST - 1) * slot_stride, vbase, tid, parts);
    cp_async_commit();
    // ---- 5. o columns 8 nt .. 8 nt + 7 of this value half, nt = kw (warps kw = 0, 1) ----
    if (kw < 2) {
      const int nt = kw;
      // register selects (no dynamic register-array index: that would go to local memory)
      const float qo[4] = {nt ? qs[1][0] : qs[0][0], nt ? qs[1][1] : qs[0][1], nt ? qs[1][2] : qs[0][2],
                           nt ? qs[1][3] : qs[0][3]};
      float oc[4];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float sx = 0.0f, sy = 0.0f;
#pragma unroll
        for (int kp = 0; kp < KS; ++kp) {
          float2 x;
          if (kp == kw) x = make_float2(qo[2 * hh], qo[2 * hh + 1]);
          else x = *reinterpret_cast<const float2*>(&Qp[vw][kp][KS == 2 ? 0 : nt][gq + 8 * hh][2 * tq]);
          sx = kp == 0 ? x.x : sx + x.x;
          sy = kp == 0 ? x.y : sy + x.y;
        }
        oc[2 * hh] = sx;
        oc[2 * hh + 1] = sy;
      }
      const uint4 ph = S.Pf[lane], pl = S.Pf[32 + lane];
      const std::uint32_t aph[4] = {ph.x, ph.y, ph.z, ph.w}, apl[4] = {pl.x, pl.y, pl.z, pl.w};
      const std::uint32_t bh[2] = {nt ? ad[1] : ad[0], nt ? ad[3] : ad[2]}, bl[2] = {nt ? adl[1] : adl[0], nt ? adl[3] : adl[2]};
      mma_bf16(oc, aph, bh);
      mma_bf16(oc, aph, bl);
      mma_bf16(oc, apl, bh);
      const int t0 = c * C, nvalid = min(C, sq.len - t0);
      bf16_t* const ocol = o_c0 + static_cast<long long>(t0) * p.so.t + 8 * nt;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        std::uint32_t* const dst = reinterpret_cast<std::uint32_t*>(ocol + o_row[hh]);
        const std::uint32_t val = pack_bf16(p.scale * oc[2 * hh], p.scale * oc[2 * hh + 1]);
        if (gq + 8 * hh < nvalid) *dst = val;
      }
    }
    s_cur = s_cur == NST - 1 ? 0 : s_cur + 1;
  }
  if (p.S_final) {
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        p.S_final[sbase + (k0 + 8 * jj + 2 * tq + (e & 1)) * D + v0 + gq + 8 * (e >> 1)] = Sacc[jj][e];
  }
}

// ---- state pass v9w / v10w (state_variant 6, D = 128, sessions 9 and 10): the state step on wgmma --------------
// One CTA = one warpgroup (128 threads) per (64 value columns, value head, sequence); warp w holds S^T for value
// columns vbase + 16 w .. + 15 and all 128 keys, in the wgmma m64n128 accumulator layout, which is v3's Sacc layout.
// Per chunk, with W, Qg, Kd, P (hi, lo) read by wgmma from shared memory ONCE per warpgroup (v3: once per warp):
//   [1] D^T = S^T W^T and o^T = S^T Qg^T: 2 x 8 wgmma m64n16k16, A = S^T's bf16 k-tiles from registers (v8's
//       accumulator-to-A identity), B = W^T / Qg^T K-major (the slot's row-major W, Qg copied into 128-byte-swizzled
//       [16 x 64] blocks);
//   [2] D^T = U^T - that (fp32), hi / lo bf16 split (v3's registers and roundings);
//   [3] S^T <- Diag(gam_n) S^T + D^T Kd: one wgmma m64n128k16, A = D^T hi (registers), B = Kd MN-major (transposed);
//       o^T += D^T P^T as Phi Dhi + Phi Dlo + Plo Dhi (3 wgmma m64n16k16, B = P^T K-major);
//   [4] o = scale o^T^T, stored through a lane-pair exchange (4-byte stores).
// The prepare writes this slot layout (kda_prepare_v6_kernel<128, true>: W, Qg, Kd [16][128] and P hi / lo [16][16]
// bf16 row-major at the same slot offsets); the same bf16 operand roundings and fp32 state as v3: only the fp32
// summation order inside the tensor-core products may differ.
namespace wg {
constexpr int SLC = 64;                                  // value columns per CTA
constexpr int UP = SLC + 4;                              // fp32 row stride of the U tile (conflict-free transposed reads)
// W and Qg as one B operand [W; Qg]^T (N = 32): per 64-key block kb a swizzled [32 x 64] bf16 block at kb * 4096 (rows
// 0..15 W, 16..31 Qg); Kd: 2 swizzled [16 x 64] blocks (2048 B) at OFF_KD
constexpr int OFF_WQ = 0, OFF_KD = 8192;
constexpr int OFF_PH = 12288, OFF_PL = 14336;            // one swizzled [16 x 64] block each (columns 0..15 used)
// U [16][UP] fp32; gam_n: one 512-byte copy per warp (v10w: each warp copies the gam_n and the U columns it reads itself,
// so it reads them before the CTA's barrier)
constexpr int OFF_U = 16384, OFF_GN = OFF_U + C * UP * 4, STAGE = (OFF_GN + 4 * 512 + 1023) / 1024 * 1024;
constexpr int SMEM = NST * STAGE + 1024;                 // + slack to align the base to 1024 bytes
static_assert(STAGE == 23552 && SMEM <= 227 * 1024, "wgmma state stage");

// the 128-byte swizzle, descriptor, fence / commit / wait helpers: kernels/common/wgmma.cuh
using wgmma_util::desc;
using wgmma_util::fence_async_smem;
using wgmma_util::fence_reg;
using wgmma_util::sw;
using wgmma_util::wgmma_commit;
using wgmma_util::wgmma_fence;
using wgmma_util::wgmma_wait;

/// D[64 x 16] (+)= A B, A [64 x 16] bf16 in registers (m16n8k16 A-fragment layout per warp), B K-major in shared
/// memory; ACC = 0: D = A B (D's registers are not read: no zero-initialisation between the fences).
template <int ACC = 1>
__device__ __forceinline__ void mma_n16(float* d, const std::uint32_t* a, std::uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(ACC));
}
/// D[64 x 32] = A B (ACC = 0) or += (ACC = 1), A [64 x 16] bf16 in registers, B K-major in shared memory.
template <int ACC = 1>
__device__ __forceinline__ void mma_n32(float* d, const std::uint32_t* a, std::uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(ACC));
}
/// D[64 x 128] += A B, A [64 x 16] bf16 in registers, B MN-major (transposed) in shared memory; D: 64 fp32 per thread.
__device__ __forceinline__ void mma_n128_t(float* d, const std::uint32_t* a, std::uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

/// 16-byte cp.async to a shared-window address (the state pass keeps its stage addresses as 32-bit shared addresses:
/// no generic-to-shared conversion and no 64-bit arithmetic per copy in the step).
__device__ __forceinline__ void cp16(std::uint32_t sdst, const void* gsrc) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sdst), "l"(gsrc));
}
/// Thread tid's share of copying one chunk's slot (the wgmma layout) into a stage, as offsets computed once per thread
/// (v10w): destinations from the stage's shared address, sources from the slot's first byte. Per stage, 10 copies of 16 B:
/// W, Qg, Kd (6: q = tid + 128 k, slot bytes 16 q, row r = tid / 16 + 8 (k & 1), 16-byte chunk c = tid % 16 of the
/// 128-byte-swizzled blocks: [W; Qg] k < 4, Kd k = 4, 5), P hi / lo (tid < 64), U (2: lane = 4 r + c4 copies rows
/// r, r + 8, columns 16 warp + 4 c4 .. + 3: the warp's own 16 value columns), gam_n (one 16-byte part per lane into the
/// warp's own 512-byte copy).
struct CopyPlan {
  std::uint32_t d_wq, d_kd, d_p, d_u, d_g;  // shared offsets from the stage base
  std::uint32_t s_wqk, s_p, s_u, s_g;       // byte offsets into the slot
  __device__ __forceinline__ CopyPlan(int tid, int vbase) {
    using SL = Slot<128>;
    const int r = tid / 16, c = tid % 16;
    const std::uint32_t x = r * 128 + (((c % 8) ^ r) << 4);  // sw(r, c % 8); r < 8, so r & 7 = r
    d_wq = (c / 8) * 4096 + x;
    d_kd = OFF_KD + (c / 8) * 2048 + x;
    const int h = (tid / 32) & 1, pr = (tid % 32) / 2, pc = tid % 2;
    d_p = (h ? OFF_PL : OFF_PH) + sw(pr, pc);
    const int warp = tid / 32, lane = tid % 32, ur = lane / 4, uc = 16 * warp + 4 * (lane % 4);
    d_u = OFF_U + (ur * UP + uc) * 4;
    d_g = OFF_GN + 512 * warp + 16 * lane;
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
};
}  // namespace wg

// v10w (session 10): the v9w step with the same wgmma products in the same order (bit-identical results), rearranged
// after the session-10 ncu source profile of v9w (T = 65536, H = 32: 409 instructions and ~1,090 cycles per warp-step,
// one warp per scheduler): (1) the wgmma descriptors are formed once (a stage or block offset adds to the start-address
// field; v9w rebuilt each from the address: 5 dependent uniform instructions before each of the 8 chained wgmma, ~13% of
// the stall samples); (2) the stage is addressed from the shared array itself, so U and gam_n are read by LDS (v9w: generic
// LD.E, whose long scoreboard held 5.5% of the samples); each warp copies the gam_n and U values it reads itself and
// reads them before the CTA's barrier (step 2);
// (3) the copies and the o stores use offsets computed once per thread (v9w: ~95 and ~50 instructions of 64-bit address
// arithmetic per step). (Storing chunk c's o during chunk c + 1's chain, or the decay there, is not possible: ptxas then
// injects a wgmma wait right after the chain's issue, see the note at the decay.)
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

  // S^T accumulators (wgmma m64n128 layout = v3's): Sacc[4 j + e] = S[8 j + 2 tq + (e & 1)][v0 + gq + 8 (e >> 1)]
  float Sacc[64];
  const long long sb = (static_cast<long long>(n) * p.HV + hv) * D * D;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      Sacc[4 * j + e] = p.S0 ? p.S0[sb + (8 * j + 2 * tq + (e & 1)) * D + v0 + gq + 8 * (e >> 1)] : 0.0f;

  const long long slot_stride = static_cast<long long>(p.HV) * SL::bytes;
  const unsigned char* slot_next = p.ws + (static_cast<long long>(sq.slot0) * p.HV + hv) * SL::bytes;
  const wg::CopyPlan cpl(tid, vbase);
#pragma unroll
  for (int i = 0; i < NST - 1; ++i) {
    if (i < nch) cpl.issue(sbase_a + i * wg::STAGE, slot_next, tid);
    cp_async_commit();
    slot_next += slot_stride;
  }
  // descriptors of stage 0 (start address >> 4 in the low 14 bits; the shared window is below 2^18 bytes, so adding a
  // stage or block offset >> 4 to the low word never carries into the next field): low words, one shared high word
  const std::uint64_t dwq0 = wg::desc(sbase_a + wg::OFF_WQ, 16, 1024);
  const std::uint32_t hi_k = static_cast<std::uint32_t>(dwq0 >> 32);  // sbo 1024, 128-byte swizzle
  const std::uint32_t lo_wq = static_cast<std::uint32_t>(dwq0);
  const std::uint32_t lo_kd = static_cast<std::uint32_t>(wg::desc(sbase_a + wg::OFF_KD, 2048, 1024));
  const std::uint32_t lo_ph = static_cast<std::uint32_t>(wg::desc(sbase_a + wg::OFF_PH, 16, 1024));
  const std::uint32_t lo_pl = static_cast<std::uint32_t>(wg::desc(sbase_a + wg::OFF_PL, 16, 1024));
  auto dsc = [hi_k](std::uint32_t lo) { return (static_cast<std::uint64_t>(hi_k) << 32) | lo; };

  // o: this thread's rows 2 tq + odd (+ 8) and columns v0 + (gq & ~1) (+ 8) of each chunk, as 4-byte bf16 pairs
  const bool odd = gq & 1;
  const int orow = 2 * tq + (odd ? 1 : 0);
  bf16_t* o_next = p.o + sq.bidx * p.so.b + static_cast<long long>(sq.bos) * p.so.t + hv * p.so.h +
                   static_cast<long long>(orow) * p.so.t + v0 + (gq & ~1);
  const long long o8 = 8 * p.so.t, o_chunk = C * p.so.t;
  int s_cur = 0;
  for (int c = 0; c < nch; ++c) {
    cp_async_wait<NST - 2>();
    const int s_next = s_cur == 0 ? NST - 1 : s_cur - 1;
    const unsigned char* const st = sbase + s_cur * wg::STAGE;
    const std::uint32_t so = (s_cur * wg::STAGE) >> 4;  // the stage's offset in descriptor units
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
    wg::fence_async_smem();
    __syncthreads();  // every thread's W, Qg, Kd, P copies of this chunk, for the wgmma
    // ---- [1] D^T and o^T's Qg part: one m64n32 chain over [W; Qg]^T, A = S^T's bf16 k-tiles ----
    std::uint32_t as[8][4];
#pragma unroll
    for (int kt = 0; kt < 8; ++kt) {
      as[kt][0] = pack_bf16(Sacc[8 * kt + 0], Sacc[8 * kt + 1]);
      as[kt][1] = pack_bf16(Sacc[8 * kt + 2], Sacc[8 * kt + 3]);
      as[kt][2] = pack_bf16(Sacc[8 * kt + 4], Sacc[8 * kt + 5]);
      as[kt][3] = pack_bf16(Sacc[8 * kt + 6], Sacc[8 * kt + 7]);
    }
    // the decay of S^T before the chain is issued: ptxas injects a wgmma wait before any access to a wgmma accumulator
    // register (Sacc, ot) while a wgmma is pending, so nothing of S^T or o^T can run in the chain's shadow
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float2 g = g2[j];
      Sacc[4 * j + 0] *= g.x;
      Sacc[4 * j + 1] *= g.y;
      Sacc[4 * j + 2] *= g.x;
      Sacc[4 * j + 3] *= g.y;
    }
    float dq[16];  // dq[0..7] = S^T W^T (r = 0..15), dq[8..15] = S^T Qg^T; written by the first wgmma (ACC = 0)
    wg::wgmma_fence();
    wg::mma_n32<0>(dq, as[0], dsc(lo_wq + so));
#pragma unroll
    for (int kt = 1; kt < 8; ++kt) wg::mma_n32(dq, as[kt], dsc(lo_wq + so + ((kt / 4) * 4096 + (kt % 4) * 32) / 16));
    wg::wgmma_commit();
    wg::wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < 16; ++e) wg::fence_reg(dq[e]);
    float ot[8];  // o^T (a copy: accumulating the P D wgmma onto dq[8..15] in place makes ptxas serialise every wgmma
                  // for lack of registers (C7511); the copy costs one injected warpgroup.arrive, as in v9w)
#pragma unroll
    for (int e = 0; e < 8; ++e) ot[e] = dq[8 + e];
    // ---- [2] D^T = U^T - S^T W^T (dq[4 nt + e]: v = gq + 8 (e >> 1), r = 8 nt + 2 tq + (e & 1)), hi / lo ----
    float d[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) d[e] = u[e] - dq[e];
    std::uint32_t ad[4], adl[4];
    split_bf16(d[0], d[1], ad[0], adl[0]);
    split_bf16(d[2], d[3], ad[1], adl[1]);
    split_bf16(d[4], d[5], ad[2], adl[2]);
    split_bf16(d[6], d[7], ad[3], adl[3]);
    // ---- [3] S^T <- Diag(gam_n) S^T + D^T Kd; o^T += D^T P^T (Phi Dhi + Phi Dlo + Plo Dhi) ----
    wg::wgmma_fence();
    wg::mma_n128_t(Sacc, ad, dsc(lo_kd + so));
    wg::mma_n16(ot, ad, dsc(lo_ph + so));
    wg::mma_n16(ot, adl, dsc(lo_ph + so));
    wg::mma_n16(ot, ad, dsc(lo_pl + so));
    wg::wgmma_commit();
    // the next chunk's copies (into the stage of chunk c - 1: every wgmma that read it was waited for in step c - 1,
    // and every thread is past this step's barrier)
    if (c + NST - 1 < nch) cpl.issue(sbase_a + s_next * wg::STAGE, slot_next, tid);
    cp_async_commit();
    slot_next += slot_stride;
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
    }
    // ---- [4] o rows 8 nt + 2 tq (+ 1), columns v0 + gq (+ 8): lane pairs (gq, gq ^ 1) exchange so that the even-gq
    // lane stores row 8 nt + 2 tq and the odd one row 8 nt + 2 tq + 1, each as (v, v + 1) bf16 pairs ----
    const int nvalid = min(C, sq.len - c * C);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int vh = 0; vh < 2; ++vh) {
        const float x0 = p.scale * ot[4 * nt + 2 * vh], x1 = p.scale * ot[4 * nt + 2 * vh + 1];  // rows r0, r0 + 1
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
        p.S_final[sb + (8 * j + 2 * tq + (e & 1)) * D + v0 + gq + 8 * (e >> 1)] = Sacc[4 * j + e];
  }
}

// v5 segment path, combine: S_start(s + 1) = A_seg(s) S_start(s) + B_seg(s) for s = 1 .. P-2, in
// fp32 (FMA chain from B over m = 0..127), from S_start(1) = seg_S[0] (segment 0's end state, pass
// 1). Launched for P >= 3. One CTA (256 threads) per
// (32-column slice of d_v, value head, sequence): column slices of S are independent.
// D = 64 or 128 (rows i0 + 8 r, r < D / 8); at D = 256 A_seg alone would be 256 KB of shared memory.
template <int D>
constexpr int cmb_smem = (D * D + D * SLICE) * 4;  // A_seg (64 KB at D = 128) + the S slice (16 KB)
static_assert(cmb_smem<128> <= 227 * 1024, "combine: shared memory per CTA");
template <int D>
__global__ void __launch_bounds__(256) kda_segment_combine_kernel(Params p, int nseg) {
  static_assert(D == 64 || D == 128, "combine: D = 64 or 128");
  constexpr int NR = D / 8;  // rows per thread
  const int slice = blockIdx.x, hv = blockIdx.y, n = blockIdx.z, tid = threadIdx.x;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  float* Ash = reinterpret_cast<float*>(dyn_smem);  // [D][D]
  float* Ssh = Ash + D * D;                          // [D][SLICE]
  const long long sbase = (static_cast<long long>(n) * p.HV + hv) * D * D;
  const long long seg_stride = static_cast<long long>(p.N) * p.HV * D * D;
  const int vb = slice * SLICE, j = tid % SLICE, i0 = tid / SLICE;  // rows i0 + 8 r, r = 0..NR-1
  for (int e = tid; e < D * SLICE; e += 256) {
    const int r = e / SLICE, cc = e % SLICE;
    Ssh[e] = p.seg_S[sbase + r * D + vb + cc];
  }
  for (int sg = 1; sg + 1 < nseg; ++sg) {
    const float* A = p.seg_A + sg * seg_stride + sbase;
    const float* Bm = p.seg_B + sg * seg_stride + sbase;
    for (int e = tid; e < D * D / 4; e += 256)
      reinterpret_cast<float4*>(Ash)[e] = reinterpret_cast<const float4*>(A)[e];
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = Bm[(i0 + 8 * r) * D + vb + j];
    __syncthreads();  // Ash and Ssh (previous segment's result) complete
#pragma unroll 4
    for (int m = 0; m < D; ++m) {
      const float sv = Ssh[m * SLICE + j];
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[r] = fmaf(Ash[(i0 + 8 * r) * D + m], sv, acc[r]);
    }
    __syncthreads();  // every thread is done reading Ash and Ssh
    float* Sout = p.seg_S + sg * seg_stride + sbase;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      Ssh[(i0 + 8 * r) * SLICE + j] = acc[r];
      Sout[(i0 + 8 * r) * D + vb + j] = acc[r];
    }
  }
}

Strides resolve(Strides s, long long T, long long heads, long long Dl) {
  if (s.h == 0) s.h = Dl;
  if (s.t == 0) s.t = heads * s.h;
  if (s.b == 0) s.b = T * s.t;
  return s;
}

struct Checked {
  Params p;
  int N, max_chunks;
  long long slots;
};

Checked check_prefill(const KdaPrefillArgs& a) {
  const char* op = "kda_prefill";
  check_dim(a.D, op);
  const int D = a.D;
  if (a.pair_chunks) {  // the two-chunk step (first version): D = 128, one-shot, the default kernels' plan
    if (D != 128)
      throw Error(std::string(op) + ": pair_chunks = true with D = " + std::to_string(D) +
                  "; accepted: D = 128 (the pair step's first version), or pair_chunks = false");
    if (a.segment_state >= 2)
      throw Error(std::string(op) + ": pair_chunks = true with segment_state = " + std::to_string(a.segment_state) +
                  "; accepted: segment_state 0 or 1 (the pair step has no segment-parallel path), or pair_chunks = false");
    if (a.state_variant != 3 || a.prepare_variant != 6)
      throw Error(std::string(op) + ": pair_chunks = true with state_variant = " + std::to_string(a.state_variant) +
                  ", prepare_variant = " + std::to_string(a.prepare_variant) +
                  "; accepted: state_variant = 3 and prepare_variant = 6 (the pair kernels replace both)");
  }
  if (D != 128 && (a.prepare_variant != 6 || a.state_variant != 3))
    throw Error(std::string(op) + ": prepare_variant = " + std::to_string(a.prepare_variant) + ", state_variant = " +
                std::to_string(a.state_variant) + " with D = " + std::to_string(D) +
                "; accepted at D = 64 and 256: prepare_variant = 6 and state_variant = 3 (prepare v4 and state variants "
                "2, 4, 5 are D = 128 only)");
  if (D == 256 && a.segment_state >= 2)
    throw Error(std::string(op) + ": segment_state = " + std::to_string(a.segment_state) +
                " with D = 256; accepted at D = 256: 0 (auto, which takes 1) or 1 (the segment path's d_k x d_k "
                "combine does not fit shared memory at D = 256)");
  if (a.T < 1) throw Error(std::string(op) + ": T = " + std::to_string(a.T) + "; accepted: T >= 1");
  if (a.B < 1) throw Error(std::string(op) + ": B = " + std::to_string(a.B) + "; accepted: B >= 1");
  if (a.H < 1 || a.HV < 1 || a.HV % a.H != 0)
    throw Error(std::string(op) + ": H = " + std::to_string(a.H) + ", HV = " + std::to_string(a.HV) +
                "; accepted: H >= 1 and HV a positive multiple of H");
  if (!(a.scale > 0.0f)) throw Error(std::string(op) + ": scale = " + std::to_string(a.scale) + "; accepted: scale > 0");
  check_gate(a.gate, a.HV, op);
  check_ptr(a.q, 16, "q");
  check_ptr(a.k, 16, "k");
  check_ptr(a.v, 16, "v");
  check_ptr(a.g, 16, "g");
  check_ptr(a.beta, 2, "beta");
  check_ptr(a.o, 16, "o");
  check_ptr(a.S0, 16, "S0", false);
  check_ptr(a.S_final, 16, "S_final", false);
  check_ptr(a.workspace, 16, "workspace", false);
  Checked ck{};
  Params& p = ck.p;
  p.B = a.B; p.T = a.T; p.H = a.H; p.HV = a.HV; p.group = a.HV / a.H;
  p.q = a.q; p.k = a.k; p.v = a.v; p.g = a.g; p.beta = a.beta; p.o = a.o;
  p.sq = resolve(a.sq, a.T, a.H, D);
  p.sk = resolve(a.sk, a.T, a.H, D);
  p.sv = resolve(a.sv, a.T, a.HV, D);
  p.sg = resolve(a.sg, a.T, a.HV, D);
  p.so = resolve(a.so, a.T, a.HV, D);
  p.sbeta = resolve(a.sbeta, a.T, a.HV, 1);
  for (auto [s, name] : {std::pair{p.sq, "q"}, {p.sk, "k"}, {p.sv, "v"}, {p.sg, "g"}, {p.so, "o"}}) {
    check_stride(s.b, 8, (std::string(name) + ".b").c_str());
    check_stride(s.t, 8, (std::string(name) + ".t").c_str());
    check_stride(s.h, 8, (std::string(name) + ".h").c_str());
  }
  p.A_log = a.gate.A_log; p.bias = a.gate.bias; p.g_min = a.gate.g_min; p.scale = a.scale;
  p.fuse_gate = a.gate.fused; p.l2norm = a.l2norm_qk; p.beta_sigmoid = a.beta_sigmoid;
  p.write_p = a.state_variant == 2 || !a.compact_workspace;
  p.S0 = a.S0; p.S_final = a.S_final; p.cu = a.cu_seqlens;
  if (a.cu_seqlens) {
    check_ptr(a.cu_seqlens, 4, "cu_seqlens");
    if (a.B != 1)
      throw Error(std::string(op) + ": cu_seqlens given with B = " + std::to_string(a.B) +
                  "; accepted: B = 1 (sequences packed along T)");
    if (a.num_seqs < 1 || a.max_seqlen < 1 || a.max_seqlen > a.T)
      throw Error(std::string(op) + ": cu_seqlens given with num_seqs = " + std::to_string(a.num_seqs) +
                  ", max_seqlen = " + std::to_string(a.max_seqlen) + "; accepted: num_seqs >= 1, 1 <= max_seqlen <= T");
    ck.N = a.num_seqs;
    ck.max_chunks = (a.max_seqlen + C - 1) / C;
    ck.slots = static_cast<long long>(a.num_seqs) + a.T / C + 1;
    p.nchunk_fixed = 0;
  } else {
    ck.N = a.B;
    ck.max_chunks = (a.T + C - 1) / C;
    ck.slots = static_cast<long long>(a.B) * ck.max_chunks;
    p.nchunk_fixed = ck.max_chunks;
  }
  p.N = ck.N;
  p.nseg_grid = 1;
  p.seg_chunks = 1 << 30;
  p.seg_base = 0;
  p.chunk_base = 0;
  p.seg_S = p.seg_A = p.seg_B = nullptr;
  if (a.segment_state < 0 || a.segment_state > 64)
    throw Error(std::string(op) + ": segment_state = " + std::to_string(a.segment_state) +
                "; accepted: 0 (auto), 1 (off) or 2..64 segments");
  if (a.segment_state >= 2 && (a.cu_seqlens || a.state_variant != 3))
    throw Error(std::string(op) + ": segment_state = " + std::to_string(a.segment_state) +
                " needs fixed-length sequences (no cu_seqlens) and state_variant = 3; got " +
                (a.cu_seqlens ? "cu_seqlens" : "state_variant = " + std::to_string(a.state_variant)));
  return ck;
}

}  // namespace

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

namespace {
/// Segments of the overlapped schedule (v4): fixed-length batches with T >= 2048 are cut into
/// K0 = min(8, max(2, T / 2048)) segments of a multiple of 16 tokens (>= ~2048 tokens each; session 11's H200 sweep of
/// K at T = 8192: K = 4 beat the former T / 1024 = 8 by 3-4% (H = 64: 0.785 vs 0.817 ms, H = 96: 1.166 vs 1.202), K = 2
/// beat 4 at B = 4 x 4096, and K = 8 stays best at T = 65536 (3.455 ms; K = 4: 3.568, K = 16: 3.46; see
/// bench/NOTES.md "Segment count"); the prepare kernel of segment k + 1 (caller's stream) runs
/// while the state pass of segment k runs (a side stream of higher priority); the state crosses
/// segments through an fp32 buffer, which is exact (the same fp32 values the registers held).
struct Segments {
  int K = 1, seg = 0;
};
Segments segments_of(const KdaPrefillArgs& a) {
  Segments sg;
  sg.seg = a.T;
  if (a.cu_seqlens || !a.overlap_segments || a.T < 2048) return sg;
  const int K0 = std::min(8, std::max(2, a.T / 2048));
  sg.seg = ((a.T + K0 - 1) / K0 + C - 1) / C * C;
  sg.K = (a.T + sg.seg - 1) / sg.seg;
  return sg;
}
std::size_t state_buffer_bytes(const KdaPrefillArgs& a, const Segments& sg) {
  return sg.K > 1 ? static_cast<std::size_t>(a.B) * a.HV * a.D * a.D * 4 : 0;
}

/// SMs of the current device (queried once per device).
int sm_count() {
  static int cache[64] = {};
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  int sms = dev < 64 ? cache[dev] : 0;
  if (sms == 0) {
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    if (dev < 64) cache[dev] = sms;
  }
  return sms;
}

/// A side stream of the greatest priority forked from `stream` (it first waits for everything enqueued on
/// `stream` so far) and n events for the caller's cross-stream edges: link(i, from, to) makes `to` wait for
/// what `from` has enqueued so far (event i < n); join() makes `stream` wait for the side stream. The stream
/// and the events are destroyed with the object (also when a launch throws; queued work still completes).
class SideStream {
 public:
  SideStream(cudaStream_t stream, int n) : stream_(stream), ev_(n + 2, nullptr) {
    int prio_least = 0, prio_greatest = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&prio_least, &prio_greatest), "cudaDeviceGetStreamPriorityRange");
    cuda_check(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, prio_greatest), "cudaStreamCreateWithPriority");
    try {
      for (auto& e : ev_) cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      link(n, stream_, side_);
    } catch (...) {
      release();
      throw;
    }
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  ~SideStream() { release(); }
  cudaStream_t side() const { return side_; }
  void link(int i, cudaStream_t from, cudaStream_t to) {
    cuda_check(cudaEventRecord(ev_[i], from), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(to, ev_[i], 0), "cudaStreamWaitEvent");
  }
  void join() { link(static_cast<int>(ev_.size()) - 1, side_, stream_); }

 private:
  void release() {
    for (auto& e : ev_)
      if (e) cudaEventDestroy(e);
    if (side_) cudaStreamDestroy(side_);
  }
  cudaStream_t stream_ = nullptr, side_ = nullptr;
  std::vector<cudaEvent_t> ev_;
};

/// The v5 segment-parallel state pass (see kda.hpp, segment_state): P segments of seg_chunks chunks.
struct SegPlan {
  int P = 1, seg_chunks = 0;
};
/// Auto rule (segment_state = 0): only for fixed-length batches, state_variant 3, when the one-shot
/// pass has at most one CTA per SM (N * HV * 4 <= SMs: 2 warps per SM, latency-bound) and >= 1024
/// chunks (T >= 16384). Cost model in us per chunk step, from the v3/v4 H200 runs: a step takes
/// t(k) = 1.27, 1.38, 1.73, 2.1 us with k = 1, 2, 3, 4 state CTAs per SM (8192x64: 2/SM 0.706 ms /
/// 512 steps; 8192x96: 2.9/SM 0.884 ms / 512; 65536x32: 1/SM 5.196 ms / 4096; 4 is extrapolated),
/// at most 4 CTAs per SM (51 KB of smem each), more make waves. Pass 1 steps weigh 0.75 (no Qg S,
/// P D, o; half the bytes). P in 2..16 minimising pass 1 + pass 2 is taken when it is below 0.9 of
/// the one-shot pass (both schedules overlap the prepare with state work; v4's overlap hid ~0.7 ms
/// of the 2.9 ms prepare at 65536x32). Pass 1 = segment 0's full pass (N HV 4 CTAs, weight 1) +
/// segments 1..P-2 (N HV 8 CTAs each, weight 0.75); pass 2 = segments 1..P-1.
/// H = 32, T = 65536 on 132 SMs: P = 3, model 3.85 ms vs 5.2 ms one-shot (0.74).
double pass_cost(long long ctas, int sms, double steps) {
  static const double t[5] = {0.0, 1.27, 1.38, 1.73, 2.1};
  const long long per_sm = (ctas + sms - 1) / sms;
  if (per_sm <= 4) return steps * t[per_sm];
  return static_cast<double>((per_sm + 3) / 4) * steps * t[4];
}
SegPlan segment_plan(const KdaPrefillArgs& a, int N, int nch) {
  SegPlan sp;
  if (a.cu_seqlens || a.state_variant != 3 || a.segment_state == 1 || a.D == 256 || a.pair_chunks) return sp;  // D = 256, pair: refused
  int P = 0;
  if (a.segment_state >= 2) {
    P = a.segment_state;
  } else {
    const int sms = sm_count();
    const long long base = static_cast<long long>(N) * a.HV * (a.D / SLICE);  // one-shot state CTAs
    if (base > sms || nch < 1024) return sp;
    double best = 0.9 * pass_cost(base, sms, nch);
    for (int q = 2; q <= 16; ++q) {
      const double L = (nch + q - 1) / q;
      // pass 1: segment 0 full (base CTAs) + segments 1..q-2 (2 base CTAs each, lighter); pass 2: q - 1 segments
      const double w1 = (1.0 + 0.75 * 2 * (q - 2)) / (1.0 + 2 * (q - 2));
      const double cost = w1 * pass_cost((1 + 2LL * (q - 2)) * base, sms, L) + pass_cost((q - 1) * base, sms, L);
      if (cost < best) {
        best = cost;
        P = q;
      }
    }
    if (P == 0) return sp;
  }
  sp.seg_chunks = (nch + P - 1) / P;
  sp.P = (nch + sp.seg_chunks - 1) / sp.seg_chunks;
  if (sp.P < 2) sp = SegPlan{};
  return sp;
}
/// The state schedule kda_prefill runs: the segment plan and the state kernel. The auto rule (segment_state = 0,
/// state_variant 3, D = 128, prepare v6, no pair step) runs the one-shot pass with the wgmma state kernel
/// (state_variant 6) where the plan is one-shot or a 2- or 3-segment path (session 9; session 6 took the key split
/// (state_variant 4) for P = 2, 3: 0.96 .. 1.00 of the P = 3 path; P = 9 (H = 16) stays the segment path, 0.63 of the
/// one-shot key split; bench/NOTES.md).
struct StatePlan {
  SegPlan sp;
  int state_variant = 3;
};
StatePlan state_plan(const KdaPrefillArgs& a, int N, int nch) {
  StatePlan s{segment_plan(a, N, nch), a.state_variant};
  // session 9: the one-shot wgmma state pass (state_variant 6) wherever the one-shot pass runs, and where the wave
  // model's P is 2 or 3 (session 6 took the key split there); measured 1.03 .. 1.16x on the ANCHORS shapes
  if (a.segment_state == 0 && a.state_variant == 3 && a.D == 128 && !a.pair_chunks && a.prepare_variant == 6 &&
      s.sp.P <= 3) {
    s.sp = SegPlan{};
    s.state_variant = 6;
  }
  return s;
}
std::size_t seg_buffer_bytes(const KdaPrefillArgs& a, int N, const SegPlan& sp) {
  return sp.P > 1 ? 3ull * (sp.P - 1) * N * a.HV * a.D * a.D * 4 : 0;
}
/// Dynamic shared memory of the state pass kernels (NST stages), checked against the 227 KB per CTA
/// (with the kernels' static shared memory: v2 2,176 B, v3 none; key split 6,144 / 16,384 B).
template <int D>
constexpr int state_smem = NST * static_cast<int>(sizeof(Stage<D>));
static_assert(state_smem<64> + 2176 <= 227 * 1024 && state_smem<128> + 16384 <= 227 * 1024 &&
                  state_smem<256> + 6144 <= 227 * 1024,
              "state pass: shared memory per CTA above 227 KB");
static_assert(state_smem<128> == 51456 && 4 * (state_smem<128> + 2176 + 1024) <= 228 * 1024,
              "the D = 128 state pass: 51,456 B (U rows padded), still 4 CTAs per SM (H = 96: one wave)");

/// The prepare kernel of KdaPrefillArgs::prepare_variant (4 or 6; checked in kda_prefill) on `grid`, for
/// d_k = d_v = D (checked: 64, 128, 256; v4 only at 128).
void launch_prepare(const Params& p, dim3 grid, int variant, int D, cudaStream_t stream, bool wg_layout = false) {
  if (wg_layout) {
    kda_prepare_v6_kernel<128, true><<<grid, 256, 0, stream>>>(p);
  } else if (D == 64) {
    kda_prepare_v6_kernel<64><<<grid, 256, 0, stream>>>(p);
  } else if (D == 256) {
    constexpr int smem = PrepV6<256>::dyn_bytes;
    cuda_check(cudaFuncSetAttribute(kda_prepare_v6_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(kda_prepare_v6_kernel<256>)");
    kda_prepare_v6_kernel<256><<<grid, 256, smem, stream>>>(p);
  } else if (variant == 6) {
    kda_prepare_v6_kernel<128><<<grid, 256, 0, stream>>>(p);
  } else {
    kda_prepare_kernel<<<grid, 256, 0, stream>>>(p);
  }
  cuda_check(cudaGetLastError(), "kda_prepare_kernel launch");
}
template <int D, bool V3>
void launch_state(const Params& p, int HV, int N, cudaStream_t stream) {
  constexpr int smem = state_smem<D>;
  cuda_check(cudaFuncSetAttribute(kda_state_kernel<D, V3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute(kda_state_kernel)");
  kda_state_kernel<D, V3><<<dim3(D / SLICE, HV, N), 64, smem, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_state_kernel launch");
}
/// The state pass v4 (state_variant 4: KS = 2; 5: KS = 4): the v3 grid, 2 KS warps per CTA. D = 256's
/// state pass (KS = 2).
template <int D, int KS>
void launch_state_ks(const Params& p, int HV, int N, cudaStream_t stream) {
  constexpr int smem = state_smem<D>;
  cuda_check(cudaFuncSetAttribute(kda_state_ks_kernel<D, KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute(kda_state_ks_kernel)");
  // 4 CTAs of ~56 KB per SM (KS = 2, D = 128) need the whole shared-memory carveout (D = 256: 2 of ~93 KB)
  cuda_check(cudaFuncSetAttribute(kda_state_ks_kernel<D, KS>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared),
             "cudaFuncSetAttribute(kda_state_ks_kernel carveout)");
  kda_state_ks_kernel<D, KS><<<dim3(D / SLICE, HV, N), 64 * KS, smem, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_state_ks_kernel launch");
}
/// The wgmma state pass (state_variant 6, D = 128): 2 CTAs of one warpgroup per (value head, sequence).
void launch_state_wg(const Params& p, int HV, int N, cudaStream_t stream) {
  cuda_check(cudaFuncSetAttribute(kda_state_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, wg::SMEM),
             "cudaFuncSetAttribute(kda_state_wg_kernel)");
  kda_state_wg_kernel<<<dim3(128 / wg::SLC, HV, N), 128, wg::SMEM, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_state_wg_kernel launch");
}
}  // namespace

namespace {
/// The state plan of `a` from its shapes and options alone (no pointer checks), for the two public queries below;
/// `who` names the query in the error (T, B or HV < 1).
StatePlan query_state_plan(const KdaPrefillArgs& a, const char* who) {
  check_dim(a.D, who);
  if (a.T < 1 || a.B < 1 || a.HV < 1 || (a.cu_seqlens && (a.num_seqs < 1 || a.max_seqlen < 1)))
    throw Error(std::string(who) + ": T = " + std::to_string(a.T) + ", B = " + std::to_string(a.B) + ", HV = " +
                std::to_string(a.HV) + "; accepted: T, B, HV >= 1 (and num_seqs, max_seqlen >= 1 with cu_seqlens)");
  const int N = a.cu_seqlens ? a.num_seqs : a.B;
  const int nch = ((a.cu_seqlens ? a.max_seqlen : a.T) + C - 1) / C;
  return state_plan(a, N, nch);
}
}  // namespace

int kda_prefill_segments(const KdaPrefillArgs& a) { return query_state_plan(a, "kda_prefill_segments").sp.P; }

int kda_prefill_state_kernel(const KdaPrefillArgs& a) {
  return query_state_plan(a, "kda_prefill_state_kernel").state_variant;
}

std::size_t kda_prefill_workspace_bytes(const KdaPrefillArgs& a) {
  const Checked ck = check_prefill(a);
  if (a.pair_chunks) return static_cast<std::size_t>(detail::kda_pair_slots(a)) * a.HV * KdaPairSlot::bytes;
  const SegPlan sp = state_plan(a, ck.N, ck.max_chunks).sp;
  return static_cast<std::size_t>(ck.slots) * a.HV * kda_slot_bytes(a.D) +
         (sp.P > 1 ? seg_buffer_bytes(a, ck.N, sp) : state_buffer_bytes(a, segments_of(a)));
}

namespace {
/// The v5 segment-parallel state pass of kda_prefill() (prepare, pass 1, combine, pass 2) for D = 64 or 128.
template <int D>
void run_segment_path(const KdaPrefillArgs& a, const Checked& ck, const SegPlan& sp, std::size_t slot_bytes,
                      cudaStream_t stream) {
  if (static_cast<long long>(ck.N) * sp.P > 65535)
    throw Error("kda_prefill: " + std::to_string(ck.N) + " sequences x " + std::to_string(sp.P) +
                " segments; accepted: <= 65535 (grid limit); use segment_state = 1");
  Params p = ck.p;
  const std::size_t seg_elems = static_cast<std::size_t>(sp.P - 1) * ck.N * a.HV * D * D;
  p.seg_S = reinterpret_cast<float*>(static_cast<unsigned char*>(a.workspace) + slot_bytes);
  p.seg_A = p.seg_S + seg_elems;
  p.seg_B = p.seg_A + seg_elems;
  p.seg_chunks = sp.seg_chunks;
  constexpr int smem = state_smem<D>;
  cuda_check(cudaFuncSetAttribute(kda_state_kernel<D, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute(kda_state_kernel pass 1)");
  cuda_check(cudaFuncSetAttribute(kda_segment_combine_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, cmb_smem<D>),
             "cudaFuncSetAttribute(kda_segment_combine_kernel)");
  if (a.overlap_segment_pass && a.run_phases == 3) {
    // overlapped (like v4): the prepare of segment k (caller's stream) runs while pass 1 of the
    // segments before it runs on a higher-priority side stream; combine and pass 2 follow on the
    // side stream (pass 2 after the last prepare); joined back to `stream`. Same kernels and
    // data as the serial order below, so bit-identical to it (tested).
    SideStream ss(stream, sp.P);
    const cudaStream_t side = ss.side();
    for (int k = 0; k < sp.P; ++k) {
      Params pk = p;
      pk.chunk_base = k * sp.seg_chunks;
      const int nk = std::min(ck.max_chunks, (k + 1) * sp.seg_chunks) - pk.chunk_base;
      launch_prepare(pk, dim3(nk, a.HV, ck.N), a.prepare_variant, D, stream);
      ss.link(k, stream, side);
      if (k + 1 < sp.P) {
        pk.chunk_base = 0;
        pk.seg_base = k;
        pk.nseg_grid = 1;
        kda_state_kernel<D, true, true><<<dim3(2 * D / SLICE, a.HV, ck.N), 64, smem, side>>>(pk);
        cuda_check(cudaGetLastError(), "kda_state_kernel pass 1 launch");
      }
    }
    if (sp.P >= 3) {
      kda_segment_combine_kernel<D><<<dim3(D / SLICE, a.HV, ck.N), 256, cmb_smem<D>, side>>>(p, sp.P);
      cuda_check(cudaGetLastError(), "kda_segment_combine_kernel launch");
    }
    p.seg_base = 1;  // pass 2: segments 1 .. P-1 (segment 0's o came from pass 1)
    p.nseg_grid = sp.P - 1;
    launch_state<D, true>(p, a.HV, ck.N * (sp.P - 1), side);
    ss.join();
    return;
  }
  if (a.run_phases & 1) {
    launch_prepare(p, dim3(ck.max_chunks, a.HV, ck.N), a.prepare_variant, D, stream);
  }
  if (a.run_phases & 2) {
    p.nseg_grid = sp.P - 1;
    kda_state_kernel<D, true, true><<<dim3(2 * D / SLICE, a.HV, ck.N * (sp.P - 1)), 64, smem, stream>>>(p);
    cuda_check(cudaGetLastError(), "kda_state_kernel pass 1 launch");
    if (sp.P >= 3) {
      kda_segment_combine_kernel<D><<<dim3(D / SLICE, a.HV, ck.N), 256, cmb_smem<D>, stream>>>(p, sp.P);
      cuda_check(cudaGetLastError(), "kda_segment_combine_kernel launch");
    }
    p.seg_base = 1;  // pass 2: segments 1 .. P-1
    p.nseg_grid = sp.P - 1;
    launch_state<D, true>(p, a.HV, ck.N * (sp.P - 1), stream);
  }
}
}  // namespace

namespace {
/// The pair path of kda_prefill() (KdaPrefillArgs::pair_chunks, checked by check_prefill): workspace and grid
/// checks, then the pair prepare kernel and the pair state pass, serially on `stream` (kernels/kda_pair.cu).
void run_pair_path(const KdaPrefillArgs& a, const Checked& ck, cudaStream_t stream) {
  const std::size_t need = static_cast<std::size_t>(detail::kda_pair_slots(a)) * a.HV * KdaPairSlot::bytes;
  if (!a.workspace || a.workspace_bytes < need)
    throw Error("kda_prefill: workspace of " + std::to_string(a.workspace_bytes) + " bytes at " +
                (a.workspace ? "a valid pointer" : "null") + " with pair_chunks = true; accepted: a 16-byte aligned device "
                "buffer of >= " + std::to_string(need) + " bytes (kda_prefill_workspace_bytes())");
  if (ck.N > 65535 || a.HV > 65535)
    throw Error("kda_prefill: " + std::to_string(ck.N) + " sequences x " + std::to_string(a.HV) +
                " value heads; accepted: each <= 65535 (grid limits)");
  if (a.run_phases < 1 || a.run_phases > 3)
    throw Error("kda_prefill: run_phases = " + std::to_string(a.run_phases) + "; accepted: 1, 2 or 3");
  KdaPrefillArgs r = a;  // the strides resolved by check_prefill
  r.sq = ck.p.sq; r.sk = ck.p.sk; r.sv = ck.p.sv; r.sg = ck.p.sg; r.so = ck.p.so; r.sbeta = ck.p.sbeta;
  detail::kda_pair_launch(r, ck.N, ck.max_chunks, stream);
}
}  // namespace

void kda_prefill(const KdaPrefillArgs& a, cudaStream_t stream) {
  Checked ck = check_prefill(a);
  if (a.pair_chunks) {
    run_pair_path(a, ck, stream);
    return;
  }
  const StatePlan stp = state_plan(a, ck.N, ck.max_chunks);
  const SegPlan sp = stp.sp;
  const Segments sg = segments_of(a);
  const std::size_t slot_bytes = static_cast<std::size_t>(ck.slots) * a.HV * kda_slot_bytes(a.D);
  const std::size_t need = slot_bytes + (sp.P > 1 ? seg_buffer_bytes(a, ck.N, sp) : state_buffer_bytes(a, sg));
  if (!a.workspace || a.workspace_bytes < need)
    throw Error("kda_prefill: workspace of " + std::to_string(a.workspace_bytes) + " bytes at " +
                (a.workspace ? "a valid pointer" : "null") + "; accepted: a 16-byte aligned device buffer of >= " +
                std::to_string(need) + " bytes (kda_prefill_workspace_bytes())");
  ck.p.ws = static_cast<unsigned char*>(a.workspace);
  if (ck.N > 65535 || a.HV > 65535)
    throw Error("kda_prefill: " + std::to_string(ck.N) + " sequences x " + std::to_string(a.HV) +
                " value heads; accepted: each <= 65535 (grid limits)");
  if (a.run_phases < 1 || a.run_phases > 3)
    throw Error("kda_prefill: run_phases = " + std::to_string(a.run_phases) + "; accepted: 1, 2 or 3");
  if (a.state_variant < 2 || a.state_variant > 6)
    throw Error("kda_prefill: state_variant = " + std::to_string(a.state_variant) +
                "; accepted: 2, 3, 4 (key split over 2 warps), 5 (key split over 4 warps) or 6 (wgmma, D = 128)");
  if (a.state_variant == 6 && a.prepare_variant != 6)
    throw Error("kda_prefill: state_variant = 6 with prepare_variant = " + std::to_string(a.prepare_variant) +
                "; accepted: prepare_variant = 6 (it writes the wgmma slot layout)");
  const bool wgl = stp.state_variant == 6;  // the prepare writes the wgmma slot layout (explicit or the auto rule)
  if (a.prepare_variant != 4 && a.prepare_variant != 6)
    throw Error("kda_prefill: prepare_variant = " + std::to_string(a.prepare_variant) + "; accepted: 4 or 6");
  auto state = [&](const Params& p, cudaStream_t s) {
    if (a.D == 64) launch_state<64, true>(p, a.HV, ck.N, s);          // (checked: state_variant 3)
    else if (a.D == 256) launch_state_ks<256, 2>(p, a.HV, ck.N, s);   // D = 256's state pass (state_variant 3)
    else if (stp.state_variant == 3) launch_state<128, true>(p, a.HV, ck.N, s);
    else if (stp.state_variant == 4) launch_state_ks<128, 2>(p, a.HV, ck.N, s);  // (or the auto rule's choice)
    else if (stp.state_variant == 5) launch_state_ks<128, 4>(p, a.HV, ck.N, s);
    else if (stp.state_variant == 6) launch_state_wg(p, a.HV, ck.N, s);
    else launch_state<128, false>(p, a.HV, ck.N, s);
  };
  if (sp.P > 1) {  // v5 segment-parallel state pass: prepare, pass 1, combine, pass 2 (D = 64, 128)
    if (a.D == 64) run_segment_path<64>(a, ck, sp, slot_bytes, stream);
    else run_segment_path<128>(a, ck, sp, slot_bytes, stream);
    return;
  }
  if (sg.K == 1 || a.run_phases != 3) {
    if (a.run_phases & 1) {
      launch_prepare(ck.p, dim3(ck.max_chunks, a.HV, ck.N), a.prepare_variant, a.D, stream, wgl);
    }
    if (a.run_phases & 2) state(ck.p, stream);
    return;
  }
  // overlapped schedule (see segments_of)
  SideStream ss(stream, sg.K);
  const cudaStream_t side = ss.side();
  float* sbuf = reinterpret_cast<float*>(static_cast<unsigned char*>(a.workspace) + slot_bytes);
  const int seg_chunks = sg.seg / C;
  for (int k = 0; k < sg.K; ++k) {
    const long long t0 = static_cast<long long>(k) * sg.seg;
    const int Tk = static_cast<int>(std::min<long long>(sg.seg, a.T - t0));
    Params p = ck.p;
    p.T = Tk;
    p.nchunk_fixed = (Tk + C - 1) / C;
    p.q += t0 * p.sq.t;
    p.k += t0 * p.sk.t;
    p.v += t0 * p.sv.t;
    p.g += t0 * p.sg.t;
    p.beta += t0 * p.sbeta.t;
    p.o += t0 * p.so.t;
    p.ws = ck.p.ws + static_cast<std::size_t>(k) * a.B * seg_chunks * a.HV * kda_slot_bytes(a.D);
    p.S0 = k == 0 ? a.S0 : sbuf;
    p.S_final = k == sg.K - 1 ? a.S_final : sbuf;
    launch_prepare(p, dim3(p.nchunk_fixed, a.HV, ck.N), a.prepare_variant, a.D, stream, wgl);
    ss.link(k, stream, side);
    state(p, side);
  }
  ss.join();
}

}  // namespace kdalab::kernels
