#pragma once
/// The bf16 reference emulation of the KDA backward for `kdalab parity --backward` (row bf16-emu), in a
/// translation unit of its own (experiments/parity_emul.cpp): the emulation reads reference/gate.hpp, whose
/// GateKind cannot meet numerics/range.hpp's in parity.cpp. This header includes no reference/ code.
#include <optional>
#include <string>
#include <vector>

#include "reference/tensor.hpp"

namespace kdalab::cli {

/// The six gradients dq, dk, dv, dg, dbeta, dS0 (float64 copies, shapes of the inputs) of the KDA recurrence's
/// function computed by the plain chunked algorithm at bf16 operand precision with fp32 accumulation (C = 64;
/// numerics/plain_emulation.hpp, emul::kda_head), on derived inputs q, k [B, T, H, d_k], v [B, T, HV, d_v],
/// g [B, T, HV, d_k], beta [B, T, HV], S0 [B, HV, d_k, d_v] and upstream dO [B, T, HV, d_v], dS_T
/// [B, HV, d_k, d_v]. q, k are rounded to bf16 once and g, beta to fp32, as the emulation's own KDA entry point
/// does. Nothing (and `why` set) when this build has no numerics/plain_emulation.hpp.
/// Why this build has no bf16 emulation of the backward ("bf16-emu rows skipped: ..."), or nothing when it has one.
std::optional<std::string> bf16_emulation_unavailable();

std::optional<std::vector<std::vector<double>>> kda_backward_bf16_emulation(
    const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v, const Tensor<double>& g,
    const Tensor<double>& beta, const Tensor<double>& S0, double scale, const Tensor<double>& dO,
    const Tensor<double>& dS_T, std::string& why);

}  // namespace kdalab::cli
