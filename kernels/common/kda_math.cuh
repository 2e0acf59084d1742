#pragma once
// Device helpers shared by the KDA, MLA and AttnRes kernels, one copy each: bf16 and fp16 packing, mma.sync m16n8k16 (bf16 in,
// fp32 accumulate) and m16n8k8 (tf32 in, fp32 accumulate; hi/lo splits) by inline PTX, cp.async, ldmatrix; the fused
// KDA input transforms (K3 gate, L2Norm factor, beta sigmoid; docs/equations.md); and the host-side checks of the KDA
// arguments (D, gate). Generic pointer / stride checks and cuda_check: kernels/common/cuda_check.hpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common/cuda_check.hpp"
#include "kernels/kda.hpp"

namespace kdalab::kernels::detail {

__device__ __forceinline__ float bf2f(std::uint16_t b) { return __uint_as_float(static_cast<std::uint32_t>(b) << 16); }

/// Two floats -> one 32-bit register of two bf16 (RNE); `lo` in the low half (first element).
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

/// Splits two floats into bf16 hi parts and bf16 lo parts (x ~ hi + lo to ~2^-16 relative).
__device__ __forceinline__ void split_bf16(float x0, float x1, std::uint32_t& hi, std::uint32_t& lo) {
  hi = pack_bf16(x0, x1);
  const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
  lo = pack_bf16(x0 - h0, x1 - h1);
}

/// Packs two floats as fp16 (round to nearest even; magnitudes above 65504 become Inf): low half = first argument.
__device__ __forceinline__ std::uint32_t pack_f16(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

/// Splits two floats into fp16 hi parts and e4m3 lo parts of (x - hi) 2^shift, round to nearest even, saturating
/// (numerics/kda_twin.hpp KdaTwinPlan::kd_lo_e4m3): lo8 holds x0's byte low, x1's high.
template <int shift>
__device__ __forceinline__ void split_f16_e4m3(float x0, float x1, std::uint32_t& hi, std::uint16_t& lo8) {
  const __half2 h = __floats2half2_rn(x0, x1);
  hi = *reinterpret_cast<const std::uint32_t*>(&h);
  const float2 hf = __half22float2(h);
  constexpr float s = static_cast<float>(1u << shift);
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo8) : "f"((x1 - hf.y) * s), "f"((x0 - hf.x) * s));
}

/// Unpacks 8 bf16 held in a uint4 into floats.
__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

