// KDA CUDA kernels (kernels/kda.hpp) against the float64 recurrence (reference/kda.hpp) and the
// kernel twin (numerics/kda_twin.hpp), on fresh seeded anchor-kda inputs; outputs poisoned (NaN)
// before every run. Runs only where the CUDA kernels are built (ctest label gpu).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "numerics/kda_twin.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/kda.hpp"
#include "tests/catch.hpp"
#include "kernels/common/random_fill.hpp"
#include "tests/gpu/kda_gpu_util.hpp"

using namespace kdalab;
using namespace kda_gpu;
using kernels::KdaSchedule;
using kernels::KdaStatePass;

namespace {

/// The accuracy bound of a kernel output: the 2.0e-3 goal, or, where the twin (the same algorithm
/// and precisions on the CPU) itself predicts more (outputs of one or a few tokens, dominated by
/// Qg S0 with S0 as a bf16 operand), the twin's error plus the 10% twin/kernel agreement margin.
double o_bound(const KdaInputs& in, const std::vector<double>& ref_o, bool use_S0 = true) {
  KdaTwinPlan p = kda_plan_kernel();
  p.use_S0 = use_S0;
  const double e_twin = compare(kda_twin(in, p).o.data, ref_o).rel_rms;
  return std::max(tol::kda_bf16_goal.value, (1.0 + tol::twin_vs_kernel.value) * e_twin);
}

std::uint64_t fresh_seed() {
  static std::uint64_t s = 20261129;
  return ++s;
}

const char* pass_name(KdaStatePass p) {
  switch (p) {
    case KdaStatePass::automatic: return "automatic";
    case KdaStatePass::mma: return "mma";
    case KdaStatePass::key_split: return "key_split";
    case KdaStatePass::wgmma: return "wgmma";
  }
  return "?";
}

/// relative RMS of a[lo, hi) vs b[lo, hi)
double rel_part(const std::vector<double>& a, const std::vector<double>& b, std::size_t lo, std::size_t hi) {
  return compare(std::vector<double>(a.begin() + lo, a.begin() + hi), std::vector<double>(b.begin() + lo, b.begin() + hi))
      .rel_rms;
}

}  // namespace

TEST_CASE("prefill anchor cases, the rule's plan and the one-shot mma pass: <= 2.0e-3 vs float64, twin within 10%",
          "[gpu][kda]") {
  const std::size_t cases[][3] = {{1, 17, 1}, {3, 64, 1}, {1, 300, 2}, {1, 1000, 4}, {1, 4096, 2}};
  for (const auto& cs : cases) {
    const KdaInputs in = make_inputs(cs[0], cs[1], cs[2], 1, 1234);
    const DevInputs d(in);
    const auto ref = kda_truth(in);
    const auto tw = kda_twin(in, kda_plan_kernel());
    const double e_twin = compare(tw.o.data, ref.o.data).rel_rms;
    for (const KdaStatePass pass : {KdaStatePass::automatic, KdaStatePass::mma}) {
      const auto a = prefill_args(in, d);
      const Overrides ov = pass == KdaStatePass::automatic ? Overrides{} : force_pass(pass);  // the rule / forced
      const auto r = run_prefill(a, in.B * in.T * in.HV * 128, in.B * in.HV * 128 * 128, ov);
      const auto mo = compare(r.o, ref.o.data), ms = compare(r.S, ref.S_final.data);
      const char* variant = pass_name(pass);
      std::printf("kernel %s anchor (B,T,H)=(%zu,%zu,%zu): o rel_rms %.4e (twin %.4e, |diff|/kernel %.3f)  state %.4e  "
                  "max_ulp %lld\n",
                  variant, cs[0], cs[1], cs[2], mo.rel_rms, e_twin, std::fabs(e_twin - mo.rel_rms) / mo.rel_rms,
                  ms.rel_rms, static_cast<long long>(mo.max_ulp_bf16));
      CAPTURE(variant, cs[0], cs[1], cs[2], mo.rel_rms, e_twin, ms.rel_rms);
      REQUIRE(mo.nan_count == 0);
      REQUIRE(mo.inf_count == 0);
      REQUIRE(ms.nan_count == 0);
      CHECK(mo.rel_rms <= tol::kda_bf16_goal.value);
      CHECK(ms.rel_rms <= tol::kda_twin_state.value);
      CHECK(std::fabs(e_twin - mo.rel_rms) <= tol::twin_vs_kernel.value * mo.rel_rms);
    }
  }
}

TEST_CASE("prefill shapes: T in {1,15,16,17,1000,4096}, B up to 8, HV = 2H, with and without S0", "[gpu][kda]") {
  struct Cs { std::size_t B, T, H, group; bool S0; };
  const Cs cases[] = {{1, 1, 1, 1, true},  {2, 15, 1, 2, true},   {8, 16, 2, 1, false}, {3, 17, 2, 2, true},
                      {8, 33, 1, 1, true}, {2, 1000, 2, 2, false}, {1, 4096, 1, 2, true}};
  for (const auto& cs : cases) {
    const KdaInputs in = make_inputs(cs.B, cs.T, cs.H, cs.group, fresh_seed());
    const DevInputs d(in);
    const auto r = run_prefill(prefill_args(in, d, cs.S0), in.B * in.T * in.HV * 128, in.B * in.HV * 128 * 128);
    const auto ref = kda_truth(in, cs.S0);
    const auto mo = compare(r.o, ref.o.data), ms = compare(r.S, ref.S_final.data);
    std::printf("kernel shape B=%zu T=%zu H=%zu HV=%zu S0=%d: o %.4e state %.4e\n", cs.B, cs.T, cs.H, in.HV, cs.S0,
                mo.rel_rms, ms.rel_rms);
    CAPTURE(cs.B, cs.T, cs.H, in.HV, cs.S0, mo.rel_rms, ms.rel_rms);
    REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
    CHECK(mo.rel_rms <= o_bound(in, ref.o.data, cs.S0));
    CHECK(ms.rel_rms <= tol::kda_twin_state.value);
  }
}

TEST_CASE("overlapped one-shot schedule is bit-identical to one prepare + one state pass (single_stream)", "[gpu][kda]") {
  // T = 8200: 4 parts of 2064 tokens, the last one 2008 (not a multiple of 16), so the middle segments read and
  // write the fp32 state buffer in place; HV = 2H; S0 given
  const KdaInputs in = make_inputs(2, 8200, 1, 2, fresh_seed());
  const DevInputs d(in);
  auto a = prefill_args(in, d);
  const std::size_t no = in.B * in.T * in.HV * 128, ns = in.B * in.HV * 128 * 128;
  REQUIRE(kernels::kda_prefill_plan(a).overlapped);
  const auto r_on = run_prefill(a, no, ns);
  a.single_stream = true;
  REQUIRE(!kernels::kda_prefill_plan(a).overlapped);
  const auto r_off = run_prefill(a, no, ns);
  const auto ref = kda_truth(in);
  const auto mo = compare(r_on.o, ref.o.data);
  std::printf("overlapped schedule B=2 T=8200 HV=2: o %.4e, identical to unsegmented: %d\n", mo.rel_rms,
              static_cast<int>(r_on.o == r_off.o && r_on.S == r_off.S));
  REQUIRE(mo.nan_count + mo.inf_count == 0);
  CHECK(r_on.o == r_off.o);
  CHECK(r_on.S == r_off.S);
  CHECK(mo.rel_rms <= tol::kda_bf16_goal.value);
}

