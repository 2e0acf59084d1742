#pragma once
// The phases of the KDA prepare (kda_prepare_kernel, kernels/kda_prefill/prepare.cu), each a __forceinline__
// function: the load with the fused gate / L2Norm / beta sigmoid, the cumulative decay and the gated q / k forms, the
// tf32 3-pass products A = Kg Ki^T and P = Qg Ki^T with their fixed-order sum over 8 warps, the forward substitution
// of [W | U], and the bf16 A / B fragment stores; also the sequence span (Seq, seq_of) of every prefill kernel.
// Algorithm: numerics/kda_twin.hpp (kda_plan_kernel()), K3 report Eq. 1 (KDA recurrence) in its chunked UT form
// (docs/equations.md section 4) and Eq. 5 (bounded gate, section 2). The functions were cut out of the kernels as
// written (same operations, same order: unchanged normalised PTX; ap_finish's index type and store_Pf's STRIDE exist
// for that). A chunk is 16 tokens (C); "thread = channel" phases run on threads 0 .. D-1 of a 256-thread group.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/kda_math.cuh"

namespace kdalab::kernels::detail::prep {

constexpr int C = 16;  // chunk (tokens)

/// One sequence of a batch as the prefill kernels see it: batch index bidx (0 with cu_seqlens), first token bos,
/// length len (tokens), first workspace slot slot0.
struct Seq {
  int bidx, bos, len;
  long long slot0;
};
/// Sequence n (of num_seqs with cu_seqlens p.cu, else of the B fixed-length ones of p.T tokens) for workspace
/// slots of TOK tokens: with cu_seqlens, slot0 = n + bos / TOK, which leaves ceil(len / TOK) slots per sequence;
/// else slot0 = n (p.*NFIXED), NFIXED the member holding ceil(T / TOK) (read only on that branch).
template <int TOK, auto NFIXED, class Prm>
__device__ __forceinline__ Seq seq_of(const Prm& p, int n) {
  Seq s;
  if (p.cu) {
    s.bidx = 0;
    s.bos = p.cu[n];
    s.len = p.cu[n + 1] - s.bos;
    s.slot0 = static_cast<long long>(n) + s.bos / TOK;
  } else {
    s.bidx = n;
    s.bos = 0;
    s.len = p.T;
    s.slot0 = static_cast<long long>(n) * (p.*NFIXED);
  }
  return s;
}

/// L2Norm of q and k (q / ||q||, k / ||k||; K3 report, the fused q/k normalisation) for a row of channels spread
/// over 16 consecutive lanes, N channels per lane: the squared norms reduced over the 16 lanes by xor shuffles
/// (offsets 8, 4, 2, 1), then scaled by inv_l2norm (rsqrtf; 0 for a zero row); a row whose squared norm overflows or
/// underflows is reduced again at a power-of-two scale (l2norm_rescale). Every lane of the warp calls it.
template <int N>
__device__ __forceinline__ void l2norm_row16(float (&fq)[N], float (&fk)[N]) {
  float nq = 0, nk = 0;
#pragma unroll
  for (int e = 0; e < N; ++e) { nq += fq[e] * fq[e]; nk += fk[e] * fk[e]; }
#pragma unroll
  for (int m = 8; m >= 1; m >>= 1) {
    nq += __shfl_xor_sync(0xffffffffu, nq, m);
    nk += __shfl_xor_sync(0xffffffffu, nk, m);
  }
  float iq = inv_l2norm(nq), ik = inv_l2norm(nk);
  const float sq = l2norm_rescale(nq), sk = l2norm_rescale(nk);
  // a row's squared norm out of fp32's safe range (overflow or underflow): every lane repeats the reduction on the
  // rows scaled by their power of two (1 for the ordinary rows, which get the same bits again); warp-uniform branch
  if (__any_sync(0xffffffffu, sq != 1.0f || sk != 1.0f)) {
    nq = 0;
    nk = 0;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float a = fq[e] * sq, c = fk[e] * sk;
      nq += a * a;
      nk += c * c;
    }
#pragma unroll
    for (int m = 8; m >= 1; m >>= 1) {
      nq += __shfl_xor_sync(0xffffffffu, nq, m);
      nk += __shfl_xor_sync(0xffffffffu, nk, m);
    }
    iq = inv_l2norm(nq) * sq;
    ik = inv_l2norm(nk) * sk;
  }
#pragma unroll
  for (int e = 0; e < N; ++e) { fq[e] *= iq; fk[e] *= ik; }
}

