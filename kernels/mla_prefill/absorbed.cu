// Causal Gated-MLA prefill over the bf16 latent cache (kernels/mla_prefill.hpp), absorbed path, d_c = 512.
//
// Three kernels on the caller's stream:
//   append   copies the T new latents into cache rows N0 .. N0 + T - 1 (16 bytes per thread);
//   prefill  one CTA (8 warps) per 32 query rows (t, head), t-major, of one sequence. The cache rows
//            0 .. kend - 1 (kend = 1 + the largest position among the CTA's rows) stream in 32-token tiles
//            through a 4-stage cp.async ring (rows padded to 520 bf16: conflict-free 32-bit fragment loads
//            and ldmatrix rows). Per tile:
//              scores  warp w: partial S_w = [q_hi; q_lo][:, 64w..64w+63] C_tile[:, 64w..]^T by mma.sync
//                      m16n8k16 (q~ fragments of the warp's columns held in registers), hi and lo rows into
//                      the same fp32 tile; the 8 partials summed through shared memory;
//              softmax 8 threads per row, fp32 online softmax in the log2 domain, causal mask per row
//                      (key tau allowed iff tau <= N0 + t); P stored as bf16 hi + lo rows;
//              P C     acc[:, 64w..] = corr acc + [P_hi; P_lo] C_tile[:, 64w..] (C fragments by
//                      ldmatrix.trans), fp32 accumulators.
//            At the end acc / l is written (no split over keys, no combine).
//   absorb   (mla_absorb_query) q~ = W_UK,i^T q^C per (token, head) in fp32, split into bf16 hi + lo.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/common/cuda_check.hpp"
#include "kernels/common/kda_math.cuh"
#include "kernels/mla_prefill.hpp"

namespace kdalab::kernels {

namespace {
using namespace detail;

constexpr int DC = 512;           // d_c
constexpr int TT = 32;            // keys per tile
constexpr int ROWS = 32;          // query rows (t, head) per CTA
constexpr int STAGES = 4;         // cp.async ring depth
constexpr int NWARP = 8, NTHR = 256;
constexpr int CROW = DC + 8;      // shared row stride of a cache tile (bf16): 1040 bytes
constexpr int RP = TT + 8;        // row stride of the score partials (fp32)
constexpr int PP = TT + 8;        // row stride of P hi / lo (bf16)
constexpr int TPR = NTHR / ROWS;  // softmax threads per row (8)
constexpr int TPT = TT / TPR;     // keys per softmax thread (4)
static_assert(TPT % 2 == 0 && TPR <= 32 && 32 % TPR == 0, "softmax layout");

constexpr std::size_t SMEM = std::size_t(STAGES) * TT * CROW * 2 + std::size_t(NWARP) * ROWS * RP * 4 +
                             std::size_t(2 * ROWS) * PP * 2 + std::size_t(2 * ROWS) * 4;

struct PParams {
  int H, N0, rows_total, nblk;
  const bf16_t* c;
  long long sc_b, sc_t;
  const bf16_t *q_hi, *q_lo;
  long long sq_b, sq_t;
  float scale_log2;  // scale * log2(e)
  float* out;
};


__global__ void __launch_bounds__(NTHR, 1) mla_prefill_kernel(PParams p) {
  const int blk = p.nblk - 1 - static_cast<int>(blockIdx.x);  // the longest CTAs (last rows) first
  const int b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, cq = lane % 4;
  const int row0 = blk * ROWS;
  const int last_row = min(row0 + ROWS, p.rows_total) - 1;
  const int kend = p.N0 + last_row / p.H + 1;  // keys 0 .. kend - 1
  const int ntiles = (kend + TT - 1) / TT;

  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* cs = reinterpret_cast<bf16_t*>(smem);
  float* red = reinterpret_cast<float*>(smem + std::size_t(STAGES) * TT * CROW * 2);
  bf16_t* ps = reinterpret_cast<bf16_t*>(red + NWARP * ROWS * RP);
  float* corr_s = reinterpret_cast<float*>(ps + 2 * ROWS * PP);
  float* linv_s = corr_s + ROWS;

  const bf16_t* cb = p.c + b * p.sc_b;
  auto load_tile = [&](int tile, int stage) {
    bf16_t* dst = cs + stage * TT * CROW;
#pragma unroll
    for (int i = 0; i < TT * (DC / 8) / NTHR; ++i) {
      const int idx = tid + i * NTHR, r = idx / (DC / 8), ch = idx % (DC / 8);
      const int tok = tile * TT + r;
      if (tok < kend)
        cp_async16(dst + r * CROW + ch * 8, cb + tok * p.sc_t + ch * 8);
      else
        cp_async16_zfill(dst + r * CROW + ch * 8, cb, 0);  // past the last key: zeros (masked anyway)
    }
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntiles) load_tile(s, s);
    cp_async_commit();
  }

