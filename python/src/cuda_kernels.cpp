// The CUDA entry points of the Python module (built with KDALAB_CUDA only): kdalab's kernels
// (kernels/kda.hpp, mla.hpp, mla_prefill.hpp, attn_res.hpp) on CUDA arrays taken through DLPack
// (torch tensors; no libtorch linked). Every array, outputs and workspace included, is the caller's:
// nothing is allocated here, every launch goes to the caller's stream (an int, cudaStream_t; 0 the
// legacy default stream), so the calls can be captured in CUDA graphs as the kernels allow. The
// Python wrappers of kdalab/cuda.py allocate, pick torch's current stream and document each call.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/attn_res.hpp"
#include "kernels/kda.hpp"
#include "kernels/kda_backward.hpp"
#include "kernels/mla.hpp"
#include "kernels/mla_prefill.hpp"
#include "python/src/arrays.hpp"
#include "python/src/cuda_kernels.hpp"
#include "python/src/docstrings.hpp"
#include "reference/error.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kdalab::py {
namespace {

namespace K = kdalab::kernels;
using Dev = nb::ndarray<>;

enum class DType { bf16, f32, i32, u8 };

const char* dtype_str(DType t) {
  switch (t) {
    case DType::bf16: return "bfloat16";
    case DType::f32: return "float32";
    case DType::i32: return "int32";
    case DType::u8: return "uint8";
  }
  return "?";
}

bool dtype_is(const nb::dlpack::dtype& d, DType t) {
  if (d.lanes != 1) return false;
  switch (t) {
    case DType::bf16: return d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) && d.bits == 16;
    case DType::f32: return d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && d.bits == 32;
    case DType::i32: return d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) && d.bits == 32;
    case DType::u8: return d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt) && d.bits == 8;
  }
  return false;
}

std::vector<std::size_t> shape_vec(const Dev& a) {
  std::vector<std::size_t> s(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) s[i] = a.shape(i);
  return s;
}

/// Checks that array `name` is on the current CUDA device, of dtype t, C-contiguous, of rank `rank`; returns
/// its shape. Errors (kdalab::Error) name the tensor, the value and what is accepted.
std::vector<std::size_t> check_dev(const Dev& a, const std::string& name, DType t, std::size_t rank) {
  require(a.device_type() == nb::device::cuda::value,
          "tensor '" + name + "' is not on a CUDA device (DLPack device type " + std::to_string(a.device_type()) +
              "); the CUDA kernels take CUDA tensors: pass " + name + ".cuda()");
  int cur = 0;
  K::cuda_check(cudaGetDevice(&cur), "cudaGetDevice");
  require(a.device_id() == cur, "tensor '" + name + "' is on CUDA device " + std::to_string(a.device_id()) +
                                    ", the current device is " + std::to_string(cur) +
                                    "; accepted: tensors on the current device (torch.cuda.set_device)");
  require(dtype_is(a.dtype(), t), "tensor '" + name + "' has dtype " + dtype_name(a.dtype()) + "; accepted: " +
                                      dtype_str(t));
  const std::vector<std::size_t> s = shape_vec(a);
  require(s.size() == rank, "tensor '" + name + "' has shape " + shape_str(s) + "; expected " + std::to_string(rank) +
                                " dimensions");
  std::int64_t expect = 1;
  bool contiguous = true;
  for (std::size_t i = s.size(); i-- > 0;) {
    if (s[i] != 1 && a.stride(i) != expect) contiguous = false;
    expect *= static_cast<std::int64_t>(s[i]);
  }
  require(expect == 0 || contiguous, "tensor '" + name + "' of shape " + shape_str(s) +
                                         " is not C-contiguous (row-major); pass " + name + ".contiguous()");
  return s;
}

/// check_dev, then the exact shape `want`.
void check_shape(const Dev& a, const std::string& name, DType t, const std::vector<std::size_t>& want) {
  const auto s = check_dev(a, name, t, want.size());
  require(s == want, "tensor '" + name + "' has shape " + shape_str(s) + ", expected " + shape_str(want));
}

template <class T>
T* ptr(const Dev& a) {
  return static_cast<T*>(a.data());
}
template <class T>
T* opt_ptr(const std::optional<Dev>& a) {
  return a ? static_cast<T*>(a->data()) : nullptr;
}

int as_int(std::size_t v, const std::string& what) {
  require(v <= 0x7fffffffu, what + " = " + std::to_string(v) + " is too large; accepted: < 2^31");
  return static_cast<int>(v);
}

