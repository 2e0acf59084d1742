// Unit tests of reference/attn_res_backward.hpp: the AttnRes VJP (full and block forms) against
// central differences in cpp_bin_float_50, and float64 against cpp_bin_float_50.
#include <functional>
#include <string>
#include <vector>

#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "numerics/tolerance.hpp"
#include "reference/attn_res_backward.hpp"

using namespace kdalab;
using namespace kdatest;

namespace {
const mp50 fd_step("1e-17");  // central-difference step (numerics/tolerance.hpp)

std::vector<Vec<mp50>> random_vecs(Rng& rng, std::size_t n, Eigen::Index d, double sigma = 1.0) {
  std::vector<Vec<mp50>> r;
  for (std::size_t i = 0; i < n; ++i) r.push_back(randn<mp50>(rng, d, 1, sigma).col(0));
  return r;
}
/// |fd - an| / |an| for the central difference of L(h) at h = 0 and the analytic value an.
double fd_rel(const std::function<mp50(const mp50&)>& L, const mp50& an) {
  const mp50 fd = (L(fd_step) - L(mp50(-fd_step))) / (2 * fd_step);
  return static_cast<double>(sabs<mp50>(mp50((fd - an) / an)));
}
/// sum_i <a_i, b_i>.
mp50 dot_all(const std::vector<Vec<mp50>>& a, const std::vector<Vec<mp50>>& b) {
  mp50 s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i].dot(b[i]);
  return s;
}
std::vector<Vec<mp50>> axpy(const std::vector<Vec<mp50>>& x, const mp50& h, const std::vector<Vec<mp50>>& d) {
  std::vector<Vec<mp50>> r = x;
  for (std::size_t i = 0; i < x.size(); ++i) r[i] += h * d[i];
  return r;
}
}  // namespace

TEST_CASE("AttnRes VJP == central differences in cpp_bin_float_50 (full and block forms)", "[backward][attn_res][mp50]") {
  Rng rng(301);
  const Eigen::Index d = 6;
  const mp50 eps(1e-6);
  const Vec<mp50> w = randn<mp50>(rng, d, 1, 0.7).col(0), dh = randn<mp50>(rng, d, 1).col(0);
  const Vec<mp50> dw_dir = randn<mp50>(rng, d, 1).col(0);
  SECTION("full form, 5 sources") {
    const std::vector<Vec<mp50>> src = random_vecs(rng, 5, d), dir = random_vecs(rng, 5, d);
    const AttnResGrad<mp50> g = attn_res_full_backward<mp50>(w, src, eps, dh);
    const double ew = fd_rel([&](const mp50& h) { return dh.dot(attn_res_full<mp50>(w + h * dw_dir, src, eps)); },
                             g.dw.dot(dw_dir));
    const double ev = fd_rel([&](const mp50& h) { return dh.dot(attn_res_full<mp50>(w, axpy(src, h, dir), eps)); },
                             dot_all(g.dsources, dir));
    INFO("relative error d/dw " << ew << ", d/dsources " << ev);
    CHECK(ew <= tol::backward_fd_mp.value);
    CHECK(ev <= tol::backward_fd_mp.value);
  }
  SECTION("block form, 3 completed blocks with and without a partial sum") {
    const std::vector<Vec<mp50>> blocks = random_vecs(rng, 3, d, 2.0), dir = random_vecs(rng, 3, d);
    const Vec<mp50> partial = randn<mp50>(rng, d, 1, 2.0).col(0), pdir = randn<mp50>(rng, d, 1).col(0);
    for (const Vec<mp50>* part : {&partial, static_cast<const Vec<mp50>*>(nullptr)}) {
      const AttnResBlockGrad<mp50> g = attn_res_block_backward<mp50>(w, blocks, part, eps, dh);
      const double ew = fd_rel([&](const mp50& h) { return dh.dot(attn_res_block<mp50>(w + h * dw_dir, blocks, part, eps)); },
                               g.dw.dot(dw_dir));
      const double eb = fd_rel([&](const mp50& h) { return dh.dot(attn_res_block<mp50>(w, axpy(blocks, h, dir), part, eps)); },
                               dot_all(g.dblocks, dir));
      INFO((part ? "with" : "without") << " partial: relative error d/dw " << ew << ", d/dblocks " << eb);
      CHECK(ew <= tol::backward_fd_mp.value);
      CHECK(eb <= tol::backward_fd_mp.value);
      if (part) {
        const double ep = fd_rel([&](const mp50& h) {
          const Vec<mp50> p2 = partial + h * pdir;
          return dh.dot(attn_res_block<mp50>(w, blocks, &p2, eps));
        }, g.dpartial.dot(pdir));
        INFO("relative error d/dpartial " << ep);
        CHECK(ep <= tol::backward_fd_mp.value);
      } else {
        CHECK(g.dpartial.size() == 0);
      }
    }
  }
}

TEST_CASE("AttnRes float64 gradients == cpp_bin_float_50 gradients", "[backward][attn_res][mp50]") {
  Rng rng(311);
  const Eigen::Index d = 16;
  const Vec<double> w = randn<double>(rng, d, 1, 0.5).col(0), dh = randn<double>(rng, d, 1).col(0);
  std::vector<Vec<double>> src;
  for (int i = 0; i < 9; ++i) src.push_back(randn<double>(rng, d, 1).col(0));
  std::vector<Vec<mp50>> src_m;
  for (const auto& s : src) src_m.push_back(s.cast<mp50>());
  const AttnResGrad<double> g = attn_res_full_backward<double>(w, src, 1e-6, dh);
  const AttnResGrad<mp50> t = attn_res_full_backward<mp50>(w.cast<mp50>(), src_m, mp50(1e-6), dh.cast<mp50>());
  const double ew = static_cast<double>(mp50((g.dw.cast<mp50>() - t.dw).norm() / t.dw.norm()));
  mp50 num = 0, den = 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    num += (g.dsources[i].cast<mp50>() - t.dsources[i]).squaredNorm();
    den += t.dsources[i].squaredNorm();
  }
  const double ev = static_cast<double>(mp50(ssqrt<mp50>(num) / ssqrt<mp50>(den)));
  INFO("relative RMS dw " << ew << ", dsources " << ev);
  CHECK(ew <= tol::backward_f64_vs_mp.value);
  CHECK(ev <= tol::backward_f64_vs_mp.value);
}