TEST_CASE("the prepare and the state pass run apart (KdaPhases) give the whole prefill's o and S_final", "[gpu][kda]") {
  // the plans bench times apart: the rule's (one-shot wgmma; T = 4100 overlapped as a whole), the one-shot mma pass,
  // the segment path
  for (const auto& cs : {std::array<std::size_t, 4>{2, 1000, 1, 2}, std::array<std::size_t, 4>{1, 4100, 1, 2}}) {
    const KdaInputs in = make_inputs(cs[0], cs[1], cs[2], cs[3], fresh_seed());
    const DevInputs d(in);
    const std::size_t no = in.B * in.T * in.HV * 128, ns = in.B * in.HV * 128 * 128;
    for (const Overrides& plan : {Overrides{}, force_pass(KdaStatePass::mma), force_segments(3)}) {
      auto a = prefill_args(in, d);
      const auto whole = run_prefill(a, no, ns, plan);
      DevBuf o(no * 2), S(ns * 4);
      o.poison();
      S.poison();
      a.o = o.as<bf16_t>();
      a.S_final = S.as<float>();
      Overrides ov = plan;
      const std::size_t wsb = kernels::kda_prefill_workspace_bytes(a, &ov);
      DevBuf ws(wsb);
      ws.poison();
      a.workspace = ws.p;
      a.workspace_bytes = wsb;
      ov.phases = kernels::KdaPhases::prepare;
      kernels::kda_prefill(a, nullptr, &ov);
      ov.phases = kernels::KdaPhases::state;
      kernels::kda_prefill(a, nullptr, &ov);
      cuda_check(cudaDeviceSynchronize(), "prepare, then state pass");
      const auto o_apart = download_bf16(o), S_apart = download_f32(S);
      const auto mo = compare(o_apart, whole.o);
      std::printf("phases apart B=%zu T=%zu, plan %s / %d segments: identical to the whole prefill: o %d S_final %d\n",
                  cs[0], cs[1], pass_name(plan.state_pass), plan.segments, static_cast<int>(o_apart == whole.o),
                  static_cast<int>(S_apart == whole.S));
      CAPTURE(cs[0], cs[1], pass_name(plan.state_pass), plan.segments);
      REQUIRE(mo.nan_count + mo.inf_count == 0);
      CHECK(o_apart == whole.o);
      CHECK(S_apart == whole.S);
    }
  }
}

TEST_CASE("segment-parallel state pass (forced) vs float64, twin segment mode and the one-shot pass", "[gpu][kda][segments]") {
  // (B, T, H, group, P, long memory): anchor gates forget the state within a few tokens, the
  // long-memory inputs (make_long_memory) carry it across segments, so a wrong combine shows there
  struct Cs { std::size_t B, T, H, group; int P; bool lm; };
  const Cs cases[] = {{1, 17, 1, 1, 2, false}, {2, 4100, 1, 2, 4, false}, {1, 4100, 1, 2, 4, true},
                      {1, 1000, 2, 1, 8, true}, {3, 333, 1, 1, 3, true}};
  for (const auto& cs : cases) {
    KdaInputs in = make_inputs(cs.B, cs.T, cs.H, cs.group, fresh_seed());
    if (cs.lm) make_long_memory(in);
    const DevInputs d(in);
    const std::size_t no = in.B * in.T * in.HV * 128, ns = in.B * in.HV * 128 * 128;
    const auto a = prefill_args(in, d);
    const Overrides seg = force_segments(cs.P), one = force_pass(KdaStatePass::mma);
    REQUIRE(kernels::kda_prefill_plan(a, &seg).segments == cs.P);
    REQUIRE(kernels::kda_prefill_plan(a, &seg).state_pass == KdaStatePass::mma);
    const auto rs = run_prefill(a, no, ns, seg);
    REQUIRE(kernels::kda_prefill_plan(a, &one).segments == 1);
    const auto r1 = run_prefill(a, no, ns, one);
    const auto ref = kda_truth(in);
    KdaTwinPlan tp = kda_plan_kernel();
    tp.segments = static_cast<std::size_t>(cs.P);
    const auto tw = kda_twin(in, tp);
    const auto mo = compare(rs.o, ref.o.data), ms = compare(rs.S, ref.S_final.data);
    const auto m1 = compare(r1.o, ref.o.data), s1 = compare(r1.S, ref.S_final.data);
    const double e_tw = compare(tw.o.data, ref.o.data).rel_rms, s_tw = compare(tw.S_final.data, ref.S_final.data).rel_rms;
    const double d_k1 = compare(rs.o, r1.o).rel_rms;
    std::printf("segments P=%d %s B=%zu T=%zu H=%zu HV=%zu: o %.4e (twin seg %.4e, |diff|/kernel %.3f; one-shot kernel %.4e; "
                "seg vs one-shot %.2e)  state %.4e (twin %.4e, one-shot %.4e)\n",
                cs.P, cs.lm ? "long-memory" : "anchor", cs.B, cs.T, cs.H, in.HV, mo.rel_rms, e_tw,
                std::fabs(e_tw - mo.rel_rms) / mo.rel_rms, m1.rel_rms, d_k1, ms.rel_rms, s_tw, s1.rel_rms);
    CAPTURE(cs.P, cs.lm, cs.B, cs.T, mo.rel_rms, e_tw, m1.rel_rms, ms.rel_rms, s_tw);
    REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
    CHECK(std::fabs(e_tw - mo.rel_rms) <= tol::twin_vs_kernel.value * mo.rel_rms);
    CHECK(std::fabs(s_tw - ms.rel_rms) <= tol::twin_vs_kernel.value * ms.rel_rms);
    // the segment scan costs at most the 10% twin/kernel margin over the one-shot pass
    CHECK(mo.rel_rms <= (1.0 + tol::twin_vs_kernel.value) * m1.rel_rms);
    if (!cs.lm) {
      CHECK(mo.rel_rms <= o_bound(in, ref.o.data));
      CHECK(ms.rel_rms <= tol::kda_twin_state.value);
    }
  }
}

