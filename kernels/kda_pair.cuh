#pragma once
// Internal interface between kernels/kda_prefill.cu (argument checks, workspace, dispatch of kda_prefill()) and
// kernels/kda_pair.cu (the two-chunk "pair" kernels of KdaPrefillArgs::pair_chunks). Not a public API: callers
// use kda_prefill() and kda_prefill_workspace_bytes() (kernels/kda.hpp). The pair kernels live in their own
// translation unit so that adding them leaves the PTX of the kernels in kda_prefill.cu untouched (nvcc's
// vectoriser changed a load of the default state pass when they shared its file).
#include <cuda_runtime_api.h>

#include "kernels/kda.hpp"

namespace kdalab::kernels::detail {

/// Pair slots (KdaPairSlot) per value head for these shapes: B ceil(T / 32) for fixed-length batches,
/// num_seqs + T / 32 + 1 with cu_seqlens (sequence n's first slot is n + cu_seqlens[n] / 32, which leaves
/// ceil(len / 32) slots per sequence). No checks: `a` is checked by the caller.
long long kda_pair_slots(const KdaPrefillArgs& a);

/// Launches the pair prepare kernel (run_phases & 1) and then the pair state pass (run_phases & 2) on `stream`.
/// `a` is checked by kda_prefill (D = 128, pair_chunks, workspace of >= kda_pair_slots(a) HV KdaPairSlot::bytes,
/// grid limits) and its strides are resolved (non-zero); N = number of sequences, max_chunks = 16-token chunks of
/// the longest sequence. Errors: kdalab::Error with the CUDA message when a launch fails.
void kda_pair_launch(const KdaPrefillArgs& a, int N, int max_chunks, cudaStream_t stream);

}  // namespace kdalab::kernels::detail
