// Absorbed Gated-MLA decode over a bf16 latent cache (kernels/mla.hpp), d_c = 512, H in {16, 32}.
// Four split kernels share the plan, the workspace layout and the host checks: v1 (variant 1, below:
// mma.sync), v2 (variant 2, the default until session 5, further down: wgmma, 64-token tiles), v4 (variant 4: v2's
// kernel with early per-warpgroup refill, v4's plan and combine with programmatic dependent launch) and v5
// (variant 5, namespace v5: the seesaw kernel on pairs of 64-token blocks, v4's plan and combine); variant 6 is v5's
// split kernel with a one-round combine (mla_combine_kernel_v6), or with none when every sequence is one slice (the
// split kernel then writes the output: SParams::direct, session 16).
// Variant 3 (32-token tiles through a 4-slot ring, session 3) was removed in session 4: v4 measured faster
// on every shape (bench/NOTES.md); its combine and plan live on in v4.
//
// v1 split kernel: one CTA (8 warps) per (slice of split_len tokens, sequence), all H heads. The slice is
// streamed in 32-token tiles through a 4-stage cp.async ring in shared memory (rows padded to 520
// bf16 so that 32-bit fragment loads and ldmatrix rows hit distinct banks). Warp w owns latent columns
// [64 w, 64 w + 64):
//   scores  partial S_w = [q_hi; q_lo][:, cols_w] C_tile[:, cols_w]^T by mma.sync m16n8k16 (the q~
//           fragments of the warp's columns stay in registers: 2 parts x MT m-tiles x 4 k-steps); the
//           hi and lo rows accumulate into the same fp32 tile; the 8 partials are summed through
//           shared memory;
//   softmax fp32 online softmax per head in the log2 domain (scale * log2 e folded in), running
//           max m and sum l per head in registers; P written to shared memory as bf16 hi + lo rows;
//   P C     acc[:, cols_w] = corr * acc + [P_hi; P_lo] C_tile[:, cols_w] by mma.sync (C fragments by
//           ldmatrix.trans), fp32 accumulators (MT x 8 n-tiles x 4 per thread).
// The partial (m, l, unnormalised acc) goes to the workspace; the combine kernel (one CTA per
// (head, sequence), float4 per thread) merges the slices of each sequence.
#include <algorithm>
#include <cmath>
#include <string>

#include <cuda.h>          // CUtensorMap (v7's TMA loads; the encoder is reached through the runtime's driver entry point)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "kernels/kda_common.cuh"
#include "kernels/mla.hpp"
#include "kernels/common/wgmma.cuh"

namespace kdalab::kernels {

namespace {
using namespace detail;

constexpr int DC = 512;          // d_c
constexpr int TT = 32;           // tokens per tile
constexpr int STAGES = 4;        // cp.async ring depth
constexpr int NWARP = 8, NTHR = 256;
constexpr int CROW = DC + 8;      // shared row stride of a cache tile (bf16): 1040 bytes
constexpr int RP = TT + 8;        // row stride of the score partials (fp32)
constexpr int PP = TT + 8;        // row stride of P hi/lo (bf16)
constexpr int MIN_SPLIT = 256;    // fewest tokens per slice chosen automatically (v1, v2)
constexpr int MIN_SPLIT_V4 = 64;  // variants 4 to 7: one 64-token tile (session 13: 8K on 128 slices, was 32 of 256)

template <int H>
constexpr std::size_t smem_bytes() {
  return std::size_t(STAGES) * TT * CROW * 2 + std::size_t(NWARP) * H * RP * 4 + std::size_t(2 * H) * PP * 2 +
         std::size_t(H) * 4;
}

struct SParams {
  int B, max_len, split_len, num_splits;
  const int* lens;
  const bf16_t* c;
  long long sc_b, sc_t;
  const bf16_t *q_hi, *q_lo;
  long long sq_b;
  float scale_log2;  // scale * log2(e)
  float *ws_acc, *ws_ml, *out;
  int q16;           // v2: q_hi / q_lo 16-byte aligned rows (cp.async); else 4-byte loads
  int p_hi_only;     // v2 ablation: P lo rows = 0
  int direct;        // v6 with one slice per sequence: the split kernel writes the output, no combine
};


__device__ __forceinline__ int seq_len(const SParams& p, int b) { return p.lens ? p.lens[b] : p.max_len; }

template <int H>
__global__ void __launch_bounds__(NTHR, 1) mla_split_kernel(SParams p) {
  constexpr int MT = H / 16;      // m-tiles per part (hi or lo)
  constexpr int TPH = NTHR / H;   // softmax threads per head
  constexpr int TPT = TT / TPH;   // tokens per softmax thread
  static_assert(H % 16 == 0 && TPT >= 1 && TT % TPH == 0, "H");
  const int split = blockIdx.x, b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, cq = lane % 4;
  const int len = seq_len(p, b);
  if (len < 1 || len > p.max_len) return;  // the combine kernel writes NaN rows
  const int start = split * p.split_len;
  if (start >= len) return;                // empty slice: the combine kernel does not read it
  const int end = min(start + p.split_len, len);
  const int ntiles = (end - start + TT - 1) / TT;

  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* cs = reinterpret_cast<bf16_t*>(smem);
  float* red = reinterpret_cast<float*>(smem + std::size_t(STAGES) * TT * CROW * 2);
  bf16_t* ps = reinterpret_cast<bf16_t*>(red + NWARP * H * RP);
  float* corr_s = reinterpret_cast<float*>(ps + 2 * H * PP);

  const bf16_t* cb = p.c + b * p.sc_b;
  auto load_tile = [&](int tile, int stage) {
    bf16_t* dst = cs + stage * TT * CROW;
    const int t0 = start + tile * TT;
#pragma unroll
    for (int i = 0; i < TT * (DC / 8) / NTHR; ++i) {
      const int idx = tid + i * NTHR, row = idx / (DC / 8), ch = idx % (DC / 8);
      const int tok = t0 + row;
      bf16_t* d = dst + row * CROW + ch * 8;
      if (tok < end)
        cp_async16(d, cb + tok * p.sc_t + ch * 8);
      else
        cp_async16_zfill(d, cb, 0);  // rows past the slice: zeros (P is 0 there; 0 * 0 stays 0)
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntiles) load_tile(s, s);
    cp_async_commit();
  }

  // q~ fragments (A operand, row-major 16x16) of this warp's 64 columns; tile i < MT: hi heads
  // 16 i .. 16 i + 15, i >= MT: lo heads 16 (i - MT) ..
  std::uint32_t qa[2 * MT][4][4];
#pragma unroll
  for (int i = 0; i < 2 * MT; ++i) {
    const bf16_t* qp = (i < MT ? p.q_hi : p.q_lo) + b * p.sq_b;
    const int h0 = 16 * (i % MT) + g;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int k0 = 64 * warp + 16 * ks + 2 * cq;
      qa[i][ks][0] = ld32(qp + h0 * DC + k0);
      qa[i][ks][1] = ld32(qp + (h0 + 8) * DC + k0);
      qa[i][ks][2] = ld32(qp + h0 * DC + k0 + 8);
      qa[i][ks][3] = ld32(qp + (h0 + 8) * DC + k0 + 8);
    }
  }

  float acc[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  const int hs = tid / TPH, j0 = (tid % TPH) * TPT;  // softmax: head hs, tokens j0 .. j0 + TPT - 1
  float m_run = -INFINITY, l_run = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nxt = it + STAGES - 1;
      if (nxt < ntiles) load_tile(nxt, nxt % STAGES);
      cp_async_commit();
    }
    const bf16_t* ct = cs + (it % STAGES) * TT * CROW;

    // ---- partial scores over this warp's 64 columns
    float sc[MT][TT / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < TT / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mt][nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int nt = 0; nt < TT / 8; ++nt) {
        const bf16_t* bp = ct + (8 * nt + g) * CROW + 64 * warp + 16 * ks + 2 * cq;
        const std::uint32_t bfr[2] = {*reinterpret_cast<const std::uint32_t*>(bp),
                                      *reinterpret_cast<const std::uint32_t*>(bp + 8)};
#pragma unroll
        for (int i = 0; i < 2 * MT; ++i) mma_bf16(sc[i % MT][nt], qa[i][ks], bfr);
      }
    {
      float* rw = red + warp * H * RP;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < TT / 8; ++nt) {
          const int h = 16 * mt + g, t = 8 * nt + 2 * cq;
          *reinterpret_cast<float2*>(rw + h * RP + t) = make_float2(sc[mt][nt][0], sc[mt][nt][1]);
          *reinterpret_cast<float2*>(rw + (h + 8) * RP + t) = make_float2(sc[mt][nt][2], sc[mt][nt][3]);
        }
    }
    __syncthreads();

    // ---- online softmax (log2 domain), P as bf16 hi + lo
    {
      const int valid = min(TT, end - (start + it * TT));
      float s[TPT];
#pragma unroll
      for (int e = 0; e < TPT; ++e) s[e] = 0.0f;
#pragma unroll
      for (int w = 0; w < NWARP; ++w)
#pragma unroll
        for (int e = 0; e < TPT; ++e) s[e] += red[(w * H + hs) * RP + j0 + e];
      float mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < TPT; ++e) {
        s[e] = (j0 + e < valid) ? s[e] * p.scale_log2 : -INFINITY;
        mx = fmaxf(mx, s[e]);
      }
#pragma unroll
      for (int m = TPH / 2; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
      const float m_new = fmaxf(m_run, mx);      // finite: token 0 of every tile is valid
      const float corr = exp2f(m_run - m_new);   // 0 on the first tile (m_run = -inf)
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < TPT; e += 2) {
        const float p0 = exp2f(s[e] - m_new), p1 = exp2f(s[e + 1] - m_new);
        sum += p0 + p1;
        std::uint32_t hi, lo;
        split_bf16(p0, p1, hi, lo);
        *reinterpret_cast<std::uint32_t*>(ps + hs * PP + j0 + e) = hi;
        *reinterpret_cast<std::uint32_t*>(ps + (H + hs) * PP + j0 + e) = lo;
      }
#pragma unroll
      for (int m = TPH / 2; m >= 1; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
      l_run = l_run * corr + sum;
      m_run = m_new;
      if (tid % TPH == 0) corr_s[hs] = corr;
    }
    __syncthreads();

    // ---- acc = corr acc + [P_hi; P_lo] C_tile over this warp's 64 columns
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float c0 = corr_s[16 * mt + g], c1 = corr_s[16 * mt + g + 8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        acc[mt][nt][0] *= c0; acc[mt][nt][1] *= c0;
        acc[mt][nt][2] *= c1; acc[mt][nt][3] *= c1;
      }
    }
#pragma unroll
    for (int ks = 0; ks < TT / 16; ++ks) {
      std::uint32_t pa[2 * MT][4];
#pragma unroll
      for (int i = 0; i < 2 * MT; ++i) {  // rows 16 i .. : hi heads for i < MT, lo heads (row H + ...) after
        const bf16_t* pp = ps + (16 * i + g) * PP + 16 * ks + 2 * cq;
        pa[i][0] = *reinterpret_cast<const std::uint32_t*>(pp);
        pa[i][1] = *reinterpret_cast<const std::uint32_t*>(pp + 8 * PP);
        pa[i][2] = *reinterpret_cast<const std::uint32_t*>(pp + 8);
        pa[i][3] = *reinterpret_cast<const std::uint32_t*>(pp + 8 * PP + 8);
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        std::uint32_t bq[4];
        ldsm_x4_trans(bq, ct + (16 * ks + (lane % 8) + 8 * ((lane / 8) & 1)) * CROW + 64 * warp + 16 * np +
                                  8 * (lane / 16));
#pragma unroll
        for (int i = 0; i < 2 * MT; ++i) {
          mma_bf16(acc[i % MT][2 * np], pa[i], bq);
          mma_bf16(acc[i % MT][2 * np + 1], pa[i], bq + 2);
        }
      }
    }
  }
  cp_async_wait<0>();

  // ---- the slice's partial: unnormalised acc [H, d_c], (m, l) per head
  const long long slot = static_cast<long long>(b) * p.num_splits + split;
  float* wa = p.ws_acc + slot * H * DC;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int h = 16 * mt + g, col = 64 * warp + 8 * nt + 2 * cq;
      *reinterpret_cast<float2*>(wa + h * DC + col) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
      *reinterpret_cast<float2*>(wa + (h + 8) * DC + col) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
    }
  if (tid % TPH == 0) {
    float* wm = p.ws_ml + (slot * H + hs) * 2;
    wm[0] = m_run;
    wm[1] = l_run;
  }
}

/// One CTA of 128 threads per (head, sequence): a = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
template <int H>
__global__ void __launch_bounds__(128) mla_combine_kernel(SParams p) {
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int len = seq_len(p, b);
  float4* o = reinterpret_cast<float4*>(p.out + (static_cast<long long>(b) * H + h) * DC) + tid;
  if (len < 1 || len > p.max_len) {
    *o = make_float4(NAN, NAN, NAN, NAN);
    return;
  }
  const int ns = (len + p.split_len - 1) / p.split_len;
  const long long base = static_cast<long long>(b) * p.num_splits;
  float M = -INFINITY;
  for (int s = 0; s < ns; ++s) M = fmaxf(M, p.ws_ml[((base + s) * H + h) * 2]);
  float L = 0.0f;
  float4 a = make_float4(0, 0, 0, 0);
  for (int s = 0; s < ns; ++s) {
    const float w = exp2f(p.ws_ml[((base + s) * H + h) * 2] - M);
    L += w * p.ws_ml[((base + s) * H + h) * 2 + 1];
    const float4 x = reinterpret_cast<const float4*>(p.ws_acc + ((base + s) * H + h) * DC)[tid];
    a.x += w * x.x; a.y += w * x.y; a.z += w * x.z; a.w += w * x.w;
  }
  const float inv = 1.0f / L;
  *o = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
}

