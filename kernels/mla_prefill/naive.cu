// Gated-MLA causal prefill with per-head output o [B, T, H, d_v] (kernels/mla_prefill.hpp,
// mla_prefill_heads): the naive-reconstruction path, the absorbed path followed by W_UV, and the rule.
//
// Naive path, on the caller's stream:
//   append    c_new -> cache rows N0 .. N0 + T - 1 (16 bytes per thread);
//   K, V      two cuBLAS strided-batched GEMMs (bf16 C and W, fp32 accumulation, fp32 output):
//             K[b, tau, i, :] = W_UK,i c_tau, V[b, tau, i, :] = W_UV,i c_tau for tau = 0 .. N0 + T - 1;
//   split     each fp32 row of 128 (512 bytes) rewritten in place as [bf16 hi (128) | bf16 lo (128)], one warp
//             per row (every lane's loads complete before any lane's stores: __syncwarp between);
//   attention one CTA (8 warps) per (128 queries, head, sequence), launched longest first; warp w owns query
//             rows 16 w .. 16 w + 15, q^C fragments in registers. Keys stream in 32-key tiles (K hi, K lo,
//             V hi, V lo; rows padded to 136 bf16: conflict-free 32-bit fragment loads and ldmatrix) through a
//             3-stage cp.async ring; keys past the CTA's last position are zero-filled (never NaN garbage).
//             Per tile and warp: S = q K_hi^T + q K_lo^T (mma.sync m16n8k16, fp32); causal mask per row
//             (key tau allowed iff tau <= N0 + t); fp32 online softmax in the log2 domain in registers
//             (row max/sum over the 4 lanes of a quad); P from the S accumulators as bf16 hi + lo A fragments;
//             O = corr O + P_hi V_hi + P_hi V_lo + P_lo V_hi (V fragments by ldmatrix.trans). A warp skips
//             the tiles that start past its last row's position (they only take part in the barrier).
//   fast      (MlaPrefillPrecision::fast) the GEMMs write K and V as bf16 (no split); the attention is the warpgroup-MMA
//             kernel of kernels/mla_prefill/fast_wg.cu, or with MlaPrefillOverrides::fast_form = mma_sync this file's kernel in
//             its fast form: the ring holds K and V alone (52 KB); S = q K^T and O += bf16(P) V, one mma pass each;
//             everything else as above.
// Packed sequences (cu_seqlens): the same launches over num_seqs sequences, each with a slot of NK = prefix + max_seqlen
// K and V rows (the GEMMs rebuild all NK; a zeroing launch clears the rows past each sequence's own N0 + T); the
// attention reads each sequence's T, N0 and first packed row from the device arrays, and a query tile past a
// sequence's end does nothing.
// Absorbed path: mla_absorb_query -> mla_prefill (a, fp32) -> W_UV converted to fp32 -> cuBLAS SGEMM batched
// over heads: o_i = W_UV,i a_i (fp32, no tensor-core rounding).
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>

#include "kernels/common/cuda_check.hpp"
#include "kernels/common/kda_math.cuh"
#include "kernels/mla_prefill.hpp"
#include "kernels/mla_prefill/fast_wg.hpp"

namespace kdalab::kernels {

namespace {
using namespace detail;

constexpr int DC = 512;              // d_c
constexpr int DH = 128;              // d_nope = d_v
constexpr int QT = 128;              // queries per CTA
constexpr int KT = 32;               // keys per tile
constexpr int STAGES = 3;            // cp.async ring depth
constexpr int NWARP = 8, NTHR = 256;
constexpr int ROW = DH + 8;          // shared row stride (bf16): 272 bytes
constexpr int ARR = KT * ROW;        // one array (K hi, K lo, V hi or V lo) of one stage, in bf16
static_assert(QT == 16 * NWARP, "one m16 tile of query rows per warp");
static_assert(KT % 16 == 0 && (2 * KT * 32) % NTHR == 0 && (2 * KT * 16) % NTHR == 0, "tile layout");

/// The attention kernel's three forms: accurate (K, V and P as bf16 hi + lo: 2 score passes, 3 P V passes),
/// accurate without P_lo V_hi (MlaPrefillOverrides::p_hi_only, an ablation), and fast (K, V and P bf16: one pass each).
enum AttnForm : int { kAccurate = 0, kAccuratePHi = 1, kFast = 2 };
/// Arrays per ring stage: K hi, K lo, V hi, V lo (accurate) or K, V (fast).
constexpr int arrays_of(int form) { return form == kFast ? 2 : 4; }
constexpr std::size_t smem_of(int form) { return std::size_t(STAGES) * arrays_of(form) * ARR * 2; }  // 104,448 / 52,224 B

struct NParams {
  int T, H, N0, NK;           // NK: K and V rows per sequence (N0 + T; packed: prefix + max_seqlen)
  const int* cu;              // packed sequences: cu_seqlens [B + 1] (T then the longest's bound), else null
  const int* n0s;             // packed: N0 of each sequence, or null (every N0 = N0)
  const bf16_t* q;            // q^C [B, T, H, 128] (packed: [T, H, 128])
  long long sq_b, sq_t;
  const bf16_t* kv;           // K rows then V rows; row (b, tau, i) = [hi 128 | lo 128] bf16 (fast: 128 bf16)
  long long v_off;            // bf16 elements from the K rows to the V rows (= B NK H 256; fast B NK H 128)
  float scale_log2;           // scale * log2(e)
  float* out;                 // o [B, T, H, 128] fp32
};


template <int FORM>
__global__ void __launch_bounds__(NTHR, 1) mla_naive_attn_kernel(NParams p) {
  constexpr bool FAST = FORM == kFast, PLO = FORM == kAccurate;
  constexpr int NARR = arrays_of(FORM);
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);  // longest CTAs first
  const int head = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, cq = lane % 4;
  const int q0 = qt * QT;
  const int Tb = p.cu ? p.cu[b + 1] - p.cu[b] : p.T, N0 = p.n0s ? p.n0s[b] : p.N0;  // this sequence's T and N0
  if (q0 >= Tb) return;  // packed: a query tile past this sequence's end
  const long long qrow0 = p.cu ? p.cu[b] : static_cast<long long>(b) * p.T;  // its first row of q and o
  const int kend = N0 + min(q0 + QT, Tb);     // keys 0 .. kend - 1
  const int ntiles = (kend + KT - 1) / KT;
  const int r0 = q0 + 16 * warp;              // the warp's first query row
  // the warp's last position (-1: no valid row, the warp computes nothing)
  const int wmax = r0 < Tb ? N0 + min(r0 + 15, Tb - 1) : -1;
  const int ra = r0 + g, rb = ra + 8;
  const int posa = N0 + min(ra, Tb - 1), posb = N0 + min(rb, Tb - 1);  // rows past T: clamped, not written

  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* ring = reinterpret_cast<bf16_t*>(smem);