  // q~ fragments (A operand, row-major 16 x 16) of this warp's 64 columns: i = 2 part + mt, part 0 = hi,
  // 1 = lo; m-tile mt holds rows 16 mt .. 16 mt + 15. Rows past T H read as zeros (never written out).
  std::uint32_t qa[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bf16_t* qp = (i < 2 ? p.q_hi : p.q_lo) + b * p.sq_b;
    const int ra = row0 + 16 * (i % 2) + g, rb = ra + 8;
    const bf16_t* pa = ra < p.rows_total ? qp + (ra / p.H) * p.sq_t + (ra % p.H) * DC : nullptr;
    const bf16_t* pb = rb < p.rows_total ? qp + (rb / p.H) * p.sq_t + (rb % p.H) * DC : nullptr;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int k0 = 64 * warp + 16 * ks + 2 * cq;
      qa[i][ks][0] = pa ? ld32(pa + k0) : 0u;
      qa[i][ks][1] = pb ? ld32(pb + k0) : 0u;
      qa[i][ks][2] = pa ? ld32(pa + k0 + 8) : 0u;
      qa[i][ks][3] = pb ? ld32(pb + k0 + 8) : 0u;
    }
  }

  float acc[2][8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  // softmax role: row hs, keys j0 .. j0 + TPT - 1 of each tile; the row's absolute position (0 for rows
  // past T H: they see key 0 only and are not written)
  const int hs = tid / TPR, j0 = (tid % TPR) * TPT;
  const int pos = row0 + hs < p.rows_total ? p.N0 + (row0 + hs) / p.H : 0;
  float m_run = -INFINITY, l_run = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nxt = it + STAGES - 1;
      if (nxt < ntiles) load_tile(nxt, nxt % STAGES);
      cp_async_commit();
    }
    const bf16_t* ct = cs + (it % STAGES) * TT * CROW;

    // ---- partial scores over this warp's 64 columns
    float sc[2][TT / 8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < TT / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mt][nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int nt = 0; nt < TT / 8; ++nt) {
        const bf16_t* bp = ct + (8 * nt + g) * CROW + 64 * warp + 16 * ks + 2 * cq;
        const std::uint32_t bfr[2] = {ld32(bp), ld32(bp + 8)};
#pragma unroll
        for (int i = 0; i < 4; ++i) mma_bf16(sc[i % 2][nt], qa[i][ks], bfr);
      }
    {
      float* rw = red + warp * ROWS * RP;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < TT / 8; ++nt) {
          const int r = 16 * mt + g, t = 8 * nt + 2 * cq;
          *reinterpret_cast<float2*>(rw + r * RP + t) = make_float2(sc[mt][nt][0], sc[mt][nt][1]);
          *reinterpret_cast<float2*>(rw + (r + 8) * RP + t) = make_float2(sc[mt][nt][2], sc[mt][nt][3]);
        }
    }
    __syncthreads();

    // ---- causal online softmax (log2 domain), P as bf16 hi + lo
    {
      float s[TPT];
#pragma unroll
      for (int e = 0; e < TPT; ++e) s[e] = 0.0f;
#pragma unroll
      for (int w = 0; w < NWARP; ++w)
#pragma unroll
        for (int e = 0; e < TPT; ++e) s[e] += red[(w * ROWS + hs) * RP + j0 + e];
      float mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < TPT; ++e) {
        const int key = it * TT + j0 + e;
        s[e] = key <= pos ? s[e] * p.scale_log2 : -INFINITY;
        mx = fmaxf(mx, s[e]);
      }
