// The split kernel of the absorbed MLA decode (kernels/mla.hpp): one CTA (two warpgroups, 256 threads) per (slice of
// split_len tokens, sequence), all H heads; it writes the slice's partial (running max m, sum l, unnormalised
// accumulator) to the workspace, or, with one slice per sequence (DecodeParams::direct), the normalised output itself.
// Design and measurements: docs/kernels/mla_decode.md.
//
// The "seesaw" schedule. Precision plan: q~ = q_hi + q_lo and P = P_hi + P_lo in bf16, fp32 accumulation. The
// schedule idea (two KV blocks per step, the output split by columns between the two warpgroups, the running max
// handed from warpgroup 0 to warpgroup 1) is the one FlashMLA published for its Hopper kernel (deepseek-ai/FlashMLA
// docs, "A Deep-Dive Into the New Flash MLA Kernel", 2025); the code below is ours.
//
// Rows: q~ row 2h = q_hi of head h, row 2h + 1 = q_lo of head h (heads >= H: zero rows). In the wgmma m64nN
// accumulator a thread holds rows r0 = 16 warp + lane / 4 and r0 + 8, so rows 2h and 2h + 1 sit in lanes 4 apart:
// s = S[2h] + S[2h + 1] is one __shfl_xor(., 4), and the softmax runs in registers (no S in shared memory). A thread
// of an even row (lane / 4 even) holds the hi rows of the score, P and output accumulators, its partner the lo rows.
//
// Blocks of 64 tokens: block 2i (A) lives in buffer 0, block 2i + 1 (B) in buffer 1 (64 KB each, 8 column blocks
// of [64 tokens x 64] in the 128-byte swizzle of kernels/common/wgmma.cuh). Warpgroup 0 owns the output columns
// [0, 256) (o_L), warpgroup 1 [256, 512) (o_R), each as one m64n256 fp32 accumulator (128 registers per thread). Per
// pair i (m = running max per head, log2 domain; [w] = warpgroup w):

//   [0] S_A = q~ C_A^T (32 wgmma m64n64k16)        [1] S_B = q~ C_B^T (concurrently)
//   [0] mA = max(m, rowmax S_A) -> shared, P_A = 2^(S_A - mA), o_L = 2^(m - mA) o_L + P_A C_A[:, L]
//       (P_A hi / lo straight from the accumulator registers: the m64n64 accumulator layout is the register
//       A-fragment layout of m64n256k16, so its own P never goes through shared memory)
//   [1] mB = max(mA, rowmax S_B) -> shared, P_B = 2^(S_B - mB) -> shared, o_R = 2^(m - mB) o_R + P_B C_B[:, R]
//   [0] P_A' = P_A 2^(mA - mB) -> shared;  o_L = 2^(mA - mB) o_L + P_B C_B[:, L]   (P_B from shared)
//   [1] o_R += P_A' C_A[:, R]                                                      (P_A' from shared)
// so warpgroup 0's P_A C_A (tensor) overlaps warpgroup 1's softmax, and each P C of one warpgroup the other's
// softmax or P C. Both end the pair at m = mB. The running sums l stay per thread and per warpgroup (each scaled like
// its accumulator) and are added once in the epilogue; the hi and lo output rows are added there by one shuffle.
//
// Loads (cp.async, rows past the slice zero-filled): warpgroup w loads column half w of both buffers
// (latent columns [256 w, 256 w + 256): the only half its own P C reads) and q~ column blocks [4 w, 4 w + 4). It
// refills a half as soon as its own last reader is done, with no cross-warpgroup wait: buffer 0's L half after [0]'s
// P_A C_A[:, L] (mid-pair), buffer 1's R half after [1]'s P_B C_B[:, R] (mid-pair), buffer 0's R half after [1]'s
// P_A' C_A[:, R], buffer 1's L half after [0]'s P_B C_B[:, L] (end of the pair; the other warpgroup's scores of
// these buffers precede the P it handed over). Each warpgroup starts its next scores on the column half it
// refilled mid-pair (k-blocks 4 w .. 4 w + 3 first: its own loads), then waits for the other warpgroup's
// "landed" signal and scores the other half. Commit groups per thread and pair, oldest first:
//   warpgroup 0: [buffer 0 L (block 2i + 2)], [buffer 1 L (2i + 3)];  warpgroup 1: [buffer 1 R (2i + 3)], [buffer 0 R (2i + 2)]
// (the prologue puts the q~ half into the first group), so cp.async.wait_group 1 = "the half I score first landed".
//
// Named barriers (256 threads: one warpgroup arrives, the other syncs; each producer's next arrival on the same
// barrier is ordered after the consumer's sync by another barrier of the cycle below, so a generation never takes
// two arrivals of one warpgroup):
//   LANDED_L [0 -> 1] wg 0's halves + q~ blocks 0-3 landed;  LANDED_R [1 -> 0] wg 1's halves + q~ blocks 4-7 landed
//   M0 [0 -> 1] mA in shared;  M1 [1 -> 0] mB in shared;  P0 [0 -> 1] P_A' in shared;  P1 [1 -> 0] P_B in shared
// plus one 128-thread barrier per warpgroup (1 + w) before wgmma reads its own fresh cp.async data and
// before it overwrites a half its wgmma just read. Per pair: 2 + 2 warpgroup barriers and 6 one-way barriers,
// no __syncthreads.
// A pair with no block B (odd block count, last pair): warpgroup 1 skips its scores and P C on B (rowmax -inf, so
// mB = mA) but keeps every barrier; warpgroup 0 skips the P_B C_B[:, L] step and the P1 barrier.
// Shared memory: q~ 64 KB + 2 x 64 KB buffers + P_A', P_B (8 KB each) + 768 B = 209 KB (+ 1 KB alignment slack).
//
// The fast precision (MlaDecodePrecision::fast; the kernel's FAST instantiation) runs the same schedule with three
// changes. Rows: row r of the CTA of row group grp is the query row qr = 64 grp + r of the sequence, token qr / H and
// head qr % H (rows qr >= s_q H: zero rows), each with its own online softmax: no partner row, no shuffle, and every
// row of P is bf16(P) (lo_row = 0). The causal mask: the row of token j reads the tokens < len - (s_q - 1 - j), so in
// the last block of the sequence its last s_q - 1 - j tokens score -inf. A row can then have no valid token in a
// block, or in a whole slice (a last slice of <= 3 tokens), so its running max is kept >= -FLT_MAX (2^(-inf + FLT_MAX)
// is 0; 2^(-inf + inf) would be NaN); such a slice's partial has l = 0 and weight 0 in the combine. The per-row shared
// values (mA, mB, l) have 64 entries, one per row, instead of 32, one per head.
#include <cfloat>
#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/common/wgmma.cuh"
#include "kernels/common/cuda_check.hpp"
#include "kernels/common/kda_math.cuh"
#include "kernels/mla_decode/decode.cuh"

