// The whole hybrid: token-by-token decode == prefill for T = 1, 7, 64, 200 on toy.json
// (<= 1e-11 in double), chunked prefill == prefill, every residual mode and granularity, block
// AttnRes with one layer per block == full at the model level, cpp_bin_float_50 vs double, errors.
#include <string>

#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/unit/hybrid_testutil.hpp"

using namespace kdalab;
using namespace kdalab::testutil;

namespace {
const std::string kToy = "data/configs/toy.json";
}

TEST_CASE("hybrid: toy.json layout is the K3 pattern", "[hybrid]") {
  const ModelConfig cfg = read_model_config(kToy);
  const auto m = build<double>(cfg);
  REQUIRE(m.layers.size() == 9);
  std::string pat;
  for (const auto& L : m.layers) pat += L.kind == LayerKind::kda ? 'K' : 'M';
  CHECK(pat == "KKKMKKKMM");
  CHECK(cfg.opt.residual == ResidualMode::block);
  CHECK(m.block_sources() == 4);  // 2 decoder layers per block, attention + SwiGLU sources each
}

TEST_CASE("hybrid: decode == prefill on toy.json for T = 1, 7, 64, 200", "[hybrid]") {
  const ModelConfig cfg = read_model_config(kToy);
  const auto m = build<double>(cfg);
  for (std::size_t T : {1u, 7u, 64u, 200u}) {
    const Mat<double> X = inputs(T, cfg.hidden, 100 + T);
    const double e = decode_vs_prefill(m, X);
    INFO("T = " << T << " rel = " << e);
    CHECK(e <= tol::f64_hybrid.value);
  }
}

TEST_CASE("hybrid: chunked prefill then decode == one prefill", "[hybrid]") {
  const ModelConfig cfg = read_model_config(kToy);
  const auto m = build<double>(cfg);
  const std::size_t T = 40;
  const Mat<double> X = inputs(T, cfg.hidden, 7);
  auto c1 = m.make_cache(T), c2 = m.make_cache(T);
  const Mat<double> Y = m.prefill(X, c1);
  Mat<double> Z(T, cfg.hidden);
  Z.topRows(13) = m.prefill(Mat<double>(X.topRows(13)), c2);
  Z.middleRows(13, 20) = m.prefill(Mat<double>(X.middleRows(13, 20)), c2);
  for (std::size_t t = 33; t < T; ++t) Z.row(t) = m.decode(Vec<double>(X.row(t).transpose()), c2).transpose();
  CHECK(rel(Z, Y) <= tol::f64_hybrid.value);
  CHECK(c2.len == T);
}

TEST_CASE("hybrid: prefill with absorbed or streaming MLA == naive MLA", "[hybrid]") {
  const ModelConfig cfg = read_model_config(kToy);
  auto m = build<double>(cfg);
  const Mat<double> X = inputs(50, cfg.hidden, 8);
  auto c0 = m.make_cache(50);
  const Mat<double> Yn = m.prefill(X, c0);
  for (auto ev : {MlaEval::absorbed, MlaEval::streaming}) {
    m.mla_eval = ev;
    auto c = m.make_cache(50);
    INFO(mla_eval_name(ev));
    CHECK(rel(m.prefill(X, c), Yn) <= tol::f64_hybrid.value);
  }
}

TEST_CASE("hybrid: decode == prefill for every residual mode, granularity and FFN stand-in", "[hybrid]") {
  ModelConfig cfg = read_model_config(kToy);
  for (auto res : {ResidualMode::plain, ResidualMode::full, ResidualMode::block})
    for (auto gran : {AttnResGranularity::sublayer, AttnResGranularity::layer})
      for (auto ffn : {FfnKind::identity, FfnKind::swiglu}) {
        cfg.opt.residual = res;
        cfg.opt.granularity = gran;
        cfg.opt.ffn = ffn;
        const auto m = build<double>(cfg);
        const Mat<double> X = inputs(9, cfg.hidden, 3);
        INFO(residual_mode_name(res) << " granularity " << (gran == AttnResGranularity::layer ? "layer" : "sublayer")
                                     << " ffn " << (ffn == FfnKind::swiglu ? "swiglu" : "identity"));
        CHECK(decode_vs_prefill(m, X) <= tol::f64_hybrid.value);
      }
}