/// (M, L) of one head over the ns slices of one sequence, reduced by all 128 threads of the CTA at once:
///   M = max_s m_s,  L = sum_s l_s 2^(m_s - M)  (log2 domain).
/// ml: (m, l) of slice s at ml[s * 2 H], ml[s * 2 H + 1]; red: 8 floats of shared memory. Every thread of
/// the CTA must call it (two __syncthreads).
template <int H>
__device__ __forceinline__ float2 combine_ml(const float* ml, int ns, int tid, float (*red)[4]) {
  const int lane = tid % 32, warp = tid / 32;
  float M = -INFINITY;
  for (int s = tid; s < ns; s += 128) M = fmaxf(M, ml[static_cast<long long>(s) * 2 * H]);
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, m));
  if (lane == 0) red[0][warp] = M;
  __syncthreads();
  M = fmaxf(fmaxf(red[0][0], red[0][1]), fmaxf(red[0][2], red[0][3]));
  float L = 0.0f;
  for (int s = tid; s < ns; s += 128) {
    const float* x = ml + static_cast<long long>(s) * 2 * H;
    L += exp2f(x[0] - M) * x[1];
  }
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) L += __shfl_xor_sync(0xffffffffu, L, m);
  if (lane == 0) red[1][warp] = L;
  __syncthreads();
  L = (red[1][0] + red[1][1]) + (red[1][2] + red[1][3]);
  return make_float2(M, L);
}

/// Combine for variant 2: as mla_combine_kernel, but the max M and the sum L are reduced over the
/// splits by all 128 threads at once, and the weighted sum of the partials runs 8 splits per step
/// (independent loads in flight) instead of one dependent load per split.
template <int H>
__global__ void __launch_bounds__(128) mla_combine_kernel_v2(SParams p) {
  __shared__ float red[2][4];
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int len = seq_len(p, b);
  float4* o = reinterpret_cast<float4*>(p.out + (static_cast<long long>(b) * H + h) * DC) + tid;
  if (len < 1 || len > p.max_len) {
    *o = make_float4(NAN, NAN, NAN, NAN);
    return;
  }
  const int ns = (len + p.split_len - 1) / p.split_len;
  const long long base = static_cast<long long>(b) * p.num_splits;
  const float* ml = p.ws_ml + (base * H + h) * 2;  // (m, l) of split s at ml[s * 2 H], ml[s * 2 H + 1]
  const float2 ML = combine_ml<H>(ml, ns, tid, red);
  const float M = ML.x, L = ML.y;
  float4 a = make_float4(0, 0, 0, 0);
  const float4* acc = reinterpret_cast<const float4*>(p.ws_acc + (base * H + h) * DC) + tid;
  constexpr long long SS = static_cast<long long>(H) * DC / 4;  // float4 stride between splits
  int s = 0;
  for (; s + 8 <= ns; s += 8) {
    float4 x[8];
    float w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[i] = acc[(s + i) * SS];
      w[i] = ml[static_cast<long long>(s + i) * 2 * H];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float wi = exp2f(w[i] - M);
      a.x += wi * x[i].x; a.y += wi * x[i].y; a.z += wi * x[i].z; a.w += wi * x[i].w;
    }
  }
  for (; s < ns; ++s) {
    const float4 x = acc[s * SS];
    const float wi = exp2f(ml[static_cast<long long>(s) * 2 * H] - M);
    a.x += wi * x.x; a.y += wi * x.y; a.z += wi * x.z; a.w += wi * x.w;
  }
  const float inv = 1.0f / L;
  *o = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
}

/// The common start of the column-quarter combines (v4, v6) for (head h, sequence b, quarter): o = this lane's float4
/// of the output quarter; returns the slice count ns of sequence b, or 0 after warp 0 wrote NaN there when the device
/// length lens[b] is outside [1, max_len] (then the CTA must return).
template <int H>
__device__ __forceinline__ int quarter_start(const SParams& p, int h, int b, int quarter, int lane, int warp, float4*& o) {
  const int len = seq_len(p, b);
  o = reinterpret_cast<float4*>(p.out + (static_cast<long long>(b) * H + h) * DC + 128 * quarter) + lane;
  if (len < 1 || len > p.max_len) {
    if (warp == 0) *o = make_float4(NAN, NAN, NAN, NAN);
    return 0;
  }
  return (len + p.split_len - 1) / p.split_len;
}

/// Combine for variant 4 (written for the removed variant 3): one CTA of 128 threads per (head, sequence, quarter of the d_c columns), so a
/// B = 1 step has 4 H CTAs (v2's combine: H CTAs, 32 SMs busy for 114 x 32 x 2 KB of partials) with 4x
/// the loads in flight. Warp w takes the slices s = w, w + 4, ... (8 per step, lane = one float4 of the
/// quarter); the 4 warps' sums meet in shared memory. (M, L) as v2 (combine_ml, every CTA of a head
/// redoes it: 2 ns floats). Launched with programmatic dependent launch (mla_decode): griddepcontrol.wait
/// first waits for the whole split grid to complete and its writes to be visible (a no-op when launched
/// without the attribute), so only the launch overlaps the split kernel's tail, never a read.
template <int H>
__global__ void __launch_bounds__(128) mla_combine_kernel_v4(SParams p) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  __shared__ float red[2][4];
  __shared__ float4 part[3][32];
  const int h = blockIdx.x, b = blockIdx.y, quarter = blockIdx.z, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  float4* o = nullptr;
  const int ns = quarter_start<H>(p, h, b, quarter, lane, warp, o);
  if (ns == 0) return;
  const long long base = static_cast<long long>(b) * p.num_splits;
  const float* ml = p.ws_ml + (base * H + h) * 2;
  const float2 ML = combine_ml<H>(ml, ns, tid, red);
  const float M = ML.x, L = ML.y;
  float4 a = make_float4(0, 0, 0, 0);
  const float4* acc = reinterpret_cast<const float4*>(p.ws_acc + (base * H + h) * DC + 128 * quarter) + lane;
  constexpr long long SS = static_cast<long long>(H) * DC / 4;  // float4 stride between splits
  int s = warp;
  for (; s + 28 < ns; s += 32) {  // slices s, s + 4, .., s + 28
    float4 x[8];
    float w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[i] = acc[(s + 4 * i) * SS];
      w[i] = ml[static_cast<long long>(s + 4 * i) * 2 * H];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float wi = exp2f(w[i] - M);
      a.x += wi * x[i].x; a.y += wi * x[i].y; a.z += wi * x[i].z; a.w += wi * x[i].w;
    }
  }
  for (; s < ns; s += 4) {
    const float4 x = acc[s * SS];
    const float wi = exp2f(ml[static_cast<long long>(s) * 2 * H] - M);
    a.x += wi * x.x; a.y += wi * x.y; a.z += wi * x.z; a.w += wi * x.w;
  }
  if (warp > 0) part[warp - 1][lane] = a;
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int w = 0; w < 3; ++w) {
      const float4 x = part[w][lane];
      a.x += x.x; a.y += x.y; a.z += x.z; a.w += x.w;
    }
    const float inv = 1.0f / L;
    *o = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
  }
}
/// Combine for variant 6 (v5's split kernel): one CTA of 32 nw threads per (head, sequence, quarter of the d_c
/// columns), nw = blockDim.x / 32 = clamp(ceil(num_splits / 8), 1, 16) warps (combine_v6_threads). Warp w takes the
/// slices s = w, w + nw, .. and merges them with its own running maximum (8 slices per step: the (m, l) pair and the
/// float4 partial of each slice are loaded together, so a step is ONE round of loads; v4's combine first reduces
/// (M, L) over all slices and only then loads the partials: two dependent rounds, and 4 warps x 8 loads = 32 slices
/// per round). With ns <= 8 nw slices (every ns <= 128; N = 64K: 128 slices, 16 warps) every load of the CTA is in
/// flight at once. The warps' (m_w, l_w, a_w) meet in shared memory; warp 0 forms
/// a = sum_w 2^(m_w - M) a_w / sum_w 2^(m_w - M) l_w. Same result as v4's combine up to the fp32 order of the sums.
/// Launched with programmatic dependent launch (griddepcontrol.wait first, as v4).
template <int H>
__global__ void __launch_bounds__(512) mla_combine_kernel_v6(SParams p) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  __shared__ float4 part[16][32];
  __shared__ float2 mlw[16];
  const int h = blockIdx.x, b = blockIdx.y, quarter = blockIdx.z, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int nw = blockDim.x / 32;
  float4* o = nullptr;
  const int ns = quarter_start<H>(p, h, b, quarter, lane, warp, o);
  if (ns == 0) return;
  const long long base = static_cast<long long>(b) * p.num_splits;
  const float2* ml = reinterpret_cast<const float2*>(p.ws_ml + (base * H + h) * 2);  // (m, l) of slice s at ml[s H]
  const float4* acc = reinterpret_cast<const float4*>(p.ws_acc + (base * H + h) * DC + 128 * quarter) + lane;
  constexpr long long SS = static_cast<long long>(H) * DC / 4;  // float4 stride between slices
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
        w[i] = ml[static_cast<long long>(s) * H];
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
// ================================================================================================
// v2 (variant 2, the default until session 5; v6 now): wgmma (sm_90a warpgroup MMA, both operands read from shared memory
// through matrix descriptors), 64-token compute tiles.
//
// One CTA = 2 warpgroups (8 warps, 256 threads) per (slice, sequence), as v1. Shared memory (~218 KB):
//   q~ tile  [64 rows x 512] bf16: row r < 32 = q_hi of head r, row 32 + r = q_lo of head r (rows of
//            heads >= H are zeros), loaded once per CTA; 8 column blocks of [64 rows x 64] in the
//            128-byte-swizzled K-major layout (16-byte chunk c of row r at r * 128 + ((c ^ (r % 8)) * 16));
//   C ring   4 slots of 32 tokens (32 KB each, 8 column blocks of [32 tokens x 64] in the same swizzled
//            layout), filled by cp.async; a compute tile = 2 slots, so one 64-token tile is computed
//            while the next one is in flight;
//   S        [64 rows x 64 tokens] fp32 scores, P [64 rows x 64 tokens] bf16 (P_hi rows 0..31, P_lo
//            rows 32..63; swizzled, the A operand of P C), corr [32] fp32.
// Per 64-token tile (3 __syncthreads):
//   scores  warpgroup w takes the 32 tokens of slot w: S[:, 32 w ..] = [q_hi; q_lo] C_slot^T,
//           32 wgmma m64n32k16 (K = 512) into 16 fp32 per thread, stored to S;
//   softmax all 256 threads: s = S[h] + S[32 + h] (the hi and lo rows), online softmax in the log2
//           domain as v1 (8 threads per head), P split into bf16 hi + lo rows;
//   P C     warpgroup w: acc_w[64 rows x 256 cols] = corr acc_w + [P_hi; P_lo] C_tile[:, 256 w ..],
//           4 wgmma m64n256k16 with C read as an MN-major (transposed) B operand: 128 fp32 per thread.
// The hi and lo rows of acc are summed once, in the epilogue (through shared memory). With H = 32 the
// hi + lo rows fill the M = 64 of the warpgroup MMA exactly, so the two-part precision (q~ and P)
// costs no extra matrix work (H = 16 leaves half of the rows zero). Slices are whole 64-token tiles;
// the combine kernel of v2 reduces (M, L) over the slices with all threads and keeps 8 partials in
// flight per thread.
namespace v2 {
constexpr int TT = 32;                        // tokens per cp.async slot (= v1's tile: the split plan is shared)
constexpr int TILE = 64;                      // tokens per compute tile = 2 slots
constexpr int SLOTS = 4;                      // 2 tiles: the one computed and the one in flight
constexpr int SLOT_BYTES = TT * DC * 2;       // 32 KB
constexpr int SP = TILE + 4;                  // fp32 row stride of S
constexpr int OFF_Q = 0, OFF_C = 64 * DC * 2, OFF_S = OFF_C + SLOTS * SLOT_BYTES;
constexpr int OFF_P = OFF_S + 17 * 1024;      // S: 64 x SP x 4 = 17408 B
constexpr int OFF_CORR = OFF_P + 64 * 128;
constexpr std::size_t SMEM = OFF_CORR + 32 * 4 + 1024;  // + slack to align the base to 1024 bytes
static_assert(64 * SP * 4 <= 17 * 1024, "S");
static_assert(SMEM <= 227 * 1024, "smem");

// the 128-byte swizzle, descriptor, fence / commit / wait helpers: kernels/wgmma.cuh
using wgmma_util::desc;
using wgmma_util::fence_async_smem;
using wgmma_util::sw;
using wgmma_util::wgmma_commit;
using wgmma_util::wgmma_fence;
using wgmma_util::wgmma_wait0;

/// Barrier of the 128 threads of warpgroup wg (named barrier 1 + wg; 0 is __syncthreads).
__device__ __forceinline__ void wg_barrier(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory"); }

/// D[64 x 32] (+)= A B, A and B K-major in shared memory (descriptors); D: 16 fp32 per thread.
__device__ __forceinline__ void wgmma_m64n32(float* d, std::uint64_t da, std::uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d));
}

/// D[64 x 256] (+)= A B, A K-major, B MN-major (transposed) in shared memory; D: 128 fp32 per thread.
__device__ __forceinline__ void wgmma_m64n256_tb(float* d, std::uint64_t da, std::uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d));
}


// ---- pieces of the wgmma tile code shared by the wgmma kernels (v2, v4) --------

