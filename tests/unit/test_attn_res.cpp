// Attention Residuals identities: block AttnRes with one source per block == full AttnRes;
// w_l = 0 gives the uniform average; the online-softmax merge == a direct softmax over all sources;
// block semantics (completed block sums + partial sum) written out; mp50; errors.
#include <cmath>
#include <string>
#include <vector>

#include "numerics/random.hpp"
#include "numerics/tolerance.hpp"
#include "reference/attn_res.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

namespace {

Vec<double> rvec(Rng& rng, std::size_t d, double s = 1.0) {
  Vec<double> v(d);
  for (auto& x : v) x = s * rng.normal();
  return v;
}
Mat<double> rmat(Rng& rng, std::size_t T, std::size_t d, double s = 1.0) {
  Mat<double> m(T, d);
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) m(i, j) = s * rng.normal();
  return m;
}
double rel(const Mat<double>& a, const Mat<double>& b) { return (a - b).norm() / b.norm(); }
double relv(const Vec<double>& a, const Vec<double>& b) { return (a - b).norm() / b.norm(); }

}  // namespace

TEST_CASE("AttnRes full form matches the equation written out", "[attn_res]") {
  Rng rng(1);
  const std::size_t d = 12;
  const double eps = 1e-6;
  std::vector<Vec<double>> src;
  for (int i = 0; i < 6; ++i) src.push_back(rvec(rng, d, 1.0 + i));
  const Vec<double> w = rvec(rng, d);
  std::vector<double> phi;
  double Z = 0;
  for (const auto& v : src) {
    const double rms = std::sqrt(v.squaredNorm() / d + eps);
    phi.push_back(std::exp(w.dot(v) / rms));
    Z += phi.back();
  }
  Vec<double> h = Vec<double>::Zero(d);
  for (std::size_t i = 0; i < src.size(); ++i) h += phi[i] / Z * src[i];
  CHECK(relv(attn_res_full<double>(w, src, eps), h) <= tol::f64_identity.value);
}

TEST_CASE("AttnRes: w_l = 0 gives the uniform average (full and block)", "[attn_res]") {
  Rng rng(2);
  const std::size_t d = 10;
  std::vector<Vec<double>> src;
  Vec<double> mean = Vec<double>::Zero(d);
  for (int i = 0; i < 7; ++i) {
    src.push_back(rvec(rng, d, 0.5 + i));
    mean += src.back() / 7.0;
  }
  const Vec<double> zero = Vec<double>::Zero(d);
  CHECK(relv(attn_res_full<double>(zero, src, 1e-6), mean) <= tol::f64_identity.value);
  // block: 3 completed block sums and a partial: the average of those 4 vectors
  std::vector<Vec<double>> blocks(src.begin(), src.begin() + 3);
  const Vec<double> p = src[3];
  const Vec<double> avg4 = (src[0] + src[1] + src[2] + src[3]) / 4.0;
  CHECK(relv(attn_res_block<double>(zero, blocks, &p, 1e-6), avg4) <= tol::f64_identity.value);
  // and the DepthMixer in full mode: a consumer after 4 pushes with w = 0 averages 5 sources
  const Mat<double> h1 = rmat(rng, 3, d);
  DepthMixer<double> mix({ResidualMode::full, 1, 1e-6}, h1);
  Mat<double> sum = h1;
  for (int i = 0; i < 4; ++i) {
    const Mat<double> f = rmat(rng, 3, d, 2.0);
    mix.push(f);
    sum += f;
  }
  CHECK(rel(mix.input(zero), sum / 5.0) <= tol::f64_identity.value);
}

TEST_CASE("AttnRes online-softmax merge == direct softmax over all sources", "[attn_res]") {
  Rng rng(3);
  const std::size_t d = 9;
  const double eps = 1e-6;
  for (int trial = 0; trial < 20; ++trial) {
    const std::size_t n = 2 + trial % 9;
    std::vector<Vec<double>> src;
    for (std::size_t i = 0; i < n; ++i) src.push_back(rvec(rng, d, 1.0 + rng.uniform(0, 3)));
    const Vec<double> w = rvec(rng, d, 1.0 + trial);  // up to large logits: the max must be tracked
    const Vec<double> direct = attn_res_full<double>(w, src, eps);
    // split the sources into 3 random disjoint sets, build partials, merge in two orders
    std::vector<SoftmaxPartial<double>> parts(3, SoftmaxPartial<double>(d));
    for (const auto& v : src) parts[static_cast<std::size_t>(rng.uniform(0, 3)) % 3].add(attn_res_logit<double>(w, v, eps), v);
    const auto m1 = SoftmaxPartial<double>::merge(SoftmaxPartial<double>::merge(parts[0], parts[1]), parts[2]);
    const auto m2 = SoftmaxPartial<double>::merge(parts[2], SoftmaxPartial<double>::merge(parts[1], parts[0]));
    INFO("trial " << trial);
    CHECK(m1.count == n);
    CHECK(relv(m1.result(), direct) <= tol::f64_identity.value);
    CHECK(relv(m2.result(), direct) <= tol::f64_identity.value);
  }
}