TEST_CASE("hybrid: decode == prefill with Kimi Linear choices (softplus gate, ungated MLA, RoPE, full-rank q)", "[hybrid]") {
  ModelConfig cfg = read_model_config(kToy);
  cfg.kda.bounded_gate = false;
  cfg.mla.output_gate = false;
  cfg.mla.rope = true;
  cfg.mla.d_cq = 0;
  cfg.opt.residual = ResidualMode::plain;
  const auto m = build<double>(cfg);
  const Mat<double> X = inputs(70, cfg.hidden, 4);  // > one 64-token KDA chunk
  CHECK(decode_vs_prefill(m, X) <= tol::f64_hybrid.value);
}

TEST_CASE("hybrid: block AttnRes with one decoder layer per block == full AttnRes (layer granularity)", "[hybrid]") {
  ModelConfig cfg = read_model_config(kToy);
  cfg.opt.granularity = AttnResGranularity::layer;
  cfg.attn_res_block_size = 1;
  cfg.opt.residual = ResidualMode::full;
  const auto mf = build<double>(cfg);
  cfg.opt.residual = ResidualMode::block;
  const auto mb = build<double>(cfg);
  const Mat<double> X = inputs(11, cfg.hidden, 5);
  auto cf = mf.make_cache(11), cb = mb.make_cache(11);
  const Mat<double> Yf = mf.prefill(X, cf), Yb = mb.prefill(X, cb);
  CHECK(rel(Yb, Yf) <= tol::f64_identity.value);
  // and the residual modes really differ (the test above is not vacuous)
  cfg.opt.residual = ResidualMode::plain;
  const auto mp = build<double>(cfg);
  auto cp = mp.make_cache(11);
  CHECK(rel(mp.prefill(X, cp), Yf) > 1e-3);
}

TEST_CASE("hybrid: cpp_bin_float_50 agrees with double on toy.json", "[hybrid][mp50]") {
  const ModelConfig cfg = read_model_config(kToy);
  const auto md = build<double>(cfg);
  const auto mm = build<mp50>(cfg);
  const std::size_t T = 3;
  const Mat<double> X = inputs(T, cfg.hidden, 9);
  auto cd = md.make_cache(T);
  auto cm = mm.make_cache(T);
  const Mat<double> Yd = md.prefill(X, cd);
  const Mat<mp50> Ym = mm.prefill(Mat<mp50>(X.cast<mp50>()), cm);
  const double e = rel(Yd, Ym);
  INFO("rel = " << e);
  CHECK(e <= tol::f64_vs_mp.value);
  CHECK(e > 0.0);  // double really rounds: the comparison is not of one computation with itself
}

TEST_CASE("hybrid: bad input gives clear errors", "[hybrid][errors]") {
  const ModelConfig cfg = read_model_config(kToy);
  const auto m = build<double>(cfg);
  auto msg = [](auto&& f) {
    try { f(); } catch (const Error& e) { return std::string(e.what()); }
    return std::string("no error");
  };
  const Mat<double> X = inputs(4, cfg.hidden, 1);
  SECTION("decode past capacity leaves every cache unchanged") {
    auto c = m.make_cache(3);
    m.prefill(Mat<double>(X.topRows(3)), c);
    const auto before = std::get<0>(c.layer[3]).c;
    const std::string e = msg([&] { m.decode(Vec<double>(X.row(3).transpose()), c); });
    INFO(e);
    CHECK(e.find("capacity 3") != std::string::npos);
    CHECK(c.len == 3);
    CHECK(std::get<0>(c.layer[3]).len == 3);
    CHECK(std::get<0>(c.layer[3]).c == before);
  }
  SECTION("input width, non-finite input, zero capacity") {
    auto c = m.make_cache(4);
    CHECK(msg([&] { m.prefill(Mat<double>(Mat<double>::Ones(2, cfg.hidden + 1)), c); }).find("hidden_size = 32") !=
          std::string::npos);
    Mat<double> Xn = X;
    Xn(0, 0) = INFINITY;
    CHECK(msg([&] { m.prefill(Xn, c); }).find("non-finite") != std::string::npos);
    CHECK(msg([&] { m.make_cache(0); }).find("capacity") != std::string::npos);
  }
}
