// Absorbed Gated-MLA decode over a bf16 latent cache (kernels/mla.hpp), d_c = 512, H in {16, 32}.
//
// Split kernel: one CTA (8 warps) per (slice of split_len tokens, sequence), all H heads. The slice is
// streamed in 32-token tiles through a 4-stage cp.async ring in shared memory (rows padded to 520
// bf16 so that 32-bit fragment loads and ldmatrix rows hit distinct banks). Warp w owns latent columns
// [64 w, 64 w + 64):
//   scores  partial S_w = [q_hi; q_lo][:, cols_w] C_tile[:, cols_w]^T by mma.sync m16n8k16 (the q~
//           fragments of the warp's columns stay in registers: 2 parts x MT m-tiles x 4 k-steps); the
//           hi and lo rows accumulate into the same fp32 tile; the 8 partials are summed through
//           shared memory;
//   softmax fp32 online softmax per head in the log2 domain (scale * log2 e folded in), running
//           max m and sum l per head in registers; P written to shared memory as bf16 hi + lo rows;
//   P C     acc[:, cols_w] = corr * acc + [P_hi; P_lo] C_tile[:, cols_w] by mma.sync (C fragments by
//           ldmatrix.trans), fp32 accumulators (MT x 8 n-tiles x 4 per thread).
// The partial (m, l, unnormalised acc) goes to the workspace; the combine kernel (one CTA per
// (head, sequence), float4 per thread) merges the slices of each sequence.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/kda_common.cuh"
#include "kernels/mla.hpp"

namespace kdalab::kernels {

namespace {
using namespace detail;

constexpr int DC = 512;          // d_c
constexpr int TT = 32;           // tokens per tile
constexpr int STAGES = 4;        // cp.async ring depth
constexpr int NWARP = 8, NTHR = 256;
constexpr int CROW = DC + 8;      // shared row stride of a cache tile (bf16): 1040 bytes
constexpr int RP = TT + 8;        // row stride of the score partials (fp32)
constexpr int PP = TT + 8;        // row stride of P hi/lo (bf16)
constexpr int MIN_SPLIT = 256;    // fewest tokens per slice chosen automatically

template <int H>
constexpr std::size_t smem_bytes() {
  return std::size_t(STAGES) * TT * CROW * 2 + std::size_t(NWARP) * H * RP * 4 + std::size_t(2 * H) * PP * 2 +
         std::size_t(H) * 4;
}

struct SParams {
  int B, max_len, split_len, num_splits;
  const int* lens;
  const bf16_t* c;
  long long sc_b, sc_t;
  const bf16_t *q_hi, *q_lo;
  long long sq_b;
  float scale_log2;  // scale * log2(e)
  float *ws_acc, *ws_ml, *out;
};

/// cp.async of 16 bytes; src_bytes = 0 fills the 16 bytes with zeros (nothing is read).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}

__device__ __forceinline__ std::uint32_t ld32(const bf16_t* p) { return *reinterpret_cast<const std::uint32_t*>(p); }

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t* r, const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ int seq_len(const SParams& p, int b) { return p.lens ? p.lens[b] : p.max_len; }

template <int H>
__global__ void __launch_bounds__(NTHR, 1) mla_split_kernel(SParams p) {
  constexpr int MT = H / 16;      // m-tiles per part (hi or lo)
  constexpr int TPH = NTHR / H;   // softmax threads per head
  constexpr int TPT = TT / TPH;   // tokens per softmax thread
  static_assert(H % 16 == 0 && TPT >= 1 && TT % TPH == 0, "H");
  const int split = blockIdx.x, b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, cq = lane % 4;
  const int len = seq_len(p, b);
  if (len < 1 || len > p.max_len) return;  // the combine kernel writes NaN rows
  const int start = split * p.split_len;
  if (start >= len) return;                // empty slice: the combine kernel does not read it
  const int end = min(start + p.split_len, len);
  const int ntiles = (end - start + TT - 1) / TT;

  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* cs = reinterpret_cast<bf16_t*>(smem);
  float* red = reinterpret_cast<float*>(smem + std::size_t(STAGES) * TT * CROW * 2);
  bf16_t* ps = reinterpret_cast<bf16_t*>(red + NWARP * H * RP);
  float* corr_s = reinterpret_cast<float*>(ps + 2 * H * PP);

  const bf16_t* cb = p.c + b * p.sc_b;
  auto load_tile = [&](int tile, int stage) {
    bf16_t* dst = cs + stage * TT * CROW;
    const int t0 = start + tile * TT;
#pragma unroll
    for (int i = 0; i < TT * (DC / 8) / NTHR; ++i) {
      const int idx = tid + i * NTHR, row = idx / (DC / 8), ch = idx % (DC / 8);
      const int tok = t0 + row;
      bf16_t* d = dst + row * CROW + ch * 8;
      if (tok < end)
        cp_async16(d, cb + tok * p.sc_t + ch * 8);
      else
        cp_async16_zfill(d, cb, 0);  // rows past the slice: zeros (P is 0 there; 0 * 0 stays 0)
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntiles) load_tile(s, s);
    cp_async_commit();
  }

  // q~ fragments (A operand, row-major 16x16) of this warp's 64 columns; tile i < MT: hi heads
  // 16 i .. 16 i + 15, i >= MT: lo heads 16 (i - MT) ..
  std::uint32_t qa[2 * MT][4][4];
#pragma unroll
  for (int i = 0; i < 2 * MT; ++i) {
    const bf16_t* qp = (i < MT ? p.q_hi : p.q_lo) + b * p.sq_b;
    const int h0 = 16 * (i % MT) + g;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int k0 = 64 * warp + 16 * ks + 2 * cq;
      qa[i][ks][0] = ld32(qp + h0 * DC + k0);
      qa[i][ks][1] = ld32(qp + (h0 + 8) * DC + k0);
      qa[i][ks][2] = ld32(qp + h0 * DC + k0 + 8);
      qa[i][ks][3] = ld32(qp + (h0 + 8) * DC + k0 + 8);
    }
  }

