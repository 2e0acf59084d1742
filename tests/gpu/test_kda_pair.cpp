// The two-chunk ("pair") KDA prefill step (KdaPrefillArgs::pair_chunks, kernels/kda_pair.cu) on the GPU: against
// the float64 recurrence (reference/kda.hpp) beside the one-chunk default kernel on the same inputs, its workspace
// slot against a float64 computation of the pair specification (bench/NOTES.md "KDA pair step (kernel)"), varlen,
// prefill-then-decode, bad input. Fresh seeded anchor-kda inputs, outputs and workspace poisoned (NaN) before every
// run. Tag [pair]; [pair][long] = T = 65536, H = 32. Every case prints its numbers (one run gives the lead all).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "numerics/kda_twin.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/kda.hpp"
#include "tests/catch.hpp"
#include "tests/gpu/kda_gpu_util.hpp"

using namespace kdalab;
using namespace kda_gpu;

namespace {

constexpr std::size_t Dm = 128;  // the pair step's first version: D = 128 only

std::uint64_t fresh_seed() {
  static std::uint64_t s = 20261206;
  return ++s;
}

/// The pair kernel's bound against float64: within tol::kda_pair_vs_default of the one-chunk kernel's error on the
/// same inputs, or of `floor` (the goal) where the one-chunk kernel is below it.
double pair_bound(double e_default, double floor) {
  return (1.0 + tol::kda_pair_vs_default.value) * std::max(e_default, floor);
}

/// The one-chunk default prefill (r1) and the pair step (r2) on the same arguments `a`, their errors against the
/// float64 truth `ref` (pair: mo, ms; one-chunk: mo1, ms1) and against each other (d_o, d_s, relative RMS).
struct PairVsDefault {
  PrefillResult r1, r2;
  ErrorMetrics mo, ms, mo1, ms1;
  double d_o, d_s;
};
PairVsDefault run_pair_vs_default(kernels::KdaPrefillArgs a, const KdaInputs& in, const KdaOutput<double>& ref) {
  const std::size_t no = in.B * in.T * in.HV * Dm, ns = in.B * in.HV * Dm * Dm;
  PairVsDefault x;
  x.r1 = run_prefill(a, no, ns);
  a.pair_chunks = true;
  x.r2 = run_prefill(a, no, ns);
  x.mo = compare(x.r2.o, ref.o.data);
  x.ms = compare(x.r2.S, ref.S_final.data);
  x.mo1 = compare(x.r1.o, ref.o.data);
  x.ms1 = compare(x.r1.S, ref.S_final.data);
  x.d_o = compare(x.r2.o, x.r1.o).rel_rms;
  x.d_s = compare(x.r2.S, x.r1.S).rel_rms;
  return x;
}

/// Slow gates (A_log = 0, bias = b for every channel; beta as drawn), the twin's "slow gates" of bench/NOTES.md
/// "KDA pair step: twin plan": with b = -6 the decay per 16-token chunk is ~0.8, so gp, gq are O(1) and every
/// cross term (M W_c, Qb, Pbl, Kt) carries weight; on the anchor gates gam_n ~ e^-50 and Wb, Kt, Qb ~ 1e-11.
void make_slow_gate(KdaInputs& in, double b) {
  for (auto& x : in.A_log.data) x = 0.0;
  for (auto& x : in.bias.data) x = b;
  derive_kda(in);
}

/// The twin's pair plan (numerics/kda_twin.hpp KdaTwinPlan::pair, the kernel's formats).
KdaTwinPlan pair_plan(bool use_S0 = true) {
  KdaTwinPlan p = kda_plan_kernel();
  p.pair = true;
  p.use_S0 = use_S0;
  return p;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("pair step on the ANCHORS.md cases (and slow gates): o <= 2.0e-3 vs float64, twin within 10%, beside the "
          "one-chunk kernel", "[gpu][kda][pair]") {
  struct Cs { std::size_t B, T, H, group; double slow_bias; };  // slow_bias 0: the anchor gates
  const Cs cases[] = {{1, 17, 1, 1, 0}, {3, 64, 1, 1, 0}, {1, 300, 2, 1, 0}, {1, 1000, 4, 1, 0}, {1, 4096, 2, 1, 0},
                      {1, 300, 2, 1, -6}, {2, 100, 1, 2, -6}, {1, 300, 2, 1, -2}};
  for (const auto& cs : cases) {
    KdaInputs in = make_inputs(cs.B, cs.T, cs.H, cs.group, 1234);
    if (cs.slow_bias != 0) make_slow_gate(in, cs.slow_bias);
    const DevInputs d(in);
    const auto ref = kda_truth(in);
    const auto tw = kda_twin(in, pair_plan());
    const double e_tw = compare(tw.o.data, ref.o.data).rel_rms, s_tw = compare(tw.S_final.data, ref.S_final.data).rel_rms;
    const auto [r1, r2, mo, ms, mo1, ms1, d_o, d_s] = run_pair_vs_default(prefill_args(in, d), in, ref);
    std::printf("pair %s (B,T,H,HV)=(%zu,%zu,%zu,%zu): o rel_rms %.4e (twin pair %.4e, |diff|/kernel %.3f; one-chunk kernel "
                "%.4e)  state %.4e (twin pair %.4e, |diff|/kernel %.3f; one-chunk %.4e)  pair vs one-chunk: o %.3e, S %.3e\n",
                cs.slow_bias == 0 ? "anchor" : (cs.slow_bias == -6 ? "slow gate b=-6" : "slow gate b=-2"), cs.B, cs.T, cs.H,
                in.HV, mo.rel_rms, e_tw, std::fabs(e_tw - mo.rel_rms) / mo.rel_rms, mo1.rel_rms, ms.rel_rms, s_tw,
                std::fabs(s_tw - ms.rel_rms) / ms.rel_rms, ms1.rel_rms, d_o, d_s);
    CAPTURE(cs.B, cs.T, cs.H, cs.slow_bias, mo.rel_rms, e_tw, mo1.rel_rms, ms.rel_rms, s_tw, ms1.rel_rms, d_o, d_s);
    REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
    CHECK(std::fabs(e_tw - mo.rel_rms) <= tol::twin_vs_kernel.value * mo.rel_rms);
    CHECK(std::fabs(s_tw - ms.rel_rms) <= tol::twin_vs_kernel.value * ms.rel_rms);
    CHECK(mo.rel_rms <= pair_bound(mo1.rel_rms, tol::kda_bf16_goal.value));
    CHECK(ms.rel_rms <= pair_bound(ms1.rel_rms, tol::kda_twin_state.value));
    if (cs.slow_bias == 0) {  // the goal is for the anchor gates (the one-chunk plan misses it on slow gates too)
      CHECK(mo.rel_rms <= tol::kda_bf16_goal.value);
      CHECK(ms.rel_rms <= tol::kda_twin_state.value);
    }
  }
}

TEST_CASE("pair step shapes: T in {1,15,16,17,31,32,33,1000,4096}, B = 2, HV = 2H, with and without S0",
          "[gpu][kda][pair]") {
  struct Cs { std::size_t T, H; bool S0; };
  const Cs cases[] = {{1, 1, true},   {15, 1, true},  {16, 2, false}, {17, 1, true},   {31, 1, true},
                      {32, 2, true},  {33, 1, false}, {1000, 1, true}, {4096, 1, true}};
  for (const auto& cs : cases) {
    const KdaInputs in = make_inputs(2, cs.T, cs.H, 2, fresh_seed());
    const DevInputs d(in);
    const auto ref = kda_truth(in, cs.S0);
    const double e_tw = compare(kda_twin(in, pair_plan(cs.S0)).o.data, ref.o.data).rel_rms;
    const auto [r1, r2, mo, ms, mo1, ms1, d_o, d_s] = run_pair_vs_default(prefill_args(in, d, cs.S0), in, ref);
    const bool same = r2.o == r1.o && r2.S == r1.S;
    std::printf("pair shape B=2 T=%zu H=%zu HV=%zu S0=%d: o %.4e (twin pair %.4e, |diff|/kernel %.3f; one-chunk %.4e)  "
                "state %.4e (one-chunk %.4e)  pair vs one-chunk: o %.3e, S %.3e, identical %d\n",
                cs.T, cs.H, in.HV, cs.S0, mo.rel_rms, e_tw, std::fabs(e_tw - mo.rel_rms) / mo.rel_rms, mo1.rel_rms,
                ms.rel_rms, ms1.rel_rms, d_o, d_s, static_cast<int>(same));
    CAPTURE(cs.T, cs.H, cs.S0, mo.rel_rms, e_tw, mo1.rel_rms, ms.rel_rms, ms1.rel_rms, d_o, d_s);
    REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
    CHECK(std::fabs(e_tw - mo.rel_rms) <= tol::twin_vs_kernel.value * mo.rel_rms);
    CHECK(mo.rel_rms <= pair_bound(mo1.rel_rms, tol::kda_bf16_goal.value));
    CHECK(ms.rel_rms <= pair_bound(ms1.rel_rms, tol::kda_twin_state.value));
    // two roundings of the same numbers (each near the goal from the truth): within twice the goal
    CHECK(d_o <= 2 * tol::kda_bf16_goal.value);
    CHECK(d_s <= 2 * tol::kda_twin_state.value);
    if (cs.T <= 16) {  // one pair whose second chunk is all padding: the one-chunk operations plus exact zeros
      CHECK(d_o <= tol::kda_pair_short_vs_default.value);
      CHECK(d_s <= tol::kda_pair_short_vs_default.value);
    }
  }
}

TEST_CASE("pair step varlen (cu_seqlens, a last sequence of 1 token) equals per-sequence truths", "[gpu][kda][pair]") {
  for (const std::vector<int>& lens : {std::vector<int>{37, 16, 100, 1}, std::vector<int>{1, 1, 5, 31, 17, 1},
                                       std::vector<int>{32, 33, 64, 1}}) {
    const int N = static_cast<int>(lens.size());
    const int Ttot = VarlenBatch::total(lens);
    const std::size_t H = 2, HV = 4;
    KdaInputs all = make_inputs(1, Ttot, H, HV / H, fresh_seed());
    if (lens[0] == 32) make_slow_gate(all, -2.0);  // the state carries across pairs and sequence ends
    const VarlenBatch vb(all, lens, fresh_seed());  // one S0 per sequence
    const DevInputs d(all);
    auto a = prefill_args(all, d);
    vb.apply(a);
    const std::size_t no = all.T * HV * Dm, ns = N * HV * Dm * Dm;
    const auto r1 = run_prefill(a, no, ns);
    a.pair_chunks = true;
    const auto r2 = run_prefill(a, no, ns);
    double worst_o = 0, worst_s = 0;
    for (int i = 0; i < N; ++i) {
      const auto ref = kda_truth(vb.part(all, i));
      const auto mo = compare(vb.o_of(r2.o, i, HV, Dm), ref.o.data);
      const auto ms = compare(vb.S_of(r2.S, i, HV, Dm), ref.S_final.data);
      const auto mo1 = compare(vb.o_of(r1.o, i, HV, Dm), ref.o.data);
      const auto ms1 = compare(vb.S_of(r1.S, i, HV, Dm), ref.S_final.data);
      CAPTURE(i, lens[i], mo.rel_rms, mo1.rel_rms, ms.rel_rms, ms1.rel_rms);
      REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
      CHECK(mo.rel_rms <= pair_bound(mo1.rel_rms, tol::kda_bf16_goal.value));
      CHECK(ms.rel_rms <= pair_bound(ms1.rel_rms, tol::kda_twin_state.value));
      worst_o = std::max(worst_o, mo.rel_rms / std::max(mo1.rel_rms, tol::kda_bf16_goal.value));
      worst_s = std::max(worst_s, ms.rel_rms / std::max(ms1.rel_rms, tol::kda_twin_state.value));
    }
    std::printf("pair varlen %zu sequences (T = %d, last len %d): worst per-sequence o / max(one-chunk, goal) = %.3f, "
                "state / max(one-chunk, bound) = %.3f; all sequences pair vs one-chunk: o %.3e, S %.3e\n",
                lens.size(), Ttot, lens.back(), worst_o, worst_s, compare(r2.o, r1.o).rel_rms, compare(r2.S, r1.S).rel_rms);
  }
}

TEST_CASE("pair step: prefill-then-decode == pair prefill of the longer sequence", "[gpu][kda][pair]") {
  const std::size_t B = 4, T0 = 37, steps = 5, H = 2, HV = 4;
  KdaInputs in = make_inputs(B, T0 + steps, H, HV / H, fresh_seed());
  make_slow_gate(in, -2.0);  // the state carries across the pair boundaries and into the decode steps
  const DevInputs d(in);
  const auto ref = kda_truth(in);
  auto af = prefill_args(in, d);
  af.pair_chunks = true;
  const auto full = run_prefill(af, B * in.T * HV * Dm, B * HV * Dm * Dm);
  // pair prefill of T0 tokens (strided view of the same buffers), then `steps` decode steps
  const auto [o_pd, S_pd] = prefill_then_decode(in, d, af, T0);
  const auto m_o = compare(o_pd, ref.o.data), m_S = compare(S_pd, ref.S_final.data);
  const auto m_same_o = compare(o_pd, full.o), m_same_S = compare(S_pd, full.S);
  const auto m_full_o = compare(full.o, ref.o.data), m_full_S = compare(full.S, ref.S_final.data);
  std::printf("pair prefill(%zu)+decode(%zu), slow gates b=-2, vs truth: o %.4e state %.4e (pair prefill(%zu) vs truth: o "
              "%.4e state %.4e); vs pair prefill(%zu): o %.4e state %.4e\n", T0, steps, m_o.rel_rms, m_S.rel_rms, in.T,
              m_full_o.rel_rms, m_full_S.rel_rms, in.T, m_same_o.rel_rms, m_same_S.rel_rms);
  REQUIRE(m_o.nan_count + m_S.nan_count == 0);
  // the decode steps are fp32 math: no worse than the pair prefill of all tokens (or the goal)
  CHECK(m_o.rel_rms <= pair_bound(m_full_o.rel_rms, tol::kda_bf16_goal.value));
  CHECK(m_S.rel_rms <= pair_bound(m_full_S.rel_rms, tol::kda_twin_state.value));
  // two roundings of the same numbers (each within the goal of the truth): within twice the goal
  CHECK(m_same_o.rel_rms <= 2 * tol::kda_bf16_goal.value);
  CHECK(m_same_S.rel_rms <= 2 * tol::kda_twin_state.value);
}

// ---- the pair workspace slot against a float64 computation of the pair specification ----------------------
namespace {

/// One 16-token chunk's quantities in float64 (numerics/kda_twin.hpp's algorithm without rounding; rows past the
/// sequence end are padding: q = k = v = g = beta = 0).
struct ChunkRef {
  std::vector<double> Qg, Kd, W, U, P, gn;  // [16][D] (P [16][16], gn [D])
};
ChunkRef chunk_ref(const KdaInputs& in, std::size_t b, std::size_t hv, std::size_t c) {
  const std::size_t D = in.d_k, h = hv / (in.HV / in.H);
  ChunkRef x;
  std::vector<double> q(16 * D, 0.0), k(16 * D, 0.0), v(16 * D, 0.0), g(16 * D, 0.0), beta(16, 0.0);
  for (std::size_t r = 0; r < 16; ++r) {
    const std::size_t t = 16 * c + r;
    if (t >= in.T) continue;
    for (std::size_t i = 0; i < D; ++i) {
      q[r * D + i] = in.q(b, t, h, i);
      k[r * D + i] = in.k(b, t, h, i);
      v[r * D + i] = in.v(b, t, hv, i);
      g[r * D + i] = in.g(b, t, hv, i);
    }
    beta[r] = in.beta(b, t, hv);
  }
  std::vector<double> gam(16 * D), Kg(16 * D), Ki(16 * D);
  x.Qg.assign(16 * D, 0.0);
  x.Kd.assign(16 * D, 0.0);
  x.gn.assign(D, 0.0);
  for (std::size_t i = 0; i < D; ++i) {
    double G = 0;
    for (std::size_t r = 0; r < 16; ++r) {
      G += g[r * D + i];
      gam[r * D + i] = std::exp(G);
    }
    x.gn[i] = gam[15 * D + i];
  }
  for (std::size_t r = 0; r < 16; ++r)
    for (std::size_t i = 0; i < D; ++i) {
      const double gr = gam[r * D + i];
      x.Qg[r * D + i] = q[r * D + i] * gr;
      Kg[r * D + i] = k[r * D + i] * gr;
      Ki[r * D + i] = k[r * D + i] / gr;
      x.Kd[r * D + i] = k[r * D + i] * x.gn[i] / gr;
    }
  std::vector<double> A(256, 0.0);
  x.P.assign(256, 0.0);
  for (std::size_t r = 0; r < 16; ++r)
    for (std::size_t s = 0; s <= r; ++s) {
      double a = 0, p = 0;
      for (std::size_t i = 0; i < D; ++i) {
        a += Kg[r * D + i] * Ki[s * D + i];
        p += x.Qg[r * D + i] * Ki[s * D + i];
      }
      if (s < r) A[r * 16 + s] = beta[r] * a;
      x.P[r * 16 + s] = p;
    }
  x.W.assign(16 * D, 0.0);
  x.U.assign(16 * D, 0.0);
  for (std::size_t r = 0; r < 16; ++r)
    for (std::size_t cc = 0; cc < 2 * D; ++cc) {
      double acc = beta[r] * (cc < D ? Kg[r * D + cc] : v[r * D + cc - D]);
      for (std::size_t s = 0; s < r; ++s) acc -= A[r * 16 + s] * (cc < D ? x.W[s * D + cc] : x.U[s * D + cc - D]);
      (cc < D ? x.W[r * D + cc] : x.U[r * D + cc - D]) = acc;
    }
  return x;
}

/// The pair quantities of the specification, float64: W2, Qg2, Kd2, U2 [32][D], P2 [32][32], gn2 [D].
struct PairRef {
  std::vector<double> W2, Qg2, Kd2, U2, P2, gn2;
};
PairRef pair_ref(const KdaInputs& in, std::size_t b, std::size_t hv, std::size_t pp) {
  const std::size_t D = in.d_k;
  const ChunkRef c0 = chunk_ref(in, b, hv, 2 * pp), c1 = chunk_ref(in, b, hv, 2 * pp + 1);
  PairRef x;
  x.W2.assign(32 * D, 0.0);
  x.Qg2 = x.Kd2 = x.U2 = x.W2;
  x.P2.assign(32 * 32, 0.0);
  x.gn2.assign(D, 0.0);
  std::vector<double> M(256, 0.0), Pbl(256, 0.0);
  for (std::size_t r = 0; r < 16; ++r)
    for (std::size_t s = 0; s < 16; ++s)
      for (std::size_t i = 0; i < D; ++i) {
        M[r * 16 + s] += c1.W[r * D + i] * c0.Kd[s * D + i];
        Pbl[r * 16 + s] += c1.Qg[r * D + i] * c0.Kd[s * D + i];
      }
  for (std::size_t r = 0; r < 16; ++r)
    for (std::size_t i = 0; i < D; ++i) {
      const double gp = c0.gn[i], gq = c1.gn[i];
      double wb = c1.W[r * D + i] * gp, ub = c1.U[r * D + i];
      for (std::size_t s = 0; s < 16; ++s) {
        wb -= M[r * 16 + s] * c0.W[s * D + i];
        ub -= M[r * 16 + s] * c0.U[s * D + i];
      }
      x.W2[r * D + i] = c0.W[r * D + i];
      x.W2[(16 + r) * D + i] = wb;
      x.U2[r * D + i] = c0.U[r * D + i];
      x.U2[(16 + r) * D + i] = ub;
      x.Qg2[r * D + i] = c0.Qg[r * D + i];
      x.Qg2[(16 + r) * D + i] = c1.Qg[r * D + i] * gp;
      x.Kd2[r * D + i] = c0.Kd[r * D + i] * gq;
      x.Kd2[(16 + r) * D + i] = c1.Kd[r * D + i];
    }
  for (std::size_t i = 0; i < D; ++i) x.gn2[i] = c0.gn[i] * c1.gn[i];
  for (std::size_t r = 0; r < 16; ++r)
    for (std::size_t s = 0; s < 16; ++s) {
      x.P2[r * 32 + s] = c0.P[r * 16 + s];
      x.P2[(16 + r) * 32 + s] = Pbl[r * 16 + s];
      x.P2[(16 + r) * 32 + 16 + s] = c1.P[r * 16 + s];
    }
  return x;
}

/// Byte offset of element (r, c) of a 16 x 16k matrix stored as mma.m16n8k16 A fragments (uint4 per (k-tile, lane)),
/// from the PTX fragment definition: lane = 4 (r % 8) + (c % 8) / 2, register (r / 8) + 2 ((c % 16) / 8), half c % 2.
std::size_t afrag_byte(std::size_t r, std::size_t c) {
  const std::size_t lane = 4 * (r % 8) + (c % 8) / 2, reg = r / 8 + 2 * ((c % 16) / 8);
  return 16 * ((c / 16) * 32 + lane) + 4 * reg + 2 * (c % 2);
}
/// Byte offset of element (k, n) of a 16 x N matrix (k = row) stored as B fragments of two n-tiles per uint4
/// (KdaSlot::Kd's order): lane = 4 (n % 8) + (k % 8) / 2, register 2 ((n % 16) / 8) + k / 8, half k % 2.
std::size_t bfrag_byte(std::size_t k, std::size_t n) {
  const std::size_t lane = 4 * (n % 8) + (k % 8) / 2, reg = 2 * ((n % 16) / 8) + k / 8;
  return 16 * ((n / 16) * 32 + lane) + 4 * reg + 2 * (k % 2);
}

}  // namespace

TEST_CASE("pair workspace slot (KdaPairSlot) vs a float64 computation of the pair specification", "[gpu][kda][pair]") {
  using PS = kernels::KdaPairSlot;
  // slow_bias != 0: slow gates (make_slow_gate), where Wb, Ub, Qb, Kt, Pbl and M are O(1) (anchor gates: ~1e-11)
  struct Cs { std::size_t B, T, H, group; std::uint64_t seed; double slow_bias; };
  const Cs cases[] = {{1, 300, 2, 1, 1234, 0}, {2, 50, 1, 2, fresh_seed(), 0}, {1, 17, 1, 1, fresh_seed(), 0},
                      {1, 300, 2, 1, 1234, -6}, {2, 50, 1, 2, fresh_seed(), -2}};
  for (const auto& cs : cases) {
    KdaInputs in = make_inputs(cs.B, cs.T, cs.H, cs.group, cs.seed);
    if (cs.slow_bias != 0) make_slow_gate(in, cs.slow_bias);
    const DevInputs d(in);
    auto a = prefill_args(in, d);
    a.pair_chunks = true;
    const std::vector<unsigned char> h = prepare_workspace(a, in.B * in.T * in.HV * Dm);  // the pair prepare only
    const std::size_t npair = (in.T + 31) / 32;
    REQUIRE(h.size() == in.B * npair * in.HV * PS::bytes);
    FieldDiff W2{"W2"}, Qg2{"Qg2"}, Kd2{"Kd2"}, U2{"U2"}, P2{"P2"}, gn2{"gam_n2"};
    double range_w[2] = {0, 0}, range_u[2] = {0, 0};  // max |W_c|, |Wb| and |U_c|, |Ub| (float64)
    for (std::size_t b = 0; b < in.B; ++b)
      for (std::size_t pp = 0; pp < npair; ++pp)
        for (std::size_t hv = 0; hv < in.HV; ++hv) {
          const PairRef x = pair_ref(in, b, hv, pp);
          const unsigned char* s = h.data() + ((b * npair + pp) * in.HV + hv) * PS::bytes;
          for (std::size_t R = 0; R < 32; ++R)
            for (std::size_t i = 0; i < Dm; ++i) {
              const std::size_t mt = R / 16, r = R % 16;
              W2.add(bf16_at(s + PS::W2 + mt * 4096, afrag_byte(r, i)), round_bf16(x.W2[R * Dm + i]));
              Qg2.add(bf16_at(s + PS::Qg2 + mt * 4096, afrag_byte(r, i)), round_bf16(x.Qg2[R * Dm + i]));
              Kd2.add(bf16_at(s + PS::Kd2 + mt * 4096, bfrag_byte(r, i)), round_bf16(x.Kd2[R * Dm + i]));
              U2.add(f32_at(s + PS::U2, 4 * (R * Dm + i)), x.U2[R * Dm + i]);
              range_w[mt] = std::max(range_w[mt], std::fabs(x.W2[R * Dm + i]));
              range_u[mt] = std::max(range_u[mt], std::fabs(x.U2[R * Dm + i]));
            }
          // P2's blocks: 0 = (rows 0..15, cols 0..15), 1 = (16.., 0..15), 2 = (16.., 16..); hi + lo
          const std::size_t r0[3] = {0, 16, 16}, c0[3] = {0, 0, 16};
          for (std::size_t blk = 0; blk < 3; ++blk)
            for (std::size_t r = 0; r < 16; ++r)
              for (std::size_t c = 0; c < 16; ++c) {
                const std::size_t off = PS::Pf2 + 1024 * blk + afrag_byte(r, c);
                P2.add(bf16_at(s, off) + bf16_at(s, off + 512), x.P2[(r0[blk] + r) * 32 + c0[blk] + c]);
              }
          for (std::size_t i = 0; i < Dm; ++i) gn2.add(f32_at(s + PS::gam_n2, 4 * i), x.gn2[i]);
        }
    std::printf("pair slot vs float64 (B,T,H,HV)=(%zu,%zu,%zu,%zu) %s, %zu slots: max|diff|/max|ref|  W2 %.3e  Qg2 %.3e  "
                "Kd2 %.3e  U2 %.3e  P2 %.3e  gam_n2 %.3e;  ranges: max|W_c| %.3g max|Wb| %.3g, max|U_c| %.3g max|Ub| %.3g\n",
                cs.B, cs.T, cs.H, in.HV, cs.slow_bias == 0 ? "anchor gates" : cs.slow_bias == -6 ? "slow b=-6" : "slow b=-2",
                in.B * npair * in.HV, W2.rel(), Qg2.rel(), Kd2.rel(), U2.rel(), P2.rel(), gn2.rel(), range_w[0], range_w[1],
                range_u[0], range_u[1]);
    for (const FieldDiff* f : {&W2, &Qg2, &Kd2, &U2, &P2, &gn2}) {
      CAPTURE(f->name, f->rel(), f->nonfinite);
      REQUIRE(f->nonfinite == 0);
    }
    CHECK(W2.rel() <= tol::kda_pair_slot_bf16.value);
    CHECK(Qg2.rel() <= tol::kda_pair_slot_bf16.value);
    CHECK(Kd2.rel() <= tol::kda_pair_slot_bf16.value);
    CHECK(U2.rel() <= tol::kda_pair_slot_fp32.value);
    CHECK(P2.rel() <= tol::kda_pair_slot_fp32.value);
    CHECK(gn2.rel() <= tol::kda_pair_slot_fp32.value);
  }
}

TEST_CASE("pair step: unsupported options give clear errors naming pair_chunks; segments auto = 1", "[gpu][kda][pair]") {
  const KdaInputs in = make_inputs(1, 20, 1, 1, fresh_seed());
  const DevInputs d(in);
  DevBuf o(in.T * Dm * 2), S(Dm * Dm * 4);
  auto good = prefill_args(in, d);
  good.pair_chunks = true;
  good.o = o.as<bf16_t>();
  good.S_final = S.as<float>();
  DevBuf ws(kernels::kda_prefill_workspace_bytes(good));
  good.workspace = ws.p;
  good.workspace_bytes = ws.bytes;
  REQUIRE_NOTHROW(kernels::kda_prefill(good, nullptr));
  cuda_check(cudaDeviceSynchronize(), "good");
  struct Bad { const char* what; kernels::KdaPrefillArgs a; const char* names; };
  std::vector<Bad> bads;
  for (const int D : {64, 256}) {
    Bad b{"D", good, "D = "};
    b.a.D = D;
    bads.push_back(b);
  }
  for (const int P : {2, 3}) {
    Bad b{"segment_state", good, "segment_state = "};
    b.a.segment_state = P;
    bads.push_back(b);
  }
  for (const int sv : {2, 4, 5}) {
    Bad b{"state_variant", good, "state_variant = "};
    b.a.state_variant = sv;
    bads.push_back(b);
  }
  {
    Bad b{"prepare_variant", good, "prepare_variant = "};
    b.a.prepare_variant = 4;
    bads.push_back(b);
  }
  {
    Bad b{"workspace", good, "pair_chunks = true"};
    b.a.workspace_bytes = kernels::KdaPairSlot::bytes - 16;  // one pair needs one slot
    bads.push_back(b);
  }
  for (const Bad& b : bads) {
    const std::string m = message_of([&] { kernels::kda_prefill(b.a, nullptr); });
    std::printf("pair bad %s: \"%s\"\n", b.what, m.c_str());
    CAPTURE(b.what, m);
    CHECK(m.find("pair_chunks") != std::string::npos);
    CHECK(m.find(b.names) != std::string::npos);
    if (b.what != std::string("workspace")) {  // the option checks also guard the workspace size query
      const std::string mw = message_of([&] { (void)kernels::kda_prefill_workspace_bytes(b.a); });
      CAPTURE(mw);
      CHECK(mw.find("pair_chunks") != std::string::npos);
    }
  }
  // segment_state 0 (auto) and 1 are accepted and run one-shot; the auto rule's target shape says 1 with pairs
  auto a = good;
  a.segment_state = 1;
  CHECK_NOTHROW(kernels::kda_prefill(a, nullptr));
  kernels::KdaPrefillArgs big = good;
  big.T = 65536;
  big.H = big.HV = 32;
  const int seg_pair = kernels::kda_prefill_segments(big);
  big.pair_chunks = false;
  std::printf("pair: kda_prefill_segments at T = 65536, H = 32: %d with pair_chunks, %d without\n", seg_pair,
              kernels::kda_prefill_segments(big));
  CHECK(seg_pair == 1);
  cuda_check(cudaDeviceSynchronize(), "after bad inputs");
}

TEST_CASE("pair step T = 65536, H = 32 vs the default prefill on all heads and float64 on one head",
          "[gpu][kda][pair][long]") {
  const std::size_t T = 65536, H = 32;
  LongKdaInputs li(T, H, Dm, fresh_seed());
  const std::size_t nq = li.nq;
  kernels::KdaPrefillArgs a = li.a;
  DevBuf o1(nq * 2), S1(H * Dm * Dm * 4), o2(nq * 2), S2(H * Dm * Dm * 4);
  run_prefill_into(a, o1, S1);
  a.pair_chunks = true;
  run_prefill_into(a, o2, S2);
  const auto ko1 = download_bf16(o1), ko2 = download_bf16(o2);
  const auto kS1 = download_f32(S1), kS2 = download_f32(S2);
  const auto mo = compare(ko2, ko1), ms = compare(kS2, kS1);
  std::printf("pair T=65536 H=32 all heads, pair vs default: o %.3e (nan %lld), S_final %.3e (nan %lld)\n", mo.rel_rms,
              static_cast<long long>(mo.nan_count), ms.rel_rms, static_cast<long long>(ms.nan_count));
  REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
  CHECK(mo.rel_rms <= 2 * tol::kda_bf16_goal.value);
  CHECK(ms.rel_rms <= 2 * tol::kda_twin_state.value);
  // one head vs the float64 recurrence (heads are independent)
  const std::size_t hv = 7;
  const KdaInputs in = long_head_inputs(li, hv);
  const auto ref = kda_truth(in);
  const auto h1 = download_head_bf16(o1.as<bf16_t>(), T, H, hv), h2 = download_head_bf16(o2.as<bf16_t>(), T, H, hv);
  const std::vector<double> s2(kS2.begin() + hv * Dm * Dm, kS2.begin() + (hv + 1) * Dm * Dm),
      s1(kS1.begin() + hv * Dm * Dm, kS1.begin() + (hv + 1) * Dm * Dm);
  const auto m2 = compare(h2, ref.o.data), m1 = compare(h1, ref.o.data);
  const auto q2 = compare(s2, ref.S_final.data), q1 = compare(s1, ref.S_final.data);
  std::printf("pair T=65536 H=32 head %zu vs float64: o %.4e (default %.4e), state %.4e (default %.4e)\n", hv, m2.rel_rms,
              m1.rel_rms, q2.rel_rms, q1.rel_rms);
  CHECK(m2.rel_rms <= tol::kda_bf16_goal.value);
  CHECK(m2.rel_rms <= pair_bound(m1.rel_rms, tol::kda_bf16_goal.value));
  CHECK(q2.rel_rms <= pair_bound(q1.rel_rms, tol::kda_twin_state.value));
}
