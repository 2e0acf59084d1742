#pragma once
/// KDA backward (reverse mode) on CUDA, sm_90a: the gradients of the prefill of kernels/kda.hpp with respect to all of
/// its inputs, for training. A plain host API like the forward: device pointers, shapes, strides in elements, a
/// cudaStream_t.
///
/// Math (docs/equations.md, KDA recurrence and its reverse mode; the exact oracle is reference/kda_backward.hpp and,
/// with the fused pre-ops, reference/kda_fused_backward.hpp), per value head, fp32 state S (d_k x d_v):
///   forward:  a_t = exp(g_t), S' = Diag(a_t) S_{t-1}, u = S'^T k_t, S_t = S' + beta_t k_t (v_t - u)^T,
///             o_t = scale S_t^T q_t
///   reverse (t = T .. 1, dS = dL/dS_t, starting from dS_T or 0), with G = dS + scale q_t do_t^T, delta = v_t - u:
///             dq_t = scale S_t do_t;  dv_t = beta_t G^T k_t;  dbeta_t = k_t^T G delta;
///             dk_t = beta_t (G delta - S' G^T k_t);  dS' = G - beta_t k_t (G^T k_t)^T;
///             dg_t,i = sum_j dS'_ij S'_ij;  dS_{t-1} = Diag(a_t) dS'
///   then the pre-ops' chain rules: L2Norm of q and k (dq, dk of the raw inputs), beta = Sigmoid(beta_raw) (dbeta of
///   the logits), the K3 gate g = g_min Sigmoid(exp(A_log) (g_raw + bias)) (dg of g_raw, dA_log, dbias summed over all
///   tokens of all sequences).
///
/// Version 1 (correct first; design, workspace and measurements: docs/kernels/kda_backward.md): everything in fp32
/// with bf16 in and out like the forward.
///  1. prepare: token-parallel, the fused pre-ops in fp32 (q, k normalised, g, beta) into the workspace.
///  2. sweep: one CTA per (sequence, value head, block of NC value columns: 64 for D = 64, 128; 32 for D = 256); the
///     recurrence is independent per value column. A forward sweep in fp32 stores S every 64 tokens (checkpoints);
///     the reverse sweep takes the chunks last first, recomputes S every 8 tokens of the chunk (sub-checkpoints) and
///     then the 8 states of each sub-chunk into per-CTA scratch, and back-propagates token by token. dv and dS0 are
///     complete per column and written directly; the per-row sums over columns (dq, dk, dg) and dbeta are written as
///     fp32 partials per column block.
///  3. epilogue: sums the partials (and dq, dk over the value heads sharing a key head) in a fixed order, applies the
///     chain rules, writes bf16 (the chunked passes with HV = H do this at the end of their gradient kernel instead,
///     with the same functions and bits); 4. a fixed-order (fp64-accumulated) sum over tokens gives dA_log and dbias.
/// Version 2, the chunked pass (KdaBackwardPass::chunked, what kda_backward_plan picks for D = 64): steps 1,
/// 3 and 4 as above; step 2 in 16-token chunks in the WY form (kernels/kda_backward/chunked.cu): a chunk-parallel
/// kernel forms each chunk's factors, two chunk-sequential chains store S entering and dS leaving every chunk, and a
/// chunk-parallel kernel forms the gradients from them; every product fp32-class (three-pass tf32 or fp32 FMA).
/// KdaBackwardPass::chunked_wg (what kda_backward_plan picks for D = 128) runs the same pass with the two chains on
/// wgmma (kernels/kda_backward/chains_wg.cu), their products as bf16 hi + lo (~2^-16 relative each): the gradients
/// stay at their bf16 floor and the backward takes 19-31% less time (docs/kernels/kda_backward.md).
/// Deterministic: no atomics; every sum has a fixed order, so two calls on the same inputs give the same bits.
///
/// Layouts (row-major, last dimension contiguous): inputs as KdaPrefillArgs (strides in elements, 0 = contiguous):
///   q, k [B, T, H, D]; v, g, dO [B, T, HV, D]; beta [B, T, HV]; A_log [HV] fp32; bias [HV, D] fp32;
///   S0, dS_T [N, HV, D, D] fp32 (N = B, or num_seqs with cu_seqlens and B = 1).
/// Outputs, contiguous: dq, dk [B, T, H, D] bf16; dv, dg [B, T, HV, D] bf16; dbeta [B, T, HV] bf16 (the per-token
/// gradients are bf16, rounded once from fp32); dA_log [HV], dbias [HV, D], dS0 [N, HV, D, D] fp32.
/// Value head j reads key head j / (HV / H); dq, dk of a key head sum the contributions of its HV / H value heads.
/// D = d_k = d_v in {64, 128, 256}.
/// Errors: kdalab::Error naming the argument, its value and what is accepted, before anything is launched (the
/// forward's checks: D, T, B, H / HV, scale, gate, pointer alignment, strides, cu_seqlens; plus the outputs, dO, dS_T
/// and the workspace). CUDA errors (launch or runtime) also throw kdalab::Error with the CUDA message.
/// The contents of cu_seqlens (offsets on the device) are the caller's: 0 = cu[0] <= cu[1] <= ... <= cu[N] = T,
/// each length <= max_seqlen (not read on the host).
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/kda.hpp"