  float acc[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  const int hs = tid / TPH, j0 = (tid % TPH) * TPT;  // softmax: head hs, tokens j0 .. j0 + TPT - 1
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
    float sc[MT][TT / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < TT / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mt][nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int nt = 0; nt < TT / 8; ++nt) {
        const bf16_t* bp = ct + (8 * nt + g) * CROW + 64 * warp + 16 * ks + 2 * cq;
        const std::uint32_t bfr[2] = {*reinterpret_cast<const std::uint32_t*>(bp),
                                      *reinterpret_cast<const std::uint32_t*>(bp + 8)};
#pragma unroll
        for (int i = 0; i < 2 * MT; ++i) mma_bf16(sc[i % MT][nt], qa[i][ks], bfr);
      }
    {
      float* rw = red + warp * H * RP;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < TT / 8; ++nt) {
          const int h = 16 * mt + g, t = 8 * nt + 2 * cq;
          *reinterpret_cast<float2*>(rw + h * RP + t) = make_float2(sc[mt][nt][0], sc[mt][nt][1]);
          *reinterpret_cast<float2*>(rw + (h + 8) * RP + t) = make_float2(sc[mt][nt][2], sc[mt][nt][3]);
        }
    }
    __syncthreads();

    // ---- online softmax (log2 domain), P as bf16 hi + lo
    {
      const int valid = min(TT, end - (start + it * TT));
      float s[TPT];
#pragma unroll
      for (int e = 0; e < TPT; ++e) s[e] = 0.0f;
#pragma unroll
      for (int w = 0; w < NWARP; ++w)
#pragma unroll
        for (int e = 0; e < TPT; ++e) s[e] += red[(w * H + hs) * RP + j0 + e];
      float mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < TPT; ++e) {
        s[e] = (j0 + e < valid) ? s[e] * p.scale_log2 : -INFINITY;
        mx = fmaxf(mx, s[e]);
      }
#pragma unroll
      for (int m = TPH / 2; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
      const float m_new = fmaxf(m_run, mx);      // finite: token 0 of every tile is valid
      const float corr = exp2f(m_run - m_new);   // 0 on the first tile (m_run = -inf)
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < TPT; e += 2) {
        const float p0 = exp2f(s[e] - m_new), p1 = exp2f(s[e + 1] - m_new);
        sum += p0 + p1;
        std::uint32_t hi, lo;
        split_bf16(p0, p1, hi, lo);
        *reinterpret_cast<std::uint32_t*>(ps + hs * PP + j0 + e) = hi;
        *reinterpret_cast<std::uint32_t*>(ps + (H + hs) * PP + j0 + e) = lo;
      }
#pragma unroll
      for (int m = TPH / 2; m >= 1; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
      l_run = l_run * corr + sum;
      m_run = m_new;
      if (tid % TPH == 0) corr_s[hs] = corr;
    }
    __syncthreads();

