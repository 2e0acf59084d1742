// The fast MLA prefill attention (kernels/mla_prefill/fast_wg.hpp) on the warpgroup MMA: causal softmax attention,
// d = 128, bf16 q, K, V and P, fp32 scores, softmax and accumulation. Design and measurements:
// docs/kernels/mla_prefill.md, "Precision fast, version 2", "version 3" and "version 4".
//
// A persistent grid of one CTA per SM; each CTA takes work items (128 query rows, head, sequence) in turn, in the
// order of item_index / item_of (below); 384 threads:
//   warpgroups 0 and 1 (consumers) own query rows [64 w, 64 w + 64) of the item each: q in shared memory (two
//     128-byte-swizzled column blocks of [64 rows x 64], copied by cp.async), O [64 x 128] fp32 in registers (the
//     m64n128 accumulator);
//   warpgroup 2 (producer; it hands its registers to the consumers by setmaxnreg): one thread streams the items' key
//     tiles of 128 keys into a ring of ST stages by TMA: K and V of a stage as two column blocks of [128 keys x 64]
//     each (128-byte swizzle, written by the copy engine), each array on its own "full" mbarrier (bytes counted) and
//     its own "empty" mbarrier: an array is refilled once all 8 consumer warps have arrived on its empty barrier, K as
//     soon as the tile's scores product is in, V after the P V product.
// Per consumer warpgroup and key tile kt (the FlashAttention-3 order within a warpgroup: the scores of tile kt are
// issued before the P V product of tile kt - 1, and the softmax of kt runs while P V of kt - 1 is on the tensor cores):
//   S = q K_kt^T                      8 wgmma m64n128k16, both operands K-major in shared memory
//   O += P_{kt-1} V_{kt-1}            8 wgmma m64n128k16, P from registers (bf16), V MN-major in shared memory
//   wait for S; release K of tile kt; causal mask (a separate code path for the tiles that reach past the warpgroup's
//     first position); online softmax in the log2 domain (row max over the 4 lanes of a quad), p = 2^(s - m) in the
//     score registers
//   wait for P V; release V of tile kt - 1; O *= 2^(m_old - m_new); P_kt = bf16(p) packed from the accumulator
//     registers (the m64nN accumulator layout is the A-fragment layout of the next product's k-steps), only now: a
//     register that an in-flight wgmma reads may not be written (ptxas would serialise every wgmma of the kernel).
// A warpgroup skips the tiles past its last row's position (at most the CTA's last one) but still takes part in their
// stage's release. The epilogue scales O by 1 / l; a warpgroup whose 64 rows all lie in the sequence writes them into
// its own 32 KB of shared memory and one thread issues four TMA stores, which run on while the warpgroup starts its
// next item (the block is reused once those stores have read it); a tail block (or an o that is not 16-byte aligned)
// is written row by row.
// The ping-pong form (template PINGPONG; FlashAttention-3's inter-warpgroup schedule) adds turns: the two warpgroups
// issue their products in alternation (two named barriers), so that one's softmax runs under the other's products;
// both then run every tile of the item. Keys past the sequence's end come from the next sequence (packed sequences: the
// zeroed rows of the slot) or, past the tensor, as TMA zeros: the causal mask removes them (and P = 0 times a finite V
// is 0).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "kernels/common/cuda_check.hpp"
#include "kernels/common/kda_math.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/mla_prefill/fast_wg.hpp"

