// Unit tests of reference/kda_chunk.hpp: the chunkwise UT/WY form equals the recurrence for any
// C and T, in float64 and (small cases) cpp_bin_float_50; the 16x16 inverse by forward substitution
// and by the Neumann product; the [-1, 1] bound of the inverse; the factored-span refusal; varlen
// and decode after a chunked prefill (docs/equations.md section 4). The full mp50 grid is in
// test_kda_chunk_slow.cpp.
#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/kda_chunk.hpp"

using namespace kdalab;
using namespace kdatest;

TEST_CASE("chunked == recurrent in float64 for C in {1,2,3,16,32,64,128} x T in {1,15,16,17,100,257}") {
  double worst = 0;
  int case_no = 0;
  for (std::size_t C : {1u, 2u, 3u, 16u, 32u, 64u, 128u})
    for (std::size_t T : {1u, 15u, 16u, 17u, 100u, 257u}) {
      const Problem p = make_problem(1000 + C * 1000 + T, 1, T, 2, 4, 8, 6);  // grouped value heads HV = 2H
      const auto r = kda_recurrent(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale);
      ChunkOptions opt;
      opt.C = C;
      opt.inverse = (case_no++ % 2) ? TriInverse::neumann : TriInverse::forward_substitution;
      const auto c = kda_chunked(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, opt);
      const double eo = rel_err(c.o, r.o), es = rel_err(c.S_final, r.S_final);
      INFO("C = " << C << ", T = " << T << ", inverse " << tri_inverse_name(opt.inverse) << ": o " << eo << ", S " << es);
      CHECK(eo <= tol::f64_identity.value);
      CHECK(es <= tol::f64_identity.value);
      worst = std::max({worst, eo, es});
    }
  std::printf("float64 chunked vs recurrent, 42 (C, T) cases: worst relative error %.3g\n", worst);
  CHECK(worst > 0.0);
}

TEST_CASE("chunked == recurrent in cpp_bin_float_50 (small subset; full grid in the slow test)") {
  for (std::size_t C : {1u, 3u, 16u, 32u})
    for (std::size_t T : {1u, 17u, 40u}) {
      const Problem p = make_problem(2000 + C * 100 + T, 1, T, 1, 1, 4, 4);
      const auto m = p.as<mp50>();
      const auto r = kda_recurrent<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale);
      ChunkOptions opt;
      opt.C = C;
      opt.inverse = (T == 17) ? TriInverse::neumann : TriInverse::forward_substitution;
      const auto c = kda_chunked<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale, opt);
      const double eo = rel_err(c.o, r.o), es = rel_err(c.S_final, r.S_final);
      INFO("C = " << C << ", T = " << T << ": o " << eo << ", S " << es);
      CHECK(eo <= tol::mp_identity.value);
      CHECK(es <= tol::mp_identity.value);
    }
}

TEST_CASE("float64 chunked == cpp_bin_float_50 truth") {
  const Problem p = make_problem(41, 1, 100, 1, 2, 8, 8);
  ChunkOptions opt;
  opt.C = 64;
  const auto d = kda_chunked(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, opt);
  const auto m = p.as<mp50>();
  const auto t = kda_recurrent<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale);
  const double eo = rel_err<mp50>(d.o.cast<mp50>(), t.o), es = rel_err<mp50>(d.S_final.cast<mp50>(), t.S_final);
  INFO("o " << eo << ", S " << es);
  CHECK(eo <= tol::f64_vs_mp.value);
  CHECK(es <= tol::f64_vs_mp.value);
}

