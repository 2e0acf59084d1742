// Unit tests of the reverse-mode derivatives of the KDA layer's ops around the core
// (reference/layers_backward.hpp: ShortConv, Swish, RMSNorm with its gain, the output gate, linear
// maps) and of the whole layer (reference/kda_layer_backward.hpp). The oracle is the central
// difference of L = <dy, f(x)> along a random direction of one input tensor, in cpp_bin_float_50,
// against the analytic <J^T dy, dx>; then float64 against cpp_bin_float_50.
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/catch.hpp"
#include "tests/unit/kda_testutil.hpp"

#include "numerics/tolerance.hpp"
#include "reference/kda_layer_backward.hpp"

using namespace kdalab;
using namespace kdatest;

namespace {
const mp50 fd_step("1e-17");  // central-difference step (numerics/tolerance.hpp, backward_fd_mp)

mp50 inner(const Mat<mp50>& a, const Mat<mp50>& b) { return a.cwiseProduct(b).sum(); }
mp50 inner(const Vec<mp50>& a, const Vec<mp50>& b) { return a.dot(b); }

/// |fd - an| / |an| for the central difference fd of L(h) at h = 0 and the analytic value an.
double fd_rel(const std::function<mp50(const mp50&)>& L, const mp50& an) {
  const mp50 fd = (L(fd_step) - L(mp50(-fd_step))) / (2 * fd_step);
  return static_cast<double>(sabs<mp50>(mp50((fd - an) / an)));
}
}  // namespace

TEST_CASE("ShortConv, Swish, RMSNorm, output-gate and linear VJPs == central differences in cpp_bin_float_50, "
          "per input tensor",
          "[backward][layers][mp50]") {
  Rng rng(601);
  const Eigen::Index T = 6, C = 4, K = 4, d = 3, heads = 2;
  SECTION("ShortConv: d/dx, d/dw, d/dtail (a tail carried from earlier tokens)") {
    const Mat<mp50> x = randn<mp50>(rng, T, C), w = randn<mp50>(rng, C, K), dy = randn<mp50>(rng, T, C);
    ConvTail<mp50> tail(K, C);
    tail.x = randn<mp50>(rng, K - 1, C);
    const ShortConvGrad<mp50> g = short_conv_backward<mp50>(x, w, tail, dy);
    const auto L = [&](const Mat<mp50>& xx, const Mat<mp50>& ww, const Mat<mp50>& tt) {
      ConvTail<mp50> t2(K, C);
      t2.x = tt;
      return inner(dy, short_conv<mp50>(xx, ww, t2));
    };
    const Mat<mp50> dx = randn<mp50>(rng, T, C), dw = randn<mp50>(rng, C, K), dt = randn<mp50>(rng, K - 1, C);
    const double ex = fd_rel([&](const mp50& h) { return L(x + h * dx, w, tail.x); }, inner(g.dx, dx));
    const double ew = fd_rel([&](const mp50& h) { return L(x, w + h * dw, tail.x); }, inner(g.dw, dw));
    const double et = fd_rel([&](const mp50& h) { return L(x, w, tail.x + h * dt); }, inner(g.dtail, dt));
    INFO("relative errors dx " << ex << ", dw " << ew << ", dtail " << et);
    CHECK(ex <= tol::backward_fd_mp.value);
    CHECK(ew <= tol::backward_fd_mp.value);
    CHECK(et <= tol::backward_fd_mp.value);
  }
  SECTION("Swish") {
    const Mat<mp50> x = randn<mp50>(rng, T, C, 2.0), dy = randn<mp50>(rng, T, C), dx = randn<mp50>(rng, T, C);
    const double e = fd_rel([&](const mp50& h) { return inner(dy, swish_mat<mp50>(Mat<mp50>(x + h * dx))); },
                            inner(swish_mat_backward<mp50>(x, dy), dx));
    INFO("relative error " << e);
    CHECK(e <= tol::backward_fd_mp.value);
  }
  SECTION("RMSNorm per head with its gain: d/dx, d/dw, eps = 1e-5 and eps = 0") {
    for (const mp50& eps : {mp50(1e-5), mp50(0)}) {
      const Mat<mp50> x = randn<mp50>(rng, T, heads * d), dy = randn<mp50>(rng, T, heads * d);
      const Vec<mp50> w = randv<mp50>(rng, d, 0.5, 1.5);
      const RmsNormGrad<mp50> g = rmsnorm_backward<mp50>(x, w, dy, eps);
      const Mat<mp50> dx = randn<mp50>(rng, T, heads * d);
      const Vec<mp50> dw = randv<mp50>(rng, d, -1.0, 1.0);
      const double ex = fd_rel([&](const mp50& h) { return inner(dy, rmsnorm<mp50>(Mat<mp50>(x + h * dx), w, eps)); },
                               inner(g.dx, dx));
      const double ew = fd_rel([&](const mp50& h) { return inner(dy, rmsnorm<mp50>(x, Vec<mp50>(w + h * dw), eps)); },
                               inner(g.dw, dw));
      INFO("eps " << static_cast<double>(eps) << ": relative errors dx " << ex << ", dw " << ew);
      CHECK(ex <= tol::backward_fd_mp.value);
      CHECK(ew <= tol::backward_fd_mp.value);
    }
  }
  SECTION("output gate: d/do, d/dgate_logit") {
    const Mat<mp50> o = randn<mp50>(rng, T, C), l = randn<mp50>(rng, T, C, 3.0), dy = randn<mp50>(rng, T, C);
    const OutputGateGrad<mp50> g = output_gate_backward<mp50>(o, l, dy);
    const Mat<mp50> d_o = randn<mp50>(rng, T, C), dl = randn<mp50>(rng, T, C);
    const double eo = fd_rel([&](const mp50& h) { return inner(dy, output_gate<mp50>(Mat<mp50>(o + h * d_o), l)); },
                             inner(g.d_o, d_o));
    const double el = fd_rel([&](const mp50& h) { return inner(dy, output_gate<mp50>(o, Mat<mp50>(l + h * dl))); },
                             inner(g.d_gate_logit, dl));
    INFO("relative errors do " << eo << ", dgate_logit " << el);
    CHECK(eo <= tol::backward_fd_mp.value);
    CHECK(el <= tol::backward_fd_mp.value);
  }
  SECTION("linear: d/dx, d/dW") {
    const Mat<mp50> x = randn<mp50>(rng, T, C), W = randn<mp50>(rng, 5, C), dy = randn<mp50>(rng, T, 5);
    const LinearGrad<mp50> g = linear_backward<mp50>(x, W, dy);
    const Mat<mp50> dx = randn<mp50>(rng, T, C), dW = randn<mp50>(rng, 5, C);
    const double ex = fd_rel([&](const mp50& h) { return inner(dy, linear<mp50>(Mat<mp50>(x + h * dx), W)); }, inner(g.dx, dx));
    const double eW = fd_rel([&](const mp50& h) { return inner(dy, linear<mp50>(x, Mat<mp50>(W + h * dW))); }, inner(g.dW, dW));
    INFO("relative errors dx " << ex << ", dW " << eW);
    CHECK(ex <= tol::backward_fd_mp.value);
    CHECK(eW <= tol::backward_fd_mp.value);
  }
}

