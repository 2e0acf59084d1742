// A cheaper accurate plan for the KDA state pass, decided on the twin (numerics/kda_twin.hpp, "State-product
// precision"; docs/kernels/kda_prefill.md): Qg S with tf32 operands (S straight from its fp32 accumulators, Qg as
// tf32: one product of k8 instructions instead of three bf16 products) beside Kd^T D as bf16 hi + lo. The hidden case
// prints the study table; the visible one holds the plan to the goals where kda_plan_state_hilo() holds.
#include <cstdio>

#include "tests/numerics/test_twin_cases.hpp"

using namespace kdalab;
using namespace twin_test;  // KindRow, kind_inputs, plan_errs, PlanErrs, truth

namespace twin_tf32_test {
/// Qg S as bf16 hi + lo, Kd^T D in tf32: the other half, for the table.
KdaTwinPlan plan_kd_tf32() {
  KdaTwinPlan p;
  p.split.qs_S = p.split.qs_Qg = true;
  p.kd = Format::tf32;
  return p;
}
}  // namespace twin_tf32_test
using namespace twin_tf32_test;

TEST_CASE("twin: Qg S in tf32 beside Kd^T D as bf16 hi + lo meets the o and state goals on long-memory and "
          "near-collinear inputs",
          "[twin]") {
  twin_test::check_goals_beside(kda_plan_state_qs_tf32(), kda_plan_state_hilo(), 1.10);  // within 10% of its o
}

TEST_CASE("twin study: tf32 in Qg S or in Kd^T D against the hi + lo plan (prints the table)", "[.][twin-study]") {
  std::printf("input (T, H, beta) | hi/lo plan o (S) | Qg S tf32 o (S) | Kd^T D tf32 o (S)\n");
  for (const KindRow& r : twin_test::study_rows()) {
    const KdaInputs in = kind_inputs(r);
    const auto ref = truth(in);
    const PlanErrs h = plan_errs(in, ref, kda_plan_state_hilo()), a = plan_errs(in, ref, kda_plan_state_qs_tf32()),
               b = plan_errs(in, ref, plan_kd_tf32());
    std::printf("%s (%zu, %zu, %s) | %.3e (%.2e) | %.3e (%.2e) | %.3e (%.2e)\n", input_kind_name(r.kind).c_str(), r.T,
                r.H, beta_dist_name(r.beta).c_str(), h.o, h.S, a.o, a.S, b.o, b.S);
    std::fflush(stdout);
  }
}
