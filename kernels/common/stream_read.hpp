#pragma once
/// A plain streaming read of a device buffer: the floor a memory-bound kernel reading the same bytes is measured
/// against (bench --op mla-decode prints it beside the decode step for small batches, where a fixed cost per step
/// matters). Reads `bytes` bytes from `p` with 16-byte loads (4 CTAs of 512 threads per SM, 8 loads in flight per
/// thread) and folds them into one value that is written to `sink` only if it equals an impossible pattern (so the
/// loads are not removed). Asynchronous on the stream; capturable in a CUDA graph.
/// Errors: kdalab::Error if p is not 16-byte aligned, bytes is not a multiple of 16, or the launch fails.
#include <cstddef>

#include "kernels/kda.hpp"

namespace kdalab::kernels {
void stream_read(const void* p, std::size_t bytes, unsigned* sink, cudaStream_t s);
}  // namespace kdalab::kernels
