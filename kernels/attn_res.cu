// Block Attention Residuals over a batch of tokens (kernels/attn_res.hpp): one or a few tokens per CTA, the
// sources streamed once through registers with an online softmax over them.
//
// Thread j of the CTA owns the 16-byte vectors j, j + NT, .., j + (VPT - 1) NT of every source row
// (coalesced: consecutive threads read consecutive 16 bytes); w sits in shared memory. Per source: convert the 8 VPT bf16 to
// fp32, sum h^2 and w h, reduce the two sums over the CTA (warp shuffles, then one shared-memory
// exchange of double-buffered slots: one __syncthreads per source), z = w.h / sqrt(h.h / d + eps),
// then the running (m, l, acc) update with one exponential and one FMA an element: where z > m, acc = acc e^(m - z) + h,
// l = l e^(m - z) + 1 and m = z; else acc = acc + h e^(z - m) and l = l + e^(z - m) (the same softmax as
// m' = max(m, z), acc = acc e^(m - m') + h e^(z - m'), whose other factor is exactly 1). The source rows arrive by bulk copies (cp.async.bulk, one per row, issued by thread 0)
// into a ring of NS row buffers in shared memory, each with an mbarrier that counts the bytes; NS - 1 rows are in
// flight while one is reduced, without registers held for them. NS is the rule's 3, a compile-time constant, or
// (AttnResArgs::ring_depth, 2 .. 8) a count read from the parameters by separate kernels (NSC = 0 below), so that the
// rule's kernels keep their code while deeper rings can be timed. The depth changes no sum's order: every depth gives
// the same output bit for bit. VPT is the rule's ceil(d / 2048) or AttnResArgs::vectors_per_thread (fewer threads a
// token: fewer of the per-source reductions and updates, which bound the issue rate at d = 2304).
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/attn_res.hpp"
#include "kernels/attn_res_limits.hpp"
#include "kernels/common/kda_math.cuh"
#include "kernels/common/mbarrier.cuh"