namespace kdalab::kernels {

/// Arguments of the KDA backward: the forward's inputs (as KdaPrefillArgs), the upstream gradients and the outputs.
struct KdaBackwardArgs {
  int B = 0;          ///< batch; must be 1 when cu_seqlens is given (packed sequences)
  int T = 0;          ///< tokens per sequence (total tokens when cu_seqlens is given), >= 1
  int H = 0, HV = 0;  ///< key heads, value heads (HV a multiple of H)
  int D = 128;        ///< d_k = d_v: 64, 128 or 256
  const bf16_t *q = nullptr, *k = nullptr, *v = nullptr;
  const bf16_t* g = nullptr;     ///< raw gate logits (gate.fused) or the log-decay g (<= 0)
  const bf16_t* beta = nullptr;  ///< raw beta logits (beta_sigmoid) or beta in [0, 1]
  KdaGate gate;                  ///< as the forward's (g_min range, fused or not, allow_unsafe_range)
  float scale = 0.0f;            ///< explicit; usually D^-1/2
  bool l2norm_qk = true, beta_sigmoid = true;
  const float* S0 = nullptr;        ///< optional initial state [N, HV, D, D] (null: zero)
  const int* cu_seqlens = nullptr;  ///< optional device int32 [N + 1], cu_seqlens[0] = 0, cu_seqlens[N] = T
  int num_seqs = 0;                 ///< N when cu_seqlens is given
  int max_seqlen = 0;               ///< longest sequence when cu_seqlens is given (host-known)
  Strides sq, sk, sv, sg, sbeta;    ///< input strides as the forward's
  const bf16_t* dO = nullptr;       ///< dL/do [B, T, HV, D]
  Strides sdo;                      ///< strides of dO
  const float* dS_T = nullptr;      ///< optional dL/dS_final [N, HV, D, D] (null: the final state is unused)
  bf16_t *dq = nullptr, *dk = nullptr;  ///< [B, T, H, D]: of the raw q, k (through the L2Norm when l2norm_qk)
  bf16_t* dv = nullptr;                 ///< [B, T, HV, D]
  bf16_t* dg = nullptr;                 ///< [B, T, HV, D]: of the g input (the raw gate logits when gate.fused)
  bf16_t* dbeta = nullptr;              ///< [B, T, HV]: of the beta input (the logits when beta_sigmoid)
  /// Optional fp32 outputs written instead of dq, dk, dg, dbeta (all four given, and then those four bf16 pointers
  /// null): the same gradients before their bf16 rounding, for callers that sum them over several calls (the value
  /// blocks of one head, kdalab.torch.chunk_kda) and round once. Same shapes, contiguous.
  float *dq_f32 = nullptr, *dk_f32 = nullptr, *dg_f32 = nullptr, *dbeta_f32 = nullptr;
  float* dA_log = nullptr;              ///< [HV]; required when gate.fused, else not written
  float* dbias = nullptr;               ///< [HV, D]; required when gate.fused, else not written
  float* dS0 = nullptr;                 ///< optional [N, HV, D, D]: dL/dS0 (also when S0 is null: the zero state's)
  void* workspace = nullptr;            ///< device scratch of kda_backward_workspace_bytes() bytes, 16-byte aligned
  std::size_t workspace_bytes = 0;
};

/// How the reverse pass maps onto the GPU (kda_backward_plan states which one runs). They compute the same gradients
/// in fp32-class arithmetic with bf16 in and out; they differ in summation order, and chunked_wg in the chains'
/// operand format (design and measurements: docs/kernels/kda_backward.md).
enum class KdaBackwardPass {
  automatic,  ///< the rule of kda_backward_plan: chunked_wg for D = 128, chunked for D = 64, else sweep (D = 256,
              ///< or more than 65535 sequences)
  sweep,      ///< version 1: token-by-token fp32 sweeps, one CTA per (sequence, value head, column block); every shape
  chunked,    ///< version 2: 16-token chunks in the WY form (docs/kernels/kda_backward.md "Version 2"); D = 64, 128,
              ///< at most 65535 sequences
  chunked_wg,  ///< the chunked pass with its two chains on wgmma (kernels/kda_backward/chains_wg.cu; the states'
               ///< products as bf16 hi + lo, docs/kernels/kda_backward.md "The chains on wgmma"); D = 128 only, at
               ///< most 65535 sequences; the rule's pick for D = 128
};

/// The last launch kda_backward runs (to time the phases apart: each prefix is timed, its difference to the one
/// before is the phase). Phases past `last` are not launched, so the outputs are then incomplete.
enum class KdaBackwardPhase {
  prepare,        ///< the pre-ops (both passes)
  factors,        ///< chunked: the chunks' factors (the sweep: its sweep)
  forward_chain,  ///< chunked: S entering every chunk (the sweep: its sweep)
  reverse_chain,  ///< chunked: dS leaving every chunk, dS0 (the sweep: its sweep)
  gradients,      ///< chunked: the gradient kernel (the sweep: its sweep)
  all,            ///< everything, the epilogue and the params sums included
};

/// What benchmarks and tests force; kda_backward without overrides (nullptr) runs the rule of kda_backward_plan.
struct KdaBackwardOverrides {
  KdaBackwardPass pass = KdaBackwardPass::automatic;
  KdaBackwardPhase last = KdaBackwardPhase::all;
  /// The chunked passes with HV = H apply the chain rules (L2Norm, gate, beta sigmoid) at the end of their gradient
  /// kernel, and no epilogue kernel runs; true keeps the partials and the separate epilogue kernel there too (the
  /// same bits: tests compare the two).
  bool separate_epilogue = false;
};

/// The pass kda_backward runs for these arguments and overrides (never automatic). Errors: kdalab::Error for bad
/// shapes (as kda_backward) or when the overrides force the chunked pass where it does not run (D = 256, or more
/// than 65535 sequences) or chunked_wg where it does not run (D = 64 or 256, or more than 65535 sequences).
KdaBackwardPass kda_backward_plan(const KdaBackwardArgs& a, const KdaBackwardOverrides* overrides = nullptr);

/// Bytes of device scratch kda_backward needs for these shapes on the current device (checks the shapes and options
/// too; the pointers are not read). Formula (docs/kernels/kda_backward.md), with M = B T token rows (T with
/// cu_seqlens), P = D / NC column blocks (NC = 64, or 32 at D = 256), all fp32:
///   prepared inputs   M (2 H D + 2 H + HV D + HV)
///   sweep pass:
///     checkpoints     K HV D^2,  K = N ceil(T / 64) (fixed length) or N + floor(T / 64) + 1 (cu_seqlens)
///     partials        P M HV (3 D + 1) + M HV
///     scratch         G 16 D NC,  G = min(N HV P, resident CTAs of the sweep kernel on this device)
///   chunked pass (16-token chunks, J = N ceil(T / 16) or N + floor(T / 16) + 1 chunk slots):
///     chunk factors   J HV (7 16 D + 3 16^2)
///     S and dS        2 J HV D^2 (the state entering and the gradient leaving every chunk)
///     partials        M HV (3 D + 1) + M HV, or M HV (D + 1) where HV = H (the gradient kernel applies the chain
///                     rules; KdaBackwardOverrides::separate_epilogue keeps the first form)
/// each region rounded up to 256 bytes.
std::size_t kda_backward_workspace_bytes(const KdaBackwardArgs& a, const KdaBackwardOverrides* overrides = nullptr);

/// The KDA backward (file comment). Asynchronous on `stream`; no allocation, no host synchronisation, no side stream
/// (capturable in a CUDA graph). Deterministic. Errors: kdalab::Error (see file comment), before anything is launched.
void kda_backward(const KdaBackwardArgs& a, cudaStream_t stream, const KdaBackwardOverrides* overrides = nullptr);

}  // namespace kdalab::kernels
