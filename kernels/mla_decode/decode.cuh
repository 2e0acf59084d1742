#pragma once
// Private to kernels/mla_decode/: the kernel parameters the split kernel (split.cu) and the combine kernel
// (combine.cu) share, and the host entry point of each file (called by launch.cu). Math, layouts and the algorithm:
// kernels/mla.hpp; design and measurements: docs/kernels/mla_decode.md.
#include <cuda_runtime_api.h>

#include "kernels/mla.hpp"

namespace kdalab::kernels::mla_decode_impl {

constexpr int DC = 512;    // d_c
constexpr int NTHR = 256;  // threads of a split-kernel CTA: two warpgroups
constexpr int BLK = 64;    // tokens per block of the split kernel; slices are whole blocks

/// Parameters of the split and combine kernels (one struct: both read the plan, the lengths and the workspace).
struct DecodeParams {
  int B, max_len, split_len, num_splits;
  const int* lens;
  const bf16_t* c;
  long long sc_b, sc_t;
  const bf16_t *q_hi, *q_lo;
  long long sq_b;
  float scale_log2;  // scale * log2(e)
  float *ws_acc, *ws_ml, *out;
  int q16;           // q_hi / q_lo rows 16-byte aligned (cp.async); else 4-byte loads
  int p_hi_only;     // ablation: P lo rows = 0
  int direct;        // one slice per sequence: the split kernel writes the output, no combine
};

/// Parameters of the fast-precision kernels: DecodeParams and the multi-token decode fields. The accurate kernels take
/// DecodeParams alone (s_q = 1, one row group), so their parameters, and code, are those of the one-token step.
struct FastParams : DecodeParams {
  int s_q;         // query tokens per sequence, 1..4
  int groups;      // row groups of 64 query rows per slice: CTAs x = split * groups + group
  long long sq_t;  // token stride of q_hi in elements
};

/// Query tokens per sequence and row groups per slice of a kernel's parameters (accurate: 1 and 1).
__host__ __device__ __forceinline__ int query_tokens(const DecodeParams&) { return 1; }
__host__ __device__ __forceinline__ int query_tokens(const FastParams& p) { return p.s_q; }
__host__ __device__ __forceinline__ int row_groups(const DecodeParams&) { return 1; }
__host__ __device__ __forceinline__ int row_groups(const FastParams& p) { return p.groups; }

/// Tokens of sequence b: lens[b], or max_len without lens.
__device__ __forceinline__ int seq_len(const DecodeParams& p, int b) { return p.lens ? p.lens[b] : p.max_len; }

/// Launches the split kernel for H heads over grid (num_splits x groups, B), the accurate (p as its DecodeParams) or the
/// fast precision (split.cu).
void launch_split(int H, bool fast, dim3 grid, cudaStream_t stream, const FastParams& p);

/// Launches the combine kernel over (s_q H query rows, B sequences, 4 column quarters) with programmatic dependent
/// launch after the split kernel (combine.cu).
void launch_combine(int H, bool fast, int B, int num_splits, cudaStream_t stream, const FastParams& p);

}  // namespace kdalab::kernels::mla_decode_impl
