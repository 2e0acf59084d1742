// KDA prefill, the segment path (KdaSchedule::segments; fixed-length batches, D = 64 and 128): the chunk sequence is
// cut into P segments; pass 1 runs, in parallel, segment 0's full pass from S0 (o; its end state is S_start(1)) and
// segments 1..P-2 from S = 0 (-> B_seg) and from S = I with v = 0 (-> A_seg, d_k x d_k); the combine kernel (below)
// scans S_start(s + 1) = A_seg S_start(s) + B_seg in fp32; pass 2 runs segments 1..P-1 in parallel from their S_start
// (o, S_final). Passes 1 and 2 are the mma state kernel (state_mma.cu). Up to ~2.5x the state work: it pays only where
// the one-shot pass leaves SMs idle (the wave model of kda_prefill_plan, launch.cu). Not bit-identical to the one-shot
// pass (A_seg carries its own bf16 operand roundings; the twin's KdaTwinPlan::segments models it).
#include <string>

#include "kernels/kda_prefill/segments.hpp"

namespace kdalab::kernels::kda_prefill_detail {
namespace {

// The combine: S_start(s + 1) = A_seg(s) S_start(s) + B_seg(s) for s = 1 .. P-2, in fp32 (FMA chain from B over m = 0
// .. D - 1), from S_start(1) = seg_S[0] (segment 0's end state, pass 1). Launched for P >= 3. One CTA (256 threads)
// per (32-column slice of d_v, value head, sequence): column slices of S are independent. D = 64 or 128 (rows i0 + 8
// r, r < D / 8); at D = 256 A_seg alone would be 256 KB of shared memory.
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
}  // namespace

void launch_segment_combine(const Params& p, int D, int HV, int N, int nseg, cudaStream_t stream) {
  auto launch = [&](auto kernel, int smem, int cols) {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(kda_segment_combine_kernel)");
    kernel<<<dim3(cols / SLICE, HV, N), 256, smem, stream>>>(p, nseg);
  };
  if (D == 64) launch(kda_segment_combine_kernel<64>, cmb_smem<64>, 64);
  else launch(kda_segment_combine_kernel<128>, cmb_smem<128>, 128);
  cuda_check(cudaGetLastError(), "kda_segment_combine_kernel launch");
}

void run_segment_path(const SegmentRun& r, cudaStream_t stream) {
  if (static_cast<long long>(r.N) * r.P > 65535)
    throw Error("kda_prefill: " + std::to_string(r.N) + " sequences x " + std::to_string(r.P) +
                " segments; accepted: <= 65535 (grid limit); force fewer segments or the one-shot schedule");
  Params p = r.p;
  const std::size_t seg_elems = static_cast<std::size_t>(r.P - 1) * r.N * r.HV * r.D * r.D;
  p.seg_S = reinterpret_cast<float*>(p.ws + r.slot_bytes);
  p.seg_A = p.seg_S + seg_elems;
  p.seg_B = p.seg_A + seg_elems;
  p.seg_chunks = r.seg_chunks;
  if (r.prepare) launch_prepare(p, dim3(r.max_chunks, r.HV, r.N), r.D, false, stream);
  if (r.state) {
    p.nseg_grid = r.P - 1;
    launch_state_mma_pass1(p, r.D, r.HV, r.N * (r.P - 1), stream);
    if (r.P >= 3) launch_segment_combine(p, r.D, r.HV, r.N, r.P, stream);
    p.seg_base = 1;  // pass 2: segments 1 .. P-1 (segment 0's o came from pass 1)
    p.nseg_grid = r.P - 1;
    launch_state_mma(p, r.D, r.HV, r.N * (r.P - 1), stream);
  }
}

}  // namespace kdalab::kernels::kda_prefill_detail