TEST_CASE("T = 65536, H = 32: the rule's plan, the P = 3 segment path and the one-shot mma pass vs float64, the twin and "
          "each other", "[gpu][kda][segments][long]") {
  const std::size_t T = 65536, H = 32, D = 128;
  LongKdaInputs li(T, H, D, fresh_seed());
  const std::size_t nq = li.nq;
  kernels::KdaPrefillArgs a = li.a;
  // the wave model picks P = 3 here on 132 SMs; the rule takes the one-shot wgmma pass instead (measured faster):
  // both are checked
  {
    const kernels::KdaPrefillPlan pl = kernels::kda_prefill_plan(a);
    int dev = 0, sms = 0;
    REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
    REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess);
    std::printf("T=65536 H=32: the rule on %d SMs: P = %d, state pass %s\n", sms, pl.segments, pass_name(pl.state_pass));
    if (sms == 132) {  // the H200's plan (the one-shot wgmma pass); the wave model depends on the SM count
      CHECK(pl.segments == 1);
      CHECK(pl.state_pass == KdaStatePass::wgmma);
    } else {  // another GPU: any plan the rule can make (the outputs below are checked whichever it is)
      CHECK((pl.segments >= 1 && pl.segments <= 16));
      CHECK((pl.state_pass == KdaStatePass::mma || pl.state_pass == KdaStatePass::wgmma));
    }
    const Overrides seg9 = force_segments(9);  // forced segments run the mma pass
    CHECK(kernels::kda_prefill_plan(a, &seg9).state_pass == KdaStatePass::mma);
  }
  const Overrides seg3 = force_segments(3);
  const int P = kernels::kda_prefill_plan(a, &seg3).segments;
  DevBuf o(nq * 2), Sf(H * D * D * 4), o1(nq * 2), Sf1(H * D * D * 4), oa(nq * 2), Sfa(H * D * D * 4);
  run_prefill_into(a, o, Sf, seg3);
  run_prefill_into(a, o1, Sf1, force_pass(KdaStatePass::mma));
  {
    const auto all_s = download_bf16(o), all_1 = download_bf16(o1);
    const auto mo = compare(all_s, all_1);
    std::printf("T=65536 H=32: forced P=%d segments; all heads, seg vs one-shot kernel: o %.3e, nan %zu\n", P,
                mo.rel_rms, static_cast<std::size_t>(mo.nan_count));
    CHECK(P == 3);
    REQUIRE(mo.nan_count + mo.inf_count == 0);
  }
  {  // the rule's plan (on 132 SMs the one-shot wgmma pass) vs the one-shot mma pass (only the fp32 order inside the
     // products differs)
    run_prefill_into(a, oa, Sfa);
    const auto m_o = compare(download_bf16(oa), download_bf16(o1)), m_s = compare(download_f32(Sfa), download_f32(Sf1));
    std::printf("T=65536 H=32: the rule's plan vs the one-shot mma pass, all heads: o %.3e S_final %.3e, nan %zu\n",
                m_o.rel_rms, m_s.rel_rms, static_cast<std::size_t>(m_o.nan_count + m_s.nan_count));
    REQUIRE(m_o.nan_count + m_o.inf_count + m_s.nan_count + m_s.inf_count == 0);
    CHECK(m_o.rel_rms <= tol::kda_state_wgmma_vs_mma.value);
    CHECK(m_s.rel_rms <= tol::kda_state_wgmma_vs_mma.value);
  }
  std::vector<float> Sf_h(H * D * D), Sf1_h(H * D * D);
  cuda_check(cudaMemcpy(Sf_h.data(), Sf.p, Sf.bytes, cudaMemcpyDeviceToHost), "S_final");
  cuda_check(cudaMemcpy(Sf1_h.data(), Sf1.p, Sf1.bytes, cudaMemcpyDeviceToHost), "S_final one-shot");
  for (std::size_t hv : {std::size_t{21}}) {  // one head: the twin takes ~30-60 s per 65536 tokens on one core
    const KdaInputs in = long_head_inputs(li, hv);  // the one head hv as a B = 1, H = 1 problem (heads are independent)
    const auto ref = kda_truth(in);
    KdaTwinPlan tp = kda_plan_kernel();
    tp.segments = static_cast<std::size_t>(P);
    const auto tw = kda_twin(in, tp);
    const auto ko = download_head_bf16(o.as<bf16_t>(), T, H, hv), ko1 = download_head_bf16(o1.as<bf16_t>(), T, H, hv);
    const std::vector<double> kS(Sf_h.begin() + hv * D * D, Sf_h.begin() + (hv + 1) * D * D),
        kS1(Sf1_h.begin() + hv * D * D, Sf1_h.begin() + (hv + 1) * D * D);
    const auto mo = compare(ko, ref.o.data), m1 = compare(ko1, ref.o.data), ms = compare(kS, ref.S_final.data);
    const double e_tw = compare(tw.o.data, ref.o.data).rel_rms;
    std::printf("T=65536 H=32 head %zu: kernel seg o %.4e (twin seg %.4e, |diff|/kernel %.3f; one-shot kernel %.4e)  state %.4e "
                "(one-shot %.4e)\n",
                hv, mo.rel_rms, e_tw, std::fabs(e_tw - mo.rel_rms) / mo.rel_rms, m1.rel_rms, ms.rel_rms,
                compare(kS1, ref.S_final.data).rel_rms);
    CAPTURE(hv, mo.rel_rms, e_tw, m1.rel_rms, ms.rel_rms);
    REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count == 0);
    CHECK(mo.rel_rms <= tol::kda_bf16_goal.value);
    CHECK(ms.rel_rms <= tol::kda_twin_state.value);
    CHECK(std::fabs(e_tw - mo.rel_rms) <= tol::twin_vs_kernel.value * mo.rel_rms);
  }
}

TEST_CASE("prefill varlen (cu_seqlens) with a last sequence of 1 token equals per-sequence truths", "[gpu][kda]") {
  for (const std::vector<int>& lens : {std::vector<int>{37, 16, 100, 1}, std::vector<int>{1, 1, 5, 31, 17, 1}}) {
    const int N = static_cast<int>(lens.size());
    const std::size_t H = 2, HV = 4;
    KdaInputs all = make_inputs(1, VarlenBatch::total(lens), H, HV / H, fresh_seed());
    const VarlenBatch vb(all, lens, fresh_seed());  // one S0 per sequence
    const DevInputs d(all);
    auto a = prefill_args(all, d);
    vb.apply(a);
    const auto r = run_prefill(a, all.T * HV * 128, N * HV * 128 * 128);
    for (int i = 0; i < N; ++i) {
      const KdaInputs s = vb.part(all, i);
      const auto ref = kda_truth(s);
      const auto mo = compare(vb.o_of(r.o, i, HV, 128), ref.o.data);
      const auto ms = compare(vb.S_of(r.S, i, HV, 128), ref.S_final.data);
      CAPTURE(i, lens[i], mo.rel_rms, ms.rel_rms);
      REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
      CHECK(mo.rel_rms <= o_bound(s, ref.o.data));
      CHECK(ms.rel_rms <= tol::kda_twin_state.value);
    }
  }
}

TEST_CASE("decode steps vs float64 truth, prefill-then-decode == prefill of the longer sequence", "[gpu][kda]") {
  const std::size_t B = 4, T0 = 37, steps = 5, H = 2, HV = 4;
  const KdaInputs in = make_inputs(B, T0 + steps, H, HV / H, fresh_seed());
  const DevInputs d(in);
  const auto ref = kda_truth(in);
  // prefill of all T0 + steps tokens
  const auto full = run_prefill(prefill_args(in, d), B * in.T * HV * 128, B * HV * 128 * 128);
  // prefill of T0 tokens (strided view of the same buffers), then `steps` decode steps
  const auto [o_pd, S_pd] = prefill_then_decode(in, d, prefill_args(in, d), T0);
  const auto m_o = compare(o_pd, ref.o.data), m_S = compare(S_pd, ref.S_final.data);
  const auto m_same_o = compare(o_pd, full.o), m_same_S = compare(S_pd, full.S);
  std::printf("prefill(%zu)+decode(%zu) vs truth: o %.4e state %.4e; vs prefill(%zu): o %.4e state %.4e\n", T0, steps,
              m_o.rel_rms, m_S.rel_rms, in.T, m_same_o.rel_rms, m_same_S.rel_rms);
  REQUIRE(m_o.nan_count + m_S.nan_count == 0);
  CHECK(m_o.rel_rms <= tol::kda_bf16_goal.value);
  CHECK(m_S.rel_rms <= tol::kda_twin_state.value);
  // two roundings of the same numbers (each within the goal of the truth): within twice the goal
  CHECK(m_same_o.rel_rms <= 2 * tol::kda_bf16_goal.value);
  CHECK(m_same_S.rel_rms <= 2 * tol::kda_twin_state.value);
}

