// KDA decode step: one token per sequence, fp32 state [B, HV, D, D] updated in place, D = d_k = d_v
// in {64, 128, 256} (a template parameter; D = 128 is the original kernel).
//
// One CTA (D threads) per (32-column slice of d_v, value head, sequence): D / 32 slices per head so
// that B = 1, H = 32 still launches 128 CTAs at D = 128. Thread t holds rows 8 (t / 8) .. +7 and columns
// 4 (t % 8) .. +3 of its slice (32 fp32 in registers at every D, float4 loads/stores: each warp touches
// 4 rows x 128 contiguous bytes). Math in fp32 (K3 report Eq. 1):
//   S' = Diag(exp(g)) S;  u = S'^T k;  delta = beta (v - u);  S = S' + k delta^T;  o = scale S^T q.
// Reductions over the D key rows: shuffles within the warp (4 row groups), then shared memory
// across the D / 32 warps. No allocation, no host synchronisation: capturable in a CUDA graph.
#include <string>

#include "kernels/common/kda_math.cuh"

namespace kdalab::kernels {

namespace {
using namespace detail;

constexpr int SLICE = 32;

struct DParams {
  int B, H, HV, group;
  const bf16_t *q, *k, *v, *g, *beta;
  long long sq, sk, sv, sg, so, sbeta;
  const float *A_log, *bias;
  float g_min, scale;
  bool fuse_gate, l2norm, beta_sigmoid;
  float* state;
  bf16_t* o;
};

template <int D>
__global__ void __launch_bounds__(D) kda_decode_kernel(DParams p) {
  static_assert(D == 64 || D == 128 || D == 256, "decode: D = 64, 128 or 256");
  constexpr int NW = D / 32;  // warps; thread = key row group (8 rows) x 4 columns, one channel per thread
  const int slice = blockIdx.x, hv = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int warp = tid / 32, cg = tid % 8, rg = tid / 8;  // rg 0..D/8-1: rows 8 rg .. 8 rg + 7
  const int h = hv / p.group;
  const int col = slice * SLICE + 4 * cg;
  float4* S = reinterpret_cast<float4*>(p.state + (static_cast<long long>(b) * p.HV + hv) * D * D);

  // issue the state loads first (the bytes that matter)
  float4 s[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = S[((8 * rg + i) * D + col) / 4];

  __shared__ float sq[D], sk[D], sa[D], red[NW][2][SLICE], sred[4];
  {
    const int i = tid;  // one channel per thread
    float qi = bf2f(p.q[b * p.sq + h * D + i]);
    float ki = bf2f(p.k[b * p.sk + h * D + i]);
    float gi = bf2f(p.g[b * p.sg + hv * D + i]);
    if (p.fuse_gate) gi = k3_gate(gi, expf(p.A_log[hv]), p.bias[hv * D + i], p.g_min);
    if (p.l2norm) {
      // the block's squared norms of (s_q qi) and (s_k ki): shuffles within a warp, then the warps' sums in the order
      // ((r0 + r1) + r2) + ... (the D = 128 order); red is free again after the caller's next barrier
      const auto norms2 = [&](float s_q, float s_k, float& nq, float& nk) {
        nq = (qi * s_q) * (qi * s_q);
        nk = (ki * s_k) * (ki * s_k);
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) {
          nq += __shfl_xor_sync(0xffffffffu, nq, m);
          nk += __shfl_xor_sync(0xffffffffu, nk, m);
        }
        if (tid % 32 == 0) { red[warp][0][0] = nq; red[warp][1][0] = nk; }
        __syncthreads();
        nq = red[0][0][0];
#pragma unroll
        for (int w = 1; w < NW; ++w) nq += red[w][0][0];
        nk = red[0][1][0];
#pragma unroll
        for (int w = 1; w < NW; ++w) nk += red[w][1][0];
      };
      float nq, nk;
      norms2(1.0f, 1.0f, nq, nk);
      float iq = inv_l2norm(nq), ik = inv_l2norm(nk);
      const float rq = l2norm_rescale(nq), rk = l2norm_rescale(nk);
      if (rq != 1.0f || rk != 1.0f) {  // squared norm overflowed or underflowed: again at a power-of-two scale
        __syncthreads();                // (block-uniform: nq, nk are the block's sums) every read of red is done
        norms2(rq, rk, nq, nk);
        iq = inv_l2norm(nq) * rq;
        ik = inv_l2norm(nk) * rk;
      }
      qi *= iq;
      ki *= ik;
      __syncthreads();
    }
    sq[i] = qi;
    sk[i] = ki;
    sa[i] = expf(gi);
    if (tid == 0) {
      float be = bf2f(p.beta[b * p.sbeta + hv]);
      sred[0] = beta_of(be, p.beta_sigmoid);
    }
  }
  __syncthreads();
  // S' = Diag(alpha) S; partial u over this thread's 8 rows
  float4 u = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = 8 * rg + i;
    const float a = sa[r], kr = sk[r];
    s[i].x *= a; s[i].y *= a; s[i].z *= a; s[i].w *= a;
    u.x += kr * s[i].x; u.y += kr * s[i].y; u.z += kr * s[i].z; u.w += kr * s[i].w;
  }
  // reduce over the 4 row groups of the warp (lanes differing in bits 3, 4), then over warps
#pragma unroll
  for (int m = 8; m <= 16; m <<= 1) {
    u.x += __shfl_xor_sync(0xffffffffu, u.x, m);
    u.y += __shfl_xor_sync(0xffffffffu, u.y, m);
    u.z += __shfl_xor_sync(0xffffffffu, u.z, m);
    u.w += __shfl_xor_sync(0xffffffffu, u.w, m);
  }
  if ((tid % 32) < 8) {
    red[warp][0][4 * cg] = u.x; red[warp][0][4 * cg + 1] = u.y;
    red[warp][0][4 * cg + 2] = u.z; red[warp][0][4 * cg + 3] = u.w;
  }
  __syncthreads();
  const float beta = sred[0];
  const bf16_t* vp = p.v + b * p.sv + hv * D + col;
  float dl[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float ue = red[0][0][4 * cg + e];
#pragma unroll
    for (int w = 1; w < NW; ++w) ue += red[w][0][4 * cg + e];
    dl[e] = beta * (bf2f(vp[e]) - ue);
  }
  // S = S' + k delta^T; partial o over the rows
  float4 o = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = 8 * rg + i;
    const float kr = sk[r], qr = sq[r];
    s[i].x += kr * dl[0]; s[i].y += kr * dl[1]; s[i].z += kr * dl[2]; s[i].w += kr * dl[3];
    o.x += qr * s[i].x; o.y += qr * s[i].y; o.z += qr * s[i].z; o.w += qr * s[i].w;
    S[(r * D + col) / 4] = s[i];
  }
#pragma unroll
  for (int m = 8; m <= 16; m <<= 1) {
    o.x += __shfl_xor_sync(0xffffffffu, o.x, m);
    o.y += __shfl_xor_sync(0xffffffffu, o.y, m);
    o.z += __shfl_xor_sync(0xffffffffu, o.z, m);
    o.w += __shfl_xor_sync(0xffffffffu, o.w, m);
  }
  if ((tid % 32) < 8) {
    red[warp][1][4 * cg] = o.x; red[warp][1][4 * cg + 1] = o.y;
    red[warp][1][4 * cg + 2] = o.z; red[warp][1][4 * cg + 3] = o.w;
  }
  __syncthreads();
  if (tid < SLICE / 2) {
    const int c2 = 2 * tid;
    float r0 = 0, r1 = 0;
#pragma unroll
    for (int w = 0; w < NW; ++w) { r0 += red[w][1][c2]; r1 += red[w][1][c2 + 1]; }
    *reinterpret_cast<std::uint32_t*>(p.o + b * p.so + hv * D + slice * SLICE + c2) =
        pack_bf16(p.scale * r0, p.scale * r1);
  }
}

}  // namespace

