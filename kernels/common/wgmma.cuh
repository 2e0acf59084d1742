#pragma once
// sm_90a warpgroup-MMA (wgmma) functions shared by the MLA decode kernels (kernels/mla_decode/split.cu) and the KDA wgmma
// state pass (kernels/kda_prefill/state_wgmma.cu, kda_state_wg_kernel): the 128-byte-swizzled shared-memory layout, the matrix
// descriptor, the fence / commit / wait instructions and the register fence. Source: PTX ISA, "Asynchronous Warpgroup
// Level Matrix Multiply-Accumulate" (wgmma.mma_async, matrix descriptors, swizzling modes).
#include <cstdint>

namespace kdalab::kernels::detail::wgmma_util {

/// Byte offset of 16-byte chunk c (0..7) of row r in a [rows x 64 bf16] 128-byte-swizzled block (1024-byte aligned).
__device__ __forceinline__ int sw(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

/// Shared-memory matrix descriptor (PTX ISA, wgmma matrix descriptor): start address, leading and
/// stride byte offsets (all >> 4), 128-byte swizzle.
__device__ __forceinline__ std::uint64_t desc(std::uint32_t saddr, std::uint32_t lbo, std::uint32_t sbo) {
  return static_cast<std::uint64_t>((saddr & 0x3FFFF) >> 4) | (static_cast<std::uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<std::uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (std::uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/// Waits until at most N committed wgmma groups of this warp are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
/// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to wgmma.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/// Keeps the compiler from moving register reads or writes of x across this point (an empty asm that "defines"
/// x): used after a wgmma wait on the accumulators and register A fragments of the wgmmas it waited for.
__device__ __forceinline__ void fence_reg(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void fence_reg(std::uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }

}  // namespace kdalab::kernels::detail::wgmma_util
