#pragma once
// Private to kernels/kda_prefill/: the shared-memory stage of one chunk for the mma and key-split state passes
// (state_mma.cu, state_key_split.cu) and its cp.async copy, and the dynamic shared memory of those passes.
#include "kernels/kda_prefill/common.cuh"

namespace kdalab::kernels::kda_prefill_detail {

// Shared stage of one chunk for one state CTA (32 value columns), d_k = d_v = D. W, Qg, Kd adjacent (as in the slot):
// one block copy. U rows are padded by UPAD floats: the mma pass reads U transposed (U[r][v] for r = 2 tq + .., v =
// gq + ..), and a row stride of 36 floats puts the 32 lanes' reads in 32 different banks (stride 32: 4-way
// conflicts).
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
  bool qg;  // false: W and Kd only (pass 1 of the segment path past segment 0: no o, so no Qg)
  bool u;   // the CTA's U slice (false: the A_seg columns of pass 1, which run with U = 0)
  bool p;   // fp32 P (Params::write_p; false in every schedule)
  bool pf;  // P as hi + lo bf16 A fragments
};

/// One chunk's workspace slot -> one state stage, by 16-byte cp.async (no commit: the caller commits). NT threads
/// (tid < NT); every trip count is a compile-time constant and each thread's copies are straight-line code with
/// immediate offsets: runtime-bounded copy loops held ~35% of the mma step's warp-stall samples on the H200 (ncu source
/// counters; docs/kernels/kda_prefill.md, "State v8"). slot: the chunk's slot (Slot<D> layout);
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

/// Dynamic shared memory of the mma and key-split state passes (NST stages), checked against the 227 KB per CTA
/// (with the kernels' static shared memory: mma none; key split 6,144 B at D = 256).
template <int D>
constexpr int state_smem = NST * static_cast<int>(sizeof(Stage<D>));
static_assert(state_smem<64> <= 227 * 1024 && state_smem<128> <= 227 * 1024 && state_smem<256> + 6144 <= 227 * 1024,
              "state pass: shared memory per CTA above 227 KB");
static_assert(state_smem<128> == 51456 && 4 * (state_smem<128> + 1024) <= 228 * 1024,
              "the D = 128 mma state pass: 51,456 B (U rows padded), 4 CTAs per SM (H = 96: one wave)");

}  // namespace kdalab::kernels::kda_prefill_detail