/// Threads ltid < 16: sBeta[ltid] = beta of token sq.bos + t0 + ltid, value head hv (bf16 input; its Sigmoid when
/// p.beta_sigmoid), 0 for rows ltid >= nvalid (past the sequence end).
template <class Prm>
__device__ __forceinline__ void load_beta(const Prm& p, const Seq& sq, int t0, int nvalid, int hv, int ltid,
                                          float* sBeta) {
  if (ltid < C) {
    float b = 0.0f;
    if (ltid < nvalid) {
      const long long tt = sq.bos + t0 + ltid;
      b = beta_of(bf2f(p.beta[sq.bidx * p.sbeta.b + tt * p.sbeta.t + hv * p.sbeta.h]), p.beta_sigmoid);
    }
    sBeta[ltid] = b;
  }
}

/// Load and fusions, thread ltid (0..255) of a 256-thread group = (row r = ltid / 16, j = ltid % 16): reads
/// q, k (query/key head h) and v, g (value head hv) of token sq.bos + t0 + r, channels 4 j + 64 hf .. + 3
/// (hf < D / 64; 8-byte loads of bf16), zeros for rows r >= nvalid; L2Norm of q and k over the row (p.l2norm:
/// the 16 threads of the row reduce by shuffles), the K3 bounded gate on g (p.fuse_gate: A_log[hv], bias[hv];
/// K3 report Eq. 5); stores the rows as fp32 into sQ, sK, sV and sKi (g), each [16][D + 4] in shared memory;
/// threads ltid < 16 write sBeta[ltid] = beta (sigmoid when p.beta_sigmoid; 0 past nvalid).
/// Prm: the kernel's parameters (q, k, v, g, beta, strides sq/sk/sv/sg/sbeta, A_log, bias, g_min, the three
/// fusion switches). No errors (inputs checked by the host).
template <int D, class Prm>
__device__ __forceinline__ void load_fuse(const Prm& p, const Seq& sq, int t0, int nvalid, int h, int hv, int ltid,
                                          float (*sQ)[D + 4], float (*sK)[D + 4], float (*sV)[D + 4],
                                          float (*sKi)[D + 4], float* sBeta) {
  constexpr int NHF = D / 64;  // 64-channel blocks a loading thread covers (4 channels each)
  const int r = ltid / 16, j = ltid % 16;
  const bool ok = r < nvalid;
  const long long t = sq.bos + t0 + r;
  float fq[4 * NHF], fk[4 * NHF], fv[4 * NHF], fg[4 * NHF];  // [4 hf + e] = channel 4j + 64 hf + e
  if (ok) {
    // one row pointer per tensor (its 64-bit offset formed once), the 64-channel blocks at immediate offsets (with
    // the sum with cc inside, the compiler forms each block's 64-bit address anew)
    const bf16_t* qr = p.q + (sq.bidx * p.sq.b + t * p.sq.t + h * p.sq.h) + 4 * j;
    const bf16_t* kr = p.k + (sq.bidx * p.sk.b + t * p.sk.t + h * p.sk.h) + 4 * j;
    const bf16_t* vr = p.v + (sq.bidx * p.sv.b + t * p.sv.t + hv * p.sv.h) + 4 * j;
    const bf16_t* gr = p.g + (sq.bidx * p.sg.b + t * p.sg.t + hv * p.sg.h) + 4 * j;
#pragma unroll
    for (int hf = 0; hf < NHF; ++hf) {
      unpack4(*reinterpret_cast<const uint2*>(qr + 64 * hf), fq + 4 * hf);
      unpack4(*reinterpret_cast<const uint2*>(kr + 64 * hf), fk + 4 * hf);
      unpack4(*reinterpret_cast<const uint2*>(vr + 64 * hf), fv + 4 * hf);
      unpack4(*reinterpret_cast<const uint2*>(gr + 64 * hf), fg + 4 * hf);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 4 * NHF; ++e) fq[e] = fk[e] = fv[e] = fg[e] = 0.0f;
  }
  if (p.l2norm) l2norm_row16(fq, fk);
  if (p.fuse_gate && ok) {
    const float ea = expf(p.A_log[hv]);
#pragma unroll
    for (int hf = 0; hf < NHF; ++hf) {
      const float4 b = *reinterpret_cast<const float4*>(p.bias + hv * D + 4 * j + 64 * hf);
      const float bb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) fg[4 * hf + e] = k3_gate(fg[4 * hf + e], ea, bb[e], p.g_min);
    }
  }