TEST_CASE("float32 chunked (C = 64, 16-token tiles, g_min = -5: span 80) vs the float64 truth") {
  const Problem p = make_problem(52, 1, 200, 2, 2, 16, 16);
  const auto r = kda_recurrent(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale);
  const auto f = p.as<float>();
  ChunkOptions opt;
  opt.C = 64;
  const auto c = kda_chunked<float>(f.q, f.k, f.v, f.g, f.beta, &f.S0, f.scale, opt);
  const double e = rel_err(c.o.cast<double>(), r.o);
  std::printf("float32 chunked (C = 64) vs float64 truth: relative error %.3g\n", e);
  CHECK(e <= tol::f32_vs_truth.value);
  opt.tile = 0;  // 64 tokens factored at once: 320 nats > 80, refused in float32
  require_error([&] { kda_chunked<float>(f.q, f.k, f.v, f.g, f.beta, &f.S0, f.scale, opt); }, {"'C'", "float32"});
}

TEST_CASE("every variant: chunked == recurrent") {
  const Problem p = make_problem(42, 2, 37, 2, 2, 5, 4);
  for (KdaVariant var : {KdaVariant::kda, KdaVariant::gated_deltanet, KdaVariant::deltanet, KdaVariant::gla,
                         KdaVariant::linear}) {
    ChunkOptions opt;
    opt.C = 16;
    const auto r = kda_recurrent(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, var);
    const auto c = kda_chunked(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, opt, var);
    INFO(variant_name(var));
    CHECK(rel_err(c.o, r.o) <= tol::f64_identity.value);
    CHECK(rel_err(c.S_final, r.S_final) <= tol::f64_identity.value);
  }
}

TEST_CASE("16x16 inverse: forward substitution == Neumann product == tiled, and L X = I") {
  Rng rng(43);
  const Mat<double> k = randn<double>(rng, 16, 8), g = randv<double>(rng, 16 * 8, -5.0, 0.0).reshaped<Eigen::RowMajor>(16, 8);
  const Vec<double> beta = randv<double>(rng, 16, 0.0, 1.0);
  const Mat<double> L = ut_lower<double>(k, g, beta);
  const Mat<double> Xf = tri_inverse<double>(L, TriInverse::forward_substitution);
  const Mat<double> Xn = tri_inverse<double>(L, TriInverse::neumann);
  CHECK(rel_err<double>(Xn, Xf) <= tol::f64_identity.value);
  CHECK((L * Xf - Mat<double>::Identity(16, 16)).norm() <= 1e-13);
  for (Eigen::Index F : {1, 3, 4, 7})
    for (TriInverse m : {TriInverse::forward_substitution, TriInverse::neumann})
      CHECK(rel_err<double>(tri_inverse_tiled<double>(L, F, m), Xf) <= tol::f64_identity.value);
  // in mp50 the two methods agree to ~1e-50
  const Mat<mp50> Lm = ut_lower<mp50>(k.cast<mp50>(), g.cast<mp50>(), beta.cast<mp50>());
  CHECK(rel_err<mp50>(tri_inverse<mp50>(Lm, TriInverse::neumann), tri_inverse<mp50>(Lm, TriInverse::forward_substitution)) <=
        tol::mp_identity.value);
  // the secondary tiling of the decays does not change L
  CHECK(rel_err<double>(ut_lower<double>(k, g, beta, 4), L) <= tol::f64_identity.value);
}

TEST_CASE("with ||k|| = 1 and beta <= 1 every entry of the 16x16 inverse lies in [-1, 1]; with ||k|| = 3 not") {
  Rng rng(44);
  double max_unit = 0, max_three = 0, max_offdiag = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Eigen::Index dk = (trial % 3 == 0) ? 2 : 8;
    Mat<double> k = randn<double>(rng, 16, dk);
    if (trial % 4 == 0) k.col(0).array() += 3.0;  // strongly aligned keys: the hard case
    for (Eigen::Index r = 0; r < 16; ++r) k.row(r).normalize();
    Mat<double> g(16, dk);
    for (Eigen::Index i = 0; i < g.size(); ++i) g.data()[i] = (trial % 2) ? -5.0 * rng.uniform() : -0.01 * rng.uniform();
    Vec<double> beta = randv<double>(rng, 16, 0.0, 1.0);
    if (trial % 5 == 0) beta.setOnes();
    for (TriInverse m : {TriInverse::forward_substitution, TriInverse::neumann}) {
      const Mat<double> X = tri_inverse<double>(ut_lower<double>(k, g, beta), m);
      max_unit = std::max(max_unit, X.cwiseAbs().maxCoeff());
      max_offdiag = std::max(max_offdiag, Mat<double>(X - Mat<double>::Identity(16, 16)).cwiseAbs().maxCoeff());
      max_three = std::max(max_three, tri_inverse<double>(ut_lower<double>(Mat<double>(3.0 * k), g, beta), m).cwiseAbs().maxCoeff());
    }
  }
  std::printf("16x16 inverse, 200 trials: max |entry| %.6f (off the diagonal %.6f) with ||k|| = 1, %.3g with ||k|| = 3\n",
              max_unit, max_offdiag, max_three);
  CHECK(max_unit <= 1.0 + 1e-12);
  CHECK(max_offdiag > 0.9);  // the bound is approached off the unit diagonal, not vacuous
  CHECK(max_three > 1e3);
}

