// reference/softmax.hpp (the softmax memory) and reference/latent_memory.hpp (an MLA latent
// memory of one head): identities on seeded random inputs.
#include <cmath>

#include "numerics/random.hpp"
#include "numerics/tolerance.hpp"
#include "reference/latent_memory.hpp"
#include "reference/mla.hpp"
#include "reference/softmax.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

namespace {
Mat<double> randn(Rng& rng, Eigen::Index r, Eigen::Index c, double sigma = 1.0) {
  Mat<double> m(r, c);
  for (Eigen::Index i = 0; i < r; ++i)
    for (Eigen::Index j = 0; j < c; ++j) m(i, j) = sigma * rng.normal();
  return m;
}
double rel(const Mat<double>& a, const Mat<double>& b) { return (a - b).norm() / b.norm(); }
}  // namespace

TEST_CASE("softmax_read in float64 matches the multiprecision truth") {
  Rng rng(11);
  const Eigen::Index n = 37, dk = 8, dv = 5;
  const Mat<double> K = randn(rng, n, dk), V = randn(rng, n, dv);
  const Mat<double> q = randn(rng, dk, 1);
  const double scale = 1.0 / std::sqrt(double(dk));
  const Vec<double> o = softmax_read<double>(q.col(0), K, V, scale);
  // Truth: plain sum of exp(scale k.q) v / sum exp(...) in cpp_bin_float_50, no max shift.
  Vec<mp50> num = Vec<mp50>::Zero(dv);
  mp50 z = 0;
  for (Eigen::Index i = 0; i < n; ++i) {
    mp50 l = 0;
    for (Eigen::Index j = 0; j < dk; ++j) l += mp50(K(i, j)) * mp50(q(j, 0));
    const mp50 w = sexp<mp50>(mp50(l * mp50(scale)));
    z += w;
    for (Eigen::Index j = 0; j < dv; ++j) num(j) += w * mp50(V(i, j));
  }
  Mat<double> truth(dv, 1);
  for (Eigen::Index j = 0; j < dv; ++j) truth(j, 0) = static_cast<double>(num(j) / z);
  CHECK(rel(Mat<double>(o), truth) <= tol::f64_vs_mp.value);
}

TEST_CASE("causal prefill equals token-by-token decode through the cache; first row is v_0") {
  Rng rng(12);
  const Eigen::Index T = 29, dk = 6, dv = 4;
  const Mat<double> q = randn(rng, T, dk), k = randn(rng, T, dk), v = randn(rng, T, dv);
  const double scale = 0.7;
  const Mat<double> o = softmax_causal_head<double>(q, k, v, scale);
  CHECK((o.row(0) - v.row(0)).norm() <= tol::f64_identity.value * v.row(0).norm());
  SoftmaxCache<double> cache(dk, dv);
  Mat<double> o2(T, dv);
  for (Eigen::Index t = 0; t < T; ++t) {
    cache.append(k.row(t).transpose(), v.row(t).transpose());
    o2.row(t) = cache.read(q.row(t).transpose(), scale).transpose();
  }
  CHECK(cache.size() == T);
  CHECK(cache.numbers() == T * (dk + dv));
  CHECK(rel(o2, o) <= tol::f64_identity.value);
}

TEST_CASE("identical keys read back the mean of the values; sharp logits read back the matching value") {
  Rng rng(13);
  const Eigen::Index n = 9, dk = 16, dv = 3;
  Mat<double> K(n, dk);
  const Mat<double> k0 = randn(rng, 1, dk);
  for (Eigen::Index i = 0; i < n; ++i) K.row(i) = k0.row(0);
  const Mat<double> V = randn(rng, n, dv);
  const Vec<double> o = softmax_read<double>(randn(rng, dk, 1).col(0), K, V, 3.0);
  const Vec<double> mean = V.colwise().mean().transpose();
  CHECK((o - mean).norm() <= tol::f64_identity.value * mean.norm());
  // Distinct unit keys, inverse temperature 1e4 (logits ~1e4: no overflow thanks to the max shift).
  Mat<double> Ku = randn(rng, n, dk);
  Ku.rowwise().normalize();
  const Vec<double> o3 = softmax_read<double>(Ku.row(4).transpose(), Ku, V, 1e4);
  CHECK(std::isfinite(o3.norm()));
  CHECK((o3 - V.row(4).transpose()).norm() <= tol::f64_identity.value * V.row(4).norm());
}