namespace kdalab::kernels::mla_prefill_detail {

namespace {
using namespace detail;
namespace mb = detail::mbar;
using wgmma_util::desc;
using wgmma_util::fence_async_smem;
using wgmma_util::fence_reg;
using wgmma_util::mma_n128_ss;
using wgmma_util::mma_n128_t;
using wgmma_util::sw;
using wgmma_util::wgmma_commit;
using wgmma_util::wgmma_fence;
using wgmma_util::wgmma_wait;

constexpr int DH = 128;               // d_nope = d_v
constexpr int QT = 128;               // query rows per CTA (two consumer warpgroups of 64)
constexpr int KT = 128;               // keys per tile
constexpr int ST = 2;                 // ring stages
constexpr int NTHR = 384;             // two consumer warpgroups + one producer warpgroup
constexpr int ARR = KT * DH * 2;      // one array (K or V) of a stage: 32 KB, two column blocks of 16 KB
constexpr int CBK = KT * 128;         // one column block [128 keys x 64] of an array: 16 KB
constexpr int STAGE = 2 * ARR;        // K then V
constexpr int OFF_Q = 0;              // q of warpgroup w at 16 KB w: two column blocks [64 rows x 64] of 8 KB
constexpr int OFF_KV = 2 * 64 * DH * 2;
constexpr int OBOX = 64 * 128;        // one TMA store box of o: [64 rows x 32 fp32 columns], 128-byte swizzle: 8 KB
constexpr int OFF_O = OFF_KV + ST * STAGE;  // o of warpgroup w at 32 KB w: four boxes
constexpr int OFF_BAR = OFF_O + 2 * 4 * OBOX;
constexpr std::size_t SMEM = OFF_BAR + 4 * ST * 8 + 1024;  // + slack to align the base to 1024 bytes
static_assert(SMEM <= 227 * 1024, "fast attention shared memory");
// setmaxnreg: the producer warpgroup drops to 24 registers a thread and the consumers rise to 240; the exchange balances
// only when the kernel starts at 168 (65536 / 384, rounded down to a multiple of 8, which __launch_bounds__(384, 1)
// gives): 128 (168 - 24) = 256 (240 - 168). A consumer's request would otherwise wait for registers forever.
constexpr int REG_START = 65536 / NTHR / 8 * 8, REG_PRODUCER = 24, REG_CONSUMER = 240;
static_assert(REG_START == 168 && 128 * (REG_START - REG_PRODUCER) == 256 * (REG_CONSUMER - REG_START), "register exchange");

struct FParams {
  int T, H, N0, NK, B;  // T: queries of the longest sequence; NK: K and V rows a sequence
  const int* cu;        // packed sequences: cu_seqlens [B + 1], else null
  const int* n0s;       // packed: each sequence's N0, or null (every N0 = N0)
  int nqt, n_items;  // query tiles of 128 rows per sequence; work items nqt H B
  int head_major;    // item order: every query tile of one (head, sequence) together (see item_of)
  const bf16_t* q;
  long long sq_b, sq_t;
  int q16;  // q, sq_b and sq_t allow 16-byte copies (else 4-byte ones)
  float scale_log2;
  float* out;
  bf16_t* out_bf16;  // OBF16: o as bf16 (out unused)
  int o_tma;  // o 16-byte aligned: full 64-row blocks leave by TMA stores (tmO), else every row by direct stores
};

/// A work item: query tile qt (rows [128 qt, 128 qt + 128)) of head `head` of sequence b, which has T queries (q and o
/// rows from row0) and N0 cached keys.
struct Item {
  int qt, head, b, T, N0;
  long long row0;
};
/// Item i in the longest-first order: the query tiles from the last one down (a tile's key count grows with qt), every
/// (head, sequence) of one tile side by side; head_major: the query tiles of one (head, sequence) side by side
/// instead, last one first (kernels/mla_prefill.hpp MlaFastOrder). Packed sequences shorter than the longest leave
/// empty items (T <= 128 qt).
__device__ __forceinline__ Item item_of(const FParams& p, int i) {
  const int hb = p.H * p.B;
  const int r = p.head_major ? i % p.nqt : i / hb, rem = p.head_major ? i / p.nqt : i - r * hb, b = rem / p.H;
  Item it{p.nqt - 1 - r, rem % p.H, b, p.T, p.N0, static_cast<long long>(b) * p.T};
  if (p.cu) {
    it.row0 = p.cu[b];
    it.T = p.cu[b + 1] - p.cu[b];
    if (p.n0s) it.N0 = p.n0s[b];
  }
  return it;
}
/// The index of this CTA's j-th item: round j hands items [j G, j G + G) to the G CTAs, in reverse CTA order on odd
/// rounds (a snake), so a CTA that drew a longer item in one round draws a shorter one in the next.
__device__ __forceinline__ int item_index(int j) {
  const int G = static_cast<int>(gridDim.x), c = static_cast<int>(blockIdx.x);
  return j * G + ((j & 1) ? G - 1 - c : c);
}
/// Key tiles of an item: keys 0 .. N0 + min(128 qt + 128, T) - 1; none for an empty item.
__device__ __forceinline__ int tiles_of(const Item& it) {
  return it.qt * QT < it.T ? (it.N0 + min(it.qt * QT + QT, it.T) + KT - 1) / KT : 0;
}

/// 128-thread barrier of consumer warpgroup wg (named barrier 1 + wg; 0 is __syncthreads).
__device__ __forceinline__ void wg_barrier(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory"); }
/// PINGPONG turns: warpgroup wg waits for its turn to issue products on named barrier 3 + wg (its 128 threads sync, the
/// other warpgroup's 128 arrive) and hands the turn over by arriving on the other's.
__device__ __forceinline__ void turn_wait(int wg) { asm volatile("bar.sync %0, 256;\n" ::"r"(3 + wg) : "memory"); }
__device__ __forceinline__ void turn_give(int wg) { asm volatile("bar.arrive %0, 256;\n" ::"r"(3 + (1 - wg)) : "memory"); }

/// Issues (does not commit) S = q K^T over d = 128: two column blocks of 4 k-steps each.
__device__ __forceinline__ void issue_scores(float* s, std::uint32_t q_addr, std::uint32_t k_addr) {
  const std::uint64_t dq = desc(q_addr, 16, 1024), dk = desc(k_addr, 16, 1024);
#pragma unroll
  for (int cb = 0; cb < 2; ++cb)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      mma_n128_ss(s, dq + ((cb * 8192 + kk * 32) >> 4), dk + ((cb * CBK + kk * 32) >> 4), (cb | kk) ? 1 : 0);
}
/// issue_scores whose first k-step's scale-d is `scale0`, 0 at run time but a value the compiler cannot see: ptxas then
/// keeps s's registers for s between products (a constant 0 lets it reuse them while s is dead, which it must not do
/// where another path has a scores product in flight).
__device__ __forceinline__ void issue_scores(float* s, std::uint32_t q_addr, std::uint32_t k_addr, int scale0) {
  const std::uint64_t dq = desc(q_addr, 16, 1024), dk = desc(k_addr, 16, 1024);
#pragma unroll
  for (int cb = 0; cb < 2; ++cb)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      mma_n128_ss(s, dq + ((cb * 8192 + kk * 32) >> 4), dk + ((cb * CBK + kk * 32) >> 4), (cb | kk) ? 1 : scale0);
}

/// Issues (does not commit) O += P V over the tile's 128 keys: 8 k-steps, P from registers, V MN-major (LBO = one
/// column block, SBO = 8 keys).
__device__ __forceinline__ void issue_pv(float* o, const std::uint32_t (*pa)[4], std::uint32_t v_addr) {
  const std::uint64_t dv = desc(v_addr, CBK, 1024);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) mma_n128_t(o, pa[kk], dv + ((kk * 16 * 128) >> 4));
}
/// issue_pv whose first k-step has scale-d `acc` (0: O = P V, o's registers not read).
__device__ __forceinline__ void issue_pv(float* o, const std::uint32_t (*pa)[4], std::uint32_t v_addr, int acc) {
  const std::uint64_t dv = desc(v_addr, CBK, 1024);
  mma_n128_t(o, pa[0], dv, acc);
#pragma unroll
  for (int kk = 1; kk < 8; ++kk) mma_n128_t(o, pa[kk], dv + ((kk * 16 * 128) >> 4));
}

/// The online softmax of one tile for this thread's two rows (h = 0: row pos[0], h = 1: pos[1]): s (the m64n128
/// accumulator: element 4j + e is row half e / 2, key key0 + 8j + 2 cq + e % 2) masked (key > pos: -inf) when MASKED,
/// then replaced by p = 2^(s scale_log2 - m_new), one FFMA and one MUFU.EX2 an element; m (in the log2 domain), l
/// updated; c[h] = 2^(m_old - m_new), the factor of the rows' accumulator. The row maximum is taken on the raw scores
/// (scale_log2 > 0 keeps their order).
template <bool MASKED>
__device__ __forceinline__ void softmax_tile(float* s, int key0, const int* pos, int cq, float scale_log2, float* m,
                                             float* l, float* c) {
  // the row maximum and the row sum in 4 independent chains per row half (element 4j + e goes to chain j % 4), so a
  // tile's reductions are 8 + 8 dependent steps per chain instead of 32 + 32
  float mc[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int k = 0; k < 4; ++k) mc[h][k] = -INFINITY;
#pragma unroll
  for (int e = 0; e < 64; ++e) {
    const int h = (e >> 1) & 1;
    if (MASKED && key0 + 8 * (e / 4) + 2 * cq + (e & 1) > pos[h]) s[e] = -INFINITY;
    mc[h][(e >> 2) & 3] = fmaxf(mc[h][(e >> 2) & 3], s[e]);
  }
  float mx[2], sc[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(fmaxf(mc[h][0], mc[h][1]), fmaxf(mc[h][2], mc[h][3]));
#pragma unroll
    for (int k = 0; k < 4; ++k) sc[h][k] = 0.0f;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    // finite: each warpgroup's first tile holds key 0, allowed for every row (a whole masked later tile: mx = -inf,
    // m stays, c = 1)
    const float mn = fmaxf(m[h], mx[h] * scale_log2);
    c[h] = ex2_ftz(m[h] - mn);  // 0 on the first tile (m = -inf)
    m[h] = mn;
  }
#pragma unroll
  for (int e = 0; e < 64; ++e) {
    const int h = (e >> 1) & 1;
    s[e] = ex2_ftz(fmaf(s[e], scale_log2, -m[h]));  // masked: 2^-inf = 0
    sc[h][(e >> 2) & 3] += s[e];
  }
  l[0] = l[0] * c[0] + ((sc[0][0] + sc[0][1]) + (sc[0][2] + sc[0][3]));
  l[1] = l[1] * c[1] + ((sc[1][0] + sc[1][1]) + (sc[1][2] + sc[1][3]));
}

/// softmax_tile with the mask only where the tile reaches past the warpgroup's first position (minpos): two branches,
/// so that the unmasked tiles run no compare and select per element.
__device__ __forceinline__ void softmax_tile_at(float* s, int key0, int minpos, const int* pos, int cq,
                                                float scale_log2, float* m, float* l, float* c) {
  if (key0 + KT - 1 > minpos)
    softmax_tile<true>(s, key0, pos, cq, scale_log2, m, l, c);
  else
    softmax_tile<false>(s, key0, pos, cq, scale_log2, m, l, c);
}

/// P = bf16(p) as the register A fragments of 8 k-steps (keys 16 kk .. 16 kk + 15): the accumulator elements 4j + {0, 1}
/// (row r0) and 4j + {2, 3} (row r0 + 8) of j = 2 kk, 2 kk + 1 are the m16n8k16 A fragment. Written only after the P V
/// product that reads pa has completed (a register write while it is in flight would serialise the wgmmas).
__device__ __forceinline__ void pack_p(const float* s, std::uint32_t (*pa)[4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

/// After the wait for a P V product: its accumulator o and its A fragments pa are settled (the compiler may neither read
/// o nor reuse pa's registers before this point).
__device__ __forceinline__ void settle_pv(float* o, std::uint32_t (*pa)[4]) {
#pragma unroll
  for (int e = 0; e < 64; ++e) fence_reg(o[e]);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) fence_reg(pa[kk][e]);
}

/// st.shared.b32 at shared address a (4-byte aligned).
__device__ __forceinline__ void st_shared_b32(std::uint32_t a, std::uint32_t x) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(x) : "memory");
}

/// st.shared.v2.f32 at shared address a (8-byte aligned).
__device__ __forceinline__ void st_shared_v2(std::uint32_t a, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(x), "f"(y) : "memory");
}

