#pragma once
// Private to kernels/kda_backward/: the kernel parameters, the per-D configuration of the sweep, the sequence span,
// fp32 device math and the launchers each file provides to launch.cu. Public API and math: kernels/kda_backward.hpp;
// design: docs/kernels/kda_backward.md.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/kda_math.cuh"
#include "kernels/kda_backward.hpp"

namespace kdalab::kernels::kda_backward_detail {

using namespace detail;

constexpr int CK = 64;   // checkpoint interval of the forward sweep (tokens)
constexpr int SUB = 8;   // sub-checkpoint interval inside a chunk (tokens); CK / SUB sub-checkpoints
constexpr int CHUNK = 16;  // the chunked pass's chunk (tokens; chunked.cu)
constexpr int SCRATCH_TILES = CK / SUB + SUB;  // per-CTA scratch: the sub-checkpoints and one sub-chunk's states
static_assert(CK % SUB == 0, "the checkpoint interval must be a multiple of the sub-checkpoint interval");

/// The sweep's mapping for d_k = d_v = D: a warp holds S on rows lane + 32 r (r < R) and BV adjacent value columns
/// (R BV = 32 fp32 of S and 32 of dS per lane); a CTA has W warps side by side, NC = W BV value columns; P = D / NC
/// CTAs (column blocks) cover a value head.
template <int D>
struct Cfg {
  static_assert(D == 64 || D == 128 || D == 256, "D = d_k = d_v must be 64, 128 or 256");
  static constexpr int R = D / 32;
  static constexpr int BV = 32 / R;
  static constexpr int NC = D == 256 ? 32 : 64;
  static constexpr int W = NC / BV;
  static constexpr int THREADS = 32 * W;
  static constexpr int P = D / NC;
  static constexpr int TILE = D * NC;  // fp32 of S one CTA holds
  static_assert(THREADS >= D, "the epilogue of a token uses one thread per key row");
  /// Shared memory (floats): q, k, a [SUB][D]; v, dO [SUB][NC]; beta [SUB] (padded to 32); the per-token reduction
  /// over warps red [W][3][D] and redb [W] (padded to 32).
  static constexpr int SMEM_FLOATS = 3 * SUB * D + 2 * SUB * NC + 32 + W * 3 * D + 32;
};

/// Column blocks per value head for a run-time D (0 for an unsupported D).
constexpr int cfg_p(int D) { return D == 64 ? 1 : D == 128 ? 2 : D == 256 ? 8 : 0; }
/// Columns per CTA for a run-time D.
constexpr int cfg_nc(int D) { return D == 256 ? 32 : 64; }

struct Params {
  int B, T, H, HV, group, D, N, P, M;  // M = token rows (B T, or T with cu_seqlens)
  int max_len;                         // the longest sequence (T, or max_seqlen with cu_seqlens)
  const bf16_t *q, *k, *v, *g, *beta, *dO;
  Strides sq, sk, sv, sg, sbeta, sdo;  // resolved (no zeros)
  const float *A_log, *bias;
  float g_min, scale;
  bool fuse_gate, l2norm, beta_sigmoid;
  const float *S0, *dS_T;
  const int* cu;
  bf16_t *dq, *dk, *dv, *dg, *dbeta;
  float *dq32, *dk32, *dg32, *dbeta32;  // KdaBackwardArgs::dq_f32 ...: written instead of the bf16 ones when set
  float *dA_log, *dbias, *dS0;
  // workspace regions (fp32)
  float *qn, *kn;      // [M][H][D]: q, k after the L2Norm (or as given)
  float *qinv, *kinv;  // [M][H]: 1 / ||q||, 1 / ||k|| (1 without the L2Norm)
  float *gf, *bf;      // [M][HV][D], [M][HV]: g (log-decay) and beta as the recurrence uses them
  float* ckpt;         // [slots][HV][D][D]: S entering each 64-token chunk (per CTA: its D x NC tile)
  float* scratch;      // [grid][SCRATCH_TILES][D NC]
  float *pq, *pk, *pg;  // [P][M][HV][D]: partial dq, dk, dg of each column block (pg[0]: dg_raw after the epilogue)
  float* pb;            // [P][M][HV]: partial dbeta
  // the chunked pass's gradient kernel applies the chain rules itself (finish_key_row, finish_value_row) and the
  // epilogue kernel does not run: one column block and one value head a key head (group == 1). pq, pk and pb are then
  // not written (nor allocated); pg[0] still receives dg_raw for the params sums.
  bool tail_in_grad;
  float* pA;            // [M][HV]: per-token dA_log terms
  // the chunked pass (chunked.cu): per (chunk slot, value head)
  float* fac;   // [slots][HV][FAC]: the chunk's factors
  float* Sst;   // [slots][HV][D][D]: S entering the chunk
  float* dSst;  // [slots][HV][D][D]: dL/dS leaving the chunk
};

/// The chunked pass's factor slot of a (chunk, value head), floats (written by chunked.cu's factors kernel, read by its
/// chains and gradient kernel and by chains_wg.cu): C x D matrices row-major (W, U, Kd, Qg), gamL (Gam's last row, D),
/// then the C x C matrices B (strictly lower), P (lower), N (lower, unit diagonal), C = CHUNK. Only what the chains
/// read and the gradient kernel cannot re-form cheaply: Gam, Kg and Ki are re-formed there from the prepared k and
/// gate. Every offset is a multiple of 4 floats and so is the size (16-byte copies).
template <int D>
struct ChunkFac {
  static constexpr int C = CHUNK;
  static constexpr int W = 0, U = C * D, Kd = 2 * C * D, Qg = 3 * C * D, gamL = 4 * C * D, B = gamL + D,
                       P = B + C * C, N = P + C * C, size = N + C * C;
};

/// Row `tau` of the flattened token rows -> (batch entry, token): fixed length tau = b T + t; with cu_seqlens b = 0.
__device__ __forceinline__ void row_bt(const Params& p, int tau, int& b, int& t) {
  if (p.cu) {
    b = 0;
    t = tau;
  } else {
    b = tau / p.T;
    t = tau - b * p.T;
  }
}
/// Warps (of 32 threads) a CTA in the one-warp-per-row kernels (prepare, epilogue): one per (token row, key head).
constexpr int kRowWarps = 8;
/// Their grid: enough CTAs of kRowWarps warps for the M H rows.
inline unsigned warp_key_row_grid(const Params& p) {
  return static_cast<unsigned>((static_cast<long long>(p.M) * p.H + kRowWarps - 1) / kRowWarps);
}
/// The (token row tau, key head h) of this warp in the one-warp-per-row kernels (rows in (token, key head) order) and
/// its (batch entry b, token t); false past the last row (uniform over the warp).
__device__ __forceinline__ bool warp_key_row(const Params& p, int& tau, int& h, int& b, int& t) {
  const long long row = static_cast<long long>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= static_cast<long long>(p.M) * p.H) return false;
  tau = static_cast<int>(row / p.H);
  h = static_cast<int>(row - static_cast<long long>(tau) * p.H);
  row_bt(p, tau, b, t);
  return true;
}
__device__ __forceinline__ std::int64_t at(const Strides& s, int b, int t, int h) {
  return static_cast<std::int64_t>(b) * s.b + static_cast<std::int64_t>(t) * s.t + static_cast<std::int64_t>(h) * s.h;
}