  const long long seq_row0 = static_cast<long long>(b) * p.NK;  // first key row of this sequence
  auto load_tile = [&](int tile, int stage) {
    bf16_t* st = ring + stage * NARR * ARR;
    if constexpr (FAST) {
#pragma unroll
      for (int j = 0; j < 2 * KT * 16 / NTHR; ++j) {  // K and V: KT rows of 16 16-byte chunks each
        const int idx = tid + j * NTHR;
        const int which = idx / (KT * 16), rem = idx % (KT * 16), r = rem / 16, ch = rem % 16;  // which: 0 K, 1 V
        const int tok = tile * KT + r;
        bf16_t* dst = st + which * ARR + r * ROW + ch * 8;
        if (tok < kend)
          cp_async16(dst, p.kv + which * p.v_off + ((seq_row0 + tok) * p.H + head) * DH + ch * 8);
        else
          cp_async16_zfill(dst, p.kv, 0);  // past the last key: zeros (masked, and never 0 x NaN)
      }
    } else {
#pragma unroll
      for (int j = 0; j < 2 * KT * 32 / NTHR; ++j) {  // K and V: KT rows of 32 16-byte chunks (hi 16, lo 16) each
        const int idx = tid + j * NTHR;
        const int which = idx / (KT * 32), rem = idx % (KT * 32), r = rem / 32, ch = rem % 32;  // which: 0 K, 1 V
        const int tok = tile * KT + r;
        bf16_t* dst = st + (2 * which + ch / 16) * ARR + r * ROW + (ch % 16) * 8;
        if (tok < kend)
          cp_async16(dst, p.kv + which * p.v_off + ((seq_row0 + tok) * p.H + head) * 256 + ch * 8);
        else
          cp_async16_zfill(dst, p.kv, 0);  // past the last key: zeros (masked, and never 0 x NaN)
      }
    }
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntiles) load_tile(s, s);
    cp_async_commit();
  }

  // q^C A fragments (16 rows x 128, row-major): k-step ks holds columns 16 ks .. 16 ks + 15
  std::uint32_t qa[DH / 16][4];
  {
    const bf16_t* qb = p.q + (p.cu ? qrow0 * p.sq_t : b * p.sq_b) + static_cast<long long>(head) * DH;
    const bf16_t* pa = ra < Tb ? qb + ra * p.sq_t : nullptr;
    const bf16_t* pb = rb < Tb ? qb + rb * p.sq_t : nullptr;
#pragma unroll
    for (int ks = 0; ks < DH / 16; ++ks) {
      const int k0 = 16 * ks + 2 * cq;
      qa[ks][0] = pa ? ld32(pa + k0) : 0u;
      qa[ks][1] = pb ? ld32(pb + k0) : 0u;
      qa[ks][2] = pa ? ld32(pa + k0 + 8) : 0u;
      qa[ks][3] = pb ? ld32(pb + k0 + 8) : 0u;
    }
  }

  float acc[DH / 8][4];
#pragma unroll
  for (int nt = 0; nt < DH / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;  // l: this thread's partial sums

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile it landed for everyone; everyone is done with tile it - 1 (its stage is refilled next)
    {
      const int nxt = it + STAGES - 1;
      if (nxt < ntiles) load_tile(nxt, nxt % STAGES);
      cp_async_commit();
    }
    if (it * KT > wmax) continue;  // every key of the tile is past every row of this warp
    const bf16_t* st = ring + (it % STAGES) * NARR * ARR;
    // fast: K and V alone (klo and vlo are never read)
    const bf16_t *khi = st, *klo = st + ARR, *vhi = st + (FAST ? 1 : 2) * ARR, *vlo = st + 3 * ARR;

    // ---- S = q (K_hi + K_lo)^T, fp32
    float s[KT / 8][4];
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < DH / 16; ++ks)
#pragma unroll
      for (int nt = 0; nt < KT / 8; ++nt) {
        const int off = (8 * nt + g) * ROW + 16 * ks + 2 * cq;
        const std::uint32_t bh[2] = {ld32(khi + off), ld32(khi + off + 8)};
        mma_bf16(s[nt], qa[ks], bh);
        if constexpr (!FAST) {
          const std::uint32_t bl[2] = {ld32(klo + off), ld32(klo + off + 8)};
          mma_bf16(s[nt], qa[ks], bl);
        }
      }

