// Device-side seeded fills for benchmarks (counter-based hash + Box-Muller): large inputs without
// host generation. Not used for correctness tests (those use numerics/random.hpp on the host).
#include "kernels/common/kda_math.cuh"
#include "kernels/common/random_fill.hpp"

namespace kdalab::kernels {
namespace {
__device__ __forceinline__ std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return x;
}
__device__ __forceinline__ float u01(std::uint64_t h) { return ((h >> 40) + 0.5f) * (1.0f / 16777216.0f); }
__device__ __forceinline__ float normal(std::uint64_t seed, std::size_t i) {
  const std::uint64_t h = mix(seed * 0x9e3779b97f4a7c15ull + i);
  const float u1 = u01(h), u2 = u01(mix(h + 0x632be59bd9b4e019ull));
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}
__global__ void fill_bf16_kernel(bf16_t* p, std::size_t n, std::uint64_t seed, float sigma) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t w = detail::pack_bf16(sigma * normal(seed, i), 0.0f);
    p[i] = static_cast<bf16_t>(w & 0xffffu);
  }
}
__global__ void fill_f32_kernel(float* p, std::size_t n, std::uint64_t seed, float sigma, bool uniform) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = uniform ? u01(mix(seed * 0x9e3779b97f4a7c15ull + i)) : sigma * normal(seed, i);
}
}  // namespace

void fill_normal_bf16(bf16_t* p, std::size_t n, std::uint64_t seed, float sigma, cudaStream_t s) {
  fill_bf16_kernel<<<1024, 256, 0, s>>>(p, n, seed, sigma);
  cuda_check(cudaGetLastError(), "fill_normal_bf16");
}
void fill_normal_f32(float* p, std::size_t n, std::uint64_t seed, float sigma, cudaStream_t s) {
  fill_f32_kernel<<<1024, 256, 0, s>>>(p, n, seed, sigma, false);
  cuda_check(cudaGetLastError(), "fill_normal_f32");
}
void fill_uniform_f32(float* p, std::size_t n, std::uint64_t seed, cudaStream_t s) {
  fill_f32_kernel<<<1024, 256, 0, s>>>(p, n, seed, 1.0f, true);
  cuda_check(cudaGetLastError(), "fill_uniform_f32");
}
}  // namespace kdalab::kernels