/// Sequence n: first token row, length, first slot of I tokens each (the sweep's checkpoints: I = CK; the chunked
/// pass's chunks: I = 16). Fixed length: n ceil(T / I); cu_seqlens: n + floor(cu[n] / I), which leaves room for
/// ceil(len / I) slots before the next sequence's first.
template <int I = CK>
__device__ __forceinline__ void seq_of(const Params& p, int n, int& bos, int& len, long long& slot0) {
  if (p.cu) {
    bos = p.cu[n];
    len = p.cu[n + 1] - bos;
    slot0 = n + bos / I;
  } else {
    bos = n * p.T;
    len = p.T;
    slot0 = static_cast<long long>(n) * ((p.T + I - 1) / I);
  }
}

/// Accurate fp32 math for the backward (IEEE expf and division; the forward's fast variants trade ~1e-6).
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ std::uint16_t f2bf(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<const std::uint16_t*>(&h);
}

/// The sum over the 32 lanes of a warp, the same on every lane, in a fixed order (xor butterfly).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

/// What the last step of a (token row, key head) row reads besides dq and dk, lane l's key columns l, l + 32, ..
/// (E = D / 32): q and k as the forward normalised them and their inverse norms (with the L2Norm only).
template <int D>
struct KeyRowIn {
  float yq[D / 32], yk[D / 32], iq, ik;
};
/// Issues the loads of a key row's inputs (`rk` = tau H + h): called ahead of the sums they meet, so that their
/// latency overlaps them (and, in the gradient kernel's tail, the other row's).
template <int D>
__device__ __forceinline__ void load_key_row(const Params& p, int lane, std::size_t rk, KeyRowIn<D>& in) {
  if (p.l2norm) {
#pragma unroll
    for (int e = 0; e < D / 32; ++e) {
      in.yq[e] = p.qn[rk * D + lane + 32 * e];
      in.yk[e] = p.kn[rk * D + lane + 32 * e];
    }
    in.iq = p.qinv[rk];
    in.ik = p.kinv[rk];
  }
}

