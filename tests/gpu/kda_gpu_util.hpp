#pragma once
// Shared code of the KDA kernel tests (tests/gpu/test_kda_kernels.cpp; the MLA / AttnRes GPU tests use DevBuf and the
// up/downloads): device buffers, uploads of KdaInputs in bf16, runs of the prefill kernel (with forced plans:
// KdaPrefillOverrides) returning o and the final state as doubles, the float64 truth, varlen batches,
// prefill-then-decode, one head of the long T = 65536 problems.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "kernels/kda.hpp"
#include "kernels/common/random_fill.hpp"
#include "numerics/bf16.hpp"
#include "numerics/kda_inputs.hpp"
#include "numerics/random.hpp"
#include "reference/kda.hpp"

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

// make_long_memory (the long-memory variant of the inputs: the state carried across thousands of tokens, so the
// segment combine matters for o) is numerics/kda_inputs.hpp's, shared with the twin tests and `kdalab parity`.

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

/// The plan, state pass, schedule or phases a test forces (kernels::KdaPrefillOverrides; {} = the rule).
using Overrides = kernels::KdaPrefillOverrides;

/// Overrides forcing the state pass `pass` (schedule one-shot unless given).
inline Overrides force_pass(kernels::KdaStatePass pass,
                            kernels::KdaSchedule schedule = kernels::KdaSchedule::one_shot) {
  Overrides ov;
  ov.state_pass = pass;
  ov.schedule = schedule;
  return ov;
}
/// Overrides forcing the segment path with P segments (the mma state pass).
inline Overrides force_segments(int P) {
  Overrides ov;
  ov.schedule = kernels::KdaSchedule::segments;
  ov.segments = P;
  return ov;
}

/// Runs kda_prefill on `a` (with `ov`) with a fresh workspace of kda_prefill_workspace_bytes(a, &ov), poisoned first,
/// and waits; with `ws_out`, the workspace bytes are downloaded into it.
inline void run_on_fresh_workspace(kernels::KdaPrefillArgs a, const Overrides& ov = {},
                                   std::vector<unsigned char>* ws_out = nullptr) {
  const std::size_t wsb = kernels::kda_prefill_workspace_bytes(a, &ov);
  DevBuf ws(wsb);
  ws.poison();
  a.workspace = ws.p;
  a.workspace_bytes = wsb;
  kernels::kda_prefill(a, nullptr, &ov);
  cuda_check(cudaDeviceSynchronize(), "kda_prefill");
  if (ws_out) {
    ws_out->resize(wsb);
    cuda_check(cudaMemcpy(ws_out->data(), ws.p, wsb, cudaMemcpyDeviceToHost), "download workspace");
  }
}

/// Runs the prefill on `a` into the caller's o and S (both poisoned first; a fresh poisoned workspace) and waits.
inline void run_prefill_into(kernels::KdaPrefillArgs a, DevBuf& o, DevBuf& S, const Overrides& ov = {}) {
  o.poison();
  S.poison();
  a.o = o.as<bf16_t>();
  a.S_final = S.as<float>();
  run_on_fresh_workspace(a, ov);
}

/// Runs the prefill on `a` (o and S_final allocated here, poisoned first) and downloads both.
inline PrefillResult run_prefill(kernels::KdaPrefillArgs a, std::size_t o_elems, std::size_t s_elems,
                                 const Overrides& ov = {}) {
  DevBuf o(o_elems * 2), S(s_elems * 4);
  run_prefill_into(a, o, S, ov);
  return {download_bf16(o), download_f32(S)};
}

/// The float64 truth of `in`: the recurrence (reference/kda.hpp kda_recurrent, K3 report Eq. 1) on the derived
/// q, k, v, g, beta, from S0 (or from S = 0 when use_S0 is false).
inline KdaOutput<double> kda_truth(const KdaInputs& in, bool use_S0 = true) {
  Tensor<double> Z(in.S0.shape, 0.0);
  return kda_recurrent<double>(in.q, in.k, in.v, in.g, in.beta, use_S0 ? &in.S0 : &Z, in.scale);
}

/// Tokens [bos, bos + len) of a [1, T, ...] tensor.
inline Tensor<double> slice_tokens(const Tensor<double>& t, std::size_t bos, std::size_t len) {
  std::vector<std::size_t> shp = t.shape;
  const std::size_t row = t.numel() / (shp[0] * shp[1]);
  shp[1] = len;
  Tensor<double> r(shp);
  std::copy(t.data.begin() + bos * row, t.data.begin() + (bos + len) * row, r.data.begin());
  return r;
}