namespace kdalab::kernels {

namespace {
using namespace detail;

constexpr int MAX_VPT = attn_res_max_vpt;
constexpr int NS_RULE = attn_res_ring_depth_rule;  // row buffers of the ring by the rule (ring_depth 0)
constexpr int MAX_NS = attn_res_ring_depth_max;     // the size of full[] in the kernels of a run-time depth
constexpr int MAX_D = 16384;
// the kernels' static shared memory (red and full[] up to the 128-byte alignment of the dynamic array) and what is left
// for the dynamic part, the pseudo-query and the ring: 4 d + 2 d NS bytes must fit (kernels/attn_res_limits.hpp)
constexpr int SMEM_STATIC = attn_res_smem_static;
constexpr int SMEM_DYN_MAX = attn_res_smem_dyn_max;
static_assert((2 * 2 * 32 * 4 + MAX_NS * 8 + 127) / 128 * 128 == SMEM_STATIC,
              "kernels/attn_res_limits.hpp states the kernels' static shared memory");

// the mbarrier and bulk-copy steps of the ring: kernels/common/mbarrier.cuh
namespace mb = detail::mbar;
constexpr int MAX_THREADS = attn_res_max_threads;  // VPT >= attn_res_vectors_per_thread_rule(d) keeps the CTA at <= 256 threads

struct AParams {
  int T, S, d, nvec;
  const bf16_t* src;
  long long s_src, s_tok;
  const float* w;
  float eps;
  const float *m_in, *l_in, *acc_in;
  float *m_out, *l_out, *acc_out;
  bf16_t* out;
  float* out_f32;
  int ns;  // row buffers of the ring, read by the kernels of a run-time depth (NSC = 0) only; last, so that the
           // fields above keep the offsets of the rule's kernels
};

/// MULTI: the CTA takes tokens blockIdx.x + jt gridDim.x in turn; else its one token blockIdx.x (the loop over tokens
/// compiles away, and with it the registers it holds: at d = 7168, 93 against 99, the difference between three CTAs
/// an SM and two).
/// NSC: the ring's depth NS as a compile-time constant (NS_RULE: the rule's kernels), or 0: NS = p.ns (2 .. MAX_NS),
/// the slot and phase of a use then divided by a run-time count (the rule's depth through such a kernel measured +1.4
/// to +11% on the H100: docs/kernels/attn_res.md, "The ring's depth").
template <int VPT, bool MULTI, int NSC>
__global__ void __launch_bounds__(MAX_THREADS) attn_res_kernel(AParams p) {
  const int tid = threadIdx.x, NT = blockDim.x;
  const int lane = tid % 32, warp = tid / 32;
  const int NS = NSC > 0 ? NSC : p.ns;  // row buffers of the ring
  __shared__ float red[2][2][32];  // [parity][sum h^2 | sum w h][warp]; the reads take warps 0 .. 7
  __shared__ std::uint64_t full[NSC > 0 ? NSC : MAX_NS];  // full[s]: row buffer s holds its source
  static_assert(sizeof(red) + sizeof(full) <= SMEM_STATIC, "the host's shared-memory bound counts these arrays");

  bool ok[VPT];
  int vi[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    vi[j] = tid + j * NT;
    ok[j] = vi[j] < p.nvec;
  }
  // pseudo-query in shared memory (registers are kept for acc and the in-flight loads)
  // then the ring of NS source rows (bf16, d each)
  extern __shared__ __align__(128) float wsh[];
  uint4* ring = reinterpret_cast<uint4*>(wsh + p.d);
  for (int v = tid; v < p.nvec * 2; v += NT) reinterpret_cast<float4*>(wsh)[v] = reinterpret_cast<const float4*>(p.w)[v];
  // the CTA's tokens t_jt = blockIdx.x + jt gridDim.x, jt = 0 .. ntok - 1, in turn; the ring runs on across them:
  // use u = jt S + i (< 2^31: the host bounds tokens_per_cta S) is source i of token t_jt, in row buffer u % NS
  const int ntok =
      MULTI ? (p.T - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x) : 1;
  const unsigned row_bytes = static_cast<unsigned>(p.d) * 2u;
  // the copy of source i of the jt-th token into row buffer `slot` (thread 0)
  const auto issue = [&](int slot, int jt, int i) {
    const long long t = static_cast<long long>(blockIdx.x) + static_cast<long long>(jt) * gridDim.x;
    mb::bulk_copy(ring + slot * p.nvec, p.src + t * p.s_tok + i * p.s_src, row_bytes, &full[slot]);
  };
  // thread 0's cursor (nj, ni): the next use to copy, NS ahead of the one being reduced
  int nj = 0, ni = 0;
  const auto issue_next = [&](int slot) {
    if (nj >= ntok) return;
    issue(slot, nj, ni);
    if (++ni == p.S) {
      ni = 0;
      ++nj;
    }
  };
  if (tid < 2 * 2 * 8) red[tid / 16][(tid / 8) % 2][tid % 8] = 0.0f;  // the slots of warps the CTA may not have
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < NS; ++s) mb::init(&full[s], 1);
    mb::init_fence();
    if constexpr (MULTI)
      for (int s = 0; s < NS; ++s) issue_next(s);
    else
      for (int s = 0; s < NS && s < p.S; ++s) issue(s, 0, s);
  }
  __syncthreads();
  const float inv_d = 1.0f / static_cast<float>(p.d);
  for (int jt = 0; jt < ntok; ++jt) {
    const int t = static_cast<int>(blockIdx.x) + jt * static_cast<int>(gridDim.x);
    // running softmax partial (m, l, acc), from partial_in when given
    float m = -INFINITY, l = 0.0f;
    float acc[VPT][8];
    const long long trow = static_cast<long long>(t) * p.d;
    if (p.acc_in) {
      m = p.m_in[t];
      l = p.l_in[t];
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        if (ok[j]) {
          const float4 a = reinterpret_cast<const float4*>(p.acc_in + trow)[2 * vi[j]];
          const float4 b = reinterpret_cast<const float4*>(p.acc_in + trow)[2 * vi[j] + 1];
          acc[j][0] = a.x; acc[j][1] = a.y; acc[j][2] = a.z; acc[j][3] = a.w;
          acc[j][4] = b.x; acc[j][5] = b.y; acc[j][6] = b.z; acc[j][7] = b.w;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[j][e] = 0.0f;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < VPT; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[j][e] = 0.0f;
    }

    for (int i = 0; i < p.S; ++i) {
      const int u = jt * p.S + i, slot = u % NS;
      mb::wait(&full[slot], static_cast<unsigned>(u / NS) & 1u);
      uint4 cur[VPT];
#pragma unroll
      for (int j = 0; j < VPT; ++j) cur[j] = ok[j] ? ring[slot * p.nvec + vi[j]] : make_uint4(0, 0, 0, 0);
      float h[VPT][8];
      float ss = 0.0f, dw = 0.0f;
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        unpack8(cur[j], h[j]);
        // a vector past the row reads w as 0 (its h is 0): one branch-free pass for both sums
        const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 w0 = ok[j] ? reinterpret_cast<const float4*>(wsh)[2 * vi[j]] : z4;
        const float4 w1 = ok[j] ? reinterpret_cast<const float4*>(wsh)[2 * vi[j] + 1] : z4;
        const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          ss = fmaf(h[j][e], h[j][e], ss);
          dw = fmaf(wv[e], h[j][e], dw);
        }
      }
#pragma unroll
      for (int o = 16; o >= 1; o >>= 1) {
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
        dw += __shfl_xor_sync(0xffffffffu, dw, o);
      }
      const int par = u & 1;  // alternates across tokens too
      if (lane == 0) {
        red[par][0][warp] = ss;
        red[par][1][warp] = dw;
      }
      __syncthreads();  // also: every thread has read row buffer `slot`, which the copy of use u + NS may now fill
      if constexpr (MULTI) {
        if (tid == 0) issue_next(slot);
      } else if (tid == 0 && i + NS < p.S) {
        issue(slot, 0, i + NS);
      }
      // the warps' partial sums in warp order; slots past the CTA's warps hold 0 (set before the first barrier), so the
      // eight reads need no loop over a run-time count and add nothing
      ss = 0.0f;
      dw = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        ss += red[par][0][k];
        dw += red[par][1][k];
      }
      const float z = dw / sqrtf(ss * inv_d + p.eps);
      // one exponential and one FMA an element: a new maximum rescales acc and l by c = e^(m - z) and adds h with
      // weight 1; otherwise acc and l keep their scale (c = 1) and h comes in with weight e^(z - m). z is the same in
      // every thread, so the branch is uniform. m = -inf (no source yet): c = 0
      if (z > m) {
        const float c = expf(m - z);
        l = fmaf(l, c, 1.0f);
#pragma unroll
        for (int j = 0; j < VPT; ++j)
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[j][k] = fmaf(acc[j][k], c, h[j][k]);
        m = z;
      } else {
        const float e = expf(z - m);
        l += e;
#pragma unroll
        for (int j = 0; j < VPT; ++j)
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[j][k] = fmaf(h[j][k], e, acc[j][k]);
      }
    }

    if (p.acc_out) {
      if (tid == 0) {
        p.m_out[t] = m;
        p.l_out[t] = l;
      }
#pragma unroll
      for (int j = 0; j < VPT; ++j)
        if (ok[j]) {
          float4* o = reinterpret_cast<float4*>(p.acc_out + trow) + 2 * vi[j];
          o[0] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
          o[1] = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
        }
    }
    const float inv = 1.0f / l;
    if (p.out_f32) {
#pragma unroll
      for (int j = 0; j < VPT; ++j)
        if (ok[j]) {
          float4* o = reinterpret_cast<float4*>(p.out_f32 + trow) + 2 * vi[j];
          o[0] = make_float4(acc[j][0] * inv, acc[j][1] * inv, acc[j][2] * inv, acc[j][3] * inv);
          o[1] = make_float4(acc[j][4] * inv, acc[j][5] * inv, acc[j][6] * inv, acc[j][7] * inv);
        }
    }
    if (p.out) {
#pragma unroll
      for (int j = 0; j < VPT; ++j)
        if (ok[j]) {
          uint4 u;
          u.x = pack_bf16(acc[j][0] * inv, acc[j][1] * inv);
          u.y = pack_bf16(acc[j][2] * inv, acc[j][3] * inv);
          u.z = pack_bf16(acc[j][4] * inv, acc[j][5] * inv);
          u.w = pack_bf16(acc[j][6] * inv, acc[j][7] * inv);
          reinterpret_cast<uint4*>(p.out + trow)[vi[j]] = u;
        }
    }
  }
}

