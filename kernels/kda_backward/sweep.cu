// KDA backward, step 2: the forward and reverse sweeps over the recurrence (kernels/kda_backward.hpp), fp32.
//
// Work item = (sequence n, value head hv, column block cb of NC value columns); the recurrence is independent per
// value column, so an item needs nothing from the others. CTAs loop over the items (grid = the resident CTAs, which
// sizes the scratch). Warp w of the CTA holds S on rows i = lane + 32 r (r < R) and columns
// cb NC + w BV + [0, BV) in registers (R BV = 32 fp32), dS likewise.
//  - forward sweep: S from S0 through the sequence; S entering chunk c (64 tokens) stored at checkpoint slot0 + c.
//  - reverse sweep, chunks last first: S from the chunk's checkpoint; the states entering each 8-token sub-chunk
//    into scratch tiles 0..7; then per sub-chunk, last first: its 8 states S_{t-1} into tiles 8..15 and the reverse
//    steps over them (the oracle's step, reference/kda_backward.hpp kda_step_backward).
// The per-row sums over value columns (dq, dk, dg: one per key row and token) are summed over the CTA's warps in
// shared memory in warp order and written as this column block's fp32 partial; dbeta likewise. dv_t (a sum over key
// rows, complete within the warp) and dS0 are written directly.
// Each thread writes and later reads back only its own scratch and checkpoint elements (no cross-thread traffic).
#include <algorithm>

#include "kernels/kda_backward/common.cuh"

namespace kdalab::kernels::kda_backward_detail {
namespace {

/// Sum over the warp of each of n values, the same bits on every lane (xor butterfly: a + b == b + a).
template <int n>
__device__ __forceinline__ void warp_allsum(float (&x)[n]) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int j = 0; j < n; ++j) x[j] += __shfl_xor_sync(0xffffffffu, x[j], o);
}

template <int D>
struct Smem {
  using K = Cfg<D>;
  float* q;    // [SUB][D]
  float* k;    // [SUB][D]
  float* a;    // [SUB][D]  exp(g)
  float* v;    // [SUB][NC]
  float* dO;   // [SUB][NC]
  float* bt;   // [SUB]
  float* red;  // [W][3][D]
  float* redb; // [W]
  __device__ explicit Smem(float* s)
      : q(s), k(s + SUB * D), a(s + 2 * SUB * D), v(s + 3 * SUB * D), dO(s + 3 * SUB * D + SUB * K::NC),
        bt(s + 3 * SUB * D + 2 * SUB * K::NC), red(bt + 32), redb(red + K::W * 3 * D) {}
};

/// Loads tokens [bos + a0, bos + a0 + cnt) of (h, hv) and the CTA's columns into shared memory (q and dO only when
/// `grad`). Synchronises before (earlier readers) and after.
template <int D>
__device__ void load_tokens(const Params& p, const Smem<D>& s, int bos, int h, int hv, int cb, int a0, int cnt,
                            bool grad) {
  using K = Cfg<D>;
  __syncthreads();
  for (int idx = threadIdx.x; idx < cnt * D; idx += K::THREADS) {
    const int j = idx / D, i = idx - j * D, tau = bos + a0 + j;
    const std::size_t rk = (static_cast<std::size_t>(tau) * p.H + h) * D + i;
    s.k[idx] = p.kn[rk];
    if (grad) s.q[idx] = p.qn[rk];
    s.a[idx] = expf(p.gf[(static_cast<std::size_t>(tau) * p.HV + hv) * D + i]);
  }
  for (int idx = threadIdx.x; idx < cnt * K::NC; idx += K::THREADS) {
    const int j = idx / K::NC, c = idx - j * K::NC, tau = bos + a0 + j;
    int b, t;
    row_bt(p, tau, b, t);
    const int col = cb * K::NC + c;
    s.v[idx] = bf2f(p.v[at(p.sv, b, t, hv) + col]);
    if (grad) s.dO[idx] = bf2f(p.dO[at(p.sdo, b, t, hv) + col]);
  }
  if (threadIdx.x < cnt) s.bt[threadIdx.x] = p.bf[static_cast<std::size_t>(bos + a0 + threadIdx.x) * p.HV + hv];
  __syncthreads();
}

