// The Gated MLA and Attention Residuals entry points of the Python module, each in float64 and
// cpp_bin_float_50 (python/src/oracle.hpp).
#include <set>
#include <sstream>

#include "python/src/convert.hpp"
#include "python/src/oracle.hpp"
#include "reference/attn_res.hpp"
#include "reference/mla.hpp"

namespace kdalab::py {

namespace {

const char* const kMlaOptions = "hidden n_h d_c d_cq d_nope d_rope d_v rope rope_theta output_gate";
const char* const kMlaWeights = "W_DKV W_KR W_Q W_DQ W_UQ W_UK W_UV W_g W_o";

MlaConfig mla_config(const Options& o) {
  const OptionReader r(o, "mla config", kMlaOptions);
  for (const char* k : {"hidden", "n_h", "d_c", "d_nope", "d_v"}) r.need(k);
  MlaConfig c;
  c.hidden = r.size("hidden", 0);
  c.n_h = r.size("n_h", 0);
  c.d_c = r.size("d_c", 0);
  c.d_cq = r.size("d_cq", 0);
  c.d_nope = r.size("d_nope", 0);
  c.d_rope = r.size("d_rope", 0);
  c.d_v = r.size("d_v", 0);
  c.rope = r.flag("rope", c.rope);
  c.rope_theta = r.number("rope_theta", c.rope_theta);
  c.output_gate = r.flag("output_gate", c.output_gate);
  mla_validate_config(c);
  return c;
}

template <class S>
MlaWeights<S> mla_weights(const Named& named) {
  std::set<std::string> ok;
  std::istringstream in(kMlaWeights);
  for (std::string w; in >> w;) ok.insert(w);
  for (const auto& [k, t] : named)
    require(ok.count(k) > 0, "mla weights: tensor '" + k + "' is unknown; accepted: " + kMlaWeights);
  // an absent weight stays empty; mla_validate names the ones the config needs
  const auto get = [&](const char* n) {
    const auto it = named.find(n);
    return it == named.end() ? Mat<S>() : to_mat<S>(it->second, n);
  };
  MlaWeights<S> w;
  w.W_DKV = get("W_DKV");
  w.W_KR = get("W_KR");
  w.W_Q = get("W_Q");
  w.W_DQ = get("W_DQ");
  w.W_UQ = get("W_UQ");
  w.W_UK = get("W_UK");
  w.W_UV = get("W_UV");
  w.W_g = get("W_g");
  w.W_o = get("W_o");
  return w;
}

template <class S>
Tensor<double> mla_in(const Tensor<double>& x, const Named& weights, const MlaConfig& cfg, MlaEval eval) {
  const Mat<S> X = to_mat<S>(x, "x");
  require(X.rows() >= 1, "tensor 'x' has shape " + shape_str(x.shape) + "; expected [T >= 1, hidden]");
  MlaCache<S> cache(cfg, static_cast<std::size_t>(X.rows()));
  return from_mat<S>(mla_prefill(cfg, mla_weights<S>(weights), X, cache, eval));
}

template <class S>
Tensor<double> attn_res_in(const Tensor<double>& v, const Tensor<double>& w, const AttnResConfig& cfg) {
  const std::size_t N = v.dim(0), T = v.dim(1), d = v.dim(2);
  const auto source = [&](std::size_t i) {
    Mat<S> m(static_cast<Eigen::Index>(T), static_cast<Eigen::Index>(d));
    for (Eigen::Index j = 0; j < m.size(); ++j) m.data()[j] = S(v.data[i * T * d + static_cast<std::size_t>(j)]);
    return m;
  };
  DepthMixer<S> mix(cfg, source(0));
  for (std::size_t i = 1; i < N; ++i) mix.push(source(i));
  return from_mat<S>(mix.input(to_vec<S>(w, "w")));
}

}  // namespace

Tensor<double> mla(const Tensor<double>& x, const Named& weights, const Options& config, const std::string& eval,
                   Precision p) {
  const MlaConfig cfg = mla_config(config);
  MlaEval e = MlaEval::naive;
  if (eval == "absorbed")
    e = MlaEval::absorbed;
  else
    require(eval == "naive", "eval = '" + eval + "' is unknown; accepted: naive, absorbed");
  return p == Precision::mp50 ? mla_in<mp50>(x, weights, cfg, e) : mla_in<double>(x, weights, cfg, e);
}

AttnResConfig attn_res_config(const Tensor<double>& v, const Tensor<double>& w, const std::string& mode,
                              std::size_t block_sources, double eps) {
  require(v.rank() == 3 && v.numel() > 0,
          "tensor 'v' has shape " + shape_str(v.shape) + "; expected [N, T, d] (the sources), no empty dimension");
  require(w.rank() == 1 && w.dim(0) == v.dim(2),
          "tensor 'w' has shape " + shape_str(w.shape) + "; expected [d] = [" + std::to_string(v.dim(2)) + "] from v " +
              shape_str(v.shape));
  require_finite(v, "v");
  require_finite(w, "w");
  require(std::isfinite(eps) && eps >= 0, "eps = " + std::to_string(eps) + " is not accepted; give a finite eps >= 0");
  AttnResConfig cfg;
  cfg.block_sources = block_sources;
  cfg.eps = eps;
  if (mode == "full")
    cfg.mode = ResidualMode::full;
  else if (mode == "block")
    cfg.mode = ResidualMode::block;
  else
    throw Error("mode = '" + mode + "' is unknown; accepted: full, block");
  require(cfg.mode != ResidualMode::block || block_sources >= 1,
          "block_sources = 0 is not accepted; give the number of sublayer outputs per block, >= 1");
  return cfg;
}

Tensor<double> attn_res(const Tensor<double>& v, const Tensor<double>& w, const std::string& mode,
                        std::size_t block_sources, double eps, Precision p) {
  const AttnResConfig cfg = attn_res_config(v, w, mode, block_sources, eps);
  return p == Precision::mp50 ? attn_res_in<mp50>(v, w, cfg) : attn_res_in<double>(v, w, cfg);
}

}  // namespace kdalab::py