namespace kdalab::kernels::mla_decode_impl {

namespace {
using namespace detail;
// the 128-byte swizzle, descriptor, fence / commit / wait: kernels/common/wgmma.cuh
using wgmma_util::desc;
using wgmma_util::fence_async_smem;
using wgmma_util::sw;
using wgmma_util::wgmma_commit;
using wgmma_util::wgmma_fence;

constexpr int CB_BYTES = BLK * 128;           // one column block [64 tokens x 64 columns] of a buffer: 8 KB
constexpr int BUF_BYTES = 8 * CB_BYTES;       // one token block: 64 KB
constexpr int OFF_Q = 0;                      // q~ [64 rows x 512]: 8 column blocks of [64 rows x 64], 64 KB
constexpr int OFF_C = 64 * DC * 2;            // buffer 0 (blocks 0, 2, ..), buffer 1 (blocks 1, 3, ..)
constexpr int OFF_P = OFF_C + 2 * BUF_BYTES;  // P_A' (warpgroup 0 -> 1), P_B (1 -> 0): [64 rows x 64 tokens] bf16, 8 KB each
constexpr int OFF_M = OFF_P + 2 * 64 * 128;   // mA, mB, l of warpgroup 1 (epilogue), fp32: 32 each, or 64 with fast
constexpr std::size_t SMEM = OFF_M + 3 * 64 * 4 + 1024;  // + slack to align the base to 1024 bytes
static_assert(SMEM <= 227 * 1024, "smem");

/// Barrier of the 128 threads of warpgroup wg (named barrier 1 + wg; 0 is __syncthreads).
__device__ __forceinline__ void wg_barrier(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory"); }

/// D[64 x 256] (+)= A B, A K-major, B MN-major (transposed) in shared memory; D: 128 fp32 per thread.
__device__ __forceinline__ void wgmma_m64n256_tb(float* d, std::uint64_t da, std::uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d));
}

enum : int { BAR_LANDED_L = 3, BAR_LANDED_R = 4, BAR_M0 = 5, BAR_M1 = 6, BAR_P0 = 7, BAR_P1 = 8 };  // 1, 2: wg_barrier

/// One-way signal to the other warpgroup on named barrier id (256 threads: this warpgroup's 128 arrive, the
/// other's 128 sync). Orders this thread's earlier shared-memory writes before the other warpgroup's reads after
/// its bar_sync (barrier release / acquire).
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
/// Waits for the other warpgroup's bar_arrive on named barrier id.
__device__ __forceinline__ void bar_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
using wgmma_util::fence_reg;  // (kernels/common/wgmma.cuh)
using wgmma_util::wgmma_wait;

/// D[64 x 64] (+)= A B, A and B K-major in shared memory (descriptors); D: 32 fp32 per thread.
__device__ __forceinline__ void wgmma_m64n64(float* d, std::uint64_t da, std::uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

/// D[64 x 256] += A B with A [64 x 16] bf16 in registers (4 x b32 per thread, the m16n8k16 A-fragment layout per
/// warp: {row g, k 2c..2c+1}, {row g + 8, k 2c..}, {row g, k 2c + 8..}, {row g + 8, k 2c + 8..}) and B MN-major
/// (transposed) in shared memory; D: 128 fp32 per thread.
__device__ __forceinline__ void wgmma_m64n256_rs(float* d, const std::uint32_t* a, std::uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/// Loads q~ column blocks [4 wg, 4 wg + 4) of all 64 rows of the CTA by the 128 threads of warpgroup wg (wt = thread
/// in the warpgroup): 16-byte cp.async when p.q16 (in the caller's commit group), else 4-byte loads + st.shared.
/// Accurate: the interleaved rows 2h = q_hi[h], 2h + 1 = q_lo[h] (heads >= H: zeros). FAST: row r = query row
/// qr = 64 grp + r, q_hi of token qr / H and head qr % H (qr >= s_q H: zeros).
template <int H, bool FAST, class Params>
__device__ __forceinline__ void load_q_half(unsigned char* q_s, const Params& p, int b, int grp, int wt, int wg) {
  auto put = [&](unsigned char* d, const bf16_t* src) {
    if (p.q16) {
      cp_async16(d, src);
    } else {
      uint4 v;
      v.x = ld32(src); v.y = ld32(src + 2); v.z = ld32(src + 4); v.w = ld32(src + 6);
      *reinterpret_cast<uint4*>(d) = v;
    }
  };
#pragma unroll 4
  for (int i = 0; i < 64 * 32 / 128; ++i) {
    const int idx = wt + 128 * i, r = idx / 32, ch = 32 * wg + idx % 32;
    unsigned char* d = q_s + (ch / 8) * 8192 + sw(r, ch % 8);
    if constexpr (FAST) {
      const int qr = 64 * grp + r;
      if (qr < p.s_q * H)
        put(d, p.q_hi + b * p.sq_b + (qr / H) * p.sq_t + (qr % H) * DC + ch * 8);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    } else {
      const int h = r >> 1;
      if (h < H)
        put(d, ((r & 1) ? p.q_lo : p.q_hi) + b * p.sq_b + h * DC + ch * 8);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

/// Issues (does not commit) the score wgmmas over latent column blocks [kb0, kb0 + 4) of one token block:
/// sc (+)= q~[:, K] C_blk[:, K]^T, 16 wgmma m64n64k16 (K = 256). first: the first of the two halves (scale_d = 0
/// on its first wgmma).
/// The descriptors of the later k-steps are the first ones plus (byte offset >> 4) in the start-address field
/// (bits 0-13; shared addresses < 256 KB, so the field never carries into the next one).
__device__ __forceinline__ void scores_half(float* sc, std::uint32_t q_addr, std::uint32_t c_blk, int kb0, bool first) {
  const std::uint64_t dq = desc(q_addr + kb0 * 8192, 16, 1024), dc = desc(c_blk + kb0 * CB_BYTES, 16, 1024);
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n64(sc, dq + ((k * 8192 + kk * 32) >> 4), dc + ((k * CB_BYTES + kk * 32) >> 4),
                   (first && k == 0 && kk == 0) ? 0 : 1);
}

/// Row scores of one block: sc (the m64n64 accumulator: element 4j + e is row r0 + 8 (e / 2), token 8j + 2 cq + e % 2)
/// becomes s * scale_log2 with s = S[2h] + S[2h + 1] when PAIRED (accurate: the partner row is in lane ^ 4; both lanes
/// get the same value), else s = the row's own score (fast); -inf for tokens >= valid;
/// mx[k] = the row max of row half k over the block's 64 tokens (quad reduction).
template <bool PAIRED>
__device__ __forceinline__ void row_scores(float* sc, int valid, float scale_log2, int cq, float* mx) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    float s = sc[e];
    if constexpr (PAIRED) s += __shfl_xor_sync(0xffffffffu, sc[e], 4);
    const int t = 8 * (e / 4) + 2 * cq + (e & 1);
    sc[e] = t < valid ? s * scale_log2 : -INFINITY;
    mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], sc[e]);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
    mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
  }
}

/// p = 2^(s - mx[row half]) in place; returns the thread's partial row sums in sum[2].
__device__ __forceinline__ void exp_rows(float* sc, const float* mx, float* sum) {
  sum[0] = sum[1] = 0.0f;
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    sc[e] = exp2f(sc[e] - mx[(e >> 1) & 1]);
    sum[(e >> 1) & 1] += sc[e];
  }
}

/// The bf16 part of (x0, x1) this thread's row carries: hi = bf16(x) for an even row (lo_row = 0), lo = bf16(x - hi)
/// for an odd one (0 when p_hi_only), packed x0 low.
__device__ __forceinline__ std::uint32_t part_bf16(float x0, float x1, int lo_row, int p_hi_only) {
  std::uint32_t hi, lo;
  split_bf16(x0, x1, hi, lo);
  return lo_row ? (p_hi_only ? 0u : lo) : hi;
}

/// P of one block as the register A fragments of 4 k-steps (tokens 16 kk .. 16 kk + 15): the accumulator elements
/// 4j + {0,1} (row r0) and 4j + {2,3} (row r0 + 8) of j = 2kk, 2kk + 1 are exactly the m16n8k16 A fragment.
__device__ __forceinline__ void pack_p(const float* p, std::uint32_t (*pa)[4], int lo_row, int p_hi_only) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = part_bf16(p[8 * kk + 0], p[8 * kk + 1], lo_row, p_hi_only);
    pa[kk][1] = part_bf16(p[8 * kk + 2], p[8 * kk + 3], lo_row, p_hi_only);
    pa[kk][2] = part_bf16(p[8 * kk + 4], p[8 * kk + 5], lo_row, p_hi_only);
    pa[kk][3] = part_bf16(p[8 * kk + 6], p[8 * kk + 7], lo_row, p_hi_only);
  }
}