    // ---- acc = corr acc + [P_hi; P_lo] C_tile over this warp's 64 columns
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float c0 = corr_s[16 * mt + g], c1 = corr_s[16 * mt + g + 8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        acc[mt][nt][0] *= c0; acc[mt][nt][1] *= c0;
        acc[mt][nt][2] *= c1; acc[mt][nt][3] *= c1;
      }
    }
#pragma unroll
    for (int ks = 0; ks < TT / 16; ++ks) {
      std::uint32_t pa[2 * MT][4];
#pragma unroll
      for (int i = 0; i < 2 * MT; ++i) {  // rows 16 i .. : hi heads for i < MT, lo heads (row H + ...) after
        const bf16_t* pp = ps + (16 * i + g) * PP + 16 * ks + 2 * cq;
        pa[i][0] = *reinterpret_cast<const std::uint32_t*>(pp);
        pa[i][1] = *reinterpret_cast<const std::uint32_t*>(pp + 8 * PP);
        pa[i][2] = *reinterpret_cast<const std::uint32_t*>(pp + 8);
        pa[i][3] = *reinterpret_cast<const std::uint32_t*>(pp + 8 * PP + 8);
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        std::uint32_t bq[4];
        ldmatrix_x4_trans(bq, ct + (16 * ks + (lane % 8) + 8 * ((lane / 8) & 1)) * CROW + 64 * warp + 16 * np +
                                  8 * (lane / 16));
#pragma unroll
        for (int i = 0; i < 2 * MT; ++i) {
          mma_bf16(acc[i % MT][2 * np], pa[i], bq);
          mma_bf16(acc[i % MT][2 * np + 1], pa[i], bq + 2);
        }
      }
    }
  }
  cp_async_wait<0>();

  // ---- the slice's partial: unnormalised acc [H, d_c], (m, l) per head
  const long long slot = static_cast<long long>(b) * p.num_splits + split;
  float* wa = p.ws_acc + slot * H * DC;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int h = 16 * mt + g, col = 64 * warp + 8 * nt + 2 * cq;
      *reinterpret_cast<float2*>(wa + h * DC + col) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
      *reinterpret_cast<float2*>(wa + (h + 8) * DC + col) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
    }
  if (tid % TPH == 0) {
    float* wm = p.ws_ml + (slot * H + hs) * 2;
    wm[0] = m_run;
    wm[1] = l_run;
  }
}