/// D = A B + D for one m16n8k16 tile: A 16x16 bf16 (row), B 16x8 bf16 (col), D 16x8 fp32.
__device__ __forceinline__ void mma_bf16(float* d, const std::uint32_t* a, const std::uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// Unpacks 4 bf16 held in a uint2 into floats.
__device__ __forceinline__ void unpack4(const uint2& u, float* f) {
  f[0] = __uint_as_float(u.x << 16);
  f[1] = __uint_as_float(u.x & 0xffff0000u);
  f[2] = __uint_as_float(u.y << 16);
  f[3] = __uint_as_float(u.y & 0xffff0000u);
}

/// Splits finite x into tf32 hi + lo, the operands of the 3-pass fp32-class product a b ~ a_hi b_hi + a_hi b_lo +
/// a_lo b_hi (the dropped a_lo b_lo is <= 2^-22 relative). hi = x rounded to tf32 with cvt.rna's rule (nearest, ties
/// away from zero) done on the bit pattern: + 2^12 then clear the 13 low bits (two integer instructions instead of
/// cvt.rna's sequence with its FSETP checks in the SASS; same result for finite |x| < FLT_MAX). lo = x - hi (exact in
/// fp32) is passed as its raw fp32 bits, assuming the tensor core ignores a tf32 operand's 13 low bits, i.e.
/// truncates lo (<= 2^-10 |lo| <= 2^-21 |x|; rounding lo with cvt.rna would give <= 2^-22 |x|). Consistent with the
/// H200 measurement: the prepare's A / P slots stayed within 3.3e-7 of fp32 FMA products
/// (docs/kernels/kda_prefill.md).
__device__ __forceinline__ void split_tf32(float x, std::uint32_t& hi, std::uint32_t& lo) {
  hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

/// D = A B + D for one m16n8k8 tile: A 16x8 tf32 (row), B 8x8 tf32 (col), D 16x8 fp32. Fragments
/// (g = lane / 4, t = lane % 4): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4);
/// b0 (k = t, n = g), b1 (k = t + 4, n = g); d0, d1 (g, 2t + {0, 1}), d2, d3 (g + 8, 2t + {0, 1}).
__device__ __forceinline__ void mma_tf32(float* d, const std::uint32_t* a, const std::uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
/// cp.async of 16 bytes with a source size: src_bytes = 0 fills the 16 bytes with zeros and reads nothing.
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
/// cp.async of 4 bytes (4-byte aligned source) with a source size: src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async4_zfill(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
/// Four transposed 8x8 bf16 matrices from shared memory (mma B fragments from a row-major tile).
__device__ __forceinline__ void ldsm_x4_trans(std::uint32_t* r, const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
/// Two consecutive bf16 values (4-byte aligned) as one 32-bit word.
__device__ __forceinline__ std::uint32_t ld32(const std::uint16_t* p) { return *reinterpret_cast<const std::uint32_t*>(p); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/// exp(x) in fp32 as ex2.approx.ftz(x log2 e) (__expf: MUFU.EX2 and one FMUL). Error (CUDA Math API, __expf): <= 2 +
/// floor(1.173 |x|) ulp, from the rounding of x log2 e; results below 2^-126 flush to 0. In the KDA prepare the cumulative
/// decay exp(G), G >= 16 g_min = -80, has <= ~95 ulp (5.7e-6 relative) at the deepest decay and <= 3 ulp for |G| <= 1:
/// the same order as the fp32 rounding of the cumulative sum G itself (16 additions, ~|G| 2^-24 each).
__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }
/// 2^x in fp32 as one MUFU.EX2 (ex2.approx.ftz: <= 2 ulp; results below 2^-126 flush to 0; 2^-inf = 0). exp2f() adds a
/// range test and two predicated multiplies per call to keep results in the subnormal range, which a softmax weight
/// below 2^-126 of its row's largest does not need.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
/// Sigmoid(x) = 1 / (1 + exp(-x)) in fp32: fast_exp and a fast reciprocal (__fdividef, <= 2 ulp;
/// 0 when exp(-x) overflows, i.e. x < -88.7, where the true value is < 3e-39), instead of the IEEE division,
/// which took ~25 SASS instructions per gate element with its slow-path branch (ncu of the prepare: this change and
/// the other instruction cuts took it from 415.5 M to 365.9 M instructions at T = 8192, H = 64); exp(-x) by fast_exp
/// (above) instead of the accurate expf (8 SASS instructions -> 2). Error: <= ~3 ulp
/// plus fast_exp's <= 1.2 |x| ulp of exp(-x), which moves Sigmoid by <= 1.2 |x| (1 - Sigmoid) ulp: ~1e-6 relative for
/// the gate's |x| <~ 10, three orders below the bf16 operand roundings (docs/kernels/kda_prefill.md, "Prepare v6
/// instruction diet").
__device__ __forceinline__ float sigmoidf_(float x) { return __fdividef(1.0f, 1.0f + fast_exp(-x)); }

// ---- the fused input transforms, one copy for the prefill and the decode kernels --------------
/// K3 bounded gate (K3 report Eq. 5): g = g_min Sigmoid(exp(A_log) (g_raw + bias)); ea = expf(A_log).
__device__ __forceinline__ float k3_gate(float g_raw, float ea, float bias, float g_min) {
  return g_min * sigmoidf_(ea * (g_raw + bias));
}
/// The fused L2Norm's factor 1 / ||x|| from the squared norm n2 (0 for a zero vector): rsqrtf (MUFU.RSQ,
/// <= 2 ulp) instead of the IEEE sqrt and division (two roundings, two slow-path branches).
__device__ __forceinline__ float inv_l2norm(float n2) { return n2 > 0 ? rsqrtf(n2) : 0.0f; }
/// The power-of-two scale s of a second L2Norm pass, for a row whose squared norm n2 left [2^-100, 2^100]: squares
/// that overflowed fp32 (|x| >~ 2^63 gives n2 = inf, so x / ||x|| = 0) or lost their bits to underflow (|x| <~ 2^-63;
/// n2 = 0 below ~2^-75, so the row would vanish). Then 1 / ||x|| = s / ||s x||, exact since s is a power of two:
/// s = 2^-80 above (bf16's largest |x| ~2^128 gives squares <= 2^96), 2^80 below (its smallest, 2^-133, gives
/// 2^-106). 1 inside the range, so ordinary rows keep their bits (the second pass never runs for them).
__device__ __forceinline__ float l2norm_rescale(float n2) {
  return n2 > 0x1p100f ? 0x1p-80f : (n2 < 0x1p-100f ? 0x1p80f : 1.0f);
}
/// beta from its input: Sigmoid(beta_raw) when the beta sigmoid is fused, else the input itself.
__device__ __forceinline__ float beta_of(float b, bool fused_sigmoid) { return fused_sigmoid ? sigmoidf_(b) : b; }

// ---- host-side checks -------------------------------------------------------------------------
/// D = d_k = d_v of the KDA kernels: 64, 128 or 256; anything else throws kdalab::Error naming `op` and D.
inline void check_dim(int D, const char* op) {
  if (D != 64 && D != 128 && D != 256)
    throw Error(std::string(op) + ": D = " + std::to_string(D) +
                " is not supported; accepted: D = d_k = d_v in {64, 128, 256}");
}
/// Element strides of a [B, T, heads, Dl] tensor (or [B, T, heads] with Dl = 1) with the fields left 0 filled in
/// as the contiguous default: h = Dl, t = heads h, b = T t (each from the one inside it, as given or filled in).
inline Strides resolve_strides(Strides s, long long T, long long heads, long long Dl) {
  if (s.h == 0) s.h = Dl;
  if (s.t == 0) s.t = heads * s.h;
  if (s.b == 0) s.b = T * s.t;
  return s;
}
/// Checks the resolved strides of tensor `name` are positive multiples of 8 elements (16-byte rows of bf16), inner
/// first (h, t, b): a field left 0 is derived from the one inside it, so a bad h or t must be named as itself, not as
/// the outer stride made from it. Throws kdalab::Error naming name.h / .t / .b.
inline void check_strides(const Strides& s, const char* name) {
  check_stride(s.h, 8, (std::string(name) + ".h").c_str());
  check_stride(s.t, 8, (std::string(name) + ".t").c_str());
  check_stride(s.b, 8, (std::string(name) + ".b").c_str());
}
/// The resolved strides of a KDA call's inputs q, k [B, T, H, D], v, g [B, T, HV, D], beta [B, T, HV] (the members
/// sq, sk, sv, sg, sbeta of KdaPrefillArgs and KdaBackwardArgs), q, k, v, g checked in that order (check_strides).
struct KdaInputStrides {
  Strides q, k, v, g, beta;
};
template <class Args>
KdaInputStrides resolve_input_strides(const Args& a, int D) {
  KdaInputStrides s{resolve_strides(a.sq, a.T, a.H, D), resolve_strides(a.sk, a.T, a.H, D),
                    resolve_strides(a.sv, a.T, a.HV, D), resolve_strides(a.sg, a.T, a.HV, D),
                    resolve_strides(a.sbeta, a.T, a.HV, 1)};
  for (auto [st, name] : {std::pair{s.q, "q"}, {s.k, "k"}, {s.v, "v"}, {s.g, "g"}}) check_strides(st, name);
  return s;
}
inline void check_gate(const KdaGate& g, int HV, const char* op) {
  if (g.fused) {
    check_ptr(g.A_log, 4, "gate.A_log");
    check_ptr(g.bias, 16, "gate.bias");
    if (!(g.g_min < 0.0f))
      throw Error(std::string(op) + ": gate.g_min = " + std::to_string(g.g_min) + "; accepted: g_min < 0");
    if (!(g.g_min >= -5.0f) && !g.allow_unsafe_range)
      throw Error(std::string(op) + ": gate.g_min = " + std::to_string(g.g_min) +
                  " is below -5: exp of a 16-token cumulative decay can leave the fp32 range; accepted: -5 <= g_min < 0, "
                  "or set gate.allow_unsafe_range (decay-range experiment only)");
  } else if (!g.allow_unsafe_range) {
    throw Error(std::string(op) +
                ": gate.fused = false reads g as given, whose range the kernel cannot check; accepted: gate.fused = true, "
                "or gate.fused = false with gate.allow_unsafe_range (the caller guarantees -5 <= g <= 0)");
  }
  (void)HV;
}

}  // namespace kdalab::kernels::detail