const char* const OP = "attn_res";

[[noreturn]] void fail(const std::string& m) { throw Error(std::string(OP) + ": " + m); }

void check_pointer(const void* ptr, std::size_t align, const char* name) {
  const auto off = reinterpret_cast<std::uintptr_t>(ptr) % align;
  if (off != 0)
    fail(std::string("pointer '") + name + "' is not " + std::to_string(align) + "-byte aligned (address % " +
         std::to_string(align) + " = " + std::to_string(off) + "); accepted: " + std::to_string(align) +
         "-byte aligned device pointers");
}

/// 0 = none given, 1 = all three given; a mix is an error.
bool check_partial(const AttnResPartial& q, const char* name) {
  const int n = (q.m != nullptr) + (q.l != nullptr) + (q.acc != nullptr);
  if (n == 0) return false;
  if (n != 3)
    fail(std::string(name) + " has " + std::to_string(n) + " of its 3 pointers (m, l, acc) set; accepted: all three or none");
  check_pointer(q.m, 4, (std::string(name) + ".m").c_str());
  check_pointer(q.l, 4, (std::string(name) + ".l").c_str());
  check_pointer(q.acc, 16, (std::string(name) + ".acc").c_str());
  return true;
}

/// The most dynamic shared memory the kernels of ring depth NSC may take: the rule's depth at the largest d (10 MAX_D
/// bytes); a run-time depth (NSC = 0): all that the opt-in limit leaves, which attn_res checks 4 d + 2 d ring_depth
/// against.
template <int NSC>
constexpr int smem_attr() {
  return NSC > 0 ? MAX_D * (4 + 2 * NSC) : SMEM_DYN_MAX;
}
static_assert(smem_attr<NS_RULE>() <= SMEM_DYN_MAX, "the rule's ring fits at every d");

