// The fast MLA prefill attention (kernels/mla_prefill/fast_wg.hpp) on the warpgroup MMA: causal softmax attention,
// d = 128, bf16 q, K, V and P, fp32 scores, softmax and accumulation. Design and measurements:
// docs/kernels/mla_prefill.md, "Precision fast, version 2".
//
// One CTA per (128 query rows, head, sequence), launched longest first; 384 threads:
//   warpgroups 0 and 1 (consumers) own query rows [64 w, 64 w + 64) of the CTA each: q in shared memory (two
//     128-byte-swizzled column blocks of [64 rows x 64]), O [64 x 128] fp32 in registers (the m64n128 accumulator);
//   warpgroup 2 (producer; it hands its registers to the consumers by setmaxnreg): one thread streams the CTA's key tiles of 128 keys into a ring of ST stages by TMA: K and V of a
//     stage as two column blocks of [128 keys x 64] each (128-byte swizzle, written by the copy engine), each array on
//     its own "full" mbarrier (bytes counted), a stage refilled after its "empty" mbarrier has the arrivals of all 8
//     consumer warps.
// Per consumer warpgroup and key tile kt (the FlashAttention-3 order within a warpgroup: the scores of tile kt are
// issued before the P V product of tile kt - 1, and the softmax of kt runs while P V of kt - 1 is on the tensor cores):
//   S = q K_kt^T                      8 wgmma m64n128k16, both operands K-major in shared memory
//   O += P_{kt-1} V_{kt-1}            8 wgmma m64n128k16, P from registers (bf16), V MN-major in shared memory
//   wait for S; causal mask (tiles that reach past the warpgroup's first position only); online softmax in the log2
//     domain (row max over the 4 lanes of a quad), p = 2^(s - m) in the score registers
//   wait for P V; release the stage of tile kt - 1; O *= 2^(m_old - m_new); P_kt = bf16(p) packed from the accumulator
//     registers (the m64nN accumulator layout is the A-fragment layout of the next product's k-steps), only now: a
//     register that an in-flight wgmma reads may not be written (ptxas would serialise every wgmma of the kernel).
// A warpgroup skips the tiles past its last row's position (at most the CTA's last one) but still takes part in their
// stage's release.
// The ping-pong form (template PINGPONG; FlashAttention-3's inter-warpgroup schedule) adds turns: the two warpgroups
// issue their products in alternation (two named barriers), so that one's softmax runs under the other's products;
// both then run every tile of the CTA. Keys past the sequence's end come from the next sequence or, past the tensor, as TMA zeros: the causal
// mask removes them (and P = 0 times a finite V is 0).
#include <cuda.h>
#include <cudaTypedefs.h>

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
constexpr int OFF_BAR = OFF_KV + ST * STAGE;
constexpr std::size_t SMEM = OFF_BAR + 3 * ST * 8 + 1024;  // + slack to align the base to 1024 bytes
static_assert(SMEM <= 227 * 1024, "fast attention shared memory");
// setmaxnreg: the producer warpgroup drops to 24 registers a thread and the consumers rise to 240; the exchange balances
// only when the kernel starts at 168 (65536 / 384, rounded down to a multiple of 8, which __launch_bounds__(384, 1)
// gives): 128 (168 - 24) = 256 (240 - 168). A consumer's request would otherwise wait for registers forever.
constexpr int REG_START = 65536 / NTHR / 8 * 8, REG_PRODUCER = 24, REG_CONSUMER = 240;
static_assert(REG_START == 168 && 128 * (REG_START - REG_PRODUCER) == 256 * (REG_CONSUMER - REG_START), "register exchange");

struct FParams {
  int T, H, N0, N;
  const bf16_t* q;
  long long sq_b, sq_t;
  float scale_log2;
  float* out;
};

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

/// Issues (does not commit) O += P V over the tile's 128 keys: 8 k-steps, P from registers, V MN-major (LBO = one
/// column block, SBO = 8 keys).
__device__ __forceinline__ void issue_pv(float* o, const std::uint32_t (*pa)[4], std::uint32_t v_addr) {
  const std::uint64_t dv = desc(v_addr, CBK, 1024);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) mma_n128_t(o, pa[kk], dv + ((kk * 16 * 128) >> 4));
}

/// The online softmax of one tile for this thread's two rows (h = 0: row pos[0], h = 1: pos[1]): s (the m64n128
/// accumulator: element 4j + e is row half e / 2, key key0 + 8j + 2 cq + e % 2) scaled to the log2 domain and masked
/// (key > pos: -inf) when `masked`, then replaced by p = 2^(s - m_new); m, l updated; c[h] = 2^(m_old - m_new), the
/// factor of the rows' accumulator.
__device__ __forceinline__ void softmax_tile(float* s, int key0, bool masked, const int* pos, int cq, float scale_log2,
                                             float* m, float* l, float* c) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int e = 0; e < 64; ++e) {
    const int h = (e >> 1) & 1;
    float x = s[e] * scale_log2;
    if (masked && key0 + 8 * (e / 4) + 2 * cq + (e & 1) > pos[h]) x = -INFINITY;
    s[e] = x;
    mx[h] = fmaxf(mx[h], x);
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    // finite: each warpgroup's first tile holds key 0, allowed for every row
    const float mn = fmaxf(m[h], mx[h]);
    c[h] = exp2f(m[h] - mn);  // 0 on the first tile (m = -inf)
    m[h] = mn;
  }