/// Stores this thread's part of P (rows r0, r0 + 8; tokens 8j + 2cq, + 1) into the swizzled [64 x 64] P tile p_s
/// (K-major A operand of the other warpgroup's P C): pa from pack_p.
__device__ __forceinline__ void store_p(unsigned char* p_s, const std::uint32_t (*pa)[4], int r0, int cq) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    *reinterpret_cast<std::uint32_t*>(p_s + sw(r0, 2 * kk) + 4 * cq) = pa[kk][0];
    *reinterpret_cast<std::uint32_t*>(p_s + sw(r0 + 8, 2 * kk) + 4 * cq) = pa[kk][1];
    *reinterpret_cast<std::uint32_t*>(p_s + sw(r0, 2 * kk + 1) + 4 * cq) = pa[kk][2];
    *reinterpret_cast<std::uint32_t*>(p_s + sw(r0 + 8, 2 * kk + 1) + 4 * cq) = pa[kk][3];
  }
}

/// store_p of the parts of p * c[row half] (P_A' = P_A 2^(mA - mB)), computed 8 values at a time (registers).
__device__ __forceinline__ void store_p_scaled(unsigned char* p_s, const float* p, const float* c, int r0, int cq,
                                               int lo_row, int p_hi_only) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const float* x = p + 8 * kk;
    *reinterpret_cast<std::uint32_t*>(p_s + sw(r0, 2 * kk) + 4 * cq) = part_bf16(x[0] * c[0], x[1] * c[0], lo_row, p_hi_only);
    *reinterpret_cast<std::uint32_t*>(p_s + sw(r0 + 8, 2 * kk) + 4 * cq) = part_bf16(x[2] * c[1], x[3] * c[1], lo_row, p_hi_only);
    *reinterpret_cast<std::uint32_t*>(p_s + sw(r0, 2 * kk + 1) + 4 * cq) = part_bf16(x[4] * c[0], x[5] * c[0], lo_row, p_hi_only);
    *reinterpret_cast<std::uint32_t*>(p_s + sw(r0 + 8, 2 * kk + 1) + 4 * cq) = part_bf16(x[6] * c[1], x[7] * c[1], lo_row, p_hi_only);
  }
}

