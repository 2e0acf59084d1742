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

/// Tokens of sequence b: lens[b], or max_len without lens.
__device__ __forceinline__ int seq_len(const DecodeParams& p, int b) { return p.lens ? p.lens[b] : p.max_len; }

/// Launches the split kernel for H heads over grid (num_splits, B) (split.cu).
void launch_split(int H, dim3 grid, cudaStream_t stream, const DecodeParams& p);

/// Launches the combine kernel over (H heads, B sequences, 4 column quarters) with programmatic dependent launch
/// after the split kernel (combine.cu).
void launch_combine(int H, int B, int num_splits, cudaStream_t stream, const DecodeParams& p);

}  // namespace kdalab::kernels::mla_decode_impl