    // ---- causal mask, online softmax (log2 domain); rows a = g, b = g + 8 of the warp's 16
    float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = it * KT + 8 * nt + 2 * cq + (e & 1);
        const bool ok = key <= (e < 2 ? posa : posb);
        s[nt][e] = ok ? s[nt][e] * p.scale_log2 : -INFINITY;
        if (e < 2) mxa = fmaxf(mxa, s[nt][e]);
        else mxb = fmaxf(mxb, s[nt][e]);
      }
#pragma unroll
    for (int m = 1; m <= 2; m <<= 1) {
      mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, m));
      mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, m));
    }
    // finite: tile 0 holds key 0, allowed for every row, and every warp with a valid row processes tile 0
    const float mna = fmaxf(m_a, mxa), mnb = fmaxf(m_b, mxb);
    const float ca = exp2f(m_a - mna), cb = exp2f(m_b - mnb);  // 0 on the first tile
    m_a = mna;
    m_b = mnb;
    float sa = 0.0f, sb = 0.0f;
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - mna);
      s[nt][1] = exp2f(s[nt][1] - mna);
      s[nt][2] = exp2f(s[nt][2] - mnb);
      s[nt][3] = exp2f(s[nt][3] - mnb);
      sa += s[nt][0] + s[nt][1];
      sb += s[nt][2] + s[nt][3];
    }
    l_a = l_a * ca + sa;
    l_b = l_b * cb + sb;
#pragma unroll
    for (int nt = 0; nt < DH / 8; ++nt) {
      acc[nt][0] *= ca;
      acc[nt][1] *= ca;
      acc[nt][2] *= cb;
      acc[nt][3] *= cb;
    }

    // ---- O += P_hi V_hi + P_hi V_lo (+ P_lo V_hi), fast: O += bf16(P) V; P's A fragments straight from the S
    // accumulators
    if constexpr (FAST) {
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk) {
        const std::uint32_t pb[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                     pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                     pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        const int vrow = 16 * kk + (lane % 8) + 8 * ((lane / 8) & 1);
#pragma unroll
        for (int np = 0; np < DH / 16; ++np) {
          std::uint32_t bv[4];
          ldsm_x4_trans(bv, vhi + vrow * ROW + 16 * np + 8 * (lane / 16));
          mma_bf16(acc[2 * np], pb, bv);
          mma_bf16(acc[2 * np + 1], pb, bv + 2);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk) {
        std::uint32_t ph[4], pl[4];
        split_bf16(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);
        split_bf16(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);
        split_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);
        split_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);
        const int vrow = 16 * kk + (lane % 8) + 8 * ((lane / 8) & 1);
#pragma unroll
        for (int np = 0; np < DH / 16; ++np) {
          const int off = vrow * ROW + 16 * np + 8 * (lane / 16);
          std::uint32_t bh[4], bl[4];
          ldsm_x4_trans(bh, vhi + off);
          ldsm_x4_trans(bl, vlo + off);
          mma_bf16(acc[2 * np], ph, bh);
          mma_bf16(acc[2 * np + 1], ph, bh + 2);
          mma_bf16(acc[2 * np], ph, bl);
          mma_bf16(acc[2 * np + 1], ph, bl + 2);
          if constexpr (PLO) {
            mma_bf16(acc[2 * np], pl, bh);
            mma_bf16(acc[2 * np + 1], pl, bh + 2);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int m = 1; m <= 2; m <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, m);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, m);
  }
  if (wmax < 0) return;
  const float ia = 1.0f / l_a, ib = 1.0f / l_b;
  float* ob = p.out + (qrow0 * p.H + head) * DH;
#pragma unroll
  for (int nt = 0; nt < DH / 8; ++nt) {
    const int col = 8 * nt + 2 * cq;
    if (ra < Tb)
      *reinterpret_cast<float2*>(ob + static_cast<long long>(ra) * p.H * DH + col) = make_float2(acc[nt][0] * ia, acc[nt][1] * ia);
    if (rb < Tb)
      *reinterpret_cast<float2*>(ob + static_cast<long long>(rb) * p.H * DH + col) = make_float2(acc[nt][2] * ib, acc[nt][3] * ib);
  }
}

/// Each fp32 row of 128 (rows 0 .. nrows - 1, contiguous) -> [bf16 hi 128 | bf16 lo 128] in the same 512 bytes.
__global__ void mla_split_rows_kernel(float* __restrict__ rows, long long nrows) {
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (long long r = blockIdx.x * static_cast<long long>(blockDim.x / 32) + threadIdx.x / 32; r < nrows; r += warps) {
    float* row = rows + r * DH;
    const float4 x = *reinterpret_cast<const float4*>(row + 4 * lane);
    __syncwarp();  // every lane holds its four values before any lane overwrites the row
    std::uint32_t h01, l01, h23, l23;
    split_bf16(x.x, x.y, h01, l01);
    split_bf16(x.z, x.w, h23, l23);
    bf16_t* out = reinterpret_cast<bf16_t*>(row);
    *reinterpret_cast<uint2*>(out + 4 * lane) = make_uint2(h01, h23);
    *reinterpret_cast<uint2*>(out + DH + 4 * lane) = make_uint2(l01, l23);
  }
}

