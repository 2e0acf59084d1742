// KDA two-chunk ("pair") step (KdaPrefillArgs::pair_chunks, opt-in; D = 128; sm_90a, mma.sync): the pair
// prepare kernel and the pair state pass. kda_prefill() (kernels/kda_prefill.cu) checks the arguments and calls
// detail::kda_pair_launch (kernels/kda_pair.cuh). Algorithm: the shared pair specification (bench/NOTES.md "KDA
// pair step (kernel)"); the slot layout: KdaPairSlot (kernels/kda.hpp). Not yet run on a GPU.
#include <cstddef>
#include <string>

#include "kernels/kda_common.cuh"
#include "kernels/kda_pair.cuh"
#include "kernels/kda_prepare_phases.cuh"
#include "kernels/kda_state_update.cuh"

namespace kdalab::kernels {

namespace {
using namespace detail;

constexpr int C = 16;      // chunk
constexpr int D128 = 128;  // d_k = d_v of the pair kernels
constexpr int SLICE = 32;  // value columns per state CTA (as the one-chunk state pass)

/// The pair kernels' parameters (from a checked KdaPrefillArgs with resolved strides).
struct PairParams {
  int T, HV, group, npair_fixed;  // npair_fixed = ceil(T / 32) (fixed-length batches)
  const bf16_t *q, *k, *v, *g, *beta;
  Strides sq, sk, sv, sg, so, sbeta;
  const float *A_log, *bias;
  float g_min, scale;
  bool fuse_gate, l2norm, beta_sigmoid;
  const float* S0;
  float* S_final;
  const int* cu;
  bf16_t* o;
  unsigned char* ws;
};

using prep::Seq;

// The bf16 A / B fragment stores (prep::store_afrag_col, prep::store_bfrag_col) and prepare v6's phases (prep::):
// kernels/kda_prepare_phases.cuh.

// ---- the two-chunk ("pair") step (KdaPrefillArgs::pair_chunks; D = 128; bench/NOTES.md "KDA pair step (kernel)") --
// The state pass advances S by 32 tokens per dependent step. Per pair of chunks c = 2p, c + 1 (c + 1 past the
// sequence end is an all-padding chunk: q = k = v = g = beta = 0, so gam = 1 and W = U = Qg = Kd = P = 0), with
// gp = gam_n(c), gq = gam_n(c + 1), the prepare forms in fp32-class arithmetic, before any bf16 rounding,
//   M = W_{c+1} Kd_c^T (16 x 16, full)    Wb = W_{c+1} Diag(gp) - M W_c    Ub = U_{c+1} - M U_c
//   Qb = Qg_{c+1} Diag(gp)    Pbl = Qg_{c+1} Kd_c^T (full)    Kt = Kd_c Diag(gq)    gn2 = gp gq
// and writes W2 = [W_c; Wb], Qg2 = [Qg_c; Qb], Kd2 = [Kt; Kd_{c+1}] (bf16, one rounding each), U2 = [U_c; Ub]
// (fp32), P2 = [[P_c, 0], [Pbl, P_{c+1}]] (bf16 hi + lo), gn2 (fp32): kernels/kda.hpp KdaPairSlot. The state
// step is D2 = U2 - W2 S, o = scale (Qg2 S + P2 D2), S <- Diag(gn2) S + Kd2^T bf16(D2): since
// S_{c+1} = Diag(gp) S + Kd_c^T D_c, D_{c+1} = U_{c+1} - W_{c+1} S_{c+1} = Ub - Wb S and
// o_{c+1} = Qg_{c+1} S_{c+1} + P_{c+1} D_{c+1} = Qb S + Pbl D_c + P_{c+1} D_{c+1} exactly.

/// Sequence n's tokens and its first pair slot (pairs of 2 C = 32 tokens; seq_info's rule with 32 for 16:
/// slot0 = n + bos / 32 leaves ceil(len / 32) slots per sequence with cu_seqlens).
__device__ __forceinline__ Seq pair_seq_info(const PairParams& p, int n) {
  return prep::seq_of<2 * C, &PairParams::npair_fixed>(p, n);
}

/// Dynamic shared-memory plan of the pair prepare (512 threads: half h = tid / 256 does chunk c + h with prepare
/// v6's phases, then the cross terms). Byte offsets. 96,640 B: 2 CTAs (32 warps) per SM.
struct PrepPair {
  static constexpr int D = D128, DP = D + 4;
  static constexpr int tile = C * DP * 4;       // one 16 x (D + 4) fp32 tile, 8,448 B
  static constexpr int T = 0;                   // [chunk h][Q -> Qg, g -> Ki, K -> Kg, V]; later (dead tiles):
                                                // half 0's partial A / P tiles over [0][0..1], then
                                                // [W_{c+1} | U_{c+1}] fp32 [16][2 D + 4] over [0][0..1];
                                                // the partial M / Pbl tiles over [0][2..3]
  static constexpr int Kd0 = T + 8 * tile;      // Kd_c fp32 [16][DP] (the B operand of M and Pbl, and Kt's source)
  static constexpr int red1 = Kd0 + tile;       // half 1's partial A / P tiles (8 warps x 256 float2); then
                                                // [W_c | U_c] fp32 [16][2 D]
  static constexpr int A = red1 + 8 * 256 * 8;  // [2][16][16]
  static constexpr int Mt = A + 2 * C * C * 4;  // M^T [16][16] (Mt[s][r] = M[r][s])
  static constexpr int Gn = Mt + C * C * 4;     // [2][D]: gam_n of both chunks
  static constexpr int Beta = Gn + 2 * D * 4;   // [2][16]
  static constexpr int bytes = Beta + 2 * C * 4;
  static constexpr int XP = 2 * D + 4;          // row of [W_{c+1} | U_{c+1}] (padded: conflict-free mma A loads)
};
static_assert(PrepPair::bytes == 96640, "pair prepare: shared-memory plan");
static_assert(2 * PrepPair::tile >= 8 * 256 * 8 && 2 * PrepPair::tile >= C * PrepPair::XP * 4 &&
                  2 * PrepPair::tile >= 16 * 128 * 8 && 8 * 256 * 8 >= C * 2 * D128 * 4,
              "pair prepare: the aliased buffers fit");
static_assert(2 * (PrepPair::bytes + 1024) <= 228 * 1024, "pair prepare: 2 CTAs per SM");

// One CTA (512 threads) per (pair, value head, sequence). Phases (half h = tid / 256, ltid = tid % 256):
//  1. load chunk c + h, fusions (prepare v6's code);
//  2. decay (ltid = channel; v6's arithmetic): Qg_c -> Qg2 m-tile 0 and Kd_{c+1} -> Kd2 k-step 1 from registers;
//     Kd_c to smem;
//  2b. Kt = Kd_c Diag(gq) -> Kd2 k-step 0, gn2 = gp gq (half 0); Qb = Qg_{c+1} Diag(gp) -> Qg2 m-tile 1 (half 1);
//  3. A = Diag(beta) Kg Ki^T, P = Qg Ki^T per chunk: v6's tf32 3-pass mma, the partial tiles of each half's
//     8 warps summed in v6's fixed order; P_c -> Pf2 block 0, P_{c+1} -> block 2;
//  4. forward substitution (v6's, thread = column of [W | U]): W_c -> W2 m-tile 0, U_c -> U2 rows 0..15, and
//     [W_c | U_c] to smem (half 0); [W_{c+1} | U_{c+1}] to smem (half 1);
//  5. M = W_{c+1} Kd_c^T (warps 0..7) and Pbl = Qg_{c+1} Kd_c^T (warps 8..15): tf32 3-pass mma, 16 channels per
//     warp, 8 partial tiles per product summed in fixed order; Pbl (full block) -> Pf2 block 1;
//  6. half 1, thread = column: [Wb | Ub] = [W_{c+1} Diag(gp) | U_{c+1}] - M [W_c | U_c] (fp32 FMAs, s = 0..15 in
//     order) -> W2 m-tile 1, U2 rows 16..31.
// Half 0's chunk runs prepare v6's arithmetic in v6's order (its A, P, W, U, Qg, Kd are v6's).
__global__ void __launch_bounds__(512, 2) kda_prepare_pair_kernel(PairParams p) {
  constexpr int D = D128, DP = PrepPair::DP, XP = PrepPair::XP;
  using PS = KdaPairSlot;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  const int pp = blockIdx.x, hv = blockIdx.y, n = blockIdx.z, tid = threadIdx.x;
  const int half = tid >> 8, ltid = tid & 255;
  const Seq sq = pair_seq_info(p, n);
  const int tp = pp * 2 * C;  // first token of the pair
  if (tp >= sq.len) return;
  const int t0 = tp + half * C;                    // first token of this half's chunk
  const int nvalid = max(0, min(C, sq.len - t0));  // 0: the all-padding chunk past the sequence end
  const int h = hv / p.group;

  float(*sT)[4][C][DP] = reinterpret_cast<float(*)[4][C][DP]>(dyn_smem + PrepPair::T);
  float(*sQ)[DP] = sT[half][0];
  float(*sKi)[DP] = sT[half][1];
  float(*sK)[DP] = sT[half][2];
  float(*sV)[DP] = sT[half][3];
  float(*sKd0)[DP] = reinterpret_cast<float(*)[DP]>(dyn_smem + PrepPair::Kd0);
  float(*sX0)[2 * D] = reinterpret_cast<float(*)[2 * D]>(dyn_smem + PrepPair::red1);  // [W_c | U_c] (phase 4 on)
  float(*sX1)[XP] = reinterpret_cast<float(*)[XP]>(&sT[0][0][0][0]);                  // [W_{c+1} | U_{c+1}] (phase 4 on)
  float(*sA)[C][C] = reinterpret_cast<float(*)[C][C]>(dyn_smem + PrepPair::A);
  float(*sMt)[C] = reinterpret_cast<float(*)[C]>(dyn_smem + PrepPair::Mt);
  float(*sGn)[D] = reinterpret_cast<float(*)[D]>(dyn_smem + PrepPair::Gn);
  float(*sBeta)[C] = reinterpret_cast<float(*)[C]>(dyn_smem + PrepPair::Beta);
  unsigned char* slot = p.ws + ((sq.slot0 + pp) * p.HV + hv) * static_cast<long long>(PS::bytes);
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;

  // ---- 1. load (8-byte loads of channels 4j..4j+3, 64+4j..), fusions: prepare v6's code on chunk c + half ----
  prep::load_fuse<D>(p, sq, t0, nvalid, h, hv, ltid, sQ, sK, sV, sKi, sBeta[half]);
  __syncthreads();
  // ---- 2. cumulative decay per channel (v6's arithmetic); Qg_c, Kd_{c+1} fragments; Kd_c to smem ----
  if (ltid < D) {
    const int i = ltid;
    float gam[C];
    const float gn = prep::decay_gamma(sKi, i, gam);  // sKi holds g here (an all-padding chunk: gam = 1)
    sGn[half][i] = gn;
    float qg[C], kd[C];
    prep::decay_apply(sQ, sK, sKi, i, gam, gn, qg, kd);  // v6's one fast reciprocal of gam
    if (half == 0) {
      prep::store_afrag_col(reinterpret_cast<uint4*>(slot + PS::Qg2), qg, i);  // m-tile 0 = Qg_c
#pragma unroll
      for (int r = 0; r < C; ++r) sKd0[r][i] = kd[r];
    } else {
      prep::store_bfrag_col(reinterpret_cast<uint4*>(slot + PS::Kd2) + 8 * 32, kd, i);  // k-step 1 = Kd_{c+1}
    }
  }
  __syncthreads();
  // ---- 2b. Kt = Kd_c Diag(gq), gn2 = gp gq (half 0); Qb = Qg_{c+1} Diag(gp) (half 1): fp32, then bf16 once ----
  if (ltid < D) {
    const int i = ltid;
    const float gp = sGn[0][i];
    float x[C];
    if (half == 0) {
      const float gq = sGn[1][i];
#pragma unroll
      for (int r = 0; r < C; ++r) x[r] = sKd0[r][i] * gq;
      prep::store_bfrag_col(reinterpret_cast<uint4*>(slot + PS::Kd2), x, i);  // k-step 0 = Kt
      reinterpret_cast<float*>(slot + PS::gam_n2)[i] = gp * gq;
    } else {
#pragma unroll
      for (int r = 0; r < C; ++r) x[r] = sQ[r][i] * gp;  // sQ = Qg_{c+1} in half 1
      prep::store_afrag_col(reinterpret_cast<uint4*>(slot + PS::Qg2) + 8 * 32, x, i);  // m-tile 1 = Qb
    }
  }
  // ---- 3. A = Kg Ki^T and P = Qg Ki^T per chunk: v6's tf32 3-pass mma, warp wl of a half sums channels
  //         [16 wl, 16 wl + 16) ----
  {
    const int wl = warp & 7;
    float acc[2][2][4] = {};  // [A | P][n-tile: s in 8 nt ..][C fragment]
    prep::ap_mma<2>(sK, sQ, sKi, 16 * wl, g, t, acc);
    __syncthreads();  // every warp is done reading Qg_c, Ki_c (and 2b's reads): half 0's partial tiles go over them
    float2* red = half == 0 ? reinterpret_cast<float2*>(&sT[0][0][0][0]) : reinterpret_cast<float2*>(dyn_smem + PrepPair::red1);
    prep::ap_store_partial(red, wl, lane, acc);
    __syncthreads();
    // thread ltid sums fragment slot ltid over the half's 8 warps; A -> sA[half]; P_c -> Pf2 block 0, P_{c+1} ->
    // block 2 (hi + lo bf16 A fragments, word 2 nt + hf of lane)
    prep::ap_finish(red, static_cast<unsigned>(ltid), g, t, sA[half], sBeta[half],
                    [&](int, int, int nt, int hf, float p0, float p1) {
                      prep::store_Pf<2048>(slot, PS::Pf2, half, lane, nt, hf, p0, p1);
                    });
  }
  __syncthreads();
  // ---- 4. [W | U] = (I + A)^{-1} [Diag(beta) Kg | Diag(beta) V] (thread = column, v6's order) ----
  {
    const int col = ltid;
    float x[C];
    prep::subst<D>(x, sBeta[half], sK, sV, sA[half], col);
    if (half == 0) {
      if (col < D) {
        prep::store_afrag_col(reinterpret_cast<uint4*>(slot + PS::W2), x, col);  // m-tile 0 = W_c
      } else {
        float* U = reinterpret_cast<float*>(slot + PS::U2);
#pragma unroll
        for (int r = 0; r < C; ++r) U[r * D + (col - D)] = x[r];  // rows 0..15 = U_c
      }
#pragma unroll
      for (int r = 0; r < C; ++r) sX0[r][col] = x[r];
    } else {
#pragma unroll
      for (int r = 0; r < C; ++r) sX1[r][col] = x[r];
    }
  }
  __syncthreads();
  // ---- 5. M = W_{c+1} Kd_c^T (warps 0..7), Pbl = Qg_{c+1} Kd_c^T (warps 8..15): tf32 3-pass mma, warp wl sums
  //         channels [16 wl, 16 wl + 16) ----
  {
    const int wl = warp & 7;
    const float* arow = half == 0 ? &sX1[0][0] : &sT[1][0][0][0];  // W_{c+1} (row XP) or Qg_{c+1} (row DP)
    const int ld = half == 0 ? XP : DP;
    float acc[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const int cb = 16 * wl + 8 * ks + t;
      std::uint32_t ah[4], al[4];
      split_tf32(arow[g * ld + cb], ah[0], al[0]);
      split_tf32(arow[(g + 8) * ld + cb], ah[1], al[1]);
      split_tf32(arow[g * ld + cb + 4], ah[2], al[2]);
      split_tf32(arow[(g + 8) * ld + cb + 4], ah[3], al[3]);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        std::uint32_t bh[2], bl[2];  // B[k][s] = Kd_c[s][k]
        split_tf32(sKd0[8 * nt + g][cb], bh[0], bl[0]);
        split_tf32(sKd0[8 * nt + g][cb + 4], bh[1], bl[1]);
        mma_tf32(acc[nt], al, bh);
        mma_tf32(acc[nt], ah, bl);
        mma_tf32(acc[nt], ah, bh);
      }
    }
    float2* red = reinterpret_cast<float2*>(&sT[0][2][0][0]);  // Kg_c, V_c: dead since phase 4
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        red[warp * 128 + (nt * 2 + hf) * 32 + lane] = make_float2(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
    __syncthreads();
    // thread ltid < 128 of half h sums fragment slot ltid of product h (M, Pbl) over warps 8 h .. 8 h + 7
    if (ltid < 128) {
      float2 sum = red[(8 * half) * 128 + ltid];
#pragma unroll
      for (int w = 1; w < 8; ++w) {
        const float2 y = red[(8 * half + w) * 128 + ltid];
        sum.x += y.x;
        sum.y += y.y;
      }
      const int idx = ltid / 32, nt = idx / 2, hf = idx & 1;
      const int r = g + 8 * hf, s0 = 8 * nt + 2 * t;
      if (half == 0) {  // M^T
        sMt[s0][r] = sum.x;
        sMt[s0 + 1][r] = sum.y;
      } else {  // Pbl (full block) -> block 1, hi + lo
        prep::store_Pf(slot, PS::Pf2, 1, lane, nt, hf, sum.x, sum.y);
      }
    }
  }
  __syncthreads();
  // ---- 6. [Wb | Ub] = [W_{c+1} Diag(gp) | U_{c+1}] - M [W_c | U_c] (half 1, thread = column, fp32) ----
  if (half == 1) {
    const int col = ltid;
    const float gp = col < D ? sGn[0][col] : 1.0f;
    float x[C];
#pragma unroll
    for (int r = 0; r < C; ++r) x[r] = sX1[r][col] * gp;
#pragma unroll
    for (int s = 0; s < C; ++s) {
      const float x0 = sX0[s][col];
      const float4* ms = reinterpret_cast<const float4*>(&sMt[s][0]);
#pragma unroll
      for (int m = 0; m < C / 4; ++m) {
        const float4 a4 = ms[m];
        x[4 * m] -= a4.x * x0;
        x[4 * m + 1] -= a4.y * x0;
        x[4 * m + 2] -= a4.z * x0;
        x[4 * m + 3] -= a4.w * x0;
      }
    }
    if (col < D) {
      prep::store_afrag_col(reinterpret_cast<uint4*>(slot + PS::W2) + 8 * 32, x, col);  // m-tile 1 = Wb
    } else {
      float* U = reinterpret_cast<float*>(slot + PS::U2);
#pragma unroll
      for (int r = 0; r < C; ++r) U[(C + r) * D + (col - D)] = x[r];  // rows 16..31 = Ub
    }
  }
}

/// Shared stage of one pair for one pair-state CTA (32 value columns). W, Qg, Kd adjacent (as in KdaPairSlot).
struct PairStage {
  uint4 W[2 * 2 * D128], Qg[2 * 2 * D128], Kd[2 * 2 * D128];  // [m-tile or k-step][k-tile or n-pair][lane]
  float U[2 * C][SLICE];
  uint4 Pf[3 * 64];  // block b: hi = Pf[64 b + lane], lo = Pf[64 b + 32 + lane]
  float gn[D128];
};
static_assert(sizeof(PairStage) == 32256, "pair stage");
static_assert(offsetof(PairStage, Kd) - offsetof(PairStage, W) == KdaPairSlot::Kd2 - KdaPairSlot::W2 &&
                  KdaPairSlot::U2 - KdaPairSlot::W2 == 3 * 2 * 2 * D128 * 16,
              "pair stage: W, Qg, Kd one block copy");
constexpr int NST_PAIR = 2;  // pair steps are ~2x a one-chunk step: one pair ahead covers what NST = 3 covers
constexpr int state_pair_smem = NST_PAIR * static_cast<int>(sizeof(PairStage));  // 64,512 B (+ 4,352 B static)
static_assert(3 * (state_pair_smem + 4352 + 1024) <= 228 * 1024, "pair state pass: 3 CTAs per SM (H = 96 in one wave)");

// The pair state pass: v3's structure (one CTA of 2 warps per (32 value columns, value head, sequence), each warp
// holds S^T for 16 value columns x 128 key rows in mma accumulators; cp.async stages) with the 32-row step:
// W2 S and Qg2 S (2 m-tiles; W S in even / odd k-tile chains as v3: 8 chains of 4), D2 = U2 - W2 S (fp32), the
// update S^T <- Diag(gn2) S^T + D2^T Kd2 (K = 32: 2 k-steps, D2's bf16 hi part, issued first as v3), then
// o = scale (Qg2 S + P2 D2) with P2 D2 = P2hi D2hi + P2hi D2lo + P2lo D2hi over the 3 non-zero blocks.
__global__ void __launch_bounds__(64) kda_state_pair_kernel(PairParams p) {
  using PS = KdaPairSlot;
  constexpr int D = D128, NJ = D / 8, NKT = D / 16;
  const int slice = blockIdx.x, hv = blockIdx.y, n = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
  const Seq sq = pair_seq_info(p, n);
  const int npair = (sq.len + 2 * C - 1) / (2 * C);
  const int vbase = slice * SLICE, v0 = vbase + warp * 16;  // this warp's 16 value columns

  extern __shared__ __align__(16) unsigned char dyn_smem[];
  PairStage* st = reinterpret_cast<PairStage*>(dyn_smem);  // NST_PAIR stages
  __shared__ float Dsh[2][2 * C][C + 1];

  // S^T accumulators: Sacc[j][e] = S[8j + 2tq + (e&1)][v0 + gq + 8(e>>1)]
  float Sacc[NJ][4];
  const long long sbase = (static_cast<long long>(n) * p.HV + hv) * D * D;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 8 * j + 2 * tq + (e & 1), col = v0 + gq + 8 * (e >> 1);
      Sacc[j][e] = p.S0 ? p.S0[sbase + row * D + col] : 0.0f;
    }