TEST_CASE("decode in a CUDA graph equals direct launches", "[gpu][kda]") {
  const std::size_t B = 3, H = 4, HV = 4;
  const KdaInputs in = make_inputs(B, 1, H, 1, fresh_seed());
  const DevInputs d(in);
  DevBuf S1(in.S0.numel() * 4), S2(in.S0.numel() * 4), o1(B * HV * 128 * 2), o2(B * HV * 128 * 2);
  cuda_check(cudaMemcpy(S1.p, d.S0.p, S1.bytes, cudaMemcpyDeviceToDevice), "copy");
  cuda_check(cudaMemcpy(S2.p, d.S0.p, S2.bytes, cudaMemcpyDeviceToDevice), "copy");
  o1.poison();
  o2.poison();
  kernels::KdaDecodeArgs dd;
  dd.B = B; dd.H = H; dd.HV = HV;
  dd.q = d.q.as<bf16_t>(); dd.k = d.k.as<bf16_t>(); dd.v = d.v.as<bf16_t>(); dd.g = d.g.as<bf16_t>();
  dd.beta = d.beta.as<bf16_t>();
  dd.gate.A_log = d.A_log.as<float>(); dd.gate.bias = d.bias.as<float>(); dd.gate.g_min = -5.0f;
  dd.scale = static_cast<float>(in.scale);
  dd.state = S1.as<float>(); dd.o = o1.as<bf16_t>();
  for (int i = 0; i < 3; ++i) kernels::kda_decode(dd, nullptr);
  dd.state = S2.as<float>(); dd.o = o2.as<bf16_t>();
  run_in_graph([&](cudaStream_t s) { kernels::kda_decode(dd, s); }, 3);
  CHECK(download_f32(S1) == download_f32(S2));
  CHECK(download_bf16(o1) == download_bf16(o2));
  // one decode step from S0 vs the truth (o of a single token; fp32 math, bf16 output)
  const auto ref = kda_truth(in);
  DevBuf S3(in.S0.numel() * 4), o3(B * HV * 128 * 2);
  cuda_check(cudaMemcpy(S3.p, d.S0.p, S3.bytes, cudaMemcpyDeviceToDevice), "copy");
  o3.poison();
  dd.state = S3.as<float>(); dd.o = o3.as<bf16_t>();
  kernels::kda_decode(dd, nullptr);
  cuda_check(cudaDeviceSynchronize(), "decode");
  const auto mo = compare(download_bf16(o3), ref.o.data), ms = compare(download_f32(S3), ref.S_final.data);
  std::printf("decode one step vs truth: o %.4e state %.4e\n", mo.rel_rms, ms.rel_rms);
  {
    // decode is fp32 math: only the bf16 output rounding, which on 1536 values scatters around 1.7e-3
    std::vector<double> fl = ref.o.data;
    for (auto& x : fl) x = round_bf16(x);
    const double floor = compare(fl, ref.o.data).rel_rms;
    CHECK(mo.rel_rms <= std::max(tol::kda_bf16_goal.value, (1.0 + tol::twin_vs_kernel.value) * floor));
  }
  CHECK(ms.rel_rms <= tol::f32_vs_truth.value);
}

TEST_CASE("bad inputs give clear errors before any launch", "[gpu][kda]") {
  const KdaInputs in = make_inputs(1, 20, 1, 1, fresh_seed());
  const DevInputs d(in);
  DevBuf o(in.T * 128 * 2), ws(1 << 20);
  auto good = prefill_args(in, d);
  good.o = o.as<bf16_t>();
  good.workspace = ws.p;
  good.workspace_bytes = ws.bytes;
  REQUIRE_NOTHROW(kernels::kda_prefill(good, nullptr));
  cuda_check(cudaDeviceSynchronize(), "good");
  auto bad = good;
  bad.D = 96;  // (64 and 256 are supported: see the [dim] cases)
  CHECK_THROWS_AS(kernels::kda_prefill(bad, nullptr), Error);
  bad = good;
  bad.T = 0;
  CHECK_THROWS_AS(kernels::kda_prefill(bad, nullptr), Error);
  bad = good;
  bad.q = good.q + 1;  // 2-byte offset: not 16-byte aligned
  CHECK_THROWS_AS(kernels::kda_prefill(bad, nullptr), Error);
  bad = good;
  bad.gate.g_min = -6.0f;
  CHECK_THROWS_AS(kernels::kda_prefill(bad, nullptr), Error);
  bad.gate.allow_unsafe_range = true;
  CHECK_NOTHROW(kernels::kda_prefill(bad, nullptr));
  bad = good;
  bad.gate.g_min = 0.0f;
  CHECK_THROWS_AS(kernels::kda_prefill(bad, nullptr), Error);
  bad = good;
  bad.gate.fused = false;
  CHECK_THROWS_AS(kernels::kda_prefill(bad, nullptr), Error);
  bad = good;
  bad.HV = 3;
  bad.H = 2;
  CHECK_THROWS_AS(kernels::kda_prefill(bad, nullptr), Error);
  bad = good;
  bad.workspace_bytes = 100;
  CHECK_THROWS_AS(kernels::kda_prefill(bad, nullptr), Error);
  bad = good;
  bad.o = nullptr;
  CHECK_THROWS_AS(kernels::kda_prefill(bad, nullptr), Error);
  kernels::KdaDecodeArgs dd;
  dd.B = 1; dd.H = 1; dd.HV = 1; dd.D = 96;
  CHECK_THROWS_AS(kernels::kda_decode(dd, nullptr), Error);
  dd.D = 128;
  CHECK_THROWS_AS(kernels::kda_decode(dd, nullptr), Error);  // null pointers
  cuda_check(cudaDeviceSynchronize(), "after bad inputs");
}

