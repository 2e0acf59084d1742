#pragma once
// Pieces of the mma.sync KDA state passes that more than one pass runs, one copy: the state update
// S^T <- Diag(gam_n) S^T + D^T Kd of the one-chunk passes v2 / v3 (kda_state_kernel, kernels/kda_prefill.cu) and of
// the pair pass (kda_state_pair_kernel, kernels/kda_pair.cu), and the m16n8 accumulator-fragment walk of the pair
// pass. Algorithm: the chunkwise KDA state update (EQUATIONS.md section 4, "State:"; K3 report Eq. 3-4), S' =
// Diag(gamma^C) S + Kd^T V~ with Kd = (gamma^C / Gamma) ⊙ K and V~ = D = U - W S.
// Both functions are __forceinline__ and were cut out of the kernels as written (same operations, same order): the
// normalised PTX of every kernel of kda_prefill.cu and kda_pair.cu is unchanged (bench/NOTES.md "State update
// shared (dedup7)").
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kda_common.cuh"

namespace kdalab::kernels::detail {

/// The state update of one state step on one warp's S^T accumulators:
///   S^T <- Diag(gam_n) S^T + sum_{ks < KS} D_ks^T Kd_ks   (EQUATIONS.md section 4, "State:"; K3 report Eq. 4).
/// Sacc[j][e] = S[8j + 2tq + (e & 1)][v0 + gq + 8(e >> 1)] (NJ = D / 8 n-tiles of 8 key rows, the warp's 16 value
/// columns v0 ..); gn: the chunk's gam_n (D fp32, shared memory); Kd: the bf16 B fragments of Kd, k-step ks, key
/// n-tile pair j / 2 at Kd[(ks NJ / 2 + j / 2) 32 + lane] (x, y: n-tile j even; z, w: odd); ad[ks]: the A fragment
/// of D_ks^T (16 value rows x 16 chunk rows, bf16). KS = 1: one chunk (v2, v3); KS = 2: a pair of chunks (the
/// pair pass, D2 = [D_c; D_c+1], Kd2 = [Kd_c; Kd_c+1]). tq = lane % 4. Per n-tile j: the decay first, then the KS
/// mma.sync in ks order (fp32 accumulate onto the decayed S). No error path (device code, shapes fixed at compile
/// time).
template <int NJ, int KS>
__device__ __forceinline__ void state_decay_update(float (&Sacc)[NJ][4], const float* gn, const uint4* Kd,
                                                   const std::uint32_t (*ad)[4], int lane, int tq) {
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const float g0 = gn[8 * j + 2 * tq], g1 = gn[8 * j + 2 * tq + 1];
    Sacc[j][0] *= g0;
    Sacc[j][1] *= g1;
    Sacc[j][2] *= g0;
    Sacc[j][3] *= g1;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const uint4 kb = Kd[(ks * (NJ / 2) + j / 2) * 32 + lane];
      const std::uint32_t b[2] = {(j & 1) ? kb.z : kb.x, (j & 1) ? kb.w : kb.y};
      mma_bf16(Sacc[j], ad[ks], b);
    }
  }
}

/// Walks the fp32 C fragments of an MT x 2 grid of m16n8 accumulator tiles (rows 16 mt .., columns 8 nt ..) by
/// element pairs: f(mt, nt, hh, r, v) for the elements 2 hh, 2 hh + 1 of tile (mt, nt), which hold row r = 16 mt + gq +
/// 8 hh, columns v and v + 1 (v = 8 nt + 2 tq); gq = lane / 4, tq = lane % 4 (the mma.sync m16n8k16 D layout, PTX ISA).
/// Order: mt, then nt, then hh (fully unrolled). The pair pass (MT = 2) writes D2 = U2 - W2 S and stores o with it.
template <int MT, class F>
__device__ __forceinline__ void for_acc_pairs(int gq, int tq, F&& f) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) f(mt, nt, hh, 16 * mt + gq + 8 * hh, 8 * nt + 2 * tq);
}

}  // namespace kdalab::kernels::detail