  auto issue = [&](int pr, int s) {
    const unsigned char* slot = p.ws + ((sq.slot0 + pr) * p.HV + hv) * static_cast<long long>(PS::bytes);
    const uint4* src = reinterpret_cast<const uint4*>(slot);  // W2, Qg2, Kd2: 24 KB contiguous
    uint4* dst = st[s].W;
    for (int i = tid; i < 3 * 2 * 2 * D; i += 64) cp_async16(dst + i, src + i);
    for (int i = tid; i < 2 * C * SLICE / 4; i += 64) {
      const int r = i / (SLICE / 4), c4 = i % (SLICE / 4);
      cp_async16(&st[s].U[r][c4 * 4], slot + PS::U2 + (r * D + vbase + c4 * 4) * 4);
    }
    for (int i = tid; i < 3 * 64; i += 64) cp_async16(&st[s].Pf[i], slot + PS::Pf2 + 16 * i);
    if (tid < D / 4) cp_async16(&st[s].gn[4 * tid], slot + PS::gam_n2 + 16 * tid);
  };

  // prologue: pairs 0 .. NST_PAIR-2 in flight (one commit group per pair, empty groups past the end)
#pragma unroll
  for (int i = 0; i < NST_PAIR - 1; ++i) {
    if (i < npair) issue(i, i);
    cp_async_commit();
  }
  for (int pr = 0; pr < npair; ++pr) {
    cp_async_wait<NST_PAIR - 2>();  // the group of pair pr has landed (for this thread)
    __syncthreads();                // ... for every thread; and every warp is done with pair pr - 1
    if (pr + NST_PAIR - 1 < npair) issue(pr + NST_PAIR - 1, (pr + NST_PAIR - 1) % NST_PAIR);
    cp_async_commit();
    const PairStage& S = st[pr % NST_PAIR];
    // ---- W2 S and Qg2 S (A from the stage, B = S packed to bf16 once per pair) ----
    float ws[2][2][4] = {}, ws2[2][2][4] = {}, qs[2][2][4] = {};  // [m-tile][n-tile][C fragment]
#pragma unroll
    for (int kt = 0; kt < NKT; ++kt) {
      std::uint32_t b[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        b[nt][0] = pack_bf16(Sacc[2 * kt][2 * nt], Sacc[2 * kt][2 * nt + 1]);
        b[nt][1] = pack_bf16(Sacc[2 * kt + 1][2 * nt], Sacc[2 * kt + 1][2 * nt + 1]);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint4 wa = S.W[(mt * NKT + kt) * 32 + lane], qa = S.Qg[(mt * NKT + kt) * 32 + lane];
        const std::uint32_t aw[4] = {wa.x, wa.y, wa.z, wa.w}, aq[4] = {qa.x, qa.y, qa.z, qa.w};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          mma_bf16((kt & 1) ? ws2[mt][nt] : ws[mt][nt], aw, b[nt]);
          mma_bf16(qs[mt][nt], aq, b[nt]);
        }
      }
    }
    // ---- D2 = U2 - W2 S (fp32) into the warp's shared tile (rows 0..15: chunk c, 16..31: chunk c + 1) ----
    // (the pragma'd pair loop keeps 8234af9's PTX: as two statements cicc merged one U pair into ld.shared.v2)
    for_acc_pairs<2>(gq, tq, [&](int mt, int nt, int hh, int r, int v) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
        Dsh[warp][r][v + i] = S.U[r][warp * 16 + v + i] - (ws[mt][nt][2 * hh + i] + ws2[mt][nt][2 * hh + i]);
    });
    __syncwarp();
    // D2^T as A fragments per k-step ks (pair rows 16 ks ..), hi and lo parts; the same registers are the
    // B fragments of P2 D2 (k = pair row, n = value column)
    std::uint32_t ad[2][4], adl[2][4];
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const int rb = C * ks;
      split_bf16(Dsh[warp][rb + 2 * tq][gq], Dsh[warp][rb + 2 * tq + 1][gq], ad[ks][0], adl[ks][0]);
      split_bf16(Dsh[warp][rb + 2 * tq][gq + 8], Dsh[warp][rb + 2 * tq + 1][gq + 8], ad[ks][1], adl[ks][1]);
      split_bf16(Dsh[warp][rb + 2 * tq + 8][gq], Dsh[warp][rb + 2 * tq + 9][gq], ad[ks][2], adl[ks][2]);
      split_bf16(Dsh[warp][rb + 2 * tq + 8][gq + 8], Dsh[warp][rb + 2 * tq + 9][gq + 8], ad[ks][3], adl[ks][3]);
    }
    // ---- S^T <- Diag(gn2) S^T + D2^T Kd2 (first: the pair-to-pair critical path) ----
    state_decay_update<NJ, 2>(Sacc, S.gn, S.Kd, ad, lane, tq);
    // ---- o = scale (Qg2 S + P2 D2): blocks (m-tile, k-step) = (0, 0) P_c, (1, 0) Pbl, (1, 1) P_{c+1} ----