#pragma unroll
  for (int e = 0; e < 64; ++e) {
    const int h = (e >> 1) & 1;
    s[e] = exp2f(s[e] - m[h]);
    sum[h] += s[e];
  }
  l[0] = l[0] * c[0] + sum[0];
  l[1] = l[1] * c[1] + sum[1];
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

/// One arrival of this warp on `bar` once every lane is past its reads of the stage.
__device__ __forceinline__ void release(std::uint64_t* bar, int lane) {
  __syncwarp();
  if (lane == 0) mb::arrive(bar);
}

template <bool PINGPONG>
__global__ void __launch_bounds__(NTHR, 1)
    mla_fast_attn_wg_kernel(const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV, FParams p) {
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);  // longest CTAs first
  const int head = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x;
  const int q0 = qt * QT;
  const int kend = p.N0 + min(q0 + QT, p.T);  // keys 0 .. kend - 1
  const int ntiles = (kend + KT - 1) / KT;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t{1023});
  std::uint64_t* full_k = reinterpret_cast<std::uint64_t*>(smem + OFF_BAR);
  std::uint64_t* full_v = full_k + ST;
  std::uint64_t* empty = full_v + ST;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      mb::init(&full_k[s], 1);
      mb::init(&full_v[s], 1);
      mb::init(&empty[s], 8);  // the 8 consumer warps
    }
    mb::init_fence();
  }
  __syncthreads();

  if (tid >= 256) {  // producer warpgroup: one thread issues every copy; its registers go to the consumers
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REG_PRODUCER) : "memory");
    if (tid == 256) {
      const int row0 = b * p.N;  // the sequence's first key row in the [B N] token dimension of the maps
      for (int kt = 0; kt < ntiles; ++kt) {
        const int s = kt % ST;
        if (kt >= ST) mb::wait(&empty[s], static_cast<unsigned>(kt / ST - 1) & 1u);
        unsigned char* st = smem + OFF_KV + s * STAGE;
        const int r = row0 + kt * KT;
        mb::arrive_expect_tx(&full_k[s], ARR);
        mb::tma_load_3d(st, &tmK, 0, head, r, &full_k[s]);
        mb::tma_load_3d(st + CBK, &tmK, 64, head, r, &full_k[s]);
        mb::arrive_expect_tx(&full_v[s], ARR);
        mb::tma_load_3d(st + ARR, &tmV, 0, head, r, &full_v[s]);
        mb::tma_load_3d(st + ARR + CBK, &tmV, 64, head, r, &full_v[s]);
      }
    }
    return;
  }

  // ---- consumer warpgroup wg (384 threads x 168 registers at launch; 128 x 24 + 256 x 240 after the exchange)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REG_CONSUMER) : "memory");
  const int wg = tid / 128, wt = tid % 128, warp = wt / 32, lane = tid % 32, g = lane / 4, cq = lane % 4;
  const int first = q0 + 64 * wg;  // the warpgroup's first query row
  const bool any = first < p.T;
  const int minpos = p.N0 + first;
  // tiles up to the last row's position; PINGPONG: every tile of the CTA in both warpgroups (the turns below need equal
  // counts; a tile past all of a warpgroup's rows is masked whole: p = 0, and m stays the finite max of tile 0)
  const int nt = PINGPONG ? ntiles : any ? (p.N0 + min(first + 63, p.T - 1)) / KT + 1 : 0;
  const int ra = first + 16 * warp + g, rb = ra + 8;
  const int pos[2] = {p.N0 + min(ra, p.T - 1), p.N0 + min(rb, p.T - 1)};  // rows past T: clamped, not written
  unsigned char* qs = smem + OFF_Q + wg * (64 * DH * 2);
  {  // q rows -> two swizzled column blocks (rows past T: zeros); 4-byte loads (the token stride is even)
    const bf16_t* qb = p.q + b * p.sq_b + static_cast<long long>(head) * DH;
#pragma unroll
    for (int i = 0; i < 64 * 16 / 128; ++i) {
      const int idx = wt + 128 * i, r = idx / 16, ch = idx % 16, t = first + r;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (t < p.T) {
        const bf16_t* src = qb + t * p.sq_t + ch * 8;
        v.x = ld32(src); v.y = ld32(src + 2); v.z = ld32(src + 4); v.w = ld32(src + 6);
      }
      *reinterpret_cast<uint4*>(qs + (ch / 8) * 8192 + sw(r, ch % 8)) = v;
    }
    fence_async_smem();
  }
  wg_barrier(wg);

  const std::uint32_t q_addr = mb::smem_u32(qs), kv0 = mb::smem_u32(smem + OFF_KV);
  float o[64], s[64];