/// One CTA of 128 threads per (head, sequence): a = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
template <int H>
__global__ void __launch_bounds__(128) mla_combine_kernel(SParams p) {
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int len = seq_len(p, b);
  float4* o = reinterpret_cast<float4*>(p.out + (static_cast<long long>(b) * H + h) * DC) + tid;
  if (len < 1 || len > p.max_len) {
    *o = make_float4(NAN, NAN, NAN, NAN);
    return;
  }
  const int ns = (len + p.split_len - 1) / p.split_len;
  const long long base = static_cast<long long>(b) * p.num_splits;
  float M = -INFINITY;
  for (int s = 0; s < ns; ++s) M = fmaxf(M, p.ws_ml[((base + s) * H + h) * 2]);
  float L = 0.0f;
  float4 a = make_float4(0, 0, 0, 0);
  for (int s = 0; s < ns; ++s) {
    const float w = exp2f(p.ws_ml[((base + s) * H + h) * 2] - M);
    L += w * p.ws_ml[((base + s) * H + h) * 2 + 1];
    const float4 x = reinterpret_cast<const float4*>(p.ws_acc + ((base + s) * H + h) * DC)[tid];
    a.x += w * x.x; a.y += w * x.y; a.z += w * x.z; a.w += w * x.w;
  }
  const float inv = 1.0f / L;
  *o = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
}

const char* const OP = "mla_decode";

void check_shapes(const MlaDecodeArgs& a) {
  auto fail = [](const std::string& m) { throw Error(std::string(OP) + ": " + m); };
  if (a.d_c != DC) fail("d_c = " + std::to_string(a.d_c) + " is not supported; accepted: d_c = 512");
  if (a.d_rope != 0)
    fail("d_rope = " + std::to_string(a.d_rope) +
         ": the decoupled-RoPE score part is not implemented yet; accepted: d_rope = 0 (NoPE)");
  if (a.H != 16 && a.H != 32) fail("H = " + std::to_string(a.H) + " is not supported; accepted: H = 16 or 32");
  if (a.B < 1 || a.B > 65535) fail("B = " + std::to_string(a.B) + "; accepted: 1 <= B <= 65535");
  if (a.capacity < 1) fail("capacity = " + std::to_string(a.capacity) + "; accepted: >= 1 token");
  if (a.max_len < 1 || a.max_len > a.capacity)
    fail("max_len = " + std::to_string(a.max_len) + "; accepted: 1 <= max_len <= capacity = " +
         std::to_string(a.capacity) + " (N = 0 or a context past the cache capacity)");
  if (a.num_splits < 0) fail("num_splits = " + std::to_string(a.num_splits) + "; accepted: >= 0 (0 = automatic)");
}

}  // namespace

MlaDecodePlan mla_decode_plan(const MlaDecodeArgs& a) {
  check_shapes(a);
  const int max_tiles = (a.max_len + TT - 1) / TT;
  int splits = a.num_splits;
  if (splits == 0) {
    int dev = 0, sms = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    // one CTA per SM (the split kernel needs ~180 KB of shared memory): the fewest slices per sequence
    // whose CTAs fill >= 95% of the last wave, among slices of >= MIN_SPLIT tokens; else the best fill
    const int smax = std::max(1, a.max_len / MIN_SPLIT);
    int best = 1;
    double best_eff = 0.0;
    for (int s = 1; s <= std::min(smax, 4 * ((sms + a.B - 1) / a.B)); ++s) {
      const long long ctas = static_cast<long long>(a.B) * s;
      const double eff = static_cast<double>(ctas) / (static_cast<double>((ctas + sms - 1) / sms) * sms);
      if (eff > best_eff + 1e-9) { best = s; best_eff = eff; }
      if (eff >= 0.95) break;
    }
    splits = best;
  }
  splits = std::max(1, std::min(splits, max_tiles));
  const int split_len = ((a.max_len + splits - 1) / splits + TT - 1) / TT * TT;
  MlaDecodePlan p;
  p.split_len = split_len;
  p.num_splits = (a.max_len + split_len - 1) / split_len;
  return p;
}

std::size_t mla_decode_workspace_bytes(const MlaDecodeArgs& a) {
  const MlaDecodePlan pl = mla_decode_plan(a);
  return static_cast<std::size_t>(a.B) * pl.num_splits * a.H * (DC + 2) * 4;
}

