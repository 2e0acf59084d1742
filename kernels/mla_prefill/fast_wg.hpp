#pragma once
// The fast MLA prefill attention on the warpgroup MMA (kernels/mla_prefill/fast_wg.cu), called by the naive path of
// mla_prefill_heads (kernels/mla_prefill/naive.cu) in precision fast. Internal to kernels/.
#include <cuda_runtime_api.h>

#include "kernels/kda.hpp"  // bf16_t, kdalab::Error

namespace kdalab::kernels::mla_prefill_detail {

/// Causal attention of T new query rows per (sequence, head) over N = N0 + T keys, d = 128: o = softmax(scale q K^T) V
/// with bf16 q, K, V and P, fp32 scores, softmax and accumulation.
/// q [B, T, H, 128] bf16 (batch stride sq_b, token stride sq_t elements, head stride 128); K and V [B, NK, H, 128] bf16
/// contiguous, 16-byte aligned, NK >= N0 + T rows a sequence; o [B, T, H, 128] fp32 (out) or bf16 (out_bf16)
/// contiguous. Query t of a sequence
/// sits at position N0 + t and reads keys 0 .. N0 + t.
/// Packed sequences (cu non-null): sequence b has cu[b + 1] - cu[b] <= T queries, at rows cu[b] .. of q (token stride
/// sq_t) and o, and N0 = n0s[b] (n0s non-null) or N0 cached keys; its K and V rows past its own N0 + T must be finite.
struct FastAttnArgs {
  int B = 0, T = 0, H = 0, N0 = 0, NK = 0;
  const int* cu = nullptr;
  const int* n0s = nullptr;
  const bf16_t* q = nullptr;
  long long sq_b = 0, sq_t = 0;
  const bf16_t* K = nullptr;
  const bf16_t* V = nullptr;
  float scale_log2 = 0.0f;  ///< softmax scale times log2(e)
  float* out = nullptr;
  bf16_t* out_bf16 = nullptr;  ///< o as bf16 instead of out (non-null: out unused)
  long long out_rows = 0;  ///< rows of o: B T, or with cu the packed total cu[B]
  int ctas = 0;  ///< CTAs of the persistent grid; 0: one per SM (at most one per work item)
  bool head_major = false;  ///< item order (kernels/mla_prefill.hpp MlaFastOrder): head-major, else longest first
};

/// Launches the attention on `stream`; `pingpong`: the form whose two consumer warpgroups issue their products in
/// alternation. Errors: kdalab::Error when the driver cannot encode the TMA descriptors (B N
/// beyond 2^31 rows) or the launch fails. The caller has checked shapes and pointers.
void fast_attention_wgmma(const FastAttnArgs& a, bool pingpong, cudaStream_t stream);

}  // namespace kdalab::kernels::mla_prefill_detail
