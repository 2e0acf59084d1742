// KDA backward, step 1: the fused pre-ops in fp32 per token row, into the workspace (kernels/kda_backward.hpp):
// q, k after the L2Norm (and 1 / ||.||), g = g_min Sigmoid(exp(A_log) (g_raw + bias)) or g as given, beta =
// Sigmoid(beta_raw) or beta as given. One warp per (token row, key head), 8 per CTA; lane l owns key columns l, l + 32,
// .. (E = D / 32 of them), as in the epilogue: every load is 64 contiguous bytes of a bf16 row and every store 128 of
// an fp32 row, the norms are warp sums (no barrier). The warp does q and k, then g and beta of each value head of its
// key head's group.
#include "kernels/kda_backward/common.cuh"

namespace kdalab::kernels::kda_backward_detail {
namespace {

template <int D>
__global__ void __launch_bounds__(kRowWarps * 32) prepare_kernel(Params p) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31;
  int tau, h, b, t;
  if (!warp_key_row(p, tau, h, b, t)) return;  // uniform over the warp
  float xq[E], xk[E], sq = 0.0f, sk = 0.0f;
  const std::int64_t oq = at(p.sq, b, t, h), ok = at(p.sk, b, t, h);
#pragma unroll
  for (int e = 0; e < E; ++e) {
    xq[e] = bf2f(p.q[oq + lane + 32 * e]);
    xk[e] = bf2f(p.k[ok + lane + 32 * e]);
    sq += xq[e] * xq[e];
    sk += xk[e] * xk[e];
  }
  float iq = 1.0f, ik = 1.0f;
  if (p.l2norm) {
    const float nq = warp_sum(sq), nk = warp_sum(sk);
    iq = nq > 0.0f ? 1.0f / sqrtf(nq) : 0.0f;
    ik = nk > 0.0f ? 1.0f / sqrtf(nk) : 0.0f;
  }
  const std::size_t rk = static_cast<std::size_t>(tau) * p.H + h;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    p.qn[rk * D + lane + 32 * e] = xq[e] * iq;
    p.kn[rk * D + lane + 32 * e] = xk[e] * ik;
  }
  if (lane == 0) {
    p.qinv[rk] = iq;
    p.kinv[rk] = ik;
  }
  for (int hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
    const std::size_t rv = static_cast<std::size_t>(tau) * p.HV + hv;
    const std::int64_t og = at(p.sg, b, t, hv);
    const float ea = p.fuse_gate ? expf(p.A_log[hv]) : 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int i = lane + 32 * e;
      const float graw = bf2f(p.g[og + i]);
      p.gf[rv * D + i] = p.fuse_gate ? p.g_min * sigm(ea * (graw + p.bias[hv * D + i])) : graw;
    }
    if (lane == 0) {
      const float x = bf2f(p.beta[at(p.sbeta, b, t, hv)]);
      p.bf[rv] = p.beta_sigmoid ? sigm(x) : x;
    }
  }
}

}  // namespace

void launch_prepare(const Params& p, cudaStream_t stream) {
  const unsigned grid = warp_key_row_grid(p);
  if (p.D == 64) prepare_kernel<64><<<grid, kRowWarps * 32, 0, stream>>>(p);
  else if (p.D == 128) prepare_kernel<128><<<grid, kRowWarps * 32, 0, stream>>>(p);
  else prepare_kernel<256><<<grid, kRowWarps * 32, 0, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_backward prepare launch");
}

}  // namespace kdalab::kernels::kda_backward_detail