TEST_CASE("factored decay span: refused beyond 700 nats in float64 with a clear error; tiles lift it") {
  const Problem p = make_problem(45, 1, 300, 1, 1, 4, 4, -5.0);
  ChunkOptions opt;
  opt.C = 256;
  opt.tile = 0;  // factor over the whole chunk: 256 * 5 = 1280 nats
  require_error([&] { kda_chunked(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, opt); },
                {"'C'", "'g'", "256", "700", "float64"});
  opt.C = 128;  // 128 * 5 = 640 nats: accepted, and still exact
  const auto r = kda_recurrent(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale);
  CHECK(rel_err(kda_chunked(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, opt).o, r.o) <= tol::f64_identity.value);
  // an unbounded gate (g down to -30): 16-token tiles keep the span at 480 nats, so C = 64 works
  const Problem q = make_problem(46, 1, 150, 1, 1, 4, 4, -30.0);
  const auto rq = kda_recurrent(q.q, q.k, q.v, q.g, q.beta, &q.S0, q.scale);
  ChunkOptions tiled;
  tiled.C = 64;
  const auto cq = kda_chunked(q.q, q.k, q.v, q.g, q.beta, &q.S0, q.scale, tiled);
  CHECK(rel_err(cq.o, rq.o) <= tol::f64_identity.value);
  CHECK(rel_err(cq.S_final, rq.S_final) <= tol::f64_identity.value);
  tiled.tile = 0;  // 64 * 30 = 1920 nats without tiles
  require_error([&] { kda_chunked(q.q, q.k, q.v, q.g, q.beta, &q.S0, q.scale, tiled); }, {"'C'", "'g'"});
  // mp50 has no such limit
  const auto m = q.as<mp50>();
  const auto rm = kda_recurrent<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale);
  ChunkOptions small;
  small.C = 32;
  small.tile = 0;
  CHECK(rel_err(kda_chunked<mp50>(m.q, m.k, m.v, m.g, m.beta, &m.S0, m.scale, small).o, rm.o) <= tol::mp_identity.value);
}

TEST_CASE("chunked rejects bad input naming the tensor or option") {
  const Problem p = make_problem(47, 1, 10, 2, 2, 3, 3);
  ChunkOptions opt;
  opt.C = 0;
  require_error([&] { kda_chunked(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, opt); }, {"'C'", "C >= 1"});
  opt.C = 4;
  Tensor<double> g = p.g;
  g.data[5] = 1e-3;
  require_error([&] { kda_chunked(p.q, p.k, p.v, g, p.beta, &p.S0, p.scale, opt); }, {"'g'", "> 0"});
  Tensor<double> beta = p.beta;
  beta.data[1] = NAN;
  require_error([&] { kda_chunked(p.q, p.k, p.v, p.g, beta, &p.S0, p.scale, opt); }, {"'beta'", "non-finite"});
  require_error([&] { kda_chunked(p.q, p.k, Tensor<double>({1, 9, 2, 3}), p.g, p.beta, &p.S0, p.scale, opt); }, {"'v'"});
  const Problem p3 = make_problem(48, 1, 10, 2, 5, 3, 3);
  require_error([&] { kda_chunked(p3.q, p3.k, p3.v, p3.g, p3.beta, &p3.S0, p3.scale, opt); }, {"'v'", "HV = 5"});
}

