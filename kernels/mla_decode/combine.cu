// The combine kernel of the absorbed MLA decode (kernels/mla.hpp): merges the partials (m_s, l_s, unnormalised acc_s)
// of the slices of each sequence, per (query row, sequence) (query row = token j H + head; s_q = 1: the head):
//   M = max_s m_s,  L = sum_s l_s 2^(m_s - M),  a = sum_s 2^(m_s - M) acc_s / L   (log2 domain)
// It is not launched when the plan gives one slice per sequence (the split kernel then writes the output).
// Design and measurements: docs/kernels/mla_decode.md.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/common/cuda_check.hpp"
#include "kernels/common/kda_math.cuh"
#include "kernels/mla_decode/decode.cuh"

namespace kdalab::kernels::mla_decode_impl {

namespace {

/// The start of the combine for (query row h of nq, sequence b, quarter): o = this lane's float4 of the output quarter;
/// returns the slice count ns of sequence b, or 0 after warp 0 wrote NaN there when the device length lens[b] is
/// outside [s_q, max_len] (then the CTA must return).
__device__ __forceinline__ int quarter_start(const DecodeParams& p, int s_q, int nq, int h, int b, int quarter, int lane,
                                             int warp, float4*& o) {
  const int len = seq_len(p, b);
  o = reinterpret_cast<float4*>(p.out + (static_cast<long long>(b) * nq + h) * DC + 128 * quarter) + lane;
  if (len < s_q || len > p.max_len) {
    if (warp == 0) *o = make_float4(NAN, NAN, NAN, NAN);
    return 0;
  }
  return (len + p.split_len - 1) / p.split_len;
}

/// One CTA of 32 nw threads per (query row, sequence, quarter of the d_c columns), nw = blockDim.x / 32 =
/// clamp(ceil(num_splits / 8), 1, 16) warps (combine_threads). Warp w takes the slices s = w, w + nw, .. and merges
/// them with its own running maximum (8 slices per step: the (m, l) pair and the float4 partial of each slice are
/// loaded together, so a step is ONE batch of independent loads, not a reduction of (M, L) over all slices followed
/// by the loads of the partials). With ns <= 8 nw slices (every ns <= 128; N = 64K: 128 slices, 16 warps) every
/// load of the CTA is in flight at once. The warps' (m_w, l_w, a_w) meet in shared memory; warp 0 forms
/// a = sum_w 2^(m_w - M) a_w / sum_w 2^(m_w - M) l_w.
/// Launched with programmatic dependent launch (launch_combine): griddepcontrol.wait first waits for the whole split
/// grid to complete and its writes to be visible (a no-op when launched without the attribute), so only the launch
/// overlaps the split kernel's tail, never a read.
/// Params: DecodeParams (accurate, s_q = 1: the query rows are the H heads) or FastParams (s_q H query rows).
template <int H, class Params>
__global__ void __launch_bounds__(512) mla_decode_combine_kernel(Params p) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  __shared__ float4 part[16][32];
  __shared__ float2 mlw[16];
  const int h = blockIdx.x, b = blockIdx.y, quarter = blockIdx.z, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int nw = blockDim.x / 32;
  const int s_q = query_tokens(p), nq = s_q * H;  // query rows per sequence (accurate: H)
  float4* o = nullptr;
  const int ns = quarter_start(p, s_q, nq, h, b, quarter, lane, warp, o);
  if (ns == 0) return;
  const long long base = static_cast<long long>(b) * p.num_splits;
  const float2* ml = reinterpret_cast<const float2*>(p.ws_ml + (base * nq + h) * 2);  // (m, l) of slice s at ml[s nq]
  const float4* acc = reinterpret_cast<const float4*>(p.ws_acc + (base * nq + h) * DC + 128 * quarter) + lane;
  const long long SS = static_cast<long long>(nq) * DC / 4;  // float4 stride between slices
  float m = -INFINITY, l = 0.0f;
  float4 a = make_float4(0, 0, 0, 0);
  for (int s0 = warp; s0 < ns; s0 += 8 * nw) {  // 8 slices s0, s0 + nw, .. per step (past ns: weight 0)
    float4 x[8];
    float2 w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int s = s0 + i * nw;
      if (s < ns) {
        x[i] = acc[s * SS];
        w[i] = ml[static_cast<long long>(s) * nq];
      } else {
        x[i] = make_float4(0, 0, 0, 0);
        w[i] = make_float2(-INFINITY, 0.0f);
      }
    }
    float mn = m;
#pragma unroll
    for (int i = 0; i < 8; ++i) mn = fmaxf(mn, w[i].x);  // finite: slice s0 < ns is in this step
    const float corr = exp2f(m - mn);                    // 0 on the first step (m = -inf)
    l *= corr;
    a.x *= corr; a.y *= corr; a.z *= corr; a.w *= corr;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float wi = exp2f(w[i].x - mn);  // 0 past ns
      l += wi * w[i].y;
      a.x += wi * x[i].x; a.y += wi * x[i].y; a.z += wi * x[i].z; a.w += wi * x[i].w;
    }
    m = mn;
  }
  part[warp][lane] = a;
  if (lane == 0) mlw[warp] = make_float2(m, l);
  __syncthreads();
  if (warp == 0) {
    const int nact = min(nw, ns);  // warps w < ns took at least one slice (the others kept m = -inf)
    float M = -INFINITY;
    for (int w = 0; w < nact; ++w) M = fmaxf(M, mlw[w].x);
    float L = 0.0f;
    float4 r = make_float4(0, 0, 0, 0);
    for (int w = 0; w < nact; ++w) {
      const float f = exp2f(mlw[w].x - M);
      const float4 x = part[w][lane];
      L += f * mlw[w].y;
      r.x += f * x.x; r.y += f * x.y; r.z += f * x.z; r.w += f * x.w;
    }
    const float inv = 1.0f / L;
    *o = make_float4(r.x * inv, r.y * inv, r.z * inv, r.w * inv);
  }
}