/// One arrival of this warp on `bar` once every lane is past its reads of the stage.
__device__ __forceinline__ void release(std::uint64_t* bar, int lane) {
  __syncwarp();
  if (lane == 0) mb::arrive(bar);
}

/// Starts the copy of warpgroup wg's 64 q rows of item `it` into its two swizzled column blocks at qs (rows past T:
/// zeros) by cp.async, one commit group; the caller waits for it (cp_async_wait<0>, then the proxy fence and the
/// warpgroup's barrier) before the first product that reads qs.
__device__ __forceinline__ void load_q_async(const FParams& p, const Item& it, unsigned char* qs, int wg, int wt) {
  const bf16_t* qb = p.q + (p.cu ? it.row0 * p.sq_t : it.b * p.sq_b) + static_cast<long long>(it.head) * DH;
  const int first = it.qt * QT + 64 * wg;
#pragma unroll
  for (int i = 0; i < 64 * 16 / 128; ++i) {
    const int idx = wt + 128 * i, r = idx / 16, ch = idx % 16, t = first + r;
    const bool in = t < it.T;
    const bf16_t* src = in ? qb + t * p.sq_t + ch * 8 : p.q;  // src size 0 reads nothing
    unsigned char* dst = qs + (ch / 8) * 8192 + sw(r, ch % 8);
    if (p.q16)
      cp_async16_zfill(dst, src, in ? 16 : 0);
    else
#pragma unroll
      for (int w = 0; w < 4; ++w) cp_async4_zfill(dst + 4 * w, in ? src + 2 * w : src, in ? 4 : 0);
  }
  cp_async_commit();
}