TEST_CASE("wgmma state pass: anchors <= 2.0e-3 vs float64, twin within 10%, close to the mma pass; shapes, varlen, "
          "overlapped schedule", "[gpu][kda][wg]") {
  const std::size_t anchors[][3] = {{1, 17, 1}, {3, 64, 1}, {1, 300, 2}, {1, 1000, 4}, {1, 4096, 2}};
  for (const auto& cs : anchors) {
    const KdaInputs in = make_inputs(cs[0], cs[1], cs[2], 1, 1234);
    const DevInputs d(in);
    const auto ref = kda_truth(in);
    const double e_twin = compare(kda_twin(in, kda_plan_kernel()).o.data, ref.o.data).rel_rms;
    const std::size_t no = in.B * in.T * in.HV * 128, ns = in.B * in.HV * 128 * 128;
    const auto a = prefill_args(in, d);
    const auto r3 = run_prefill(a, no, ns, force_pass(KdaStatePass::mma));
    const auto r = run_prefill(a, no, ns, force_pass(KdaStatePass::wgmma));
    CHECK(kernels::kda_prefill_plan(a).state_pass == KdaStatePass::wgmma);  // the rule's plan
    const auto rd = run_prefill(a, no, ns);
    CHECK(rd.o == r.o);
    CHECK(rd.S == r.S);
    const auto mo = compare(r.o, ref.o.data), ms = compare(r.S, ref.S_final.data);
    const auto d_o = compare(r.o, r3.o), d_s = compare(r.S, r3.S);
    std::printf("state wg anchor (B,T,H)=(%zu,%zu,%zu): o rel_rms %.4e (twin %.4e, |diff|/kernel %.3f)  state %.4e  "
                "vs mma: o %.3e (identical %d), S_final %.3e\n",
                cs[0], cs[1], cs[2], mo.rel_rms, e_twin, std::fabs(e_twin - mo.rel_rms) / mo.rel_rms, ms.rel_rms,
                d_o.rel_rms, static_cast<int>(r.o == r3.o), d_s.rel_rms);
    CAPTURE(cs[0], cs[1], cs[2], mo.rel_rms, e_twin, ms.rel_rms, d_o.rel_rms, d_s.rel_rms);
    REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
    CHECK(mo.rel_rms <= tol::kda_bf16_goal.value);
    CHECK(ms.rel_rms <= tol::kda_twin_state.value);
    CHECK(std::fabs(e_twin - mo.rel_rms) <= tol::twin_vs_kernel.value * mo.rel_rms);
    CHECK(d_o.rel_rms <= tol::kda_state_wgmma_vs_mma.value);
    CHECK(d_s.rel_rms <= tol::kda_state_wgmma_vs_mma.value);
  }
  struct Cs { std::size_t B, T, H, group; bool S0; };
  const Cs cases[] = {{1, 1, 1, 1, true},  {2, 15, 1, 2, true},   {8, 16, 2, 1, false}, {3, 17, 2, 2, true},
                      {8, 33, 1, 1, true}, {2, 1000, 2, 2, false}, {2, 4100, 1, 2, true}};
  for (const auto& cs : cases) {
    const KdaInputs in = make_inputs(cs.B, cs.T, cs.H, cs.group, fresh_seed());
    const DevInputs d(in);
    const std::size_t no = in.B * in.T * in.HV * 128, ns = in.B * in.HV * 128 * 128;
    auto a = prefill_args(in, d, cs.S0);
    const Overrides wg = force_pass(KdaStatePass::wgmma);
    const auto r3 = run_prefill(a, no, ns, force_pass(KdaStatePass::mma));
    const auto r = run_prefill(a, no, ns, wg);
    a.single_stream = true;  // no overlapped schedule
    const auto r1 = run_prefill(a, no, ns, wg);
    const auto ref = kda_truth(in, cs.S0);
    const auto mo = compare(r.o, ref.o.data), ms = compare(r.S, ref.S_final.data);
    double wo = 0, wsd = 0;  // per sequence vs mma: a wrong sequence / head / column block cannot hide in the total
    for (std::size_t b = 0; b < in.B; ++b) {
      wo = std::max(wo, rel_part(r.o, r3.o, b * in.T * in.HV * 128, (b + 1) * in.T * in.HV * 128));
      wsd = std::max(wsd, rel_part(r.S, r3.S, b * in.HV * 128 * 128, (b + 1) * in.HV * 128 * 128));
    }
    std::printf("state wg B=%zu T=%zu H=%zu HV=%zu S0=%d: o %.4e state %.4e; vs mma (worst sequence): o %.3e S_final %.3e; "
                "overlapped == unsegmented: %d\n", cs.B, cs.T, cs.H, in.HV, cs.S0, mo.rel_rms, ms.rel_rms, wo, wsd,
                static_cast<int>(r.o == r1.o && r.S == r1.S));
    CAPTURE(cs.B, cs.T, cs.H, in.HV, cs.S0, mo.rel_rms, ms.rel_rms, wo, wsd);
    REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
    CHECK(mo.rel_rms <= o_bound(in, ref.o.data, cs.S0));
    CHECK(ms.rel_rms <= tol::kda_twin_state.value);
    CHECK(wo <= tol::kda_state_wgmma_vs_mma.value);
    CHECK(wsd <= tol::kda_state_wgmma_vs_mma.value);
    CHECK(r.o == r1.o);
    CHECK(r.S == r1.S);
  }
  {  // varlen, last sequence of 1 token
    const std::vector<int> lens{37, 16, 100, 1};
    const int N = static_cast<int>(lens.size());
    const std::size_t H = 2, HV = 4;
    KdaInputs all = make_inputs(1, VarlenBatch::total(lens), H, HV / H, fresh_seed());
    const VarlenBatch vb(all, lens, fresh_seed());
    const DevInputs d(all);
    auto a = prefill_args(all, d);
    vb.apply(a);
    const auto r = run_prefill(a, all.T * HV * 128, N * HV * 128 * 128, force_pass(KdaStatePass::wgmma));
    for (int i = 0; i < N; ++i) {
      const KdaInputs s = vb.part(all, i);
      const auto ref = kda_truth(s);
      const auto mo = compare(vb.o_of(r.o, i, HV, 128), ref.o.data);
      const auto ms = compare(vb.S_of(r.S, i, HV, 128), ref.S_final.data);
      std::printf("state wg varlen seq %d (len %d): o %.4e state %.4e\n", i, lens[i], mo.rel_rms, ms.rel_rms);
      CAPTURE(i, lens[i], mo.rel_rms, ms.rel_rms);
      REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
      CHECK(mo.rel_rms <= o_bound(s, ref.o.data));
      CHECK(ms.rel_rms <= tol::kda_twin_state.value);
    }
  }
}

TEST_CASE("forced plans the kernels cannot run are refused before any launch, naming the override", "[gpu][kda]") {
  const KdaInputs in = make_inputs(1, 40, 1, 1, fresh_seed());
  const DevInputs d(in);
  const auto a = prefill_args(in, d);
  auto refused = [&](const Overrides& ov, const char* what) {
    std::string m = "(no error)";
    try {
      (void)run_prefill(a, in.T * 128, 128 * 128, ov);
    } catch (const Error& e) {
      m = e.what();
    }
    CAPTURE(what, m);
    CHECK(m.find(what) != std::string::npos);
    CHECK_THROWS_AS(kernels::kda_prefill_workspace_bytes(a, &ov), Error);
  };
  refused(force_pass(KdaStatePass::key_split), "overrides.state_pass = key_split");  // D = 256 only
  refused(force_pass(KdaStatePass::wgmma, KdaSchedule::segments), "overrides.segments");  // P = 0
  Overrides ov = force_segments(2);
  ov.state_pass = KdaStatePass::wgmma;  // the segment path runs the mma pass only
  refused(ov, "overrides.schedule = segments");
  refused(force_segments(1), "overrides.segments = 1");
  refused(force_segments(65), "overrides.segments = 65");
  // the rule at this small shape: the one-shot wgmma pass; forced mma and one-shot run
  const kernels::KdaPrefillPlan pl = kernels::kda_prefill_plan(a);
  CHECK(pl.segments == 1);
  CHECK(pl.schedule == KdaSchedule::one_shot);
  CHECK(pl.state_pass == KdaStatePass::wgmma);
  CHECK_NOTHROW(run_prefill(a, in.T * 128, 128 * 128, force_pass(KdaStatePass::mma)));
  cuda_check(cudaDeviceSynchronize(), "after refused plans");
}