/// Threads per CTA of the combine kernel for ns slices per sequence: 32 nw with nw = clamp(ceil(ns / 8), 1, 16), the
/// fewest warps that still take every slice in ONE batch of loads (8 slices per warp and step). One warp per slice
/// up to 16 made B x 4 H CTAs of up to 512 threads, two waves of them for B >= 8; measured on an H200 (CUDA-graph
/// step, H = 32): B = 8 x 8K 47-49 -> 36-37 us, 16 x 4K 42.5 -> 35-36, 4 x 16K 43.7 -> 38.9, B = 1 N = 2K
/// 10.8 -> 10.4; unchanged at N = 64K (ns = 128: 16 warps either way), 1M and large batches. Packing 2 or 4 column
/// quarters into one CTA when nw <= 2 (CTAs of >= 4 warps) measured the same. docs/kernels/mla_decode.md.
int combine_threads(int ns) { return 32 * std::max(1, std::min(16, (ns + 7) / 8)); }

/// Launches a combine kernel with programmatic dependent launch (cudaLaunchAttributeProgrammaticStreamSerialization):
/// it may start while the split kernel before it in the stream finishes (after that kernel's
/// griddepcontrol.launch_dependents); its griddepcontrol.wait holds every read until the split grid has completed.
/// Works under CUDA-graph capture (a programmatic edge).
template <class Params, void (*kernel)(Params)>
void launch_combine_pdl(dim3 grid, cudaStream_t stream, const Params& p, const char* name, int threads) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cuda_check(cudaLaunchKernelEx(&cfg, kernel, p), (std::string(name) + " launch (programmatic dependent launch)").c_str());
}

}  // namespace

void launch_combine(int H, bool fast, int B, int num_splits, cudaStream_t stream, const FastParams& p) {
  const dim3 qgrid(fast ? p.s_q * H : H, B, 4);
  const int threads = combine_threads(num_splits);
  const DecodeParams& d = p;  // the accurate kernels' parameters
  if (H == 32 && !fast)
    launch_combine_pdl<DecodeParams, mla_decode_combine_kernel<32, DecodeParams>>(
        qgrid, stream, d, "mla_decode_combine_kernel<32, accurate>", threads);
  else if (H == 16 && !fast)
    launch_combine_pdl<DecodeParams, mla_decode_combine_kernel<16, DecodeParams>>(
        qgrid, stream, d, "mla_decode_combine_kernel<16, accurate>", threads);
  else if (H == 32)
    launch_combine_pdl<FastParams, mla_decode_combine_kernel<32, FastParams>>(
        qgrid, stream, p, "mla_decode_combine_kernel<32, fast>", threads);
  else
    launch_combine_pdl<FastParams, mla_decode_combine_kernel<16, FastParams>>(
        qgrid, stream, p, "mla_decode_combine_kernel<16, fast>", threads);
}

}  // namespace kdalab::kernels::mla_decode_impl
