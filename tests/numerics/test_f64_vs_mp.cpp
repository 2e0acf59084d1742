// float64 and float32 recurrences against the cpp_bin_float_50 truth on anchor-kda inputs: the proof
// that lets `kdalab parity` use a float64 truth for long T.
#include <array>

#include "numerics/metrics.hpp"
#include "numerics/random.hpp"
#include "numerics/tolerance.hpp"
#include "reference/kda.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

namespace {
struct Errs {
  double o64, s64, o32, s32;
};
Errs run(const KdaInputs& in) {
  const auto tm = kda_recurrent<mp50>(in.q.cast<mp50>(), in.k.cast<mp50>(), in.v.cast<mp50>(), in.g.cast<mp50>(),
                                      in.beta.cast<mp50>(), nullptr, mp50(in.scale));
  auto S0m = in.S0.cast<mp50>();
  const auto tmS = kda_recurrent<mp50>(in.q.cast<mp50>(), in.k.cast<mp50>(), in.v.cast<mp50>(), in.g.cast<mp50>(),
                                       in.beta.cast<mp50>(), &S0m, mp50(in.scale));
  const auto d = kda_recurrent<double>(in.q, in.k, in.v, in.g, in.beta, &in.S0, in.scale);
  auto S0f = in.S0.cast<float>();
  const auto f = kda_recurrent<float>(in.q.cast<float>(), in.k.cast<float>(), in.v.cast<float>(), in.g.cast<float>(),
                                      in.beta.cast<float>(), &S0f, static_cast<float>(in.scale));
  const auto o_t = tmS.o.cast<double>().data, s_t = tmS.S_final.cast<double>().data;
  // the zero-state truth differs from the S0 one: a test that S0 is used at all
  REQUIRE(rel_rms(tm.o.cast<double>().data, o_t) > 1e-3);
  return {rel_rms(d.o.data, o_t), rel_rms(d.S_final.data, s_t), rel_rms(f.o.cast<double>().data, o_t),
          rel_rms(f.S_final.cast<double>().data, s_t)};
}
}  // namespace

TEST_CASE("float64 recurrence is within 1e-12 of cpp_bin_float_50 on anchor-kda inputs") {
  for (auto [B, T, H, D] : {std::array<std::size_t, 4>{1, 17, 1, 128}, std::array<std::size_t, 4>{2, 48, 2, 32}}) {
    const KdaInputs in = anchor_kda(B, T, H, D, 20261129);
    const Errs e = run(in);
    CAPTURE(B, T, H, D, e.o64, e.s64, e.o32, e.s32);
    CHECK(e.o64 < tol::f64_vs_mp.value);
    CHECK(e.s64 < tol::f64_vs_mp.value);
    CHECK(e.o64 > 0.0);  // float64 is not the truth itself
    CHECK(e.o32 < tol::f32_vs_truth.value);
    CHECK(e.s32 < tol::f32_vs_truth.value);
    CHECK(e.o32 > 1e4 * e.o64);
  }
}
