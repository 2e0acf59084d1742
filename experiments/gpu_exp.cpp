// GPU measurements of the research experiments (see experiments/gpu_exp.hpp). CUDA builds only.
#ifdef KDALAB_HAVE_CUDA
#include "experiments/gpu_exp.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/kda.hpp"
#include "kernels/mla.hpp"
#include "kernels/common/random_fill.hpp"
#include "numerics/bf16.hpp"
#include "reference/error.hpp"

namespace kdalab::gpu_exp {

namespace {
using kernels::bf16_t;
using kernels::cuda_check;

struct Dev {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit Dev(std::size_t n) : bytes(n) { cuda_check(cudaMalloc(&p, n ? n : 16), "cudaMalloc"); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  Dev(Dev&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  ~Dev() { if (p) cudaFree(p); }
  template <class T> T* as() const { return static_cast<T*>(p); }
};

Dev up_bf16(const Tensor<double>& t) {
  std::vector<bf16_t> h(t.numel());
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = bf16_bits(round_bf16(t.data[i]));
  Dev d(h.size() * 2);
  cuda_check(cudaMemcpy(d.p, h.data(), d.bytes, cudaMemcpyHostToDevice), "upload bf16");
  return d;
}
Dev up_f32(const std::vector<float>& h) {
  Dev d(h.size() * 4);
  cuda_check(cudaMemcpy(d.p, h.data(), d.bytes, cudaMemcpyHostToDevice), "upload f32");
  return d;
}
template <class F>
double median_time(F&& launch, int iters) {
  for (int i = 0; i < 3; ++i) launch();
  cuda_check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "cudaEventCreate");
  cuda_check(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> ts;
  for (int i = 0; i < iters; ++i) {
    cuda_check(cudaEventRecord(a), "cudaEventRecord");
    launch();
    cuda_check(cudaEventRecord(b), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    ts.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}
}  // namespace

KdaOutput<double> kda_prefill_on_gpu(const KdaInputs& in, double bias_shift, bool unsafe) {
  require(in.d_k == in.d_v && (in.d_k == 64 || in.d_k == 128 || in.d_k == 256) && in.H == in.HV,
          "kda_prefill_on_gpu: the kernel needs D = d_k = d_v in {64, 128, 256} and HV = H");
  const std::size_t D = in.d_k;
  Dev q = up_bf16(in.q_raw), k = up_bf16(in.k_raw), v = up_bf16(in.v), g = up_bf16(in.g_raw), beta = up_bf16(in.beta_raw);
  std::vector<float> A(in.A_log.numel()), bias(in.bias.numel()), S0(in.S0.numel());
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(in.A_log.data[i]);
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(in.bias.data[i] + bias_shift);
  for (std::size_t i = 0; i < S0.size(); ++i) S0[i] = static_cast<float>(in.S0.data[i]);
  Dev dA = up_f32(A), dbias = up_f32(bias), dS0 = up_f32(S0);
  kernels::KdaPrefillArgs a;
  a.B = static_cast<int>(in.B);
  a.T = static_cast<int>(in.T);
  a.H = a.HV = static_cast<int>(in.H);
  a.D = static_cast<int>(D);
  a.q = q.as<bf16_t>();
  a.k = k.as<bf16_t>();
  a.v = v.as<bf16_t>();
  a.g = g.as<bf16_t>();
  a.beta = beta.as<bf16_t>();
  a.gate.A_log = dA.as<float>();
  a.gate.bias = dbias.as<float>();
  a.gate.g_min = static_cast<float>(in.g_min);
  a.gate.allow_unsafe_range = unsafe;
  a.scale = static_cast<float>(in.scale);
  a.S0 = dS0.as<float>();
  KdaOutput<double> out{Tensor<double>({in.B, in.T, in.HV, D}), Tensor<double>({in.B, in.HV, D, D})};
  Dev o(out.o.numel() * 2), S(out.S_final.numel() * 4);
  cuda_check(cudaMemset(o.p, 0xFF, o.bytes), "poison o");
  cuda_check(cudaMemset(S.p, 0xFF, S.bytes), "poison S");
  a.o = o.as<bf16_t>();
  a.S_final = S.as<float>();
  const std::size_t wsb = kernels::kda_prefill_workspace_bytes(a);
  Dev ws(wsb);
  a.workspace = ws.p;
  a.workspace_bytes = wsb;
  kernels::kda_prefill(a, nullptr);
  cuda_check(cudaDeviceSynchronize(), "kda_prefill");
  std::vector<bf16_t> ho(out.o.numel());
  std::vector<float> hS(out.S_final.numel());
  cuda_check(cudaMemcpy(ho.data(), o.p, o.bytes, cudaMemcpyDeviceToHost), "download o");
  cuda_check(cudaMemcpy(hS.data(), S.p, S.bytes, cudaMemcpyDeviceToHost), "download S");
  for (std::size_t i = 0; i < ho.size(); ++i) out.o.data[i] = bf16_from_bits(ho[i]);
  for (std::size_t i = 0; i < hS.size(); ++i) out.S_final.data[i] = hS[i];
  return out;
}

double time_kda_decode(int B, int H, int iters) {
  const std::size_t D = 128, nqk = std::size_t(B) * H * D;
  Dev q(nqk * 2), k(nqk * 2), v(nqk * 2), g(nqk * 2), beta(std::size_t(B) * H * 2), A(H * 4), bias(H * D * 4),
      state(std::size_t(B) * H * D * D * 4), o(nqk * 2);
  kernels::fill_normal_bf16(q.as<bf16_t>(), nqk, 1, 1.0f, nullptr);
  kernels::fill_normal_bf16(k.as<bf16_t>(), nqk, 2, 1.0f, nullptr);
  kernels::fill_normal_bf16(v.as<bf16_t>(), nqk, 3, 1.0f, nullptr);
  kernels::fill_normal_bf16(g.as<bf16_t>(), nqk, 4, 1.0f, nullptr);
  kernels::fill_normal_bf16(beta.as<bf16_t>(), std::size_t(B) * H, 5, 1.0f, nullptr);
  kernels::fill_uniform_f32(A.as<float>(), H, 6, nullptr);
  kernels::fill_uniform_f32(bias.as<float>(), H * D, 7, nullptr);
  kernels::fill_normal_f32(state.as<float>(), std::size_t(B) * H * D * D, 8, 0.1f, nullptr);
  kernels::KdaDecodeArgs a;
  a.B = B;
  a.H = a.HV = H;
  a.D = 128;
  a.q = q.as<bf16_t>();
  a.k = k.as<bf16_t>();
  a.v = v.as<bf16_t>();
  a.g = g.as<bf16_t>();
  a.beta = beta.as<bf16_t>();
  a.gate.A_log = A.as<float>();
  a.gate.bias = bias.as<float>();
  a.scale = 1.0f / std::sqrt(128.0f);
  a.state = state.as<float>();
  a.o = o.as<bf16_t>();
  return median_time([&] { kernels::kda_decode(a, nullptr); }, iters);
}

double time_mla_decode(std::int64_t n, int H, int iters) {
  require(n >= 1 && n <= (std::int64_t{1} << 24), "time_mla_decode: n = " + std::to_string(n) + " must be in [1, 2^24]");
  const int d_c = 512;
  Dev C(std::size_t(n) * d_c * 2), q_hi(std::size_t(H) * d_c * 2), q_lo(std::size_t(H) * d_c * 2),
      out(std::size_t(H) * d_c * 4);
  kernels::fill_normal_bf16(C.as<bf16_t>(), std::size_t(n) * d_c, 11, 1.0f, nullptr);
  kernels::fill_normal_bf16(q_hi.as<bf16_t>(), std::size_t(H) * d_c, 12, 1.0f, nullptr);
  kernels::fill_normal_bf16(q_lo.as<bf16_t>(), std::size_t(H) * d_c, 13, 1.0f / 256.0f, nullptr);
  kernels::MlaDecodeArgs a;
  a.B = 1;
  a.H = H;
  a.capacity = a.max_len = static_cast<int>(n);
  a.c = C.as<bf16_t>();
  a.q_hi = q_hi.as<bf16_t>();
  a.q_lo = q_lo.as<bf16_t>();
  a.scale = 1.0f / std::sqrt(192.0f);
  a.out = out.as<float>();
  const std::size_t wsb = kernels::mla_decode_workspace_bytes(a);
  Dev ws(wsb);
  a.workspace = ws.p;
  a.workspace_bytes = wsb;
  return median_time([&] { kernels::mla_decode(a, nullptr); }, iters);
}

}  // namespace kdalab::gpu_exp
#endif
