// The _host_* functions of the Python module (CUDA builds): kdalab's kernels run the way the C++ GPU
// tests run them, from host float64 arrays (bf16 / fp32 values) uploaded with cudaMemcpy into fresh
// cudaMalloc buffers, arguments at their contiguous defaults, outputs downloaded as float64 (exact).
// The KDA path is the GPU tests' own (tests/gpu/kda_gpu_util.hpp: DevInputs, prefill_args,
// prefill_then_decode). python/tests/test_cuda_kernels.py compares the torch entry points
// (python/src/cuda_kernels.cpp) with these bit for bit on the same inputs.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include <map>
#include <string>

#include "kernels/attn_res.hpp"
#include "kernels/mla.hpp"
#include "kernels/mla_prefill.hpp"
#include "python/src/arrays.hpp"
#include "python/src/cuda_kernels.hpp"
#include "tests/gpu/kda_gpu_util.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kdalab::py {
namespace {

namespace K = kdalab::kernels;
using kda_gpu::DevBuf;
using kda_gpu::download_bf16;
using kda_gpu::download_f32;
using kda_gpu::upload_bf16;
using kda_gpu::upload_f32;

Tensor<double> from(std::vector<double> v, std::vector<std::size_t> shape) {
  Tensor<double> t(std::move(shape));
  require(t.numel() == v.size(), "host path: downloaded size mismatch");
  t.data = std::move(v);
  return t;
}

const Tensor<double>& pick(const std::map<std::string, Tensor<double>>& m, const char* name) {
  const auto it = m.find(name);
  require(it != m.end(), std::string("host path: tensor '") + name + "' is missing");
  return it->second;
}

std::map<std::string, Tensor<double>> tensors_in(const std::map<std::string, Array>& m) {
  std::map<std::string, Tensor<double>> r;
  for (const auto& [k, a] : m) r.emplace(k, tensor_in(a, k));
  return r;
}

}  // namespace