/// acc rows r0 (elements 4j, 4j + 1) *= c[0], rows r0 + 8 *= c[1]; skipped when both are 1 (bit-identical).
__device__ __forceinline__ void rescale(float* acc, const float* c) {
  if (c[0] != 1.0f || c[1] != 1.0f) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      acc[4 * j] *= c[0]; acc[4 * j + 1] *= c[0];
      acc[4 * j + 2] *= c[1]; acc[4 * j + 3] *= c[1];
    }
  }
}

/// Issues (does not commit) P C over the 4 k-steps of one block for this warpgroup's column half: acc += P
/// C_blk[:, 256 wg ..], P from registers (pa) or, when pa is null, from the swizzled shared tile at p_addr.
/// C_blk read as an MN-major B operand: LBO = one column block (8 KB), SBO = 8 tokens (1 KB).
__device__ __forceinline__ void pc_block(float* acc, const std::uint32_t (*pa)[4], std::uint32_t p_addr,
                                         std::uint32_t c_blk, int wg) {
  const std::uint64_t db = desc(c_blk + 4 * wg * CB_BYTES, CB_BYTES, 1024), dp = desc(p_addr, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if (pa)
      wgmma_m64n256_rs(acc, pa[kk], db + ((kk * 16 * 128) >> 4));
    else
      wgmma_m64n256_tb(acc, dp + ((kk * 32) >> 4), db + ((kk * 16 * 128) >> 4), 1);
  }
}