/// Persistent: gridDim.x CTAs (at most one an SM) take the items in item_index order. The ring's use counter runs on
/// across a CTA's items in the producer and in both consumer warpgroups alike, so the producer fetches the next item's
/// first key tiles while the consumers finish the current one; each consumer warpgroup fetches its next q rows by
/// cp.async as soon as its last scores product of the current item is in.
template <bool PINGPONG, bool OBF16>
__global__ void __launch_bounds__(NTHR, 1)
    mla_fast_attn_wg_kernel(const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,
                            const __grid_constant__ CUtensorMap tmO, FParams p) {
  const int tid = threadIdx.x;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t{1023});
  std::uint64_t* full_k = reinterpret_cast<std::uint64_t*>(smem + OFF_BAR);
  std::uint64_t* full_v = full_k + ST;
  std::uint64_t* empty_k = full_v + ST;  // K of a stage read (its scores products are in)
  std::uint64_t* empty_v = empty_k + ST;  // V of a stage read (its P V products are in)
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      mb::init(&full_k[s], 1);
      mb::init(&full_v[s], 1);
      mb::init(&empty_k[s], 8);  // the 8 consumer warps
      mb::init(&empty_v[s], 8);
    }
    mb::init_fence();
  }
  __syncthreads();

  if (tid >= 256) {  // producer warpgroup: one thread issues every copy; its registers go to the consumers
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REG_PRODUCER) : "memory");
    if (tid == 256) {
      int u = 0;  // ring uses so far
      for (int j = 0;; ++j) {
        const int i = item_index(j);
        if (i >= p.n_items) break;
        const Item it = item_of(p, i);
        const int ntiles = tiles_of(it);
        const int row0 = it.b * p.NK;  // the sequence's first key row in the [B NK] token dimension of the maps
        for (int kt = 0; kt < ntiles; ++kt, ++u) {
          const int s = u % ST;
          unsigned char* st = smem + OFF_KV + s * STAGE;
          const int r = row0 + kt * KT;
          if (u >= ST) mb::wait(&empty_k[s], static_cast<unsigned>(u / ST - 1) & 1u);
          mb::arrive_expect_tx(&full_k[s], ARR);
          mb::tma_load_3d(st, &tmK, 0, it.head, r, &full_k[s]);
          mb::tma_load_3d(st + CBK, &tmK, 64, it.head, r, &full_k[s]);
          if (u >= ST) mb::wait(&empty_v[s], static_cast<unsigned>(u / ST - 1) & 1u);
          mb::arrive_expect_tx(&full_v[s], ARR);
          mb::tma_load_3d(st + ARR, &tmV, 0, it.head, r, &full_v[s]);
          mb::tma_load_3d(st + ARR + CBK, &tmV, 64, it.head, r, &full_v[s]);
        }
      }
    }
    return;
  }

  // ---- consumer warpgroup wg (384 threads x 168 registers at launch; 128 x 24 + 256 x 240 after the exchange)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REG_CONSUMER) : "memory");
  // the warpgroup index through a shuffle from lane 0: the compiler then knows it is warp-uniform and keeps what
  // derives from it (q_addr, the tile counts, the wgmma descriptors) in uniform registers
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), wt = tid % 128, warp = wt / 32, lane = tid % 32, g = lane / 4,
            cq = lane % 4;
  unsigned char* qs = smem + OFF_Q + wg * (64 * DH * 2);
  const std::uint32_t q_addr = mb::smem_u32(qs), kv0 = mb::smem_u32(smem + OFF_KV);
  const auto stage = [](int u) { return u % ST; };
  const auto parity = [](int u) { return static_cast<unsigned>(u / ST) & 1u; };

  // the tiles of item it that warpgroup wg reads: up to its last row's position; PINGPONG: every tile of the item in
  // both warpgroups (the turns below need equal counts; a tile past all of a warpgroup's rows is masked whole: p = 0,
  // and m stays the finite max of tile 0)
  const auto wg_tiles = [&](const Item& it, int ntiles) {
    const int first = it.qt * QT + 64 * wg;
    return PINGPONG ? ntiles : first < it.T ? (it.N0 + min(first + 63, it.T - 1)) / KT + 1 : 0;
  };
  // the epilogue of item it: o divided by l, stored (the warpgroup's rows; o is read, not written)
  const auto epilogue = [&](const Item& it, int first, int ra, int rb, const float* o, float* l) {

#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    const float ia = 1.0f / l[0], ib = 1.0f / l[1];
    const auto on = [&](int e) { return o[e] * ((e >> 1) & 1 ? ib : ia); };  // o[e] / its row's l
    if (p.o_tma && first + 64 <= it.T) {
      // all 64 rows in the sequence: through the warpgroup's block of shared memory and four TMA stores, which run
      // on while the warpgroup starts its next item (box x: columns [32 x, 32 x + 32); 16-byte chunk k of row r at
      // k ^ r % 8)
      unsigned char* os = smem + OFF_O + wg * 4 * OBOX;
      if (wt == 0) mb::bulk_wait_read();  // the previous item's stores have read the block
      wg_barrier(wg);
      const int r0 = 16 * warp + g;  // row ra - first (and r0 + 8, the same swizzle)
      if constexpr (OBF16) {
        // bf16 o: two boxes of [64 rows x 64 columns]; columns 8 jj + 2 cq + {0, 1}: box jj / 8, chunk jj % 8, byte
        // 4 cq of the chunk
        const std::uint32_t base = mb::smem_u32(os) + r0 * 128 + 4 * cq, x = r0 & 7;
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) {
          const std::uint32_t a = base + (jj / 8) * OBOX + (((jj % 8) ^ x) << 4);
          st_shared_b32(a, pack_bf16(on(4 * jj), on(4 * jj + 1)));
          st_shared_b32(a + 8 * 128, pack_bf16(on(4 * jj + 2), on(4 * jj + 3)));
        }
      } else {
        // fp32 o: four boxes of [64 rows x 32 columns]; columns 8 jj + 2 cq + {0, 1}: box jj / 4, chunk
        // 2 (jj % 4) + cq / 2 (= 2 (jj % 4) ^ cq / 2), byte 8 (cq % 2) of the chunk
        const std::uint32_t base = mb::smem_u32(os) + r0 * 128 + 8 * (cq & 1), y = ((cq >> 1) ^ (r0 & 7)) << 4;
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) {
          const std::uint32_t a = base + (jj / 4) * OBOX + ((32u * (jj % 4)) ^ y);
          st_shared_v2(a, on(4 * jj), on(4 * jj + 1));
          st_shared_v2(a + 8 * 128, on(4 * jj + 2), on(4 * jj + 3));
        }
      }
      fence_async_smem();
      wg_barrier(wg);
      if (wt == 0) {
        const int row = static_cast<int>(it.row0) + first;
        constexpr int NBOX = OBF16 ? 2 : 4, BOXW = OBF16 ? 64 : 32;
#pragma unroll
        for (int x = 0; x < NBOX; ++x) mb::tma_store_3d(&tmO, os + x * OBOX, BOXW * x, it.head, row);
        mb::bulk_commit();
      }
    } else {  // a tail block: rows past the sequence's end are not written
      const long long rs = static_cast<long long>(p.H) * DH, o0 = (it.row0 * p.H + it.head) * DH;
#pragma unroll
      for (int jj = 0; jj < 16; ++jj) {
        const int col = 8 * jj + 2 * cq;
        if constexpr (OBF16) {
          if (ra < it.T) *reinterpret_cast<std::uint32_t*>(p.out_bf16 + o0 + ra * rs + col) = pack_bf16(on(4 * jj), on(4 * jj + 1));
          if (rb < it.T)
            *reinterpret_cast<std::uint32_t*>(p.out_bf16 + o0 + rb * rs + col) = pack_bf16(on(4 * jj + 2), on(4 * jj + 3));
        } else {
          if (ra < it.T) *reinterpret_cast<float2*>(p.out + o0 + ra * rs + col) = make_float2(on(4 * jj), on(4 * jj + 1));
          if (rb < it.T) *reinterpret_cast<float2*>(p.out + o0 + rb * rs + col) = make_float2(on(4 * jj + 2), on(4 * jj + 3));
        }
      }
    }
    };
  if constexpr (PINGPONG) {
    int i = item_index(0);
    if (i < p.n_items) load_q_async(p, item_of(p, i), qs, wg, wt);
    int u0 = 0;  // ring uses before this item
    for (int j = 0; i < p.n_items; ++j) {
      const Item it = item_of(p, i);
      const int inext = item_index(j + 1);
      const int ntiles = tiles_of(it);
      const int first = it.qt * QT + 64 * wg;  // the warpgroup's first query row
      const bool any = first < it.T;
      const int minpos = it.N0 + first;
      // tiles up to the last row's position; PINGPONG: every tile of the item in both warpgroups (the turns below need
      // equal counts; a tile past all of a warpgroup's rows is masked whole: p = 0, and m stays the finite max of tile 0)
      const int nt = PINGPONG ? ntiles : any ? (it.N0 + min(first + 63, it.T - 1)) / KT + 1 : 0;
      const int ra = first + 16 * warp + g, rb = ra + 8;
      const int pos[2] = {it.N0 + min(ra, it.T - 1), it.N0 + min(rb, it.T - 1)};  // rows past T: clamped, not written
      // this item's q rows are in (and every thread of the warpgroup is past the previous item)
      cp_async_wait<0>();
      fence_async_smem();
      wg_barrier(wg);
      // the next item's q rows, once this item's last scores product has read qs
      const auto prefetch_q = [&]() {
        if (inext >= p.n_items) return;
        wg_barrier(wg);  // every warp's share of the product is in
        load_q_async(p, item_of(p, inext), qs, wg, wt);
      };
      if (nt == 0) prefetch_q();

      float o[64], s[64];
  #pragma unroll
      for (int e = 0; e < 64; ++e) o[e] = s[e] = 0.0f;
      std::uint32_t pa[8][4];
      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, c[2];

      if (PINGPONG && wg == 1 && nt > 0) turn_give(wg);  // warpgroup 0 issues first (an empty item: no turns)
      if (nt > 0) {
        mb::wait(&full_k[stage(u0)], parity(u0));
        if (PINGPONG) turn_wait(wg);
        wgmma_fence();
        issue_scores(s, q_addr, kv0 + stage(u0) * STAGE);
        wgmma_commit();
        if (PINGPONG && !(wg == 1 && nt == 1)) turn_give(wg);  // warpgroup 1's last issue hands nothing over
        wgmma_wait<0>();
  #pragma unroll
        for (int e = 0; e < 64; ++e) fence_reg(s[e]);
        release(&empty_k[stage(u0)], lane);
        if (nt == 1) prefetch_q();
        softmax_tile_at(s, 0, minpos, pos, cq, p.scale_log2, m, l, c);
        pack_p(s, pa);
        for (int kt = 1; kt < nt; ++kt) {
          const int un = u0 + kt, up = un - 1;
          mb::wait(&full_k[stage(un)], parity(un));
          mb::wait(&full_v[stage(up)], parity(up));
          if (PINGPONG) turn_wait(wg);
          wgmma_fence();
          issue_scores(s, q_addr, kv0 + stage(un) * STAGE);
          wgmma_commit();
          issue_pv(o, pa, kv0 + stage(up) * STAGE + ARR);
          wgmma_commit();
          if (PINGPONG && !(wg == 1 && kt == nt - 1)) turn_give(wg);
          wgmma_wait<1>();  // the scores (the older group) are in: K of tile kt is free
  #pragma unroll
          for (int e = 0; e < 64; ++e) fence_reg(s[e]);
          release(&empty_k[stage(un)], lane);
          if (kt == nt - 1) prefetch_q();
          softmax_tile_at(s, kt * KT, minpos, pos, cq, p.scale_log2, m, l, c);
          wgmma_wait<0>();  // P V of tile kt - 1 is in: its stage is free, o may be rescaled and pa rewritten
          settle_pv(o, pa);
          release(&empty_v[stage(up)], lane);
  #pragma unroll
          for (int e = 0; e < 64; ++e) o[e] *= c[(e >> 1) & 1];
          pack_p(s, pa);
        }
        const int ul = u0 + nt - 1;
        mb::wait(&full_v[stage(ul)], parity(ul));
        wgmma_fence();
        issue_pv(o, pa, kv0 + stage(ul) * STAGE + ARR);
        wgmma_commit();
        wgmma_wait<0>();
        settle_pv(o, pa);
        release(&empty_v[stage(ul)], lane);
      }
      for (int kt = nt; kt < ntiles; ++kt) {  // past this warpgroup's rows: only the stage's release
        // both arrays' phases are waited on: a parity wait is only sound on a barrier whose earlier phases this thread
        // has seen complete (a skipped K phase still pending would pass this warpgroup's next wait on that stage)
        const int uk = u0 + kt;
        mb::wait(&full_k[stage(uk)], parity(uk));
        mb::wait(&full_v[stage(uk)], parity(uk));
        release(&empty_k[stage(uk)], lane);
        release(&empty_v[stage(uk)], lane);
      }
      u0 += ntiles;
      i = inext;
      if (any) epilogue(it, first, ra, rb, o, l);
    }
  } else {
    // Each item's first scores product is issued before the item starts: after the previous item's last P V, so
    // that it runs under that product and the previous item's epilogue (before the loop for the first item). ptxas
    // keeps the wgmma products in flight only where every path into a point has the same products in flight, so the
    // early product is issued on every path: a dummy one (its s is not read) where the next item has no tile for this
    // warpgroup or there is none, and a dummy P V in the place of the last one where this item has no tile for it.
    // The dummies read shared memory that other copies may be writing; only the ignored registers see it.
    const int scale0 = p.n_items < 0 ? 1 : 0;  // 0: see issue_scores
    // s is not initialised: each item's first scores product writes it (scale-d 0 at run time); zeroing it here put
    // copies of s after the first product, where ptxas then waits for it
    float s[64], o[64];
#pragma unroll
    for (int e = 0; e < 64; ++e) o[e] = 0.0f;
    std::uint32_t pa[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[kk][e] = 0u;
    int i = item_index(0);
    if (i < p.n_items) load_q_async(p, item_of(p, i), qs, wg, wt);
    int u0 = 0;  // ring uses before this item
    // item ii's first scores product, its K at ring use u (a dummy where item ii has no tile for this warpgroup or
    // does not exist), committed as one group
    const auto issue_first = [&](int ii, int u) {
      bool real = false;
      if (ii < p.n_items) {
        const Item nx = item_of(p, ii);
        real = wg_tiles(nx, tiles_of(nx)) > 0;
      }
      // one issue sequence for both kinds: the flag opaque to the compiler, which would otherwise copy the products
      // into each branch before the loop (and ptxas then waits for them where the copies meet)
      int rf = real ? 1 : 0;
      asm volatile("" : "+r"(rf));
      real = rf != 0;
      if (real) {
        cp_async_wait<0>();  // the item's q rows (prefetch_q), and every thread of the warpgroup past the last item
        fence_async_smem();
        wg_barrier(wg);
        mb::wait(&full_k[stage(u)], parity(u));
      }
      wgmma_fence();
      issue_scores(s, q_addr, kv0 + (real ? stage(u) : 0) * STAGE, scale0);
      wgmma_commit();
    };
    issue_first(i, 0);
    for (int j = 0; i < p.n_items; ++j) {
      const Item it = item_of(p, i);
      const int inext = item_index(j + 1);
      const int ntiles = tiles_of(it);
      const int first = it.qt * QT + 64 * wg;  // the warpgroup's first query row
      const bool any = first < it.T;
      const int minpos = it.N0 + first;
      const int nt = wg_tiles(it, ntiles);
      const int ra = first + 16 * warp + g, rb = ra + 8;
      const int pos[2] = {it.N0 + min(ra, it.T - 1), it.N0 + min(rb, it.T - 1)};  // rows past T: clamped, not written
      // the next item's q rows, once this item's last scores product has read qs
      const auto prefetch_q = [&]() {
        if (inext >= p.n_items) return;
        wg_barrier(wg);  // every warp's share of the product is in
        load_q_async(p, item_of(p, inext), qs, wg, wt);
      };
      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, c[2];
      wgmma_wait<0>();  // this item's first scores product (a dummy where nt = 0)
#pragma unroll
      for (int e = 0; e < 64; ++e) fence_reg(s[e]);
      if (nt > 0) {
        release(&empty_k[stage(u0)], lane);
        if (nt == 1) prefetch_q();
        softmax_tile_at(s, 0, minpos, pos, cq, p.scale_log2, m, l, c);
        pack_p(s, pa);
        for (int kt = 1; kt < nt; ++kt) {
          const int un = u0 + kt, up = un - 1;
          mb::wait(&full_k[stage(un)], parity(un));
          mb::wait(&full_v[stage(up)], parity(up));
          wgmma_fence();
          issue_scores(s, q_addr, kv0 + stage(un) * STAGE, scale0);
          wgmma_commit();
          issue_pv(o, pa, kv0 + stage(up) * STAGE + ARR, kt == 1 ? 0 : 1);  // the item's first: o = P V
          wgmma_commit();
          wgmma_wait<1>();  // the scores (the older group) are in: K of tile kt is free
#pragma unroll
          for (int e = 0; e < 64; ++e) fence_reg(s[e]);
          release(&empty_k[stage(un)], lane);
          if (kt == nt - 1) prefetch_q();
          softmax_tile_at(s, kt * KT, minpos, pos, cq, p.scale_log2, m, l, c);
          wgmma_wait<0>();  // P V of tile kt - 1 is in: its stage is free, o may be rescaled and pa rewritten
          settle_pv(o, pa);
          release(&empty_v[stage(up)], lane);
#pragma unroll
          for (int e = 0; e < 64; ++e) o[e] *= c[(e >> 1) & 1];
          pack_p(s, pa);
        }
        const int ul = u0 + nt - 1;
        mb::wait(&full_v[stage(ul)], parity(ul));
        wgmma_fence();
        issue_pv(o, pa, kv0 + stage(ul) * STAGE + ARR, nt == 1 ? 0 : 1);
        wgmma_commit();
      } else {
        cp_async_wait<0>();  // this item's q rows are in before the next item's are copied over them
        fence_async_smem();
        wg_barrier(wg);
        prefetch_q();
        wgmma_fence();
        issue_pv(o, pa, kv0 + ARR, 0);  // the dummy in the last P V's place
        wgmma_commit();
      }
      // tiles past this warpgroup's rows: only the stages' releases. Before the early product's K wait: with rows the
      // warpgroup's last tile is at most one before the item's, whose stage is not the one the pending P V reads
      // (both arrays' phases are waited on: a parity wait is only sound on a barrier whose earlier phases this thread
      // has seen complete)
      for (int kt = nt; kt < ntiles; ++kt) {
        const int uk = u0 + kt;
        mb::wait(&full_k[stage(uk)], parity(uk));
        mb::wait(&full_v[stage(uk)], parity(uk));
        release(&empty_k[stage(uk)], lane);
        release(&empty_v[stage(uk)], lane);
      }
      // the next item's first K is use u0 + ntiles: its stage last held use u0 + ntiles - 2, whose K both warpgroups
      // released after that use's scores product
      issue_first(inext, u0 + ntiles);
      wgmma_wait<1>();  // this item's last P V (the older group) is in; the next item's scores run on
      settle_pv(o, pa);
      if (nt > 0) release(&empty_v[stage(u0 + nt - 1)], lane);
      u0 += ntiles;
      i = inext;
      if (any) epilogue(it, first, ra, rb, o, l);
    }
    wgmma_wait<0>();  // the last (dummy) scores product
  }
  if (wt == 0) mb::bulk_wait_read();  // the block stays until the last stores have read it
}