/// Cache rows N0 .. N0 + T - 1 of every sequence <- c_new (the first d_c elements of each row); total = B Tmax d_c / 8
/// with Tmax = T (packed sequences, cu non-null: T of sequence b = cu[b + 1] - cu[b] <= Tmax, its rows of c_new from
/// cu[b], its N0 = n0s[b] when n0s is non-null).
__global__ void mla_heads_append_kernel(const bf16_t* __restrict__ src, long long sn_b, long long sn_t,
                                        bf16_t* __restrict__ c, long long sc_b, long long sc_t, int N0, int Tmax,
                                        const int* __restrict__ cu, const int* __restrict__ n0s, long long total) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int v = static_cast<int>(i % (DC / 8));
    const long long row = i / (DC / 8);
    const long long t = row % Tmax, b = row / Tmax;
    if (cu && t >= cu[b + 1] - cu[b]) continue;
    const long long n0 = n0s ? n0s[b] : N0;
    const bf16_t* s = cu ? src + (cu[b] + t) * sn_t : src + b * sn_b + t * sn_t;
    *reinterpret_cast<uint4*>(c + b * sc_b + (n0 + t) * sc_t + v * 8) = *reinterpret_cast<const uint4*>(s + v * 8);
  }
}

/// Packed sequences: zeroes the K and V rows of sequence b from its own N = N0_b + T_b to the slot's NK rows (their
/// cache rows hold whatever the cache held; a masked key's P = 0 must meet a finite V). kv: K then V, 2 B NK rows of
/// `row16` 16-byte words each.
__global__ void mla_zero_tail_rows_kernel(uint4* __restrict__ kv, int B, int NK, long long row16, int N0,
                                          const int* __restrict__ cu, const int* __restrict__ n0s) {
  const long long total = 2LL * B * NK * row16;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long row = i / row16;
    const int key = static_cast<int>(row % NK), b = static_cast<int>((row / NK) % B);
    if (key >= (n0s ? n0s[b] : N0) + cu[b + 1] - cu[b]) kv[i] = make_uint4(0, 0, 0, 0);
  }
}

__global__ void bf16_to_f32_kernel(const bf16_t* __restrict__ x, float* __restrict__ y, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    y[i] = bf2f(x[i]);
}

[[noreturn]] void fail(const std::string& m) { throw Error("mla_prefill_heads: " + m); }

void check_ptr_h(const void* ptr, std::size_t align, const char* name) {
  if (!ptr) fail(std::string("pointer '") + name + "' is null; a device pointer is required");
  const auto off = reinterpret_cast<std::uintptr_t>(ptr) % align;
  if (off != 0)
    fail(std::string("pointer '") + name + "' is not " + std::to_string(align) + "-byte aligned (address % " +
         std::to_string(align) + " = " + std::to_string(off) + "); accepted: " + std::to_string(align) +
         "-byte aligned device pointers");
}

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("mla_prefill_heads: cuBLAS ") + what + " failed: " + cublasGetStatusString(s));
}

cublasHandle_t cublas_handle() {
  static std::once_flag once;
  static cublasHandle_t h = nullptr;
  static cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  std::call_once(once, [] { st = cublasCreate(&h); });
  cublas_check(st, "cublasCreate");
  return h;
}

constexpr std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

/// Bytes per element of the naive path's K and V: fp32 (split in place into bf16 hi + lo) in precision accurate,
/// bf16 in fast.
std::size_t kv_element_bytes(const MlaPrefillHeadsArgs& a) {
  return mla_prefill_heads_precision(a) == MlaPrefillPrecision::fast ? 2 : 4;
}

/// The naive path's sequences: nseq of them, each with a slot of NK K and V rows, at most Tmax new tokens.
struct SeqGeom {
  long long nseq, NK, Tmax;
};
SeqGeom geom_of(const MlaPrefillHeadsArgs& a) {
  if (a.cu_seqlens) return {a.num_seqs, static_cast<long long>(a.prefix) + a.max_seqlen, a.max_seqlen};
  return {a.B, static_cast<long long>(a.prefix) + a.T, a.T};
}

void check_shape(const MlaPrefillHeadsArgs& a) {
  if (a.B < 1 || a.B > 65535) fail("B = " + std::to_string(a.B) + "; accepted: 1 <= B <= 65535");
  if (a.T < 1) fail("T = " + std::to_string(a.T) + "; accepted: T >= 1 new token");
  if (a.H < 1 || a.H > 256) fail("H = " + std::to_string(a.H) + "; accepted: 1 <= H <= 256");
  if (a.prefix < 0) fail("prefix (N0) = " + std::to_string(a.prefix) + "; accepted: N0 >= 0 cached tokens");
  if (a.capacity < 1) fail("capacity = " + std::to_string(a.capacity) + "; accepted: >= 1 token");
  if (!a.cu_seqlens) {
    if (a.prefix_lens) fail("prefix_lens without cu_seqlens; accepted: per-sequence prefixes of packed sequences only");
    if (static_cast<long long>(a.prefix) + a.T > a.capacity)
      fail("prefix N0 = " + std::to_string(a.prefix) + " plus T = " + std::to_string(a.T) + " passes the cache capacity " +
           std::to_string(a.capacity) + "; accepted: N0 + T <= capacity (allocate a larger cache)");
    return;
  }
  if (a.B != 1)
    fail("B = " + std::to_string(a.B) + " with cu_seqlens; accepted: B = 1 (packed sequences, T = all new tokens)");
  if (a.num_seqs < 1 || a.num_seqs > 65535)
    fail("num_seqs = " + std::to_string(a.num_seqs) + " with cu_seqlens; accepted: 1 <= num_seqs <= 65535");
  if (a.max_seqlen < 1 || a.max_seqlen > a.T)
    fail("max_seqlen = " + std::to_string(a.max_seqlen) + " with cu_seqlens; accepted: 1 <= max_seqlen <= T = " +
         std::to_string(a.T));
  if (static_cast<long long>(a.prefix) + a.max_seqlen > a.capacity)
    fail("prefix bound " + std::to_string(a.prefix) + " plus max_seqlen " + std::to_string(a.max_seqlen) +
         " passes the cache capacity " + std::to_string(a.capacity) + "; accepted: prefix + max_seqlen <= capacity");
}

}  // namespace