cudaStream_t stream_of(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

/// Bytes of a 1-D uint8 workspace, checked against what the kernel needs.
std::size_t check_workspace(const Dev& ws, std::size_t need) {
  const auto s = check_dev(ws, "workspace", DType::u8, 1);
  require(s[0] >= need, "tensor 'workspace' has " + std::to_string(s[0]) + " bytes; the call needs " +
                            std::to_string(need) + " (the *_workspace_bytes function)");
  return s[0];
}

// ---- KDA ----------------------------------------------------------------------------------------------

/// The inputs the prefill and the decode step share, checked (device, dtype, contiguous, shape) and filled into `a`
/// (a K::KdaPrefillArgs or K::KdaDecodeArgs): q, k [lead..., H, D]; v, g [lead..., HV, D]; beta [lead..., HV];
/// A_log [HV]; bias [HV, D] (the gate), with lead = [B, T] for the prefill and [B] for the decode; also g_min,
/// scale, l2norm_qk, beta_sigmoid. Returns the shape of q with H replaced by HV, i.e. that of o [lead..., HV, D].
/// Errors: kdalab::Error naming the tensor or size.
template <class Args>
std::vector<std::size_t> kda_inputs(Args& a, const Dev& q, const Dev& k, const Dev& v, const Dev& g, const Dev& beta,
                                    const Dev& A_log, const Dev& bias, double g_min, double scale, bool l2norm_qk,
                                    bool beta_sigmoid) {
  constexpr bool prefill = std::is_same_v<Args, K::KdaPrefillArgs>;
  constexpr std::size_t lead = prefill ? 2 : 1;  // [B, T] or [B]
  const auto sq = check_dev(q, "q", DType::bf16, lead + 2);
  const auto sv = check_dev(v, "v", DType::bf16, lead + 2);
  const std::size_t H = sq[lead], D = sq[lead + 1], HV = sv[lead];
  auto heads = sq;  // lead..., H, D
  check_shape(k, "k", DType::bf16, heads);
  heads[lead] = HV;  // lead..., HV, D
  check_shape(v, "v", DType::bf16, heads);
  check_shape(g, "g", DType::bf16, heads);
  check_shape(beta, "beta", DType::bf16, std::vector<std::size_t>(heads.begin(), heads.end() - 1));
  check_shape(A_log, "A_log", DType::f32, {HV});
  check_shape(bias, "bias", DType::f32, {HV, D});
  a.B = as_int(sq[0], "B");
  if constexpr (prefill) a.T = as_int(sq[1], "T");
  a.H = as_int(H, "H");
  a.HV = as_int(HV, "HV");
  a.D = as_int(D, "D");
  a.q = ptr<const K::bf16_t>(q);
  a.k = ptr<const K::bf16_t>(k);
  a.v = ptr<const K::bf16_t>(v);
  a.g = ptr<const K::bf16_t>(g);
  a.beta = ptr<const K::bf16_t>(beta);
  a.gate.A_log = ptr<const float>(A_log);
  a.gate.bias = ptr<const float>(bias);
  a.gate.g_min = static_cast<float>(g_min);
  a.scale = static_cast<float>(scale);
  a.l2norm_qk = l2norm_qk;
  a.beta_sigmoid = beta_sigmoid;
  return heads;
}

/// cu_seqlens (int32 [N + 1] on the device) into the argument set `a` (KdaPrefillArgs or KdaBackwardArgs) with B = 1;
/// returns N. max_seqlen: the longest sequence (host-known), checked by the kernel. Errors name the tensor.
template <class Args>
std::size_t apply_cu_seqlens(Args& a, const Dev& cu, std::int64_t max_seqlen) {
  const auto s = check_dev(cu, "cu_seqlens", DType::i32, 1);
  require(s[0] >= 2, "tensor 'cu_seqlens' has shape " + shape_str(s) + "; accepted: [N + 1] with N >= 1 sequences");
  a.cu_seqlens = ptr<const int>(cu);
  a.num_seqs = as_int(s[0] - 1, "num_seqs");
  a.max_seqlen = static_cast<int>(max_seqlen);
  return s[0] - 1;
}

/// The prefill's arguments from the arrays (shapes from q [B, T, H, D] and v [B, T, HV, D]); no workspace.
K::KdaPrefillArgs kda_prefill_args(const Dev& q, const Dev& k, const Dev& v, const Dev& g, const Dev& beta,
                                   const Dev& A_log, const Dev& bias, const Dev& o, const std::optional<Dev>& S0,
                                   const std::optional<Dev>& S_final, double g_min, double scale, bool l2norm_qk,
                                   bool beta_sigmoid, bool single_stream, const std::optional<Dev>& cu_seqlens,
                                   std::int64_t max_seqlen, bool gate_fused) {
  K::KdaPrefillArgs a;
  const auto so = kda_inputs(a, q, k, v, g, beta, A_log, bias, g_min, scale, l2norm_qk, beta_sigmoid);
  const std::size_t HV = so[2], D = so[3];
  const std::size_t N = cu_seqlens ? apply_cu_seqlens(a, *cu_seqlens, max_seqlen) : so[0];
  check_shape(o, "o", DType::bf16, so);
  if (S0) check_shape(*S0, "S0", DType::f32, {N, HV, D, D});
  if (S_final) check_shape(*S_final, "S_final", DType::f32, {N, HV, D, D});
  a.gate.fused = gate_fused;  // false: g is the log-decay, the caller's range (A_log, bias not read)
  a.gate.allow_unsafe_range = !gate_fused;
  a.S0 = opt_ptr<const float>(S0);
  a.S_final = opt_ptr<float>(S_final);
  a.o = ptr<K::bf16_t>(o);
  a.single_stream = single_stream;
  return a;
}

K::KdaPrefillArgs kda_prefill_shape(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t HV, std::int64_t D,
                                    bool single_stream, std::int64_t num_seqs = 0) {
  K::KdaPrefillArgs a;
  const auto n = [](std::int64_t v, const char* name) {
    require(v >= 1 && v <= 0x7fffffff, std::string(name) + " = " + std::to_string(v) + "; accepted: >= 1");
    return static_cast<int>(v);
  };
  a.B = n(B, "B");
  a.T = n(T, "T");
  a.H = n(H, "H");
  a.HV = n(HV, "HV");
  a.D = n(D, "D");
  a.single_stream = single_stream;
  // kda_prefill_workspace_bytes validates a whole argument set but reads only the shape: stand-in values that
  // pass its checks (an aligned address that is never dereferenced, scale 1, the default gate)
  alignas(256) static const unsigned char stand_in[256] = {};
  const auto* bf = reinterpret_cast<const K::bf16_t*>(stand_in);
  a.q = a.k = a.v = a.g = a.beta = bf;
  a.o = reinterpret_cast<K::bf16_t*>(const_cast<unsigned char*>(stand_in));
  a.gate.A_log = a.gate.bias = reinterpret_cast<const float*>(stand_in);
  a.scale = 1.0f;
  if (num_seqs > 0) {  // packed sequences: the workspace depends on N (the offsets themselves are not read)
    a.cu_seqlens = reinterpret_cast<const int*>(stand_in);
    a.num_seqs = n(num_seqs, "num_seqs");
    a.max_seqlen = a.T;
  }
  return a;
}

// ---- MLA ----------------------------------------------------------------------------------------------

/// The latent cache c [B, N_max, row] (row = d_c = 512, or 576 with k^R in each row): shape, and the row stride.
std::vector<std::size_t> check_cache(const Dev& c) { return check_dev(c, "c", DType::bf16, 3); }

K::KdaPrecision parse_precision(const std::string& p) {
  if (p == "fast") return K::KdaPrecision::fast;
  if (p == "accurate") return K::KdaPrecision::accurate;
  throw Error("precision = '" + p + "' is unknown; accepted: fast, accurate");
}

K::MlaDecodePrecision parse_mla_precision(const std::string& p) {
  if (p == "auto") return K::MlaDecodePrecision::automatic;
  if (p == "accurate") return K::MlaDecodePrecision::accurate;
  if (p == "fast") return K::MlaDecodePrecision::fast;
  throw Error("precision = '" + p + "' is unknown; accepted: auto, accurate, fast");
}

K::MlaPrefillPrecision parse_prefill_precision(const std::string& p) {
  if (p == "auto") return K::MlaPrefillPrecision::automatic;
  if (p == "accurate") return K::MlaPrefillPrecision::accurate;
  if (p == "fast") return K::MlaPrefillPrecision::fast;
  throw Error("precision = '" + p + "' is unknown; accepted: auto, accurate, fast");
}

K::MlaPrefillPath parse_path(const std::string& p) {
  if (p == "auto") return K::MlaPrefillPath::automatic;
  if (p == "absorbed") return K::MlaPrefillPath::absorbed;
  if (p == "naive") return K::MlaPrefillPath::naive;
  throw Error("path = '" + p + "' is unknown; accepted: auto, absorbed, naive");
}

/// cuda_kda_backward: the arrays checked (device, dtype, C-contiguous, shape) into K::KdaBackwardArgs, then the call.
void kda_backward_call(const Dev& q, const Dev& k, const Dev& v, const Dev& g, const Dev& beta,
                       const std::optional<Dev>& A_log, const std::optional<Dev>& bias, const Dev& dO,
                       const std::optional<Dev>& S0, const std::optional<Dev>& dS_T, const Dev& dq, const Dev& dk,
                       const Dev& dv, const Dev& dg, const Dev& dbeta, const std::optional<Dev>& dA_log,
                       const std::optional<Dev>& dbias, const std::optional<Dev>& dS0, const Dev& workspace,
                       double g_min, double scale, bool l2norm_qk, bool beta_sigmoid, bool gate_fused,
                       const std::optional<Dev>& cu_seqlens, std::int64_t max_seqlen, std::uintptr_t stream) {
  K::KdaBackwardArgs a;
  const auto sq = check_dev(q, "q", DType::bf16, 4);
  const auto sv = check_dev(v, "v", DType::bf16, 4);
  const std::size_t B = sq[0], T = sq[1], H = sq[2], D = sq[3], HV = sv[2];
  const std::vector<std::size_t> shk = {B, T, H, D}, shv = {B, T, HV, D}, shb = {B, T, HV};
  check_shape(k, "k", DType::bf16, shk);
  check_shape(v, "v", DType::bf16, shv);
  check_shape(g, "g", DType::bf16, shv);
  check_shape(beta, "beta", DType::bf16, shb);
  check_shape(dO, "dO", DType::bf16, shv);
  // dq, dk, dg, dbeta: all bf16, or all float32 (the kernel's fp32 outputs, KdaBackwardArgs::dq_f32), as dq is
  const DType gt = dtype_is(dq.dtype(), DType::f32) ? DType::f32 : DType::bf16;
  check_shape(dq, "dq", gt, shk);
  check_shape(dk, "dk", gt, shk);
  check_shape(dv, "dv", DType::bf16, shv);
  check_shape(dg, "dg", gt, shv);
  check_shape(dbeta, "dbeta", gt, shb);
  a.B = as_int(B, "B");
  a.T = as_int(T, "T");
  a.H = as_int(H, "H");
  a.HV = as_int(HV, "HV");
  a.D = as_int(D, "D");
  const std::size_t N = cu_seqlens ? apply_cu_seqlens(a, *cu_seqlens, max_seqlen) : B;
  for (const auto& [t, name] : {std::pair{&S0, "S0"}, {&dS_T, "dS_T"}, {&dS0, "dS0"}})
    if (*t) check_shape(**t, name, DType::f32, {N, HV, D, D});
  if (gate_fused) {
    for (const auto& [t, name] : {std::pair{&A_log, "A_log"}, {&bias, "bias"}, {&dA_log, "dA_log"}, {&dbias, "dbias"}})
      require(t->has_value(), std::string("tensor '") + name + "' is None; it is required with gate_fused = True");
    check_shape(*A_log, "A_log", DType::f32, {HV});
    check_shape(*bias, "bias", DType::f32, {HV, D});
    check_shape(*dA_log, "dA_log", DType::f32, {HV});
    check_shape(*dbias, "dbias", DType::f32, {HV, D});
  }
  a.q = ptr<const K::bf16_t>(q);
  a.k = ptr<const K::bf16_t>(k);
  a.v = ptr<const K::bf16_t>(v);
  a.g = ptr<const K::bf16_t>(g);
  a.beta = ptr<const K::bf16_t>(beta);
  a.gate.fused = gate_fused;
  a.gate.allow_unsafe_range = !gate_fused;  // g given: the caller's range
  a.gate.g_min = static_cast<float>(g_min);
  a.gate.A_log = gate_fused ? ptr<const float>(*A_log) : nullptr;
  a.gate.bias = gate_fused ? ptr<const float>(*bias) : nullptr;
  a.scale = static_cast<float>(scale);
  a.l2norm_qk = l2norm_qk;
  a.beta_sigmoid = beta_sigmoid;
  a.S0 = opt_ptr<const float>(S0);
  a.dO = ptr<const K::bf16_t>(dO);
  a.dS_T = opt_ptr<const float>(dS_T);
  if (gt == DType::f32) {
    a.dq_f32 = ptr<float>(dq);
    a.dk_f32 = ptr<float>(dk);
    a.dg_f32 = ptr<float>(dg);
    a.dbeta_f32 = ptr<float>(dbeta);
  } else {
    a.dq = ptr<K::bf16_t>(dq);
    a.dk = ptr<K::bf16_t>(dk);
    a.dg = ptr<K::bf16_t>(dg);
    a.dbeta = ptr<K::bf16_t>(dbeta);
  }
  a.dv = ptr<K::bf16_t>(dv);
  a.dA_log = gate_fused ? ptr<float>(*dA_log) : nullptr;
  a.dbias = gate_fused ? ptr<float>(*dbias) : nullptr;
  a.dS0 = opt_ptr<float>(dS0);
  a.workspace = workspace.data();
  a.workspace_bytes = check_workspace(workspace, K::kda_backward_workspace_bytes(a));
  K::kda_backward(a, stream_of(stream));
}

}  // namespace

