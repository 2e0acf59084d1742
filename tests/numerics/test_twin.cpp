// The KDA kernel twin (numerics/kda_twin.hpp): float64 identity with the recurrence, and the
// accuracy of the precision plans on the anchor-kda cases (data/golden/kda_recurrent.h5) (the T = 4096 case is in
// test_twin_slow.cpp).
#include <cstdio>

#include "numerics/kda_twin.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/kda.hpp"
#include "tests/catch.hpp"
#include "tests/numerics/test_twin_cases.hpp"

using namespace kdalab;

TEST_CASE("twin with every format fp64 equals the float64 recurrence", "[twin]") {
  for (std::size_t C : {16u, 5u}) {
    for (bool fused : {true, false}) {
      // grouped value heads (HV = 2H), T not a multiple of C, D = 32 to stay fast
      KdaInputs in = twin_test::grouped_inputs(2, 37, 2, 2, 32, 7 + C);
      KdaTwinPlan p = kda_plan_fp64();
      p.chunk = C;
      p.fuse_gate = p.l2norm = p.beta_sigmoid = fused;
      const auto tw = kda_twin(in, p);
      const auto ref = kda_recurrent<double>(in.q, in.k, in.v, in.g, in.beta, &in.S0, in.scale);
      CAPTURE(C, fused);
      CHECK(compare(tw.o.data, ref.o.data).rel_rms <= tol::f64_identity.value);
      CHECK(compare(tw.S_final.data, ref.S_final.data).rel_rms <= tol::f64_identity.value);
    }
  }
}

TEST_CASE("twin without S0 equals the recurrence from a zero state", "[twin]") {
  KdaInputs in = anchor_kda(1, 21, 1, 16, 99);
  KdaTwinPlan p = kda_plan_fp64();
  p.use_S0 = false;
  Tensor<double> Z(in.S0.shape, 0.0);
  const auto tw = kda_twin(in, p);
  const auto ref = kda_recurrent<double>(in.q, in.k, in.v, in.g, in.beta, &Z, in.scale);
  CHECK(compare(tw.o.data, ref.o.data).rel_rms <= tol::f64_identity.value);
}

TEST_CASE("twin rejects bad plans and shapes", "[twin]") {
  KdaInputs in = anchor_kda(1, 4, 1, 8, 3);
  KdaTwinPlan p;
  p.chunk = 0;
  CHECK_THROWS(kda_twin(in, p));
  p.chunk = 16;
  // Kd's lo product a chunk late needs the fp16 plan's value scale and Kd alone split; the refusal names the option
  const auto refused = [&in](const KdaTwinPlan& q) {
    try {
      kda_twin(in, q);
    } catch (const Error& e) {
      return std::string(e.what()).find("kd_lo_delayed") != std::string::npos;
    }
    return false;
  };
  KdaTwinPlan late = kda_plan_state_f16_lo_late();
  CHECK_NOTHROW(kda_twin(in, late));
  late.value_scale = false;
  CHECK(refused(late));
  late = kda_plan_state_f16_lo_late();
  late.split.kd_D = true;
  CHECK(refused(late));
  late = kda_plan_state_f16_lo_late();
  late.split.kd_Kd = false;
  CHECK(refused(late));
  in.v = Tensor<double>({1, 4, 1, 7});
  CHECK_THROWS(kda_twin(in, p));
}

TEST_CASE("precision plans on the anchor-kda cases", "[twin]") {
  for (auto cs : twin_test::anchor_cases_fast) twin_test::check_anchor_case(cs);
}