/// One forward step on token j of shared memory: S <- S' + beta k (v - S'^T k)^T, S' = Diag(a) S.
template <int D>
__device__ __forceinline__ void fwd_step(float (&S)[Cfg<D>::R][Cfg<D>::BV], const Smem<D>& s, int j, int warp,
                                         int lane) {
  using K = Cfg<D>;
  float u[K::BV];
#pragma unroll
  for (int c = 0; c < K::BV; ++c) u[c] = 0.0f;
#pragma unroll
  for (int r = 0; r < K::R; ++r) {
    const float ar = s.a[j * D + lane + 32 * r], kr = s.k[j * D + lane + 32 * r];
#pragma unroll
    for (int c = 0; c < K::BV; ++c) {
      S[r][c] *= ar;
      u[c] += kr * S[r][c];
    }
  }
  warp_allsum(u);
  const float beta = s.bt[j];
#pragma unroll
  for (int c = 0; c < K::BV; ++c) u[c] = beta * (s.v[j * K::NC + warp * K::BV + c] - u[c]);
#pragma unroll
  for (int r = 0; r < K::R; ++r) {
    const float kr = s.k[j * D + lane + 32 * r];
#pragma unroll
    for (int c = 0; c < K::BV; ++c) S[r][c] += kr * u[c];
  }
}

/// One reverse step on token j of shared memory (token row tau): S holds S_{t-1} (consumed), dS holds dL/dS_t on
/// entry and dL/dS_{t-1} on exit. Writes dv, and the column block's partial dq, dk, dg, dbeta.
template <int D>
__device__ __forceinline__ void bwd_step(const Params& p, float (&S)[Cfg<D>::R][Cfg<D>::BV],
                                         float (&dS)[Cfg<D>::R][Cfg<D>::BV], const Smem<D>& s, int j, int tau, int hv,
                                         int cb, int warp, int lane) {
  using K = Cfg<D>;
  const float beta = s.bt[j], scale = p.scale;
  const float* dOj = s.dO + j * K::NC + warp * K::BV;
  // u = S'^T k and Gk = G^T k, G = dS + scale q dO^T
  float red2[2 * K::BV];
#pragma unroll
  for (int c = 0; c < 2 * K::BV; ++c) red2[c] = 0.0f;
#pragma unroll
  for (int r = 0; r < K::R; ++r) {
    const int i = j * D + lane + 32 * r;
    const float ar = s.a[i], kr = s.k[i], sq = scale * s.q[i];
#pragma unroll
    for (int c = 0; c < K::BV; ++c) {
      red2[c] += kr * (ar * S[r][c]);
      red2[K::BV + c] += kr * (dS[r][c] + sq * dOj[c]);
    }
  }
  warp_allsum(red2);
  float delta[K::BV], gk[K::BV];
#pragma unroll
  for (int c = 0; c < K::BV; ++c) {
    delta[c] = s.v[j * K::NC + warp * K::BV + c] - red2[c];
    gk[c] = red2[K::BV + c];
  }
  // dv_t = beta G^T k (complete: the sum over all key rows)
  {
    bf16_t* dv = p.dv + (static_cast<std::size_t>(tau) * p.HV + hv) * D + cb * K::NC + warp * K::BV;
#pragma unroll
    for (int c = 0; c < K::BV; ++c)
      if (lane == c) dv[c] = f2bf(beta * gk[c]);
  }
  float dbeta = 0.0f;
  float* red = s.red + warp * 3 * D;
#pragma unroll
  for (int r = 0; r < K::R; ++r) {
    const int i = lane + 32 * r;
    const float ar = s.a[j * D + i], kr = s.k[j * D + i], sq = scale * s.q[j * D + i];
    float dq = 0.0f, gd = 0.0f, sgk = 0.0f, dg = 0.0f;
#pragma unroll
    for (int c = 0; c < K::BV; ++c) {
      const float sp = ar * S[r][c];               // S'
      const float st = sp + beta * kr * delta[c];  // S_t
      dq += st * dOj[c];
      const float G = dS[r][c] + sq * dOj[c];
      gd += G * delta[c];
      sgk += sp * gk[c];
      const float dsp = G - beta * kr * gk[c];  // dS'
      dg += dsp * sp;
      dS[r][c] = ar * dsp;
    }
    red[i] = scale * dq;
    red[D + i] = beta * (gd - sgk);
    red[2 * D + i] = dg;
    dbeta += kr * gd;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) dbeta += __shfl_xor_sync(0xffffffffu, dbeta, o);
  if (lane == 0) s.redb[warp] = dbeta;
  __syncthreads();
  const int tid = threadIdx.x;
  if (tid < D) {
    float aq = 0.0f, ak = 0.0f, ag = 0.0f;
#pragma unroll
    for (int w = 0; w < K::W; ++w) {
      aq += s.red[w * 3 * D + tid];
      ak += s.red[w * 3 * D + D + tid];
      ag += s.red[w * 3 * D + 2 * D + tid];
    }
    const std::size_t o = ((static_cast<std::size_t>(cb) * p.M + tau) * p.HV + hv) * D + tid;
    p.pq[o] = aq;
    p.pk[o] = ak;
    p.pg[o] = ag;
  }
  if (tid == 0) {
    float ab = 0.0f;
#pragma unroll
    for (int w = 0; w < K::W; ++w) ab += s.redb[w];
    p.pb[(static_cast<std::size_t>(cb) * p.M + tau) * p.HV + hv] = ab;
  }
  __syncthreads();
}

