#pragma once
/// GPU measurements of the research experiments (ISSUE 8), compiled only with the CUDA kernels
/// (KDALAB_HAVE_CUDA). Declarations only: no CUDA types leak into the experiment files.
/// Every call throws kdalab::Error on a CUDA or cuBLAS failure.
#include <cstdint>

#include "numerics/random.hpp"
#include "reference/kda.hpp"

namespace kdalab::gpu_exp {

/// The CUDA prefill kernel (kernels/kda.hpp, chunk 16, fused K3 gate, L2Norm and beta sigmoid) on
/// `in` (B, T, H = HV, D = 128) with the gate bias raised by `bias_shift` (so that
/// g = g_min Sigmoid(e^A (g_raw + bias + shift))) and gate.allow_unsafe_range = `unsafe`.
/// Returns o [B, T, HV, D] (bf16 values as doubles) and the final state.
KdaOutput<double> kda_prefill_on_gpu(const KdaInputs& in, double bias_shift, bool unsafe);

/// Median seconds of one KDA decode step (kernels::kda_decode), B sequences, HV = H heads of
/// D = 128, fp32 state in place, after warm-up; `iters` timed launches (CUDA events).
double time_kda_decode(int B, int H, int iters);

/// Median seconds of an absorbed MLA decode read of one layer at batch 1 over a bf16 latent cache
/// of n tokens x d_c, H heads, done as two cuBLAS bf16 GEMMs with fp32 accumulation: scores
/// [n x H] = C^T q~ and the attended latent [d_c x H] = C P (P: bf16 probabilities). The softmax over
/// the H x n scores is not included (it adds ~8 H n bytes of traffic vs the 2 (2 n d_c) of the GEMMs).
double time_mla_read_gemms(std::int64_t n, int H, int d_c, int iters);

}  // namespace kdalab::gpu_exp