#pragma unroll
  for (int hf = 0; hf < NHF; ++hf) {
    const int cc = 4 * j + 64 * hf, o = 4 * hf;
    *reinterpret_cast<float4*>(&sQ[r][cc]) = make_float4(fq[o], fq[o + 1], fq[o + 2], fq[o + 3]);
    *reinterpret_cast<float4*>(&sK[r][cc]) = make_float4(fk[o], fk[o + 1], fk[o + 2], fk[o + 3]);
    *reinterpret_cast<float4*>(&sV[r][cc]) = make_float4(fv[o], fv[o + 1], fv[o + 2], fv[o + 3]);
    *reinterpret_cast<float4*>(&sKi[r][cc]) = make_float4(fg[o], fg[o + 1], fg[o + 2], fg[o + 3]);
  }
  load_beta(p, sq, t0, nvalid, hv, ltid, sBeta);
}

/// Thread = channel i: the cumulative decay gam[r] = exp(G_r), G_r = g[0][i] + .. + g[r][i] (fp32, in row order),
/// from sG = the [16][DP] tile holding g (rows past the sequence end carry g = 0: gam stays). Returns
/// gam_n = gam[C - 1]. exp by fast_exp (kernels/common/kda_math.cuh).
template <int DP>
__device__ __forceinline__ float decay_gamma(float (*sG)[DP], int i, float (&gam)[C]) {
  float G = 0.0f;
#pragma unroll
  for (int r = 0; r < C; ++r) {
    G += sG[r][i];
    gam[r] = fast_exp(G);
  }
  return gam[C - 1];
}

/// Thread = channel i, after decay_gamma: Qg = q gam (into sQ and qg), Kg = k gam (into sK), Ki = k / gam (into
/// sKi, over g), Kd = k gam_n / gam (into kd), row by row. One fast reciprocal of gam (MUFU.RCP, <= 1 ulp;
/// gam >= exp(16 g_min) = 1.8e-35 is a normal number) instead of two IEEE divisions (k / gam, gn / gam: ~9
/// instructions and a slow-path branch each): Ki and Kd are within ~2 ulp of the divisions' results.
template <int DP>
__device__ __forceinline__ void decay_apply(float (*sQ)[DP], float (*sK)[DP], float (*sKi)[DP], int i,
                                            const float (&gam)[C], float gn, float (&qg)[C], float (&kd)[C]) {
#pragma unroll
  for (int r = 0; r < C; ++r) {
    const float kk = sK[r][i];
    const float rg = __fdividef(1.0f, gam[r]);
    qg[r] = sQ[r][i] * gam[r];
    sQ[r][i] = qg[r];
    sK[r][i] = kk * gam[r];
    sKi[r][i] = kk * rg;
    kd[r] = kk * (gn * rg);
  }
}

