// KDA backward, steps 3 and 4 (kernels/kda_backward.hpp): the fixed-order sums of the sweep's partials and the
// pre-ops' chain rules, then the sums over tokens of the gate parameters' gradients.
//  - epilogue: one CTA per (token row, key head), one thread per key row. dq, dk: the sum over the column blocks of
//    each value head of the group, value heads in order, then the L2Norm's backward dx = (dy - y (y . dy)) / ||x||.
//    Per value head of the group: dg (the column blocks' sum) through the K3 gate (dg_raw = dg g_min s (1 - s)
//    exp(A_log), s = Sigmoid(exp(A_log) (g_raw + bias))), kept in fp32 in partial slot 0 for dbias, and the token's
//    dA_log term sum_i dg_i g_min s (1 - s) exp(A_log) (g_raw + bias); dbeta through the beta sigmoid.
//  - params (fused gate only): dbias[hv][i] and dA_log[hv] summed over all token rows in a fixed order, in fp64.
#include "kernels/kda_backward/common.cuh"

namespace kdalab::kernels::kda_backward_detail {
namespace {

__global__ void epilogue_kernel(Params p) {
  __shared__ float buf[32];
  const int tau = blockIdx.x, h = blockIdx.y, i = threadIdx.x, D = p.D;
  int b, t;
  row_bt(p, tau, b, t);
  const std::size_t plane = static_cast<std::size_t>(p.M) * p.HV * D;  // one column block's partials
  float dq = 0.0f, dk = 0.0f;
  for (int hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
    const std::size_t o = (static_cast<std::size_t>(tau) * p.HV + hv) * D + i;
    for (int c = 0; c < p.P; ++c) {
      dq += p.pq[c * plane + o];
      dk += p.pk[c * plane + o];
    }
  }
  const std::size_t rk = static_cast<std::size_t>(tau) * p.H + h;
  if (p.l2norm) {
    const float yq = p.qn[rk * D + i], yk = p.kn[rk * D + i];
    const float sq = block_sum(yq * dq, buf);
    const float sk = block_sum(yk * dk, buf);
    dq = (dq - yq * sq) * p.qinv[rk];
    dk = (dk - yk * sk) * p.kinv[rk];
  }
  if (p.dq32) {
    p.dq32[rk * D + i] = dq;
    p.dk32[rk * D + i] = dk;
  } else {
    p.dq[rk * D + i] = f2bf(dq);
    p.dk[rk * D + i] = f2bf(dk);
  }

  for (int hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
    const std::size_t rv = static_cast<std::size_t>(tau) * p.HV + hv, o = rv * D + i;
    float dg = 0.0f;
    for (int c = 0; c < p.P; ++c) dg += p.pg[c * plane + o];
    if (p.fuse_gate) {
      const float ea = expf(p.A_log[hv]), z = bf2f(p.g[at(p.sg, b, t, hv) + i]) + p.bias[hv * D + i];
      const float u = ea * z, sg = sigm(u);
      const float dgdu = p.g_min * sg * (1.0f - sg);
      const float draw = dg * dgdu * ea;
      if (p.dg32) p.dg32[o] = draw;
      else p.dg[o] = f2bf(draw);
      p.pg[o] = draw;  // slot 0, this thread's own element: the per-token dbias term
      const float dA = block_sum(dg * dgdu * u, buf);
      if (i == 0) p.pA[rv] = dA;
    } else if (p.dg32) {
      p.dg32[o] = dg;
    } else {
      p.dg[o] = f2bf(dg);
    }
    if (i == 0) {
      float db = 0.0f;
      for (int c = 0; c < p.P; ++c) db += p.pb[static_cast<std::size_t>(c) * p.M * p.HV + rv];
      if (p.beta_sigmoid) {
        const float sb = sigm(bf2f(p.beta[at(p.sbeta, b, t, hv)]));
        db *= sb * (1.0f - sb);
      }
      if (p.dbeta32) p.dbeta32[rv] = db;
      else p.dbeta[rv] = f2bf(db);
    }
  }
}

/// grid (HV, ceil(D / 32)), 256 threads = 8 rows of 32 columns: column i = 32 blockIdx.y + lane sums the token rows
/// tau = row, row + 8, ... in fp64, then the 8 rows in order; blockIdx.y == 0 also sums dA_log over the token rows.
__global__ void params_kernel(Params p) {
  __shared__ double part[8][32];
  __shared__ double partA[256];
  const int hv = blockIdx.x, lane = threadIdx.x % 32, row = threadIdx.x / 32, D = p.D;
  const int i = blockIdx.y * 32 + lane;
  double s = 0.0;
  if (i < D)
    for (int tau = row; tau < p.M; tau += 8) s += p.pg[(static_cast<std::size_t>(tau) * p.HV + hv) * D + i];
  part[row][lane] = s;
  double sA = 0.0;
  if (blockIdx.y == 0)
    for (int tau = threadIdx.x; tau < p.M; tau += 256) sA += p.pA[static_cast<std::size_t>(tau) * p.HV + hv];
  partA[threadIdx.x] = sA;
  __syncthreads();
  if (row == 0 && i < D) {
    double tot = 0.0;
    for (int r = 0; r < 8; ++r) tot += part[r][lane];
    p.dbias[hv * D + i] = static_cast<float>(tot);
  }
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    double tot = 0.0;
    for (int r = 0; r < 256; ++r) tot += partA[r];
    p.dA_log[hv] = static_cast<float>(tot);
  }
}

}  // namespace

void launch_epilogue(const Params& p, cudaStream_t stream) {
  epilogue_kernel<<<dim3(p.M, p.H), p.D, 0, stream>>>(p);
  cuda_check(cudaGetLastError(), "kda_backward epilogue launch");
  if (p.fuse_gate) {
    params_kernel<<<dim3(p.HV, (p.D + 31) / 32), 256, 0, stream>>>(p);
    cuda_check(cudaGetLastError(), "kda_backward params launch");
  }
}

}  // namespace kdalab::kernels::kda_backward_detail