TEST_CASE("AttnRes block with one source per block == full", "[attn_res]") {
  Rng rng(4);
  const std::size_t T = 5, d = 8, L = 9;
  const Mat<double> h1 = rmat(rng, T, d);
  DepthMixer<double> full({ResidualMode::full, 1, 1e-6}, h1), block({ResidualMode::block, 1, 1e-6}, h1);
  for (std::size_t l = 0; l < L; ++l) {
    const Vec<double> w = rvec(rng, d);
    const Mat<double> a = full.input(w), b = block.input(w);
    INFO("consumer " << l);
    CHECK(rel(b, a) <= tol::f64_identity.value);
    const Mat<double> f = rmat(rng, T, d, 1.0 + static_cast<double>(l));  // a stand-in sublayer output
    full.push(f);
    block.push(f);
  }
}

TEST_CASE("AttnRes block form: completed block sums plus the partial sum of the current block", "[attn_res]") {
  Rng rng(5);
  const std::size_t T = 3, d = 6, B = 3;  // 3 sources per block
  const Mat<double> h1 = rmat(rng, T, d);
  DepthMixer<double> mix({ResidualMode::block, B, 1e-6}, h1);
  std::vector<Mat<double>> outs;
  for (std::size_t l = 0; l < 8; ++l) {
    const Vec<double> w = rvec(rng, d);
    // expected: sources [h1, sum block 1, ..., sum block n-1] + partial sum of the current block if non-empty
    std::vector<Mat<double>> srcs{h1};
    const std::size_t done = outs.size() / B, rest = outs.size() % B;
    for (std::size_t n = 0; n < done; ++n) {
      Mat<double> s = Mat<double>::Zero(T, d);
      for (std::size_t j = 0; j < B; ++j) s += outs[n * B + j];
      srcs.push_back(s);
    }
    if (rest) {
      Mat<double> s = Mat<double>::Zero(T, d);
      for (std::size_t j = done * B; j < outs.size(); ++j) s += outs[j];
      srcs.push_back(s);
    }
    Mat<double> expect(T, d);
    for (std::size_t t = 0; t < T; ++t) {
      std::vector<Vec<double>> rows;
      for (const auto& s : srcs) rows.push_back(s.row(t).transpose());
      expect.row(t) = attn_res_full<double>(w, rows, 1e-6).transpose();
    }
    INFO("consumer " << l << " with " << srcs.size() << " sources");
    CHECK(rel(mix.input(w), expect) <= tol::f64_identity.value);
    outs.push_back(rmat(rng, T, d, 2.0));
    mix.push(outs.back());
  }
}

TEST_CASE("AttnRes plain mode is the running residual sum", "[attn_res]") {
  Rng rng(6);
  const Mat<double> h1 = rmat(rng, 4, 5);
  DepthMixer<double> mix({ResidualMode::plain, 1, 1e-6}, h1);
  Mat<double> sum = h1;
  for (int i = 0; i < 3; ++i) {
    const Mat<double> f = rmat(rng, 4, 5);
    mix.push(f);
    sum += f;
  }
  CHECK(rel(mix.input(rvec(rng, 5)), sum) <= tol::f64_identity.value);
}

TEST_CASE("AttnRes in cpp_bin_float_50: merge == direct to 1e-40; double agrees to 1e-12", "[attn_res][mp50]") {
  Rng rng(7);
  const std::size_t d = 6;
  std::vector<Vec<double>> src;
  for (int i = 0; i < 5; ++i) src.push_back(rvec(rng, d, 1.0 + i));
  const Vec<double> w = rvec(rng, d, 2.0);
  std::vector<Vec<mp50>> srcm;
  for (const auto& v : src) srcm.push_back(v.cast<mp50>());
  const Vec<mp50> wm = w.cast<mp50>();
  const mp50 eps(1e-6);
  const Vec<mp50> direct = attn_res_full<mp50>(wm, srcm, eps);
  SoftmaxPartial<mp50> a(d), b(d);
  for (std::size_t i = 0; i < srcm.size(); ++i) (i % 2 ? a : b).add(attn_res_logit<mp50>(wm, srcm[i], eps), srcm[i]);
  const Vec<mp50> merged = SoftmaxPartial<mp50>::merge(a, b).result();
  const Vec<mp50> diff = merged - direct;
  CHECK(static_cast<double>(diff.norm() / direct.norm()) <= tol::mp_identity.value);
  CHECK(relv(attn_res_full<double>(w, src, 1e-6), direct.cast<double>()) <= tol::f64_vs_mp.value);
}

TEST_CASE("AttnRes bad input gives clear errors", "[attn_res][errors]") {
  Rng rng(8);
  auto msg = [](auto&& f) {
    try { f(); } catch (const Error& e) { return std::string(e.what()); }
    return std::string("no error");
  };
  const Mat<double> h1 = rmat(rng, 2, 4);
  CHECK(msg([&] { DepthMixer<double>({ResidualMode::block, 0, 1e-6}, h1); }).find("block size") != std::string::npos);
  DepthMixer<double> mix({ResidualMode::full, 1, 1e-6}, h1);
  CHECK(msg([&] { mix.input(Vec<double>::Zero(5)); }).find("pseudo-query") != std::string::npos);
  CHECK(msg([&] { mix.push(Mat<double>::Zero(2, 3)); }).find("[2, 4]") != std::string::npos);
  CHECK(msg([&] { attn_res_full<double>(Vec<double>::Zero(4), {}, 1e-6); }).find("no sources") != std::string::npos);
  CHECK(msg([&] { SoftmaxPartial<double>(4).result(); }).find("zero sources") != std::string::npos);
}
