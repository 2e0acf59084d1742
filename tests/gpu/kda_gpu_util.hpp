#pragma once
// Helpers of the KDA kernel tests and the bench: device buffers, uploads of KdaInputs in bf16,
// and a run of the prefill kernel returning o and the final state as doubles.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/kda.hpp"
#include "kernels/random_fill.hpp"
#include "numerics/bf16.hpp"
#include "numerics/random.hpp"

namespace kda_gpu {
using namespace kdalab;
using kernels::bf16_t;
using kernels::cuda_check;

/// An owning device allocation (cudaMalloc), poisoned with 0xFF bytes (bf16/fp32 NaN) on request.
struct DevBuf {
  void* p = nullptr;
  std::size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(std::size_t n) : bytes(n) { cuda_check(cudaMalloc(&p, n ? n : 16), "cudaMalloc"); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  ~DevBuf() { if (p) cudaFree(p); }
  template <class T> T* as() const { return static_cast<T*>(p); }
  void poison() { cuda_check(cudaMemset(p, 0xFF, bytes), "cudaMemset poison"); }
};

/// One long sequence of KDA prefill inputs filled on the device (B = 1, HV = H, d_k = d_v = D): q, k, v and the
/// raw gate logits g ~ N(0, 1) bf16, beta logits N(0, 1), A_log and bias U(0, 1) fp32, S0 N(0, 0.1^2) fp32, from
/// seed + 1 .. seed + 8; `a` points at them (K3 gate, g_min = -5, scale D^-1/2, S0 given; o, S_final, workspace
/// left to the caller). The inputs of the T = 65536 [long] cases.
struct LongKdaInputs {
  std::size_t T, H, D, nq;
  DevBuf q, k, v, g, beta, A_log, bias, S0;
  kernels::KdaPrefillArgs a;
  LongKdaInputs(std::size_t T_, std::size_t H_, std::size_t D_, std::uint64_t seed)
      : T(T_), H(H_), D(D_), nq(T_ * H_ * D_), q(nq * 2), k(nq * 2), v(nq * 2), g(nq * 2), beta(T * H * 2),
        A_log(H * 4), bias(H * D * 4), S0(H * D * D * 4) {
    kernels::fill_normal_bf16(q.as<bf16_t>(), nq, seed + 1, 1.0f, nullptr);
    kernels::fill_normal_bf16(k.as<bf16_t>(), nq, seed + 2, 1.0f, nullptr);
    kernels::fill_normal_bf16(v.as<bf16_t>(), nq, seed + 3, 1.0f, nullptr);
    kernels::fill_normal_bf16(g.as<bf16_t>(), nq, seed + 4, 1.0f, nullptr);
    kernels::fill_normal_bf16(beta.as<bf16_t>(), T * H, seed + 5, 1.0f, nullptr);
    kernels::fill_uniform_f32(A_log.as<float>(), H, seed + 6, nullptr);
    kernels::fill_uniform_f32(bias.as<float>(), H * D, seed + 7, nullptr);
    kernels::fill_normal_f32(S0.as<float>(), H * D * D, seed + 8, 0.1f, nullptr);
    cuda_check(cudaDeviceSynchronize(), "fill");
    a.B = 1; a.T = static_cast<int>(T); a.H = static_cast<int>(H); a.HV = static_cast<int>(H); a.D = static_cast<int>(D);
    a.q = q.as<bf16_t>(); a.k = k.as<bf16_t>(); a.v = v.as<bf16_t>(); a.g = g.as<bf16_t>(); a.beta = beta.as<bf16_t>();
    a.gate.A_log = A_log.as<float>(); a.gate.bias = bias.as<float>(); a.gate.g_min = -5.0f;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.S0 = S0.as<float>();
  }
};

inline DevBuf upload_bf16(const Tensor<double>& t) {
  std::vector<bf16_t> h(t.numel());
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = bf16_bits(round_bf16(t.data[i]));
  DevBuf d(h.size() * 2);
  cuda_check(cudaMemcpy(d.p, h.data(), d.bytes, cudaMemcpyHostToDevice), "upload bf16");
  return d;
}
inline DevBuf upload_f32(const Tensor<double>& t) {
  std::vector<float> h(t.numel());
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(t.data[i]);
  DevBuf d(h.size() * 4);
  cuda_check(cudaMemcpy(d.p, h.data(), d.bytes, cudaMemcpyHostToDevice), "upload f32");
  return d;
}
inline std::vector<double> download_bf16(const DevBuf& d) {
  std::vector<bf16_t> h(d.bytes / 2);
  cuda_check(cudaMemcpy(h.data(), d.p, d.bytes, cudaMemcpyDeviceToHost), "download bf16");
  std::vector<double> r(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) r[i] = bf16_from_bits(h[i]);
  return r;
}
inline std::vector<double> download_f32(const DevBuf& d) {
  std::vector<float> h(d.bytes / 4);
  cuda_check(cudaMemcpy(h.data(), d.p, d.bytes, cudaMemcpyDeviceToHost), "download f32");
  return std::vector<double>(h.begin(), h.end());
}

/// The kernel sees A_log and bias in fp32: round them in the inputs and re-derive q, k, g, beta, so
/// the float64 truth runs on exactly the kernel's inputs.
inline void round_gate_params_fp32(KdaInputs& in) {
  for (auto& x : in.A_log.data) x = static_cast<float>(x);
  for (auto& x : in.bias.data) x = static_cast<float>(x);
  derive_kda(in);
}

/// anchor-kda inputs with HV = group * H (q_raw, k_raw cut to H heads), d_k = d_v = D, gate params in fp32.
inline KdaInputs make_inputs(std::size_t B, std::size_t T, std::size_t H, std::size_t group, std::uint64_t seed,
                             std::size_t D = 128) {
  KdaInputs in = anchor_kda(B, T, H * group, D, seed);
  if (group > 1) {
    Tensor<double> q({B, T, H, D}), k({B, T, H, D});
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t i = 0; i < D; ++i) {
            q(b, t, h, i) = in.q_raw(b, t, h, i);
            k(b, t, h, i) = in.k_raw(b, t, h, i);
          }
    in.q_raw = q;
    in.k_raw = k;
    in.H = H;
  }
  round_gate_params_fp32(in);
  return in;
}

/// The long-memory variant of `in` (decay ~ -3e-5 per token: A_log = 0, bias = -12; beta ~ 0.007:
/// beta_raw - 5): the state is carried across thousands of tokens, so the v5 segment combine
/// (S_start = A_seg S_start + B_seg) matters for o; on the anchor gates the state is forgotten within
/// a few tokens. Raw values stay bf16 / fp32 representable; derived tensors recomputed.
inline void make_long_memory(KdaInputs& in) {
  for (auto& x : in.A_log.data) x = 0.0;
  for (auto& x : in.bias.data) x = -12.0;
  for (auto& x : in.beta_raw.data) x = round_bf16(x - 5.0);
  derive_kda(in);
}

/// Rows [0, T) of value (or key) head `head` of a device [1, T, heads, 128] bf16 tensor, as doubles.
inline std::vector<double> download_head_bf16(const bf16_t* p, std::size_t T, std::size_t heads, std::size_t head,
                                              std::size_t width = 128) {
  std::vector<bf16_t> h(T * width);
  cuda_check(cudaMemcpy2D(h.data(), width * 2, p + head * width, heads * width * 2, width * 2, T, cudaMemcpyDeviceToHost),
             "download head");
  std::vector<double> r(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) r[i] = bf16_from_bits(h[i]);
  return r;
}

/// Device copies of one problem's inputs.
struct DevInputs {
  DevBuf q, k, v, g, beta, A_log, bias, S0;
  explicit DevInputs(const KdaInputs& in)
      : q(upload_bf16(in.q_raw)), k(upload_bf16(in.k_raw)), v(upload_bf16(in.v)), g(upload_bf16(in.g_raw)),
        beta(upload_bf16(in.beta_raw)), A_log(upload_f32(in.A_log)), bias(upload_f32(in.bias)), S0(upload_f32(in.S0)) {}
};

inline kernels::KdaPrefillArgs prefill_args(const KdaInputs& in, const DevInputs& d, bool use_S0 = true) {
  kernels::KdaPrefillArgs a;
  a.B = static_cast<int>(in.B);
  a.T = static_cast<int>(in.T);
  a.H = static_cast<int>(in.H);
  a.HV = static_cast<int>(in.HV);
  a.D = static_cast<int>(in.d_k);
  a.q = d.q.as<bf16_t>();
  a.k = d.k.as<bf16_t>();
  a.v = d.v.as<bf16_t>();
  a.g = d.g.as<bf16_t>();
  a.beta = d.beta.as<bf16_t>();
  a.gate.A_log = d.A_log.as<float>();
  a.gate.bias = d.bias.as<float>();
  a.gate.g_min = static_cast<float>(in.g_min);
  a.scale = static_cast<float>(in.scale);
  a.S0 = use_S0 ? d.S0.as<float>() : nullptr;
  return a;
}

struct PrefillResult {
  std::vector<double> o, S;
};

/// Runs the prefill on `a` (o and S_final allocated here, poisoned first) and downloads both.
inline PrefillResult run_prefill(kernels::KdaPrefillArgs a, std::size_t o_elems, std::size_t s_elems) {
  DevBuf o(o_elems * 2), S(s_elems * 4);
  o.poison();
  S.poison();
  a.o = o.as<bf16_t>();
  a.S_final = S.as<float>();
  const std::size_t wsb = kernels::kda_prefill_workspace_bytes(a);
  DevBuf ws(wsb);
  ws.poison();
  a.workspace = ws.p;
  a.workspace_bytes = wsb;
  kernels::kda_prefill(a, nullptr);
  cuda_check(cudaDeviceSynchronize(), "kda_prefill");
  return {download_bf16(o), download_f32(S)};
}

/// Captures `launch(stream)` into a CUDA graph on a fresh stream, replays the graph `replays` times
/// and synchronises; the stream, graph and executable graph are released also when a call throws.
template <class F>
void run_in_graph(F&& launch, int replays = 1) {
  cudaStream_t s = nullptr;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  cuda_check(cudaStreamCreate(&s), "stream");
  auto release = [&] {
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(s);
  };
  try {
    cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
    launch(s);
    cuda_check(cudaStreamEndCapture(s, &g), "end capture");
    cuda_check(cudaGraphInstantiate(&ge, g, 0), "instantiate");
    for (int i = 0; i < replays; ++i) cuda_check(cudaGraphLaunch(ge, s), "graph launch");
    cuda_check(cudaStreamSynchronize(s), "sync");
  } catch (...) {
    release();
    throw;
  }
  release();
}

}  // namespace kda_gpu