/// Loads q~ rows into the [64 x 512] q~ tile (row r < 32: q_hi of head r, 32 + r: q_lo; rows of heads
/// >= H are zeros), column blocks [kb0, kb0 + NKB) only, by NT threads of which this one is t.
/// 16-byte cp.async when p.q16 (in the caller's current commit group), else 4-byte loads + st.shared.
template <int H, int NT, int NKB>
__device__ __forceinline__ void load_q_rows(unsigned char* q_s, const SParams& p, int b, int t, int kb0) {
  constexpr int NCH = NKB * 8;  // 16-byte chunks per row in the loaded blocks
#pragma unroll 4
  for (int i = 0; i < 64 * NCH / NT; ++i) {
    const int idx = t + i * NT, r = idx / NCH, ch = kb0 * 8 + idx % NCH, h = r % 32;
    unsigned char* d = q_s + (ch / 8) * 8192 + sw(r, ch % 8);
    if (h < H) {
      const bf16_t* src = (r < 32 ? p.q_hi : p.q_lo) + b * p.sq_b + h * DC + ch * 8;
      if (p.q16) {
        cp_async16(d, src);
      } else {
        uint4 v;
        v.x = ld32(src); v.y = ld32(src + 2); v.z = ld32(src + 4); v.w = ld32(src + 6);
        *reinterpret_cast<uint4*>(d) = v;
      }
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

/// Scores of one warpgroup over latent column blocks [kb0, kb0 + NKB) (K = 64 NKB) of one 32-token slot:
/// sc = [q_hi; q_lo][:, K range] C_slot[:, K range]^T, 4 NKB wgmma m64n32k16 (16 fp32 per thread, the
/// m64n32 accumulator layout), waited for. q_addr / c_slot: shared addresses of the q~ tile and the slot.
template <int NKB>
__device__ __forceinline__ void scores_kblocks(float* sc, std::uint32_t q_addr, std::uint32_t c_slot, int kb0) {
#pragma unroll
  for (int e = 0; e < 16; ++e) sc[e] = 0.0f;
  wgmma_fence();
#pragma unroll
  for (int kb = kb0; kb < kb0 + NKB; ++kb)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n32(sc, desc(q_addr + kb * 8192 + kk * 32, 16, 1024), desc(c_slot + kb * (TT * 128) + kk * 32, 16, 1024),
                   (kb != kb0 || kk != 0) ? 1 : 0);
  wgmma_commit();
  wgmma_wait0();
}

/// Stores a m64n32 accumulator (rows r0, r0 + 8 of this thread, r0 = 16 warp-in-warpgroup + lane / 4)
/// to the fp32 buffer s (row stride sp floats) at columns col0 + 0 .. 31.
__device__ __forceinline__ void store_scores(const float* sc, float* s, int sp, int col0, int r0, int cq) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int col = col0 + 8 * j + 2 * cq;
    *reinterpret_cast<float2*>(s + r0 * sp + col) = make_float2(sc[4 * j], sc[4 * j + 1]);
    *reinterpret_cast<float2*>(s + (r0 + 8) * sp + col) = make_float2(sc[4 * j + 2], sc[4 * j + 3]);
  }
}

/// One online-softmax step (log2 domain; flash-decoding, EQUATIONS.md section 5) of head hs over this
/// thread's TPT tokens j0 .. j0 + TPT - 1 of a tile (TPH consecutive threads share the head): s = the raw
/// scores q~ . c (hi + lo rows summed), tokens >= valid are masked. Writes P as bf16 hi (row hs) + lo
/// (row 32 + hs) into the swizzled P tile p_s, the rescale factor corr = 2^(m_old - m_new) to corr_s[hs],
/// and updates the running max m_run and sum l_run. p_hi_only: lo rows 0 (ablation).
template <int TPH, int TPT>
__device__ __forceinline__ void softmax_step(float* s, int j0, int valid, float scale_log2, int p_hi_only, int hs,
                                             int tid, unsigned char* p_s, float* corr_s, float& m_run, float& l_run) {
  float mx = -INFINITY;
#pragma unroll
  for (int e = 0; e < TPT; ++e) {
    s[e] = (j0 + e < valid) ? s[e] * scale_log2 : -INFINITY;
    mx = fmaxf(mx, s[e]);
  }
#pragma unroll
  for (int m = TPH / 2; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
  const float m_new = fmaxf(m_run, mx);      // finite: token 0 of every tile is valid
  const float corr = exp2f(m_run - m_new);   // 0 on the first tile (m_run = -inf)
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < TPT; e += 2) {
    const float p0 = exp2f(s[e] - m_new), p1 = exp2f(s[e + 1] - m_new);
    sum += p0 + p1;
    std::uint32_t hi, lo;
    split_bf16(p0, p1, hi, lo);
    if (p_hi_only) lo = 0u;
    const int t = j0 + e;
    *reinterpret_cast<std::uint32_t*>(p_s + sw(hs, t / 8) + (t % 8) * 2) = hi;
    *reinterpret_cast<std::uint32_t*>(p_s + sw(32 + hs, t / 8) + (t % 8) * 2) = lo;
  }
#pragma unroll
  for (int m = TPH / 2; m >= 1; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  l_run = l_run * corr + sum;
  m_run = m_new;
  if (tid % TPH == 0) corr_s[hs] = corr;
}

/// P C of one warpgroup over KSTEPS x 16 tokens: acc = corr acc + [P_hi; P_lo] C[:, 256 wg .. 256 wg + 255],
/// KSTEPS wgmma m64n256k16 (acc: 128 fp32 per thread), waited for. p_addr: the P tile (K-major, swizzled);
/// c_base: the first 32-token slot of the tile (token 16 kk is in slot kk / 2, rows 16 (kk % 2) ..), read
/// as an MN-major B operand: LBO = one column block (TT x 128 bytes), SBO = 8 tokens (1024 bytes).
template <int KSTEPS>
__device__ __forceinline__ void pc_step(float* acc, const float* corr_s, int r0, std::uint32_t p_addr,
                                        std::uint32_t c_base, int wg) {
  const float c0 = corr_s[r0 % 32], c1 = corr_s[(r0 + 8) % 32];
  // the running max of both rows unchanged (corr = 1, the common case after the first tiles): x * 1 = x
  // exactly, so the 128 multiplies are skipped (bit-identical; on the first tile acc = 0 and corr = 0)
  if (c0 != 1.0f || c1 != 1.0f) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      acc[4 * j] *= c0; acc[4 * j + 1] *= c0;
      acc[4 * j + 2] *= c1; acc[4 * j + 3] *= c1;
    }
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KSTEPS; ++kk)
    wgmma_m64n256_tb(acc, desc(p_addr + kk * 32, 16, 1024),
                     desc(c_base + (kk / 2) * SLOT_BYTES + 4 * wg * (TT * 128) + (kk % 2) * 16 * 128, TT * 128, 1024), 1);
  wgmma_commit();
  wgmma_wait0();
}

/// Epilogue: the slice's partial (unnormalised acc [H, d_c] = hi rows + lo rows of the two warpgroups'
/// m64n256 accumulators, and (m, l) per head) to the workspace. The lo warps (wl >= 2) hand their rows
/// over through mrg (shared, 2 x 32 x 260 fp32; the caller guarantees no load or wgmma still uses it).
/// Every thread of the CTA must call it (one __syncthreads).
template <int H, int TPH>
__device__ __forceinline__ void write_partial(const float* acc, float* mrg_base, const SParams& p, int b, int split,
                                              int tid, int wg, int wl, int r0, int cq, int hs, float m_run, float l_run) {
  constexpr int MS = 256 + 4;  // fp32 row stride of the merge buffer
  float* mrg = mrg_base + wg * 32 * MS;
  if (wl >= 2) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      *reinterpret_cast<float2*>(mrg + (r0 - 32) * MS + 8 * j + 2 * cq) = make_float2(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<float2*>(mrg + (r0 - 24) * MS + 8 * j + 2 * cq) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
  __syncthreads();
  const long long slot = static_cast<long long>(b) * p.num_splits + split;
  if (wl < 2) {
    float* wa = p.ws_acc + slot * H * DC;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = r0 + 8 * half;  // 0 .. 31
      if (h < H) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const float2 lo = *reinterpret_cast<const float2*>(mrg + h * MS + 8 * j + 2 * cq);
          *reinterpret_cast<float2*>(wa + h * DC + 256 * wg + 8 * j + 2 * cq) =
              make_float2(acc[4 * j + 2 * half] + lo.x, acc[4 * j + 2 * half + 1] + lo.y);
        }
      }
    }
  }
  if (tid % TPH == 0) {
    float* wm = p.ws_ml + (slot * H + hs) * 2;
    wm[0] = m_run;
    wm[1] = l_run;
  }
}
constexpr std::size_t MERGE_BYTES = 2 * 32 * (256 + 4) * 4;  // write_partial's mrg

/// kRefill = false: variant 2 as measured in sessions 2-3 (the loads of tile it + 1 are issued after tile it
/// has landed, so at the top of each iteration nothing else is in flight). kRefill = true: variant 4, the same
/// math on the same tiles, but each warpgroup refills its column half (256 latent columns, the only part its
/// own P C reads) of the 2-slot buffer of tile it with tile it + 2 as soon as its P C of tile it is done
/// (a 128-thread named barrier), so tiles it + 1 and it + 2 (up to 128 KB) are in flight while tile
/// it + 1 is awaited; and it releases the combine early (programmatic dependent launch).
template <int H, bool kRefill = false>
__global__ void __launch_bounds__(NTHR, 1) mla_split_kernel_v2(SParams p) {
  constexpr int TPH = NTHR / H;    // softmax threads per head
  constexpr int TPT = TILE / TPH;  // tokens per softmax thread
  static_assert((H == 16 || H == 32) && TPT >= 2 && TPT % 2 == 0, "H");
  static_assert(MERGE_BYTES <= SLOTS * SLOT_BYTES, "the epilogue's merge buffer lives in the C ring");
  const int split = blockIdx.x, b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, cq = lane % 4;
  const int wg = warp / 4, wl = warp % 4;  // warpgroup, warp in the warpgroup
  const int len = seq_len(p, b);
  if (len < 1 || len > p.max_len) return;  // the combine kernel writes NaN rows
  const int start = split * p.split_len;
  if (start >= len) return;                // empty slice: the combine kernel does not read it
  const int end = min(start + p.split_len, len);
  const int ntiles = (end - start + TILE - 1) / TILE;

  extern __shared__ unsigned char smem_raw[];
  const std::uint32_t raw_addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);  // 1024-byte aligned (swizzle atoms)
  const std::uint32_t sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  float* s_s = reinterpret_cast<float*>(smem + OFF_S);
  unsigned char* p_s = smem + OFF_P;
  float* corr_s = reinterpret_cast<float*>(smem + OFF_CORR);
  if (tid < 32) corr_s[tid] = 0.0f;  // heads >= H keep 0

  load_q_rows<H, NTHR, DC / 64>(smem + OFF_Q, p, b, tid, 0);  // q~ rows (once), all 8 column blocks
  // P rows of heads >= H stay zero (their acc rows are never read, but keep them finite)
  for (int i = tid; i < 64 * 128 / 16; i += NTHR) reinterpret_cast<uint4*>(p_s)[i] = make_uint4(0, 0, 0, 0);

  const bf16_t* cb = p.c + b * p.sc_b;
  // tile `tile` (64 tokens) into slots 2 buf, 2 buf + 1; rows past the slice are zeros (P is 0 there)
  const int lrow = tid / (DC / 8), lch = tid % (DC / 8);  // this thread's first row and its 16-byte chunk
  auto load_tile = [&](int tile, int buf) {
    const int t0 = start + tile * TILE + lrow;
    const bf16_t* src = cb + static_cast<long long>(t0) * p.sc_t + lch * 8;
    unsigned char* dst = smem + OFF_C + 2 * buf * SLOT_BYTES + (lch / 8) * (TT * 128);
#pragma unroll
    for (int i = 0; i < TILE * (DC / 8) / NTHR; ++i) {
      const int row = lrow + i * (NTHR / (DC / 8));  // 4 rows per step
      unsigned char* d = dst + (row / TT) * SLOT_BYTES + sw(row % TT, lch % 8);
      if (t0 + i * (NTHR / (DC / 8)) < end)
        cp_async16(d, src);
      else
        cp_async16_zfill(d, cb, 0);
      src += (NTHR / (DC / 8)) * p.sc_t;
    }
  };
  // v4 (kRefill): this warpgroup's column half (chunks 32 wg .. 32 wg + 31 of each row) of tile `tile` into
  // buffer `buf`: thread wt copies chunk hch of rows hrow, hrow + 4, .., hrow + 60 (a warp reads 512
  // contiguous bytes of one row); rows past the slice are zeros
  const int wt = tid % 128, hrow = wt / 32, hch = 32 * wg + wt % 32;
  auto load_half = [&](int tile, int buf) {
    const int t0 = start + tile * TILE + hrow;
    const bf16_t* src = cb + static_cast<long long>(t0) * p.sc_t + hch * 8;
    unsigned char* dst = smem + OFF_C + 2 * buf * SLOT_BYTES + (hch / 8) * (TT * 128);
#pragma unroll
    for (int i = 0; i < TILE / 4; ++i) {
      const int row = hrow + 4 * i;
      unsigned char* d = dst + (row / TT) * SLOT_BYTES + sw(row % TT, hch % 8);
      if (t0 + 4 * i < end)
        cp_async16(d, src);
      else
        cp_async16_zfill(d, cb, 0);
      src += 4 * p.sc_t;
    }
  };
  load_tile(0, 0);  // with the q~ rows in the same group
  cp_async_commit();
  if constexpr (kRefill) {  // group 1 = tile 1 (empty when the slice has one tile)
    if (ntiles > 1) load_tile(1, 1);
    cp_async_commit();
  }

  float acc[128];