/// Stores this thread's part of its warpgroup's accumulator half (128 fp32, the m64n256 layout) at dst + row * DC +
/// column for its output rows row[0], row[1] < nrows; SCALED: each row's values times inv[k] first. PAIRED
/// (accurate): the output row of a head is its hi row + lo row, and the pair (hi lane, lo lane) = (lane, lane ^ 4)
/// splits the 32 column groups j: the hi lane sums j < 16, the lo lane j >= 16, each receiving the partner's row of
/// its half by one shuffle per element. Otherwise (fast) every accumulator row is an output row of its own.
template <bool SCALED, bool PAIRED>
__device__ __forceinline__ void store_rows(float* dst, const float* acc, const float* inv, const int* row, int nrows,
                                           int lo_row, int cq) {
#pragma unroll
  for (int j = 0; j < (PAIRED ? 16 : 32); ++j) {
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (PAIRED) {
        const float send = lo_row ? acc[4 * j + e] : acc[4 * (j + 16) + e];
        const float mine = lo_row ? acc[4 * (j + 16) + e] : acc[4 * j + e];
        v[e] = mine + __shfl_xor_sync(0xffffffffu, send, 4);
      } else {
        v[e] = acc[4 * j + e];
      }
      if constexpr (SCALED) v[e] *= inv[e / 2];
    }
    const int col = 8 * (PAIRED && lo_row ? j + 16 : j) + 2 * cq;
    if (row[0] < nrows) *reinterpret_cast<float2*>(dst + row[0] * DC + col) = make_float2(v[0], v[1]);
    if (row[1] < nrows) *reinterpret_cast<float2*>(dst + row[1] * DC + col) = make_float2(v[2], v[3]);
  }
}

/// The end of the split kernel: the running sums l of both warpgroups are added per row (through l1_s in shared
/// memory, at the thread's row indices ri), (m, l) of each output row and the slice's unnormalised partial (each
/// warpgroup's accumulator half: 128 fp32 per thread, the m64n256 layout; accurate: hi row + lo row) go to the
/// workspace slot (b, split) at the output rows qi < nq of the sequence; with p.direct (one slice per sequence) the
/// partial divided by l goes to the output instead.
template <bool FAST>
__device__ __forceinline__ void epilogue(const DecodeParams& p, float* acc, float* l, const float* m, float* l1_s, int b,
                                         int split, int wg, bool owner, const int* ri, const int* qi, int nq,
                                         int lo_row, int cq) {
  // l of both warpgroups per row; out = each warpgroup's accumulator half (accurate: hi row + lo row)
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 1);
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 2);
  }
  if (wg == 1 && owner) { l1_s[ri[0]] = l[0]; l1_s[ri[1]] = l[1]; }
  __syncthreads();
  if (p.direct) {
    // one slice per sequence (num_splits = 1): the output itself, acc / l with l of both warpgroups, the
    // same float operations as the combine's single-slice merge (acc * (1 / l)), so the same bits
    if (wg == 0 && owner) { l1_s[ri[0]] += l[0]; l1_s[ri[1]] += l[1]; }
    __syncthreads();
    const float inv[2] = {1.0f / l1_s[ri[0]], 1.0f / l1_s[ri[1]]};
    store_rows<true, !FAST>(p.out + static_cast<long long>(b) * nq * DC + 256 * wg, acc, inv, qi, nq, lo_row, cq);
    return;
  }
  const long long slot = static_cast<long long>(b) * p.num_splits + split;
  if (wg == 0 && owner) {
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (qi[k] < nq) {
        float* wm = p.ws_ml + (slot * nq + qi[k]) * 2;
        wm[0] = m[k];
        wm[1] = l[k] + l1_s[ri[k]];
      }
  }
  store_rows<false, !FAST>(p.ws_acc + slot * nq * DC + 256 * wg, acc, nullptr, qi, nq, lo_row, cq);
}

/// The kernel's parameters: DecodeParams for the accurate precision, FastParams for fast (decode.cuh).
template <bool FAST>
using ParamsOf = std::conditional_t<FAST, FastParams, DecodeParams>;

