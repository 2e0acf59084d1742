// KDA prefill, the prepare kernel: one CTA (256 threads) per (16-token chunk, value head, sequence) writes the chunk's
// workspace slot (KdaSlotOf<D>, kernels/kda.hpp). Per CTA:
//  - loads: 8-byte loads of channels 4j.. and 64 + 4j.. so each quarter-warp's float4 store covers 128 contiguous
//    bytes (an 8-channel split makes 2-way bank conflicts); fused gate, L2Norm, beta sigmoid;
//  - decay phase (thread = channel): Qg and Kd go from registers straight to their global fragments (Qg: channels
//    i, i^1 swap 8 values by shuffle; Kd: no exchange);
//  - A = Kg Ki^T and P = Qg Ki^T on the tensor cores (mma.m16n8k8, tf32 3-pass: a_hi b_hi + a_hi b_lo + a_lo b_hi,
//    fp32 accumulation; ~2^-21 relative per product term, against 2^-24 for fp32 FMAs), K = D split over the 8
//    warps, the 8 partial 16 x 16 tiles summed through shared memory in fixed order;
//  - forward substitution of [W | U]: the A row as float4 broadcasts; W from the substitution registers straight to
//    its fragments (as Qg).
// ~2.4x less shared-memory traffic than an fp32-FMA prepare (bound by it: ncu L1/smem 79%, DRAM 22%); measurements
// and the retired FMA version (commit 1910970): docs/kernels/kda_prefill.md.
#include "kernels/kda_prefill/common.cuh"

namespace kdalab::kernels::kda_prefill_detail {
namespace {

// store_afrag_col / store_bfrag_col (the Qg, W and Kd fragment stores): kernels/kda_prefill/prepare_phases.cuh.

/// Shared-memory plan of the prepare for d_k = d_v = D: four 16 x (D + 4) fp32 tiles (static up to D = 128;
/// dynamic at D = 256, where they are 66.6 KB, above the 48 KB static limit), A (1 KB), beta; the 8 warps'
/// partial A / P tiles (16 KB) go over tiles [0] and [1] when those are large enough (D >= 128), else into
/// their own static buffer (D = 64).
template <int D>
struct PrepSmem {
  static constexpr int DP = D + 4;                             // padded row (floats), keeps float4 alignment
  static constexpr int tile_bytes = 4 * C * DP * 4;            // sT
  static constexpr bool dyn = tile_bytes > 48 * 1024;          // D = 256
  static constexpr int dyn_bytes = dyn ? tile_bytes : 0;
  static constexpr bool red_in_tiles = 2 * C * DP * 4 >= 8 * 256 * 8;
  static constexpr int static_bytes = (dyn ? 0 : tile_bytes) + (red_in_tiles ? 0 : 8 * 256 * 8) + C * C * 4 + C * 4;
  static_assert(static_bytes <= 48 * 1024, "prepare: static shared memory above 48 KB");
  static_assert(static_bytes + dyn_bytes <= 227 * 1024, "prepare: shared memory per CTA above 227 KB");

};

// 4 CTAs (32 warps) per SM at D = 64 / 128 need <= 64 registers: the minimum-blocks bound keeps ptxas there
// (the gate / reciprocal code takes 72 without it, i.e. 3 CTAs per SM); D = 256 is held to 3 CTAs by its 66.6 KB of
// dynamic shared memory (and by this bound: <= 85 registers).
// kHiLo (the accurate precision, wgmma layout only) is its own instance: its lo stores in the fast kernel took
// registers from the rest (96 bytes of spills against 8), whatever the run-time branch.
template <int D, bool kWg = false, bool kHiLo = false>
__global__ void __launch_bounds__(256, D == 256 ? 3 : 4) kda_prepare_kernel(Params p) {
  static_assert(!kWg || D == 128, "the wgmma slot layout: D = 128");
  static_assert(!kHiLo || kWg, "the lo parts: the wgmma layout only");
  static_assert(D == 64 || D == 128 || D == 256, "prepare: D = 64, 128 or 256");
  constexpr int DP = PrepSmem<D>::DP;
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
  if constexpr (PrepSmem<D>::dyn) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    sT = reinterpret_cast<float(*)[C][DP]>(dyn_smem);
  } else {
    __shared__ __align__(16) float sT_static[4][C][DP];
    sT = sT_static;
  }
  __shared__ __align__(16) float sA[C][C];
  __shared__ float sBeta[C];
  [[maybe_unused]] __shared__ std::uint32_t sUmax[kHiLo ? 4 : 1];  // the accurate precision: max |U| of the 4 U warps (fp32 bits)
  float(*sQ)[DP] = sT[0];
  float(*sKi)[DP] = sT[1];
  float(*sK)[DP] = sT[2];
  float(*sV)[DP] = sT[3];
  unsigned char* slot = p.ws + ((sq.slot0 + c) * p.HV + hv) * static_cast<long long>(SL::bytes);