#pragma unroll
      for (int m = TPR / 2; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
      const float m_new = fmaxf(m_run, mx);     // finite: key 0 (tile 0) is allowed for every row
      const float corr = exp2f(m_run - m_new);  // 0 on the first tile
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < TPT; e += 2) {
        const float p0 = exp2f(s[e] - m_new), p1 = exp2f(s[e + 1] - m_new);
        sum += p0 + p1;
        std::uint32_t hi, lo;
        split_bf16(p0, p1, hi, lo);
        *reinterpret_cast<std::uint32_t*>(ps + hs * PP + j0 + e) = hi;
        *reinterpret_cast<std::uint32_t*>(ps + (ROWS + hs) * PP + j0 + e) = lo;
      }
#pragma unroll
      for (int m = TPR / 2; m >= 1; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
      l_run = l_run * corr + sum;
      m_run = m_new;
      if (tid % TPR == 0) corr_s[hs] = corr;
    }
    __syncthreads();

    // ---- acc = corr acc + [P_hi; P_lo] C_tile over this warp's 64 columns
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const float c0 = corr_s[16 * mt + g], c1 = corr_s[16 * mt + g + 8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        acc[mt][nt][0] *= c0;
        acc[mt][nt][1] *= c0;
        acc[mt][nt][2] *= c1;
        acc[mt][nt][3] *= c1;
      }
    }
#pragma unroll
    for (int ks = 0; ks < TT / 16; ++ks) {
      std::uint32_t pa[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // P rows 16 i ..: i = 0, 1 hi (rows 0..31), i = 2, 3 lo (rows 32..63)
        const bf16_t* pp = ps + (16 * i + g) * PP + 16 * ks + 2 * cq;
        pa[i][0] = ld32(pp);
        pa[i][1] = ld32(pp + 8 * PP);
        pa[i][2] = ld32(pp + 8);
        pa[i][3] = ld32(pp + 8 * PP + 8);
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        std::uint32_t bq[4];
        ldsm_x4_trans(bq, ct + (16 * ks + (lane % 8) + 8 * ((lane / 8) & 1)) * CROW + 64 * warp + 16 * np + 8 * (lane / 16));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          mma_bf16(acc[i % 2][2 * np], pa[i], bq);
          mma_bf16(acc[i % 2][2 * np + 1], pa[i], bq + 2);
        }
      }
    }
  }
  cp_async_wait<0>();
  if (tid % TPR == 0) linv_s[hs] = 1.0f / l_run;
  __syncthreads();

  float* ob = p.out + static_cast<long long>(b) * p.rows_total * DC;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int ra = 16 * mt + g, rb = ra + 8;
    const float ia = linv_s[ra], ib = linv_s[rb];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int col = 64 * warp + 8 * nt + 2 * cq;
      if (row0 + ra < p.rows_total)
        *reinterpret_cast<float2*>(ob + static_cast<long long>(row0 + ra) * DC + col) =
            make_float2(acc[mt][nt][0] * ia, acc[mt][nt][1] * ia);
      if (row0 + rb < p.rows_total)
        *reinterpret_cast<float2*>(ob + static_cast<long long>(row0 + rb) * DC + col) =
            make_float2(acc[mt][nt][2] * ib, acc[mt][nt][3] * ib);
    }
  }
}

