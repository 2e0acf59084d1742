// Limits of the Block AttnRes kernel's ring depth (kernels/attn_res.hpp AttnResArgs::ring_depth), without CUDA headers,
// so that a CPU build can refuse a depth the kernel would refuse (experiments/bench.cpp) from the same numbers.
#pragma once

namespace kdalab::kernels {

/// Row buffers of the ring by the rule (ring_depth = 0).
constexpr int attn_res_ring_depth_rule = 3;
/// The deepest ring a run-time depth may ask for.
constexpr int attn_res_ring_depth_max = 8;
/// Static shared memory of the kernels (the reduction slots and the barriers of the deepest ring, up to the 128-byte
/// alignment of the dynamic array: 640 bytes, as ptxas reports); kernels/attn_res.cu checks it against its arrays.
constexpr int attn_res_smem_static = 640;
/// Dynamic shared memory a CTA may take: the 227 KB sm_90 opt-in limit less the static part. The pseudo-query and a
/// ring of n rows take 4 d + 2 d n bytes, which must fit.
constexpr int attn_res_smem_dyn_max = 227 * 1024 - attn_res_smem_static;

}  // namespace kdalab::kernels
