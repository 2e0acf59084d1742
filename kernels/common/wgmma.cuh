#pragma once
// sm_90a warpgroup-MMA (wgmma) functions shared by the MLA decode kernels (kernels/mla_decode/split.cu), the KDA wgmma
// state pass (kernels/kda_prefill/state_wgmma.cu, kda_state_wg_kernel), the KDA backward's wgmma chains
// (kernels/kda_backward/chains_wg.cu) and the fast MLA prefill attention (kernels/mla_prefill/fast_wg.cu): the
// 128-byte-swizzled shared-memory layout, the matrix descriptor, the fence / commit / wait instructions, the register
// fence, the m64n128k16 products and the m64n16k16 / m64n32k16 products with A from registers (bf16, and fp16 for the
// m64n32k16 and MN-major m64n128k16 ones). Source: PTX ISA,
// "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (wgmma.mma_async, matrix descriptors, swizzling modes).
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

// The m64n128k16 product with A from registers and B MN-major, for bf16 (TY = bf16) or fp16 (TY = f16) operands.
#define KDALAB_WGMMA_N128_T(TY)                                                                                   \
  asm volatile(                                                                                                   \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                                \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"                                                \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                     \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                           \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                           \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                           \
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                                 \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),             \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),       \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),     \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),     \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),     \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),     \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),     \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])      \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))

/// D[64 x 128] (+)= A B, A [64 x 16] bf16 (F16: fp16) in registers, B MN-major (transposed) in shared memory, of the
/// same type; D: 64 fp32 per thread; scale_d = 0: D = A B (D's registers are not read).
template <bool F16 = false>
__device__ __forceinline__ void mma_n128_t(float* d, const std::uint32_t* a, std::uint64_t db, int scale_d) {
  if constexpr (F16) KDALAB_WGMMA_N128_T("f16");
  else KDALAB_WGMMA_N128_T("bf16");
}
#undef KDALAB_WGMMA_N128_T

/// D[64 x 128] += A B as above (scale_d = 1).
template <bool F16 = false>
__device__ __forceinline__ void mma_n128_t(float* d, const std::uint32_t* a, std::uint64_t db) {
  mma_n128_t<F16>(d, a, db, 1);
}

/// D[64 x 16] (+)= A B, A [64 x 16] bf16 in registers (the m16n8k16 A-fragment layout per warp), B [16 x 16] K-major in
/// shared memory; ACC = 0: D = A B (D's registers are not read: no zero-initialisation between the fences). D: 8 fp32
/// per thread, the m64nN accumulator layout.
template <int ACC = 1>
__device__ __forceinline__ void mma_n16(float* d, const std::uint32_t* a, std::uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(ACC));
}
// The m64n32k16 product with A from registers and B K-major, for bf16 (TY = bf16) or fp16 (TY = f16) operands.
#define KDALAB_WGMMA_N32(TY)                                                                                      \
  asm volatile(                                                                                                   \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                                \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "    \
      "%11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"                                      \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),             \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])        \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(ACC))

/// D[64 x 32] (+)= A B as mma_n16 with B [16 x 32] K-major; D: 16 fp32 per thread. F16: A and B fp16 instead of bf16.
template <int ACC = 1, bool F16 = false>
__device__ __forceinline__ void mma_n32(float* d, const std::uint32_t* a, std::uint64_t db) {
  if constexpr (F16) KDALAB_WGMMA_N32("f16");
  else KDALAB_WGMMA_N32("bf16");
}
#undef KDALAB_WGMMA_N32

/// D[64 x 128] (+)= A B, A [64 x 16] and B [16 x 128] both K-major in shared memory (descriptors); scale_d = 0: D = A B
/// (D's registers are not read). D: 64 fp32 per thread, the m64nN accumulator layout.
__device__ __forceinline__ void mma_n128_ss(float* d, std::uint64_t da, std::uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}

}  // namespace kdalab::kernels::detail::wgmma_util
