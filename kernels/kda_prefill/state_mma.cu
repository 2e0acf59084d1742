// KDA prefill, the mma state pass (KdaStatePass::mma; D = 64 and 128) and the two passes of the segment path.
//
// One CTA of 2 warps per (32-column slice of d_v, value head, sequence), so H = 32 heads give 128 CTAs at D = 128.
// Each warp keeps S^T for 16 value columns x D key rows in mma accumulator registers (fp32); its C-fragment layout is
// exactly the B-fragment layout Qg S needs and the A-fragment layout of S^T, so no shuffles. Per chunk: D^T = U^T -
// S^T W^T (in registers, in the layout the update takes), the state update S^T <- Diag(gam_n) S^T + D^T Kd issued
// first, then o = scale (Qg S + P D) with P D on the tensor cores as Phi Dhi + Phi Dlo + Plo Dhi (bf16 hi/lo splits,
// fp32 accumulate: ~2^-16 relative, i.e. fp32-class as the plan asks), accumulated straight onto Qg S. The next
// chunks' slots stream in by cp.async (NST stages, straight-line copies issued after the update) while the current
// one is computed. The retired fp32-FMA P D step (commit 1910970) and the measurements: docs/kernels/kda_prefill.md.
//
// kPass1 (the segment path, pass 1), segments 1..: no o; slices 0 .. D / 32 - 1 run the segment from S = 0 with the
// true U (-> B_seg columns), slices D / 32 .. from S = I with U = 0 (-> A_seg columns: D = -W S); the end state goes
// to seg_B / seg_A. Segment 0 in pass 1 is the full state pass from S0 (o written; the A_seg slices exit) whose end
// state is S_start(1) (seg_S[0]). Without kPass1 the kernel is the state pass of one segment (all chunks when
// nseg_grid = 1), starting from S0 (segment 0) or seg_S.
//
// D: 64 or 128 (D / 16 k-tiles of W S and Qg S, D / 8 n-tiles of the update, D / 2 fp32 of S per thread). D = 256
// runs the key-split pass (state_key_split.cu; 128 fp32 per thread here would spill).
#include "kernels/kda_prefill/stage.cuh"
#include "kernels/kda_prefill/state_update.cuh"

namespace kdalab::kernels::kda_prefill_detail {
namespace {

template <int D, bool kPass1 = false>
__global__ void __launch_bounds__(64) kda_state_kernel(Params p) {
  static_assert(D == 64 || D == 128, "the one-warp-per-16-columns state step: D = 64 or 128");
  using SL = Slot<D>;  // (static members, not local constants: a lambda's capture of those changes the D = 128 PTX)
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
  const StageParts parts{full, !acols, p.write_p && full, full};
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
}  // namespace

void launch_state_mma(const Params& p, int D, int HV, int nz, cudaStream_t stream) {
  auto launch = [&](auto kernel, int smem, int cols) {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(kda_state_kernel)");
    kernel<<<dim3(cols / SLICE, HV, nz), 64, smem, stream>>>(p);
  };
  if (D == 64) launch(kda_state_kernel<64>, state_smem<64>, 64);
  else launch(kda_state_kernel<128>, state_smem<128>, 128);
  cuda_check(cudaGetLastError(), "kda_state_kernel launch");
}

void launch_state_mma_pass1(const Params& p, int D, int HV, int nz, cudaStream_t stream) {
  auto launch = [&](auto kernel, int smem, int cols) {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(kda_state_kernel pass 1)");
    kernel<<<dim3(2 * cols / SLICE, HV, nz), 64, smem, stream>>>(p);
  };
  if (D == 64) launch(kda_state_kernel<64, true>, state_smem<64>, 64);
  else launch(kda_state_kernel<128, true>, state_smem<128>, 128);
  cuda_check(cudaGetLastError(), "kda_state_kernel pass 1 launch");
}

}  // namespace kdalab::kernels::kda_prefill_detail