void bind_cuda_host_path(nb::module_& m) {
  // KDA: prefill of tokens [0, T0), then decode steps T0 .. T - 1 on its final state (the GPU tests'
  // prefill_then_decode). Tensors of kdalab.anchor_kda (q_raw, k_raw [B, T, H, D]; v, g_raw [B, T, HV, D];
  // beta_raw [B, T, HV]; A_log [HV]; bias [HV, D]; S0 [B, HV, D, D]). Returns (o [B, T, HV, D], S).
  m.def("_host_kda_prefill_then_decode",
        [](const std::map<std::string, Array>& arrays, double g_min, double scale, std::size_t T0) {
          const auto t = tensors_in(arrays);
          KdaInputs in;
          in.q_raw = pick(t, "q_raw");
          in.k_raw = pick(t, "k_raw");
          in.v = pick(t, "v");
          in.g_raw = pick(t, "g_raw");
          in.beta_raw = pick(t, "beta_raw");
          in.A_log = pick(t, "A_log");
          in.bias = pick(t, "bias");
          in.S0 = pick(t, "S0");
          require(in.q_raw.rank() == 4 && in.v.rank() == 4, "host path: q_raw and v must be [B, T, heads, D]");
          in.B = in.q_raw.dim(0);
          in.T = in.q_raw.dim(1);
          in.H = in.q_raw.dim(2);
          in.d_k = in.d_v = in.q_raw.dim(3);
          in.HV = in.v.dim(2);
          in.g_min = g_min;
          in.scale = scale;
          require(T0 >= 1 && T0 <= in.T, "host path: T0 outside [1, T]");
          const kda_gpu::DevInputs d(in);
          const kda_gpu::PrefillResult r =
              kda_gpu::prefill_then_decode(in, d, kda_gpu::prefill_args(in, d), T0);
          return nb::make_tuple(tensor_out(from(r.o, {in.B, in.T, in.HV, in.d_v})),
                                tensor_out(from(r.S, {in.B, in.HV, in.d_k, in.d_v})));
        },
        "arrays"_a, "g_min"_a, "scale"_a, "T0"_a);

  // MLA: q~ = absorb(q_C, W_UK) then one decode step over the cache c [B, N, d_c] (all N tokens).
  // q_C [B, H, d_nope]. Returns (q_hi, q_lo [B, H, d_c], a [B, H, d_c]).
  m.def("_host_mla_absorb_decode",
        [](const Array& q_C_a, const Array& W_UK_a, const Array& c_a, double scale) {
          const Tensor<double> q_C = tensor_in(q_C_a, "q_C"), W_UK = tensor_in(W_UK_a, "W_UK"), c = tensor_in(c_a, "c");
          const std::size_t B = q_C.dim(0), H = q_C.dim(1), dn = q_C.dim(2), dc = W_UK.dim(1), N = c.dim(1);
          const DevBuf dq = upload_bf16(q_C), dw = upload_bf16(W_UK), dcache = upload_bf16(c);
          DevBuf hi(B * H * dc * 2), lo(B * H * dc * 2), out(B * H * dc * 4);
          K::MlaAbsorbArgs ab;
          ab.n = static_cast<int>(B);
          ab.H = static_cast<int>(H);
          ab.d_nope = static_cast<int>(dn);
          ab.d_c = static_cast<int>(dc);
          ab.q_C = dq.as<K::bf16_t>();
          ab.W_UK = dw.as<K::bf16_t>();
          ab.q_hi = hi.as<K::bf16_t>();
          ab.q_lo = lo.as<K::bf16_t>();
          K::mla_absorb_query(ab, nullptr);
          K::MlaDecodeArgs a;
          a.B = static_cast<int>(B);
          a.H = static_cast<int>(H);
          a.d_c = static_cast<int>(dc);
          a.capacity = a.max_len = static_cast<int>(N);
          a.c = dcache.as<K::bf16_t>();
          a.q_hi = hi.as<K::bf16_t>();
          a.q_lo = lo.as<K::bf16_t>();
          a.scale = static_cast<float>(scale);
          a.out = out.as<float>();
          DevBuf ws(K::mla_decode_workspace_bytes(a));
          a.workspace = ws.p;
          a.workspace_bytes = ws.bytes;
          K::mla_decode(a, nullptr);
          kda_gpu::cuda_check(cudaDeviceSynchronize(), "mla decode");
          return nb::make_tuple(tensor_out(from(download_bf16(hi), {B, H, dc})),
                                tensor_out(from(download_bf16(lo), {B, H, dc})),
                                tensor_out(from(download_f32(out), {B, H, dc})));
        },
        "q_C"_a, "W_UK"_a, "c"_a, "scale"_a);

  // MLA prefill with per-head output (mla_prefill_heads): cache c [B, N_max, d_c] (rows < prefix cached),
  // c_new [B, T, d_c], q_C [B, T, H, d_nope], W_UK, W_UV [H 128, d_c]. Returns (o [B, T, H, d_v], cache after).
  m.def("_host_mla_prefill",
        [](const Array& c_a, const Array& c_new_a, const Array& q_C_a, const Array& W_UK_a, const Array& W_UV_a,
           int prefix, double scale, const std::string& path, const std::string& precision) {
          const Tensor<double> c = tensor_in(c_a, "c"), c_new = tensor_in(c_new_a, "c_new"), q_C = tensor_in(q_C_a, "q_C"),
                               W_UK = tensor_in(W_UK_a, "W_UK"), W_UV = tensor_in(W_UV_a, "W_UV");
          const std::size_t B = q_C.dim(0), T = q_C.dim(1), H = q_C.dim(2), dn = q_C.dim(3), dc = W_UK.dim(1),
                            dv = W_UV.dim(0) / H, N = c.dim(1);
          DevBuf dcache = upload_bf16(c);
          const DevBuf dnew = upload_bf16(c_new), dq = upload_bf16(q_C), dk = upload_bf16(W_UK), dvw = upload_bf16(W_UV);
          DevBuf out(B * T * H * dv * 4);
          K::MlaPrefillHeadsArgs a;
          a.B = static_cast<int>(B);
          a.T = static_cast<int>(T);
          a.H = static_cast<int>(H);
          a.d_c = static_cast<int>(dc);
          a.d_nope = static_cast<int>(dn);
          a.d_v = static_cast<int>(dv);
          a.capacity = static_cast<int>(N);
          a.prefix = prefix;
          a.c = dcache.as<K::bf16_t>();
          a.c_new = dnew.as<K::bf16_t>();
          a.q_C = dq.as<K::bf16_t>();
          a.W_UK = dk.as<K::bf16_t>();
          a.W_UV = dvw.as<K::bf16_t>();
          a.scale = static_cast<float>(scale);
          a.out = out.as<float>();
          a.precision = precision == "fast"       ? K::MlaPrefillPrecision::fast
                        : precision == "accurate" ? K::MlaPrefillPrecision::accurate
                                                  : K::MlaPrefillPrecision::automatic;
          K::MlaPrefillOverrides ov;
          ov.path = path == "naive" ? K::MlaPrefillPath::naive
                    : path == "absorbed" ? K::MlaPrefillPath::absorbed : K::MlaPrefillPath::automatic;
          DevBuf ws(K::mla_prefill_heads_workspace_bytes(a, &ov));
          a.workspace = ws.p;
          a.workspace_bytes = ws.bytes;
          K::mla_prefill_heads(a, nullptr, &ov);
          kda_gpu::cuda_check(cudaDeviceSynchronize(), "mla prefill");
          return nb::make_tuple(tensor_out(from(download_f32(out), {B, T, H, dv})),
                                tensor_out(from(download_bf16(dcache), {B, N, dc})));
        },
        "c"_a, "c_new"_a, "q_C"_a, "W_UK"_a, "W_UV"_a, "prefix"_a, "scale"_a, "path"_a, "precision"_a = "auto");

  // AttnRes over src [S, T, d] (bf16 values) with pseudo-query w [d] (fp32 values). Returns out_f32 [T, d].
  m.def("_host_attn_res",
        [](const Array& src_a, const Array& w_a, double eps) {
          const Tensor<double> src = tensor_in(src_a, "src"), w = tensor_in(w_a, "w");
          const std::size_t S = src.dim(0), T = src.dim(1), d = src.dim(2);
          const DevBuf ds = upload_bf16(src), dw = upload_f32(w);
          DevBuf out(T * d * 4);
          K::AttnResArgs a;
          a.T = static_cast<int>(T);
          a.S = static_cast<int>(S);
          a.d = static_cast<int>(d);
          a.src = ds.as<K::bf16_t>();
          a.w = dw.as<float>();
          a.eps = static_cast<float>(eps);
          a.out_f32 = out.as<float>();
          K::attn_res(a, nullptr);
          kda_gpu::cuda_check(cudaDeviceSynchronize(), "attn_res");
          return tensor_out(from(download_f32(out), {T, d}));
        },
        "src"_a, "w"_a, "eps"_a);
}

}  // namespace kdalab::py