/// Sequence i of a varlen problem `all` (tokens [cu[i], cu[i + 1]), S0 from the per-sequence S0) as its own problem.
inline KdaInputs varlen_part(const KdaInputs& all, const Tensor<double>& S0, const std::vector<int>& cu, int i) {
  const std::size_t HV = all.HV, D = all.d_k, len = cu[i + 1] - cu[i];
  KdaInputs s = all;
  s.T = len;
  for (auto* t : {&s.q, &s.k, &s.v, &s.g, &s.beta, &s.q_raw, &s.k_raw, &s.g_raw, &s.beta_raw})
    *t = slice_tokens(*t, cu[i], len);
  s.S0 = Tensor<double>({1, HV, D, D});
  std::copy(S0.data.begin() + i * HV * D * D, S0.data.begin() + (i + 1) * HV * D * D, s.S0.data.begin());
  return s;
}

/// A varlen batch over `all` (B = 1, T = the sum of `lens`): one S0 per sequence ([N, HV, D, D], N(0, 0.1^2) fp32
/// values from s0_seed; written into all.S0, so upload `all` after this), cu_seqlens on the host and the device.
struct VarlenBatch {
  std::vector<int> lens, cu;  // cu: N + 1 offsets
  int N;
  Tensor<double> S0;
  DevBuf dcu;
  VarlenBatch(KdaInputs& all, std::vector<int> lens_, std::uint64_t s0_seed)
      : lens(std::move(lens_)), cu(lens.size() + 1, 0), N(static_cast<int>(lens.size())),
        S0({lens.size(), all.HV, all.d_k, all.d_k}), dcu(cu.size() * 4) {
    Rng rng(s0_seed);
    rng.fill_normal(S0, 0.1, Format::fp32);
    all.S0 = S0;
    for (int i = 0; i < N; ++i) cu[i + 1] = cu[i] + lens[i];
    cuda_check(cudaMemcpy(dcu.p, cu.data(), dcu.bytes, cudaMemcpyHostToDevice), "cu_seqlens");
  }
  /// Total tokens of `lens`.
  static int total(const std::vector<int>& lens) { return std::accumulate(lens.begin(), lens.end(), 0); }
  /// Points `a` at the device cu_seqlens (num_seqs, max_seqlen).
  void apply(kernels::KdaPrefillArgs& a) const {
    a.cu_seqlens = dcu.as<int>();
    a.num_seqs = N;
    a.max_seqlen = *std::max_element(lens.begin(), lens.end());
  }
  /// Sequence i as its own problem (varlen_part).
  KdaInputs part(const KdaInputs& all, int i) const { return varlen_part(all, S0, cu, i); }
  /// Sequence i's rows of a kernel output o [T, HV, D] and its block of a final state [N, HV, D, D].
  std::vector<double> o_of(const std::vector<double>& o, int i, std::size_t HV, std::size_t D) const {
    return std::vector<double>(o.begin() + cu[i] * HV * D, o.begin() + cu[i + 1] * HV * D);
  }
  std::vector<double> S_of(const std::vector<double>& S, int i, std::size_t HV, std::size_t D) const {
    return std::vector<double>(S.begin() + i * HV * D * D, S.begin() + (i + 1) * HV * D * D);
  }
};

