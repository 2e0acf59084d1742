// KDA backward, version 2: the chunked pass (kernels/kda_backward.hpp; design and measurements:
// docs/kernels/kda_backward.md "Version 2"). Per value head, chunks of C = 16 tokens in the WY form; the names are
// those of reference/kda_chunk_backward.hpp and numerics/kda_chunk_backward_twin.hpp. Every product is fp32-class:
// the products over D or over value columns run on mma.sync as three tf32 passes (hi hi + hi lo + lo hi), the
// products over the 16 tokens of a chunk in fp32 FMA.
//  1. factors (one CTA per chunk and value head): from the prepared q, k, g, beta (prepare.cu) and v: the in-chunk
//     cumulative log-decay G, Gam = e^G, Kg = Gam K, Ki = K / Gam, Qg = Gam Q, Kd = gamL Ki (gamL: Gam's last row),
//     B = StrictTril(Kg Ki^T), P = Tril(Qg Ki^T), A = Diag(beta) B, N = (I + A)^-1 and [W | U] = N [Diag(beta) Kg |
//     Diag(beta) V] by forward substitution; stored in the chunk's factor slot. Rows past the end of a sequence are
//     zero (g = 0 there), which leaves every product of the chunk unchanged.
//  2. forward chain (one CTA per sequence, value head and NC value columns; chunks in order): stores S entering each
//     chunk; V~ = U - W S, S <- Diag(gamL) S + Kd^T V~.
//  3. reverse chain (chunks last first): stores dS = dL/dS leaving each chunk; dV~ = scale P^T dO + Kd dS,
//     dS <- Diag(gamL) dS + Qg^T (scale dO) - W^T dV~; dS0 at the end.
//  4. gradients (one CTA per chunk and value head), NT value columns at a time from the stored S and dS: V~, dV~,
//     dY = N^T dV~ (dv = beta dY), and the sums over value columns dQg' = dO S^T, dW = -dV~ S^T, dKd = V~ dS^T,
//     dP = scale Tril(dO V~^T), the dY U^T part of dA; then the chunk's token math: dX = N^T dW,
//     dA = -StrictTril(dX W^T + dY U^T), dB = Diag(beta) dA, dQg = scale dQg' + dP Ki,
//     dKi = dP^T Qg + dKd Diag(gamL) + dB^T Kg, dKg = dB Ki + Diag(beta) dX, dq = Gam dQg, dk = Gam dKg + dKi / Gam,
//     dG = Gam (K dKg + Q dQg) - Ki dKi (+ gamL dgamL on the last row, dgamL = rowsum(dS S) + colsum(Ki dKd)),
//     dg = the suffix sums of dG, dbeta = rowsum(dA B) + rowsum(dX Kg) + rowsum(dY V). Written as the partials of one
//     column block, which the epilogue (epilogue.cu) turns into the outputs as for the sweep.
// No atomics: every sum has a fixed order.
#include <algorithm>

#include "kernels/kda_backward/common.cuh"

