#pragma once
/// Non-template entry points of the reference (reference/*.hpp) for the Python module: float64
/// tensors in, float64 tensors out, the arithmetic in float64 or cpp_bin_float_50 (mp50; inputs
/// widened exactly, outputs rounded once to float64). No math here: each function casts, calls the
/// reference template and casts back. Errors: kdalab::Error from the reference (shapes, NaN/Inf,
/// ranges), with the tensor named as in the reference.
#include <cstddef>
#include <map>
#include <string>

#include "reference/tensor.hpp"

namespace kdalab::py {

/// Scalar type the reference runs in.
enum class Precision { float64, mp50 };
/// Parses "float64" or "mp50" (alias "cpp_bin_float_50"); throws kdalab::Error naming 'precision'.
Precision parse_precision(const std::string& s);

/// Output o [B, T, HV, d_v] and final state S [B, HV, d_k, d_v] (K3 report Eq. 1 orientation).
struct KdaResult {
  Tensor<double> o, S;
};

/// KDA recurrence (K3 report Eq. 1; reference/kda.hpp kda_recurrent). q, k [B, T, H, d_k];
/// v [B, T, HV, d_v]; g [B, T, HV, d_k] (log-decay, <= 0); beta [B, T, HV]; S0 [B, HV, d_k, d_v] or
/// null (zero state). variant: kda, gated_deltanet, deltanet, gla, linear.
KdaResult kda_recurrent(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                        const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0, double scale,
                        const std::string& variant, Precision p);

/// Chunked KDA (Kimi Linear sections 3-4; reference/kda_chunk.hpp kda_chunked), shapes as
/// kda_recurrent; C chunk size >= 1, tile secondary tile (0: none).
KdaResult kda_chunked(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                      const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0, double scale,
                      std::size_t C, std::size_t tile, const std::string& variant, Precision p);

/// T one-token decode steps from S0 (reference/kda_decode.hpp kda_decode_steps; kda_step per token).
KdaResult kda_decode(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                     const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>& S0, double scale,
                     Precision p);

/// Named tensors (weights) and options of a layer, as given from Python.
using Named = std::map<std::string, Tensor<double>>;
/// Option values as text (numbers as Python's str() writes them, booleans "true"/"false").
using Options = std::map<std::string, std::string>;

/// KDA layer prefill on a fresh cache (K3 report Eqs. 2, 5, 6; reference/kda_layer.hpp). x [T, hidden];
/// returns y [T, hidden], o_core [T, HV d_v] (KDA output before RMSNorm), S [HV, d_k, d_v].
struct KdaLayerResult {
  Tensor<double> y, o_core, S;
};
KdaLayerResult kda_layer(const Tensor<double>& x, const Named& weights, const Options& config, Precision p);

/// Gated MLA prefill on a fresh cache (DeepSeek-V2 Eqs. 9-19, K3 report Eq. 7; reference/mla.hpp
/// mla_prefill), eval "naive" or "absorbed". x [T, hidden] -> y [T, hidden].
Tensor<double> mla(const Tensor<double>& x, const Named& weights, const Options& config, const std::string& eval,
                   Precision p);

/// Attention Residuals over depth (K3 report Eqs. 8-10; reference/attn_res.hpp DepthMixer):
/// v [N, T, d] (v_0 = h_1, then the sublayer outputs), w [d]; mode "full" or "block" with
/// block_sources sublayer outputs per block; eps of the RMSNorm of the keys. Returns h [T, d].
Tensor<double> attn_res(const Tensor<double>& v, const Tensor<double>& w, const std::string& mode,
                        std::size_t block_sources, double eps, Precision p);

// ---- gradients (vector-Jacobian products; reference/*_backward.hpp) -------------------------------

/// dL/d(q, k, v, g, beta, S0) of a KDA call, shaped as its inputs: dq, dk [B, T, H, d_k];
/// dv [B, T, HV, d_v]; dg [B, T, HV, d_k]; dbeta [B, T, HV]; dS0 [B, HV, d_k, d_v].
struct KdaGradResult {
  Tensor<double> dq, dk, dv, dg, dbeta, dS0;
};

/// Reverse-mode derivative of kda_recurrent (reference/kda_backward.hpp kda_recurrent_backward) for
/// upstream dO [B, T, HV, d_v] and dS_T [B, HV, d_k, d_v] (null: the final state is unused). checkpoint:
/// states kept every `checkpoint` tokens (0: all; every value gives the same bits).
KdaGradResult kda_recurrent_backward(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                                     const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0,
                                     const Tensor<double>& dO, const Tensor<double>* dS_T, double scale,
                                     const std::string& variant, std::size_t checkpoint, Precision p);

/// Reverse-mode derivative of kda_chunked, variant kda, chunk size C >= 1
/// (reference/kda_chunk_backward.hpp kda_chunked_backward); arguments as kda_recurrent_backward.
KdaGradResult kda_chunked_backward(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                                   const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0,
                                   const Tensor<double>& dO, const Tensor<double>* dS_T, double scale, std::size_t C,
                                   Precision p);

/// The KDA decay gate (K3 report Eq. 5 "bounded", Kimi Linear "softplus"; reference/gate.hpp gate):
/// z [T, HV d_k], A_log [HV], bias [HV, d_k] -> g [T, HV d_k]; g_min < 0 for the bounded gate.
Tensor<double> gate(const Tensor<double>& z, const Tensor<double>& A_log, const Tensor<double>& bias,
                    const std::string& kind, double g_min, Precision p);

/// dz [T, HV d_k], dA_log [HV], dbias [HV, d_k] of gate() for upstream dg [T, HV d_k]
/// (reference/gate_backward.hpp gate_backward).
struct GateGradResult {
  Tensor<double> dz, dA_log, dbias;
};
GateGradResult gate_backward(const Tensor<double>& z, const Tensor<double>& A_log, const Tensor<double>& bias,
                             const Tensor<double>& dg, const std::string& kind, double g_min, Precision p);

/// dv [N, T, d] and dw [d] of attn_res() for upstream dh [T, d] (reference/attn_res_backward.hpp; in
/// block mode a source inside a block sum receives the block sum's gradient).
struct AttnResGradResult {
  Tensor<double> dv, dw;
};
AttnResGradResult attn_res_backward(const Tensor<double>& v, const Tensor<double>& w, const Tensor<double>& dh,
                                    const std::string& mode, std::size_t block_sources, double eps, Precision p);

/// The MLA attention core (DeepSeek-V2 Eqs. 9-19 without the projections and the output gate;
/// reference/mla.hpp mla_attend_naive / mla_attend_absorbed): queries q_C [T, n_h d_nope],
/// q_R [T, n_h d_rope] (d_rope may be 0), latent cache C [N, d_c], shared keys K_R [N, d_rope],
/// W_UK [n_h d_nope, d_c], W_UV [n_h d_v, d_c]; query row t sits at position N - T + t (causal).
/// Returns o [T, n_h d_v] (ungated). eval "naive" or "absorbed".
Tensor<double> mla_attend(const Tensor<double>& q_C, const Tensor<double>& q_R, const Tensor<double>& C,
                          const Tensor<double>& K_R, const Tensor<double>& W_UK, const Tensor<double>& W_UV,
                          std::size_t n_h, const std::string& eval, Precision p);

/// Gradients of mla_attend for upstream dO [T, n_h d_v] (reference/mla_backward.hpp), each shaped as
/// its input: dq_C, dq_R, dC, dK_R, dW_UK, dW_UV.
struct MlaAttendGradResult {
  Tensor<double> dq_C, dq_R, dC, dK_R, dW_UK, dW_UV;
};
MlaAttendGradResult mla_attend_backward(const Tensor<double>& q_C, const Tensor<double>& q_R,
                                        const Tensor<double>& C, const Tensor<double>& K_R,
                                        const Tensor<double>& W_UK, const Tensor<double>& W_UV,
                                        const Tensor<double>& dO, std::size_t n_h, const std::string& eval,
                                        Precision p);

}  // namespace kdalab::py