template <int D>
__global__ void __launch_bounds__(Cfg<D>::THREADS) sweep_kernel(Params p) {
  using K = Cfg<D>;
  extern __shared__ float smem[];
  const Smem<D> s(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int items = p.N * p.HV * K::P;
  float* scr = p.scratch + static_cast<std::size_t>(blockIdx.x) * SCRATCH_TILES * K::TILE;
  // element (r, c) of this thread in a CTA tile (scratch, checkpoints): coalesced over the lanes
  const int toff = warp * 32 * K::R * K::BV + lane;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int cb = item % K::P, hv = (item / K::P) % p.HV, n = item / (K::P * p.HV);
    const int h = hv / p.group;
    int bos, len;
    long long slot0;
    seq_of(p, n, bos, len, slot0);
    const int nch = (len + CK - 1) / CK;
    const int col0 = cb * K::NC + warp * K::BV;
    const std::size_t st_base = (static_cast<std::size_t>(n) * p.HV + hv) * D * D;  // S0, dS_T, dS0
    float S[K::R][K::BV], dS[K::R][K::BV];
    const auto ckpt_of = [&](int c) {
      return p.ckpt + (static_cast<std::size_t>(slot0 + c) * p.HV + hv) * D * D +
             static_cast<std::size_t>(cb) * K::TILE;
    };
    const auto store = [&](float* tile) {
#pragma unroll
      for (int r = 0; r < K::R; ++r)
#pragma unroll
        for (int c = 0; c < K::BV; ++c) tile[toff + (r * K::BV + c) * 32] = S[r][c];
    };
    const auto load = [&](const float* tile) {
#pragma unroll
      for (int r = 0; r < K::R; ++r)
#pragma unroll
        for (int c = 0; c < K::BV; ++c) S[r][c] = tile[toff + (r * K::BV + c) * 32];
    };

    // forward sweep: the checkpoints
#pragma unroll
    for (int r = 0; r < K::R; ++r)
#pragma unroll
      for (int c = 0; c < K::BV; ++c)
        S[r][c] = p.S0 ? p.S0[st_base + static_cast<std::size_t>(lane + 32 * r) * D + col0 + c] : 0.0f;
    for (int ch = 0; ch < nch; ++ch) {
      store(ckpt_of(ch));
      if (ch + 1 == nch) break;
      for (int m = 0; m < CK / SUB; ++m) {
        load_tokens<D>(p, s, bos, h, hv, cb, ch * CK + m * SUB, SUB, false);
        for (int j = 0; j < SUB; ++j) fwd_step<D>(S, s, j, warp, lane);
      }
    }

    // reverse sweep
#pragma unroll
    for (int r = 0; r < K::R; ++r)
#pragma unroll
      for (int c = 0; c < K::BV; ++c)
        dS[r][c] = p.dS_T ? p.dS_T[st_base + static_cast<std::size_t>(lane + 32 * r) * D + col0 + c] : 0.0f;
    for (int ch = nch - 1; ch >= 0; --ch) {
      const int t0 = ch * CK, t1 = min(len, t0 + CK), nsub = (t1 - t0 + SUB - 1) / SUB;
      load(ckpt_of(ch));
      for (int m = 0; m < nsub; ++m) {
        store(scr + m * K::TILE);
        if (m + 1 == nsub) break;
        load_tokens<D>(p, s, bos, h, hv, cb, t0 + m * SUB, SUB, false);
        for (int j = 0; j < SUB; ++j) fwd_step<D>(S, s, j, warp, lane);
      }
      for (int m = nsub - 1; m >= 0; --m) {
        const int a0 = t0 + m * SUB, cnt = min(SUB, t1 - a0);
        load(scr + m * K::TILE);
        load_tokens<D>(p, s, bos, h, hv, cb, a0, cnt, true);
        for (int j = 0; j < cnt; ++j) {
          store(scr + (CK / SUB + j) * K::TILE);
          if (j + 1 < cnt) fwd_step<D>(S, s, j, warp, lane);
        }
        for (int j = cnt - 1; j >= 0; --j) {
          load(scr + (CK / SUB + j) * K::TILE);
          bwd_step<D>(p, S, dS, s, j, bos + a0 + j, hv, cb, warp, lane);
        }
      }
    }
    if (p.dS0) {
#pragma unroll
      for (int r = 0; r < K::R; ++r)
#pragma unroll
        for (int c = 0; c < K::BV; ++c)
          p.dS0[st_base + static_cast<std::size_t>(lane + 32 * r) * D + col0 + c] = dS[r][c];
    }
  }
}