/// One warp's share of A = Kg Ki^T and P = Qg Ki^T (16 x 16 each) over channels [c0, c0 + 8 NKS): tf32 3-pass
/// mma.m16n8k8 (a_lo b_hi + a_hi b_lo + a_hi b_hi, fp32 accumulation), lane = 4 g + t. Adds into
/// acc[A | P][n-tile: columns 8 nt ..][C fragment]. sK = Kg, sQ = Qg, sKi = Ki, each [16][DP].
template <int NKS, int DP>
__device__ __forceinline__ void ap_mma(float (*sK)[DP], float (*sQ)[DP], float (*sKi)[DP], int c0, int g, int t,
                                       float (&acc)[2][2][4]) {
#pragma unroll
  for (int ks = 0; ks < NKS; ++ks) {
    const int cb = c0 + 8 * ks + t;
    std::uint32_t kh[4], kl[4], qh[4], ql[4];
    split_tf32(sK[g][cb], kh[0], kl[0]);
    split_tf32(sK[g + 8][cb], kh[1], kl[1]);
    split_tf32(sK[g][cb + 4], kh[2], kl[2]);
    split_tf32(sK[g + 8][cb + 4], kh[3], kl[3]);
    split_tf32(sQ[g][cb], qh[0], ql[0]);
    split_tf32(sQ[g + 8][cb], qh[1], ql[1]);
    split_tf32(sQ[g][cb + 4], qh[2], ql[2]);
    split_tf32(sQ[g + 8][cb + 4], qh[3], ql[3]);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      std::uint32_t bh[2], bl[2];  // B[k][s] = Ki[s][k]
      split_tf32(sKi[8 * nt + g][cb], bh[0], bl[0]);
      split_tf32(sKi[8 * nt + g][cb + 4], bh[1], bl[1]);
      mma_tf32(acc[0][nt], kl, bh);
      mma_tf32(acc[0][nt], kh, bl);
      mma_tf32(acc[0][nt], kh, bh);
      mma_tf32(acc[1][nt], ql, bh);
      mma_tf32(acc[1][nt], qh, bl);
      mma_tf32(acc[1][nt], qh, bh);
    }
  }
}

/// After ap_mma: warp w's partial A / P tiles to red[256 w + slot], slot = ((pr 2 + nt) 2 + hf) 32 + lane, as
/// float2 (columns s0, s0 + 1 of rows g + 8 hf); red: 8 x 256 float2 of shared memory no longer read.
__device__ __forceinline__ void ap_store_partial(float2* red, int w, int lane, const float (&acc)[2][2][4]) {
#pragma unroll
  for (int pr = 0; pr < 2; ++pr)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        red[w * 256 + ((pr * 2 + nt) * 2 + hf) * 32 + lane] = make_float2(acc[pr][nt][2 * hf], acc[pr][nt][2 * hf + 1]);
}

/// After every warp's ap_store_partial and a __syncthreads(), thread s (0..255) sums fragment slot s over the 8
/// warps in fixed order (warp 0, 1, .., 7): product pr = s / 128, n-tile nt, rows r = g + 8 hf, columns
/// s0 = 8 nt + 2 t, s0 + 1 (lane = 4 g + t). A = StrictLower(Diag(beta) Kg Ki^T) goes to sA; P = Lower(Qg Ki^T)
/// (p0, p1) to store_p(r, s0, nt, hf, p0, p1), the kernel's own P layout. I: int or unsigned, the type in which
/// s / 32 is formed (the prepare passes its int tid; the type changes the generated index arithmetic).
template <class I, class StoreP>
__device__ __forceinline__ void ap_finish(const float2* red, I s, int g, int t, float (*sA)[C], const float* sBeta,
                                          StoreP&& store_p) {
  float2 sum = red[s];
#pragma unroll
  for (int k = 1; k < 8; ++k) {
    const float2 x = red[k * 256 + s];
    sum.x += x.x;
    sum.y += x.y;
  }
  const int idx = s / 32, pr = idx / 4, nt = (idx / 2) & 1, hf = idx & 1;
  const int r = g + 8 * hf, s0 = 8 * nt + 2 * t;
  if (pr == 0) {
    const float b = sBeta[r];
    *reinterpret_cast<float2*>(&sA[r][s0]) = make_float2(s0 < r ? b * sum.x : 0.0f, s0 + 1 < r ? b * sum.y : 0.0f);
  } else {
    const float p0 = s0 <= r ? sum.x : 0.0f, p1 = s0 + 1 <= r ? sum.y : 0.0f;
    store_p(r, s0, nt, hf, p0, p1);
  }
}