template <int VPT, bool MULTI, int NSC>
void launch_form(const AParams& p, int threads, int smem, long long grid, cudaStream_t stream) {
  static bool attr = false;  // once per instantiation (so that a call inside graph capture sets nothing)
  if (!attr && smem > 48 * 1024) {
    cuda_check(cudaFuncSetAttribute(attn_res_kernel<VPT, MULTI, NSC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem_attr<NSC>()),
               "cudaFuncSetAttribute(attn_res_kernel)");
    attr = true;
  }
  attn_res_kernel<VPT, MULTI, NSC><<<static_cast<unsigned>(grid), threads, smem, stream>>>(p);
}

/// Launches T / tokens_per_cta CTAs (rounded up); tokens_per_cta = 0: the rule (attn_res_tokens_per_cta), which
/// counts the CTAs of the one-token form of this ring depth an SM holds. NSC: as attn_res_kernel (0: p.ns rows).
template <int VPT, int NSC>
void launch(const AParams& p, int threads, int tokens_per_cta, cudaStream_t stream) {
  // the pseudo-query (fp32) and the ring of NS bf16 rows: 10 d bytes for the rule's 3
  const int smem = p.d * 4 + (NSC > 0 ? NSC : p.ns) * p.d * 2;
  // d <= 4096 (VPT <= 2): one token a CTA. Measured on the H100 (docs/kernels/attn_res.md, "Version 3"): at d = 7168
  // four tokens a CTA are 3% faster than one, at d = 2304 several are 7% slower
  if (tokens_per_cta == 0 && VPT <= 2) tokens_per_cta = 1;
  if (tokens_per_cta == 0) {
    static int resident = 0, resident_smem = -1;  // the last d's resident CTAs (occupancy queries: no stream work)
    if (resident_smem != smem) {
      if (smem > 48 * 1024)
        cuda_check(cudaFuncSetAttribute(attn_res_kernel<VPT, false, NSC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        smem_attr<NSC>()),
                   "cudaFuncSetAttribute(attn_res_kernel)");
      int dev = 0, sms = 0, per_sm = 0;
      cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
      cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SM count)");
      cuda_check(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attn_res_kernel<VPT, false, NSC>, threads, smem),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor(attn_res_kernel)");
      resident = std::max(1, per_sm) * sms;
      resident_smem = smem;
    }
    tokens_per_cta = attn_res_tokens_per_cta(p.T, resident);
  }
  const long long grid = (static_cast<long long>(p.T) + tokens_per_cta - 1) / tokens_per_cta;
  if (tokens_per_cta == 1)
    launch_form<VPT, false, NSC>(p, threads, smem, grid, stream);
  else
    launch_form<VPT, true, NSC>(p, threads, smem, grid, stream);
}

