// U stored in the prepare's slot as fp16 of U times 2^-x, x the exponent of the chunk's max |U| (numerics/kda_twin.hpp
// KdaTwinPlan::u_store), on top of either of the CUDA kernel's plans, which keep U in fp32 (docs/kernels/kda_prefill.md,
// "U as scaled fp16 in the slot"): what it costs against U kept in fp32, on the state-precision study's inputs; why fp16
// with the scale and not bf16; and that the scale keeps fp16's range out of the way whatever the scale of v.
#include <cmath>
#include <cstdio>

#include "tests/numerics/test_twin_cases.hpp"

using namespace kdalab;
using namespace twin_test;  // KindRow, kind_inputs, plan_errs, PlanErrs, truth

namespace twin_u_store_test {
KdaTwinPlan with_u(KdaTwinPlan p, Format f) {
  p.u_store = f;
  return p;
}
}  // namespace twin_u_store_test
using namespace twin_u_store_test;

TEST_CASE("twin: U stored as fp16 times its chunk's power of two keeps o within 2% of U kept in fp32 on both kernel "
          "plans, and the accurate plan's o and state goals, on anchor, long-memory and near-collinear inputs",
          "[twin]") {
  for (const KindRow& r : {KindRow{InputKind::anchor, 2048, 2, BetaDist::sigmoid},
                           KindRow{InputKind::long_memory, 2048, 2, BetaDist::sigmoid},
                           KindRow{InputKind::collinear_keys_slow_decay, 2048, 1, BetaDist::one},
                           KindRow{InputKind::identical_keys, 64, 1, BetaDist::one}}) {
    const KdaInputs in = kind_inputs(r);
    const auto ref = truth(in);
    for (const bool accurate : {false, true}) {
      const KdaTwinPlan plan = accurate ? kda_plan_state_f16() : kda_plan_kernel();
      REQUIRE(plan.u_store == Format::fp32);
      const PlanErrs f16 = plan_errs(in, ref, with_u(plan, Format::fp16)), f32 = plan_errs(in, ref, plan);
      std::printf("%s T = %zu, %s: o %.3e -> %.3e, state %.3e -> %.3e (U fp32 -> fp16)\n", input_kind_name(r.kind).data(),
                  r.T, accurate ? "accurate" : "fast", f32.o, f16.o, f32.S, f16.S);
      CAPTURE(input_kind_name(r.kind), r.T, accurate, f16.o, f16.S, f32.o, f32.S);
      CHECK(f16.o <= 1.02 * f32.o);
      if (accurate) {
        CHECK(f16.o <= tol::kda_bf16_goal.value);
        CHECK(f16.S <= tol::kda_state_goal.value);
      }
    }
  }
}

TEST_CASE("twin: U stored as bf16 instead (the same bytes as fp16) takes the fast plan's o on anchor inputs 20% or more "
          "above U in fp32, where fp16 stays within 2%",
          "[twin]") {
  const KdaInputs in = kind_inputs({InputKind::anchor, 2048, 2, BetaDist::sigmoid});
  const auto ref = truth(in);
  const PlanErrs b = plan_errs(in, ref, with_u(kda_plan_kernel(), Format::bf16));
  const PlanErrs h = plan_errs(in, ref, with_u(kda_plan_kernel(), Format::fp16));
  const PlanErrs f = plan_errs(in, ref, kda_plan_kernel());
  CAPTURE(b.o, h.o, f.o);
  CHECK(b.o >= 1.2 * f.o);
  CHECK(h.o <= 1.02 * f.o);
}

TEST_CASE("twin: with U's chunk scale, v and S0 at 2^40 and 2^-40, beyond fp16's range, give the fast plan with U as "
          "fp16 the errors of the unscaled inputs",
          "[twin]") {
  const KdaTwinPlan plan = with_u(kda_plan_kernel(), Format::fp16);
  const KdaInputs base = kind_inputs({InputKind::anchor, 40, 1, BetaDist::sigmoid});
  const PlanErrs e0 = plan_errs(base, truth(base), plan);
  for (const int x : {40, -40}) {
    KdaInputs in = base;
    for (auto& y : in.v.data) y = std::ldexp(y, x);
    for (auto& y : in.S0.data) y = std::ldexp(y, x);
    const auto ref = truth(in);
    const PlanErrs e = plan_errs(in, ref, plan);
    double vmax = 0;  // |v| sets |U|'s scale: outside fp16's range (max 65504, smallest subnormal 2^-24) here
    for (const double y : in.v.data) vmax = std::max(vmax, std::fabs(y));
    CAPTURE(x, e0.o, e0.S, e.o, e.S, vmax);
    CHECK((vmax > 65504.0 || vmax < std::ldexp(1.0, -24)));
    // the same fp16 digits at every scale: the same relative errors
    CHECK(std::fabs(e.o - e0.o) <= 1e-9 * e0.o);
    CHECK(std::fabs(e.S - e0.S) <= 1e-9 * e0.S);
  }
}