const char* mla_prefill_path_name(MlaPrefillPath p) {
  switch (p) {
    case MlaPrefillPath::automatic: return "auto";
    case MlaPrefillPath::absorbed: return "absorbed";
    case MlaPrefillPath::naive: return "naive";
  }
  return "?";
}

MlaPrefillPath mla_prefill_path_rule(const MlaPrefillHeadsArgs& a) {
  // naive iff 4096 pairs > 1280 pairs + 262,144 N  <=>  11 pairs > 1024 N (kernels/mla_prefill.hpp)
  const long long T = std::max(a.T, 0), N0 = std::max(a.prefix, 0);
  const long long pairs = T * N0 + T * (T + 1) / 2, N = N0 + T;
  return 11 * pairs > 1024 * N ? MlaPrefillPath::naive : MlaPrefillPath::absorbed;
}

const char* mla_prefill_precision_name(MlaPrefillPrecision p) {
  switch (p) {
    case MlaPrefillPrecision::automatic: return "auto";
    case MlaPrefillPrecision::accurate: return "accurate";
    case MlaPrefillPrecision::fast: return "fast";
  }
  return "?";
}

MlaPrefillPrecision mla_prefill_precision_rule(const MlaPrefillHeadsArgs&) { return MlaPrefillPrecision::accurate; }

const char* mla_fast_form_name(MlaFastForm f) {
  switch (f) {
    case MlaFastForm::automatic: return "auto";
    case MlaFastForm::wgmma: return "wgmma";
    case MlaFastForm::wgmma_pingpong: return "wgmma_pingpong";
    case MlaFastForm::mma_sync: return "mma_sync";
  }
  return "?";
}

MlaFastForm mla_fast_form_rule() { return MlaFastForm::wgmma; }

const char* mla_fast_order_name(MlaFastOrder o) {
  switch (o) {
    case MlaFastOrder::automatic: return "auto";
    case MlaFastOrder::longest_first: return "longest_first";
    case MlaFastOrder::head_major: return "head_major";
  }
  return "?";
}

MlaFastOrder mla_fast_order_rule(const MlaPrefillHeadsArgs& a) {
  const long long T = std::max(a.cu_seqlens ? a.max_seqlen : a.T, 1), N0 = std::max(a.prefix, 0);
  return N0 >= 7 * T || (T + 127) / 128 <= 16 ? MlaFastOrder::head_major : MlaFastOrder::longest_first;
}

MlaPrefillPrecision mla_prefill_heads_precision(const MlaPrefillHeadsArgs& a) {
  return a.precision == MlaPrefillPrecision::automatic ? mla_prefill_precision_rule(a) : a.precision;
}

bool mla_kv_products_in_one_call(long long nseq, long long nk, long long sc_t, long long sc_b, long long w_gap) {
  return (nseq == 1 || sc_b == nk * sc_t) && nseq * nk <= 2147483647LL && w_gap > 0 && w_gap % 8 == 0;
}

MlaPrefillPath mla_prefill_heads_path(const MlaPrefillHeadsArgs& a, const MlaPrefillOverrides* ov) {
  if (mla_prefill_heads_precision(a) == MlaPrefillPrecision::fast || a.cu_seqlens) return MlaPrefillPath::naive;
  if (ov && (ov->path == MlaPrefillPath::absorbed || ov->path == MlaPrefillPath::naive)) return ov->path;
  return mla_prefill_path_rule(a);
}

std::size_t mla_prefill_heads_workspace_bytes(const MlaPrefillHeadsArgs& a, const MlaPrefillOverrides* ov) {
  check_shape(a);
  const std::size_t B = a.B, T = a.T, H = a.H;
  if (mla_prefill_heads_path(a, ov) == MlaPrefillPath::naive) {
    const SeqGeom sg = geom_of(a);
    return 2 * align256(static_cast<std::size_t>(sg.nseq * sg.NK) * H * DH * kv_element_bytes(a));
  }
  return 2 * align256(B * T * H * DC * 2) + align256(B * T * H * DC * 4) + align256(H * DH * DC * 4);
}

