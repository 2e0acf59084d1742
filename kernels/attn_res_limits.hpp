// Limits of the Block AttnRes kernel's ring depth (kernels/attn_res.hpp AttnResArgs::ring_depth) and its rule for the
// vectors a thread, without CUDA headers, so that a CPU build (experiments/bench.cpp) and the tests use the kernel's
// own numbers.
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
/// The most threads a CTA has, and the most 16-byte vectors of a row a thread owns.
constexpr int attn_res_max_threads = 256, attn_res_max_vpt = 8;
/// The rule's vectors a thread (AttnResArgs::vectors_per_thread = 0) at width d: the fewest that keep a row's d / 8
/// vectors within attn_res_max_threads, ceil(d / 2048); the accepted counts run from it to attn_res_max_vpt.
constexpr int attn_res_vectors_per_thread_rule(int d) {
  const int v = (d / 8 + attn_res_max_threads - 1) / attn_res_max_threads;
  return v < 1 ? 1 : v;
}
static_assert(attn_res_vectors_per_thread_rule(8) == 1 && attn_res_vectors_per_thread_rule(2304) == 2 &&
                  attn_res_vectors_per_thread_rule(7168) == 4 && attn_res_vectors_per_thread_rule(16384) == 8,
              "the rule: ceil(d / 2048), at least 1");

}  // namespace kdalab::kernels