namespace {
KdaConfig small_layer(GateKind gate, GateInput input) {
  KdaConfig c;
  c.hidden = 6; c.H = 1; c.HV = 2; c.d_k = 3; c.d_v = 2; c.conv_kernel = 3;
  c.gate = gate; c.gate_input = input; c.gate_rank = 2; c.chunk = 0;
  return c;
}
/// Pointers to every weight matrix of a KdaWeights and its name, in a fixed order.
template <class S>
std::vector<std::pair<std::string, Mat<S>*>> weight_mats(KdaWeights<S>& w) {
  return {{"W_q", &w.W_q},       {"W_k", &w.W_k},     {"W_v", &w.W_v},         {"conv_q", &w.conv_q},
          {"conv_k", &w.conv_k}, {"conv_v", &w.conv_v}, {"W_beta", &w.W_beta}, {"W_a_down", &w.W_a_down},
          {"W_a_up", &w.W_a_up}, {"W_alpha", &w.W_alpha}, {"g_bias", &w.g_bias}, {"W_g", &w.W_g},
          {"W_o", &w.W_o}};
}
}  // namespace

TEST_CASE("KDA layer VJP == central differences in cpp_bin_float_50 for x and every weight, both gates and gate inputs",
          "[backward][kda_layer][mp50]") {
  const Eigen::Index T = 7;
  for (const GateKind gate : {GateKind::bounded, GateKind::softplus})
    for (const GateInput input : {GateInput::from_x, GateInput::from_v}) {
      const KdaConfig cfg = small_layer(gate, input);
      const KdaWeights<mp50> w = KdaWeights<mp50>::random(cfg, 611);
      Rng rng(612);
      const Mat<mp50> x = randn<mp50>(rng, T, 6), dy = randn<mp50>(rng, T, 6);
      const KdaLayerGrad<mp50> gr = kda_layer_backward<mp50>(cfg, w, x, dy);
      const auto L = [&](const Mat<mp50>& xx, const KdaWeights<mp50>& ww) {
        const KdaLayer<mp50> layer(cfg, ww);
        auto cache = layer.make_cache();
        return inner(dy, layer.prefill(xx, cache));
      };
      const std::string where = std::string(gate_kind_name(gate)) + " gate from " + gate_input_name(input);
      {
        const Mat<mp50> dx = randn<mp50>(rng, T, 6);
        const double e = fd_rel([&](const mp50& h) { return L(Mat<mp50>(x + h * dx), w); }, inner(gr.dx, dx));
        INFO(where << ", d/dx: relative error " << e);
        CHECK(e <= tol::backward_fd_mp.value);
      }
      KdaWeights<mp50> wd = w, gcopy = gr.dw;
      auto mats = weight_mats(wd);
      auto gmats = weight_mats(gcopy);
      for (std::size_t i = 0; i < mats.size(); ++i) {
        const bool used = input == GateInput::from_x ? mats[i].first != "W_alpha"
                                                     : mats[i].first != "W_a_down" && mats[i].first != "W_a_up";
        const Mat<mp50> w0 = *mats[i].second;
        const Mat<mp50> dir = randn<mp50>(rng, w0.rows(), w0.cols());
        const mp50 an = inner(*gmats[i].second, dir);
        if (!used) {
          INFO(where << ": unused weight " << mats[i].first << " gets a zero gradient");
          CHECK(an == 0);
          continue;
        }
        const double e = fd_rel(
            [&](const mp50& h) {
              *mats[i].second = w0 + h * dir;
              const mp50 l = L(x, wd);
              *mats[i].second = w0;
              return l;
            },
            an);
        INFO(where << ", d/d" << mats[i].first << ": relative error " << e);
        CHECK(e <= tol::backward_fd_mp.value);
      }
      for (auto [name, vw, vg] : {std::tuple<const char*, Vec<mp50>*, const Vec<mp50>*>{"A_log", &wd.A_log, &gr.dw.A_log},
                                  {"rms_w", &wd.rms_w, &gr.dw.rms_w}}) {
        const Vec<mp50> v0 = *vw;
        const Vec<mp50> dir = randv<mp50>(rng, v0.size(), -1.0, 1.0);
        const double e = fd_rel(
            [&](const mp50& h) {
              *vw = v0 + h * dir;
              const mp50 l = L(x, wd);
              *vw = v0;
              return l;
            },
            inner(*vg, dir));
        INFO(where << ", d/d" << name << ": relative error " << e);
        CHECK(e <= tol::backward_fd_mp.value);
      }
    }
}