TEST_CASE("wgmma state pass: T = 65536, H = 32 one-shot vs the one-shot mma pass (all heads) and float64 (one head)",
          "[gpu][kda][wg][long]") {
  const std::size_t T = 65536, H = 32, D = 128;
  LongKdaInputs li(T, H, D, fresh_seed());
  const std::size_t nq = li.nq;
  const kernels::KdaPrefillArgs a = li.a;
  auto run = [&](KdaStatePass pass) { return run_prefill(a, nq, H * D * D, force_pass(pass)); };
  const auto r3 = run(KdaStatePass::mma);
  const std::size_t hv = 21;
  const KdaInputs in = long_head_inputs(li, hv);  // head hv as a B = 1, H = 1 problem (heads are independent)
  const auto ref = kda_truth(in);
  {  // the wgmma pass: the rule's choice here on 132 SMs
    const auto r = run(KdaStatePass::wgmma);
    const auto d_o = compare(r.o, r3.o), d_s = compare(r.S, r3.S);
    const double tol_mma = tol::kda_state_wgmma_vs_mma.value;
    // head hv: o rows are [T][H][D] with the head in the middle
    std::vector<double> ko(T * D);
    for (std::size_t t = 0; t < T; ++t)
      std::copy(r.o.begin() + (t * H + hv) * D, r.o.begin() + (t * H + hv + 1) * D, ko.begin() + t * D);
    const std::vector<double> kS(r.S.begin() + hv * D * D, r.S.begin() + (hv + 1) * D * D);
    const auto mo = compare(ko, ref.o.data), ms = compare(kS, ref.S_final.data);
    std::printf("state wgmma T=65536 H=32 one-shot: all heads vs mma one-shot: o %.3e S_final %.3e (nan %zu); head %zu vs "
                "float64: o %.4e state %.4e\n",
                d_o.rel_rms, d_s.rel_rms, static_cast<std::size_t>(d_o.nan_count), hv, mo.rel_rms, ms.rel_rms);
    CAPTURE(d_o.rel_rms, d_s.rel_rms, mo.rel_rms, ms.rel_rms);
    REQUIRE(d_o.nan_count + d_o.inf_count + d_s.nan_count + d_s.inf_count == 0);
    CHECK(d_o.rel_rms <= tol_mma);
    CHECK(d_s.rel_rms <= tol_mma);
    CHECK(mo.rel_rms <= tol::kda_bf16_goal.value);
    CHECK(ms.rel_rms <= tol::kda_twin_state.value);
  }
}

// ---- D = d_k = d_v = 64 and 256 (KdaPrefillArgs::D, KdaDecodeArgs::D), tag [dim] ------------------------
// The same kinds of cases as D = 128 above: anchors vs float64 and the twin, shapes, the overlapped schedule,
// varlen, the segment path (D = 64) / its refusal (D = 256), prefill-then-decode, decode vs truth, bad D.
// Twin predictions on the CPU before any run (seed 1234, anchor cases (1,17,1) (3,64,1) (1,300,2) (1,1000,4)):
// D = 64: o 1.641e-3 1.719e-3 1.653e-3 1.678e-3, state 2.28e-3 2.24e-3 2.26e-3 2.20e-3;
// D = 256: o 1.673e-3 1.722e-3 1.660e-3 1.673e-3, state 2.35e-3 2.40e-3 2.40e-3 2.38e-3.
namespace {
constexpr std::size_t kDims[] = {64, 256};
}  // namespace

TEST_CASE("D = 64, 256: anchor cases <= 2.0e-3 vs float64, state <= 3.0e-3, twin within 10%", "[gpu][kda][dim]") {
  for (const std::size_t D : kDims) {
    const std::size_t cases[][3] = {{1, 17, 1}, {3, 64, 1}, {1, 300, 2}, {1, 1000, 4}};
    for (const auto& cs : cases) {
      const KdaInputs in = make_inputs(cs[0], cs[1], cs[2], 1, 1234, D);
      const DevInputs d(in);
      const auto ref = kda_truth(in);
      const auto tw = kda_twin(in, kda_plan_kernel());
      const double e_twin = compare(tw.o.data, ref.o.data).rel_rms, s_twin = compare(tw.S_final.data, ref.S_final.data).rel_rms;
      const auto r = run_prefill(prefill_args(in, d), in.B * in.T * in.HV * D, in.B * in.HV * D * D);
      const auto mo = compare(r.o, ref.o.data), ms = compare(r.S, ref.S_final.data);
      std::printf("dim D=%zu anchor (B,T,H)=(%zu,%zu,%zu): o rel_rms %.4e (twin %.4e, |diff|/kernel %.3f)  state %.4e "
                  "(twin %.4e)  max_ulp %lld\n",
                  D, cs[0], cs[1], cs[2], mo.rel_rms, e_twin, std::fabs(e_twin - mo.rel_rms) / mo.rel_rms, ms.rel_rms,
                  s_twin, static_cast<long long>(mo.max_ulp_bf16));
      CAPTURE(D, cs[0], cs[1], cs[2], mo.rel_rms, e_twin, ms.rel_rms, s_twin);
      REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
      CHECK(mo.rel_rms <= tol::kda_bf16_goal.value);
      CHECK(ms.rel_rms <= tol::kda_twin_state.value);
      CHECK(std::fabs(e_twin - mo.rel_rms) <= tol::twin_vs_kernel.value * mo.rel_rms);
      CHECK(std::fabs(s_twin - ms.rel_rms) <= tol::twin_vs_kernel.value * ms.rel_rms);
    }
  }
}

TEST_CASE("D = 64, 256: shapes T in {1,15,16,17,1000,4100}, B = 2, HV = 2H, with and without S0; overlapped schedule",
          "[gpu][kda][dim]") {
  struct Cs { std::size_t B, T, H, group; bool S0; };
  const Cs cases[] = {{1, 1, 1, 1, true},    {2, 1, 1, 2, true},    {2, 15, 1, 2, true},   {2, 16, 2, 1, false},
                      {2, 17, 2, 2, true},   {2, 1000, 1, 2, false}, {2, 1000, 2, 2, true}, {2, 4100, 1, 2, true}};
  for (const std::size_t D : kDims)
    for (const auto& cs : cases) {
      const KdaInputs in = make_inputs(cs.B, cs.T, cs.H, cs.group, fresh_seed(), D);
      const DevInputs d(in);
      const std::size_t no = in.B * in.T * in.HV * D, ns = in.B * in.HV * D * D;
      auto a = prefill_args(in, d, cs.S0);
      const auto r = run_prefill(a, no, ns);  // T >= 2048: the overlapped schedule (parts through an fp32 state buffer)
      a.single_stream = true;
      const auto r1 = run_prefill(a, no, ns);
      const auto ref = kda_truth(in, cs.S0);
      const auto mo = compare(r.o, ref.o.data), ms = compare(r.S, ref.S_final.data);
      const bool same = r.o == r1.o && r.S == r1.S;
      const double bound = o_bound(in, ref.o.data, cs.S0);
      std::printf("dim D=%zu shape B=%zu T=%zu H=%zu HV=%zu S0=%d: o %.4e (bound %.4e) state %.4e; overlapped == "
                  "unsegmented: %d\n",
                  D, cs.B, cs.T, cs.H, in.HV, cs.S0, mo.rel_rms, bound, ms.rel_rms, static_cast<int>(same));
      CAPTURE(D, cs.B, cs.T, cs.H, in.HV, cs.S0, mo.rel_rms, ms.rel_rms);
      REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
      CHECK(mo.rel_rms <= bound);
      CHECK(ms.rel_rms <= tol::kda_twin_state.value);
      CHECK(same);
      // per sequence: a wrong sequence or head offset at this D cannot hide in the total
      for (std::size_t b = 0; b < in.B; ++b) {
        const std::size_t lo = b * in.T * in.HV * D, hi = (b + 1) * in.T * in.HV * D;
        const auto mb = compare(std::vector<double>(r.o.begin() + lo, r.o.begin() + hi),
                                std::vector<double>(ref.o.data.begin() + lo, ref.o.data.begin() + hi));
        CAPTURE(b, mb.rel_rms);
        CHECK(mb.rel_rms <= 2 * bound);
      }
    }
}