/// Cache rows N0 .. N0 + T - 1 of every sequence <- c_new (the first d_c elements of each row).
__global__ void mla_append_kernel(const bf16_t* __restrict__ src, long long sn_b, long long sn_t, bf16_t* __restrict__ c,
                                  long long sc_b, long long sc_t, int N0, int T, long long total) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int v = static_cast<int>(i % (DC / 8));
    const long long row = i / (DC / 8);
    const long long t = row % T, b = row / T;
    const uint4 x = *reinterpret_cast<const uint4*>(src + b * sn_b + t * sn_t + v * 8);
    *reinterpret_cast<uint4*>(c + b * sc_b + (N0 + t) * sc_t + v * 8) = x;
  }
}

constexpr int AB_TOK = 32;  // tokens per CTA of the absorption

/// q~[t, h, :] = sum_j q_C[t, h, j] W_UK[h d_nope + j, :] in fp32; thread owns columns 2 tid, 2 tid + 1.
__global__ void __launch_bounds__(256) mla_absorb_kernel(const bf16_t* __restrict__ qC, long long sqc_t,
                                                          const bf16_t* __restrict__ W, int n, int H, int dn,
                                                          bf16_t* __restrict__ q_hi, bf16_t* __restrict__ q_lo) {
  extern __shared__ float qs[];  // [AB_TOK][dn]
  const int t0 = blockIdx.x * AB_TOK, h = blockIdx.y, tid = threadIdx.x;
  for (int idx = tid; idx < AB_TOK * dn; idx += 256) {
    const int r = idx / dn, j = idx % dn, t = t0 + r;
    const std::uint16_t v = t < n ? qC[t * sqc_t + static_cast<long long>(h) * dn + j] : std::uint16_t(0);
    qs[idx] = bf2f(v);
  }
  __syncthreads();
  float acc[AB_TOK][2];
#pragma unroll
  for (int r = 0; r < AB_TOK; ++r) acc[r][0] = acc[r][1] = 0.0f;
  const bf16_t* wp = W + static_cast<long long>(h) * dn * DC + 2 * tid;
  for (int j = 0; j < dn; ++j) {
    const std::uint32_t w2 = *reinterpret_cast<const std::uint32_t*>(wp + static_cast<long long>(j) * DC);
    const float w0 = __uint_as_float(w2 << 16), w1 = __uint_as_float(w2 & 0xffff0000u);
#pragma unroll
    for (int r = 0; r < AB_TOK; ++r) {
      const float q = qs[r * dn + j];
      acc[r][0] = fmaf(q, w0, acc[r][0]);
      acc[r][1] = fmaf(q, w1, acc[r][1]);
    }
  }
#pragma unroll
  for (int r = 0; r < AB_TOK; ++r) {
    const int t = t0 + r;
    if (t < n) {
      std::uint32_t hi, lo;
      split_bf16(acc[r][0], acc[r][1], hi, lo);
      const long long o = (static_cast<long long>(t) * H + h) * DC + 2 * tid;
      *reinterpret_cast<std::uint32_t*>(q_hi + o) = hi;
      *reinterpret_cast<std::uint32_t*>(q_lo + o) = lo;
    }
  }
}

[[noreturn]] void fail(const char* op, const std::string& m) { throw Error(std::string(op) + ": " + m); }

void check_pointer(const char* op, const void* ptr, std::size_t align, const char* name) {
  if (!ptr) fail(op, std::string("pointer '") + name + "' is null; a device pointer is required");
  const auto off = reinterpret_cast<std::uintptr_t>(ptr) % align;
  if (off != 0)
    fail(op, std::string("pointer '") + name + "' is not " + std::to_string(align) + "-byte aligned (address % " +
                 std::to_string(align) + " = " + std::to_string(off) + "); accepted: " + std::to_string(align) +
                 "-byte aligned device pointers");
}

}  // namespace

