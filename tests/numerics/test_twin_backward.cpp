// The kernel twin of the CUDA KDA backward (numerics/kda_backward_twin.hpp) against the float64 oracle of the same
// problem form: the twin's error per gradient is what the GPU test holds the kernel to within 10%
// (tests/gpu/test_kda_backward.cpp), so the numbers it predicts are guarded here, on the CPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "numerics/kda_backward_twin.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

namespace {

struct Named {
  const char* name;
  const Tensor<double>* twin;
  const Tensor<double>* f32;
  const Tensor<double>* ref;
  bool bf16;
};

/// Every gradient of the twin within the kernel's tolerance; a bf16 gradient at its own rounding floor (the fp32
/// arithmetic below it: the unrounded fp32 form within f32 tolerance), an fp32 gradient within kda_bwd_f32.
void check_twin(const KdaBwdProblem& p) {
  const KdaBwdGrads ref = kda_backward_kernel_form<double>(p);
  const KdaBwdGrads f32 = kda_backward_kernel_form<float>(p);
  const KdaBwdGrads tw = kda_backward_twin(p);
  std::vector<Named> all = {{"dq", &tw.dq, &f32.dq, &ref.dq, true},         {"dk", &tw.dk, &f32.dk, &ref.dk, true},
                            {"dv", &tw.dv, &f32.dv, &ref.dv, true},         {"dg", &tw.dg, &f32.dg, &ref.dg, true},
                            {"dbeta", &tw.dbeta, &f32.dbeta, &ref.dbeta, true}, {"dS0", &tw.dS0, &f32.dS0, &ref.dS0, false}};
  if (p.fused) {
    all.push_back({"dA_log", &tw.dA_log, &f32.dA_log, &ref.dA_log, false});
    all.push_back({"dbias", &tw.dbias, &f32.dbias, &ref.dbias, false});
  }
  for (const Named& n : all) {
    const double e = compare(n.twin->data, n.ref->data).rel_rms;
    const double e32 = compare(n.f32->data, n.ref->data).rel_rms;
    const double floor = bf16_rounding_floor(n.ref->data);
    std::printf("  %-6s twin %.3e  fp32 form %.3e  bf16 floor %.3e\n", n.name, e, e32, floor);
    CAPTURE(n.name, e, e32, floor);
    CHECK(std::isfinite(e));
    CHECK(e32 <= tol::kda_bwd_f32.value);
    if (n.bf16) {
      CHECK(e <= tol::kda_bwd_bf16.value);
      CHECK(e >= 0.95 * floor);  // the output rounding is in the twin
      CHECK(e <= 1.05 * floor);  // and the fp32 arithmetic stays below it
    } else {
      CHECK(e <= tol::kda_bwd_f32.value);
    }
  }
}

}  // namespace

TEST_CASE("backward twin: bf16 gradients at their rounding floor, fp32 gradients within fp32 noise (fused pre-ops)",
          "[twin][kda_bwd]") {
  std::printf("backward twin, D = 128, B = 1, T = 300, H = 1, HV = 2, fused pre-ops, S0, dS_T\n");
  check_twin(kda_backward_problem(1, 300, 1, 2, 128, {}, true, true, true, true, true, 20261205));
}

TEST_CASE("backward twin: gate, L2Norm and beta given; packed sequences", "[twin][kda_bwd]") {
  std::printf("backward twin, D = 64, B = 2, T = 40, H = 2, no pre-ops, S0\n");
  check_twin(kda_backward_problem(2, 40, 2, 1, 64, {}, false, false, false, true, false, 20261206));
  std::printf("backward twin, D = 64, varlen 5 64 1, H = 1, HV = 2, fused, dS_T\n");
  check_twin(kda_backward_problem(1, 0, 1, 2, 64, {5, 64, 1}, true, true, true, true, true, 20261207));
}