/// P (two fp32 values p0, p1 of rows g + 8 hf, columns 8 nt + 2 t, + 1 of a 16 x 16 block) as hi + lo bf16 A
/// fragments into the 1024-byte block at pf = slot + off + STRIDE idx (hi: 32 lanes x 16 B, then lo at pf + 512):
/// word 4 lane + 2 nt + hf of each half. (STRIDE idx is formed here, after the split, as the kernels' inline code did.)
template <int STRIDE = 1024>
__device__ __forceinline__ void store_Pf(unsigned char* slot, int off, int idx, int lane, int nt, int hf, float p0,
                                         float p1) {
  std::uint32_t hi, lo;
  split_bf16(p0, p1, hi, lo);
  unsigned char* pf = slot + off + STRIDE * idx;
  reinterpret_cast<std::uint32_t*>(pf)[lane * 4 + nt * 2 + hf] = hi;
  reinterpret_cast<std::uint32_t*>(pf + 512)[lane * 4 + nt * 2 + hf] = lo;
}

/// Thread = column col of [W | U] = (I + A)^{-1} [Diag(beta) Kg | Diag(beta) V] (col < D: W from sK = Kg;
/// D <= col < 2 D: U from sV), by fp32 forward substitution row by row: x[r] = beta_r X[r][col] -
/// sum_{s < r} A[r][s] x[s], s in increasing order, the A row read as float4 broadcasts.
template <int D, int DP>
__device__ __forceinline__ void subst(float (&x)[C], const float* sBeta, float (*sK)[DP], float (*sV)[DP],
                                      float (*sA)[C], int col) {
#pragma unroll
  for (int r = 0; r < C; ++r) {
    float acc = sBeta[r] * (col < D ? sK[r][col] : sV[r][col - D]);
    const float4* ar = reinterpret_cast<const float4*>(&sA[r][0]);
#pragma unroll
    for (int m = 0; m < C / 4; ++m) {
      if (4 * m < r) {
        const float4 a4 = ar[m];
        const float av[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (4 * m + e < r) acc -= av[e] * x[4 * m + e];
      }
    }
    x[r] = acc;
  }
}

/// Thread = channel i (0..127, whole warps) holding the column X[r] = M[r][i] of a 16 x 128 matrix M:
/// writes M as the bf16 A fragments of mma.m16n8k16 that kda_prepare_kernel writes (uint4 (kt, lane =
/// 4 g + tq) = {(g, c0), (g + 8, c0), (g, c0 + 8), (g + 8, c0 + 8)} column pairs, c0 = 16 kt + 2 tq,
/// column c0 in the low half). Channels i and i ^ 1 swap 8 values; the even one writes rows g = 0..3,
/// the odd one g = 4..7 (8-byte stores).
__device__ __forceinline__ void store_afrag_col(uint4* frag, const float (&X)[C], int i) {
  const int par = i & 1, kt = i / 16, hh = (i % 16) / 8, tq = (i % 8) / 2;
#pragma unroll
  for (int gg = 0; gg < 4; ++gg) {
    // send the partner its rows (4 (1 - par) + gg, + 8), receive mine (4 par + gg, + 8) of its channel
    const float s0 = par ? X[gg] : X[gg + 4], s1 = par ? X[gg + 8] : X[gg + 12];
    const float y0 = __shfl_xor_sync(0xffffffffu, s0, 1), y1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    const float x0 = par ? X[gg + 4] : X[gg], x1 = par ? X[gg + 12] : X[gg + 8];
    const std::uint32_t w0 = par ? pack_bf16(y0, x0) : pack_bf16(x0, y0);  // even channel in the low half
    const std::uint32_t w1 = par ? pack_bf16(y1, x1) : pack_bf16(x1, y1);
    const int g = 4 * par + gg;
    reinterpret_cast<uint2*>(frag + kt * 32 + g * 4 + tq)[hh] = make_uint2(w0, w1);
  }
}

/// Thread = channel n holding X[r] = Kd[r][n]: writes the bf16 B fragments of mma.m16n8k16 (k = chunk
/// row, n = key channel) that kda_prepare_kernel writes: uint4 (kt, lane = 4 gq + tq) =
/// {(2tq, 2tq+1) @ n0, (2tq+8, 2tq+9) @ n0, the same @ n0 + 8}, n0 = 16 kt + gq.
__device__ __forceinline__ void store_bfrag_col(uint4* frag, const float (&X)[C], int n) {
  const int kt = n / 16, gq = n % 8, hh = (n % 16) / 8;
#pragma unroll
  for (int tq = 0; tq < 4; ++tq)
    reinterpret_cast<uint2*>(frag + kt * 32 + gq * 4 + tq)[hh] =
        make_uint2(pack_bf16(X[2 * tq], X[2 * tq + 1]), pack_bf16(X[2 * tq + 8], X[2 * tq + 9]));
}

/// Thread = channel i (whole warps, i < N) holding the column X[r] = M[r][i] of a 16 x N matrix M: writes M row-major
/// in bf16 (F16: fp16) (M[r][i] at m[r N + i]), the layout the wgmma state step (kda_state_wg_kernel) copies into its
/// swizzled shared-memory tiles. Channels i and i ^ 1 swap 8 values; the even one writes rows 0..7, the odd one rows
/// 8..15, each as 4-byte words (M[r][i & ~1], M[r][i | 1]).
template <int N, bool F16 = false>
__device__ __forceinline__ void store_rowmajor_col(std::uint16_t* m, const float (&X)[C], int i) {
  const auto pack = [](float a, float b) { return F16 ? pack_f16(a, b) : pack_bf16(a, b); };
  const int par = i & 1;
#pragma unroll
  for (int rr = 0; rr < 8; ++rr) {
    // (selects on compile-time indices: a run-time index into X would put it in local memory)
    const float mine = par ? X[rr + 8] : X[rr], send = par ? X[rr] : X[rr + 8];
    const float y = __shfl_xor_sync(0xffffffffu, send, 1);  // the partner's value at my row
    const std::uint32_t w = par ? pack(y, mine) : pack(mine, y);  // even channel in the low half
    *reinterpret_cast<std::uint32_t*>(m + (par ? rr + 8 : rr) * N + (i & ~1)) = w;
  }
}

/// store_rowmajor_col of X's fp16 hi parts into `hi` and of its lo parts as e4m3 of (x - hi) 2^kda_kd_lo_e4m3_shift
/// into `lo8` (one byte per value, row-major [C][N] bytes): the accurate precision's Kd, its lo region at 2 KB a chunk
/// (numerics/kda_twin.hpp kd_lo_e4m3); one exchange of the fp32 values for both (split_f16_e4m3 on the pair each
/// thread stores).
template <int N>
__device__ __forceinline__ void store_rowmajor_col_hi_lo8(std::uint16_t* hi, unsigned char* lo8, const float (&X)[C],
                                                          int i) {
  const int par = i & 1;
#pragma unroll
  for (int rr = 0; rr < 8; ++rr) {
    const float mine = par ? X[rr + 8] : X[rr], send = par ? X[rr] : X[rr + 8];
    const float y = __shfl_xor_sync(0xffffffffu, send, 1);
    std::uint32_t wh;
    std::uint16_t wl;
    split_f16_e4m3<kda_kd_lo_e4m3_shift>(par ? y : mine, par ? mine : y, wh, wl);  // even channel low
    const int at = (par ? rr + 8 : rr) * N + (i & ~1);
    *reinterpret_cast<std::uint32_t*>(hi + at) = wh;
    *reinterpret_cast<std::uint16_t*>(lo8 + at) = wl;
  }
}

}  // namespace kdalab::kernels::detail::prep