template <int D>
int resident_of() {
  using K = Cfg<D>;
  const int smem = K::SMEM_FLOATS * 4;
  cuda_check(cudaFuncSetAttribute(sweep_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute (kda_backward sweep)");
  int per_sm = 0, dev = 0, sms = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sweep_kernel<D>, K::THREADS, smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  return std::max(1, per_sm) * sms;
}

template <int D>
void launch_of(const Params& p, int grid, cudaStream_t stream) {
  using K = Cfg<D>;
  const int smem = K::SMEM_FLOATS * 4;
  cuda_check(cudaFuncSetAttribute(sweep_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute (kda_backward sweep)");
  sweep_kernel<D><<<grid, K::THREADS, smem, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_backward sweep launch");
}

}  // namespace

int sweep_resident_ctas(int D) {
  switch (D) {
    case 64: return resident_of<64>();
    case 128: return resident_of<128>();
    default: return resident_of<256>();
  }
}

void launch_sweep(const Params& p, int grid, cudaStream_t stream) {
  switch (p.D) {
    case 64: launch_of<64>(p, grid, stream); break;
    case 128: launch_of<128>(p, grid, stream); break;
    default: launch_of<256>(p, grid, stream); break;
  }
}

}  // namespace kdalab::kernels::kda_backward_detail