void mla_decode(const MlaDecodeArgs& a, cudaStream_t stream) {
  const MlaDecodePlan pl = mla_decode_plan(a);
  check_ptr(a.c, 16, "c");
  check_ptr(a.q_hi, 4, "q_hi");
  check_ptr(a.q_lo, 4, "q_lo");
  check_ptr(a.out, 16, "out");
  check_ptr(a.lens, 4, "lens", false);
  check_ptr(a.workspace, 16, "workspace");
  if (!std::isfinite(a.scale) || !(a.scale > 0.0f))
    throw Error(std::string(OP) + ": scale = " + std::to_string(a.scale) + "; accepted: a finite scale > 0");
  const long long sc_t = a.sc_t ? a.sc_t : DC;
  if (sc_t < DC || sc_t % 8 != 0)
    throw Error(std::string(OP) + ": sc_t = " + std::to_string(sc_t) +
                "; accepted: a multiple of 8 elements >= d_c = 512 (512: latent only; 576: [c ; k_R] rows)");
  const long long sc_b = a.sc_b ? a.sc_b : static_cast<long long>(a.capacity) * sc_t;
  if (sc_b % 8 != 0 || (a.B > 1 && sc_b < static_cast<long long>(a.capacity) * sc_t))
    throw Error(std::string(OP) + ": sc_b = " + std::to_string(sc_b) + "; accepted: a multiple of 8 elements >= capacity * sc_t = " +
                std::to_string(static_cast<long long>(a.capacity) * sc_t));
  const long long sq_b = a.sq_b ? a.sq_b : static_cast<long long>(a.H) * DC;
  if (sq_b % 2 != 0 || sq_b < static_cast<long long>(a.H) * DC)
    throw Error(std::string(OP) + ": sq_b = " + std::to_string(sq_b) + "; accepted: an even number of elements >= H * d_c = " +
                std::to_string(a.H * DC));
  const std::size_t need = static_cast<std::size_t>(a.B) * pl.num_splits * a.H * (DC + 2) * 4;
  if (a.workspace_bytes < need)
    throw Error(std::string(OP) + ": workspace_bytes = " + std::to_string(a.workspace_bytes) + "; accepted: >= " +
                std::to_string(need) + " (mla_decode_workspace_bytes)");
  SParams p{};
  p.B = a.B; p.max_len = a.max_len; p.split_len = pl.split_len; p.num_splits = pl.num_splits;
  p.lens = a.lens; p.c = a.c; p.sc_b = sc_b; p.sc_t = sc_t;
  p.q_hi = a.q_hi; p.q_lo = a.q_lo; p.sq_b = sq_b;
  p.scale_log2 = a.scale * 1.4426950408889634f;
  p.ws_acc = static_cast<float*>(a.workspace);
  p.ws_ml = p.ws_acc + static_cast<std::size_t>(a.B) * pl.num_splits * a.H * DC;
  p.out = a.out;
  const dim3 grid(pl.num_splits, a.B), cgrid(a.H, a.B);
  if (a.H == 32) {
    static bool attr = false;
    if (!attr) {
      cuda_check(cudaFuncSetAttribute(mla_split_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes<32>())), "cudaFuncSetAttribute(mla_split_kernel<32>)");
      attr = true;
    }
    mla_split_kernel<32><<<grid, NTHR, smem_bytes<32>(), stream>>>(p);
    cuda_check(cudaGetLastError(), "mla_split_kernel launch");
    mla_combine_kernel<32><<<cgrid, 128, 0, stream>>>(p);
  } else {
    static bool attr = false;
    if (!attr) {
      cuda_check(cudaFuncSetAttribute(mla_split_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes<16>())), "cudaFuncSetAttribute(mla_split_kernel<16>)");
      attr = true;
    }
    mla_split_kernel<16><<<grid, NTHR, smem_bytes<16>(), stream>>>(p);
    cuda_check(cudaGetLastError(), "mla_split_kernel launch");
    mla_combine_kernel<16><<<cgrid, 128, 0, stream>>>(p);
  }
  cuda_check(cudaGetLastError(), "mla_combine_kernel launch");
}

}  // namespace kdalab::kernels
