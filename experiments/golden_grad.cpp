// Golden gradient fixtures: the cpp_bin_float_50 reverse-mode derivatives (reference/*_backward.hpp)
// of small seeded problems, rounded once to float64, written and checked by `kdalab golden` through
// grad_ops() (experiments/golden_layers.hpp). Each check runs the current float64 backward on the
// same inputs and compares every gradient tensor with the stored mp50 one (relative RMS <=
// tol::backward_f64_vs_mp = 1e-13), after checking that the generator still draws the stored
// inputs bit for bit.
//
// Files and layouts (float64; per case group /<case>/):
//   kda_recurrent_grad.h5, kda_chunked_grad.h5: inputs q, k [B, T, H, d_k] (unit rows), v [B, T, HV, d_v],
//       g [B, T, HV, d_k] (log-decay), beta [B, T, HV], S0 [B, HV, d_k, d_v]; upstream dO [B, T, HV, d_v] and
//       dS_T [B, HV, d_k, d_v]; gradients dq, dk, dv, dg, dbeta, dS0 (shapes of their inputs) of
//       L = <dO, o> + <dS_T, S_T> from the mp50 recurrence backward. The chunked file is checked with the
//       chunked backward (reference/kda_chunk_backward.hpp) at every chunk size of its attribute C.
//   kda_layer_grad.h5: the cases of kda_layer.h5 (weights KdaWeights::random(cfg, seed), x = N(0, 1) with
//       seed + 1); dy [T, hidden] (seed + 2); dx [T, hidden] and dw/<weight> (KdaWeights names and shapes)
//       of L = <dy, y> on a fresh cache (reference/kda_layer_backward.hpp).
//   mla_grad.h5: the cases of mla.h5; dy [T, hidden] (seed + 2); dx and dw/<weight> (the weights the config
//       uses) of L = <dy, y> for the naive prefill (reference/mla_backward.hpp); checked with the naive and
//       the absorbed float64 backward.
//   attn_res_grad.h5: the cases of attn_res.h5 (full form, one mix per token); dh [T, d] (Rng(seed + 2));
//       dv [N, T, d] (one gradient per source) and dw [d] (summed over the T tokens) of L = sum_t <dh_t, h_t>.
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "experiments/golden_fixtures.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/attn_res_backward.hpp"
#include "reference/error.hpp"
#include "reference/kda_chunk_backward.hpp"
#include "reference/kda_layer_backward.hpp"
#include "reference/mla_backward.hpp"