  // ---- load (8-byte loads of channels 4j..4j+3, 64+4j.., ...), fusions ----
  prep::load_fuse<D>(p, sq, t0, nvalid, h, hv, tid, sQ, sK, sV, sKi, sBeta);
  __syncthreads();
  // ---- cumulative decay per channel (thread = channel); Qg, Kd fragments and gam_n to the slot ----
  if (tid < D) {
    const int i = tid;
    float gam[C];
    const float gn = prep::decay_gamma(sKi, i, gam);  // sKi holds g here
    reinterpret_cast<float*>(slot + SL::gam_n)[i] = gn;
    float qg[C], kd[C];
    prep::decay_apply(sQ, sK, sKi, i, gam, gn, qg, kd);
    if constexpr (kWg) {  // the wgmma state pass: Qg, Kd row-major (kda_state_wg_kernel's layout)
      auto* qg_hi = reinterpret_cast<std::uint16_t*>(slot + SL::Qg);
      auto* kd_hi = reinterpret_cast<std::uint16_t*>(slot + SL::Kd);
      if constexpr (kHiLo) {  // the accurate precision: Qg fp16; Kd fp16 hi + e4m3 lo ((x - rnd(x)) 2^12) in the lo region
        unsigned char* lo = p.ws_lo + ((sq.slot0 + c) * p.HV + hv) * static_cast<long long>(kda_slot_lo_bytes);
        prep::store_rowmajor_col<D, true>(qg_hi, qg, i);
        prep::store_rowmajor_col_hi_lo8<D>(kd_hi, lo, kd, i);
      } else {
        prep::store_rowmajor_col<D>(qg_hi, qg, i);
        prep::store_rowmajor_col<D>(kd_hi, kd, i);
      }
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
    if constexpr (PrepSmem<D>::red_in_tiles) {
      red = reinterpret_cast<float2*>(&sT[0][0][0]);
    } else {
      __shared__ __align__(16) float2 red_static[8 * 256];
      red = red_static;
    }
    prep::ap_store_partial(red, warp, lane, acc);
    __syncthreads();
    // thread tid sums fragment slot tid over the warps; A -> sA; P: fp32 (write_p, off) and hi + lo bf16 A fragments
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
  // ---- [W | U] = (I + A)^{-1} [Diag(beta) Kg | Diag(beta) V] (thread = column) ----
  // 2 D columns: thread tid takes column tid (D = 128), tid < 128 (D = 64; whole warps idle past it),
  // tid and tid + 256 (D = 256). W columns (< D) cover whole warps, as store_afrag_col's shuffles need.
  auto subst = [&](const int col) {
    float x[C];
    prep::subst<D>(x, sBeta, sK, sV, sA, col);
    if (col < D) {
      if constexpr (kWg) prep::store_rowmajor_col<D, kHiLo>(reinterpret_cast<std::uint16_t*>(slot + SL::W), x, col);
      else prep::store_afrag_col(reinterpret_cast<uint4*>(slot + SL::W), x, col);
    } else {
      float* U = reinterpret_cast<float*>(slot + SL::U);
#pragma unroll
      for (int r = 0; r < C; ++r) U[r * D + (col - D)] = x[r];
      if constexpr (kHiLo) {  // the chunk's max |U| (fp32 bits: non-negative floats order as integers), per warp
        std::uint32_t m = 0;
#pragma unroll
        for (int r = 0; r < C; ++r) m = max(m, __float_as_uint(fabsf(x[r])));
        m = __reduce_max_sync(0xffffffffu, m);
        if (tid % 32 == 0) sUmax[tid / 32 - D / 32] = m;
      }
    }
  };
  if constexpr (2 * D == 256) {
    subst(tid);
    if constexpr (kHiLo) {  // the slot's U-max word (the fp32 P member's first 4 bytes): the state pass's value scale
      __syncthreads();
      if (tid == 0)
        *reinterpret_cast<std::uint32_t*>(slot + SL::P) = max(max(sUmax[0], sUmax[1]), max(sUmax[2], sUmax[3]));
    }
  } else if constexpr (2 * D < 256) {
    if (tid < 2 * D) subst(tid);
  } else {
    static_assert(2 * D == 512, "D = 256: two columns per thread");
    // one after the other: interleaved (unrolled) the two chains took 168 registers (1 CTA per SM)
#pragma unroll 1
    for (int col = tid; col < 2 * D; col += 256) subst(col);
  }
}
}  // namespace

void launch_prepare(const Params& p, dim3 grid, int D, bool wgmma_layout, cudaStream_t stream) {
  if (wgmma_layout && p.ws_lo) {
    kda_prepare_kernel<128, true, true><<<grid, 256, 0, stream>>>(p);
  } else if (wgmma_layout) {
    kda_prepare_kernel<128, true><<<grid, 256, 0, stream>>>(p);
  } else if (D == 64) {
    kda_prepare_kernel<64><<<grid, 256, 0, stream>>>(p);
  } else if (D == 256) {
    constexpr int smem = PrepSmem<256>::dyn_bytes;
    cuda_check(cudaFuncSetAttribute(kda_prepare_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(kda_prepare_kernel<256>)");
    kda_prepare_kernel<256><<<grid, 256, smem, stream>>>(p);
  } else {
    kda_prepare_kernel<128><<<grid, 256, 0, stream>>>(p);
  }
  cuda_check(cudaGetLastError(), "kda_prepare_kernel launch");
}

}  // namespace kdalab::kernels::kda_prefill_detail
