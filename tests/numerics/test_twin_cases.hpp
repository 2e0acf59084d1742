#pragma once
// Shared helpers of the twin tests (test_twin*.cpp; not a test itself).
#include <array>
#include <cstdio>
#include <vector>

#include "numerics/kda_inputs.hpp"
#include "numerics/kda_twin.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/kda.hpp"
#include "tests/catch.hpp"

namespace twin_test {
using namespace kdalab;

/// anchor-kda inputs with HV = group * H value heads: drawn with HV heads, then q_raw / k_raw are
/// cut to the first H heads and the derived tensors recomputed.
inline KdaInputs grouped_inputs(std::size_t B, std::size_t T, std::size_t H, std::size_t group, std::size_t D,
                                std::uint64_t seed) {
  KdaInputs in = anchor_kda(B, T, H * group, D, seed);
  Tensor<double> q({B, T, H, D}), k({B, T, H, D});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < D; ++i) {
          q(b, t, h, i) = in.q_raw(b, t, h, i);
          k(b, t, h, i) = in.k_raw(b, t, h, i);
        }
  in.q_raw = q;
  in.k_raw = k;
  in.H = H;
  derive_kda(in);
  return in;
}

/// Relative RMS of o and of the final state of a twin plan against the float64 truth `ref` on `in`.
struct PlanErrs {
  double o, S;
};
inline PlanErrs plan_errs(const KdaInputs& in, const KdaOutput<double>& ref, const KdaTwinPlan& p) {
  const auto r = kda_twin(in, p);
  return {compare(r.o.data, ref.o.data).rel_rms, compare(r.S_final.data, ref.S_final.data).rel_rms};
}
/// One input of the state-precision studies: a numerics/kda_inputs.hpp kind at (T, H), D = 128, seed 1234.
struct KindRow {
  InputKind kind;
  std::size_t T, H;
  BetaDist beta;
};
inline KdaInputs kind_inputs(const KindRow& r) {
  KdaGenSpec s;
  s.T = r.T; s.H = r.H; s.d_k = s.d_v = 128; s.inputs = r.kind; s.beta = r.beta; s.seed = 1234;
  return kda_inputs(s);
}
/// The rows of the state-precision study tables (docs/kernels/kda_prefill.md): anchor, long memory up to T = 65536,
/// near-collinear and identical keys.
inline std::vector<KindRow> study_rows() {
  return {{InputKind::anchor, 17, 1, BetaDist::sigmoid},         {InputKind::anchor, 2048, 2, BetaDist::sigmoid},
          {InputKind::long_memory, 300, 1, BetaDist::sigmoid},   {InputKind::long_memory, 2048, 2, BetaDist::sigmoid},
          {InputKind::long_memory, 8192, 1, BetaDist::sigmoid},  {InputKind::long_memory, 65536, 1, BetaDist::sigmoid},
          {InputKind::collinear_keys, 64, 1, BetaDist::one},     {InputKind::collinear_keys_slow_decay, 64, 1, BetaDist::one},
          {InputKind::collinear_keys_slow_decay, 2048, 1, BetaDist::one}, {InputKind::identical_keys, 64, 1, BetaDist::one},
          {InputKind::collinear_keys, 64, 2, BetaDist::sigmoid}};
}
/// The float64 recurrence on `in` (its S0).
inline KdaOutput<double> truth(const KdaInputs& in) {
  return kda_recurrent<double>(in.q, in.k, in.v, in.g, in.beta, &in.S0, in.scale);
}
/// Holds plan `p` to the o and state goals on long-memory (T = 300), collinear keys with slow decay (64) and identical
/// keys (64), with its o at most `factor` times plan `q`'s on each.
inline void check_goals_beside(const KdaTwinPlan& p, const KdaTwinPlan& q, double factor) {
  for (const KindRow& r : {KindRow{InputKind::long_memory, 300, 1, BetaDist::sigmoid},
                           KindRow{InputKind::collinear_keys_slow_decay, 64, 1, BetaDist::one},
                           KindRow{InputKind::identical_keys, 64, 1, BetaDist::one}}) {
    const KdaInputs in = kind_inputs(r);
    const auto ref = truth(in);
    const PlanErrs e = plan_errs(in, ref, p), other = plan_errs(in, ref, q);
    CAPTURE(input_kind_name(r.kind), r.T, e.o, e.S, other.o, other.S);
    CHECK(e.o <= tol::kda_bf16_goal.value);
    CHECK(e.S <= tol::kda_state_goal.value);
    CHECK(e.o <= factor * other.o);
  }
}

struct AnchorCase {
  std::size_t B, T, H;
};
inline constexpr std::array<AnchorCase, 4> anchor_cases_fast{{{1, 17, 1}, {3, 64, 1}, {1, 300, 2}, {1, 1000, 4}}};

/// Measures the all-bf16 plan and the kernel plan on one anchor case (D = 128, seed 1234),
/// prints the errors, and holds the kernel plan under its tolerance.
inline void check_anchor_case(AnchorCase cs) {
  const KdaInputs in = anchor_kda(cs.B, cs.T, cs.H, 128, 1234);
  const auto ref = kda_recurrent<double>(in.q, in.k, in.v, in.g, in.beta, &in.S0, in.scale);
  std::vector<double> floor_o = ref.o.data;
  for (auto& x : floor_o) x = round_bf16(x);
  const double e_floor = compare(floor_o, ref.o.data).rel_rms;
  const auto m_bf16 = compare(kda_twin(in, kda_plan_all_bf16()).o.data, ref.o.data);
  const auto tk = kda_twin(in, kda_plan_kernel());
  const auto m_kern = compare(tk.o.data, ref.o.data);
  const auto m_state = compare(tk.S_final.data, ref.S_final.data);
  std::printf("anchor (B,T,H)=(%zu,%zu,%zu): all-bf16 %.3e  kernel-plan %.3e  (state %.3e)  bf16 floor %.3e\n",
              cs.B, cs.T, cs.H, m_bf16.rel_rms, m_kern.rel_rms, m_state.rel_rms, e_floor);
  CAPTURE(cs.B, cs.T, cs.H, m_bf16.rel_rms, m_kern.rel_rms, e_floor);
  CHECK(m_kern.nan_count == 0);
  CHECK(m_kern.rel_rms <= tol::kda_twin_plan.value);
  CHECK(m_kern.rel_rms <= tol::kda_bf16_goal.value);
  CHECK(m_state.rel_rms <= tol::kda_twin_state.value);
  // The all-bf16 plan is why the kernel plan exists: it misses the goal on these inputs.
  CHECK(m_bf16.rel_rms > tol::kda_bf16_goal.value);
}
}  // namespace twin_test