void mla_prefill(const MlaPrefillArgs& a, cudaStream_t stream) {
  const char* op = "mla_prefill";
  if (a.d_c != DC) fail(op, "d_c = " + std::to_string(a.d_c) + " is not supported; accepted: d_c = 512");
  if (a.d_rope != 0)
    fail(op, "d_rope = " + std::to_string(a.d_rope) +
                 ": the decoupled-RoPE score part is not implemented; accepted: d_rope = 0 (NoPE)");
  if (a.H < 1 || a.H > 256) fail(op, "H = " + std::to_string(a.H) + "; accepted: 1 <= H <= 256");
  if (a.B < 1 || a.B > 65535) fail(op, "B = " + std::to_string(a.B) + "; accepted: 1 <= B <= 65535");
  if (a.T < 1) fail(op, "T = " + std::to_string(a.T) + "; accepted: T >= 1 new token");
  if (a.prefix < 0) fail(op, "prefix (N0) = " + std::to_string(a.prefix) + "; accepted: N0 >= 0 cached tokens");
  if (a.capacity < 1) fail(op, "capacity = " + std::to_string(a.capacity) + "; accepted: >= 1 token");
  if (static_cast<long long>(a.prefix) + a.T > a.capacity)
    fail(op, "prefix N0 = " + std::to_string(a.prefix) + " plus T = " + std::to_string(a.T) + " passes the cache capacity " +
                 std::to_string(a.capacity) + "; accepted: N0 + T <= capacity (allocate a larger cache)");
  if (static_cast<long long>(a.T) * a.H > (1LL << 30))
    fail(op, "T * H = " + std::to_string(static_cast<long long>(a.T) * a.H) + "; accepted: <= 2^30 query rows");
  check_pointer(op, a.c, 16, "c");
  check_pointer(op, a.q_hi, 4, "q_hi");
  check_pointer(op, a.q_lo, 4, "q_lo");
  check_pointer(op, a.out, 8, "out");
  if (a.c_new) check_pointer(op, a.c_new, 16, "c_new");
  if (!std::isfinite(a.scale) || !(a.scale > 0.0f))
    fail(op, "scale = " + std::to_string(a.scale) + "; accepted: a finite scale > 0");
  const long long sc_t = a.sc_t ? a.sc_t : DC;
  if (sc_t < DC || sc_t % 8 != 0)
    fail(op, "sc_t = " + std::to_string(sc_t) + "; accepted: a multiple of 8 elements >= d_c = 512 (512: latent only; 576: [c ; k_R] rows)");
  const long long sc_b = a.sc_b ? a.sc_b : static_cast<long long>(a.capacity) * sc_t;
  if (sc_b % 8 != 0 || (a.B > 1 && sc_b < static_cast<long long>(a.capacity) * sc_t))
    fail(op, "sc_b = " + std::to_string(sc_b) + "; accepted: a multiple of 8 elements >= capacity * sc_t = " +
                 std::to_string(static_cast<long long>(a.capacity) * sc_t));
  const long long sn_t = a.sn_t ? a.sn_t : DC;
  const long long sn_b = a.sn_b ? a.sn_b : static_cast<long long>(a.T) * sn_t;
  if (a.c_new && (sn_t < DC || sn_t % 8 != 0 || sn_b % 8 != 0 || (a.B > 1 && sn_b < static_cast<long long>(a.T) * sn_t)))
    fail(op, "c_new strides sn_t = " + std::to_string(sn_t) + ", sn_b = " + std::to_string(sn_b) +
                 "; accepted: multiples of 8 elements, sn_t >= 512, sn_b >= T * sn_t");
  const long long sq_t = a.sq_t ? a.sq_t : static_cast<long long>(a.H) * DC;
  const long long sq_b = a.sq_b ? a.sq_b : static_cast<long long>(a.T) * sq_t;
  if (sq_t % 2 != 0 || sq_t < static_cast<long long>(a.H) * DC || sq_b % 2 != 0 ||
      (a.B > 1 && sq_b < static_cast<long long>(a.T) * sq_t))
    fail(op, "query strides sq_t = " + std::to_string(sq_t) + ", sq_b = " + std::to_string(sq_b) +
                 "; accepted: even, sq_t >= H * d_c = " + std::to_string(a.H * DC) + ", sq_b >= T * sq_t");

  if (a.c_new) {
    const long long total = static_cast<long long>(a.B) * a.T * (DC / 8);
    const int blocks = static_cast<int>(std::min<long long>((total + 255) / 256, 65535LL * 8));
    mla_append_kernel<<<blocks, 256, 0, stream>>>(a.c_new, sn_b, sn_t, a.c, sc_b, sc_t, a.prefix, a.T, total);
    cuda_check(cudaGetLastError(), "mla_append_kernel launch");
  }
  PParams p{};
  p.H = a.H;
  p.N0 = a.prefix;
  p.rows_total = a.T * a.H;
  p.nblk = (p.rows_total + ROWS - 1) / ROWS;
  p.c = a.c;
  p.sc_b = sc_b;
  p.sc_t = sc_t;
  p.q_hi = a.q_hi;
  p.q_lo = a.q_lo;
  p.sq_b = sq_b;
  p.sq_t = sq_t;
  p.scale_log2 = a.scale * 1.4426950408889634f;
  p.out = a.out;
  static bool attr = false;  // once (so that a call inside CUDA-graph capture sets no attribute)
  if (!attr) {
    cuda_check(cudaFuncSetAttribute(mla_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(SMEM)),
               "cudaFuncSetAttribute(mla_prefill_kernel)");
    attr = true;
  }
  mla_prefill_kernel<<<dim3(p.nblk, a.B), NTHR, SMEM, stream>>>(p);
  cuda_check(cudaGetLastError(), "mla_prefill_kernel launch");
}