#pragma unroll
  for (int e = 0; e < 128; ++e) acc[e] = 0.0f;
  const int hs = tid / TPH, j0 = (tid % TPH) * TPT;  // softmax: head hs, tokens j0 .. j0 + TPT - 1
  float m_run = -INFINITY, l_run = 0.0f;
  const int r0 = 16 * wl + g;  // this thread's accumulator rows r0, r0 + 8 (of the M = 64)

  for (int it = 0; it < ntiles; ++it) {
    if constexpr (kRefill) {
      cp_async_wait<1>();  // this thread's copies of tile it have landed (tile it + 1 may be in flight)
      fence_async_smem();
      __syncthreads();     // tile it complete and visible to wgmma
    } else {
      cp_async_wait<0>();  // tile it
      fence_async_smem();
      __syncthreads();     // tile it visible; P C of tile it - 1 done (its buffer is free)
      if (it + 1 < ntiles) load_tile(it + 1, (it + 1) % 2);
      cp_async_commit();
    }
    const std::uint32_t cbuf = sbase + OFF_C + 2 * (it % 2) * SLOT_BYTES;

    // ---- scores, warpgroup wg: S[:, 32 wg .. 32 wg + 31] = [q_hi; q_lo] C_slot^T (32 wgmma m64n32k16)
    {
      float sc[16];
      scores_kblocks<DC / 64>(sc, sbase + OFF_Q, cbuf + wg * SLOT_BYTES, 0);
      store_scores(sc, s_s, SP, 32 * wg, r0, cq);
    }
    __syncthreads();

    // ---- online softmax (log2 domain) of s = S[h] + S[32 + h], P as bf16 hi + lo rows
    {
      const int valid = min(TILE, end - (start + it * TILE));
      float s[TPT];
#pragma unroll
      for (int e = 0; e < TPT; ++e) s[e] = s_s[hs * SP + j0 + e] + s_s[(32 + hs) * SP + j0 + e];
      softmax_step<TPH, TPT>(s, j0, valid, p.scale_log2, p.p_hi_only, hs, tid, p_s, corr_s, m_run, l_run);
    }
    fence_async_smem();
    __syncthreads();

    // ---- P C, warpgroup wg: acc = corr acc + [P_hi; P_lo] C_tile[:, 256 wg .. 256 wg + 255] (4 wgmma m64n256k16)
    pc_step<TILE / 16>(acc, corr_s, r0, sbase + OFF_P, cbuf, wg);
    if constexpr (kRefill) {
      // every warp of this warpgroup is past its wgmma wait: its column half of buffer it % 2 is free (the
      // other warpgroup's scores read it before the barrier after the scores; its P C reads the other half)
      wg_barrier(wg);
      if (it + 2 < ntiles) load_half(it + 2, it % 2);
      cp_async_commit();
    }
  }
  if constexpr (kRefill) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  cp_async_wait<0>();
  __syncthreads();

  // ---- epilogue: out rows = hi rows + lo rows of acc (lo warps hand theirs over through shared memory)
  write_partial<H, TPH>(acc, reinterpret_cast<float*>(smem + OFF_C), p, b, split, tid, wg, wl, r0, cq, hs, m_run, l_run);
}
}  // namespace v2

// ================================================================================================
// v5 (variant 5, opt-in): the "seesaw" split kernel. Same math and precision plan as v2 (q~ = q_hi + q_lo and
// P = P_hi + P_lo in bf16, fp32 accumulation), a different schedule. The schedule idea (two KV blocks per step, the
// output split by columns between the two warpgroups, the running max handed from warpgroup 0 to warpgroup 1) is the
// one FlashMLA published for its Hopper kernel (deepseek-ai/FlashMLA docs, "A Deep-Dive Into the New Flash MLA
// Kernel", 2025); the code below is ours.
//
// Rows: q~ row 2h = q_hi of head h, row 2h + 1 = q_lo of head h (heads >= H: zero rows). In the wgmma m64nN
// accumulator a thread holds rows r0 = 16 warp + lane / 4 and r0 + 8, so rows 2h and 2h + 1 sit in lanes 4 apart:
// s = S[2h] + S[2h + 1] is one __shfl_xor(., 4), and the softmax runs in registers (no S in shared memory). A thread
// of an even row (lane / 4 even) holds the hi rows of the score, P and output accumulators, its partner the lo rows.
//
// Blocks of 64 tokens: block 2i (A) lives in buffer 0, block 2i + 1 (B) in buffer 1 (64 KB each, 8 column blocks
// of [64 tokens x 64] in v2's 128-byte swizzle). Warpgroup 0 owns the output columns [0, 256) (o_L), warpgroup 1
// [256, 512) (o_R), each as one m64n256 fp32 accumulator (128 registers per thread). Per pair i (m = running max
// per head, log2 domain; [w] = warpgroup w):
//   [0] S_A = q~ C_A^T (32 wgmma m64n64k16)        [1] S_B = q~ C_B^T (concurrently)
//   [0] mA = max(m, rowmax S_A) -> shared, P_A = 2^(S_A - mA), o_L = 2^(m - mA) o_L + P_A C_A[:, L]
//       (P_A hi / lo straight from the accumulator registers: the m64n64 accumulator layout is the register
//       A-fragment layout of m64n256k16, so its own P never goes through shared memory)
//   [1] mB = max(mA, rowmax S_B) -> shared, P_B = 2^(S_B - mB) -> shared, o_R = 2^(m - mB) o_R + P_B C_B[:, R]
//   [0] P_A' = P_A 2^(mA - mB) -> shared;  o_L = 2^(mA - mB) o_L + P_B C_B[:, L]   (P_B from shared)
//   [1] o_R += P_A' C_A[:, R]                                                      (P_A' from shared)
// so warpgroup 0's P_A C_A (tensor) overlaps warpgroup 1's softmax, and each P C of one warpgroup the other's
// softmax or P C. Both end the pair at m = mB. The running sums l stay per thread and per warpgroup (each scaled like
// its accumulator) and are added once in the epilogue; the hi and lo output rows are added there by one shuffle.
//
// Loads (cp.async, rows past the slice zero-filled as in v2): warpgroup w loads column half w of both buffers
// (latent columns [256 w, 256 w + 256): the only half its own P C reads) and q~ column blocks [4 w, 4 w + 4). It
// refills a half as soon as its own last reader is done, with no cross-warpgroup wait: buffer 0's L half after [0]'s
// P_A C_A[:, L] (mid-pair), buffer 1's R half after [1]'s P_B C_B[:, R] (mid-pair), buffer 0's R half after [1]'s
// P_A' C_A[:, R], buffer 1's L half after [0]'s P_B C_B[:, L] (end of the pair; the other warpgroup's scores of
// these buffers precede the P it handed over). Each warpgroup starts its next scores on the column half it
// refilled mid-pair (k-blocks 4 w .. 4 w + 3 first: its own loads), then waits for the other warpgroup's
// "landed" signal and scores the other half. Commit groups per thread and pair, oldest first:
//   warpgroup 0: [buffer 0 L (block 2i + 2)], [buffer 1 L (2i + 3)];  warpgroup 1: [buffer 1 R (2i + 3)], [buffer 0 R (2i + 2)]
// (the prologue puts the q~ half into the first group), so cp.async.wait_group 1 = "the half I score first landed".
//
// Named barriers (256 threads: one warpgroup arrives, the other syncs; each producer's next arrival on the same
// barrier is ordered after the consumer's sync by another barrier of the cycle below, so a generation never takes
// two arrivals of one warpgroup):
//   LANDED_L [0 -> 1] wg 0's halves + q~ blocks 0-3 landed;  LANDED_R [1 -> 0] wg 1's halves + q~ blocks 4-7 landed
//   M0 [0 -> 1] mA in shared;  M1 [1 -> 0] mB in shared;  P0 [0 -> 1] P_A' in shared;  P1 [1 -> 0] P_B in shared
// plus one 128-thread barrier per warpgroup (1 + w, as v4) before wgmma reads its own fresh cp.async data and
// before it overwrites a half its wgmma just read. Per pair: 2 + 2 warpgroup barriers and 6 one-way barriers,
// no __syncthreads (v2: 3 __syncthreads per 64 tokens).
// A pair with no block B (odd block count, last pair): warpgroup 1 skips its scores and P C on B (rowmax -inf, so
// mB = mA) but keeps every barrier; warpgroup 0 skips the P_B C_B[:, L] step and the P1 barrier.
// Shared memory: q~ 64 KB + 2 x 64 KB buffers + P_A', P_B (8 KB each) + 384 B = 209 KB (+ 1 KB alignment slack).
// Plan and combine: v4's (64-token slices of least modelled time, 4-CTA-per-head combine with programmatic
// dependent launch).
namespace v5 {
constexpr int BLK = 64;                       // tokens per block
constexpr int CB_BYTES = BLK * 128;           // one column block [64 tokens x 64 columns] of a buffer: 8 KB
constexpr int BUF_BYTES = 8 * CB_BYTES;       // one token block: 64 KB
constexpr int OFF_Q = 0;                      // q~ [64 rows x 512]: 8 column blocks of [64 rows x 64], 64 KB
constexpr int OFF_C = 64 * DC * 2;            // buffer 0 (blocks 0, 2, ..), buffer 1 (blocks 1, 3, ..)
constexpr int OFF_P = OFF_C + 2 * BUF_BYTES;  // P_A' (warpgroup 0 -> 1), P_B (1 -> 0): [64 rows x 64 tokens] bf16, 8 KB each
constexpr int OFF_M = OFF_P + 2 * 64 * 128;   // mA [32], mB [32], l of warpgroup 1 [32] (epilogue), fp32
constexpr std::size_t SMEM = OFF_M + 3 * 32 * 4 + 1024;  // + slack to align the base to 1024 bytes
static_assert(SMEM <= 227 * 1024, "smem");
enum : int { BAR_LANDED_L = 3, BAR_LANDED_R = 4, BAR_M0 = 5, BAR_M1 = 6, BAR_P0 = 7, BAR_P1 = 8 };  // 1, 2: wg_barrier

/// One-way signal to the other warpgroup on named barrier id (256 threads: this warpgroup's 128 arrive, the
/// other's 128 sync). Orders this thread's earlier shared-memory writes before the other warpgroup's reads after
/// its bar_sync (barrier release / acquire).
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
/// Waits for the other warpgroup's bar_arrive on named barrier id.
__device__ __forceinline__ void bar_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
using wgmma_util::fence_reg;  // (kernels/wgmma.cuh)
using wgmma_util::wgmma_wait;

/// D[64 x 64] (+)= A B, A and B K-major in shared memory (descriptors); D: 32 fp32 per thread.
__device__ __forceinline__ void wgmma_m64n64(float* d, std::uint64_t da, std::uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

/// D[64 x 256] += A B with A [64 x 16] bf16 in registers (4 x b32 per thread, the m16n8k16 A-fragment layout per
/// warp: {row g, k 2c..2c+1}, {row g + 8, k 2c..}, {row g, k 2c + 8..}, {row g + 8, k 2c + 8..}) and B MN-major
/// (transposed) in shared memory; D: 128 fp32 per thread.
__device__ __forceinline__ void wgmma_m64n256_rs(float* d, const std::uint32_t* a, std::uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/// Loads q~ column blocks [4 wg, 4 wg + 4) of all 64 interleaved rows (row 2h = q_hi[h], 2h + 1 = q_lo[h]; heads
/// >= H: zeros) by the 128 threads of warpgroup wg (wt = thread in the warpgroup): 16-byte cp.async when p.q16 (in
/// the caller's commit group), else 4-byte loads + st.shared.
template <int H>
__device__ __forceinline__ void load_q_half(unsigned char* q_s, const SParams& p, int b, int wt, int wg) {
#pragma unroll 4
  for (int i = 0; i < 64 * 32 / 128; ++i) {
    const int idx = wt + 128 * i, r = idx / 32, ch = 32 * wg + idx % 32, h = r >> 1;
    unsigned char* d = q_s + (ch / 8) * 8192 + v2::sw(r, ch % 8);
    if (h < H) {
      const bf16_t* src = ((r & 1) ? p.q_lo : p.q_hi) + b * p.sq_b + h * DC + ch * 8;
      if (p.q16) {
        cp_async16(d, src);
      } else {
        uint4 v;
        v.x = ld32(src); v.y = ld32(src + 2); v.z = ld32(src + 4); v.w = ld32(src + 6);
        *reinterpret_cast<uint4*>(d) = v;
      }
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

/// Issues (does not commit) the score wgmmas over latent column blocks [kb0, kb0 + 4) of one token block:
/// sc (+)= q~[:, K] C_blk[:, K]^T, 16 wgmma m64n64k16 (K = 256). first: the first of the two halves (scale_d = 0
/// on its first wgmma).
/// The descriptors of the later k-steps are the first ones plus (byte offset >> 4) in the start-address field
/// (bits 0-13; shared addresses < 256 KB, so the field never carries into the next one).
__device__ __forceinline__ void scores_half(float* sc, std::uint32_t q_addr, std::uint32_t c_blk, int kb0, bool first) {
  const std::uint64_t dq = v2::desc(q_addr + kb0 * 8192, 16, 1024), dc = v2::desc(c_blk + kb0 * CB_BYTES, 16, 1024);
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n64(sc, dq + ((k * 8192 + kk * 32) >> 4), dc + ((k * CB_BYTES + kk * 32) >> 4),
                   (first && k == 0 && kk == 0) ? 0 : 1);
}

/// Row scores of one block: sc (the m64n64 accumulator: element 4j + e is row r0 + 8 (e / 2), token 8j + 2 cq + e % 2)
/// becomes s = (S[2h] + S[2h + 1]) * scale_log2 (the partner row is in lane ^ 4; both lanes get the same value),
/// -inf for tokens >= valid; mx[k] = the row max of row half k over the block's 64 tokens (quad reduction).
/// NE = accumulator elements per thread (32: a 64-token block of v5, 16: a 32-token block of v7).
template <int NE = 32>
__device__ __forceinline__ void row_scores(float* sc, int valid, float scale_log2, int cq, float* mx) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int e = 0; e < NE; ++e) {
    const float s = sc[e] + __shfl_xor_sync(0xffffffffu, sc[e], 4);
    const int t = 8 * (e / 4) + 2 * cq + (e & 1);
    sc[e] = t < valid ? s * scale_log2 : -INFINITY;
    mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], sc[e]);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
    mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
  }
}

/// p = 2^(s - mx[row half]) in place; returns the thread's partial row sums in sum[2].
template <int NE = 32>
__device__ __forceinline__ void exp_rows(float* sc, const float* mx, float* sum) {
  sum[0] = sum[1] = 0.0f;
#pragma unroll
  for (int e = 0; e < NE; ++e) {
    sc[e] = exp2f(sc[e] - mx[(e >> 1) & 1]);
    sum[(e >> 1) & 1] += sc[e];
  }
}

/// The bf16 part of (x0, x1) this thread's row carries: hi = bf16(x) for an even row (lo_row = 0), lo = bf16(x - hi)
/// for an odd one (0 when p_hi_only), packed x0 low.
__device__ __forceinline__ std::uint32_t part_bf16(float x0, float x1, int lo_row, int p_hi_only) {
  std::uint32_t hi, lo;
  split_bf16(x0, x1, hi, lo);
  return lo_row ? (p_hi_only ? 0u : lo) : hi;
}

/// P of one block as the register A fragments of 4 k-steps (tokens 16 kk .. 16 kk + 15): the accumulator elements
/// 4j + {0,1} (row r0) and 4j + {2,3} (row r0 + 8) of j = 2kk, 2kk + 1 are exactly the m16n8k16 A fragment.
/// NKK = k-steps of 16 tokens per block (4: v5, 2: v7).
template <int NKK = 4>
__device__ __forceinline__ void pack_p(const float* p, std::uint32_t (*pa)[4], int lo_row, int p_hi_only) {
#pragma unroll
  for (int kk = 0; kk < NKK; ++kk) {
    pa[kk][0] = part_bf16(p[8 * kk + 0], p[8 * kk + 1], lo_row, p_hi_only);
    pa[kk][1] = part_bf16(p[8 * kk + 2], p[8 * kk + 3], lo_row, p_hi_only);
    pa[kk][2] = part_bf16(p[8 * kk + 4], p[8 * kk + 5], lo_row, p_hi_only);
    pa[kk][3] = part_bf16(p[8 * kk + 6], p[8 * kk + 7], lo_row, p_hi_only);
  }
}

/// Stores this thread's part of P (rows r0, r0 + 8; tokens 8j + 2cq, + 1) into the swizzled [64 x 64] P tile p_s
/// (K-major A operand of the other warpgroup's P C): pa from pack_p.
template <int NKK = 4>
__device__ __forceinline__ void store_p(unsigned char* p_s, const std::uint32_t (*pa)[4], int r0, int cq) {
#pragma unroll
  for (int kk = 0; kk < NKK; ++kk) {
    *reinterpret_cast<std::uint32_t*>(p_s + v2::sw(r0, 2 * kk) + 4 * cq) = pa[kk][0];
    *reinterpret_cast<std::uint32_t*>(p_s + v2::sw(r0 + 8, 2 * kk) + 4 * cq) = pa[kk][1];
    *reinterpret_cast<std::uint32_t*>(p_s + v2::sw(r0, 2 * kk + 1) + 4 * cq) = pa[kk][2];
    *reinterpret_cast<std::uint32_t*>(p_s + v2::sw(r0 + 8, 2 * kk + 1) + 4 * cq) = pa[kk][3];
  }
}

/// store_p of the parts of p * c[row half] (P_A' = P_A 2^(mA - mB)), computed 8 values at a time (registers).
template <int NKK = 4>
__device__ __forceinline__ void store_p_scaled(unsigned char* p_s, const float* p, const float* c, int r0, int cq,
                                               int lo_row, int p_hi_only) {
#pragma unroll
  for (int kk = 0; kk < NKK; ++kk) {
    const float* x = p + 8 * kk;
    *reinterpret_cast<std::uint32_t*>(p_s + v2::sw(r0, 2 * kk) + 4 * cq) = part_bf16(x[0] * c[0], x[1] * c[0], lo_row, p_hi_only);
    *reinterpret_cast<std::uint32_t*>(p_s + v2::sw(r0 + 8, 2 * kk) + 4 * cq) = part_bf16(x[2] * c[1], x[3] * c[1], lo_row, p_hi_only);
    *reinterpret_cast<std::uint32_t*>(p_s + v2::sw(r0, 2 * kk + 1) + 4 * cq) = part_bf16(x[4] * c[0], x[5] * c[0], lo_row, p_hi_only);
    *reinterpret_cast<std::uint32_t*>(p_s + v2::sw(r0 + 8, 2 * kk + 1) + 4 * cq) = part_bf16(x[6] * c[1], x[7] * c[1], lo_row, p_hi_only);
  }
}

/// acc rows r0 (elements 4j, 4j + 1) *= c[0], rows r0 + 8 *= c[1]; skipped when both are 1 (bit-identical).
__device__ __forceinline__ void rescale(float* acc, const float* c) {
  if (c[0] != 1.0f || c[1] != 1.0f) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      acc[4 * j] *= c[0]; acc[4 * j + 1] *= c[0];
      acc[4 * j + 2] *= c[1]; acc[4 * j + 3] *= c[1];
    }
  }
}

