#pragma once
// sm_90 shared-memory mbarriers and bulk copies that complete on them, shared by Block AttnRes (kernels/attn_res.cu: a
// ring of row copies) and the fast MLA prefill attention (kernels/mla_prefill/fast_wg.cu: TMA tiles in, TMA stores of
// o out). Source: PTX ISA, "mbarrier", "cp.async.bulk" and "cp.async.bulk.tensor".
#include <cstdint>

namespace kdalab::kernels::detail::mbar {

__device__ __forceinline__ unsigned smem_u32(const void* ptr) { return static_cast<unsigned>(__cvta_generic_to_shared(ptr)); }

/// Initialises `bar` for `count` arrivals per phase (one thread; mbar_init_fence and a CTA barrier before any use).
__device__ __forceinline__ void init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
/// Makes the initialisations visible to the async proxy (the copies that complete on the barriers).
__device__ __forceinline__ void init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

/// One arrival that also expects `bytes` of copies to complete on `bar` in its current phase.
__device__ __forceinline__ void arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
/// One arrival (release: this thread's earlier shared-memory reads and writes are ordered before the phase completes).
__device__ __forceinline__ void arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
/// Waits until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void wait(std::uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

/// `bytes` from global `src` into shared `dst` (both 16-byte aligned, bytes a multiple of 16), completing on `bar`,
/// which expects exactly those bytes (this call makes the arrival). The fence orders the CTA's earlier generic-proxy
/// accesses of `dst` before the copy's writes.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, std::uint64_t* bar) {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  arrive_expect_tx(bar, bytes);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

/// One box of a rank-3 TMA tensor map (`tmap`: the address of a __grid_constant__ CUtensorMap kernel parameter) at
/// element coordinates (c0, c1, c2) into shared `dst` (aligned as the map's swizzle needs: 1024 bytes for 128-byte
/// swizzle), completing on `bar` (whose expected bytes the caller has set). Elements outside the tensor read as 0.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* tmap, int c0, int c1, int c2, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<std::uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}

/// One box of a rank-3 TMA tensor map from shared `src` (aligned as the map's swizzle needs) to global at element
/// coordinates (c0, c1, c2), in this thread's current bulk async-group (bulk_commit closes it). The caller has made its
/// CTA's generic-proxy writes of `src` visible to the async proxy (fence.proxy.async.shared::cta, then a barrier).
/// Elements outside the tensor are not written.
__device__ __forceinline__ void tma_store_3d(const void* tmap, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<std::uint64_t>(tmap)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
/// Closes this thread's current bulk async-group (the stores issued since the last commit).
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/// Waits until this thread's committed bulk async-groups have read their shared-memory sources (their global writes
/// may still be in flight), so that the sources may be rewritten or the CTA may exit.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

}  // namespace kdalab::kernels::detail::mbar