template <int H, bool FAST>
__global__ void __launch_bounds__(NTHR, 1) mla_decode_split_kernel(ParamsOf<FAST> p) {
  static_assert(H == 16 || H == 32, "H");
  const int s_q = query_tokens(p), groups = row_groups(p);  // accurate: 1, 1
  // the CTAs of one slice's row groups are neighbours in x (they read the same latents at about the same time)
  const int split = blockIdx.x / groups, grp = blockIdx.x % groups, b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, cq = lane % 4;
  // warpgroup index broadcast from lane 0: provably warp-uniform for ptxas (the wgmma code below branches on it)
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0), wt = tid % 128;
  const int r0 = 16 * (warp % 4) + g;            // this thread's accumulator rows r0, r0 + 8 (of the M = 64)
  // per row k = 0, 1 (r0, r0 + 8): ri = its index in the per-row shared values (mA_s, mB_s, l1_s), qi = the output row
  // of the sequence it carries (out [b] as nq rows of d_c). Accurate: both the head (rows 2h, 2h + 1 are its hi and lo
  // rows, one softmax); fast: ri = the row, qi = 64 grp + row (token qi / H, head qi % H; qi >= nq: a zero row)
  const int nq = s_q * H;
  const int ri[2] = {FAST ? r0 : r0 >> 1, FAST ? r0 + 8 : (r0 + 8) >> 1};
  const int qi[2] = {FAST ? 64 * grp + ri[0] : ri[0], FAST ? 64 * grp + ri[1] : ri[1]};
  const int lo_row = FAST ? 0 : g & 1;           // rows r0, r0 + 8 are lo rows (q_lo, P_lo) when g is odd (accurate)
  const bool owner = lo_row == 0 && cq == 0;     // writes the per-row values of its two rows
  const int len = seq_len(p, b);
  if (len < s_q || len > p.max_len) {  // NaN rows: written by the combine kernel, or here when there is none
    if (p.direct) {
      const int row0 = 64 * grp, nrow = FAST ? min(64, nq - row0) : H;  // this CTA's output rows
      for (int i = tid; i < nrow * DC; i += NTHR) p.out[(static_cast<long long>(b) * nq + row0) * DC + i] = NAN;
    }
    return;
  }
  const int start = split * p.split_len;
  if (start >= len) return;                // empty slice: the combine kernel does not read it
  const int end = min(start + p.split_len, len);
  const int nblk = (end - start + BLK - 1) / BLK, npairs = (nblk + 1) / 2;
  // the tokens this thread's rows read end at lim (exclusive): the slice's end, and with fast the causal mask, the
  // query of token j reading the tokens < len - (s_q - 1 - j). Both rows r0, r0 + 8 (all 16 rows of the warp) are of
  // one token: H >= 16 query rows per token, 64 per group. Zero rows (qi >= nq) read to the end.
  int lim = end;
  if constexpr (FAST) {
    if (qi[0] < nq) lim = min(end, len - (s_q - 1 - qi[0] / H));
  }

  extern __shared__ unsigned char smem_raw[];
  const std::uint32_t raw_addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);  // 1024-byte aligned (swizzle atoms)
  const std::uint32_t sbase = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  const std::uint32_t q_addr = sbase + OFF_Q, c0_addr = sbase + OFF_C, c1_addr = sbase + OFF_C + BUF_BYTES;
  const std::uint32_t pA_addr = sbase + OFF_P, pB_addr = sbase + OFF_P + 64 * 128;
  unsigned char* pA_s = smem + OFF_P;                 // P_A' (written by warpgroup 0)
  unsigned char* pB_s = smem + OFF_P + 64 * 128;      // P_B (written by warpgroup 1)
  float* mA_s = reinterpret_cast<float*>(smem + OFF_M);  // per row index ri: 32 (accurate) or 64 (fast) floats each
  float* mB_s = mA_s + (FAST ? 64 : 32);
  float* l1_s = mA_s + (FAST ? 128 : 64);

  const bf16_t* cb = p.c + b * p.sc_b;
  // this warpgroup's column half (16-byte chunks 32 wg .. 32 wg + 31 of each token row) of block blk into buffer
  // blk % 2: thread wt copies chunk hch of rows hrow, hrow + 4, .., hrow + 60 (a warp reads 512 contiguous bytes of
  // one row); rows past the slice are zeros
  const int hrow = wt / 32, hch = 32 * wg + wt % 32;
  auto load_half = [&](int blk) {
    const int t0 = start + blk * BLK + hrow;
    const bf16_t* src = cb + static_cast<long long>(t0) * p.sc_t + hch * 8;
    unsigned char* dst = smem + OFF_C + (blk & 1) * BUF_BYTES + (hch / 8) * CB_BYTES;
#pragma unroll
    for (int i = 0; i < BLK / 4; ++i) {
      unsigned char* d = dst + sw(hrow + 4 * i, hch % 8);
      if (t0 + 4 * i < end)
        cp_async16(d, src);
      else
        cp_async16_zfill(d, cb, 0);
      src += 4 * p.sc_t;
    }
  };

  // prologue: groups (oldest first) wg 0: [q~ blocks 0-3, block 0 L], [block 1 L]; wg 1: [q~ blocks 4-7, block 1 R],
  // [block 0 R] (a missing block 1: an empty group)
  load_q_half<H, FAST>(smem + OFF_Q, p, b, grp, wt, wg);
  if (wg == 0) {
    load_half(0);
    cp_async_commit();
    if (nblk > 1) load_half(1);
    cp_async_commit();
  } else {
    if (nblk > 1) load_half(1);
    cp_async_commit();
    load_half(0);
    cp_async_commit();
  }

  float acc[128];