/// Issues (does not commit) P C over the 4 k-steps of one block for this warpgroup's column half: acc += P
/// C_blk[:, 256 wg ..], P from registers (pa) or, when pa is null, from the swizzled shared tile at p_addr.
/// C_blk read as an MN-major B operand: LBO = one column block (8 KB), SBO = 8 tokens (1 KB).
/// NKK k-steps of 16 tokens, CBB = bytes of one column block of the buffer (v5: 64 tokens x 128 B; v7: 32 x 128 B).
template <int NKK = 4, int CBB = CB_BYTES>
__device__ __forceinline__ void pc_block(float* acc, const std::uint32_t (*pa)[4], std::uint32_t p_addr,
                                         std::uint32_t c_blk, int wg) {
  const std::uint64_t db = v2::desc(c_blk + 4 * wg * CBB, CBB, 1024), dp = v2::desc(p_addr, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < NKK; ++kk) {
    if (pa)
      wgmma_m64n256_rs(acc, pa[kk], db + ((kk * 16 * 128) >> 4));
    else
      v2::wgmma_m64n256_tb(acc, dp + ((kk * 32) >> 4), db + ((kk * 16 * 128) >> 4), 1);
  }
}

/// Stores this thread's share of hi row + lo row of its warpgroup's accumulator half (128 fp32, the m64n256 layout)
/// at dst + head * DC + column for its heads hd[0], hd[1] < H; SCALED: each head's values times inv[k] first. The
/// pair (hi lane, lo lane) = (lane, lane ^ 4) splits the 32 column groups j: the hi lane sums j < 16, the lo lane
/// j >= 16, each receiving the partner's row of its half by one shuffle per element.
template <int H, bool SCALED>
__device__ __forceinline__ void store_rows(float* dst, const float* acc, const float* inv, const int* hd, int lo_row,
                                           int cq) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float send = lo_row ? acc[4 * j + e] : acc[4 * (j + 16) + e];
      const float mine = lo_row ? acc[4 * (j + 16) + e] : acc[4 * j + e];
      v[e] = mine + __shfl_xor_sync(0xffffffffu, send, 4);
      if constexpr (SCALED) v[e] *= inv[e / 2];
    }
    const int col = 8 * (lo_row ? j + 16 : j) + 2 * cq;
    if (hd[0] < H) *reinterpret_cast<float2*>(dst + hd[0] * DC + col) = make_float2(v[0], v[1]);
    if (hd[1] < H) *reinterpret_cast<float2*>(dst + hd[1] * DC + col) = make_float2(v[2], v[3]);
  }
}

/// The end of a seesaw split kernel (v5, v7): the running sums l of both warpgroups are added per head (through l1_s,
/// 32 floats of shared memory), (m, l) of each head and the slice's unnormalised partial (hi row + lo row of each
/// warpgroup's accumulator half: 128 fp32 per thread, the m64n256 layout) go to the workspace slot (b, split); with
/// p.direct (variant 6, one slice per sequence) the partial divided by l goes to the output instead.
template <int H>
__device__ __forceinline__ void epilogue(const SParams& p, float* acc, float* l, const float* m, float* l1_s, int b,
                                         int split, int wg, bool owner, const int* hd, int lo_row, int cq) {
  // l of both warpgroups per head; out = hi row + lo row of each warpgroup's accumulator half
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 1);
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 2);
  }
  if (wg == 1 && owner) { l1_s[hd[0]] = l[0]; l1_s[hd[1]] = l[1]; }
  __syncthreads();
  if (p.direct) {
    // one slice per sequence (variant 6, num_splits = 1): the output itself, acc / l with l of both warpgroups, the
    // same float operations as the combine's single-slice merge (acc * (1 / l)), so the same bits
    if (wg == 0 && owner) { l1_s[hd[0]] += l[0]; l1_s[hd[1]] += l[1]; }
    __syncthreads();
    const float inv[2] = {1.0f / l1_s[hd[0]], 1.0f / l1_s[hd[1]]};
    store_rows<H, true>(p.out + static_cast<long long>(b) * H * DC + 256 * wg, acc, inv, hd, lo_row, cq);
    return;
  }
  const long long slot = static_cast<long long>(b) * p.num_splits + split;
  if (wg == 0 && owner) {
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (hd[k] < H) {
        float* wm = p.ws_ml + (slot * H + hd[k]) * 2;
        wm[0] = m[k];
        wm[1] = l[k] + l1_s[hd[k]];
      }
  }
  store_rows<H, false>(p.ws_acc + slot * H * DC + 256 * wg, acc, nullptr, hd, lo_row, cq);
}

template <int H>
__global__ void __launch_bounds__(NTHR, 1) mla_split_kernel_v5(SParams p) {
  static_assert(H == 16 || H == 32, "H");
  const int split = blockIdx.x, b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, cq = lane % 4;
  // warpgroup index broadcast from lane 0: provably warp-uniform for ptxas (the wgmma code below branches on it)
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0), wt = tid % 128;
  const int r0 = 16 * (warp % 4) + g;            // this thread's accumulator rows r0, r0 + 8 (of the M = 64)
  const int hd[2] = {r0 >> 1, (r0 + 8) >> 1};    // their heads
  const int lo_row = g & 1;                      // rows r0, r0 + 8 are lo rows (q_lo, P_lo) when g is odd
  const bool owner = lo_row == 0 && cq == 0;     // writes the per-head values of its two heads
  const int len = seq_len(p, b);
  if (len < 1 || len > p.max_len) {  // NaN rows: written by the combine kernel, or here when there is none
    if (p.direct)
      for (int i = tid; i < H * DC; i += NTHR) p.out[static_cast<long long>(b) * H * DC + i] = NAN;
    return;
  }
  const int start = split * p.split_len;
  if (start >= len) return;                // empty slice: the combine kernel does not read it
  const int end = min(start + p.split_len, len);
  const int nblk = (end - start + BLK - 1) / BLK, npairs = (nblk + 1) / 2;

  extern __shared__ unsigned char smem_raw[];
  const std::uint32_t raw_addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);  // 1024-byte aligned (swizzle atoms)
  const std::uint32_t sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  const std::uint32_t q_addr = sbase + OFF_Q, c0_addr = sbase + OFF_C, c1_addr = sbase + OFF_C + BUF_BYTES;
  const std::uint32_t pA_addr = sbase + OFF_P, pB_addr = sbase + OFF_P + 64 * 128;
  unsigned char* pA_s = smem + OFF_P;                 // P_A' (written by warpgroup 0)
  unsigned char* pB_s = smem + OFF_P + 64 * 128;      // P_B (written by warpgroup 1)
  float* mA_s = reinterpret_cast<float*>(smem + OFF_M);
  float* mB_s = mA_s + 32;
  float* l1_s = mA_s + 64;

  const bf16_t* cb = p.c + b * p.sc_b;
  // this warpgroup's column half (16-byte chunks 32 wg .. 32 wg + 31 of each token row) of block blk into buffer
  // blk % 2: thread wt copies chunk hch of rows hrow, hrow + 4, .., hrow + 60 (a warp reads 512 contiguous bytes of
  // one row); rows past the slice are zeros
  const int hrow = wt / 32, hch = 32 * wg + wt % 32;
  auto load_half = [&](int blk) {
    const int t0 = start + blk * BLK + hrow;
    const bf16_t* src = cb + static_cast<long long>(t0) * p.sc_t + hch * 8;
    unsigned char* dst = smem + OFF_C + (blk & 1) * BUF_BYTES + (hch / 8) * CB_BYTES;
#pragma unroll
    for (int i = 0; i < BLK / 4; ++i) {
      unsigned char* d = dst + v2::sw(hrow + 4 * i, hch % 8);
      if (t0 + 4 * i < end)
        cp_async16(d, src);
      else
        cp_async16_zfill(d, cb, 0);
      src += 4 * p.sc_t;
    }
  };

  // prologue: groups (oldest first) wg 0: [q~ blocks 0-3, block 0 L], [block 1 L]; wg 1: [q~ blocks 4-7, block 1 R],
  // [block 0 R] (a missing block 1: an empty group)
  load_q_half<H>(smem + OFF_Q, p, b, wt, wg);
  if (wg == 0) {
    load_half(0);
    cp_async_commit();
    if (nblk > 1) load_half(1);
    cp_async_commit();
  } else {
    if (nblk > 1) load_half(1);
    cp_async_commit();
    load_half(0);
    cp_async_commit();
  }

  float acc[128];
