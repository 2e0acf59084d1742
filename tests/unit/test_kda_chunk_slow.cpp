// Slow (label `slow`): chunked == recurrent in cpp_bin_float_50 over the full grid
// C in {1, 2, 3, 16, 32, 64, 128} x T in {1, 15, 16, 17, 100, 257}, both inverse methods,
// d_k = d_v = 8, grouped value heads (H = 1, HV = 2), initial state (docs/equations.md section 4).
#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/kda_chunk.hpp"

using namespace kdalab;
using namespace kdatest;

TEST_CASE("chunked == recurrent in cpp_bin_float_50, full (C, T) grid") {
  double worst = 0;
  int case_no = 0;
  for (std::size_t T : {1u, 15u, 16u, 17u, 100u, 257u}) {
    const Problem p = make_problem(3000 + T, 1, T, 1, 2, 8, 8);
    const auto m = p.as<mp50>();
    const auto r = kda_recurrent<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale);
    for (std::size_t C : {1u, 2u, 3u, 16u, 32u, 64u, 128u}) {
      ChunkOptions opt;
      opt.C = C;
      opt.inverse = (case_no++ % 2) ? TriInverse::neumann : TriInverse::forward_substitution;
      const auto c = kda_chunked<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale, opt);
      const double eo = rel_err(c.o, r.o), es = rel_err(c.S_final, r.S_final);
      INFO("C = " << C << ", T = " << T << ": o " << eo << ", S " << es);
      CHECK(eo <= tol::mp_identity.value);
      CHECK(es <= tol::mp_identity.value);
      worst = std::max({worst, eo, es});
    }
  }
  std::printf("mp50 chunked vs recurrent, full grid: worst relative error %.3g\n", worst);
}