#pragma unroll
  for (int e = 0; e < 128; ++e) acc[e] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows r0, r0 + 8 (log2 domain), the same in both warpgroups
  float l[2] = {0.0f, 0.0f};            // this thread's partial running sums (its tokens of its warpgroup's blocks)

  if (wg == 0) {
    for (int i = 0; i < npairs; ++i) {
      const int bA = 2 * i, bB = 2 * i + 1;
      const bool hasB = bB < nblk;
      float sc[32];
      // ---- S_A: k-blocks 0-3 (this warpgroup's loads), then 4-7 once warpgroup 1's have landed
      cp_async_wait<1>();
      fence_async_smem();
      wg_barrier(0);
      wgmma_fence();
      scores_half(sc, q_addr, c0_addr, 0, true);
      wgmma_commit();
      cp_async_wait<0>();  // block bB's L half too (warpgroup 1 scores it)
      fence_async_smem();
      bar_arrive(BAR_LANDED_L);
      bar_sync(BAR_LANDED_R);
      scores_half(sc, q_addr, c0_addr, 4, false);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < 32; ++e) fence_reg(sc[e]);
      // ---- softmax of block A; mA to warpgroup 1 first (it waits for it)
      float mx[2], mA[2], cA[2], sum[2];
      row_scores<!FAST>(sc, min(BLK, lim - (start + bA * BLK)), p.scale_log2, cq, mx);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        mA[k] = fmaxf(m[k], mx[k]);  // accurate: finite (token 0 of every block is valid)
        if constexpr (FAST) mA[k] = fmaxf(mA[k], -FLT_MAX);  // a row masked so far: finite, P = 0 (file comment)
      }
      if (owner) { mA_s[ri[0]] = mA[0]; mA_s[ri[1]] = mA[1]; }
      bar_arrive(BAR_M0);
#pragma unroll
      for (int k = 0; k < 2; ++k) cA[k] = exp2f(m[k] - mA[k]);  // 0 on the first pair (m = -inf)
      exp_rows(sc, mA, sum);
#pragma unroll
      for (int k = 0; k < 2; ++k) l[k] = l[k] * cA[k] + sum[k];
      // ---- o_L = cA o_L + P_A C_A[:, L], P_A from registers
      std::uint32_t pa[4][4];
      pack_p(sc, pa, lo_row, p.p_hi_only);
      rescale(acc, cA);
      wgmma_fence();
      pc_block(acc, pa, 0, c0_addr, 0);
      wgmma_commit();
      // ---- mB from warpgroup 1; P_A' = P_A 2^(mA - mB) to shared for its o_R
      bar_sync(BAR_M1);
      float cB[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) cB[k] = exp2f(mA[k] - mB_s[ri[k]]);
      store_p_scaled(pA_s, sc, cB, r0, cq, lo_row, p.p_hi_only);
      fence_async_smem();
      bar_arrive(BAR_P0);
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < 128; ++e) fence_reg(acc[e]);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) fence_reg(pa[kk][x]);
      // buffer 0's L half is free (only this warpgroup reads it): refill with block bA + 2
      wg_barrier(0);
      if (bA + 2 < nblk) load_half(bA + 2);
      cp_async_commit();
      rescale(acc, cB);