#pragma unroll
  for (int e = 0; e < 128; ++e) acc[e] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows r0, r0 + 8 (log2 domain), the same in both warpgroups
  float l[2] = {0.0f, 0.0f};            // this thread's partial running sums (its tokens of its warpgroup's blocks)

  if (wg == 0) {
    for (int i = 0; i < npairs; ++i) {
      const int bA = 2 * i, bB = 2 * i + 1;
      const bool hasB = bB < nblk;
      float sc[32];
      // ---- S_A: k-blocks 0-3 (this warpgroup's loads), then 4-7 once warpgroup 1's have landed
      cp_async_wait<1>();
      v2::fence_async_smem();
      v2::wg_barrier(0);
      v2::wgmma_fence();
      scores_half(sc, q_addr, c0_addr, 0, true);
      v2::wgmma_commit();
      cp_async_wait<0>();  // block bB's L half too (warpgroup 1 scores it)
      v2::fence_async_smem();
      bar_arrive(BAR_LANDED_L);
      bar_sync(BAR_LANDED_R);
      scores_half(sc, q_addr, c0_addr, 4, false);
      v2::wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < 32; ++e) fence_reg(sc[e]);
      // ---- softmax of block A; mA to warpgroup 1 first (it waits for it)
      float mx[2], mA[2], cA[2], sum[2];
      row_scores(sc, min(BLK, end - (start + bA * BLK)), p.scale_log2, cq, mx);
#pragma unroll
      for (int k = 0; k < 2; ++k) mA[k] = fmaxf(m[k], mx[k]);  // finite: token 0 of every block is valid
      if (owner) { mA_s[hd[0]] = mA[0]; mA_s[hd[1]] = mA[1]; }
      bar_arrive(BAR_M0);
#pragma unroll
      for (int k = 0; k < 2; ++k) cA[k] = exp2f(m[k] - mA[k]);  // 0 on the first pair (m = -inf)
      exp_rows(sc, mA, sum);
#pragma unroll
      for (int k = 0; k < 2; ++k) l[k] = l[k] * cA[k] + sum[k];
      // ---- o_L = cA o_L + P_A C_A[:, L], P_A from registers
      std::uint32_t pa[4][4];
      pack_p(sc, pa, lo_row, p.p_hi_only);
      rescale(acc, cA);
      v2::wgmma_fence();
      pc_block(acc, pa, 0, c0_addr, 0);
      v2::wgmma_commit();
      // ---- mB from warpgroup 1; P_A' = P_A 2^(mA - mB) to shared for its o_R
      bar_sync(BAR_M1);
      float cB[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) cB[k] = exp2f(mA[k] - mB_s[hd[k]]);
      store_p_scaled(pA_s, sc, cB, r0, cq, lo_row, p.p_hi_only);
      v2::fence_async_smem();
      bar_arrive(BAR_P0);
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < 128; ++e) fence_reg(acc[e]);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) fence_reg(pa[kk][x]);
      // buffer 0's L half is free (only this warpgroup reads it): refill with block bA + 2
      v2::wg_barrier(0);
      if (bA + 2 < nblk) load_half(bA + 2);
      cp_async_commit();
      rescale(acc, cB);
#pragma unroll
      for (int k = 0; k < 2; ++k) { l[k] *= cB[k]; m[k] = mB_s[hd[k]]; }
      // ---- o_L += P_B C_B[:, L], P_B from shared
      if (hasB) {
        bar_sync(BAR_P1);
        v2::wgmma_fence();
        pc_block(acc, nullptr, pB_addr, c1_addr, 0);
        v2::wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 128; ++e) fence_reg(acc[e]);
        // buffer 1's L half is free (warpgroup 1 scored block bB before it handed over P_B): refill with bB + 2
        v2::wg_barrier(0);
        if (bB + 2 < nblk) load_half(bB + 2);
        cp_async_commit();
      }
    }
  } else {
    for (int i = 0; i < npairs; ++i) {
      const int bA = 2 * i, bB = 2 * i + 1;
      const bool hasB = bB < nblk;
      float sc[32];
      // ---- S_B: k-blocks 4-7 (this warpgroup's loads), then 0-3 once warpgroup 0's have landed (one branch for
      // both halves: a control-flow join between them would copy the in-flight accumulators and make ptxas
      // serialize the wgmmas); without block B only the landing handshake
      float mx[2] = {-INFINITY, -INFINITY};
      cp_async_wait<1>();
      v2::fence_async_smem();
      v2::wg_barrier(1);
      if (hasB) {
        v2::wgmma_fence();
        scores_half(sc, q_addr, c1_addr, 4, true);
        v2::wgmma_commit();
        cp_async_wait<0>();  // block bA's R half too (warpgroup 0 scores it)
        v2::fence_async_smem();
        bar_arrive(BAR_LANDED_R);
        bar_sync(BAR_LANDED_L);
        scores_half(sc, q_addr, c1_addr, 0, false);
        v2::wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 32; ++e) fence_reg(sc[e]);
        row_scores(sc, min(BLK, end - (start + bB * BLK)), p.scale_log2, cq, mx);
      } else {
        cp_async_wait<0>();
        v2::fence_async_smem();
        bar_arrive(BAR_LANDED_R);
        bar_sync(BAR_LANDED_L);
      }
      // ---- mB = max(mA, rowmax S_B) to warpgroup 0
      bar_sync(BAR_M0);
      float mB[2], cB[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) mB[k] = fmaxf(mA_s[hd[k]], mx[k]);
      if (owner) { mB_s[hd[0]] = mB[0]; mB_s[hd[1]] = mB[1]; }
      bar_arrive(BAR_M1);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        cB[k] = exp2f(m[k] - mB[k]);  // 0 on the first pair (m = -inf)
        l[k] *= cB[k];
        m[k] = mB[k];
      }
      rescale(acc, cB);
      std::uint32_t pa[4][4];
      if (hasB) {
        // ---- P_B to shared (for warpgroup 0) and o_R += P_B C_B[:, R] from registers
        float sum[2];
        exp_rows(sc, mB, sum);
#pragma unroll
        for (int k = 0; k < 2; ++k) l[k] += sum[k];
        pack_p(sc, pa, lo_row, p.p_hi_only);
        store_p(pB_s, pa, r0, cq);
        v2::fence_async_smem();
        bar_arrive(BAR_P1);
        v2::wgmma_fence();
        pc_block(acc, pa, 0, c1_addr, 1);
        v2::wgmma_commit();
      }
      // ---- o_R += P_A' C_A[:, R], P_A' from shared
      bar_sync(BAR_P0);
      v2::wgmma_fence();
      pc_block(acc, nullptr, pA_addr, c0_addr, 1);
      v2::wgmma_commit();
      if (hasB) {
        wgmma_wait<1>();  // P_B C_B[:, R] done: buffer 1's R half is free (only this warpgroup reads it)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int x = 0; x < 4; ++x) fence_reg(pa[kk][x]);
        v2::wg_barrier(1);
        if (bB + 2 < nblk) load_half(bB + 2);
        cp_async_commit();
      }
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < 128; ++e) fence_reg(acc[e]);
      // buffer 0's R half is free (warpgroup 0 scored block bA before it handed over P_A'): refill with bA + 2
      v2::wg_barrier(1);
      if (bA + 2 < nblk) load_half(bA + 2);
      cp_async_commit();
    }
  }
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  cp_async_wait<0>();  // (every group is empty or waited for by now)

  epilogue<H>(p, acc, l, m, l1_s, b, split, wg, owner, hd, lo_row, cq);
}
}  // namespace v5

// ================================================================================================
// v7 (variant 7, session 12, opt-in): v5's math, precision plan and seesaw on 32-token blocks in a 4-slot ring
// filled by the tensor-memory accelerator (TMA). Why: at N = 64K a v6 CTA streams only 4 pairs of 64-token blocks and
// its two 64 KB buffers are refilled only after both warpgroups read them, so HBM idles during part of each pair and
// the first scores wait for 128 KB + q~ (bench/NOTES.md, "MLA decode at short N"). Here a pair is two 32-token blocks
// (A = block 2i, B = 2i + 1) and the ring holds two pairs: while one pair is computed the next one is in flight, and the
// first scores start once 32 KB have landed.
//
// Shared memory (1024-byte aligned): q~ 64 KB (v5's interleaved rows, cp.async as v5), the ring of 4 slots x 32 KB
// (slot s = block j % 4; 8 column blocks of [32 tokens x 64 columns] = 4 KB each in the 128-byte swizzle, which is
// the layout a TMA tile load with CU_TENSOR_MAP_SWIZZLE_128B writes), P_A' and P_B (v5's 8 KB tiles, tokens 0-31
// used), mA / mB / l1 (3 x 32 fp32), 4 mbarriers ("slot full", one per slot) and 4 release counters: 209 KB.
// Loads: a 3D tensor map over the cache (512 columns, max_len tokens, B sequences; strides sc_t, sc_b) with a box of
// [64 columns x 32 tokens]; one block = 8 box loads into the slot, completing the slot's mbarrier with 32 KB of
// transaction bytes. Tokens >= max_len land as zeros (TMA out-of-bounds fill); tokens in [len, max_len) of a shorter
// sequence land as whatever the cache holds there, so the warpgroup about to multiply P by a block with fewer than
// 32 valid tokens first zeroes its column half of the rows past them (P = 0 there, but 0 * NaN would be NaN).
// Refill: no producer warp. Each warpgroup releases a block when its last wgmma on it has completed (wgmma wait,
// warpgroup barrier, then thread 0: fence + atomicAdd on the slot's counter); the release that returns an odd count
// is the second one, and that thread issues block j + 4 into the slot at once. Both warpgroups read every block
// (scores of A by 0 and of B by 1, P C of both blocks by both on their column halves), at the points v5 refilled
// buffer halves: wg 0 releases A after P_A C_A[:, L], B after P_B C_B[:, L]; wg 1 releases B after P_B C_B[:, R], A
// after P_A' C_A[:, R].
// Per pair: v5's seesaw unchanged (named barriers M0, M1, P0, P1; the landing barriers LANDED_L/R of v5 are replaced
// by the slot mbarriers, waited on by each warpgroup before its first read of a block), scores m64n32k16 x 32,
// P C m64n256k16 x 2 per block and warpgroup.
// Plan, workspace and combine: v6's (64-token slices of least modelled time, one-round PDL combine).
namespace v7 {
constexpr int BLK = 32;                        // tokens per block (one ring slot)
constexpr int NSLOT = 4;                       // ring slots: two pairs
constexpr int CB_BYTES = BLK * 128;            // one column block [32 tokens x 64 columns]: 4 KB
constexpr int SLOT_BYTES = 8 * CB_BYTES;       // one block: 32 KB
constexpr int OFF_Q = 0;
constexpr int OFF_C = 64 * DC * 2;             // 64 KB
constexpr int OFF_P = OFF_C + NSLOT * SLOT_BYTES;
constexpr int OFF_M = OFF_P + 2 * 64 * 128;
constexpr int OFF_BAR = OFF_M + 3 * 32 * 4;    // 8-byte aligned
constexpr int OFF_CNT = OFF_BAR + NSLOT * 8;
constexpr std::size_t SMEM = OFF_CNT + NSLOT * 4 + 1024;  // + slack to align the base to 1024 bytes
static_assert(SMEM <= 227 * 1024, "smem");
static_assert(OFF_BAR % 8 == 0, "mbarrier alignment");
enum : int { BAR_M0 = 5, BAR_M1 = 6, BAR_P0 = 7, BAR_P1 = 8 };  // 1, 2: wg_barrier

using v5::bar_arrive;
using v5::bar_sync;
using wgmma_util::fence_reg;
using wgmma_util::wgmma_wait;

__device__ __forceinline__ void mbar_init(std::uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/// One arrival of the issuing thread plus the transaction bytes the TMA loads of this phase will complete.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/// Waits until the phase of parity `parity` of the mbarrier has completed.
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred P1;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
/// TMA tile load of box (c0 = column, c1 = token, c2 = sequence) into shared memory, completing on mbarrier bar.
__device__ __forceinline__ void tma_load_3d(std::uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

/// Issues the 8 box loads of block j (tokens start + 32 j ..) of sequence b into slot j % 4.
__device__ __forceinline__ void issue_block(const CUtensorMap* map, std::uint32_t c_addr, std::uint32_t bar_addr,
                                            int j, int start, int b) {
  const int s = j % NSLOT;
  const std::uint32_t bar = bar_addr + 8 * s, dst = c_addr + s * SLOT_BYTES;
  mbar_arrive_expect_tx(bar, SLOT_BYTES);
#pragma unroll
  for (int cb = 0; cb < 8; ++cb) tma_load_3d(dst + cb * CB_BYTES, map, 64 * cb, start + j * BLK, b, bar);
}

/// Thread 0 of a warpgroup, after the warpgroup's last wgmma on block j completed (and a warpgroup barrier): counts
/// the release; the second release of the block issues block j + 4 into the freed slot.
__device__ __forceinline__ void release_block(const CUtensorMap* map, int* cnt, std::uint32_t c_addr,
                                              std::uint32_t bar_addr, int j, int nblk, int start, int b) {
  __threadfence_block();
  const int old = atomicAdd(cnt + j % NSLOT, 1);
  __threadfence_block();
  if ((old & 1) && j + NSLOT < nblk) issue_block(map, c_addr, bar_addr, j + NSLOT, start, b);
}

/// Zeroes rows [valid, 32) of column half `half` of a slot (16-byte stores by the 128 threads of warpgroup `half`,
/// which reads only that half in its P C; the swizzle permutes chunks within a row, so whole rows are zeroed whatever
/// it is), then makes them visible to wgmma.
__device__ __forceinline__ void zero_tail(unsigned char* slot, int valid, int half, int wt) {
  for (int i = wt; i < (BLK - valid) * 32; i += 128) {
    const int row = valid + i / 32, cb = 4 * half + (i % 32) / 8, ch = i % 8;
    *reinterpret_cast<uint4*>(slot + cb * CB_BYTES + row * 128 + ch * 16) = make_uint4(0, 0, 0, 0);
  }
  v2::fence_async_smem();
  v2::wg_barrier(half);
}

/// Scores of one 32-token block: sc = q~ C_blk^T, 32 wgmma m64n32k16 (K = 512), issued and committed.
__device__ __forceinline__ void scores_blk(float* sc, std::uint32_t q_addr, std::uint32_t slot) {
  const std::uint64_t dq = v2::desc(q_addr, 16, 1024), dc = v2::desc(slot, 16, 1024);
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      v2::wgmma_m64n32(sc, dq + ((k * 8192 + kk * 32) >> 4), dc + ((k * CB_BYTES + kk * 32) >> 4),
                       (k == 0 && kk == 0) ? 0 : 1);
  v2::wgmma_commit();
}

template <int H>
__global__ void __launch_bounds__(NTHR, 1) mla_split_kernel_v7(const __grid_constant__ CUtensorMap tmap, const SParams p) {
  static_assert(H == 16 || H == 32, "H");
  const int split = blockIdx.x, b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, cq = lane % 4;
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0), wt = tid % 128;
  const int r0 = 16 * (warp % 4) + g;
  const int hd[2] = {r0 >> 1, (r0 + 8) >> 1};
  const int lo_row = g & 1;
  const bool owner = lo_row == 0 && cq == 0;
  const int len = seq_len(p, b);
  if (len < 1 || len > p.max_len) return;  // the combine kernel writes NaN rows
  const int start = split * p.split_len;
  if (start >= len) return;
  const int end = min(start + p.split_len, len);
  const int nblk = (end - start + BLK - 1) / BLK, npairs = (nblk + 1) / 2;

  extern __shared__ unsigned char smem_raw[];
  const std::uint32_t raw_addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  const std::uint32_t sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  const std::uint32_t q_addr = sbase + OFF_Q, c_addr = sbase + OFF_C, bar_addr = sbase + OFF_BAR;
  const std::uint32_t pA_addr = sbase + OFF_P, pB_addr = sbase + OFF_P + 64 * 128;
  unsigned char* pA_s = smem + OFF_P;
  unsigned char* pB_s = smem + OFF_P + 64 * 128;
  float* mA_s = reinterpret_cast<float*>(smem + OFF_M);
  float* mB_s = mA_s + 32;
  float* l1_s = mA_s + 64;
  int* cnt = reinterpret_cast<int*>(smem + OFF_CNT);
  const CUtensorMap* map = &tmap;
  auto slot_of = [&](int j) { return c_addr + (j % NSLOT) * SLOT_BYTES; };
  auto wait_block = [&](int j) { mbar_wait(bar_addr + 8 * (j % NSLOT), (j / NSLOT) & 1); };
  auto valid_of = [&](int j) { return min(BLK, end - (start + j * BLK)); };
  // before warpgroup `half`'s P C on block j: a partial block's rows past its valid tokens, zeroed in that column half
  auto zero_if_partial = [&](int j, int half) {
    if (const int v = valid_of(j); v < BLK) zero_tail(smem + OFF_C + (j % NSLOT) * SLOT_BYTES, v, half, wt);
  };

  // prologue: thread 0 sets up the slot barriers and issues the first 4 blocks; q~ by cp.async meanwhile
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < NSLOT; ++s) {
      mbar_init(bar_addr + 8 * s, 1);
      cnt[s] = 0;
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    v2::fence_async_smem();
    for (int j = 0; j < min(NSLOT, nblk); ++j) issue_block(map, c_addr, bar_addr, j, start, b);
  }
  v5::load_q_half<H>(smem + OFF_Q, p, b, wt, wg);
  cp_async_commit();
  cp_async_wait<0>();
  v2::fence_async_smem();
  __syncthreads();

  float acc[128];
#pragma unroll
  for (int e = 0; e < 128; ++e) acc[e] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};