TEST_CASE("varlen chunked == sequences one by one (last sequence of length 1) == varlen recurrent") {
  const std::vector<std::size_t> cu{0, 20, 21, 58, 59};
  const Problem p = make_problem(49, 1, 59, 1, 2, 4, 4);
  Rng rng(50);
  Tensor<double> S0({4, 2, 4, 4});
  rng.fill_normal(S0, 0.1);
  ChunkOptions opt;
  opt.C = 16;
  const auto c = kda_chunked_varlen(p.q, p.k, p.v, p.g, p.beta, &S0, cu, p.scale, opt);
  const auto r = kda_recurrent_varlen(p.q, p.k, p.v, p.g, p.beta, &S0, cu, p.scale);
  CHECK(rel_err(c.o, r.o) <= tol::f64_identity.value);
  CHECK(rel_err(c.S_final, r.S_final) <= tol::f64_identity.value);
  for (std::size_t n = 0; n + 1 < cu.size(); ++n) {
    Tensor<double> s0({1, 2, 4, 4});
    std::copy(S0.data.begin() + n * 32, S0.data.begin() + (n + 1) * 32, s0.data.begin());
    const auto one = kda_chunked(slice_tokens(p.q, cu[n], cu[n + 1]), slice_tokens(p.k, cu[n], cu[n + 1]),
                                 slice_tokens(p.v, cu[n], cu[n + 1]), slice_tokens(p.g, cu[n], cu[n + 1]),
                                 slice_tokens(p.beta, cu[n], cu[n + 1]), &s0, p.scale, opt);
    INFO("sequence " << n);
    CHECK(rel_err(slice_tokens(c.o, cu[n], cu[n + 1]), one.o) == 0.0);
    Tensor<double> sf({1, 2, 4, 4});
    std::copy(c.S_final.data.begin() + n * 32, c.S_final.data.begin() + (n + 1) * 32, sf.data.begin());
    CHECK(rel_err(sf, one.S_final) == 0.0);
  }
}

TEST_CASE("decode after a chunked prefill == chunked prefill of everything") {
  const std::size_t T = 50, T1 = 33;
  const Problem p = make_problem(51, 1, T, 2, 2, 6, 5);
  ChunkOptions opt;
  opt.C = 16;
  const auto full = kda_chunked(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, opt);
  const auto pre = kda_chunked(slice_tokens(p.q, 0, T1), slice_tokens(p.k, 0, T1), slice_tokens(p.v, 0, T1),
                               slice_tokens(p.g, 0, T1), slice_tokens(p.beta, 0, T1), &p.S0, p.scale, opt);
  Tensor<double> state = pre.S_final;
  double worst = 0;
  for (std::size_t t = T1; t < T; ++t) {
    // decode through the chunk path as a length-1 sequence on odd steps, through the recurrence on even ones
    const auto args = std::make_tuple(slice_tokens(p.q, t, t + 1), slice_tokens(p.k, t, t + 1), slice_tokens(p.v, t, t + 1),
                                      slice_tokens(p.g, t, t + 1), slice_tokens(p.beta, t, t + 1));
    const auto step = (t % 2) ? kda_chunked(std::get<0>(args), std::get<1>(args), std::get<2>(args), std::get<3>(args),
                                            std::get<4>(args), &state, p.scale, opt)
                              : kda_recurrent(std::get<0>(args), std::get<1>(args), std::get<2>(args), std::get<3>(args),
                                              std::get<4>(args), &state, p.scale);
    state = step.S_final;
    worst = std::max(worst, rel_err(step.o, slice_tokens(full.o, t, t + 1)));
  }
  CHECK(worst <= tol::f64_identity.value);
  CHECK(rel_err(state, full.S_final) <= tol::f64_identity.value);
}
