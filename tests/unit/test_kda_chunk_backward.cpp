// Unit tests of reference/kda_chunk_backward.hpp: the VJP of the chunkwise form equals the VJP of
// the recurrence (reference/kda_backward.hpp, checked against central differences in
// tests/unit/test_kda_backward.cpp) for every chunk size, T not a multiple of C included.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/kda_chunk_backward.hpp"

using namespace kdalab;
using namespace kdatest;

TEST_CASE("chunked VJP == recurrent VJP for any chunk size, T % C != 0 included", "[backward][chunk]") {
  const Problem p = make_problem(501, 2, 23, 1, 2, 4, 3);
  Rng rng(502);
  Tensor<double> dO({p.B, p.T, p.HV, p.dv}), dS_T({p.B, p.HV, p.dk, p.dv});
  rng.fill_normal(dO);
  rng.fill_normal(dS_T);
  const KdaGrad<double> ref = kda_recurrent_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, dO, &dS_T);
  for (const std::size_t C : {1, 2, 3, 5, 7, 16, 22, 23, 64}) {
    const KdaGrad<double> c = kda_chunked_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, dO, &dS_T, C);
    const std::vector<std::pair<const Tensor<double>*, const Tensor<double>*>> pairs = {
        {&c.dq, &ref.dq}, {&c.dk, &ref.dk}, {&c.dv, &ref.dv}, {&c.dg, &ref.dg}, {&c.dbeta, &ref.dbeta}, {&c.dS0, &ref.dS0}};
    const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "dS0"};
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      const double e = rel_err(*pairs[i].first, *pairs[i].second);
      INFO("chunk " << C << " (T = 23), " << names[i] << ": relative difference " << e);
      CHECK(e <= tol::f64_identity.value);
    }
  }
}

TEST_CASE("chunked VJP refuses a chunk whose cumulative decay leaves the factored range", "[backward][chunk][errors]") {
  Problem p = make_problem(511, 1, 40, 1, 1, 3, 2);
  for (auto& x : p.g.data) x = -30.0;  // 40 tokens x 30 nats = 1200 > 700
  const Tensor<double> dO({1, 40, 1, 2});
  require_error([&] { kda_chunked_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, dO, nullptr, 40); },
                {"kda_chunked_backward", "cumulative log-decay", "kda_recurrent_backward"});
  CHECK_NOTHROW(kda_chunked_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, dO, nullptr, 16));
}

TEST_CASE("chunked VJP == recurrent VJP in cpp_bin_float_50 (an exact reformulation)", "[backward][chunk][mp50]") {
  const Problem p = make_problem(521, 1, 13, 1, 2, 4, 3);
  const auto m = p.as<mp50>();
  Rng rng(522);
  Tensor<double> dO({p.B, p.T, p.HV, p.dv}), dS_T({p.B, p.HV, p.dk, p.dv});
  rng.fill_normal(dO);
  rng.fill_normal(dS_T);
  const Tensor<mp50> dOm = dO.cast<mp50>(), dS_Tm = dS_T.cast<mp50>();
  const KdaGrad<mp50> ref = kda_recurrent_backward<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale, dOm, &dS_Tm);
  for (const std::size_t C : {3, 16}) {
    const KdaGrad<mp50> c = kda_chunked_backward<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale, dOm, &dS_Tm, C);
    double worst = 0;
    for (const auto& [a, b] : {std::pair<const Tensor<mp50>*, const Tensor<mp50>*>{&c.dq, &ref.dq}, {&c.dk, &ref.dk},
                               {&c.dv, &ref.dv}, {&c.dg, &ref.dg}, {&c.dbeta, &ref.dbeta}, {&c.dS0, &ref.dS0}})
      worst = std::max(worst, rel_err<mp50>(*a, *b));
    INFO("chunk " << C << " (T = 13): worst relative difference " << worst);
    CHECK(worst <= tol::mp_identity.value);
  }
}