#pragma unroll
    for (int blk = 0; blk < 3; ++blk) {
      const int mt = blk == 0 ? 0 : 1, ks = blk == 2 ? 1 : 0;
      const uint4 ph = S.Pf[64 * blk + lane], pl = S.Pf[64 * blk + 32 + lane];
      const std::uint32_t aph[4] = {ph.x, ph.y, ph.z, ph.w}, apl[4] = {pl.x, pl.y, pl.z, pl.w};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const std::uint32_t bh[2] = {ad[ks][nt], ad[ks][nt + 2]}, bl[2] = {adl[ks][nt], adl[ks][nt + 2]};
        mma_bf16(qs[mt][nt], aph, bh);
        mma_bf16(qs[mt][nt], aph, bl);
        mma_bf16(qs[mt][nt], apl, bh);
      }
    }
    const int tp = pr * 2 * C;
    for_acc_pairs<2>(gq, tq, [&](int mt, int nt, int hh, int r, int v) {
      if (tp + r < sq.len) {
        const long long t = sq.bos + tp + r;
        *reinterpret_cast<std::uint32_t*>(p.o + sq.bidx * p.so.b + t * p.so.t + hv * p.so.h + v0 + v) =
            pack_bf16(p.scale * qs[mt][nt][2 * hh], p.scale * qs[mt][nt][2 * hh + 1]);
      }
    });
    __syncwarp();  // Dsh is rewritten next pair
  }
  if (p.S_final) {
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        p.S_final[sbase + (8 * j + 2 * tq + (e & 1)) * D + v0 + gq + 8 * (e >> 1)] = Sacc[j][e];
  }
}

}  // namespace