TEST_CASE("D = 64, 256: varlen (cu_seqlens) with a last sequence of 1 token equals per-sequence truths", "[gpu][kda][dim]") {
  for (const std::size_t D : kDims)
    for (const std::vector<int>& lens : {std::vector<int>{37, 16, 100, 1}, std::vector<int>{1, 1, 5, 31, 17, 1}}) {
      const int N = static_cast<int>(lens.size());
      const std::size_t H = 2, HV = 4;
      KdaInputs all = make_inputs(1, VarlenBatch::total(lens), H, HV / H, fresh_seed(), D);
      const VarlenBatch vb(all, lens, fresh_seed());
      const DevInputs d(all);
      auto a = prefill_args(all, d);
      vb.apply(a);
      const auto r = run_prefill(a, all.T * HV * D, N * HV * D * D);
      double wo = 0, ws = 0;
      for (int i = 0; i < N; ++i) {
        const KdaInputs s = vb.part(all, i);
        const auto ref = kda_truth(s);
        const auto mo = compare(vb.o_of(r.o, i, HV, D), ref.o.data);
        const auto ms = compare(vb.S_of(r.S, i, HV, D), ref.S_final.data);
        wo = std::max(wo, mo.rel_rms);
        ws = std::max(ws, ms.rel_rms);
        CAPTURE(D, i, lens[i], mo.rel_rms, ms.rel_rms);
        REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
        CHECK(mo.rel_rms <= o_bound(s, ref.o.data));
        CHECK(ms.rel_rms <= tol::kda_twin_state.value);
      }
      std::printf("dim D=%zu varlen %d sequences (last len 1): worst o %.4e, worst state %.4e vs float64\n", D, N, wo, ws);
    }
}

TEST_CASE("D = 64: segment-parallel state pass (forced) vs float64, twin segment mode, one-shot; D = 256 refuses it",
          "[gpu][kda][dim][segments]") {
  struct Cs { std::size_t B, T, H, group; int P; bool lm; };
  const Cs cases[] = {{2, 1000, 1, 2, 3, false}, {1, 4100, 1, 2, 4, true}, {1, 17, 1, 1, 2, false}};
  for (const auto& cs : cases) {
    KdaInputs in = make_inputs(cs.B, cs.T, cs.H, cs.group, fresh_seed(), 64);
    if (cs.lm) make_long_memory(in);
    const DevInputs d(in);
    const std::size_t no = in.B * in.T * in.HV * 64, ns = in.B * in.HV * 64 * 64;
    const auto a = prefill_args(in, d);
    const Overrides seg = force_segments(cs.P);
    REQUIRE(kernels::kda_prefill_plan(a, &seg).segments == cs.P);
    const auto rs = run_prefill(a, no, ns, seg);
    const auto r1 = run_prefill(a, no, ns, force_pass(KdaStatePass::mma));
    const auto ref = kda_truth(in);
    KdaTwinPlan tp = kda_plan_kernel();
    tp.segments = static_cast<std::size_t>(cs.P);
    const auto tw = kda_twin(in, tp);
    const auto mo = compare(rs.o, ref.o.data), ms = compare(rs.S, ref.S_final.data), m1 = compare(r1.o, ref.o.data);
    const double e_tw = compare(tw.o.data, ref.o.data).rel_rms, s_tw = compare(tw.S_final.data, ref.S_final.data).rel_rms;
    std::printf("dim D=64 segments P=%d %s B=%zu T=%zu HV=%zu: o %.4e (twin seg %.4e, |diff|/kernel %.3f; one-shot %.4e) "
                "state %.4e (twin %.4e)\n",
                cs.P, cs.lm ? "long-memory" : "anchor", cs.B, cs.T, in.HV, mo.rel_rms, e_tw,
                std::fabs(e_tw - mo.rel_rms) / mo.rel_rms, m1.rel_rms, ms.rel_rms, s_tw);
    CAPTURE(cs.P, cs.lm, cs.T, mo.rel_rms, e_tw, m1.rel_rms, ms.rel_rms, s_tw);
    REQUIRE(mo.nan_count + mo.inf_count + ms.nan_count + ms.inf_count == 0);
    CHECK(std::fabs(e_tw - mo.rel_rms) <= tol::twin_vs_kernel.value * mo.rel_rms);
    CHECK(std::fabs(s_tw - ms.rel_rms) <= tol::twin_vs_kernel.value * ms.rel_rms);
    CHECK(mo.rel_rms <= (1.0 + tol::twin_vs_kernel.value) * m1.rel_rms);
    if (!cs.lm) {
      CHECK(mo.rel_rms <= o_bound(in, ref.o.data));
      CHECK(ms.rel_rms <= tol::kda_twin_state.value);
    }
  }
  // D = 256: a forced segment count is refused (before any launch), the rule takes the one-shot key-split pass
  const KdaInputs in = make_inputs(1, 40, 1, 1, fresh_seed(), 256);
  const DevInputs d(in);
  auto a = prefill_args(in, d);
  const Overrides seg2 = force_segments(2);
  CHECK_THROWS_AS(run_prefill(a, in.T * 256, 256 * 256, seg2), Error);
  CHECK_THROWS_AS(kernels::kda_prefill_workspace_bytes(a, &seg2), Error);
  a.T = 65536;  // (shape only: kda_prefill_plan reads no pointer) the wave model would take P = 3 here at D = 128
  a.H = a.HV = 32;
  CHECK(kernels::kda_prefill_plan(a).segments == 1);
  CHECK(kernels::kda_prefill_plan(a).state_pass == KdaStatePass::key_split);
}