#pragma unroll
  for (int e = 0; e < 64; ++e) o[e] = s[e] = 0.0f;
  std::uint32_t pa[8][4];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, c[2];

  if (PINGPONG && wg == 1) turn_give(wg);  // warpgroup 0 issues first
  if (nt > 0) {
    mb::wait(&full_k[0], 0);
    if (PINGPONG) turn_wait(wg);
    wgmma_fence();
    issue_scores(s, q_addr, kv0);
    wgmma_commit();
    if (PINGPONG && !(wg == 1 && nt == 1)) turn_give(wg);  // warpgroup 1's last issue hands nothing over
    wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < 64; ++e) fence_reg(s[e]);
    softmax_tile(s, 0, KT - 1 > minpos, pos, cq, p.scale_log2, m, l, c);
    pack_p(s, pa);
    for (int kt = 1; kt < nt; ++kt) {
      const int st = kt % ST, sp = (kt - 1) % ST;
      mb::wait(&full_k[st], static_cast<unsigned>(kt / ST) & 1u);
      mb::wait(&full_v[sp], static_cast<unsigned>((kt - 1) / ST) & 1u);
      if (PINGPONG) turn_wait(wg);
      wgmma_fence();
      issue_scores(s, q_addr, kv0 + st * STAGE);
      wgmma_commit();
      issue_pv(o, pa, kv0 + sp * STAGE + ARR);
      wgmma_commit();
      if (PINGPONG && !(wg == 1 && kt == nt - 1)) turn_give(wg);
      wgmma_wait<1>();  // the scores (the older group) are in
#pragma unroll
      for (int e = 0; e < 64; ++e) fence_reg(s[e]);
      softmax_tile(s, kt * KT, kt * KT + KT - 1 > minpos, pos, cq, p.scale_log2, m, l, c);
      wgmma_wait<0>();  // P V of tile kt - 1 is in: its stage is free, o may be rescaled and pa rewritten
      settle_pv(o, pa);
      release(&empty[sp], lane);
#pragma unroll
      for (int e = 0; e < 64; ++e) o[e] *= c[(e >> 1) & 1];
      pack_p(s, pa);
    }
    const int sl = (nt - 1) % ST;
    mb::wait(&full_v[sl], static_cast<unsigned>((nt - 1) / ST) & 1u);
    wgmma_fence();
    issue_pv(o, pa, kv0 + sl * STAGE + ARR);
    wgmma_commit();
    wgmma_wait<0>();
    settle_pv(o, pa);
    release(&empty[sl], lane);
  }
  for (int kt = nt; kt < ntiles; ++kt) {  // past this warpgroup's rows: only the stage's release
    const int st = kt % ST;
    mb::wait(&full_v[st], static_cast<unsigned>(kt / ST) & 1u);
    release(&empty[st], lane);
  }
  if (!any) return;

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  const float ia = 1.0f / l[0], ib = 1.0f / l[1];
  float* ob = p.out + (static_cast<long long>(b) * p.T * p.H + head) * DH;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 8 * j + 2 * cq;
    if (ra < p.T)
      *reinterpret_cast<float2*>(ob + static_cast<long long>(ra) * p.H * DH + col) = make_float2(o[4 * j] * ia, o[4 * j + 1] * ia);
    if (rb < p.T)
      *reinterpret_cast<float2*>(ob + static_cast<long long>(rb) * p.H * DH + col) =
          make_float2(o[4 * j + 2] * ib, o[4 * j + 3] * ib);
  }
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

}  // namespace

void fast_attention_wgmma(const FastAttnArgs& a, bool pingpong, cudaStream_t stream) {
  const long long rows = static_cast<long long>(a.B) * (static_cast<long long>(a.N0) + a.T);
  if (rows + KT >= (1LL << 31))
    throw Error("mla_prefill_heads: B (N0 + T) = " + std::to_string(rows) +
                " key rows; accepted for precision fast: fewer than 2^31 - 128 (TMA coordinates are 32-bit)");
  const CUtensorMap tk = kv_map(a.K, a.H, rows, "K"), tv = kv_map(a.V, a.H, rows, "V");
  FParams p{};
  p.T = a.T;
  p.H = a.H;
  p.N0 = a.N0;
  p.N = a.N0 + a.T;
  p.q = a.q;
  p.sq_b = a.sq_b;
  p.sq_t = a.sq_t;
  p.scale_log2 = a.scale_log2;
  p.out = a.out;
  const dim3 grid(static_cast<unsigned>((a.T + QT - 1) / QT), static_cast<unsigned>(a.H), static_cast<unsigned>(a.B));
  const auto launch = [&](auto kernel, bool& attr) {
    if (!attr) {  // once per form (a call inside graph capture sets nothing)
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(SMEM)),
                 "cudaFuncSetAttribute(mla_fast_attn_wg_kernel)");
      attr = true;
    }
    kernel<<<grid, NTHR, SMEM, stream>>>(tk, tv, p);
  };
  static bool attr[2] = {false, false};
  if (pingpong)
    launch(mla_fast_attn_wg_kernel<true>, attr[1]);
  else
    launch(mla_fast_attn_wg_kernel<false>, attr[0]);
  cuda_check(cudaGetLastError(), "mla_fast_attn_wg_kernel launch");
}

}  // namespace kdalab::kernels::mla_prefill_detail
