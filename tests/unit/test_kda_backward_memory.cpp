// Unit tests of the memory of the KDA reverse sweeps: the checkpointed recurrence backward
// (reference/kda_backward.hpp) and the chunk-recompute chunked backward (reference/kda_chunk_backward.hpp)
// hold O(T / C) states of d_k x d_v, not O(T), counted by their states_held output; at T = 65,536 they
// run and agree with each other, and checkpointing changes no bit of the gradients.
#include <cstddef>
#include <vector>

#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/kda_chunk_backward.hpp"

using namespace kdalab;
using namespace kdatest;

namespace {
struct HeadUp {
  Head h;
  Mat<double> dO, dS_T;
};
HeadUp head_problem(std::uint64_t seed, Eigen::Index T, Eigen::Index dk, Eigen::Index dv) {
  HeadUp p{random_head(seed, T, dk, dv, 0.0, 1.0, 0.1, 0.2), Mat<double>(), Mat<double>()};
  Rng rng(seed + 1);
  p.dO = randn<double>(rng, T, dv);
  p.dS_T = randn<double>(rng, dk, dv);
  return p;
}
}  // namespace

TEST_CASE("the reverse sweeps hold ceil(T / C) (+ C) states, not T: counted, and bit-identical gradients",
          "[backward][memory]") {
  const Eigen::Index T = 1000, dk = 4, dv = 3;
  const HeadUp p = head_problem(701, T, dk, dv);
  const double scale = 0.5;
  std::size_t all_states = 0;
  const KdaHeadGrad<double> all = kda_recurrent_head_backward<double>(p.h.q, p.h.k, p.h.v, p.h.g, p.h.beta, p.h.S0, scale,
                                                                      p.dO, p.dS_T, KdaVariant::kda, 0, &all_states);
  CHECK(all_states == static_cast<std::size_t>(T) + 1);  // every S_{t-1} plus the one checkpoint S_0
  for (const Eigen::Index C : {Eigen::Index(32), Eigen::Index(kda_sqrt_checkpoint(T))}) {
    std::size_t held = 0;
    const KdaHeadGrad<double> c = kda_recurrent_head_backward<double>(p.h.q, p.h.k, p.h.v, p.h.g, p.h.beta, p.h.S0, scale,
                                                                      p.dO, p.dS_T, KdaVariant::kda, C, &held);
    INFO("checkpoint every " << C << " tokens (T = " << T << "): " << held << " states held");
    CHECK(held == static_cast<std::size_t>((T + C - 1) / C + C));
    CHECK(c.dq == all.dq);
    CHECK(c.dk == all.dk);
    CHECK(c.dv == all.dv);
    CHECK(c.dg == all.dg);
    CHECK(c.dbeta == all.dbeta);
    CHECK(c.dS0 == all.dS0);
  }
  CHECK(kda_sqrt_checkpoint(T) == 32);
  for (const Eigen::Index C : {Eigen::Index(16), Eigen::Index(64)}) {
    std::size_t held = 0;
    const KdaHeadGrad<double> c =
        kda_chunked_head_backward<double>(p.h.q, p.h.k, p.h.v, p.h.g, p.h.beta, p.h.S0, scale, p.dO, p.dS_T, C, &held);
    INFO("chunk " << C << " (T = " << T << "): " << held << " states held");
    CHECK(held == static_cast<std::size_t>((T + C - 1) / C));
    for (const auto& [a, b] : {std::pair<const Mat<double>*, const Mat<double>*>{&c.dq, &all.dq}, {&c.dk, &all.dk},
                               {&c.dv, &all.dv}, {&c.dg, &all.dg}, {&c.dS0, &all.dS0}})
      CHECK(rel_err(*a, *b) <= tol::f64_identity.value);
    CHECK(rel_err(Mat<double>(c.dbeta), Mat<double>(all.dbeta)) <= tol::f64_identity.value);
  }
}

TEST_CASE("T = 65,536: the chunk-recompute and checkpointed backwards run in O(sqrt(T)) / O(T / C) states and agree",
          "[backward][memory]") {
  const Eigen::Index T = 65536, dk = 4, dv = 4, C = 64;
  const HeadUp p = head_problem(711, T, dk, dv);
  std::size_t held_chunk = 0, held_rec = 0;
  const KdaHeadGrad<double> ch =
      kda_chunked_head_backward<double>(p.h.q, p.h.k, p.h.v, p.h.g, p.h.beta, p.h.S0, 0.5, p.dO, p.dS_T, C, &held_chunk);
  const Eigen::Index ck = static_cast<Eigen::Index>(kda_sqrt_checkpoint(T));
  const KdaHeadGrad<double> rc = kda_recurrent_head_backward<double>(p.h.q, p.h.k, p.h.v, p.h.g, p.h.beta, p.h.S0, 0.5, p.dO,
                                                                     p.dS_T, KdaVariant::kda, ck, &held_rec);
  INFO("chunked: " << held_chunk << " states; checkpointed recurrence (every " << ck << "): " << held_rec
                   << " states; keeping all would be " << T + 1);
  CHECK(held_chunk == static_cast<std::size_t>(T / C));  // 1024 states = 128 KiB here; 512 MiB at d_k = d_v = 128
  CHECK(held_rec == 2 * static_cast<std::size_t>(ck));   // 512 states
  for (const auto& [a, b] : {std::pair<const Mat<double>*, const Mat<double>*>{&ch.dq, &rc.dq}, {&ch.dk, &rc.dk},
                             {&ch.dv, &rc.dv}, {&ch.dg, &rc.dg}, {&ch.dS0, &rc.dS0}})
    CHECK(rel_err(*a, *b) <= tol::f64_identity.value);
}
