// KDA prefill, the key-split state pass (KdaStatePass::key_split; the D = 256 state pass).
//
// The mma pass's step (same slot, same bf16 operand roundings, fp32 state) with the KEY dimension of S split over
// KS = 2 warps per 16 value columns: one CTA of 2 KS warps per (32 value columns, value head, sequence), the mma
// pass's grid. Warp (vw = warp & 1, kw = warp >> 1) holds S^T for the value columns v0 = 32 slice + 16 vw .. + 15 and
// the key rows k0 = kw D / KS .. + D / KS - 1: 16 n-tiles (64 fp32 of S) per thread, where the one-warp step would
// hold 128 and spill. Per chunk:
//  1. partial W S and Qg S over the warp's key rows (8 k-tiles each), stored to shared memory (Wp transposed [v][r],
//     XOR-swizzled; Qp [r][v] for the o columns the other warp owns);
//  2. a named barrier of the KS warps of the same value half;
//  3. every warp forms D = U - (sum over kw' = 0..KS-1 of the W S partials, in that fixed order) for its 16 value
//     columns directly in the D^T A-fragment layout (both warps compute bit-identical D: same operands, same order),
//     hi/lo bf16 split as the mma pass;
//  4. S^T <- Diag(gam_n) S^T + D^T Kd on its own key rows only;
//  5. warps kw = 0 and 1 each finish 8 of the 16 o columns (n-tile nt = kw): Qg S summed over the KS partials (fixed
//     order), + P D (Phi Dhi + Phi Dlo + Plo Dhi, as the mma pass), o stored.
// One-shot pass only (nseg_grid = 1): the segment path's A_seg combine does not fit shared memory at D = 256. The
// D = 128 key split (2 and 4 warps, retired: commit 1910970) and the measurements: docs/kernels/kda_prefill.md.
#include "kernels/kda_prefill/stage.cuh"
#include "kernels/kda_prefill/state_update.cuh"

namespace kdalab::kernels::kda_prefill_detail {
namespace {

constexpr int KS = 2;  // warps per 16 value columns (the key dimension of S split in KS parts)

template <int D>
__global__ void __launch_bounds__(64 * KS) kda_state_ks_kernel(Params p) {
  static_assert(D == 256, "the key-split state pass: D = 256 (D = 64, 128 run the mma or wgmma pass)");
  using SL = Slot<D>;  // (static members, not local constants: a lambda's capture of those changes the PTX)
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
  // Qg S partials: Qp[vw][kw][0][r][v'] for the n-tile nt (v = 8 nt + v'): warp kw stores n-tile 1 - kw only, the
  // one its partner finishes
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
    // ad[2 rh + vh] = (D[8 rh + 2 tq][8 vh + gq], D[8 rh + 2 tq + 1][8 vh + gq]) (the mma pass's layout)
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
}  // namespace

void launch_state_key_split(const Params& p, int HV, int N, cudaStream_t stream) {
  constexpr int D = 256, smem = state_smem<D>;
  cuda_check(cudaFuncSetAttribute(kda_state_ks_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute(kda_state_ks_kernel)");
  // 2 CTAs of ~93 KB per SM need the whole shared-memory carveout
  cuda_check(cudaFuncSetAttribute(kda_state_ks_kernel<D>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared),
             "cudaFuncSetAttribute(kda_state_ks_kernel carveout)");
  kda_state_ks_kernel<D><<<dim3(D / SLICE, HV, N), 64 * KS, smem, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_state_ks_kernel launch");
}

}  // namespace kdalab::kernels::kda_prefill_detail
