#pragma once
/// The GPU calls of the experiments (parity, decay-range, decode-cost) and of `kdalab check`, compiled only with
/// the CUDA kernels (KDALAB_HAVE_CUDA). Declarations only: no CUDA types leak into the experiment files.
/// Every call throws kdalab::Error on a CUDA failure.
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

/// Median seconds of one absorbed MLA decode step of one layer at batch 1 (kernels/mla.hpp mla_decode:
/// bf16 latent cache of n tokens x d_c = 512, H query heads, hi + lo query, split over the sequence
/// + combine), after warm-up; `iters` timed launches (CUDA events). Errors: n outside [1, 2^24].
double time_mla_decode(std::int64_t n, int H, int iters);

}  // namespace kdalab::gpu_exp