TEST_CASE("D = 64, 256: prefill-then-decode == prefill of the longer sequence; decode vs float64; decode in a graph",
          "[gpu][kda][dim]") {
  for (const std::size_t D : kDims) {
    const std::size_t B = 2, T0 = 37, steps = 5, H = 2, HV = 4;
    const KdaInputs in = make_inputs(B, T0 + steps, H, HV / H, fresh_seed(), D);
    const DevInputs d(in);
    const auto ref = kda_truth(in);
    const auto full = run_prefill(prefill_args(in, d), B * in.T * HV * D, B * HV * D * D);
    const auto [o_pd, S_pd] = prefill_then_decode(in, d, prefill_args(in, d), T0);
    const auto m_o = compare(o_pd, ref.o.data), m_S = compare(S_pd, ref.S_final.data);
    const auto m_same_o = compare(o_pd, full.o), m_same_S = compare(S_pd, full.S);
    std::printf("dim D=%zu prefill(%zu)+decode(%zu) vs truth: o %.4e state %.4e; vs prefill(%zu): o %.4e state %.4e\n", D,
                T0, steps, m_o.rel_rms, m_S.rel_rms, in.T, m_same_o.rel_rms, m_same_S.rel_rms);
    CAPTURE(D, m_o.rel_rms, m_S.rel_rms, m_same_o.rel_rms, m_same_S.rel_rms);
    REQUIRE(m_o.nan_count + m_o.inf_count + m_S.nan_count + m_S.inf_count == 0);
    CHECK(m_o.rel_rms <= tol::kda_bf16_goal.value);
    CHECK(m_S.rel_rms <= tol::kda_twin_state.value);
    CHECK(m_same_o.rel_rms <= 2 * tol::kda_bf16_goal.value);
    CHECK(m_same_S.rel_rms <= 2 * tol::kda_twin_state.value);

    // one decode step from S0 vs the truth, and the same step in a CUDA graph (3 replays == 3 launches)
    const KdaInputs i1 = make_inputs(3, 1, 2, 2, fresh_seed(), D);
    const DevInputs d1(i1);
    const auto ref1 = kda_truth(i1);
    kernels::KdaDecodeArgs de;
    de.B = 3; de.H = 2; de.HV = 4; de.D = static_cast<int>(D);
    de.q = d1.q.as<bf16_t>(); de.k = d1.k.as<bf16_t>(); de.v = d1.v.as<bf16_t>(); de.g = d1.g.as<bf16_t>();
    de.beta = d1.beta.as<bf16_t>();
    de.gate.A_log = d1.A_log.as<float>(); de.gate.bias = d1.bias.as<float>(); de.gate.g_min = -5.0f;
    de.scale = static_cast<float>(i1.scale);
    DevBuf S1(i1.S0.numel() * 4), S2(i1.S0.numel() * 4), o1(3 * 4 * D * 2), o2(3 * 4 * D * 2);
    cuda_check(cudaMemcpy(S1.p, d1.S0.p, S1.bytes, cudaMemcpyDeviceToDevice), "copy");
    cuda_check(cudaMemcpy(S2.p, d1.S0.p, S2.bytes, cudaMemcpyDeviceToDevice), "copy");
    o1.poison();
    o2.poison();
    de.state = S1.as<float>(); de.o = o1.as<bf16_t>();
    kernels::kda_decode(de, nullptr);
    cuda_check(cudaDeviceSynchronize(), "decode");
    const auto mo = compare(download_bf16(o1), ref1.o.data), ms = compare(download_f32(S1), ref1.S_final.data);
    std::vector<double> fl = ref1.o.data;
    for (auto& x : fl) x = round_bf16(x);
    const double floor = compare(fl, ref1.o.data).rel_rms;
    for (int i = 0; i < 2; ++i) kernels::kda_decode(de, nullptr);
    de.state = S2.as<float>(); de.o = o2.as<bf16_t>();
    run_in_graph([&](cudaStream_t st) { kernels::kda_decode(de, st); }, 3);
    const bool graph_same = download_f32(S1) == download_f32(S2) && download_bf16(o1) == download_bf16(o2);
    std::printf("dim D=%zu decode one step vs truth: o %.4e (bf16 floor %.4e) state %.4e; graph == launches: %d\n", D,
                mo.rel_rms, floor, ms.rel_rms, static_cast<int>(graph_same));
    REQUIRE(mo.nan_count + ms.nan_count == 0);
    CHECK(mo.rel_rms <= std::max(tol::kda_bf16_goal.value, (1.0 + tol::twin_vs_kernel.value) * floor));
    CHECK(ms.rel_rms <= tol::f32_vs_truth.value);
    CHECK(graph_same);
  }
}

TEST_CASE("bad D (and state passes forced at a D they do not run) give clear errors before any launch", "[gpu][kda][dim]") {
  const KdaInputs in = make_inputs(1, 20, 1, 1, fresh_seed());
  const DevInputs d(in);
  DevBuf o(in.T * 256 * 2), ws(1 << 22);
  auto good = prefill_args(in, d);
  good.o = o.as<bf16_t>();
  good.workspace = ws.p;
  good.workspace_bytes = ws.bytes;
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  for (const int D : {96, 32, 0, 512, -128}) {
    auto bad = good;
    bad.D = D;
    const std::string m = message([&] { kernels::kda_prefill(bad, nullptr); });
    const std::string mw = message([&] { (void)kernels::kda_prefill_workspace_bytes(bad); });
    kernels::KdaDecodeArgs dd;
    dd.B = 1; dd.H = 1; dd.HV = 1; dd.D = D;
    const std::string md = message([&] { kernels::kda_decode(dd, nullptr); });
    std::printf("dim bad D = %d: prefill says \"%s\"; decode says \"%s\"\n", D, m.c_str(), md.c_str());
    CAPTURE(D, m, mw, md);
    const std::string named = "D = " + std::to_string(D);
    for (const std::string* s : {&m, &mw, &md}) {
      CHECK(s->find(named) != std::string::npos);
      CHECK(s->find("{64, 128, 256}") != std::string::npos);
    }
  }
  // state passes forced at a D they do not run (inputs of that D)
  for (const std::size_t D : kDims) {
    const KdaInputs i2 = make_inputs(1, 20, 1, 1, fresh_seed(), D);
    const DevInputs d2(i2);
    const KdaStatePass not_here[2][2] = {{KdaStatePass::key_split, KdaStatePass::wgmma},   // D = 64
                                         {KdaStatePass::mma, KdaStatePass::wgmma}};        // D = 256
    for (const KdaStatePass pass : not_here[D == 256 ? 1 : 0]) {
      const auto a = prefill_args(i2, d2);
      const std::string m = message([&] { (void)run_prefill(a, i2.T * D, D * D, force_pass(pass)); });
      CAPTURE(D, pass_name(pass), m);
      CHECK(m.find("D = " + std::to_string(D)) != std::string::npos);
      CHECK(m.find(std::string("overrides.state_pass = ") + pass_name(pass)) != std::string::npos);
    }
    auto a = prefill_args(i2, d2);  // the defaults run
    CHECK_NOTHROW(run_prefill(a, i2.T * D, D * D));
  }
  cuda_check(cudaDeviceSynchronize(), "after bad D");
}

TEST_CASE("D = 64, 256: T = 65536, H = 32 (D = 64: auto rule) vs the one-shot pass on all heads, no NaN",
          "[gpu][kda][dim][long]") {
  for (const std::size_t D : kDims) {
    const std::size_t T = 65536, H = 32;
    LongKdaInputs li(T, H, D, fresh_seed());
    const std::size_t nq = li.nq;
    [[maybe_unused]] DevBuf &q = li.q, &k = li.k, &v = li.v, &g = li.g, &beta = li.beta, &A_log = li.A_log,
                             &bias = li.bias, &S0 = li.S0;
    const kernels::KdaPrefillArgs a = li.a;
    const int P = kernels::kda_prefill_plan(a).segments;
    const auto r = run_prefill(a, nq, H * D * D);
    Overrides one;
    one.schedule = KdaSchedule::one_shot;
    const auto r1 = run_prefill(a, nq, H * D * D, one);
    const auto d_o = compare(r.o, r1.o), d_s = compare(r.S, r1.S);
    std::printf("dim D=%zu T=65536 H=32: auto P=%d; default vs one-shot: o %.3e S_final %.3e; nan o %zu S %zu\n", D, P,
                d_o.rel_rms, d_s.rel_rms, static_cast<std::size_t>(d_o.nan_count), static_cast<std::size_t>(d_s.nan_count));
    CAPTURE(D, P, d_o.rel_rms, d_s.rel_rms);
    REQUIRE(d_o.nan_count + d_o.inf_count + d_s.nan_count + d_s.inf_count == 0);
    if (D == 256) {
      CHECK(P == 1);
      CHECK(r.o == r1.o);
    }
    // (D = 64 segment path vs one-shot: printed; its accuracy is tested against the twin in the forced cases)
  }
}
