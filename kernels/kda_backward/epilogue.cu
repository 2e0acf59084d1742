// KDA backward, steps 3 and 4 (kernels/kda_backward.hpp): the fixed-order sums of the sweep's partials and the
// pre-ops' chain rules, then the sums over tokens of the gate parameters' gradients.
//  - epilogue: one warp per (token row, key head), D / 32 key columns per lane. dq, dk: the sum over the column blocks of
//    each value head of the group, value heads in order, then the L2Norm's backward dx = (dy - y (y . dy)) / ||x||.
//    Per value head of the group: dg (the column blocks' sum) through the K3 gate (dg_raw = dg g_min s (1 - s)
//    exp(A_log), s = Sigmoid(exp(A_log) (g_raw + bias))), kept in fp32 in partial slot 0 for dbias, and the token's
//    dA_log term sum_i dg_i g_min s (1 - s) exp(A_log) (g_raw + bias); dbeta through the beta sigmoid. The row math is
//    common.cuh's finish_key_row and finish_value_row, which the chunked passes' gradient kernel also runs on its own
//    rows where HV = H (Params::tail_in_grad): this kernel is then not launched.
//  - params (fused gate only): dbias[hv][i] and dA_log[hv] summed over all token rows in a fixed order, in fp64.
#include "kernels/kda_backward/common.cuh"

namespace kdalab::kernels::kda_backward_detail {
namespace {

/// One warp per (token row, key head), 8 per CTA; lane l owns key columns l, l + 32, .. (E = D / 32 of them), so
/// every load of a row is 128 contiguous bytes and every reduction is a warp's (no barrier).
template <int D>
__global__ void __launch_bounds__(kRowWarps * 32) epilogue_kernel(Params p) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31;
  int tau, h, b, t;
  if (!warp_key_row(p, tau, h, b, t)) return;  // uniform over the warp
  const std::size_t plane = static_cast<std::size_t>(p.M) * p.HV * D;  // one column block's partials
  const std::size_t rk = static_cast<std::size_t>(tau) * p.H + h;
  KeyRowIn<D> kin;
  load_key_row<D>(p, lane, rk, kin);
  float dq[E], dk[E];
#pragma unroll
  for (int e = 0; e < E; ++e) dq[e] = dk[e] = 0.0f;
  for (int hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
    const std::size_t o = (static_cast<std::size_t>(tau) * p.HV + hv) * D + lane;
    for (int c = 0; c < p.P; ++c)
#pragma unroll
      for (int e = 0; e < E; ++e) {
        dq[e] += p.pq[c * plane + o + 32 * e];
        dk[e] += p.pk[c * plane + o + 32 * e];
      }
  }
  finish_key_row<D>(p, lane, rk, dq, dk, kin);

  for (int hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
    const std::size_t rv = static_cast<std::size_t>(tau) * p.HV + hv;
    ValueRowIn<D> vin;
    load_value_row<D>(p, lane, b, t, hv, vin);
    float dg[E];
#pragma unroll
    for (int e = 0; e < E; ++e) dg[e] = 0.0f;
    for (int c = 0; c < p.P; ++c)
#pragma unroll
      for (int e = 0; e < E; ++e) dg[e] += p.pg[c * plane + rv * D + lane + 32 * e];
    float db = 0.0f;
    for (int c = 0; c < p.P; ++c) db += p.pb[static_cast<std::size_t>(c) * p.M * p.HV + rv];
    finish_value_row<D>(p, lane, rv, dg, db, vin);
  }
}

/// grid (HV, ceil(D / 32)), PR x 32 threads = PR rows of 32 columns: column i = 32 blockIdx.y + lane sums the token
/// rows tau = row, row + PR, ... in fp64 (two accumulators, even and odd steps, so that two loads are in flight per
/// thread), then the PR rows in order; blockIdx.y == 0 also sums dA_log over the token rows.
constexpr int PR = 32;
__global__ void __launch_bounds__(PR * 32) params_kernel(Params p) {
  __shared__ double part[PR][32];
  __shared__ double partA[PR * 32];
  const int hv = blockIdx.x, lane = threadIdx.x % 32, row = threadIdx.x / 32, D = p.D;
  const int i = blockIdx.y * 32 + lane;
  double s0 = 0.0, s1 = 0.0;
  if (i < D) {
    int tau = row;
    for (; tau + PR < p.M; tau += 2 * PR) {
      s0 += p.pg[(static_cast<std::size_t>(tau) * p.HV + hv) * D + i];
      s1 += p.pg[(static_cast<std::size_t>(tau + PR) * p.HV + hv) * D + i];
    }
    if (tau < p.M) s0 += p.pg[(static_cast<std::size_t>(tau) * p.HV + hv) * D + i];
  }
  part[row][lane] = s0 + s1;
  double sA = 0.0;
  if (blockIdx.y == 0)
    for (int tau = threadIdx.x; tau < p.M; tau += PR * 32) sA += p.pA[static_cast<std::size_t>(tau) * p.HV + hv];
  partA[threadIdx.x] = sA;
  __syncthreads();
  if (row == 0 && i < D) {
    double tot = 0.0;
    for (int r = 0; r < PR; ++r) tot += part[r][lane];
    p.dbias[hv * D + i] = static_cast<float>(tot);
  }
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    double tot = 0.0;
    for (int r = 0; r < PR * 32; ++r) tot += partA[r];
    p.dA_log[hv] = static_cast<float>(tot);
  }
}

}  // namespace

void launch_epilogue(const Params& p, cudaStream_t stream) {
  if (!p.tail_in_grad) {  // else the gradient kernel has applied the chain rules
    const unsigned grid = warp_key_row_grid(p);
    if (p.D == 64) epilogue_kernel<64><<<grid, kRowWarps * 32, 0, stream>>>(p);
    else if (p.D == 128) epilogue_kernel<128><<<grid, kRowWarps * 32, 0, stream>>>(p);
    else epilogue_kernel<256><<<grid, kRowWarps * 32, 0, stream>>>(p);
    cuda_check(cudaGetLastError(), "kda_backward epilogue launch");
  }
  if (p.fuse_gate) {
    params_kernel<<<dim3(p.HV, (p.D + 31) / 32), PR * 32, 0, stream>>>(p);
    cuda_check(cudaGetLastError(), "kda_backward params launch");
  }
}

}  // namespace kdalab::kernels::kda_backward_detail