TEST_CASE("KDA layer float64 gradients == cpp_bin_float_50 gradients, and checkpointing changes no bit",
          "[backward][kda_layer][mp50]") {
  KdaConfig cfg = small_layer(GateKind::bounded, GateInput::from_x);
  cfg.hidden = 8; cfg.H = 2; cfg.HV = 2; cfg.d_k = 4; cfg.d_v = 4; cfg.conv_kernel = 4; cfg.chunk = 8;
  const Eigen::Index T = 24;
  const KdaWeights<double> w = KdaWeights<double>::random(cfg, 621);
  Rng rng(622);
  const Mat<double> x = randn<double>(rng, T, 8), dy = randn<double>(rng, T, 8);
  const KdaLayerGrad<double> d = kda_layer_backward<double>(cfg, w, x, dy);
  const KdaLayerGrad<mp50> m = kda_layer_backward<mp50>(cfg, w.cast<mp50>(), x.cast<mp50>(), dy.cast<mp50>());
  const double ex = rel_err<mp50>(Mat<mp50>(d.dx.cast<mp50>()), m.dx);
  INFO("dx: relative RMS " << ex);
  CHECK(ex <= tol::backward_f64_vs_mp.value);
  KdaWeights<double> dd = d.dw;
  KdaWeights<mp50> mm = m.dw;
  auto a = weight_mats(dd);
  auto b = weight_mats(mm);
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].first == "W_alpha") continue;  // unused with the gate from x: zero in both
    const double e = rel_err<mp50>(Mat<mp50>(a[i].second->cast<mp50>()), *b[i].second);
    INFO("d" << a[i].first << ": relative RMS " << e);
    CHECK(e <= tol::backward_f64_vs_mp.value);
  }
  const KdaLayerGrad<double> c = kda_layer_backward<double>(cfg, w, x, dy, 5);
  CHECK(c.dx == d.dx);
  CHECK(c.dw.W_q == d.dw.W_q);
  CHECK(c.dw.A_log == d.dw.A_log);
}

TEST_CASE("layer VJPs reject an upstream gradient of the wrong shape, naming it", "[backward][layers][errors]") {
  Rng rng(631);
  const Mat<double> x = randn<double>(rng, 4, 3), w = randn<double>(rng, 3, 2);
  require_error([&] { short_conv_backward<double>(x, w, ConvTail<double>(2, 3), Mat<double>(4, 2)); },
                {"short_conv_backward", "'dy'", "[4, 2]", "[4, 3]"});
  require_error([&] { rmsnorm_backward<double>(x, Vec<double>::Ones(3), Mat<double>(3, 3)); }, {"rmsnorm_backward", "'dy'"});
  require_error([&] { output_gate_backward<double>(x, x, Mat<double>(4, 4)); }, {"output_gate_backward", "'dy'"});
  const KdaConfig cfg = small_layer(GateKind::bounded, GateInput::from_x);
  const KdaWeights<double> wl = KdaWeights<double>::random(cfg, 632);
  require_error([&] { kda_layer_backward<double>(cfg, wl, Mat<double>::Zero(5, 6), Mat<double>::Zero(4, 6)); },
                {"kda_layer_backward", "'dy'"});
}