/// cuTensorMapEncodeTiled from the driver, looked up once through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static cudaError_t err = cudaSuccess;
  static cudaDriverEntryPointQueryResult res = cudaDriverEntryPointSuccess;
  std::call_once(once, [] {
    void* f = nullptr;
    err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &res);
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  });
  cuda_check(err, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
  if (res != cudaDriverEntryPointSuccess || !fn)
    throw Error("mla_prefill_heads: the driver has no cuTensorMapEncodeTiled (query result " + std::to_string(static_cast<int>(res)) +
                "); the fast attention needs a CUDA 12+ driver");
  return fn;
}

/// The TMA map of K or V [rows = B N, H, 128] bf16: boxes of [128 rows x 1 head x 64 columns], 128-byte swizzle.
CUtensorMap kv_map(const bf16_t* base, int H, long long rows, const char* name) {
  CUtensorMap m;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(DH), static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(DH) * 2, static_cast<cuuint64_t>(H) * DH * 2};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(KT)};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16_t*>(base), dims, strides, box, estr,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(std::string("mla_prefill_heads: cuTensorMapEncodeTiled failed for ") + name + " (CUresult " +
                std::to_string(static_cast<int>(r)) + ", rows " + std::to_string(rows) + ", H " + std::to_string(H) + ")");
  return m;
}