void mla_prefill_heads(const MlaPrefillHeadsArgs& a, cudaStream_t stream, const MlaPrefillOverrides* ov) {
  if (a.d_c != DC) fail("d_c = " + std::to_string(a.d_c) + " is not supported; accepted: d_c = 512");
  if (a.d_nope != DH) fail("d_nope = " + std::to_string(a.d_nope) + " is not supported; accepted: d_nope = 128");
  if (a.d_v != DH) fail("d_v = " + std::to_string(a.d_v) + " is not supported; accepted: d_v = 128");
  if (a.d_rope != 0)
    fail("d_rope = " + std::to_string(a.d_rope) + ": the decoupled-RoPE score part is not implemented; accepted: d_rope = 0 (NoPE)");
  if (ov && ov->path != MlaPrefillPath::automatic && ov->path != MlaPrefillPath::absorbed &&
      ov->path != MlaPrefillPath::naive)
    fail("overrides path = " + std::to_string(static_cast<int>(ov->path)) + "; accepted: automatic, absorbed or naive");
  if (a.precision != MlaPrefillPrecision::automatic && a.precision != MlaPrefillPrecision::accurate &&
      a.precision != MlaPrefillPrecision::fast)
    fail("precision = " + std::to_string(static_cast<int>(a.precision)) + "; accepted: automatic, accurate or fast");
  const bool fast = mla_prefill_heads_precision(a) == MlaPrefillPrecision::fast;
  if (fast && ov && ov->path == MlaPrefillPath::absorbed)
    fail("precision fast with the absorbed path forced; accepted: fast runs the naive path only (automatic or naive)");
  if (a.cu_seqlens && ov && ov->path == MlaPrefillPath::absorbed)
    fail("cu_seqlens with the absorbed path forced; accepted: packed sequences run the naive path only (automatic or naive)");
  if (ov && (static_cast<int>(ov->fast_form) < 0 || static_cast<int>(ov->fast_form) > 3))
    fail("overrides fast_form = " + std::to_string(static_cast<int>(ov->fast_form)) +
         "; accepted: automatic, wgmma, wgmma_pingpong or mma_sync");
  if (ov && ov->fast_ctas < 0)
    fail("overrides fast_ctas = " + std::to_string(ov->fast_ctas) + "; accepted: 0 (one CTA per SM) or a CTA count >= 1");
  const MlaFastForm form = ov && ov->fast_form != MlaFastForm::automatic ? ov->fast_form : mla_fast_form_rule();
  if (ov && ov->fast_ctas != 0 && (!fast || form == MlaFastForm::mma_sync))
    fail("overrides fast_ctas = " + std::to_string(ov->fast_ctas) +
         " sizes the persistent grid of the wgmma forms; accepted: fast_ctas with precision fast and a wgmma form only");
  if (ov && (static_cast<int>(ov->fast_order) < 0 || static_cast<int>(ov->fast_order) > 2))
    fail("overrides fast_order = " + std::to_string(static_cast<int>(ov->fast_order)) +
         "; accepted: automatic, longest_first or head_major");
  if (ov && ov->fast_order != MlaFastOrder::automatic && (!fast || form == MlaFastForm::mma_sync))
    fail(std::string("overrides fast_order = ") + mla_fast_order_name(ov->fast_order) +
         " orders the persistent grid of the wgmma forms; accepted: fast_order with precision fast and a wgmma form only");
  if (!fast && ov && ov->fast_form != MlaFastForm::automatic)
    fail(std::string("fast_form = ") + mla_fast_form_name(ov->fast_form) +
         " with precision accurate: it picks a form of the fast attention; accepted: fast_form with precision fast only");
  if (fast && ov && ov->p_hi_only)
    fail("precision fast with p_hi_only: the ablation drops a pass of the accurate plan; accepted: p_hi_only with "
         "precision accurate only");
  check_shape(a);
  check_ptr_h(a.c, 16, "c");
  if (a.c_new) check_ptr_h(a.c_new, 16, "c_new");
  check_ptr_h(a.q_C, 4, "q_C");
  check_ptr_h(a.W_UK, 4, "W_UK");
  check_ptr_h(a.W_UV, 4, "W_UV");
  if (a.out_bf16) {
    if (a.out) fail("both out and out_bf16 given; accepted: exactly one (fp32 o in out, or bf16 o in out_bf16)");
    if (!fast)
      fail("out_bf16 with precision accurate: bf16 o would round away its ~5e-6; accepted: out_bf16 with precision fast only");
    if ((ov && ov->fast_form != MlaFastForm::automatic ? ov->fast_form : mla_fast_form_rule()) == MlaFastForm::mma_sync)
      fail("out_bf16 with fast_form = mma_sync; accepted: out_bf16 with a wgmma form only");
    check_ptr_h(a.out_bf16, 4, "out_bf16");
  } else {
    check_ptr_h(a.out, 8, "out");
  }
  if (!std::isfinite(a.scale) || !(a.scale > 0.0f)) fail("scale = " + std::to_string(a.scale) + "; accepted: a finite scale > 0");
  const long long sc_t = a.sc_t ? a.sc_t : DC;
  if (sc_t < DC || sc_t % 8 != 0)
    fail("sc_t = " + std::to_string(sc_t) + "; accepted: a multiple of 8 elements >= d_c = 512 (512: latent only; 576: [c ; k_R] rows)");
  const long long sc_b = a.sc_b ? a.sc_b : static_cast<long long>(a.capacity) * sc_t;
  const SeqGeom sg = geom_of(a);
  if (sc_b % 8 != 0 || (sg.nseq > 1 && sc_b < static_cast<long long>(a.capacity) * sc_t))
    fail("sc_b = " + std::to_string(sc_b) + "; accepted: a multiple of 8 elements >= capacity * sc_t = " +
         std::to_string(static_cast<long long>(a.capacity) * sc_t));
  const long long sn_t = a.sn_t ? a.sn_t : DC;
  const long long sn_b = a.sn_b ? a.sn_b : static_cast<long long>(a.T) * sn_t;
  if (a.c_new && (sn_t < DC || sn_t % 8 != 0 || sn_b % 8 != 0 || (a.B > 1 && sn_b < static_cast<long long>(a.T) * sn_t)))
    fail("c_new strides sn_t = " + std::to_string(sn_t) + ", sn_b = " + std::to_string(sn_b) +
         "; accepted: multiples of 8 elements, sn_t >= 512, sn_b >= T * sn_t");
  const long long sqc_t = a.sqc_t ? a.sqc_t : static_cast<long long>(a.H) * DH;
  if (sqc_t % 2 != 0 || sqc_t < static_cast<long long>(a.H) * DH)
    fail("sqc_t = " + std::to_string(sqc_t) + "; accepted: even, >= H * d_nope = " + std::to_string(a.H * DH));
  const MlaPrefillPath path = mla_prefill_heads_path(a, ov);
  const std::size_t need = mla_prefill_heads_workspace_bytes(a, ov);
  if (!a.workspace) fail("pointer 'workspace' is null; accepted: >= " + std::to_string(need) + " bytes of device memory");
  check_ptr_h(a.workspace, 256, "workspace");
  if (a.workspace_bytes < need)
    fail("workspace_bytes = " + std::to_string(a.workspace_bytes) + " for the " + mla_prefill_path_name(path) +
         (fast ? " path in precision fast" : " path") + "; accepted: >= mla_prefill_heads_workspace_bytes(args) = " +
         std::to_string(need));
  cublasHandle_t hb = cublas_handle();
  cublas_check(cublasSetStream(hb, stream), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  const long long B = a.B, T = a.T, H = a.H;

  if (path == MlaPrefillPath::absorbed) {
    unsigned char* ws = static_cast<unsigned char*>(a.workspace);
    bf16_t* q_hi = reinterpret_cast<bf16_t*>(ws);
    bf16_t* q_lo = reinterpret_cast<bf16_t*>(ws + align256(B * T * H * DC * 2));
    float* lat = reinterpret_cast<float*>(ws + 2 * align256(B * T * H * DC * 2));
    float* wuv = reinterpret_cast<float*>(ws + 2 * align256(B * T * H * DC * 2) + align256(B * T * H * DC * 4));
    MlaAbsorbArgs ab;
    ab.n = static_cast<int>(B * T);
    ab.H = a.H;
    ab.d_nope = DH;
    ab.q_C = a.q_C;
    ab.sqc_t = sqc_t;
    ab.W_UK = a.W_UK;
    ab.q_hi = q_hi;
    ab.q_lo = q_lo;
    mla_absorb_query(ab, stream);
    MlaPrefillArgs pa;
    pa.B = a.B;
    pa.T = a.T;
    pa.H = a.H;
    pa.capacity = a.capacity;
    pa.prefix = a.prefix;
    pa.c = a.c;
    pa.sc_b = sc_b;
    pa.sc_t = sc_t;
    pa.c_new = a.c_new;
    pa.sn_b = sn_b;
    pa.sn_t = sn_t;
    pa.q_hi = q_hi;
    pa.q_lo = q_lo;
    pa.scale = a.scale;
    pa.out = lat;
    mla_prefill(pa, stream);
    const long long nw = H * DH * DC;
    bf16_to_f32_kernel<<<static_cast<int>(std::min<long long>((nw + 255) / 256, 4096)), 256, 0, stream>>>(a.W_UV, wuv, nw);
    cuda_check(cudaGetLastError(), "bf16_to_f32_kernel launch");
    // column-major view, per head i: o_i^T [128 x BT] (ld H 128) = W_UV,i [128 x 512] (stored col-major 512 x 128,
    // ld 512: op T) x a_i^T [512 x BT] (ld H 512)
    cublas_check(cublasSgemmStridedBatched(hb, CUBLAS_OP_T, CUBLAS_OP_N, DH, static_cast<int>(B * T), DC, &one, wuv, DC,
                                           static_cast<long long>(DH) * DC, lat, static_cast<int>(H * DC), DC, &zero, a.out,
                                           static_cast<int>(H * DH), DH, static_cast<int>(H)),
                 "cublasSgemmStridedBatched (o = W_UV a)");
    return;
  }

  // ---- naive (sg: B sequences of N = N0 + T keys, or the packed sequences in slots of NK = prefix + max_seqlen rows)
  const long long NS = sg.nseq, NK = sg.NK, TM = sg.Tmax;
  if (a.c_new) {
    const long long total = NS * TM * (DC / 8);
    const int blocks = static_cast<int>(std::min<long long>((total + 255) / 256, 65535LL * 8));
    mla_heads_append_kernel<<<blocks, 256, 0, stream>>>(a.c_new, sn_b, sn_t, a.c, sc_b, sc_t, a.prefix, static_cast<int>(TM),
                                                         a.cu_seqlens, a.prefix_lens, total);
    cuda_check(cudaGetLastError(), "mla_heads_append_kernel launch");
  }
  // K and V: fp32 [NS, NK, H, 128] (accurate: split in place into bf16 hi + lo below) or bf16 (fast: rounded once)
  void* Kw = a.workspace;
  void* Vw = static_cast<unsigned char*>(a.workspace) + align256(NS * NK * H * DH * kv_element_bytes(a));
  // column-major view, per sequence b: K_b^T [H 128 x NK] (ld H 128) = W_UK [H 128 x 512] (stored col-major
  // 512 x H 128, ld 512: op T) x C_b^T [512 x NK] (ld sc_t); bf16 inputs, fp32 accumulation, fp32 or bf16 output
  const auto kv_type = fast ? CUDA_R_16BF : CUDA_R_32F;
  const long long w_gap = a.W_UV - a.W_UK;  // bf16 elements from W_UK to W_UV
  const long long kv_gap =  // elements from K's workspace part to V's
      (static_cast<unsigned char*>(Vw) - static_cast<unsigned char*>(Kw)) / static_cast<long long>(kv_element_bytes(a));
  if (mla_kv_products_in_one_call(NS, NK, sc_t, sc_b, w_gap)) {
    // K and V as a batch of two products over every sequence's NK keys laid end to end (one launch: measured 63 against
    // 70 us at 8 x 512 on the H100, docs/kernels/mla_prefill.md, "The K and V products in one call")
    cublas_check(cublasGemmStridedBatchedEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(H * DH), static_cast<int>(NS * NK),
                                            DC, &one, a.W_UK, CUDA_R_16BF, DC, w_gap, a.c, CUDA_R_16BF,
                                            static_cast<int>(sc_t), 0, &zero, Kw, kv_type, static_cast<int>(H * DH), kv_gap,
                                            2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx ([K, V] = C [W_UK, W_UV]^T)");
  } else {
    for (int which = 0; which < 2; ++which)
      cublas_check(cublasGemmStridedBatchedEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(H * DH), static_cast<int>(NK), DC,
                                              &one, which == 0 ? a.W_UK : a.W_UV, CUDA_R_16BF, DC, 0, a.c, CUDA_R_16BF,
                                              static_cast<int>(sc_t), sc_b, &zero, which == 0 ? Kw : Vw, kv_type,
                                              static_cast<int>(H * DH), NK * H * DH, static_cast<int>(NS),
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   which == 0 ? "cublasGemmStridedBatchedEx (K = C W_UK^T)" : "cublasGemmStridedBatchedEx (V = C W_UV^T)");
  }
  if (!fast) {
    // K and V rows are contiguous only when the V part starts right after the K part (align256 of a multiple of
    // 512 bytes is the identity), so one split launch covers both
    const long long nrows = 2 * NS * NK * H;
    const int sblocks = static_cast<int>(std::min<long long>((nrows + 7) / 8, 65535LL * 4));
    mla_split_rows_kernel<<<sblocks, 256, 0, stream>>>(static_cast<float*>(Kw), nrows);
    cuda_check(cudaGetLastError(), "mla_split_rows_kernel launch");
  }
  if (a.cu_seqlens) {  // the rows of each slot past its sequence's keys (K then V are contiguous, as above)
    const long long row16 = H * DH * kv_element_bytes(a) / 16;
    const int zblocks = static_cast<int>(std::min<long long>((2 * NS * NK * row16 + 255) / 256, 65535LL * 4));
    mla_zero_tail_rows_kernel<<<zblocks, 256, 0, stream>>>(static_cast<uint4*>(Kw), static_cast<int>(NS), static_cast<int>(NK),
                                                           row16, a.prefix, a.cu_seqlens, a.prefix_lens);
    cuda_check(cudaGetLastError(), "mla_zero_tail_rows_kernel launch");
  }

  NParams p{};
  p.T = static_cast<int>(TM);
  p.H = a.H;
  p.N0 = a.prefix;
  p.NK = static_cast<int>(NK);
  p.cu = a.cu_seqlens;
  p.n0s = a.prefix_lens;
  p.q = a.q_C;
  p.sq_t = sqc_t;
  p.sq_b = T * sqc_t;
  p.kv = static_cast<const bf16_t*>(Kw);
  p.v_off = NS * NK * H * (fast ? DH : 2 * DH);  // bf16 elements from the K rows to the V rows
  p.scale_log2 = a.scale * 1.4426950408889634f;
  p.out = a.out;
  const dim3 grid(static_cast<unsigned>((TM + QT - 1) / QT), static_cast<unsigned>(H), static_cast<unsigned>(NS));
  const auto launch = [&](auto kernel, std::size_t smem, bool& attr_set, const char* what) {
    if (!attr_set) {  // once per form
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), what);
      attr_set = true;
    }
    kernel<<<grid, NTHR, smem, stream>>>(p);
  };
  static bool attr[3] = {false, false, false};
  if (fast && form != MlaFastForm::mma_sync) {
    mla_prefill_detail::FastAttnArgs fa;
    fa.B = static_cast<int>(NS);
    fa.T = static_cast<int>(TM);
    fa.H = a.H;
    fa.N0 = a.prefix;
    fa.NK = static_cast<int>(NK);
    fa.cu = a.cu_seqlens;
    fa.n0s = a.prefix_lens;
    fa.q = a.q_C;
    fa.sq_b = p.sq_b;
    fa.sq_t = p.sq_t;
    fa.K = static_cast<const bf16_t*>(Kw);
    fa.V = static_cast<const bf16_t*>(Vw);
    fa.scale_log2 = p.scale_log2;
    fa.out = a.out;
    fa.out_bf16 = a.out_bf16;
    fa.out_rows = B * T;  // packed sequences: B = 1, T = every new token
    fa.ctas = ov ? ov->fast_ctas : 0;
    fa.head_major = (ov && ov->fast_order != MlaFastOrder::automatic ? ov->fast_order : mla_fast_order_rule(a)) ==
                    MlaFastOrder::head_major;
    mla_prefill_detail::fast_attention_wgmma(fa, form == MlaFastForm::wgmma_pingpong, stream);
  } else if (fast)
    launch(mla_naive_attn_kernel<kFast>, smem_of(kFast), attr[kFast], "cudaFuncSetAttribute(mla_naive_attn_kernel fast)");
  else if (ov && ov->p_hi_only)
    launch(mla_naive_attn_kernel<kAccuratePHi>, smem_of(kAccuratePHi), attr[kAccuratePHi],
           "cudaFuncSetAttribute(mla_naive_attn_kernel accurate, P hi only)");
  else
    launch(mla_naive_attn_kernel<kAccurate>, smem_of(kAccurate), attr[kAccurate],
           "cudaFuncSetAttribute(mla_naive_attn_kernel accurate)");
  cuda_check(cudaGetLastError(), "mla_naive_attn_kernel launch");
}

}  // namespace kdalab::kernels