long long detail::kda_pair_slots(const KdaPrefillArgs& a) {
  return a.cu_seqlens ? static_cast<long long>(a.num_seqs) + a.T / (2 * C) + 1
                      : static_cast<long long>(a.B) * ((a.T + 2 * C - 1) / (2 * C));
}

void detail::kda_pair_launch(const KdaPrefillArgs& a, int N, int max_chunks, cudaStream_t stream) {
  PairParams p{};
  p.T = a.T;
  p.HV = a.HV;
  p.group = a.HV / a.H;
  p.npair_fixed = (a.T + 2 * C - 1) / (2 * C);
  p.q = a.q; p.k = a.k; p.v = a.v; p.g = a.g; p.beta = a.beta;
  p.sq = a.sq; p.sk = a.sk; p.sv = a.sv; p.sg = a.sg; p.so = a.so; p.sbeta = a.sbeta;
  p.A_log = a.gate.A_log; p.bias = a.gate.bias; p.g_min = a.gate.g_min; p.scale = a.scale;
  p.fuse_gate = a.gate.fused; p.l2norm = a.l2norm_qk; p.beta_sigmoid = a.beta_sigmoid;
  p.S0 = a.S0; p.S_final = a.S_final; p.cu = a.cu_seqlens; p.o = a.o;
  p.ws = static_cast<unsigned char*>(a.workspace);
  const int max_pairs = (max_chunks + 1) / 2;
  if (a.run_phases & 1) {
    cuda_check(cudaFuncSetAttribute(kda_prepare_pair_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, PrepPair::bytes),
               "cudaFuncSetAttribute(kda_prepare_pair_kernel)");
    cuda_check(cudaFuncSetAttribute(kda_prepare_pair_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared),
               "cudaFuncSetAttribute(kda_prepare_pair_kernel carveout)");
    kda_prepare_pair_kernel<<<dim3(max_pairs, a.HV, N), 512, PrepPair::bytes, stream>>>(p);
    cuda_check(cudaGetLastError(), "kda_prepare_pair_kernel launch");
  }
  if (a.run_phases & 2) {
    cuda_check(cudaFuncSetAttribute(kda_state_pair_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, state_pair_smem),
               "cudaFuncSetAttribute(kda_state_pair_kernel)");
    cuda_check(cudaFuncSetAttribute(kda_state_pair_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared),
               "cudaFuncSetAttribute(kda_state_pair_kernel carveout)");
    kda_state_pair_kernel<<<dim3(D128 / SLICE, a.HV, N), 64, state_pair_smem, stream>>>(p);
    cuda_check(cudaGetLastError(), "kda_state_pair_kernel launch");
  }
}

}  // namespace kdalab::kernels
