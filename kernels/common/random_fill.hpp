#pragma once
/// Seeded device-side fills for benchmark inputs (never zeros): N(0, sigma^2) rounded to bf16 or
/// fp32, and U(0, 1) in fp32. Deterministic for a seed on one device; not bit-identical to
/// numerics/random.hpp (correctness tests use that one). Asynchronous on the stream.
/// Errors: kdalab::Error on a CUDA launch error.
#include <cstddef>
#include <cstdint>

#include "kernels/kda.hpp"

namespace kdalab::kernels {
void fill_normal_bf16(bf16_t* p, std::size_t n, std::uint64_t seed, float sigma, cudaStream_t s);
void fill_normal_f32(float* p, std::size_t n, std::uint64_t seed, float sigma, cudaStream_t s);
void fill_uniform_f32(float* p, std::size_t n, std::uint64_t seed, cudaStream_t s);
}  // namespace kdalab::kernels