  if (wg == 0) {
    for (int i = 0; i < npairs; ++i) {
      const int bA = 2 * i, bB = 2 * i + 1;
      const bool hasB = bB < nblk;
      float sc[16];
      wait_block(bA);
      v2::wgmma_fence();
      scores_blk(sc, q_addr, slot_of(bA));
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < 16; ++e) fence_reg(sc[e]);
      float mx[2], mA[2], cA[2], sum[2];
      const int vA = valid_of(bA);
      v5::row_scores<16>(sc, vA, p.scale_log2, cq, mx);
#pragma unroll
      for (int k = 0; k < 2; ++k) mA[k] = fmaxf(m[k], mx[k]);
      if (owner) { mA_s[hd[0]] = mA[0]; mA_s[hd[1]] = mA[1]; }
      bar_arrive(BAR_M0);
#pragma unroll
      for (int k = 0; k < 2; ++k) cA[k] = exp2f(m[k] - mA[k]);
      v5::exp_rows<16>(sc, mA, sum);
#pragma unroll
      for (int k = 0; k < 2; ++k) l[k] = l[k] * cA[k] + sum[k];
      std::uint32_t pa[2][4];
      v5::pack_p<2>(sc, pa, lo_row, p.p_hi_only);
      zero_if_partial(bA, 0);
      v5::rescale(acc, cA);
      v2::wgmma_fence();
      v5::pc_block<2, CB_BYTES>(acc, pa, 0, slot_of(bA), 0);
      v2::wgmma_commit();
      bar_sync(BAR_M1);
      float cB[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) cB[k] = exp2f(mA[k] - mB_s[hd[k]]);
      v5::store_p_scaled<2>(pA_s, sc, cB, r0, cq, lo_row, p.p_hi_only);
      v2::fence_async_smem();
      bar_arrive(BAR_P0);
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < 128; ++e) fence_reg(acc[e]);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) fence_reg(pa[kk][x]);
      v2::wg_barrier(0);
      if (wt == 0) release_block(map, cnt, c_addr, bar_addr, bA, nblk, start, b);
      v5::rescale(acc, cB);
#pragma unroll
      for (int k = 0; k < 2; ++k) { l[k] *= cB[k]; m[k] = mB_s[hd[k]]; }
      if (hasB) {
        bar_sync(BAR_P1);
        wait_block(bB);  // (completed: warpgroup 1 scored it; the wait makes the TMA writes visible here)
        zero_if_partial(bB, 0);
        v2::wgmma_fence();
        v5::pc_block<2, CB_BYTES>(acc, nullptr, pB_addr, slot_of(bB), 0);
        v2::wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 128; ++e) fence_reg(acc[e]);
        v2::wg_barrier(0);
        if (wt == 0) release_block(map, cnt, c_addr, bar_addr, bB, nblk, start, b);
      }
    }
  } else {
    for (int i = 0; i < npairs; ++i) {
      const int bA = 2 * i, bB = 2 * i + 1;
      const bool hasB = bB < nblk;
      float sc[16];
      float mx[2] = {-INFINITY, -INFINITY};
      if (hasB) {
        wait_block(bB);
        v2::wgmma_fence();
        scores_blk(sc, q_addr, slot_of(bB));
        wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 16; ++e) fence_reg(sc[e]);
        v5::row_scores<16>(sc, valid_of(bB), p.scale_log2, cq, mx);
      }
      bar_sync(BAR_M0);
      float mB[2], cB[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) mB[k] = fmaxf(mA_s[hd[k]], mx[k]);
      if (owner) { mB_s[hd[0]] = mB[0]; mB_s[hd[1]] = mB[1]; }
      bar_arrive(BAR_M1);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        cB[k] = exp2f(m[k] - mB[k]);
        l[k] *= cB[k];
        m[k] = mB[k];
      }
      v5::rescale(acc, cB);
      std::uint32_t pa[2][4];
      if (hasB) {
        float sum[2];
        v5::exp_rows<16>(sc, mB, sum);
#pragma unroll
        for (int k = 0; k < 2; ++k) l[k] += sum[k];
        v5::pack_p<2>(sc, pa, lo_row, p.p_hi_only);
        v5::store_p<2>(pB_s, pa, r0, cq);
        v2::fence_async_smem();
        bar_arrive(BAR_P1);
        zero_if_partial(bB, 1);
        v2::wgmma_fence();
        v5::pc_block<2, CB_BYTES>(acc, pa, 0, slot_of(bB), 1);
        v2::wgmma_commit();
      }
      bar_sync(BAR_P0);
      wait_block(bA);  // (completed: warpgroup 0 scored it)
      zero_if_partial(bA, 1);
      v2::wgmma_fence();
      v5::pc_block<2, CB_BYTES>(acc, nullptr, pA_addr, slot_of(bA), 1);
      v2::wgmma_commit();
      if (hasB) {
        wgmma_wait<1>();
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
          for (int x = 0; x < 4; ++x) fence_reg(pa[kk][x]);
        v2::wg_barrier(1);
        if (wt == 0) release_block(map, cnt, c_addr, bar_addr, bB, nblk, start, b);
      }
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < 128; ++e) fence_reg(acc[e]);
      v2::wg_barrier(1);
      if (wt == 0) release_block(map, cnt, c_addr, bar_addr, bA, nblk, start, b);
    }
  }
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  v5::epilogue<H>(p, acc, l, m, l1_s, b, split, wg, owner, hd, lo_row, cq);
}
}  // namespace v7


const char* const OP = "mla_decode";
/// v4 split planning: a slice's fixed cost in tokens of streaming (the q~ load, 64 KB, and the partial,
/// 64 KB written + read by the combine: ~128 tokens of 1 KB at the streaming rate). (Since session 16 v6 skips the
/// combine when every sequence is one slice, so this slightly overcharges that choice; kept, it is a tuning constant.)
constexpr int V4_FIXED_TOKENS = 128;

void check_pointer(const void* ptr, std::size_t align, const char* name, bool required = true) {
  if (!ptr) {
    if (required) throw Error(std::string(OP) + ": pointer '" + name + "' is null; a device pointer is required");
    return;
  }
  const auto off = reinterpret_cast<std::uintptr_t>(ptr) % align;
  if (off != 0)
    throw Error(std::string(OP) + ": pointer '" + name + "' is not " + std::to_string(align) + "-byte aligned (address % " +
                std::to_string(align) + " = " + std::to_string(off) + "); accepted: " + std::to_string(align) +
                "-byte aligned device pointers");
}

void check_shapes(const MlaDecodeArgs& a) {
  auto fail = [](const std::string& m) { throw Error(std::string(OP) + ": " + m); };
  if (a.d_c != DC) fail("d_c = " + std::to_string(a.d_c) + " is not supported; accepted: d_c = 512");
  if (a.d_rope != 0)
    fail("d_rope = " + std::to_string(a.d_rope) +
         ": the decoupled-RoPE score part is not implemented yet; accepted: d_rope = 0 (NoPE)");
  if (a.H != 16 && a.H != 32) fail("H = " + std::to_string(a.H) + " is not supported; accepted: H = 16 or 32");
  if (a.B < 1 || a.B > 65535) fail("B = " + std::to_string(a.B) + "; accepted: 1 <= B <= 65535");
  if (a.capacity < 1) fail("capacity = " + std::to_string(a.capacity) + "; accepted: >= 1 token");
  if (a.max_len < 1 || a.max_len > a.capacity)
    fail("max_len = " + std::to_string(a.max_len) + "; accepted: 1 <= max_len <= capacity = " +
         std::to_string(a.capacity) + " (N = 0 or a context past the cache capacity)");
  if (a.variant != 1 && a.variant != 2 && a.variant != 4 && a.variant != 5 && a.variant != 6 && a.variant != 7)
    fail("variant = " + std::to_string(a.variant) +
         "; accepted: 1 (mma.sync split kernel), 2 (wgmma split kernel), 4 (variant 2 with per-warpgroup early "
         "refill), 5 (seesaw split kernel), 6 (seesaw split kernel with the one-round combine) or 7 (seesaw on "
         "32-token blocks in a TMA-filled 4-slot ring, one-round combine)" +
         (a.variant == 3 ? std::string(" (variant 3 was removed: variant 4 is faster on every measured shape)") : ""));
  if (a.p_hi_only && a.variant == 1)
    fail("p_hi_only = true needs variant = 2, 4, 5, 6 or 7 (an ablation of the wgmma kernels)");
  if (a.num_splits < 0) fail("num_splits = " + std::to_string(a.num_splits) + "; accepted: >= 0 (0 = automatic)");
}

/// Sets the kernel's dynamic shared memory size on the first call (per kernel), then launches it.
template <void (*kernel)(SParams)>
void launch_split(std::size_t smem, dim3 grid, cudaStream_t stream, const SParams& p, const char* name) {
  static bool attr = false;  // one flag per kernel (template instance)
  if (!attr) {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
               (std::string("cudaFuncSetAttribute(") + name + ")").c_str());
    attr = true;
  }
  kernel<<<grid, NTHR, smem, stream>>>(p);
  cuda_check(cudaGetLastError(), (std::string(name) + " launch").c_str());
}