/// The TMA map of o [rows, H, 128], fp32 (`bf16` false) or bf16: boxes of [64 rows x 1 head x 128 bytes of columns]
/// (32 fp32 or 64 bf16), 128-byte swizzle.
CUtensorMap o_map(void* base, bool bf16, int H, long long rows) {
  CUtensorMap m;
  const cuuint64_t es = bf16 ? 2 : 4;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(DH), static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(DH) * es, static_cast<cuuint64_t>(H) * DH * es};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(128 / es), 1, 64};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = encode_fn()(&m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, base,
                                 dims, strides, box, estr,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("mla_prefill_heads: cuTensorMapEncodeTiled failed for o (CUresult " + std::to_string(static_cast<int>(r)) +
                ", rows " + std::to_string(rows) + ", H " + std::to_string(H) + ")");
  return m;
}

}  // namespace

void fast_attention_wgmma(const FastAttnArgs& a, bool pingpong, cudaStream_t stream) {
  const long long rows = static_cast<long long>(a.B) * a.NK;
  if (rows + KT >= (1LL << 31))
    throw Error("mla_prefill_heads: K and V rows (sequences x N0 + T) = " + std::to_string(rows) +
                " key rows; accepted for precision fast: fewer than 2^31 - 128 (TMA coordinates are 32-bit)");
  const CUtensorMap tk = kv_map(a.K, a.H, rows, "K"), tv = kv_map(a.V, a.H, rows, "V");
  const long long nqt = (static_cast<long long>(a.T) + QT - 1) / QT, n_items = nqt * a.H * a.B;
  if (n_items >= (1LL << 30))  // item indices stay below 2^31 with a round of slack
    throw Error("mla_prefill_heads: ceil(T / 128) H B = " + std::to_string(n_items) +
                " work items; accepted for precision fast: fewer than 2^30");
  FParams p{};
  p.T = a.T;
  p.H = a.H;
  p.N0 = a.N0;
  p.NK = a.NK;
  p.B = a.B;
  p.cu = a.cu;
  p.n0s = a.n0s;
  p.nqt = static_cast<int>(nqt);
  p.head_major = a.head_major ? 1 : 0;
  p.n_items = static_cast<int>(n_items);
  p.q = a.q;
  p.sq_b = a.sq_b;
  p.sq_t = a.sq_t;
  p.q16 = reinterpret_cast<std::uintptr_t>(a.q) % 16 == 0 && a.sq_t % 8 == 0 && a.sq_b % 8 == 0;
  p.scale_log2 = a.scale_log2;
  p.out = a.out;
  p.out_bf16 = a.out_bf16;
  const bool obf16 = a.out_bf16 != nullptr;
  void* const o_base = obf16 ? static_cast<void*>(a.out_bf16) : static_cast<void*>(a.out);
  // rows < 2^31 (the K and V rows bound them), so the stores' row coordinate fits
  p.o_tma = reinterpret_cast<std::uintptr_t>(o_base) % 16 == 0 && a.out_rows > 0 ? 1 : 0;
  CUtensorMap to{};
  if (p.o_tma) to = o_map(o_base, obf16, a.H, a.out_rows);
  int ctas = a.ctas;
  if (ctas <= 0) {  // one CTA an SM
    int dev = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SM count)");
  }
  const dim3 grid(static_cast<unsigned>(std::min<long long>(ctas, n_items)));
  const auto launch = [&](auto kernel, bool& attr) {
    if (!attr) {  // once per form (a call inside graph capture sets nothing)
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(SMEM)),
                 "cudaFuncSetAttribute(mla_fast_attn_wg_kernel)");
      attr = true;
    }
    kernel<<<grid, NTHR, SMEM, stream>>>(tk, tv, to, p);
  };
  static bool attr[4] = {false, false, false, false};
  if (pingpong && obf16)
    launch(mla_fast_attn_wg_kernel<true, true>, attr[3]);
  else if (pingpong)
    launch(mla_fast_attn_wg_kernel<true, false>, attr[1]);
  else if (obf16)
    launch(mla_fast_attn_wg_kernel<false, true>, attr[2]);
  else
    launch(mla_fast_attn_wg_kernel<false, false>, attr[0]);
  cuda_check(cudaGetLastError(), "mla_fast_attn_wg_kernel launch");
}

}  // namespace kdalab::kernels::mla_prefill_detail