/// The last step of a (token row, key head) row, lane l holding the key columns l, l + 32, .. (E = D / 32) of its
/// summed dq and dk: the L2Norm's backward dx = (dy - y (y . dy)) / ||x|| when the forward normalised, then the stores
/// (bf16, or fp32 with KdaBackwardArgs::dq_f32). `rk` = tau H + h; `in` from load_key_row. Used by the epilogue kernel
/// and by the gradient kernel's own tail (Params::tail_in_grad), so both give the same bits.
template <int D>
__device__ __forceinline__ void finish_key_row(const Params& p, int lane, std::size_t rk, float (&dq)[D / 32],
                                               float (&dk)[D / 32], const KeyRowIn<D>& in) {
  constexpr int E = D / 32;
  if (p.l2norm) {
    float sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      sq += in.yq[e] * dq[e];
      sk += in.yk[e] * dk[e];
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      dq[e] = (dq[e] - in.yq[e] * sq) * in.iq;
      dk[e] = (dk[e] - in.yk[e] * sk) * in.ik;
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const std::size_t o = rk * D + lane + 32 * e;
    if (p.dq32) {
      p.dq32[o] = dq[e];
      p.dk32[o] = dk[e];
    } else {
      p.dq[o] = f2bf(dq[e]);
      p.dk[o] = f2bf(dk[e]);
    }
  }
}

/// What the last step of a (token row, value head) row reads besides dg and dbeta, lane l's key columns: the raw gate,
/// the bias and exp(A_log) (fused gate only), the beta logit (beta sigmoid only).
template <int D>
struct ValueRowIn {
  float graw[D / 32], bias[D / 32], ea, beta_raw;
};
/// Issues the loads of a value row's inputs (token (b, t), value head hv), ahead of the sums they meet.
template <int D>
__device__ __forceinline__ void load_value_row(const Params& p, int lane, int b, int t, int hv, ValueRowIn<D>& in) {
  if (p.fuse_gate) {
#pragma unroll
    for (int e = 0; e < D / 32; ++e) {
      in.graw[e] = bf2f(p.g[at(p.sg, b, t, hv) + lane + 32 * e]);
      in.bias[e] = p.bias[hv * D + lane + 32 * e];
    }
    in.ea = expf(p.A_log[hv]);
  }
  if (p.beta_sigmoid) in.beta_raw = bf2f(p.beta[at(p.sbeta, b, t, hv)]);
}