/// Launches a combine kernel (`threads` threads: 128, or v6's combine_v6_threads) with programmatic dependent launch
/// (cudaLaunchAttributeProgrammaticStreamSerialization): it may start while the split kernel before it in
/// the stream finishes (after that kernel's griddepcontrol.launch_dependents); its griddepcontrol.wait
/// holds every read until the split grid has completed. Works under CUDA-graph capture (a programmatic edge).
template <void (*kernel)(SParams)>
void launch_combine_pdl(dim3 grid, cudaStream_t stream, const SParams& p, const char* name, int threads = 128) {
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

/// Threads per CTA of mla_combine_kernel_v6 for ns slices per sequence: 32 nw with nw = clamp(ceil(ns / 8), 1, 16),
/// the fewest warps that still take every slice in ONE round of loads (8 slices per warp and step). Session 15
/// (bench/NOTES.md, device calls 3-5): one warp per slice up to 16 (the rule before) made B x 4 H CTAs of up to 512
/// threads, two waves of them for B >= 8; the graph step at B = 8 x 8K (H = 32, 16 slices each) 47-49 -> 36-37 us,
/// 16 x 4K 42.5 -> 35-36, 4 x 16K 43.7 -> 38.9, B = 1 N = 2K 10.8 -> 10.4; unchanged at N = 64K (ns = 128: 16 warps
/// either way), 1M and large batches. Packing 2 or 4 column quarters into one CTA when nw <= 2 (CTAs of >= 4 warps)
/// measured the same (call 5) and was dropped.
int combine_v6_threads(int ns) { return 32 * std::max(1, std::min(16, (ns + 7) / 8)); }

/// The combine of variants 6 and 7: mla_combine_kernel_v6 over (H heads, B sequences, 4 column quarters) with
/// combine_v6_threads(num_splits) threads per CTA, programmatic dependent launch after the split kernel.
void launch_combine_v6(int H, int B, int num_splits, cudaStream_t stream, const SParams& p) {
  const dim3 qgrid(H, B, 4);
  const int threads = combine_v6_threads(num_splits);
  if (H == 32)
    launch_combine_pdl<mla_combine_kernel_v6<32>>(qgrid, stream, p, "mla_combine_kernel_v6<32>", threads);
  else
    launch_combine_pdl<mla_combine_kernel_v6<16>>(qgrid, stream, p, "mla_combine_kernel_v6<16>", threads);
}

/// v7's tensor map over the latent cache: 3D (512 columns, max_len tokens, B sequences; byte strides 2 sc_t and
/// 2 sc_b), box [64 columns x 32 tokens x 1], 128-byte swizzle, out-of-bounds elements (tokens >= max_len) filled
/// with zeros. The encoder (cuTensorMapEncodeTiled, CUDA driver API) is reached through the runtime's driver entry
/// point, so nothing links libcuda. Throws kdalab::Error when the driver lacks it or refuses the map.
CUtensorMap latent_tensor_map(const bf16_t* c, int max_len, int B, long long sc_t, long long sc_b) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (!encode) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cuda_check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q),
               "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (q != cudaDriverEntryPointSuccess || !fn)
      throw Error(std::string(OP) + ": variant 7 needs cuTensorMapEncodeTiled (CUDA driver >= 12.0), not found");
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  CUtensorMap map{};
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(DC), static_cast<cuuint64_t>(max_len), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(sc_t) * 2, static_cast<cuuint64_t>(sc_b) * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(v7::BLK), 1};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16_t*>(c), dims, strides, box, estr,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(std::string(OP) + ": cuTensorMapEncodeTiled refused the latent cache map (CUresult " + std::to_string(r) +
                "; max_len = " + std::to_string(max_len) + ", B = " + std::to_string(B) + ", sc_t = " +
                std::to_string(sc_t) + ", sc_b = " + std::to_string(sc_b) + ")");
  return map;
}

/// Launches v7's split kernel (the tensor map is a __grid_constant__ parameter: TMA reads it from parameter space).
template <int H>
void launch_split_v7(const CUtensorMap& map, dim3 grid, cudaStream_t stream, const SParams& p) {
  static bool attr = false;
  if (!attr) {
    cuda_check(cudaFuncSetAttribute(v7::mla_split_kernel_v7<H>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(v7::SMEM)),
               "cudaFuncSetAttribute(mla_split_kernel_v7)");
    attr = true;
  }
  v7::mla_split_kernel_v7<H><<<grid, NTHR, v7::SMEM, stream>>>(map, p);
  cuda_check(cudaGetLastError(), "mla_split_kernel_v7 launch");
}

}  // namespace

MlaDecodePlan mla_decode_plan(const MlaDecodeArgs& a) {
  check_shapes(a);
  const int max_tiles = (a.max_len + TT - 1) / TT;
  int splits = a.num_splits;
  if (splits == 0) {
    // SM count per device, queried once (so that a call inside CUDA-graph capture makes no attribute query)
    static int sm_count[64] = {};
    int dev = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    int sms = dev < 64 ? sm_count[dev] : 0;
    if (sms == 0) {
      cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
      if (dev < 64) sm_count[dev] = sms;
    }
    // one CTA per SM (the split kernel needs ~180 KB of shared memory): the fewest slices per sequence
    // whose CTAs fill >= 95% of the last wave, among slices of >= MIN_SPLIT tokens; else the best fill
    const int smax = std::max(1, a.max_len / MIN_SPLIT);
    int best = 1;
    double best_eff = 0.0;
    for (int s = 1; s <= std::min(smax, 4 * ((sms + a.B - 1) / a.B)); ++s) {
      const long long ctas = static_cast<long long>(a.B) * s;
      const double eff = static_cast<double>(ctas) / (static_cast<double>((ctas + sms - 1) / sms) * sms);
      if (eff > best_eff + 1e-9) { best = s; best_eff = eff; }
      if (eff >= 0.95) break;
    }
    splits = best;
    if (a.variant >= 4) {
      // v4 (and v5, v6): the split count of least modelled time, waves x (split_len + V4_FIXED_TOKENS) with split_len
      // rounded up to whole 64-token tiles and the resulting slice count (v2's rule above takes the first
      // s with >= 95% fill before rounding: N = 65536 gives 114 slices of 576 where 128 of 512 fit one wave)
      long long best_cost = -1;
      const int smax4 = std::max(1, a.max_len / MIN_SPLIT_V4);
      for (int s = 1; s <= std::min(smax4, 4 * ((sms + a.B - 1) / a.B)); ++s) {
        const int len = ((a.max_len + s - 1) / s + v2::TILE - 1) / v2::TILE * v2::TILE;
        const int ns = (a.max_len + len - 1) / len;
        const long long waves = (static_cast<long long>(a.B) * ns + sms - 1) / sms;
        const long long cost = waves * (len + V4_FIXED_TOKENS);
        if (best_cost < 0 || cost < best_cost) { best_cost = cost; splits = ns; }
      }
    }
  }
  splits = std::max(1, std::min(splits, max_tiles));
  const int gran = a.variant == 1 ? TT : v2::TILE;  // slices of whole compute tiles
  const int split_len = ((a.max_len + splits - 1) / splits + gran - 1) / gran * gran;
  MlaDecodePlan p;
  p.split_len = split_len;
  p.num_splits = (a.max_len + split_len - 1) / split_len;
  return p;
}

std::size_t mla_decode_workspace_bytes(const MlaDecodeArgs& a) {
  const MlaDecodePlan pl = mla_decode_plan(a);
  return static_cast<std::size_t>(a.B) * pl.num_splits * a.H * (DC + 2) * 4;
}

void mla_decode(const MlaDecodeArgs& a, cudaStream_t stream) {
  const MlaDecodePlan pl = mla_decode_plan(a);
  check_pointer(a.c, 16, "c");
  check_pointer(a.q_hi, 4, "q_hi");
  check_pointer(a.q_lo, 4, "q_lo");
  check_pointer(a.out, 16, "out");
  check_pointer(a.lens, 4, "lens", false);
  check_pointer(a.workspace, 16, "workspace");
  if (!std::isfinite(a.scale) || !(a.scale > 0.0f))
    throw Error(std::string(OP) + ": scale = " + std::to_string(a.scale) + "; accepted: a finite scale > 0");
  const long long sc_t = a.sc_t ? a.sc_t : DC;
  if (sc_t < DC || sc_t % 8 != 0)
    throw Error(std::string(OP) + ": sc_t = " + std::to_string(sc_t) +
                "; accepted: a multiple of 8 elements >= d_c = 512 (512: latent only; 576: [c ; k_R] rows)");
  const long long sc_b = a.sc_b ? a.sc_b : static_cast<long long>(a.capacity) * sc_t;
  if (sc_b % 8 != 0 || (a.B > 1 && sc_b < static_cast<long long>(a.capacity) * sc_t))
    throw Error(std::string(OP) + ": sc_b = " + std::to_string(sc_b) + "; accepted: a multiple of 8 elements >= capacity * sc_t = " +
                std::to_string(static_cast<long long>(a.capacity) * sc_t));
  const long long sq_b = a.sq_b ? a.sq_b : static_cast<long long>(a.H) * DC;
  if (sq_b % 2 != 0 || sq_b < static_cast<long long>(a.H) * DC)
    throw Error(std::string(OP) + ": sq_b = " + std::to_string(sq_b) + "; accepted: an even number of elements >= H * d_c = " +
                std::to_string(a.H * DC));
  const std::size_t need = static_cast<std::size_t>(a.B) * pl.num_splits * a.H * (DC + 2) * 4;
  if (a.workspace_bytes < need)
    throw Error(std::string(OP) + ": workspace_bytes = " + std::to_string(a.workspace_bytes) + "; accepted: >= " +
                std::to_string(need) + " (mla_decode_workspace_bytes)");
  SParams p{};
  p.B = a.B; p.max_len = a.max_len; p.split_len = pl.split_len; p.num_splits = pl.num_splits;
  p.lens = a.lens; p.c = a.c; p.sc_b = sc_b; p.sc_t = sc_t;
  p.q_hi = a.q_hi; p.q_lo = a.q_lo; p.sq_b = sq_b;
  p.scale_log2 = a.scale * 1.4426950408889634f;
  p.ws_acc = static_cast<float*>(a.workspace);
  p.ws_ml = p.ws_acc + static_cast<std::size_t>(a.B) * pl.num_splits * a.H * DC;
  p.out = a.out;
  p.q16 = (reinterpret_cast<std::uintptr_t>(a.q_hi) % 16 == 0 && reinterpret_cast<std::uintptr_t>(a.q_lo) % 16 == 0 &&
           sq_b % 8 == 0) ? 1 : 0;
  p.p_hi_only = a.p_hi_only ? 1 : 0;
  const dim3 grid(pl.num_splits, a.B), cgrid(a.H, a.B);
  if (a.variant == 7) {
    const CUtensorMap map = latent_tensor_map(a.c, a.max_len, a.B, sc_t, sc_b);
    if (a.H == 32)
      launch_split_v7<32>(map, grid, stream, p);
    else
      launch_split_v7<16>(map, grid, stream, p);
    launch_combine_v6(a.H, a.B, pl.num_splits, stream, p);
    return;
  }
  if (a.variant == 5 || a.variant == 6) {
    p.direct = a.variant == 6 && pl.num_splits == 1 ? 1 : 0;  // (session 16: no combine launch, no partial round trip)
    if (a.H == 32)
      launch_split<v5::mla_split_kernel_v5<32>>(v5::SMEM, grid, stream, p, "mla_split_kernel_v5<32>");
    else
      launch_split<v5::mla_split_kernel_v5<16>>(v5::SMEM, grid, stream, p, "mla_split_kernel_v5<16>");
    if (a.variant == 6) {
      if (!p.direct) launch_combine_v6(a.H, a.B, pl.num_splits, stream, p);
      return;
    }
    const dim3 qgrid(a.H, a.B, 4);  // v4's combine: 4 column quarters per (head, sequence)
    if (a.H == 32)
      launch_combine_pdl<mla_combine_kernel_v4<32>>(qgrid, stream, p, "mla_combine_kernel_v4<32>");
    else
      launch_combine_pdl<mla_combine_kernel_v4<16>>(qgrid, stream, p, "mla_combine_kernel_v4<16>");
    return;
  }
  if (a.variant == 4) {
    if (a.H == 32)
      launch_split<v2::mla_split_kernel_v2<32, true>>(v2::SMEM, grid, stream, p, "mla_split_kernel_v2<32, refill>");
    else
      launch_split<v2::mla_split_kernel_v2<16, true>>(v2::SMEM, grid, stream, p, "mla_split_kernel_v2<16, refill>");
    const dim3 qgrid(a.H, a.B, 4);  // 4 column quarters per (head, sequence)
    if (a.H == 32)
      launch_combine_pdl<mla_combine_kernel_v4<32>>(qgrid, stream, p, "mla_combine_kernel_v4<32>");
    else
      launch_combine_pdl<mla_combine_kernel_v4<16>>(qgrid, stream, p, "mla_combine_kernel_v4<16>");
    return;
  }
  if (a.variant == 2) {
    if (a.H == 32)
      launch_split<v2::mla_split_kernel_v2<32>>(v2::SMEM, grid, stream, p, "mla_split_kernel_v2<32>");
    else
      launch_split<v2::mla_split_kernel_v2<16>>(v2::SMEM, grid, stream, p, "mla_split_kernel_v2<16>");
  } else {
    if (a.H == 32)
      launch_split<mla_split_kernel<32>>(smem_bytes<32>(), grid, stream, p, "mla_split_kernel<32>");
    else
      launch_split<mla_split_kernel<16>>(smem_bytes<16>(), grid, stream, p, "mla_split_kernel<16>");
  }
  if (a.variant == 2) {
    if (a.H == 32)
      mla_combine_kernel_v2<32><<<cgrid, 128, 0, stream>>>(p);
    else
      mla_combine_kernel_v2<16><<<cgrid, 128, 0, stream>>>(p);
  } else {
    if (a.H == 32)
      mla_combine_kernel<32><<<cgrid, 128, 0, stream>>>(p);
    else
      mla_combine_kernel<16><<<cgrid, 128, 0, stream>>>(p);
  }
  cuda_check(cudaGetLastError(), "mla_combine_kernel launch");
}

}  // namespace kdalab::kernels