namespace kdalab::golden {

namespace {

using Line = std::function<void(const std::string&, double, double)>;

/// Relative RMS of a gradient computed now against the stored one, dataset `name` of fixture `path`. A stored
/// tensor of another size or with a NaN / Inf is an error naming that dataset (a damaged fixture, exit 2).
double vs_stored(const Tensor<double>& now, const std::string& path, const std::string& name) {
  const Tensor<double> st = read_f64(path, name);
  const std::string where = "golden file '" + path + "': dataset '" + name + "'";
  const std::string fix = "; regenerate with 'kdalab golden --regen --force' if the file was damaged";
  require(st.numel() == now.numel(), where + " has shape " + shape_str(st.shape) + ", expected " +
                                         shape_str(now.shape) + fix);
  for (std::size_t i = 0; i < st.numel(); ++i)
    require(std::isfinite(st.data[i]),
            where + " holds " + fmt::format("{}", st.data[i]) + " at flat index " + std::to_string(i) + fix);
  return rel_rms(now.data, st.data);
}

/// One line for a gradient computed now: its relative RMS against the stored dataset g/name of `path`, within
/// tol::backward_f64_vs_mp, named op + g + "/" + name + label.
void compare_stored(const Line& line, const std::string& path, const std::string& op, const std::string& g,
                    const std::string& name, const Tensor<double>& now, const std::string& label = "") {
  line(op + g + "/" + name + label, vs_stored(now, path, g + "/" + name), tol::backward_f64_vs_mp.value);
}

// ---- KDA core ------------------------------------------------------------------------------------

struct CoreCase {
  std::string name;
  std::size_t B, T, H, HV, dk, dv;
  double g_span;  ///< g ~ -g_span U(0, 1)
  std::uint64_t seed;
};

struct CoreProblem {
  Tensor<double> q, k, v, g, beta, S0, dO, dS_T;
  double scale;
};

/// Seeded inputs in a fixed draw order (q, k, v, g, beta, S0, dO, dS_T) with numerics/random.hpp's Rng:
/// q, k ~ N(0, 1) then each d_k row normalised; v, dO, dS_T ~ N(0, 1); S0 ~ 0.1 N(0, 1); beta ~ U(0, 1).
CoreProblem make_core(const CoreCase& c) {
  Rng rng(c.seed);
  CoreProblem p{Tensor<double>({c.B, c.T, c.H, c.dk}), Tensor<double>({c.B, c.T, c.H, c.dk}),
                Tensor<double>({c.B, c.T, c.HV, c.dv}), Tensor<double>({c.B, c.T, c.HV, c.dk}),
                Tensor<double>({c.B, c.T, c.HV}), Tensor<double>({c.B, c.HV, c.dk, c.dv}),
                Tensor<double>({c.B, c.T, c.HV, c.dv}), Tensor<double>({c.B, c.HV, c.dk, c.dv}),
                1.0 / std::sqrt(static_cast<double>(c.dk))};
  for (Tensor<double>* u : {&p.q, &p.k}) {
    rng.fill_normal(*u);
    for (std::size_t r = 0; r < u->numel() / c.dk; ++r) {
      double n2 = 0;
      for (std::size_t i = 0; i < c.dk; ++i) n2 += u->data[r * c.dk + i] * u->data[r * c.dk + i];
      for (std::size_t i = 0; i < c.dk; ++i) u->data[r * c.dk + i] /= std::sqrt(n2);
    }
  }
  rng.fill_normal(p.v);
  for (auto& x : p.g.data) x = -c.g_span * rng.uniform();
  rng.fill_uniform(p.beta, 0.0, 1.0);
  rng.fill_normal(p.S0, 0.1);
  rng.fill_normal(p.dO);
  rng.fill_normal(p.dS_T);
  return p;
}

std::vector<CoreCase> recurrent_cases() {
  return {{"grouped_T24", 1, 24, 1, 2, 8, 8, 1.0, 501}, {"batch2_dv6_T17", 2, 17, 2, 2, 4, 6, 0.5, 502}};
}
std::vector<CoreCase> chunked_cases() { return {{"T41", 1, 41, 1, 1, 8, 8, 0.1, 511}}; }
const char* kChunkSizes = "1,8,16,41";

const char* kGradNames[] = {"dq", "dk", "dv", "dg", "dbeta", "dS0"};
std::vector<const Tensor<double>*> grad_list(const KdaGrad<double>& g) {
  return {&g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta, &g.dS0};
}

template <class T>
std::string names_of(const std::vector<T>& cs) {
  std::string r;
  for (const auto& c : cs) r += (r.empty() ? "" : ",") + c.name;
  return r;
}

void regen_core(ResultsFile& f, const std::vector<CoreCase>& cases, bool chunked) {
  if (chunked) f.attr("/", "C", kChunkSizes);
  for (const auto& c : cases) {
    const CoreProblem p = make_core(c);
    const auto m = [](const Tensor<double>& t) { return t.cast<mp50>(); };
    const Tensor<mp50> S0 = m(p.S0), dS_T = m(p.dS_T);
    const KdaGrad<mp50> gr =
        kda_recurrent_backward<mp50>(m(p.q), m(p.k), m(p.v), m(p.g), m(p.beta), &S0, mp50(p.scale), m(p.dO), &dS_T);
    const std::string g = c.name;
    f.group(g, "KDA core gradient case " + g + ": seeded inputs and upstream gradients, cpp_bin_float_50 VJP");
    const auto put = [&](const char* n, const Tensor<double>& x, const std::string& d) { f.write_array(g, n, x, "1", d); };
    put("q", p.q, "q [B, T, H, d_k], unit rows");
    put("k", p.k, "k [B, T, H, d_k], unit rows");
    put("v", p.v, "v [B, T, HV, d_v]");
    put("g", p.g, "log-decay g [B, T, HV, d_k] ~ -g_span U(0, 1)");
    put("beta", p.beta, "beta [B, T, HV] ~ U(0, 1)");
    put("S0", p.S0, "initial state [B, HV, d_k, d_v]");
    put("dO", p.dO, "upstream dL/do [B, T, HV, d_v]");
    put("dS_T", p.dS_T, "upstream dL/dS_T [B, HV, d_k, d_v]");
    const auto grads = std::vector<const Tensor<mp50>*>{&gr.dq, &gr.dk, &gr.dv, &gr.dg, &gr.dbeta, &gr.dS0};
    for (std::size_t i = 0; i < grads.size(); ++i)
      put(kGradNames[i], grads[i]->cast<double>(),
          std::string(kGradNames[i]) + ": cpp_bin_float_50 recurrence VJP rounded once to float64");
    for (auto [n, x] : std::initializer_list<std::pair<const char*, double>>{
             {"B", double(c.B)}, {"T", double(c.T)}, {"H", double(c.H)}, {"HV", double(c.HV)}, {"d_k", double(c.dk)},
             {"d_v", double(c.dv)}, {"g_span", c.g_span}, {"scale", p.scale}, {"seed", double(c.seed)}})
      f.attr(g, n, x);
  }
}

void check_core(const std::string& path, const Line& line, const std::vector<CoreCase>& cases, bool chunked) {
  const std::string op = chunked ? "kda_chunked_grad" : "kda_recurrent_grad";
  for (const auto& c : cases) {
    const std::string g = "/" + c.name;
    const CoreProblem p = make_core(c);
    std::string drifted;
    for (auto [n, x] : std::initializer_list<std::pair<const char*, const Tensor<double>*>>{
             {"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"g", &p.g}, {"beta", &p.beta}, {"S0", &p.S0}, {"dO", &p.dO},
             {"dS_T", &p.dS_T}})
      if (read_f64(path, g + "/" + n).data != x->data) drifted += std::string(drifted.empty() ? "" : ",") + n;
    line(op + g + " inputs == generator (bit-exact)" + (drifted.empty() ? "" : ": differ in " + drifted),
         drifted.empty() ? 0.0 : 1.0, 0.0);
    const auto compare = [&](const KdaGrad<double>& d, const std::string& label) {
      const auto gl = grad_list(d);
      for (std::size_t i = 0; i < gl.size(); ++i) compare_stored(line, path, op, g, kGradNames[i], *gl[i], label);
    };
    if (!chunked) {
      compare(kda_recurrent_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, p.dO, &p.dS_T),
              " (float64 now vs mp50 then)");
      continue;
    }
    std::stringstream cs(kChunkSizes);
    std::string tok;
    while (std::getline(cs, tok, ','))
      compare(kda_chunked_backward<double>(p.q, p.k, p.v, p.g, p.beta, &p.S0, p.scale, p.dO, &p.dS_T, std::stoul(tok)),
              " C=" + tok);
  }
}

// ---- KDA layer ------------------------------------------------------------------------------------

template <class S>
std::vector<std::pair<const char*, const Mat<S>*>> kda_weight_mats(const KdaWeights<S>& w) {
  return {{"W_q", &w.W_q},       {"W_k", &w.W_k},       {"W_v", &w.W_v},       {"conv_q", &w.conv_q},
          {"conv_k", &w.conv_k}, {"conv_v", &w.conv_v}, {"W_beta", &w.W_beta}, {"W_a_down", &w.W_a_down},
          {"W_a_up", &w.W_a_up}, {"W_alpha", &w.W_alpha}, {"g_bias", &w.g_bias}, {"W_g", &w.W_g},
          {"W_o", &w.W_o}};
}

/// x [T, hidden] (Rng(seed + 1)) and dy [T, hidden] (Rng(seed + 2)) of a layer gradient case.
std::pair<Mat<double>, Mat<double>> layer_x_dy(std::size_t T, std::size_t hidden, std::uint64_t seed) {
  return {normal_mat(T, hidden, seed + 1), normal_mat(T, hidden, seed + 2)};
}

/// Opens group g (description `what`) of a layer gradient case, writes its x, dy and the mp50 dx (`dx_what`), then
/// the weight-gradient group g/dw (`dw_what`) with dL/d<name> of each weight in `dw`; returns g/dw.
std::string put_layer_case(ResultsFile& f, const std::string& g, const std::string& what, const Mat<double>& x,
                           const Mat<double>& dy, const Mat<mp50>& dx, const std::string& dx_what,
                           const std::string& dw_what, const std::vector<std::pair<const char*, const Mat<mp50>*>>& dw) {
  const std::string wg = g + "/dw";
  f.group(g, what);
  f.write_array(g, "x", to_tensor(x), "1", "layer input x [T, hidden] (N(0, 1), Rng(seed + 1))");
  f.write_array(g, "dy", to_tensor(dy), "1", "upstream dL/dy [T, hidden] (N(0, 1), Rng(seed + 2))");
  f.write_array(g, "dx", to_tensor(dx), "1", dx_what);
  f.group(wg, dw_what);
  for (auto [n, m] : dw) f.write_array(wg, n, to_tensor(*m), "1", std::string("dL/d") + n);
  return wg;
}

/// The line saying whether the stored x and dy of layer case g are what the generator draws now, bit for bit.
void check_layer_x_dy(const Line& line, const std::string& path, const std::string& op, const std::string& g,
                      const Mat<double>& x, const Mat<double>& dy) {
  const bool same = read_f64(path, g + "/x").data == to_tensor(x).data && read_f64(path, g + "/dy").data == to_tensor(dy).data;
  line(op + g + " x, dy == generator (bit-exact)", same ? 0.0 : 1.0, 0.0);
}

void regen_kda_layer_grad(ResultsFile& f) {
  for (const auto& c : kda_layer_cases()) {
    const KdaWeights<double> w = KdaWeights<double>::random(c.cfg, c.seed);
    const auto [x, dy] = layer_x_dy(c.T, c.cfg.hidden, c.seed);
    const KdaLayerGrad<mp50> gr = kda_layer_backward<mp50>(c.cfg, w.cast<mp50>(), x.cast<mp50>(), dy.cast<mp50>());
    const std::string g = c.name;
    const std::string wg =
        put_layer_case(f, g, "KDA layer gradient case " + g + " (the config, weights and x of kda_layer.h5), "
                       "cpp_bin_float_50 VJP", x, dy, gr.dx, "dL/dx [T, hidden], mp50 rounded once",
                       "dL/d(weight) for every KdaWeights member (zero for a weight the config does not use)",
                       kda_weight_mats(gr.dw));
    f.write_array(wg, "A_log", to_tensor(gr.dw.A_log), "1", "dL/dA_log [HV]");
    f.write_array(wg, "rms_w", to_tensor(gr.dw.rms_w), "1", "dL/d rms_w [d_v]");
    f.attr(g, "T", double(c.T));
    f.attr(g, "seed", double(c.seed));
  }
}

void check_kda_layer_grad(const std::string& path, const Line& line) {
  for (const auto& c : kda_layer_cases()) {
    const std::string g = "/" + c.name;
    const KdaWeights<double> w = KdaWeights<double>::random(c.cfg, c.seed);
    const auto [x, dy] = layer_x_dy(c.T, c.cfg.hidden, c.seed);
    check_layer_x_dy(line, path, "kda_layer_grad", g, x, dy);
    const KdaLayerGrad<double> d = kda_layer_backward<double>(c.cfg, w, x, dy);
    const auto cmp = [&](const std::string& n, const Tensor<double>& t) {
      compare_stored(line, path, "kda_layer_grad", g, n, t);
    };
    cmp("dx", to_tensor(d.dx));
    for (auto [n, m] : kda_weight_mats(d.dw)) {
      if (m->norm() == 0.0) continue;  // a weight this config does not use: zero in both
      cmp(std::string("dw/") + n, to_tensor(*m));
    }
    cmp("dw/A_log", to_tensor(d.dw.A_log));
    cmp("dw/rms_w", to_tensor(d.dw.rms_w));
  }
}

// ---- MLA ------------------------------------------------------------------------------------------

template <class S>
std::vector<std::pair<const char*, const Mat<S>*>> mla_weight_mats(const MlaWeights<S>& w) {
  std::vector<std::pair<const char*, const Mat<S>*>> r;
  for (auto p : std::initializer_list<std::pair<const char*, const Mat<S>*>>{
           {"W_DKV", &w.W_DKV}, {"W_KR", &w.W_KR}, {"W_Q", &w.W_Q}, {"W_DQ", &w.W_DQ}, {"W_UQ", &w.W_UQ},
           {"W_UK", &w.W_UK}, {"W_UV", &w.W_UV}, {"W_g", &w.W_g}, {"W_o", &w.W_o}})
    if (p.second->size() > 0) r.push_back(p);
  return r;
}

void regen_mla_grad(ResultsFile& f) {
  for (const auto& c : mla_cases()) {
    Rng rng(c.seed);
    const MlaWeights<double> w = mla_random_weights<double>(c.cfg, [&] { return rng.normal(); });
    const auto [x, dy] = layer_x_dy(c.T, c.cfg.hidden, c.seed);
    const MlaLayerGrad<mp50> gr = mla_prefill_backward<mp50>(c.cfg, w.cast<mp50>(), x.cast<mp50>(), dy.cast<mp50>());
    const std::string g = c.name;
    put_layer_case(f, g, "Gated MLA gradient case " + g + " (the config, weights and x of mla.h5), cpp_bin_float_50 VJP",
                   x, dy, gr.dx, "dL/dx [T, hidden], mp50 naive prefill VJP rounded once",
                   "dL/d(weight) for every weight the config uses (MlaWeights names, [out, in])", mla_weight_mats(gr.dw));
    f.attr(g, "T", double(c.T));
    f.attr(g, "seed", double(c.seed));
  }
}

void check_mla_grad(const std::string& path, const Line& line) {
  for (const auto& c : mla_cases()) {
    const std::string g = "/" + c.name;
    Rng rng(c.seed);
    const MlaWeights<double> w = mla_random_weights<double>(c.cfg, [&] { return rng.normal(); });
    const auto [x, dy] = layer_x_dy(c.T, c.cfg.hidden, c.seed);
    check_layer_x_dy(line, path, "mla_grad", g, x, dy);
    for (const MlaEval eval : {MlaEval::naive, MlaEval::absorbed}) {
      const MlaLayerGrad<double> d = mla_prefill_backward<double>(c.cfg, w, x, dy, eval);
      const std::string label = " (" + mla_eval_name(eval) + ")";
      compare_stored(line, path, "mla_grad", g, "dx", to_tensor(d.dx), label);
      for (auto [n, m] : mla_weight_mats(d.dw))
        compare_stored(line, path, "mla_grad", g, std::string("dw/") + n, to_tensor(*m), label);
    }
  }
}

// ---- AttnRes --------------------------------------------------------------------------------------

/// The full-form VJP of every token of a case in scalar S: dv [N, T, d] and dw [d] (summed over tokens).
template <class S>
std::pair<Tensor<double>, Tensor<double>> attn_res_grads(const AttnResFixture& fx, const Mat<double>& dh) {
  const AttnResCase& c = fx.c;
  Tensor<double> dv({c.N, c.T, c.d});
  Vec<S> dw = Vec<S>::Zero(static_cast<Eigen::Index>(c.d));
  for (std::size_t t = 0; t < c.T; ++t) {
    std::vector<Vec<S>> src;
    for (const auto& v : fx.v) src.push_back(Vec<S>(v.row(static_cast<Eigen::Index>(t)).transpose().template cast<S>()));
    const AttnResGrad<S> gr = attn_res_full_backward<S>(fx.w.cast<S>(), src, S(c.eps),
                                                        Vec<S>(dh.row(static_cast<Eigen::Index>(t)).transpose().template cast<S>()));
    dw += gr.dw;
    for (std::size_t i = 0; i < c.N; ++i)
      for (std::size_t j = 0; j < c.d; ++j)
        dv(i, t, j) = static_cast<double>(gr.dsources[i](static_cast<Eigen::Index>(j)));
  }
  return {dv, to_tensor(dw)};
}

void regen_attn_res_grad(ResultsFile& f) {
  for (const auto& c : attn_res_cases()) {
    const AttnResFixture fx = make_attn_res(c);
    const Mat<double> dh = normal_mat(c.T, c.d, c.seed + 2);
    const auto [dv, dw] = attn_res_grads<mp50>(fx, dh);
    const std::string g = c.name;
    f.group(g, "AttnRes gradient case " + g + " (the sources and pseudo-query of attn_res.h5), full form, mp50 VJP");
    f.write_array(g, "dh", to_tensor(dh), "1", "upstream dL/dh [T, d] (N(0, 1), Rng(seed + 2))");
    f.write_array(g, "dv", dv, "1", "dL/dv_i [N, T, d], one gradient per source, mp50 rounded once");
    f.write_array(g, "dw", dw, "1", "dL/dw [d], summed over the T tokens");
    f.attr(g, "seed", double(c.seed));
  }
}

void check_attn_res_grad(const std::string& path, const Line& line) {
  for (const auto& c : attn_res_cases()) {
    const std::string g = "/" + c.name;
    const AttnResFixture fx = make_attn_res(c);
    const Mat<double> dh = normal_mat(c.T, c.d, c.seed + 2);
    line("attn_res_grad" + g + " dh == generator (bit-exact)", read_f64(path, g + "/dh").data == to_tensor(dh).data ? 0.0 : 1.0,
         0.0);
    const auto [dv, dw] = attn_res_grads<double>(fx, dh);
    compare_stored(line, path, "attn_res_grad", g, "dv", dv, " (float64 vs mp50)");
    compare_stored(line, path, "attn_res_grad", g, "dw", dw);
  }
}

}  // namespace

std::vector<LayerOp> grad_ops() {
  return {
      {"kda_recurrent_grad", "KDA recurrence VJP (reference/kda_backward.hpp), mp50 truth",
       [](ResultsFile& f) { regen_core(f, recurrent_cases(), false); },
       [](const std::string& p, const Line& l) { check_core(p, l, recurrent_cases(), false); }, names_of(recurrent_cases())},
      {"kda_chunked_grad", "KDA chunked-form VJP (reference/kda_chunk_backward.hpp) vs the mp50 recurrence VJP",
       [](ResultsFile& f) { regen_core(f, chunked_cases(), true); },
       [](const std::string& p, const Line& l) { check_core(p, l, chunked_cases(), true); }, names_of(chunked_cases())},
      {"kda_layer_grad", "KDA layer VJP (reference/kda_layer_backward.hpp): dx and every weight, mp50 truth",
       regen_kda_layer_grad, check_kda_layer_grad, names_of(kda_layer_cases())},
      {"mla_grad", "Gated MLA prefill VJP (reference/mla_backward.hpp): dx and every weight, mp50 truth", regen_mla_grad,
       check_mla_grad, names_of(mla_cases())},
      {"attn_res_grad", "AttnRes full-form VJP (reference/attn_res_backward.hpp): sources and pseudo-query, mp50 truth",
       regen_attn_res_grad, check_attn_res_grad, names_of(attn_res_cases())},
  };
}

}  // namespace kdalab::golden
