// Absorbed Gated-MLA decode over a bf16 latent cache (kernels/mla.hpp), d_c = 512, H in {16, 32}.
// Three split kernels share the plan, the workspace layout and the host checks: v1 (variant 1, below:
// mma.sync), v2 (variant 2, the default, further down: wgmma, 64-token tiles) and v4 (variant 4: v2's
// kernel with early per-warpgroup refill, v4's plan and combine with programmatic dependent launch).
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

#include "kernels/kda_common.cuh"
#include "kernels/mla.hpp"

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
constexpr int MIN_SPLIT = 256;    // fewest tokens per slice chosen automatically

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
  const int len = seq_len(p, b);
  float4* o = reinterpret_cast<float4*>(p.out + (static_cast<long long>(b) * H + h) * DC + 128 * quarter) + lane;
  if (len < 1 || len > p.max_len) {
    if (warp == 0) *o = make_float4(NAN, NAN, NAN, NAN);
    return;
  }
  const int ns = (len + p.split_len - 1) / p.split_len;
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
// ================================================================================================
// v2 (variant 2, the default): wgmma (sm_90a warpgroup MMA, both operands read from shared memory
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

/// Byte offset of 16-byte chunk c (0..7) of row r in a [rows x 64 bf16] 128-byte-swizzled block.
__device__ __forceinline__ int sw(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

/// Shared-memory matrix descriptor (PTX ISA, wgmma matrix descriptor): start address, leading and
/// stride byte offsets (all >> 4), 128-byte swizzle.
__device__ __forceinline__ std::uint64_t desc(std::uint32_t saddr, std::uint32_t lbo, std::uint32_t sbo) {
  return static_cast<std::uint64_t>((saddr & 0x3FFFF) >> 4) | (static_cast<std::uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<std::uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (std::uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to wgmma.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
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


const char* const OP = "mla_decode";
/// v4 split planning: a slice's fixed cost in tokens of streaming (the q~ load, 64 KB, and the partial,
/// 64 KB written + read by the combine: ~128 tokens of 1 KB at the streaming rate).
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
  if (a.variant != 1 && a.variant != 2 && a.variant != 4)
    fail("variant = " + std::to_string(a.variant) +
         "; accepted: 1 (mma.sync split kernel), 2 (wgmma split kernel) or 4 (variant 2 with per-warpgroup early "
         "refill)" + (a.variant == 3 ? std::string(" (variant 3 was removed: variant 4 is faster on every measured shape)") : ""));
  if (a.p_hi_only && a.variant == 1)
    fail("p_hi_only = true needs variant = 2 or 4 (an ablation of the wgmma kernels)");
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

/// Launches a combine kernel (128 threads) with programmatic dependent launch
/// (cudaLaunchAttributeProgrammaticStreamSerialization): it may start while the split kernel before it in
/// the stream finishes (after that kernel's griddepcontrol.launch_dependents); its griddepcontrol.wait
/// holds every read until the split grid has completed. Works under CUDA-graph capture (a programmatic edge).
template <void (*kernel)(SParams)>
void launch_combine_pdl(dim3 grid, cudaStream_t stream, const SParams& p, const char* name) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(128);
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
    if (a.variant == 4) {
      // v4: the split count of least modelled time, waves x (split_len + V4_FIXED_TOKENS) with split_len
      // rounded up to whole 64-token tiles and the resulting slice count (v2's rule above takes the first
      // s with >= 95% fill before rounding: N = 65536 gives 114 slices of 576 where 128 of 512 fit one wave)
      long long best_cost = -1;
      for (int s = 1; s <= std::min(smax, 4 * ((sms + a.B - 1) / a.B)); ++s) {
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
