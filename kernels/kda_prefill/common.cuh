#pragma once
// Private to kernels/kda_prefill/: the kernel parameters, the workspace slot, the sequence span, and the launchers
// each file of the folder provides to launch.cu. Algorithm and precision plan: numerics/kda_twin.hpp
// (kda_plan_kernel()), docs/equations.md; versions and measurements: docs/kernels/kda_prefill.md.
//
// The prefill runs two kernels:
//  1. the prepare (prepare.cu), token-parallel, one CTA (256 threads) per (16-token chunk, value head, sequence):
//     fused gate, L2Norm, beta sigmoid; cumulative decay gam = exp(G); Qg, Kg, Ki, Kd; A = StrictLower(Diag(beta)
//     Kg Ki^T) and P = Lower(Qg Ki^T) on the tensor cores (tf32 3-pass); [W | U] by fp32 forward substitution.
//     Writes the chunk's workspace slot: W, Qg (bf16 A fragments of mma.m16n8k16, or row-major for the wgmma
//     pass), Kd (bf16 B fragments), U (fp32), P (hi + lo bf16), gam_n (fp32).
//  2. a state pass, chunk-sequential: D^T = U^T - S^T W^T, o = scale (Qg S + P D), S^T <- Diag(gam_n) S^T + D^T Kd
//     with S in fp32 registers. Three kernels (KdaStatePass, kernels/kda.hpp): mma (state_mma.cu, one warp per 16
//     value columns, D = 64 and 128, also the two passes of the segment path, segments.cu), key_split
//     (state_key_split.cu, D = 256) and wgmma (state_wgmma.cu, D = 128, one warpgroup per 64 value columns).
// launch.cu checks the arguments, states the rule (kda_prefill_plan) and runs the schedule.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/kda_math.cuh"
#include "kernels/kda.hpp"
#include "kernels/kda_prefill/prepare_phases.cuh"

namespace kdalab::kernels::kda_prefill_detail {

using namespace detail;

constexpr int C = 16;      // chunk (tokens)
constexpr int SLICE = 32;  // value columns per CTA of the mma and key-split state passes
constexpr int NST = 3;     // cp.async pipeline depth of the state passes (6 gave no gain and cost occupancy)

// Workspace slot per (chunk, value head), bytes (KdaSlotOf<D>, kernels/kda.hpp). W, Qg, Kd are bf16 (mma operand
// fragments); U, gam_n stay fp32 (used in fp32); Pf: P as hi + lo bf16 A fragments (2 x 32 x 16 B). The fp32 P
// member is not written (write_p is false in every schedule); the slot stride keeps its 1 KB.
template <int D>
using Slot = KdaSlotOf<D>;
static_assert(Slot<128>::W == 0 && Slot<128>::Qg == 4096 && Slot<128>::Kd == 8192 && Slot<128>::U == 12288 &&
                  Slot<128>::P == 20480 && Slot<128>::gam_n == 21504 && Slot<128>::Pf == 22016 &&
                  Slot<128>::bytes == 23040,
              "slot layout (the state kernels' stage copies rely on it)");

struct Params {
  int B, T, H, HV, group, N, nchunk_fixed;
  const bf16_t *q, *k, *v, *g, *beta;
  Strides sq, sk, sv, sg, so, sbeta;
  const float *A_log, *bias;
  float g_min, scale;
  bool fuse_gate, l2norm, beta_sigmoid;
  bool write_p;  // the prepare writes fp32 P and the state pass loads it: false in every schedule (kept so that the
                 // kernels' parameter layout, and with it their code, is the one measured)
  const float* S0;
  float* S_final;
  const int* cu;
  bf16_t* o;
  unsigned char* ws;
  unsigned char* ws_lo;  // the accurate precision's lo parts (kda_slot_lo_bytes per slot, same slot index); null: fast
  // The segment path (segments.cu): grid.z = N * nseg_grid, segment sg = seg_base + blockIdx.z % nseg_grid covers
  // chunks [sg * seg_chunks, min(nch, (sg + 1) * seg_chunks)). One-shot pass: nseg_grid = 1, seg_chunks = 1 << 30.
  int nseg_grid, seg_chunks;
  int seg_base;    // first segment of this launch
  int chunk_base;  // first chunk of a prepare launch (0 in every schedule; part of the measured parameter layout)
  float* seg_S;  // [P - 1][N][HV][D][D] fp32: S_start of segments 1 .. P-1
  float* seg_A;  // [P - 1][N][HV][D][D] fp32: A_seg (d_k x d_k) of segments 0 .. P-2
  float* seg_B;  // [P - 1][N][HV][D][D] fp32: B_seg of segments 0 .. P-2
};

using prep::Seq;
/// Sequence n's tokens and its first slot (16-token chunks): kernels/kda_prefill/prepare_phases.cuh seq_of.
__device__ __forceinline__ Seq seq_info(const Params& p, int n) { return prep::seq_of<C, &Params::nchunk_fixed>(p, n); }

// ---- launchers (host), one per kernel family; each checks the launch with cuda_check ----
/// prepare.cu: the prepare kernel for d_k = d_v = D (64, 128, 256) on `grid` (chunks, HV, N); wgmma_layout: W, Qg, Kd,
/// P row-major for the wgmma state pass (D = 128 only), and with p.ws_lo set the lo parts of Qg and Kd.
void launch_prepare(const Params& p, dim3 grid, int D, bool wgmma_layout, cudaStream_t stream);
/// state_mma.cu: the mma state pass (D = 64 or 128), grid (D / 32, HV, nz): one-shot (nz = N, nseg_grid = 1) or
/// pass 2 of the segment path (nz = N nseg_grid).
void launch_state_mma(const Params& p, int D, int HV, int nz, cudaStream_t stream);
/// state_mma.cu: pass 1 of the segment path (D = 64 or 128), grid (2 D / 32, HV, nz = N nseg_grid).
void launch_state_mma_pass1(const Params& p, int D, int HV, int nz, cudaStream_t stream);
/// state_key_split.cu: the key-split state pass (D = 256), grid (D / 32, HV, N).
void launch_state_key_split(const Params& p, int HV, int N, cudaStream_t stream);
/// state_wgmma.cu: the wgmma state pass (D = 128), grid (2, HV, N); the accurate precision's variant when p.ws_lo is set.
/// reserve_sm: each CTA takes the SM's whole shared memory (KdaPrefillPlan::state_sm_reserved).
void launch_state_wgmma(const Params& p, int HV, int N, cudaStream_t stream, bool reserve_sm = false);
/// segments.cu: the combine of the segment path (D = 64 or 128), S_start(s + 1) for s = 1 .. nseg - 2.
void launch_segment_combine(const Params& p, int D, int HV, int N, int nseg, cudaStream_t stream);

}  // namespace kdalab::kernels::kda_prefill_detail
