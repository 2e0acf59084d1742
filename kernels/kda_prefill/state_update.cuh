#pragma once
// The state update S^T <- Diag(gam_n) S^T + D^T Kd of the mma state pass (kda_state_kernel,
// kernels/kda_prefill/state_mma.cu). Algorithm: the chunkwise KDA state update (docs/equations.md section 4, "State:";
// K3 report Eq. 3-4), S' = Diag(gamma^C) S + Kd^T V~ with Kd = (gamma^C / Gamma) ⊙ K and V~ = D = U - W S.
// __forceinline__ and cut out of the kernel as written (same operations, same order: unchanged normalised PTX).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/kda_math.cuh"

namespace kdalab::kernels::detail {

/// The state update of one state step on one warp's S^T accumulators:
///   S^T <- Diag(gam_n) S^T + sum_{ks < KS} D_ks^T Kd_ks   (docs/equations.md section 4, "State:"; K3 report Eq. 4).
/// Sacc[j][e] = S[8j + 2tq + (e & 1)][v0 + gq + 8(e >> 1)] (NJ = D / 8 n-tiles of 8 key rows, the warp's 16 value
/// columns v0 ..); gn: the chunk's gam_n (D fp32, shared memory); Kd: the bf16 B fragments of Kd, k-step ks, key
/// n-tile pair j / 2 at Kd[(ks NJ / 2 + j / 2) 32 + lane] (x, y: n-tile j even; z, w: odd); ad[ks]: the A fragment
/// of D_ks^T (16 value rows x 16 chunk rows, bf16). KS: chunks per step (the mma pass: 1; KS > 1 takes the
/// KS chunks' stacked D^T and Kd). tq = lane % 4. Per n-tile j: the decay first, then the KS
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

}  // namespace kdalab::kernels::detail
