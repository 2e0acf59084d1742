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

/// T one-token decode steps from S0 (experiments/kda_ops.hpp kda_decode_steps; kda_step per token).
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

}  // namespace kdalab::py
