#pragma once
// The fast MLA prefill attention on the warpgroup MMA (kernels/mla_prefill/fast_wg.cu), called by the naive path of
// mla_prefill_heads (kernels/mla_prefill/naive.cu) in precision fast. Internal to kernels/.
#include <cuda_runtime_api.h>

#include "kernels/kda.hpp"  // bf16_t, kdalab::Error

namespace kdalab::kernels::mla_prefill_detail {

/// Causal attention of T new query rows per (sequence, head) over N = N0 + T keys, d = 128: o = softmax(scale q K^T) V
/// with bf16 q, K, V and P, fp32 scores, softmax and accumulation.
/// q [B, T, H, 128] bf16 (batch stride sq_b, token stride sq_t elements, head stride 128); K and V [B, N, H, 128] bf16
/// contiguous, 16-byte aligned; o [B, T, H, 128] fp32 contiguous. Query t of a sequence sits at position N0 + t and reads
/// keys 0 .. N0 + t.
struct FastAttnArgs {
  int B = 0, T = 0, H = 0, N0 = 0;
  const bf16_t* q = nullptr;
  long long sq_b = 0, sq_t = 0;
  const bf16_t* K = nullptr;
  const bf16_t* V = nullptr;
  float scale_log2 = 0.0f;  ///< softmax scale times log2(e)
  float* out = nullptr;
  int ctas = 0;  ///< CTAs of the persistent grid; 0: one per SM (at most one per work item)
};

/// Launches the attention on `stream`; `pingpong`: the form whose two consumer warpgroups issue their products in
/// alternation. Errors: kdalab::Error when the driver cannot encode the TMA descriptors (B N
/// beyond 2^31 rows) or the launch fails. The caller has checked shapes and pointers.
void fast_attention_wgmma(const FastAttnArgs& a, bool pingpong, cudaStream_t stream);

}  // namespace kdalab::kernels::mla_prefill_detail