/// The kernels of VPT = vpt vectors a thread and ring depth NSC.
template <int NSC>
void launch_vpt(int vpt, const AParams& p, int threads, int tokens_per_cta, cudaStream_t stream) {
  switch (vpt) {
    case 1: launch<1, NSC>(p, threads, tokens_per_cta, stream); break;
    case 2: launch<2, NSC>(p, threads, tokens_per_cta, stream); break;
    case 3: launch<3, NSC>(p, threads, tokens_per_cta, stream); break;
    case 4: launch<4, NSC>(p, threads, tokens_per_cta, stream); break;
    case 5: launch<5, NSC>(p, threads, tokens_per_cta, stream); break;
    case 6: launch<6, NSC>(p, threads, tokens_per_cta, stream); break;
    case 7: launch<7, NSC>(p, threads, tokens_per_cta, stream); break;
    default: launch<8, NSC>(p, threads, tokens_per_cta, stream); break;
  }
}

}  // namespace

int attn_res_tokens_per_cta(int T, int resident) {
  // about two waves of CTAs over the resident slots, at most 4 tokens a CTA
  const long long per = static_cast<long long>(T) / (2LL * std::max(1, resident));
  return static_cast<int>(std::clamp<long long>(per, 1, 4));
}

void attn_res(const AttnResArgs& a, cudaStream_t stream) {
  if (a.T < 1) fail("T = " + std::to_string(a.T) + "; accepted: T >= 1 token");
  if (a.S < 1) fail("S = " + std::to_string(a.S) + "; accepted: S >= 1 source (the embedding h_0 is always one)");
  if (a.d < 8 || a.d % 8 != 0 || a.d > MAX_D)
    fail("d = " + std::to_string(a.d) + "; accepted: a multiple of 8 with 8 <= d <= 16384");
  if (!a.src) fail("pointer 'src' is null; a device pointer is required");
  if (!a.w) fail("pointer 'w' (pseudo-query) is null; a device pointer is required");
  check_pointer(a.src, 16, "src");
  check_pointer(a.w, 16, "w");
  if (a.out) check_pointer(a.out, 16, "out");
  if (a.out_f32) check_pointer(a.out_f32, 16, "out_f32");
  const bool pin = check_partial(a.partial_in, "partial_in");
  const bool pout = check_partial(a.partial_out, "partial_out");
  if (!a.out && !a.out_f32 && !pout) fail("no output: set out, out_f32 or partial_out");
  if (!std::isfinite(a.eps) || a.eps < 0.0f) fail("eps = " + std::to_string(a.eps) + "; accepted: a finite eps >= 0");
  if (a.tokens_per_cta < 0 || static_cast<long long>(a.tokens_per_cta) * a.S >= (1LL << 31))
    fail("tokens_per_cta = " + std::to_string(a.tokens_per_cta) + " with S = " + std::to_string(a.S) +
         "; accepted: 0 (the rule) or a count >= 1 with tokens_per_cta S < 2^31");
  if (a.ring_depth != 0 && (a.ring_depth < 2 || a.ring_depth > MAX_NS))
    fail("ring_depth = " + std::to_string(a.ring_depth) + "; accepted: 0 (the rule: " + std::to_string(NS_RULE) +
         " row buffers) or 2 .. " + std::to_string(MAX_NS) + " row buffers");
  const int ns = a.ring_depth ? a.ring_depth : NS_RULE;
  const long long smem = 4LL * a.d + 2LL * ns * a.d;  // the pseudo-query (fp32) and the ring of ns bf16 rows
  if (smem > SMEM_DYN_MAX)
    fail("ring_depth = " + std::to_string(ns) + " with d = " + std::to_string(a.d) + " needs " + std::to_string(smem) +
         " bytes of shared memory (4 d + 2 d ring_depth); accepted: at most " + std::to_string(SMEM_DYN_MAX) +
         " (227 KB less the kernel's " + std::to_string(SMEM_STATIC) + " static bytes), ring_depth <= " +
         std::to_string((SMEM_DYN_MAX - 4LL * a.d) / (2LL * a.d)) + " at this d");
  const long long s_tok = a.s_tok ? a.s_tok : a.d;
  if (s_tok < a.d || s_tok % 8 != 0)
    fail("s_tok = " + std::to_string(s_tok) + "; accepted: a multiple of 8 elements >= d = " + std::to_string(a.d));
  const long long s_src = a.s_src ? a.s_src : static_cast<long long>(a.T) * s_tok;
  if (s_src < 0 || s_src % 8 != 0)
    fail("s_src = " + std::to_string(s_src) + "; accepted: a non-negative multiple of 8 elements");
  const int nvec = a.d / 8;
  const int vpt_rule = attn_res_vectors_per_thread_rule(a.d);  // the fewest vectors a thread at <= 256 threads
  if (a.vectors_per_thread != 0 && (a.vectors_per_thread < vpt_rule || a.vectors_per_thread > MAX_VPT))
    fail("vectors_per_thread = " + std::to_string(a.vectors_per_thread) + " with d = " + std::to_string(a.d) +
         "; accepted: 0 (the rule: " + std::to_string(vpt_rule) + ") or " + std::to_string(vpt_rule) + " .. " +
         std::to_string(MAX_VPT) + " at this d (ceil(d / 2048) .. 8)");
  const int vpt = a.vectors_per_thread ? a.vectors_per_thread : vpt_rule;
  const int threads = ((nvec + vpt - 1) / vpt + 31) / 32 * 32;
  if (vpt > MAX_VPT || threads > MAX_THREADS) fail("d = " + std::to_string(a.d) + " needs too many registers; accepted: d <= 16384");
  AParams p{};
  p.T = a.T; p.S = a.S; p.d = a.d; p.nvec = nvec;
  p.src = a.src; p.s_src = s_src; p.s_tok = s_tok; p.w = a.w; p.eps = a.eps;
  if (pin) { p.m_in = a.partial_in.m; p.l_in = a.partial_in.l; p.acc_in = a.partial_in.acc; }
  if (pout) { p.m_out = a.partial_out.m; p.l_out = a.partial_out.l; p.acc_out = a.partial_out.acc; }
  p.out = a.out;
  p.out_f32 = a.out_f32;
  p.ns = ns;
  // the rule's depth runs the kernels with the depth compiled in (no division by a run-time count on the default
  // path), any other depth the kernels that read it from p.ns
  if (ns == NS_RULE)
    launch_vpt<NS_RULE>(vpt, p, threads, a.tokens_per_cta, stream);
  else
    launch_vpt<0>(vpt, p, threads, a.tokens_per_cta, stream);
  cuda_check(cudaGetLastError(), "attn_res_kernel launch");
}

}  // namespace kdalab::kernels
