// The state-product precision decision of the KDA kernel twin (numerics/kda_twin.hpp, "State-product precision";
// docs/kernels/kda_prefill.md, "State-product precision: the twin's decision"): on long-memory inputs and on
// near-collinear keys the kernel plan (bf16 operands in W S, Qg S, Kd^T D) misses the accuracy goals, while
// kda_plan_state_hilo() (Qg S and Kd^T D with both operands as bf16 hi + lo) meets them; carrying only S as hi + lo
// in W S and Qg S (the cheap fix) does not. D = 128, seed 1234, truth = the float64 recurrence on the same inputs.
#include <cstdio>

#include "numerics/kda_inputs.hpp"
#include "numerics/kda_twin.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/kda.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

namespace state_precision_test {
struct HiloErrs {
  double o, S;
};
HiloErrs hilo_twin_errors(const KdaInputs& in, const KdaOutput<double>& ref, const KdaTwinPlan& p) {
  const auto r = kda_twin(in, p);
  return {compare(r.o.data, ref.o.data).rel_rms, compare(r.S_final.data, ref.S_final.data).rel_rms};
}
/// The kernel plan, S-only hi + lo and the chosen plan on one input; prints their errors.
void check_hilo_case(InputKind kind, std::size_t T, BetaDist beta) {
  KdaGenSpec s;
  s.T = T; s.H = 1; s.d_k = s.d_v = 128; s.inputs = kind; s.beta = beta; s.seed = 1234;
  const KdaInputs in = kda_inputs(s);
  const auto ref = kda_recurrent<double>(in.q, in.k, in.v, in.g, in.beta, &in.S0, in.scale);
  KdaTwinPlan s_only;  // the cheap fix: S as hi + lo in W S and Qg S only
  s_only.split.ws_S = s_only.split.qs_S = true;
  const HiloErrs kern = hilo_twin_errors(in, ref, kda_plan_kernel()), cheap = hilo_twin_errors(in, ref, s_only),
             hilo = hilo_twin_errors(in, ref, kda_plan_state_hilo());
  std::printf("%s T=%zu beta=%s: kernel plan o %.3e S %.3e | S-only hi/lo o %.3e S %.3e | state hi/lo o %.3e S %.3e\n",
              input_kind_name(kind).c_str(), T, beta_dist_name(beta).c_str(), kern.o, kern.S, cheap.o, cheap.S, hilo.o,
              hilo.S);
  CAPTURE(input_kind_name(kind), T, kern.o, kern.S, cheap.o, cheap.S, hilo.o, hilo.S);
  CHECK(hilo.o <= tol::kda_bf16_goal.value);
  CHECK(hilo.S <= tol::kda_state_goal.value);
  // why the change is needed: the kernel plan misses the o goal here, and S alone as hi + lo is not enough
  CHECK(kern.o > tol::kda_bf16_goal.value);
  CHECK(cheap.o > tol::kda_bf16_goal.value);
}
}  // namespace state_precision_test
using namespace state_precision_test;

TEST_CASE("state hi/lo plan meets the goals on long-memory inputs where the kernel plan misses o", "[twin]") {
  check_hilo_case(InputKind::long_memory, 300, BetaDist::sigmoid);
}

TEST_CASE("state hi/lo plan meets the goals on near-collinear keys where the kernel plan misses o and S", "[twin]") {
  KdaGenSpec s;
  check_hilo_case(InputKind::collinear_keys_slow_decay, 64, BetaDist::one);
  // the kernel plan's final state misses its goal too on these keys (beta = 1 rewrites S along one direction)
  s.T = 64; s.H = 1; s.d_k = s.d_v = 128; s.inputs = InputKind::collinear_keys_slow_decay; s.beta = BetaDist::one;
  s.seed = 1234;
  const KdaInputs in = kda_inputs(s);
  const auto ref = kda_recurrent<double>(in.q, in.k, in.v, in.g, in.beta, &in.S0, in.scale);
  CHECK(hilo_twin_errors(in, ref, kda_plan_kernel()).S > tol::kda_state_goal.value);
}