/// Prefill of the first T0 tokens of `in` with `a` (from prefill_args(in, d)) and `ov` as a
/// strided view of d's [B, in.T, ...] buffers, then decode steps T0 .. in.T - 1 (kda_decode: same gate, scale and D)
/// on the prefill's final state. o [B, in.T, HV, D], the state and the workspace are poisoned first. Returns o
/// (all in.T rows) and the state after in.T tokens, as doubles.
inline PrefillResult prefill_then_decode(const KdaInputs& in, const DevInputs& d, kernels::KdaPrefillArgs a,
                                         std::size_t T0, const Overrides& ov = {}) {
  const std::size_t B = in.B, H = in.H, HV = in.HV, D = in.d_k;
  a.T = static_cast<int>(T0);
  a.sq.b = a.sk.b = static_cast<std::int64_t>(in.T * H * D);
  a.sv.b = a.sg.b = a.so.b = static_cast<std::int64_t>(in.T * HV * D);
  a.sbeta.b = static_cast<std::int64_t>(in.T * HV);
  a.sq.t = a.sk.t = static_cast<std::int64_t>(H * D);
  a.sv.t = a.sg.t = a.so.t = static_cast<std::int64_t>(HV * D);
  a.sbeta.t = static_cast<std::int64_t>(HV);
  DevBuf o(B * in.T * HV * D * 2), S(B * HV * D * D * 4);
  run_prefill_into(a, o, S, ov);
  kernels::KdaDecodeArgs dd;
  dd.B = static_cast<int>(B);
  dd.H = static_cast<int>(H);
  dd.HV = static_cast<int>(HV);
  dd.D = static_cast<int>(D);
  dd.sq_b = dd.sk_b = static_cast<std::int64_t>(in.T * H * D);
  dd.sv_b = dd.sg_b = dd.so_b = static_cast<std::int64_t>(in.T * HV * D);
  dd.sbeta_b = static_cast<std::int64_t>(in.T * HV);
  dd.gate = a.gate;
  dd.scale = a.scale;
  dd.state = S.as<float>();
  for (std::size_t t = T0; t < in.T; ++t) {
    dd.q = d.q.as<bf16_t>() + t * H * D;
    dd.k = d.k.as<bf16_t>() + t * H * D;
    dd.v = d.v.as<bf16_t>() + t * HV * D;
    dd.g = d.g.as<bf16_t>() + t * HV * D;
    dd.beta = d.beta.as<bf16_t>() + t * HV;
    dd.o = o.as<bf16_t>() + t * HV * D;
    kernels::kda_decode(dd, nullptr);
  }
  cuda_check(cudaDeviceSynchronize(), "prefill + decode");
  return {download_bf16(o), download_f32(S)};
}

/// Value head hv of a LongKdaInputs problem as a B = 1, H = HV = 1 problem (heads are independent): its q, k, v,
/// g, beta, A_log, bias and S0 downloaded from the device, g_min = -5, scale D^-1/2, derived tensors computed.
inline KdaInputs long_head_inputs(const LongKdaInputs& li, std::size_t hv) {
  const std::size_t T = li.T, H = li.H, D = li.D;
  auto mk = [](std::vector<std::size_t> shp, std::vector<double> data) {
    Tensor<double> t(std::move(shp));
    if (t.data.size() != data.size()) throw Error("long_head_inputs: tensor size mismatch");
    t.data = std::move(data);
    return t;
  };
  std::vector<float> A_h(H), bias_h(H * D), S0_h(H * D * D);
  cuda_check(cudaMemcpy(A_h.data(), li.A_log.p, li.A_log.bytes, cudaMemcpyDeviceToHost), "A_log");
  cuda_check(cudaMemcpy(bias_h.data(), li.bias.p, li.bias.bytes, cudaMemcpyDeviceToHost), "bias");
  cuda_check(cudaMemcpy(S0_h.data(), li.S0.p, li.S0.bytes, cudaMemcpyDeviceToHost), "S0");
  KdaInputs in;
  in.B = 1; in.T = T; in.H = 1; in.HV = 1; in.d_k = D; in.d_v = D;
  in.g_min = -5.0;
  in.scale = 1.0 / std::sqrt(static_cast<double>(D));
  in.q_raw = mk({1, T, 1, D}, download_head_bf16(li.q.as<bf16_t>(), T, H, hv, D));
  in.k_raw = mk({1, T, 1, D}, download_head_bf16(li.k.as<bf16_t>(), T, H, hv, D));
  in.v = mk({1, T, 1, D}, download_head_bf16(li.v.as<bf16_t>(), T, H, hv, D));
  in.g_raw = mk({1, T, 1, D}, download_head_bf16(li.g.as<bf16_t>(), T, H, hv, D));
  in.beta_raw = mk({1, T, 1}, download_head_bf16(li.beta.as<bf16_t>(), T, H, hv, 1));
  in.A_log = mk({1}, std::vector<double>{A_h[hv]});
  in.bias = mk({1, D}, std::vector<double>(bias_h.begin() + hv * D, bias_h.begin() + (hv + 1) * D));
  in.S0 = mk({1, 1, D, D}, std::vector<double>(S0_h.begin() + hv * D * D, S0_h.begin() + (hv + 1) * D * D));
  derive_kda(in);
  return in;
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