#pragma unroll
      for (int k = 0; k < 2; ++k) { l[k] *= cB[k]; m[k] = mB_s[ri[k]]; }
      // ---- o_L += P_B C_B[:, L], P_B from shared
      if (hasB) {
        bar_sync(BAR_P1);
        wgmma_fence();
        pc_block(acc, nullptr, pB_addr, c1_addr, 0);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 128; ++e) fence_reg(acc[e]);
        // buffer 1's L half is free (warpgroup 1 scored block bB before it handed over P_B): refill with bB + 2
        wg_barrier(0);
        if (bB + 2 < nblk) load_half(bB + 2);
        cp_async_commit();
      }
    }
  } else {
    for (int i = 0; i < npairs; ++i) {
      const int bA = 2 * i, bB = 2 * i + 1;
      const bool hasB = bB < nblk;
      float sc[32];
      // ---- S_B: k-blocks 4-7 (this warpgroup's loads), then 0-3 once warpgroup 0's have landed (one branch for
      // both halves: a control-flow join between them would copy the in-flight accumulators and make ptxas
      // serialize the wgmmas); without block B only the landing handshake
      float mx[2] = {-INFINITY, -INFINITY};
      cp_async_wait<1>();
      fence_async_smem();
      wg_barrier(1);
      if (hasB) {
        wgmma_fence();
        scores_half(sc, q_addr, c1_addr, 4, true);
        wgmma_commit();
        cp_async_wait<0>();  // block bA's R half too (warpgroup 0 scores it)
        fence_async_smem();
        bar_arrive(BAR_LANDED_R);
        bar_sync(BAR_LANDED_L);
        scores_half(sc, q_addr, c1_addr, 0, false);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 32; ++e) fence_reg(sc[e]);
        row_scores<!FAST>(sc, min(BLK, lim - (start + bB * BLK)), p.scale_log2, cq, mx);
      } else {
        cp_async_wait<0>();
        fence_async_smem();
        bar_arrive(BAR_LANDED_R);
        bar_sync(BAR_LANDED_L);
      }
      // ---- mB = max(mA, rowmax S_B) to warpgroup 0
      bar_sync(BAR_M0);
      float mB[2], cB[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) mB[k] = fmaxf(mA_s[ri[k]], mx[k]);
      if (owner) { mB_s[ri[0]] = mB[0]; mB_s[ri[1]] = mB[1]; }
      bar_arrive(BAR_M1);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        cB[k] = exp2f(m[k] - mB[k]);  // 0 on the first pair (m = -inf)
        l[k] *= cB[k];
        m[k] = mB[k];
      }
      rescale(acc, cB);
      std::uint32_t pa[4][4];
      if (hasB) {
        // ---- P_B to shared (for warpgroup 0) and o_R += P_B C_B[:, R] from registers
        float sum[2];
        exp_rows(sc, mB, sum);
#pragma unroll
        for (int k = 0; k < 2; ++k) l[k] += sum[k];
        pack_p(sc, pa, lo_row, p.p_hi_only);
        store_p(pB_s, pa, r0, cq);
        fence_async_smem();
        bar_arrive(BAR_P1);
        wgmma_fence();
        pc_block(acc, pa, 0, c1_addr, 1);
        wgmma_commit();
      }
      // ---- o_R += P_A' C_A[:, R], P_A' from shared
      bar_sync(BAR_P0);
      wgmma_fence();
      pc_block(acc, nullptr, pA_addr, c0_addr, 1);
      wgmma_commit();
      if (hasB) {
        wgmma_wait<1>();  // P_B C_B[:, R] done: buffer 1's R half is free (only this warpgroup reads it)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int x = 0; x < 4; ++x) fence_reg(pa[kk][x]);
        wg_barrier(1);
        if (bB + 2 < nblk) load_half(bB + 2);
        cp_async_commit();
      }
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < 128; ++e) fence_reg(acc[e]);
      // buffer 0's R half is free (warpgroup 0 scored block bA before it handed over P_A'): refill with bA + 2
      wg_barrier(1);
      if (bA + 2 < nblk) load_half(bA + 2);
      cp_async_commit();
    }
  }
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  cp_async_wait<0>();  // (every group is empty or waited for by now)

  epilogue<FAST>(p, acc, l, m, l1_s, b, split, wg, owner, ri, qi, nq, lo_row, cq);
}

}  // namespace

void launch_split(int H, bool fast, dim3 grid, cudaStream_t stream, const FastParams& p) {
  // sets the kernel's dynamic shared memory size on the first call (per kernel), then launches it
  auto launch = [&](auto kernel, bool& attr, const char* name) {
    if (!attr) {
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(SMEM)),
                 (std::string("cudaFuncSetAttribute(") + name + ")").c_str());
      attr = true;
    }
    kernel<<<grid, NTHR, SMEM, stream>>>(p);
    cuda_check(cudaGetLastError(), (std::string(name) + " launch").c_str());
  };
  static bool attr[4] = {};
  if (H == 32 && !fast)
    launch(mla_decode_split_kernel<32, false>, attr[0], "mla_decode_split_kernel<32, accurate>");
  else if (H == 16 && !fast)
    launch(mla_decode_split_kernel<16, false>, attr[1], "mla_decode_split_kernel<16, accurate>");
  else if (H == 32)
    launch(mla_decode_split_kernel<32, true>, attr[2], "mla_decode_split_kernel<32, fast>");
  else
    launch(mla_decode_split_kernel<16, true>, attr[3], "mla_decode_split_kernel<16, fast>");
}

}  // namespace kdalab::kernels::mla_decode_impl