/// The last step of a (token row, value head) row, lane l holding the key columns l, l + 32, .. of its summed dg and
/// every lane the summed dbeta `db`: through the K3 gate (dg_raw = dg g_min s (1 - s) exp(A_log), kept in fp32 in
/// partial slot 0 for dbias, and the token's dA_log term into pA) when fused, through the beta sigmoid when the
/// forward applied it, then the stores. `rv` = tau HV + hv; `in` from load_value_row.
template <int D>
__device__ __forceinline__ void finish_value_row(const Params& p, int lane, std::size_t rv, const float (&dg)[D / 32],
                                                 float db, const ValueRowIn<D>& in) {
  constexpr int E = D / 32;
  if (p.fuse_gate) {
    float dA = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const std::size_t o = rv * D + lane + 32 * e;
      const float z = in.graw[e] + in.bias[e];
      const float u = in.ea * z, sg = sigm(u);
      const float dgdu = p.g_min * sg * (1.0f - sg);
      const float draw = dg[e] * dgdu * in.ea;
      if (p.dg32) p.dg32[o] = draw;
      else p.dg[o] = f2bf(draw);
      p.pg[o] = draw;  // slot 0, this lane's own element: the per-token dbias term
      dA += dg[e] * dgdu * u;
    }
    dA = warp_sum(dA);
    if (lane == 0) p.pA[rv] = dA;
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const std::size_t o = rv * D + lane + 32 * e;
      if (p.dg32) p.dg32[o] = dg[e];
      else p.dg[o] = f2bf(dg[e]);
    }
  }
  if (lane == 0) {
    if (p.beta_sigmoid) {
      const float sb = sigm(in.beta_raw);
      db *= sb * (1.0f - sb);
    }
    if (p.dbeta32) p.dbeta32[rv] = db;
    else p.dbeta[rv] = f2bf(db);
  }
}

// ---- launchers (host); each checks its launch with cuda_check ----
/// prepare.cu: one warp per (token row, key head), 8 per CTA.
void launch_prepare(const Params& p, cudaStream_t stream);
/// sweep.cu: the most CTAs of the sweep resident at once on the current device (the scratch is sized for them).
int sweep_resident_ctas(int D);
/// sweep.cu: the forward and reverse sweeps on `grid` CTAs (each loops over the N HV P work items).
void launch_sweep(const Params& p, int grid, cudaStream_t stream);
/// epilogue.cu: the partial sums and chain rules, one warp per (token row, key head), 8 per CTA; then (fused gate)
/// dA_log and dbias.
void launch_epilogue(const Params& p, cudaStream_t stream);
/// chunked.cu: the chunked pass (factors, forward chain, reverse chain, gradients) for D = 64 or 128; writes what the
/// sweep writes (dv, dS0 and the partials of one column block) for the epilogue.
/// `wg_chains` (KdaBackwardPass::chunked_wg, D = 128 only): the chains run as chains_wg.cu's wgmma kernel instead of
/// chunked.cu's mma.sync one; the factors and gradient kernels are the same.
void launch_chunked(const Params& p, cudaStream_t stream, KdaBackwardPhase last = KdaBackwardPhase::all,
                    bool wg_chains = false);
/// chains_wg.cu: the forward and reverse chains of the chunked pass on wgmma (D = 128; the launch of chunked.cu's
/// chains_kernel replaced: the same Sst, dSst and dS0 from the same factor slots); `forward_only` as there.
void launch_chains_wg(const Params& p, cudaStream_t stream, bool forward_only);
/// chunked.cu: floats of one chunk's factor slot (D = 64 or 128).
std::size_t chunked_factor_floats(int D);

}  // namespace kdalab::kernels::kda_backward_detail