void bind_cuda(nb::module_& m) {
  m.def(
      "cuda_kda_prefill_workspace_bytes",
      [](std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t HV, std::int64_t D, bool single_stream,
         std::int64_t num_seqs, const std::string& precision) {
        K::KdaPrefillArgs a = kda_prefill_shape(B, T, H, HV, D, single_stream, num_seqs);
        a.precision = parse_precision(precision);
        return K::kda_prefill_workspace_bytes(a);
      },
      "B"_a, "T"_a, "H"_a, "HV"_a, "D"_a, nb::kw_only(), "single_stream"_a = false, "num_seqs"_a = 0,
      "precision"_a = "fast", doc::cuda_kda_prefill_workspace_bytes);
  m.def(
      "cuda_kda_prefill",
      [](const Dev& q, const Dev& k, const Dev& v, const Dev& g, const Dev& beta, const Dev& A_log, const Dev& bias,
         const Dev& o, const std::optional<Dev>& S0, const std::optional<Dev>& S_final, const Dev& workspace,
         double g_min, double scale, bool l2norm_qk, bool beta_sigmoid, bool single_stream, std::uintptr_t stream,
         const std::optional<Dev>& cu_seqlens, std::int64_t max_seqlen, bool gate_fused, const std::string& precision) {
        K::KdaPrefillArgs a = kda_prefill_args(q, k, v, g, beta, A_log, bias, o, S0, S_final, g_min, scale, l2norm_qk,
                                               beta_sigmoid, single_stream, cu_seqlens, max_seqlen, gate_fused);
        a.precision = parse_precision(precision);
        a.workspace = workspace.data();
        a.workspace_bytes = check_workspace(workspace, K::kda_prefill_workspace_bytes(a));
        K::kda_prefill(a, stream_of(stream));
      },
      "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "A_log"_a, "bias"_a, "o"_a, "S0"_a.none(), "S_final"_a.none(),
      "workspace"_a, nb::kw_only(), "g_min"_a, "scale"_a, "l2norm_qk"_a = true, "beta_sigmoid"_a = true,
      "single_stream"_a = false, "stream"_a = 0, "cu_seqlens"_a.none() = nb::none(), "max_seqlen"_a = 0,
      "gate_fused"_a = true, "precision"_a = "fast", doc::cuda_kda_prefill);
  m.def(
      "cuda_kda_backward_workspace_bytes",
      [](std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t HV, std::int64_t D, std::int64_t num_seqs) {
        const K::KdaPrefillArgs f = kda_prefill_shape(B, T, H, HV, D, false, num_seqs);
        K::KdaBackwardArgs a;
        a.B = f.B; a.T = f.T; a.H = f.H; a.HV = f.HV; a.D = f.D; a.scale = 1.0f;
        a.cu_seqlens = f.cu_seqlens; a.num_seqs = f.num_seqs; a.max_seqlen = f.max_seqlen;
        return K::kda_backward_workspace_bytes(a);
      },
      "B"_a, "T"_a, "H"_a, "HV"_a, "D"_a, nb::kw_only(), "num_seqs"_a = 0, doc::cuda_kda_backward_workspace_bytes);
  m.def("cuda_kda_backward", &kda_backward_call, "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "A_log"_a.none(),
        "bias"_a.none(), "dO"_a, "S0"_a.none(), "dS_T"_a.none(), "dq"_a, "dk"_a, "dv"_a, "dg"_a, "dbeta"_a,
        "dA_log"_a.none(), "dbias"_a.none(), "dS0"_a.none(), "workspace"_a, nb::kw_only(), "g_min"_a, "scale"_a,
        "l2norm_qk"_a = true, "beta_sigmoid"_a = true, "gate_fused"_a = true, "cu_seqlens"_a.none() = nb::none(),
        "max_seqlen"_a = 0, "stream"_a = 0, doc::cuda_kda_backward);
  m.def(
      "cuda_kda_decode",
      [](const Dev& q, const Dev& k, const Dev& v, const Dev& g, const Dev& beta, const Dev& A_log, const Dev& bias,
         const Dev& state, const Dev& o, double g_min, double scale, bool l2norm_qk, bool beta_sigmoid,
         std::uintptr_t stream, bool gate_fused) {
        K::KdaDecodeArgs a;
        const auto so = kda_inputs(a, q, k, v, g, beta, A_log, bias, g_min, scale, l2norm_qk, beta_sigmoid);
        const std::size_t B = so[0], HV = so[1], D = so[2];
        check_shape(state, "state", DType::f32, {B, HV, D, D});
        check_shape(o, "o", DType::bf16, so);
        a.state = ptr<float>(state);
        a.o = ptr<K::bf16_t>(o);
        a.gate.fused = gate_fused;  // false: g is the log-decay, the caller's range (A_log, bias not read)
        a.gate.allow_unsafe_range = !gate_fused;
        K::kda_decode(a, stream_of(stream));
      },
      "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "A_log"_a, "bias"_a, "state"_a, "o"_a, nb::kw_only(), "g_min"_a,
      "scale"_a, "l2norm_qk"_a = true, "beta_sigmoid"_a = true, "stream"_a = 0, "gate_fused"_a = true,
      doc::cuda_kda_decode);

  m.def(
      "cuda_mla_absorb_query",
      [](const Dev& q_C, const Dev& W_UK, const Dev& q_hi, const Dev& q_lo, std::uintptr_t stream) {
        const auto s = check_dev(q_C, "q_C", DType::bf16, 3);
        const auto sw = check_dev(W_UK, "W_UK", DType::bf16, 2);
        const std::size_t n = s[0], H = s[1], dn = s[2], dc = sw[1];
        check_shape(W_UK, "W_UK", DType::bf16, {H * dn, dc});
        check_shape(q_hi, "q_hi", DType::bf16, {n, H, dc});
        check_shape(q_lo, "q_lo", DType::bf16, {n, H, dc});
        K::MlaAbsorbArgs a;
        a.n = as_int(n, "n");
        a.H = as_int(H, "H");
        a.d_nope = as_int(dn, "d_nope");
        a.d_c = as_int(dc, "d_c");
        a.q_C = ptr<const K::bf16_t>(q_C);
        a.W_UK = ptr<const K::bf16_t>(W_UK);
        a.q_hi = ptr<K::bf16_t>(q_hi);
        a.q_lo = ptr<K::bf16_t>(q_lo);
        K::mla_absorb_query(a, stream_of(stream));
      },
      "q_C"_a, "W_UK"_a, "q_hi"_a, "q_lo"_a, nb::kw_only(), "stream"_a = 0, doc::cuda_mla_absorb_query);

  const auto mla_decode_args = [](std::int64_t B, std::int64_t H, std::int64_t capacity, std::int64_t max_len,
                                   std::int64_t s_q, const std::string& precision) {
    K::MlaDecodeArgs a;
    a.B = static_cast<int>(B);
    a.H = static_cast<int>(H);
    a.capacity = static_cast<int>(capacity);
    a.max_len = static_cast<int>(max_len);
    require(s_q >= 1 && s_q <= 4, "s_q = " + std::to_string(s_q) + "; accepted: 1 <= s_q <= 4 query tokens per sequence");
    a.s_q = static_cast<int>(s_q);
    a.precision = parse_mla_precision(precision);
    return a;
  };
  m.def(
      "cuda_mla_decode_workspace_bytes",
      [mla_decode_args](std::int64_t B, std::int64_t H, std::int64_t capacity, std::int64_t max_len, std::int64_t s_q,
                        const std::string& precision) {
        return K::mla_decode_workspace_bytes(mla_decode_args(B, H, capacity, max_len, s_q, precision));
      },
      "B"_a, "H"_a, "capacity"_a, "max_len"_a, nb::kw_only(), "s_q"_a = 1, "precision"_a = "auto",
      doc::cuda_mla_decode_workspace_bytes);
  m.def(
      "cuda_mla_decode",
      [mla_decode_args](const Dev& q_hi, const std::optional<Dev>& q_lo, const Dev& c, const Dev& out,
                        const Dev& workspace, const std::optional<Dev>& lens, std::int64_t max_len, double scale,
                        const std::string& precision, std::uintptr_t stream) {
        // q_hi [B, H, d_c] (one query token) or [B, s_q, H, d_c]; q_lo and out of the same shape
        const std::size_t rank = q_hi.ndim();
        require(rank == 3 || rank == 4, "tensor 'q_hi' has shape " + shape_str(shape_vec(q_hi)) +
                                            "; expected [B, H, d_c] or [B, s_q, H, d_c]");
        const auto sq = check_dev(q_hi, "q_hi", DType::bf16, rank);
        const auto sc = check_cache(c);
        const std::size_t B = sq[0], s_q = rank == 4 ? sq[1] : 1, H = sq[rank - 2], dc = sq[rank - 1];
        if (q_lo) check_shape(*q_lo, "q_lo", DType::bf16, sq);
        require(sc[0] == B, "tensor 'c' has shape " + shape_str(sc) + ", expected [B = " + std::to_string(B) +
                                ", N_max, row] (row = d_c or d_c + d_rope)");
        check_shape(out, "out", DType::f32, sq);
        if (lens) check_shape(*lens, "lens", DType::i32, {B});
        K::MlaDecodeArgs a = mla_decode_args(static_cast<std::int64_t>(B), static_cast<std::int64_t>(H),
                                             static_cast<std::int64_t>(sc[1]), max_len, static_cast<std::int64_t>(s_q),
                                             precision);
        a.d_c = as_int(dc, "d_c");
        a.lens = opt_ptr<const int>(lens);
        a.c = ptr<const K::bf16_t>(c);
        a.sc_t = static_cast<std::int64_t>(sc[2]);
        a.q_hi = ptr<const K::bf16_t>(q_hi);
        a.q_lo = opt_ptr<const K::bf16_t>(q_lo);
        a.scale = static_cast<float>(scale);
        a.out = ptr<float>(out);
        a.workspace = workspace.data();
        a.workspace_bytes = check_workspace(workspace, K::mla_decode_workspace_bytes(a));
        K::mla_decode(a, stream_of(stream));
      },
      "q_hi"_a, "q_lo"_a.none(), "c"_a, "out"_a, "workspace"_a, "lens"_a.none() = nb::none(), nb::kw_only(),
      "max_len"_a, "scale"_a, "precision"_a = "auto", "stream"_a = 0, doc::cuda_mla_decode);

  const auto mla_prefill_args = [](std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t capacity,
                                   std::int64_t prefix) {
    K::MlaPrefillHeadsArgs a;
    a.B = static_cast<int>(B);
    a.T = static_cast<int>(T);
    a.H = static_cast<int>(H);
    a.capacity = static_cast<int>(capacity);
    a.prefix = static_cast<int>(prefix);
    return a;
  };
  m.def(
      "cuda_mla_prefill_workspace_bytes",
      [mla_prefill_args](std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t capacity, std::int64_t prefix,
                         const std::string& path, const std::string& precision) {
        K::MlaPrefillOverrides ov;
        ov.path = parse_path(path);
        K::MlaPrefillHeadsArgs a = mla_prefill_args(B, T, H, capacity, prefix);
        a.precision = parse_prefill_precision(precision);
        return K::mla_prefill_heads_workspace_bytes(a, &ov);
      },
      "B"_a, "T"_a, "H"_a, "capacity"_a, "prefix"_a, nb::kw_only(), "path"_a = "auto", "precision"_a = "auto",
      doc::cuda_mla_prefill_workspace_bytes);
  m.def(
      "cuda_mla_prefill",
      [mla_prefill_args](const Dev& c, const Dev& q_C, const Dev& W_UK, const Dev& W_UV, const Dev& out,
                         const Dev& workspace, const std::optional<Dev>& c_new, std::int64_t prefix, double scale,
                         const std::string& path, const std::string& precision, std::uintptr_t stream) {
        const auto sc = check_cache(c);
        const auto sq = check_dev(q_C, "q_C", DType::bf16, 4);
        const auto sk = check_dev(W_UK, "W_UK", DType::bf16, 2);
        const auto sv = check_dev(W_UV, "W_UV", DType::bf16, 2);
        const std::size_t B = sq[0], T = sq[1], H = sq[2], dn = sq[3], dc = sk[1];
        require(sc[0] == B, "tensor 'c' has shape " + shape_str(sc) + ", expected [B = " + std::to_string(B) +
                                ", N_max, row] (row = d_c or d_c + d_rope)");
        check_shape(W_UK, "W_UK", DType::bf16, {H * dn, dc});
        require(sv.size() == 2 && sv[1] == dc && sv[0] % (H ? H : 1) == 0,
                "tensor 'W_UV' has shape " + shape_str(sv) + ", expected [H d_v, d_c] with H = " + std::to_string(H) +
                    ", d_c = " + std::to_string(dc));
        const std::size_t dv = sv[0] / H;
        const bool out_f32 = dtype_is(out.dtype(), DType::f32);
        require(out_f32 || dtype_is(out.dtype(), DType::bf16),
                "tensor 'out' has dtype " + dtype_name(out.dtype()) + "; accepted: float32, bfloat16 (precision fast)");
        check_shape(out, "out", out_f32 ? DType::f32 : DType::bf16, {B, T, H, dv});
        if (c_new) check_shape(*c_new, "c_new", DType::bf16, {B, T, dc});
        K::MlaPrefillHeadsArgs a = mla_prefill_args(static_cast<std::int64_t>(B), static_cast<std::int64_t>(T),
                                                     static_cast<std::int64_t>(H), static_cast<std::int64_t>(sc[1]),
                                                     prefix);
        a.d_c = as_int(dc, "d_c");
        a.d_nope = as_int(dn, "d_nope");
        a.d_v = as_int(dv, "d_v");
        a.c = ptr<K::bf16_t>(c);
        a.sc_t = static_cast<std::int64_t>(sc[2]);
        a.c_new = opt_ptr<const K::bf16_t>(c_new);
        a.q_C = ptr<const K::bf16_t>(q_C);
        a.W_UK = ptr<const K::bf16_t>(W_UK);
        a.W_UV = ptr<const K::bf16_t>(W_UV);
        a.scale = static_cast<float>(scale);
        if (out_f32)
          a.out = ptr<float>(out);
        else
          a.out_bf16 = ptr<K::bf16_t>(out);
        a.precision = parse_prefill_precision(precision);
        K::MlaPrefillOverrides ov;
        ov.path = parse_path(path);
        a.workspace = workspace.data();
        a.workspace_bytes = check_workspace(workspace, K::mla_prefill_heads_workspace_bytes(a, &ov));
        K::mla_prefill_heads(a, stream_of(stream), &ov);
      },
      "c"_a, "q_C"_a, "W_UK"_a, "W_UV"_a, "out"_a, "workspace"_a, "c_new"_a.none() = nb::none(), nb::kw_only(),
      "prefix"_a, "scale"_a, "path"_a = "auto", "precision"_a = "auto", "stream"_a = 0,
      doc::cuda_mla_prefill);

  m.def(
      "cuda_attn_res",
      [](const Dev& src, const Dev& w, const Dev& out, double eps, std::uintptr_t stream) {
        const auto s = check_dev(src, "src", DType::bf16, 3);
        const std::size_t S = s[0], T = s[1], d = s[2];
        check_shape(w, "w", DType::f32, {d});
        const bool f32 = dtype_is(out.dtype(), DType::f32);
        require(f32 || dtype_is(out.dtype(), DType::bf16),
                "tensor 'out' has dtype " + dtype_name(out.dtype()) + "; accepted: float32, bfloat16");
        check_shape(out, "out", f32 ? DType::f32 : DType::bf16, {T, d});
        K::AttnResArgs a;
        a.T = as_int(T, "T");
        a.S = as_int(S, "S");
        a.d = as_int(d, "d");
        a.src = ptr<const K::bf16_t>(src);
        a.w = ptr<const float>(w);
        a.eps = static_cast<float>(eps);
        if (f32)
          a.out_f32 = ptr<float>(out);
        else
          a.out = ptr<K::bf16_t>(out);
        K::attn_res(a, stream_of(stream));
      },
      "src"_a, "w"_a, "out"_a, nb::kw_only(), "eps"_a = 1e-6, "stream"_a = 0, doc::cuda_attn_res);
}

}  // namespace kdalab::py
