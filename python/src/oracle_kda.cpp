// The KDA entry points of the Python module: recurrence, chunked form, decode steps and the layer,
// each in float64 and cpp_bin_float_50 (python/src/oracle.hpp).
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "reference/kda_decode.hpp"
#include "python/src/convert.hpp"
#include "python/src/oracle.hpp"
#include "reference/kda.hpp"
#include "reference/kda_chunk.hpp"
#include "reference/kda_layer.hpp"

namespace kdalab::py {

Precision parse_precision(const std::string& s) {
  if (s == "float64") return Precision::float64;
  if (s == "mp50" || s == "cpp_bin_float_50") return Precision::mp50;
  throw Error("precision = '" + s + "' is unknown; accepted: float64, mp50 (cpp_bin_float_50)");
}

OptionReader::OptionReader(const Options& given, const std::string& what, const std::string& accepted)
    : given_(given), what_(what) {
  std::set<std::string> ok;
  std::istringstream in(accepted);
  for (std::string w; in >> w;) ok.insert(w);
  for (const auto& [k, v] : given)
    require(ok.count(k) > 0, what + ": option '" + k + "' is unknown; accepted: " + accepted);
}

void OptionReader::need(const std::string& key) const {
  require(has(key), what_ + ": option '" + key + "' is required");
}

std::size_t OptionReader::size(const std::string& key, std::size_t fallback) const {
  const auto it = given_.find(key);
  if (it == given_.end()) return fallback;
  const std::string& s = it->second;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = s.empty() || s[0] == '-' ? 0 : std::strtoull(s.c_str(), &end, 10);
  require(!s.empty() && s[0] != '-' && end && *end == '\0' && errno == 0,
          what_ + ": option '" + key + "' = '" + s + "'; accepted: an integer >= 0");
  return static_cast<std::size_t>(v);
}

double OptionReader::number(const std::string& key, double fallback) const {
  const auto it = given_.find(key);
  if (it == given_.end()) return fallback;
  const std::string& s = it->second;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  require(!s.empty() && end && *end == '\0' && std::isfinite(v),
          what_ + ": option '" + key + "' = '" + s + "'; accepted: a finite number");
  return v;
}

bool OptionReader::flag(const std::string& key, bool fallback) const {
  const auto it = given_.find(key);
  if (it == given_.end()) return fallback;
  if (it->second == "true") return true;
  if (it->second == "false") return false;
  throw Error(what_ + ": option '" + key + "' = '" + it->second + "'; accepted: True, False");
}

std::string OptionReader::text(const std::string& key, const std::string& fallback) const {
  const auto it = given_.find(key);
  return it == given_.end() ? fallback : it->second;
}

void require_scale(double scale) {
  require(std::isfinite(scale) && scale > 0, "scale = " + num_str(scale) + " is not accepted; give a finite scale > 0 "
                                             "(usually d_k^-1/2)");
}

namespace {

template <class S>
KdaResult narrow(const KdaOutput<S>& r) {
  return {r.o.template cast<double>(), r.S_final.template cast<double>()};
}

template <class S>
KdaResult recurrent_in(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                       const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0, double scale,
                       KdaVariant var) {
  const Tensor<S> s0 = S0 ? S0->cast<S>() : Tensor<S>();
  return narrow(kdalab::kda_recurrent<S>(q.cast<S>(), k.cast<S>(), v.cast<S>(), g.cast<S>(), beta.cast<S>(),
                                         S0 ? &s0 : nullptr, S(scale), var));
}

template <class S>
KdaResult chunked_in(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                     const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0, double scale,
                     const ChunkOptions& opt, KdaVariant var) {
  const Tensor<S> s0 = S0 ? S0->cast<S>() : Tensor<S>();
  return narrow(kdalab::kda_chunked<S>(q.cast<S>(), k.cast<S>(), v.cast<S>(), g.cast<S>(), beta.cast<S>(),
                                       S0 ? &s0 : nullptr, S(scale), opt, var));
}

const char* const kKdaLayerOptions =
    "hidden H HV d_k d_v gate g_min gate_input gate_rank conv_kernel l2_eps rms_eps scale chunk";
const char* const kKdaLayerWeights =
    "W_q W_k W_v conv_q conv_k conv_v W_beta W_a_down W_a_up W_alpha g_bias W_g W_o A_log rms_w";

KdaConfig kda_config(const Options& o) {
  const OptionReader r(o, "kda_layer config", kKdaLayerOptions);
  KdaConfig c;
  for (const char* k : {"hidden", "H", "HV", "d_k", "d_v"}) r.need(k);
  c.hidden = r.size("hidden", 0);
  c.H = r.size("H", 0);
  c.HV = r.size("HV", 0);
  c.d_k = r.size("d_k", 0);
  c.d_v = r.size("d_v", 0);
  c.gate = parse_gate_kind(r.text("gate", "bounded"), "kda_layer config: option 'gate'");
  c.g_min = r.number("g_min", c.g_min);
  c.gate_input = parse_gate_input(r.text("gate_input", "x"), "kda_layer config: option 'gate_input'");
  c.gate_rank = r.size("gate_rank", c.gate_rank);
  c.conv_kernel = r.size("conv_kernel", c.conv_kernel);
  c.l2_eps = r.number("l2_eps", c.l2_eps);
  c.rms_eps = r.number("rms_eps", c.rms_eps);
  c.scale = r.number("scale", c.scale);
  c.chunk = r.size("chunk", c.chunk);
  c.validate();
  return c;
}

template <class S>
KdaWeights<S> kda_weights(const Named& named) {
  std::set<std::string> ok;
  std::istringstream in(kKdaLayerWeights);
  for (std::string w; in >> w;) ok.insert(w);
  for (const auto& [k, t] : named)
    require(ok.count(k) > 0, "kda_layer weights: tensor '" + k + "' is unknown; accepted: " + kKdaLayerWeights);
  const auto get = [&](const char* n) -> const Tensor<double>& {
    const auto it = named.find(n);
    require(it != named.end(), std::string("kda_layer weights: tensor '") + n + "' is missing (every one of " +
                                   kKdaLayerWeights + " is needed; both gate-input weights always)");
    return it->second;
  };
  KdaWeights<S> w;
  w.W_q = to_mat<S>(get("W_q"), "W_q");
  w.W_k = to_mat<S>(get("W_k"), "W_k");
  w.W_v = to_mat<S>(get("W_v"), "W_v");
  w.conv_q = to_mat<S>(get("conv_q"), "conv_q");
  w.conv_k = to_mat<S>(get("conv_k"), "conv_k");
  w.conv_v = to_mat<S>(get("conv_v"), "conv_v");
  w.W_beta = to_mat<S>(get("W_beta"), "W_beta");
  w.W_a_down = to_mat<S>(get("W_a_down"), "W_a_down");
  w.W_a_up = to_mat<S>(get("W_a_up"), "W_a_up");
  w.W_alpha = to_mat<S>(get("W_alpha"), "W_alpha");
  w.g_bias = to_mat<S>(get("g_bias"), "g_bias");
  w.W_g = to_mat<S>(get("W_g"), "W_g");
  w.W_o = to_mat<S>(get("W_o"), "W_o");
  w.A_log = to_vec<S>(get("A_log"), "A_log");
  w.rms_w = to_vec<S>(get("rms_w"), "rms_w");
  return w;
}

template <class S>
KdaLayerResult kda_layer_in(const Tensor<double>& x, const Named& weights, const KdaConfig& cfg) {
  const KdaLayer<S> layer(cfg, kda_weights<S>(weights));
  auto cache = layer.make_cache();
  KdaActivations<S> act;
  const Mat<S> y = layer.prefill(to_mat<S>(x, "x"), cache, &act);
  KdaLayerResult r{from_mat<S>(y), from_mat<S>(act.o), Tensor<double>({cfg.HV, cfg.d_k, cfg.d_v})};
  std::size_t i = 0;
  for (const auto& m : cache.S)
    for (Eigen::Index j = 0; j < m.size(); ++j) r.S.data[i++] = static_cast<double>(m.data()[j]);
  return r;
}

}  // namespace

KdaResult kda_recurrent(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                        const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0, double scale,
                        const std::string& variant, Precision p) {
  require_scale(scale);
  const KdaVariant var = parse_variant(variant);
  return p == Precision::mp50 ? recurrent_in<mp50>(q, k, v, g, beta, S0, scale, var)
                              : recurrent_in<double>(q, k, v, g, beta, S0, scale, var);
}

KdaResult kda_chunked(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                      const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>* S0, double scale,
                      std::size_t C, std::size_t tile, const std::string& variant, Precision p) {
  require_scale(scale);
  const KdaVariant var = parse_variant(variant);
  ChunkOptions opt;
  opt.C = C;
  opt.tile = tile;
  return p == Precision::mp50 ? chunked_in<mp50>(q, k, v, g, beta, S0, scale, opt, var)
                              : chunked_in<double>(q, k, v, g, beta, S0, scale, opt, var);
}

KdaResult kda_decode(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                     const Tensor<double>& g, const Tensor<double>& beta, const Tensor<double>& S0, double scale,
                     Precision p) {
  require_scale(scale);
  if (p == Precision::mp50)
    return narrow(kda_decode_steps<mp50>(q.cast<mp50>(), k.cast<mp50>(), v.cast<mp50>(), g.cast<mp50>(),
                                         beta.cast<mp50>(), S0.cast<mp50>(), mp50(scale)));
  return narrow(kda_decode_steps<double>(q, k, v, g, beta, S0, scale));
}

KdaLayerResult kda_layer(const Tensor<double>& x, const Named& weights, const Options& config, Precision p) {
  const KdaConfig cfg = kda_config(config);
  return p == Precision::mp50 ? kda_layer_in<mp50>(x, weights, cfg) : kda_layer_in<double>(x, weights, cfg);
}

}  // namespace kdalab::py