void kda_decode(const KdaDecodeArgs& a, cudaStream_t stream) {
  const char* op = "kda_decode";
  check_dim(a.D, op);
  const int D = a.D;
  if (a.B < 1 || a.B > 65535)
    throw Error(std::string(op) + ": B = " + std::to_string(a.B) + "; accepted: 1 <= B <= 65535");
  if (a.H < 1 || a.HV < 1 || a.HV % a.H != 0 || a.HV > 65535)
    throw Error(std::string(op) + ": H = " + std::to_string(a.H) + ", HV = " + std::to_string(a.HV) +
                "; accepted: H >= 1 and HV a positive multiple of H (<= 65535)");
  if (!(a.scale > 0.0f)) throw Error(std::string(op) + ": scale = " + std::to_string(a.scale) + "; accepted: scale > 0");
  check_gate(a.gate, a.HV, op);
  check_ptr(a.q, 2, "q");
  check_ptr(a.k, 2, "k");
  check_ptr(a.v, 2, "v");
  check_ptr(a.g, 2, "g");
  check_ptr(a.beta, 2, "beta");
  check_ptr(a.o, 4, "o");
  check_ptr(a.state, 16, "state");
  DParams p{};
  p.B = a.B; p.H = a.H; p.HV = a.HV; p.group = a.HV / a.H;
  p.q = a.q; p.k = a.k; p.v = a.v; p.g = a.g; p.beta = a.beta; p.o = a.o; p.state = a.state;
  p.sq = a.sq_b ? a.sq_b : static_cast<long long>(a.H) * D;
  p.sk = a.sk_b ? a.sk_b : static_cast<long long>(a.H) * D;
  p.sv = a.sv_b ? a.sv_b : static_cast<long long>(a.HV) * D;
  p.sg = a.sg_b ? a.sg_b : static_cast<long long>(a.HV) * D;
  p.so = a.so_b ? a.so_b : static_cast<long long>(a.HV) * D;
  p.sbeta = a.sbeta_b ? a.sbeta_b : a.HV;
  if (p.so % 2 != 0)
    throw Error(std::string(op) + ": so_b = " + std::to_string(p.so) + "; accepted: an even number of elements");
  p.A_log = a.gate.A_log; p.bias = a.gate.bias; p.g_min = a.gate.g_min; p.scale = a.scale;
  p.fuse_gate = a.gate.fused; p.l2norm = a.l2norm_qk; p.beta_sigmoid = a.beta_sigmoid;
  if (D == 64) kda_decode_kernel<64><<<dim3(64 / SLICE, a.HV, a.B), 64, 0, stream>>>(p);
  else if (D == 256) kda_decode_kernel<256><<<dim3(256 / SLICE, a.HV, a.B), 256, 0, stream>>>(p);
  else kda_decode_kernel<128><<<dim3(128 / SLICE, a.HV, a.B), 128, 0, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_decode_kernel launch");
}

}  // namespace kdalab::kernels
