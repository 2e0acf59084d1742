// KDA backward, step 1: the fused pre-ops in fp32 per token row, into the workspace (kernels/kda_backward.hpp):
// q, k after the L2Norm (and 1 / ||.||), g = g_min Sigmoid(exp(A_log) (g_raw + bias)) or g as given, beta =
// Sigmoid(beta_raw) or beta as given. One CTA per (token row, value head), one thread per key row; the CTA of the
// first value head of each key head also does q and k.
#include "kernels/kda_backward/common.cuh"

namespace kdalab::kernels::kda_backward_detail {
namespace {

__global__ void prepare_kernel(Params p) {
  __shared__ float buf[32];
  const int tau = blockIdx.x, hv = blockIdx.y, i = threadIdx.x, D = p.D;
  int b, t;
  row_bt(p, tau, b, t);
  const std::size_t row_v = static_cast<std::size_t>(tau) * p.HV + hv;
  const float graw = bf2f(p.g[at(p.sg, b, t, hv) + i]);
  float gv = graw;
  if (p.fuse_gate) gv = p.g_min * sigm(expf(p.A_log[hv]) * (graw + p.bias[hv * D + i]));
  p.gf[row_v * D + i] = gv;
  if (i == 0) {
    const float x = bf2f(p.beta[at(p.sbeta, b, t, hv)]);
    p.bf[row_v] = p.beta_sigmoid ? sigm(x) : x;
  }
  if (hv % p.group != 0) return;  // uniform over the CTA
  const int h = hv / p.group;
  const std::size_t row_k = static_cast<std::size_t>(tau) * p.H + h;
  const float xq = bf2f(p.q[at(p.sq, b, t, h) + i]), xk = bf2f(p.k[at(p.sk, b, t, h) + i]);
  float iq = 1.0f, ik = 1.0f;
  if (p.l2norm) {
    const float nq = block_sum(xq * xq, buf);
    const float nk = block_sum(xk * xk, buf);
    iq = nq > 0.0f ? 1.0f / sqrtf(nq) : 0.0f;
    ik = nk > 0.0f ? 1.0f / sqrtf(nk) : 0.0f;
  }
  p.qn[row_k * D + i] = xq * iq;
  p.kn[row_k * D + i] = xk * ik;
  if (i == 0) {
    p.qinv[row_k] = iq;
    p.kinv[row_k] = ik;
  }
}

}  // namespace

void launch_prepare(const Params& p, cudaStream_t stream) {
  prepare_kernel<<<dim3(p.M, p.HV), p.D, 0, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_backward prepare launch");
}

}  // namespace kdalab::kernels::kda_backward_detail
