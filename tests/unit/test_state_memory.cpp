// A fixed state that overwrites and never gets slower, on the reference recurrence (docs/equations.md,
// sections 1 and 8): a written key reads back its value, the delta rule overwrites (linear attention adds),
// distinct keys do not interfere, the state has a fixed size whatever the context, and the decode-cost table
// (softmax reads grow with n, the KDA state read does not). A state held as d_v x d_k read as o = S k gives the
// same numbers as the reference's S^T (K3 report Eq. 1 orientation) read as S^T k.
#include <cstdio>

#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "reference/kda.hpp"

using namespace kdalab;
using namespace kdatest;

namespace {
constexpr Eigen::Index D = 4;
Vec<double> onehot(Eigen::Index i) { Vec<double> v = Vec<double>::Zero(D); v(i) = 1.0; return v; }
Vec<double> vec4(double a, double b, double c, double d) { Vec<double> v(4); v << a, b, c, d; return v; }
const Vec<double> kZeroG = Vec<double>::Zero(D);

/// A delta-rule write (beta = 1, no decay): one DeltaNet step of the reference.
Mat<double> delta_write(Mat<double> S, const Vec<double>& k, const Vec<double>& v, double beta = 1.0) {
  kda_step<double>(S, k, k, v, kZeroG, beta, 1.0, KdaVariant::deltanet);
  return S;
}
/// A linear-attention write: one linear-attention step of the reference.
Mat<double> linear_write(Mat<double> S, const Vec<double>& k, const Vec<double>& v) {
  kda_step<double>(S, k, k, v, kZeroG, 1.0, 1.0, KdaVariant::linear);
  return S;
}
/// A read: what the state associates with key k (S^T k in the KV layout).
Vec<double> read(const Mat<double>& S, const Vec<double>& k) { return S.transpose() * k; }
Mat<double> zeros() { return Mat<double>::Zero(D, D); }
}  // namespace

const Vec<double> k1 = onehot(1), k2 = onehot(2);
const Vec<double> a = vec4(9, 8, 7, 6), b = vec4(1, 2, 3, 4);

TEST_CASE("a key written then read back returns its value", "[kda][state]") {
  const Mat<double> S = delta_write(zeros(), k1, a);
  CHECK(read(S, k1) == a);
  // also with a random unit key and a state that already holds something (beta = 1: exact up to rounding)
  Rng rng(2);
  Vec<double> k = randn<double>(rng, D, 1).col(0);
  k.normalize();
  const Mat<double> S2 = delta_write(randn<double>(rng, D, D), k, b);
  CHECK((read(S2, k) - b).norm() <= 1e-14);
}

TEST_CASE("the delta rule overwrites a key, keeping the latest value", "[kda][state]") {
  const Mat<double> S = delta_write(delta_write(zeros(), k1, a), k1, b);
  std::printf("delta  read(k1): [%g, %g, %g, %g]  -> latest value b (old a gone)\n", read(S, k1)(0), read(S, k1)(1),
              read(S, k1)(2), read(S, k1)(3));
  CHECK(read(S, k1) == b);
  // the seed's own orientation (S_seed = S^T, o = S_seed k) gives the same state and read
  Mat<double> Sseed = Mat<double>::Zero(D, D);
  kda_step_seed<double>(Sseed, k1, k1, a, kZeroG, 1.0, 1.0);
  kda_step_seed<double>(Sseed, k1, k1, b, kZeroG, 1.0, 1.0);
  CHECK(Sseed == to_seed_layout(S));
  CHECK(Vec<double>(Sseed * k1) == b);
}

TEST_CASE("linear attention returns a + b for a key written twice where the delta rule returns b", "[kda][state]") {
  const Mat<double> L = linear_write(linear_write(zeros(), k1, a), k1, b);
  std::printf("linear read(k1): [%g, %g, %g, %g]  -> a+b, smeared\n", read(L, k1)(0), read(L, k1)(1), read(L, k1)(2),
              read(L, k1)(3));
  CHECK(read(L, k1) == Vec<double>(a + b));
  CHECK(read(delta_write(delta_write(zeros(), k1, a), k1, b), k1) == b);
}

TEST_CASE("distinct keys do not interfere in the shared state", "[kda][state]") {
  const Mat<double> S = delta_write(delta_write(zeros(), k1, a), k2, b);
  CHECK(read(S, k1) == a);
  CHECK(read(S, k2) == b);
  // overwriting k2 leaves k1 alone
  const Mat<double> S2 = delta_write(S, k2, a);
  CHECK(read(S2, k1) == a);
  CHECK(read(S2, k2) == a);
}

TEST_CASE("the recurrent state is a fixed d x d, whatever the context length", "[kda][state]") {
  for (std::size_t T : {1u, 10u, 1000u}) {
    const Problem p = make_problem(200 + T, 1, T, 1, 1, D, D);
    const KdaOutput<double> r = kda_recurrent(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale);
    CHECK(r.S_final.numel() == static_cast<std::size_t>(D * D));
    CHECK(r.S_final.shape == std::vector<std::size_t>{1, 1, D, D});
    CHECK(r.o.shape == std::vector<std::size_t>{1, T, 1, D});
  }
}

TEST_CASE("softmax decode reads grow with n, the KDA state read does not", "[kda][state][decode-cost]") {
  std::uint64_t prev = 0;
  for (std::uint64_t n : {1ull, 1000ull, 128000ull, 1000000ull}) {
    CHECK(softmax_decode_reads(n, 64) > prev);
    prev = softmax_decode_reads(n, 64);
    CHECK(kda_decode_reads(64, 64) == 4096u);
  }
  std::printf("%12s%15s%12s%10s\n", "context n", "softmax reads", "KDA reads", "speedup");
  const std::uint64_t expect64[] = {31, 4000, 31250};
  const std::uint64_t ns[] = {1000, 128000, 1000000};
  for (int i = 0; i < 3; ++i) {
    const std::uint64_t sm = softmax_decode_reads(ns[i], 64), kd = kda_decode_reads(64, 64);
    std::printf("%12llu%15llu%12llu%9llux\n", static_cast<unsigned long long>(ns[i]), static_cast<unsigned long long>(sm),
                static_cast<unsigned long long>(kd), static_cast<unsigned long long>(sm / kd));
    CHECK(sm / kd == expect64[i]);
  }
  CHECK(softmax_decode_reads(1000, 64) == 128000u);
  CHECK(softmax_decode_reads(128000, 64) == 16384000u);
  CHECK(softmax_decode_reads(1000000, 64) == 128000000u);
  // "check yourself": d_k = d_v = 128 after 1M tokens: 16,384 state numbers vs 256,000,000 cached
  CHECK(kda_decode_reads(128, 128) == 16384u);
  CHECK(softmax_decode_reads(1000000, 128) == 256000000u);
  CHECK(softmax_decode_reads(1000000, 128) / kda_decode_reads(128, 128) == 15625u);
  CHECK(softmax_decode_reads(1000000, 128) % kda_decode_reads(128, 128) == 0u);
}