namespace kdalab::kernels::kda_backward_detail {
namespace {

constexpr int C = CHUNK;  // chunk (tokens)
constexpr int NC = 32;  // value columns per CTA of the chains
constexpr int NT = 32;  // value columns per step of the gradient kernel
constexpr int CL = C + 4;  // padded row of a C x C matrix in shared memory

/// The factor slot (common.cuh ChunkFac).
template <int D>
using Fac = ChunkFac<D>;

/// d (one m16n8k8 accumulator tile) += A B summed over k in [0, K) (K a multiple of 8), fp32-class: each operand
/// split into tf32 hi + lo, three products; the hi hi terms and the two correction terms accumulate apart (three
/// independent mma chains) and meet at the end. A(m, k) = a[m am + k ak] and B(k, n) = b[k bk + n bn] in shared
/// memory (a transpose is a swap of the strides); a points at the tile's first row, b at its first column.
template <int K>
__device__ __forceinline__ void mma_x3(float (&d)[4], const float* a, int am, int ak, const float* b, int bk, int bn) {
  static_assert(K % 8 == 0, "K: a multiple of the mma's k = 8");
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float e1[4] = {0.0f, 0.0f, 0.0f, 0.0f}, e2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 8) {
    std::uint32_t ah[4], al[4], bh[2], bl[2];
    split_tf32(a[g * am + (k0 + t) * ak], ah[0], al[0]);
    split_tf32(a[(g + 8) * am + (k0 + t) * ak], ah[1], al[1]);
    split_tf32(a[g * am + (k0 + t + 4) * ak], ah[2], al[2]);
    split_tf32(a[(g + 8) * am + (k0 + t + 4) * ak], ah[3], al[3]);
    split_tf32(b[(k0 + t) * bk + g * bn], bh[0], bl[0]);
    split_tf32(b[(k0 + t + 4) * bk + g * bn], bh[1], bl[1]);
    mma_tf32(e1, al, bh);
    mma_tf32(e2, ah, bl);
    mma_tf32(d, ah, bh);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) d[e] += e1[e] + e2[e];
}
/// Row and column inside the 16 x 8 tile of accumulator element e of this thread.
__device__ __forceinline__ int frow(int e) { return ((threadIdx.x & 31) >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int fcol(int e) { return 2 * (threadIdx.x & 3) + (e & 1); }

/// Four fp32 from global memory and into shared memory at p[0..3]; both addresses 16-byte aligned (every row pitch and
/// buffer offset of the chains is a multiple of four floats).
__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void st4(float* p, const float4& v) { *reinterpret_cast<float4*>(p) = v; }

/// Element (b, t, hv, col) of a bf16 [B, T, HV, D] input with strides, as fp32.
__device__ __forceinline__ float ld_v(const bf16_t* x, const Strides& s, const Params& p, int tau, int hv, int col) {
  int b, t;
  row_bt(p, tau, b, t);
  return bf2f(x[at(s, b, t, hv) + col]);
}

// ---------------------------------------------------------------------------------------------------------------
// 1. factors
template <int D>
__global__ void __launch_bounds__(256, 2) factors_kernel(Params p) {
  constexpr int LD = D + 4;
  using F = Fac<D>;
  extern __shared__ float sm[];
  float *sK = sm, *sQ = sK + C * LD, *sGam = sQ + C * LD, *sV = sGam + C * LD, *sKg = sV + C * LD,
        *sKi = sKg + C * LD, *sQg = sKi + C * LD, *sA = sQg + C * LD, *sbt = sA + C * CL;
  const int c = blockIdx.x, hv = blockIdx.y, n = blockIdx.z, tid = threadIdx.x;
  int bos, len;
  long long slot0;
  seq_of<C>(p, n, bos, len, slot0);
  const int t0 = c * C;
  if (t0 >= len) return;  // uniform over the CTA
  const int L = min(C, len - t0), h = hv / p.group;
  float* f = p.fac + (static_cast<std::size_t>(slot0 + c) * p.HV + hv) * F::size;
  // the chunk's k, q, g, v: every load of the thread issued before its first store (one memory round trip, not one
  // per element)
  constexpr int NE = C * D / 256;
  float k[NE], q[NE], g[NE], v[NE];
#pragma unroll
  for (int u = 0; u < NE; ++u) {
    const int idx = tid + 256 * u, r = idx / D, i = idx - r * D;
    k[u] = q[u] = g[u] = v[u] = 0.0f;
    if (r < L) {
      const int tau = bos + t0 + r;
      const std::size_t rk = (static_cast<std::size_t>(tau) * p.H + h) * D + i;
      k[u] = p.kn[rk];
      q[u] = p.qn[rk];
      g[u] = p.gf[(static_cast<std::size_t>(tau) * p.HV + hv) * D + i];
      v[u] = ld_v(p.v, p.sv, p, tau, hv, i);
    }
  }
#pragma unroll
  for (int u = 0; u < NE; ++u) {
    const int idx = tid + 256 * u, r = idx / D, i = idx - r * D;
    sK[r * LD + i] = k[u];
    sQ[r * LD + i] = q[u];
    sGam[r * LD + i] = g[u];
    sV[r * LD + i] = v[u];
  }
  if (tid < C) sbt[tid] = tid < L ? p.bf[static_cast<std::size_t>(bos + t0 + tid) * p.HV + hv] : 0.0f;
  __syncthreads();
  if (tid < D) {  // the cumulative log-decay of column tid, then Gam = e^G
    float G = 0.0f;
    for (int r = 0; r < C; ++r) {
      G += sGam[r * LD + tid];
      sGam[r * LD + tid] = expf(G);
    }
  }
  __syncthreads();
  for (int idx = tid; idx < C * D; idx += 256) {
    const int r = idx / D, i = idx - r * D;
    const float gam = sGam[r * LD + i], gl = sGam[(C - 1) * LD + i], k = sK[r * LD + i];
    const float kg = gam * k, ki = k / gam, qg = gam * sQ[r * LD + i], kd = k * (gl / gam);
    sKg[r * LD + i] = kg;
    sKi[r * LD + i] = ki;
    sQg[r * LD + i] = qg;
    f[F::Qg + idx] = qg;
    f[F::Kd + idx] = kd;
    if (r == C - 1) f[F::gamL + i] = gam;
  }
  __syncthreads();
  {  // B and P, one element per thread (only the parts used: s < r for B, s <= r for P; the rest would need e^(+G))
    const int r = tid / C, s = tid % C;
    float b = 0.0f, pq = 0.0f;
    if (s <= r)
      for (int i = 0; i < D; ++i) {
        const float ki = sKi[s * LD + i];
        b += sKg[r * LD + i] * ki;
        pq += sQg[r * LD + i] * ki;
      }
    if (s == r) b = 0.0f;
    f[F::B + tid] = b;
    f[F::P + tid] = pq;
    sA[r * CL + s] = sbt[r] * b;
  }
  __syncthreads();
  // [W | U | N] = (I + A)^-1 [Diag(beta) Kg | Diag(beta) V | I], one column per thread (columns are independent)
  for (int col = tid; col < 2 * D + C; col += 256) {
    float x[C];
#pragma unroll
    for (int r = 0; r < C; ++r) {
      float acc = col < D ? sbt[r] * sKg[r * LD + col] : col < 2 * D ? sbt[r] * sV[r * LD + col - D] : (col - 2 * D == r ? 1.0f : 0.0f);
#pragma unroll
      for (int s = 0; s < r; ++s) acc -= sA[r * CL + s] * x[s];
      x[r] = acc;
    }
    float* dst = col < D ? f + F::W + col : col < 2 * D ? f + F::U + (col - D) : f + F::N + (col - 2 * D);
    const int stride = col < 2 * D ? D : C;
#pragma unroll
    for (int r = 0; r < C; ++r) dst[r * stride] = x[r];
  }
}

/// A chain CTA's D x NC tile of a state: from / into the [D][D] fp32 state at `g` (columns col0 ..; null `g` on the
/// way in: zero) and shared memory with rows of NC + 4.
template <int D>
__device__ __forceinline__ void tile_in(float* s, const float* g, int col0) {
  for (int idx = threadIdx.x; idx < D * NC / 4; idx += blockDim.x) {
    const int i = idx / (NC / 4), c = 4 * (idx - i * (NC / 4));
    st4(s + i * (NC + 4) + c, g ? ld4(g + static_cast<std::size_t>(i) * D + col0 + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
  }
}
template <int D>
__device__ __forceinline__ void tile_out(float* g, const float* s, int col0) {
  for (int idx = threadIdx.x; idx < D * NC / 4; idx += blockDim.x) {
    const int i = idx / (NC / 4), c = 4 * (idx - i * (NC / 4));
    *reinterpret_cast<float4*>(g + static_cast<std::size_t>(i) * D + col0 + c) =
        *reinterpret_cast<const float4*>(s + i * (NC + 4) + c);
  }
}

/// The chains' C x NC products A B over D keys, split over the four warps (warp w sums keys [w D / 4, (w + 1) D / 4):
/// a chain of D / 32 mma steps instead of D / 8): warp w's partial into sPart + w C NL. A: C x D rows at stride D + 4;
/// B: D x NC at stride NC + 4 (both shared memory).
template <int D>
__device__ __forceinline__ void key_split_partials(float* sPart, const float* a, const float* b, int w) {
  constexpr int LD = D + 4, NL = NC + 4, KW = D / 4;
#pragma unroll
  for (int nt = 0; nt < NC / 8; ++nt) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_x3<KW>(d, a + w * KW, LD, 1, b + w * KW * NL + 8 * nt, NL, 1);
#pragma unroll
    for (int e = 0; e < 4; ++e) sPart[(w * C + frow(e)) * NL + 8 * nt + fcol(e)] = d[e];
  }
}
/// The four partials of key_split_partials at offset o, summed in a fixed order.
__device__ __forceinline__ float partials_sum(const float* sPart, int o) {
  constexpr int P = C * (NC + 4);
  return ((sPart[o] + sPart[P + o]) + sPart[2 * P + o]) + sPart[3 * P + o];
}

// ---------------------------------------------------------------------------------------------------------------
// 2. forward chain: S entering every chunk
template <int D>
__device__ __forceinline__ void fwd_chain(const Params& p, int cb, int hv) {
  constexpr int LD = D + 4, NL = NC + 4;
  using F = Fac<D>;
  extern __shared__ float sm[];
  float *sS = sm, *sW = sS + D * NL, *sKd = sW + C * LD, *sU = sKd + C * LD, *sVt = sU + C * NL, *sPart = sVt + C * NL,
        *sgL = sPart + 4 * C * NL;
  const int n = blockIdx.z, tid = threadIdx.x, w = tid / 32;
  int bos, len;
  long long slot0;
  seq_of<C>(p, n, bos, len, slot0);
  const int nch = (len + C - 1) / C, col0 = cb * NC;
  const std::size_t st_base = (static_cast<std::size_t>(n) * p.HV + hv) * D * D;
  tile_in<D>(sS, p.S0 ? p.S0 + st_base : nullptr, col0);
  // the next chunk's W, Kd, U slice and gamL, loaded into registers one step ahead
  constexpr int V4 = C * D / 512;  // float4 of a C x D matrix per thread
  static_assert(C * NC == 512, "one float4 of the U slice per thread");
  float4 rW[V4], rKd[V4], rU;
  float rgl = 0.0f;
  const auto fetch = [&](int ch) {
    const float* f = p.fac + (static_cast<std::size_t>(slot0 + ch) * p.HV + hv) * F::size;
#pragma unroll
    for (int j = 0; j < V4; ++j) {
      rW[j] = ld4(f + F::W + 4 * (tid + 128 * j));
      rKd[j] = ld4(f + F::Kd + 4 * (tid + 128 * j));
    }
    rU = ld4(f + F::U + (tid / (NC / 4)) * D + col0 + 4 * (tid % (NC / 4)));
    if (tid < D) rgl = f[F::gamL + tid];
  };
  if (nch > 0) fetch(0);
  for (int ch = 0; ch < nch; ++ch) {
    __syncthreads();
    tile_out<D>(p.Sst + (static_cast<std::size_t>(slot0 + ch) * p.HV + hv) * D * D, sS, col0);
#pragma unroll
    for (int j = 0; j < V4; ++j) {
      const int e = 4 * (tid + 128 * j), r = e / D, i = e - r * D;
      st4(sW + r * LD + i, rW[j]);
      st4(sKd + r * LD + i, rKd[j]);
    }
    st4(sU + (tid / (NC / 4)) * NL + 4 * (tid % (NC / 4)), rU);
    if (tid < D) sgL[tid] = rgl;
    if (ch + 1 < nch) fetch(ch + 1);
    __syncthreads();
    // V~ = U - W S, the keys split over the warps; the four partials meet in a fixed order
    key_split_partials<D>(sPart, sW, sS, w);
    __syncthreads();
    for (int idx = tid; idx < C * NC; idx += 128) {
      const int o = (idx / NC) * NL + idx % NC;
      sVt[o] = sU[o] - partials_sum(sPart, o);
    }
    __syncthreads();
    // S <- Diag(gamL) S + Kd^T V~: tiles of 16 key rows x 8 columns
#pragma unroll
    for (int tt = w; tt < (D / 16) * (NC / 8); tt += 4) {
      const int m0 = 16 * (tt / (NC / 8)), n0 = 8 * (tt % (NC / 8));
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_x3<C>(d, sKd + m0, 1, LD, sVt + n0, NL, 1);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = m0 + frow(e), c = n0 + fcol(e);
        sS[i * NL + c] = sgL[i] * sS[i * NL + c] + d[e];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 3. reverse chain: dS leaving every chunk, dS0
template <int D>
__device__ __forceinline__ void bwd_chain(const Params& p, int cb, int hv) {
  constexpr int LD = D + 4, NL = NC + 4;
  using F = Fac<D>;
  extern __shared__ float sm[];
  float *sdS = sm, *sW = sdS + D * NL, *sKd = sW + C * LD, *sQg = sKd + C * LD, *sP = sQg + C * LD,
        *sdO = sP + C * CL, *sdVt = sdO + C * NL, *sPart = sdVt + C * NL, *sgL = sPart + 4 * C * NL;
  const int n = blockIdx.z, tid = threadIdx.x, w = tid / 32;
  int bos, len;
  long long slot0;
  seq_of<C>(p, n, bos, len, slot0);
  const int nch = (len + C - 1) / C, col0 = cb * NC;
  const float scale = p.scale;
  const std::size_t st_base = (static_cast<std::size_t>(n) * p.HV + hv) * D * D;
  tile_in<D>(sdS, p.dS_T ? p.dS_T + st_base : nullptr, col0);
  // the next chunk's W, Kd, Qg, P, dO slice and gamL, loaded into registers one step ahead
  constexpr int V4 = C * D / 512;  // float4 of a C x D matrix per thread
  static_assert(C * C == 256 && C * NC == 512, "two elements of P and four of the dO slice per thread");
  float4 rW[V4], rKd[V4], rQg[V4];
  float rP[2], rdO[4], rgl = 0.0f;
  const auto fetch = [&](int ch) {
    const float* f = p.fac + (static_cast<std::size_t>(slot0 + ch) * p.HV + hv) * F::size;
#pragma unroll
    for (int j = 0; j < V4; ++j) {
      rW[j] = ld4(f + F::W + 4 * (tid + 128 * j));
      rKd[j] = ld4(f + F::Kd + 4 * (tid + 128 * j));
      rQg[j] = ld4(f + F::Qg + 4 * (tid + 128 * j));
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) rP[m] = f[F::P + tid + 128 * m];
    const int t0 = ch * C, L = min(C, len - t0);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int idx = tid + 128 * m, r = idx / NC, c = idx - r * NC;
      rdO[m] = r < L ? ld_v(p.dO, p.sdo, p, bos + t0 + r, hv, col0 + c) : 0.0f;
    }
    if (tid < D) rgl = f[F::gamL + tid];
  };
  if (nch > 0) fetch(nch - 1);
  for (int ch = nch - 1; ch >= 0; --ch) {
    __syncthreads();
    tile_out<D>(p.dSst + (static_cast<std::size_t>(slot0 + ch) * p.HV + hv) * D * D, sdS, col0);
#pragma unroll
    for (int j = 0; j < V4; ++j) {
      const int e = 4 * (tid + 128 * j), r = e / D, i = e - r * D;
      st4(sW + r * LD + i, rW[j]);
      st4(sKd + r * LD + i, rKd[j]);
      st4(sQg + r * LD + i, rQg[j]);
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) sP[((tid + 128 * m) / C) * CL + (tid + 128 * m) % C] = rP[m];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int idx = tid + 128 * m, r = idx / NC, c = idx - r * NC;
      sdO[r * NL + c] = rdO[m];
    }
    if (tid < D) sgL[tid] = rgl;
    if (ch > 0) fetch(ch - 1);
    __syncthreads();
    {  // dV~ = scale P^T dO + Kd dS: Kd dS with the keys split over the warps (as V~ in the forward chain), P^T dO
       // for columns 8 w .. of warp w; the partials meet in a fixed order
      key_split_partials<D>(sPart, sKd, sdS, w);
      float d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_x3<C>(d1, sP, 1, CL, sdO + 8 * w, NL, 1);
      __syncthreads();
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int o = frow(e) * NL + 8 * w + fcol(e);
        sdVt[o] = scale * d1[e] + partials_sum(sPart, o);
      }
    }
    __syncthreads();
    // dS <- Diag(gamL) dS + Qg^T (scale dO) - W^T dV~
#pragma unroll
    for (int tt = w; tt < (D / 16) * (NC / 8); tt += 4) {
      const int m0 = 16 * (tt / (NC / 8)), n0 = 8 * (tt % (NC / 8));
      float d1[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_x3<C>(d1, sQg + m0, 1, LD, sdO + n0, NL, 1);
      mma_x3<C>(d2, sW + m0, 1, LD, sdVt + n0, NL, 1);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = m0 + frow(e), c = n0 + fcol(e);
        sdS[i * NL + c] = sgL[i] * sdS[i * NL + c] + scale * d1[e] - d2[e];
      }
    }
  }
  if (p.dS0) {
    __syncthreads();
    tile_out<D>(p.dS0 + st_base, sdS, col0);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 2 + 3. the two chains in one launch: they read only the factor slots, dO and the boundary states, and write
// different buffers (S / dS), so they run side by side. blockIdx.x enumerates (role, value head, column block), the
// reverse chains first (the longer ones: where not every CTA is resident at once, the forward chains fill the slots
// the reverse chains leave); `forward_only` (the phase prefix KdaBackwardPhase::forward_chain) launches the forward
// chains alone.
template <int D>
__global__ void __launch_bounds__(128) chains_kernel(Params p, bool forward_only) {
  constexpr int NB = D / NC;
  const int per_role = NB * p.HV, x = static_cast<int>(blockIdx.x);
  const int r = x < per_role ? x : x - per_role, hv = r / NB, cb = r - hv * NB;
  if (forward_only || x >= per_role) fwd_chain<D>(p, cb, hv);
  else bwd_chain<D>(p, cb, hv);
}

// ---------------------------------------------------------------------------------------------------------------
// 4. gradients
template <int D>
struct GradSmem {
  static constexpr int LD = D + 4, NL = NT + 4;
  // floats: W, Kd, Qg, Ki, Kg, Gam [C][LD]; P, N, Bm [C][CL]; the tiles S, dS [D][NL] and dO, V, U, Vt, dVt, dY
  // [C][NL], whose space the token math reuses after the last tile for dQg', dW, dKd, dX, dG [C][LD]; dP, dAY, dA,
  // dB [C][CL]; dgamL [D]; dbY, beta [C]. 111 KB at D = 128: two CTAs per SM.
  static constexpr int tiles = 2 * D * NL + 6 * C * NL;
  static_assert(5 * C * LD <= tiles, "the token math's C x D buffers reuse the tile space");
  static constexpr int floats = 6 * C * LD + 7 * C * CL + tiles + D + 2 * C;
  static constexpr int bytes = floats * 4;
};

template <int D>
__global__ void __launch_bounds__(256, 2) grad_kernel(Params p) {
  using Sm = GradSmem<D>;
  using F = Fac<D>;
  constexpr int LD = Sm::LD, NL = Sm::NL;
  constexpr int TPW = D / 64;  // 8-column tiles of a C x D accumulator per warp (8 warps)
  extern __shared__ float sm[];
  float* s = sm;
  const auto take = [&s](int n) {
    float* r = s;
    s += n;
    return r;
  };
  float *sW = take(C * LD), *sKd = take(C * LD), *sQg = take(C * LD), *sKi = take(C * LD), *sKg = take(C * LD),
        *sGam = take(C * LD);
  float *sP = take(C * CL), *sN = take(C * CL), *sBm = take(C * CL);
  float *sS = take(D * NL), *sdS = take(D * NL);
  float *sdO = take(C * NL), *sV = take(C * NL), *sU = take(C * NL), *sVt = take(C * NL), *sdVt = take(C * NL),
        *sdY = take(C * NL);
  float *sdQp = sS, *sdW = sdQp + C * LD, *sdKd = sdW + C * LD, *sdX = sdKd + C * LD, *sdG = sdX + C * LD;
  float *sdP = take(C * CL), *sdAY = take(C * CL), *sdA = take(C * CL), *sdB = take(C * CL);
  float *sdgL = take(D), *sdbY = take(C), *sdb = take(C);

  const int c = blockIdx.x, hv = blockIdx.y, n = blockIdx.z, tid = threadIdx.x, w = tid / 32, lane = tid % 32;
  int bos, len;
  long long slot0;
  seq_of<C>(p, n, bos, len, slot0);
  const int t0 = c * C;
  if (t0 >= len) return;  // uniform over the CTA
  const int L = min(C, len - t0), h = hv / p.group;
  const float scale = p.scale;
  const std::size_t sh = static_cast<std::size_t>(slot0 + c) * p.HV + hv;
  const float* f = p.fac + sh * F::size;
  const float* gS = p.Sst + sh * D * D;
  const float* gdS = p.dSst + sh * D * D;
  {  // W, Kd, Qg, the prepared k (into sKg for now) and gate (into sGam), rows past the sequence zero as in the factors
     // kernel; float4s (rows of D and of LD are multiples of 4 floats), every load issued before the first store
    constexpr int NE = C * D / 1024;
    float4 wv[NE], dv[NE], qv[NE], kv[NE], gv[NE];
#pragma unroll
    for (int u = 0; u < NE; ++u) {
      const int idx = 4 * tid + 1024 * u, r = idx / D, i = idx - r * D;
      wv[u] = ld4(f + F::W + idx);
      dv[u] = ld4(f + F::Kd + idx);
      qv[u] = ld4(f + F::Qg + idx);
      kv[u] = gv[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < L) {
        const int tau = bos + t0 + r;
        kv[u] = ld4(p.kn + (static_cast<std::size_t>(tau) * p.H + h) * D + i);
        gv[u] = ld4(p.gf + (static_cast<std::size_t>(tau) * p.HV + hv) * D + i);
      }
    }
#pragma unroll
    for (int u = 0; u < NE; ++u) {
      const int idx = 4 * tid + 1024 * u, r = idx / D, o = r * LD + idx - r * D;
      st4(sW + o, wv[u]);
      st4(sKd + o, dv[u]);
      st4(sQg + o, qv[u]);
      st4(sKg + o, kv[u]);
      st4(sGam + o, gv[u]);
    }
  }
  __syncthreads();
  if (tid < D) {  // Gam = e^G, G the cumulative log-decay of column tid (the factors kernel's operations, same bits)
    float G = 0.0f;
    for (int r = 0; r < C; ++r) {
      G += sGam[r * LD + tid];
      sGam[r * LD + tid] = expf(G);
    }
  }
  __syncthreads();
  for (int idx = tid; idx < C * D; idx += 256) {  // Kg = Gam k, Ki = k / Gam (same bits as the factors kernel)
    const int o = (idx / D) * LD + idx % D;
    const float gam = sGam[o], k = sKg[o];
    sKg[o] = gam * k;
    sKi[o] = k / gam;
  }
  {
    const int r = tid / C, s2 = tid % C;
    sP[r * CL + s2] = f[F::P + tid];
    sN[r * CL + s2] = f[F::N + tid];
    sBm[r * CL + s2] = f[F::B + tid];
  }
  if (tid < C) sdb[tid] = tid < L ? p.bf[static_cast<std::size_t>(bos + t0 + tid) * p.HV + hv] : 0.0f;  // beta
  // dO and V of the chunk's rows: row r is token t0 + r of one sequence, at element offset base + r * (token stride).
  // 16-byte loads: kda_backward accepts only 16-byte aligned v and dO with strides of multiples of 8 elements
  std::int64_t row_dO, row_v;
  const std::int64_t st_dO = p.sdo.t, st_v = p.sv.t;
  {
    int b, t;
    row_bt(p, bos + t0, b, t);
    row_dO = at(p.sdo, b, t, hv);
    row_v = at(p.sv, b, t, hv);
  }
  float accQ[TPW][4] = {}, accW[TPW][4] = {}, accK[TPW][4] = {}, accS[4] = {};  // accS: dP (warps 0, 1), dY U^T (2, 3)
  float dgl = 0.0f, dby = 0.0f;  // thread i < D: rowsum(dS S); thread r < C: rowsum(dY V)
  for (int j0 = 0; j0 < D; j0 += NT) {
    __syncthreads();
    {  // the S and dS tiles, and dO (threads 0-63) and V (64-127) as 4 lanes a token row of 8 bf16 columns (16
       // bytes) each, or U (128-255) as a float4 a thread: every load of the thread issued before its first store
      constexpr int NLD = D * NT / 1024;
      float4 a[NLD], b[NLD];
#pragma unroll
      for (int u = 0; u < NLD; ++u) {
        const int idx = 4 * tid + 1024 * u, i = idx / NT, cc = idx - i * NT;
        a[u] = ld4(gS + static_cast<std::size_t>(i) * D + j0 + cc);
        b[u] = ld4(gdS + static_cast<std::size_t>(i) * D + j0 + cc);
      }
      const int r = tid < 128 ? (tid & 63) >> 2 : (tid - 128) >> 3;
      const int c8 = 8 * (tid & 3), c4 = 4 * ((tid - 128) & 7);
      uint4 wd4 = make_uint4(0u, 0u, 0u, 0u);  // dO or V: bf16 element 2 m in the low half of word m; U: fp32 bits
      if (tid >= 128)
        wd4 = *reinterpret_cast<const uint4*>(f + F::U + r * D + j0 + c4);
      else if (r < L)
        wd4 = *reinterpret_cast<const uint4*>((tid < 64 ? p.dO + row_dO : p.v + row_v) + r * (tid < 64 ? st_dO : st_v) +
                                            j0 + c8);
#pragma unroll
      for (int u = 0; u < NLD; ++u) {
        const int idx = 4 * tid + 1024 * u, i = idx / NT, cc = idx - i * NT;
        st4(sS + i * NL + cc, a[u]);
        st4(sdS + i * NL + cc, b[u]);
      }
      if (tid < 128) {
        const std::uint32_t wd[4] = {wd4.x, wd4.y, wd4.z, wd4.w};
        float x[8];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          x[2 * m] = __uint_as_float(wd[m] << 16);
          x[2 * m + 1] = __uint_as_float(wd[m] & 0xffff0000u);
        }
        float* dst = (tid < 64 ? sdO : sV) + r * NL + c8;
        st4(dst, make_float4(x[0], x[1], x[2], x[3]));
        st4(dst + 4, make_float4(x[4], x[5], x[6], x[7]));
      } else {
        st4(sU + r * NL + c4, make_float4(__uint_as_float(wd4.x), __uint_as_float(wd4.y), __uint_as_float(wd4.z),
                                          __uint_as_float(wd4.w)));
      }
    }
    __syncthreads();
    if (w < NT / 8) {  // V~ = U - W S
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_x3<D>(d, sW, LD, 1, sS + 8 * w, NL, 1);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int o = frow(e) * NL + 8 * w + fcol(e);
        sVt[o] = sU[o] - d[e];
      }
    } else if (w < 2 * (NT / 8)) {  // dV~ = scale P^T dO + Kd dS
      const int n0 = 8 * (w - NT / 8);
      float d1[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_x3<C>(d1, sP, 1, CL, sdO + n0, NL, 1);
      mma_x3<D>(d2, sKd, LD, 1, sdS + n0, NL, 1);
#pragma unroll
      for (int e = 0; e < 4; ++e) sdVt[frow(e) * NL + n0 + fcol(e)] = scale * d1[e] + d2[e];
    }
    __syncthreads();
    if (w < NT / 8) {  // dY = N^T dV~
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_x3<C>(d, sN, 1, CL, sdVt + 8 * w, NL, 1);
#pragma unroll
      for (int e = 0; e < 4; ++e) sdY[frow(e) * NL + 8 * w + fcol(e)] = d[e];
    }
    // the sums over value columns with D outputs: warp w owns key columns 8 (w TPW + q) ..
#pragma unroll
    for (int q = 0; q < TPW; ++q) {
      const int n0 = 8 * (w * TPW + q);
      mma_x3<NT>(accQ[q], sdO, NL, 1, sS + n0 * NL, 1, NL);
      mma_x3<NT>(accW[q], sdVt, NL, 1, sS + n0 * NL, 1, NL);
      mma_x3<NT>(accK[q], sVt, NL, 1, sdS + n0 * NL, 1, NL);
    }
    if (tid < D)
      for (int cc = 0; cc < NT; ++cc) dgl += sdS[tid * NL + cc] * sS[tid * NL + cc];
    __syncthreads();
    if (w < 2) mma_x3<NT>(accS, sdO, NL, 1, sVt + 8 * w * NL, 1, NL);
    else if (w < 4) mma_x3<NT>(accS, sdY, NL, 1, sU + 8 * (w - 2) * NL, 1, NL);
    for (int idx = tid; idx < L * NT; idx += 256) {
      const int r = idx / NT, cc = idx - r * NT;
      const float br = sdb[r];
      p.dv[(static_cast<std::size_t>(bos + t0 + r) * p.HV + hv) * D + j0 + cc] = f2bf(br * sdY[r * NL + cc]);
    }
    if (tid < C)
      for (int cc = 0; cc < NT; ++cc) dby += sdY[tid * NL + cc] * sV[tid * NL + cc];
  }
  // the accumulators into shared memory (over the tiles: every warp done with them first)
  __syncthreads();
#pragma unroll
  for (int q = 0; q < TPW; ++q) {
    const int n0 = 8 * (w * TPW + q);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int o = frow(e) * LD + n0 + fcol(e);
      sdQp[o] = accQ[q][e];
      sdW[o] = -accW[q][e];
      sdKd[o] = accK[q][e];
    }
  }
  if (w < 4) {
    float* dst = w < 2 ? sdP + 8 * w : sdAY + 8 * (w - 2);
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[frow(e) * CL + fcol(e)] = accS[e];
  }
  if (tid < C) sdbY[tid] = dby;
  __syncthreads();
  // dP = scale Tril(dO V~^T); dX = N^T dW
  {
    const int r = tid / C, s2 = tid % C;
    sdP[r * CL + s2] = s2 <= r ? scale * sdP[r * CL + s2] : 0.0f;
  }
#pragma unroll
  for (int q = 0; q < TPW; ++q) {  // dX on mma: warp w owns the key columns 8 (w TPW + q) .. of every row
    const int n0 = 8 * (w * TPW + q);
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_x3<C>(x, sN, 1, CL, sdW + n0, LD, 1);
#pragma unroll
    for (int e = 0; e < 4; ++e) sdX[frow(e) * LD + n0 + fcol(e)] = x[e];
  }
  if (tid < D) {  // dgamL = rowsum(dS S) + colsum(Ki dKd)
    float x = dgl;
#pragma unroll
    for (int r = 0; r < C; ++r) x += sKi[r * LD + tid] * sdKd[r * LD + tid];
    sdgL[tid] = x;
  }
  __syncthreads();
  {  // dX W^T on mma, the key dimension in four quarters: warp w forms columns 8 (w & 1) .. of quarter w / 2 into a
     // C x C partial, in P, N, dA and dB (P and N are read no more; dA and dB are formed in place below)
    const int nt = w & 1, kq = w >> 1;
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_x3<D / 4>(a, sdX + kq * (D / 4), LD, 1, sW + 8 * nt * LD + kq * (D / 4), 1, LD);
    float* part = kq == 0 ? sP : kq == 1 ? sN : kq == 2 ? sdA : sdB;
#pragma unroll
    for (int e = 0; e < 4; ++e) part[frow(e) * CL + 8 * nt + fcol(e)] = a[e];
  }
  __syncthreads();
  {  // dA = -StrictTril(dX W^T + dY U^T) (the quarters summed in a fixed order), dB = Diag(beta) dA
    const int r = tid / C, s2 = tid % C, o = r * CL + s2;
    const float a = s2 < r ? -((((sP[o] + sN[o]) + sdA[o]) + sdB[o]) + sdAY[o]) : 0.0f;
    sdA[o] = a;
    sdB[o] = sdb[r] * a;
  }
  __syncthreads();
  // dbeta = rowsum(dA B) + rowsum(dX Kg) + rowsum(dY V): rows 2 w and 2 w + 1, the lanes over the key columns
  float dbr[2];
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int r = 2 * w + m;
    float x = lane < C ? sdA[r * CL + lane] * sBm[r * CL + lane] : 0.0f;
    for (int i = lane; i < D; i += 32) x += sdX[r * LD + i] * sKg[r * LD + i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    dbr[m] = x + sdbY[r];
  }
  __syncthreads();
#pragma unroll
  for (int q = 0; q < TPW; ++q) {  // the C x C x D products on mma, warp w owning key columns 8 (w TPW + q) ..
    const int n0 = 8 * (w * TPW + q);
    float mq[4] = {0.0f, 0.0f, 0.0f, 0.0f}, mi[4] = {0.0f, 0.0f, 0.0f, 0.0f}, mg[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_x3<C>(mq, sdP, CL, 1, sKi + n0, LD, 1);  // dP Ki
    mma_x3<C>(mi, sdP, 1, CL, sQg + n0, LD, 1);  // dP^T Qg
    mma_x3<C>(mi, sdB, 1, CL, sKg + n0, LD, 1);  //   + dB^T Kg
    mma_x3<C>(mg, sdB, CL, 1, sKi + n0, LD, 1);  // dB Ki
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {  // elements (2 e2, 2 e2 + 1): one row, two neighbouring key columns
      const int r = frow(2 * e2), i0 = n0 + fcol(2 * e2);
      const float br = sdb[r];
      float kk[2] = {0.0f, 0.0f}, qq[2] = {0.0f, 0.0f}, oq[2], ok[2];
      const int tau = bos + t0 + r;
      const std::size_t rk = (static_cast<std::size_t>(tau) * p.H + h) * D + i0;
      if (r < L) {
        const float2 k2 = *reinterpret_cast<const float2*>(p.kn + rk), q2 = *reinterpret_cast<const float2*>(p.qn + rk);
        kk[0] = k2.x; kk[1] = k2.y; qq[0] = q2.x; qq[1] = q2.y;
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int e = 2 * e2 + u, i = i0 + u;
        const float dqg = scale * sdQp[r * LD + i] + mq[e];
        const float dki = sdKd[r * LD + i] * sGam[(C - 1) * LD + i] + mi[e];
        const float dkg = mg[e] + br * sdX[r * LD + i];
        const float gam = sGam[r * LD + i];
        oq[u] = gam * dqg;
        ok[u] = gam * dkg + dki / gam;
        float dG = gam * (kk[u] * dkg + qq[u] * dqg) - sKi[r * LD + i] * dki;
        if (r == C - 1) dG += sGam[(C - 1) * LD + i] * sdgL[i];
        sdG[r * LD + i] = dG;
      }
      if (p.tail_in_grad) {  // into W's and Kd's places (read no more) for the tail below
        *reinterpret_cast<float2*>(sW + r * LD + i0) = make_float2(oq[0], oq[1]);
        *reinterpret_cast<float2*>(sKd + r * LD + i0) = make_float2(ok[0], ok[1]);
      } else if (r < L) {
        const std::size_t o = (static_cast<std::size_t>(tau) * p.HV + hv) * D + i0;
        *reinterpret_cast<float2*>(p.pq + o) = make_float2(oq[0], oq[1]);
        *reinterpret_cast<float2*>(p.pk + o) = make_float2(ok[0], ok[1]);
      }
    }
  }
  __syncthreads();
  if (tid < D) {  // dg: the suffix sums of dG over the chunk's rows (in dG's place for the tail, or as partials)
    float acc = 0.0f;
    for (int r = C - 1; r >= 0; --r) {
      acc += sdG[r * LD + tid];
      if (p.tail_in_grad) sdG[r * LD + tid] = acc;
      else if (r < L) p.pg[(static_cast<std::size_t>(bos + t0 + r) * p.HV + hv) * D + tid] = acc;
    }
  }
  if (!p.tail_in_grad) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int r = 2 * w + m;
      if (lane == 0 && r < L) p.pb[static_cast<std::size_t>(bos + t0 + r) * p.HV + hv] = dbr[m];
    }
    return;
  }
  // The tail (one value head a key head, so h == hv): the epilogue's chain rules on this chunk's rows, warp w taking
  // rows 2 w and 2 w + 1 with the epilogue's lane mapping (lane l: key columns l, l + 32, ..) and functions, so the
  // bits are the epilogue kernel's. Both rows' inputs are loaded before either row's stores (which the compiler may
  // not move loads across), so the two rows' round trips overlap.
  __syncthreads();
  constexpr int E = D / 32;
  KeyRowIn<D> kin[2];
  ValueRowIn<D> vin[2];
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int r = 2 * w + m;
    if (r < L) {  // uniform over the warp
      const int tau = bos + t0 + r;
      int b, t;
      row_bt(p, tau, b, t);
      load_key_row<D>(p, lane, static_cast<std::size_t>(tau) * p.H + h, kin[m]);
      load_value_row<D>(p, lane, b, t, hv, vin[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int r = 2 * w + m;
    if (r >= L) break;  // uniform over the warp
    const int tau = bos + t0 + r;
    float dq[E], dk[E], dg[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      dq[e] = sW[r * LD + lane + 32 * e];
      dk[e] = sKd[r * LD + lane + 32 * e];
      dg[e] = sdG[r * LD + lane + 32 * e];
    }
    finish_key_row<D>(p, lane, static_cast<std::size_t>(tau) * p.H + h, dq, dk, kin[m]);
    finish_value_row<D>(p, lane, static_cast<std::size_t>(tau) * p.HV + hv, dg, dbr[m], vin[m]);
  }
}

template <int D>
int fac_smem() {
  return (7 * C * (D + 4) + C * CL + C) * 4;
}
template <int D>
int fwd_smem() {
  return (D * (NC + 4) + 2 * C * (D + 4) + 6 * C * (NC + 4) + D) * 4;
}
template <int D>
int bwd_smem() {
  return (D * (NC + 4) + 3 * C * (D + 4) + C * CL + 6 * C * (NC + 4) + D) * 4;
}

template <class K>
void set_smem(K kernel, int bytes, const char* what) {
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
}

template <int D>
void launch_of(const Params& p, cudaStream_t stream, KdaBackwardPhase last, bool wg_chains) {
  const int max_len = p.cu ? p.max_len : p.T;  // host-known (KdaBackwardArgs::max_seqlen)
  const dim3 chunks((max_len + C - 1) / C, p.HV, p.N);
  set_smem(factors_kernel<D>, fac_smem<D>(), "cudaFuncSetAttribute (kda_backward factors)");
  factors_kernel<D><<<chunks, 256, fac_smem<D>(), stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_backward factors launch");
  if (last == KdaBackwardPhase::factors) return;
  const bool forward_only = last == KdaBackwardPhase::forward_chain;
  if (wg_chains) {  // D = 128 (kda_backward_plan refuses chunked_wg otherwise)
    launch_chains_wg(p, stream, forward_only);
  } else {
    const int chain_smem = std::max(fwd_smem<D>(), bwd_smem<D>());
    set_smem(chains_kernel<D>, chain_smem, "cudaFuncSetAttribute (kda_backward chains)");
    const dim3 chains((forward_only ? 1 : 2) * (D / NC) * p.HV, 1, p.N);
    chains_kernel<D><<<chains, 128, chain_smem, stream>>>(p, forward_only);
    cuda_check(cudaGetLastError(), "kda_backward chains launch");
  }
  if (last == KdaBackwardPhase::forward_chain || last == KdaBackwardPhase::reverse_chain) return;
  set_smem(grad_kernel<D>, GradSmem<D>::bytes, "cudaFuncSetAttribute (kda_backward gradients)");
  grad_kernel<D><<<chunks, 256, GradSmem<D>::bytes, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_backward gradients launch");
}

}  // namespace

std::size_t chunked_factor_floats(int D) { return D == 64 ? Fac<64>::size : Fac<128>::size; }

void launch_chunked(const Params& p, cudaStream_t stream, KdaBackwardPhase last, bool wg_chains) {
  if (p.D == 64) launch_of<64>(p, stream, last, false);
  else launch_of<128>(p, stream, last, wg_chains);
}

}  // namespace kdalab::kernels::kda_backward_detail