void mla_absorb_query(const MlaAbsorbArgs& a, cudaStream_t stream) {
  const char* op = "mla_absorb_query";
  if (a.d_c != DC) fail(op, "d_c = " + std::to_string(a.d_c) + " is not supported; accepted: d_c = 512");
  if (a.n < 1) fail(op, "n = " + std::to_string(a.n) + "; accepted: n >= 1 token");
  if (a.H < 1 || a.H > 256) fail(op, "H = " + std::to_string(a.H) + "; accepted: 1 <= H <= 256");
  if (a.d_nope < 1 || a.d_nope > 256) fail(op, "d_nope = " + std::to_string(a.d_nope) + "; accepted: 1 <= d_nope <= 256");
  const long long sqc_t = a.sqc_t ? a.sqc_t : static_cast<long long>(a.H) * a.d_nope;
  if (sqc_t < static_cast<long long>(a.H) * a.d_nope)
    fail(op, "sqc_t = " + std::to_string(sqc_t) + "; accepted: >= H * d_nope = " + std::to_string(a.H * a.d_nope));
  check_pointer(op, a.q_C, 2, "q_C");
  check_pointer(op, a.W_UK, 4, "W_UK");
  check_pointer(op, a.q_hi, 4, "q_hi");
  check_pointer(op, a.q_lo, 4, "q_lo");
  const std::size_t smem = static_cast<std::size_t>(AB_TOK) * a.d_nope * 4;  // <= 32 KB
  mla_absorb_kernel<<<dim3((a.n + AB_TOK - 1) / AB_TOK, a.H), 256, smem, stream>>>(a.q_C, sqc_t, a.W_UK, a.n, a.H, a.d_nope,
                                                                                   a.q_hi, a.q_lo);
  cuda_check(cudaGetLastError(), "mla_absorb_kernel launch");
}

}  // namespace kdalab::kernels