TEST_CASE("softmax memory rejects an empty cache and mismatched widths") {
  const Mat<double> K(0, 4), V(0, 2);
  CHECK_THROWS_AS(softmax_read<double>(Vec<double>::Ones(4), K, V, 1.0), Error);
  const Mat<double> K2 = Mat<double>::Ones(3, 4), V2 = Mat<double>::Ones(2, 2);
  CHECK_THROWS_AS(softmax_read<double>(Vec<double>::Ones(4), K2, V2, 1.0), Error);
  CHECK_THROWS_AS(softmax_read<double>(Vec<double>::Ones(5), K2, Mat<double>::Ones(3, 2), 1.0), Error);
  SoftmaxCache<double> c(4, 2);
  CHECK_THROWS_AS(c.read(Vec<double>::Ones(4), 1.0), Error);
  CHECK_THROWS_AS(c.append(Vec<double>::Ones(3), Vec<double>::Ones(2)), Error);
  CHECK_THROWS_AS(softmax_causal_head<double>(Mat<double>::Ones(3, 4), Mat<double>::Ones(2, 4), Mat<double>::Ones(3, 2), 1.0),
                  Error);
}

TEST_CASE("MLA latent memory: direct read == reference/mla.hpp absorbed read; exact when d_c >= d_k + d_v") {
  Rng rng(14);
  const Eigen::Index n = 21, dk = 8, dv = 8;
  const Mat<double> Kin = randn(rng, n, dk), Vin = randn(rng, n, dv);
  const Mat<double> q = randn(rng, dk, 1);
  const double temp = 2.0;
  for (Eigen::Index dc : {Eigen::Index(6), Eigen::Index(16), Eigen::Index(20)}) {
    CAPTURE(dc);
    const auto codec = LatentCodec<double>::from_gaussian(randn(rng, dc, dk + dv), dk, dv);
    Mat<double> C(n, dc);
    for (Eigen::Index i = 0; i < n; ++i) C.row(i) = codec.encode(Kin.row(i).transpose(), Vin.row(i).transpose()).transpose();
    const Vec<double> o_direct = mla_latent_read<double>(q.col(0), C, codec, temp);
    // Through mla.hpp: query token x = [q; 0], attend over all n latents.
    const MlaConfig cfg = codec.mla_config();
    const MlaWeights<double> w = codec.mla_weights(temp);
    Mat<double> x = Mat<double>::Zero(1, dk + dv);
    x.leftCols(dk) = q.transpose();
    const auto p = mla_project<double>(cfg, w, x, static_cast<std::size_t>(n));
    const Mat<double> o_mla = mla_attend_absorbed<double>(cfg, w, p, C, Mat<double>(n, 0), static_cast<std::size_t>(n - 1));
    CHECK(rel(Mat<double>(o_mla.row(0).transpose()), Mat<double>(o_direct)) <= tol::f64_identity.value);
    // Against the plain softmax memory over the raw keys and values.
    const Vec<double> o_soft = softmax_read<double>(q.col(0), Kin, Vin, temp);
    const double e = rel(Mat<double>(o_direct), Mat<double>(o_soft));
    if (dc >= dk + dv) CHECK(e <= tol::f64_identity.value);
    else CHECK(e > 1e-3);  // a d_c < d_k + d_v latent loses information
  }
  CHECK_THROWS_AS(LatentCodec<double>::from_gaussian(Mat<double>::Ones(4, 5), 2, 2), Error);
}
