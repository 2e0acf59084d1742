// Layer-level golden fixtures: kda_layer, mla, attn_res, hybrid. The case definitions,
// loaders and evaluations are declared in experiments/golden_fixtures.hpp; `kdalab golden`
// (experiments/golden.cpp) writes and checks them through layer_ops(). A separate translation unit
// from golden.cpp because reference/gate.hpp (KDA layer) and numerics/range.hpp (the KDA input
// generator) both define GateKind and cannot meet in one file.
#include <H5Cpp.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>

#include "experiments/golden_fixtures.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/error.hpp"

namespace kdalab::golden {

namespace {
std::string dtype_name(const H5::DataSet& ds) {
  const H5T_class_t cls = ds.getTypeClass();
  const std::size_t bytes = ds.getDataType().getSize();
  if (cls == H5T_FLOAT) return "float" + std::to_string(8 * bytes);
  if (cls == H5T_INTEGER) return "int" + std::to_string(8 * bytes);
  if (cls == H5T_STRING) return "a string";
  return "a non-numeric type";
}
}  // namespace

Tensor<double> read_f64(const std::string& file, const std::string& name) {
  H5::Exception::dontPrint();
  require(h5read::exists(file, name), "golden file '" + file + "' has no dataset '" + name +
                                          "'; regenerate with 'kdalab golden --regen --force'");
  try {
    H5::H5File f(file, H5F_ACC_RDONLY);
    require(H5Oexists_by_name(f.getId(), name.c_str(), H5P_DEFAULT) > 0,
            "golden file '" + file + "': '" + name + "' is a dangling link (it points to nothing)");
    require(f.childObjType(name) == H5O_TYPE_DATASET, "golden file '" + file + "': '" + name + "' is not a dataset");
    H5::DataSet ds = f.openDataSet(name);
    require(ds.getTypeClass() == H5T_FLOAT && ds.getDataType().getSize() == 8,
            "golden file '" + file + "': dataset '" + name + "' has dtype " + dtype_name(ds) +
                "; expected float64 (fixtures hold the mp50 truth rounded once to float64; regenerate with "
                "'kdalab golden --regen --force')");
  } catch (const H5::Exception& e) {
    throw Error("golden file '" + file + "': HDF5 cannot read '" + name + "' (" + e.getDetailMsg() + ")");
  }
  return h5read::array(file, name);
}

Mat<double> normal_mat(std::size_t r, std::size_t c, std::uint64_t seed) {
  Rng rng(seed);
  Mat<double> m(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = rng.normal();
  return m;
}

namespace {
std::size_t count_attr(const std::string& file, const std::string& g, const char* a) {
  const double x = h5read::attr_double(file, g, a);
  require(std::isfinite(x) && x >= 0 && x == std::floor(x) && x < 1e9,
          "golden file '" + file + "' " + g + ": attribute " + a + " = " + fmt::format("{}", x) + " is not a count");
  return static_cast<std::size_t>(x);
}
void require_shape(const std::string& file, const std::string& name, const Tensor<double>& t,
                   const std::vector<std::size_t>& want) {
  require(t.shape == want, "golden file '" + file + "': dataset '" + name + "' has shape " + shape_str(t.shape) +
                               ", its case attributes give " + shape_str(want));
}
Mat<double> mat_ds(const std::string& file, const std::string& name, std::size_t r, std::size_t c) {
  const Tensor<double> t = read_f64(file, name);
  require_shape(file, name, t, {r, c});
  return to_mat(t, name);
}
Vec<double> vec_ds(const std::string& file, const std::string& name, std::size_t n) {
  const Tensor<double> t = read_f64(file, name);
  require_shape(file, name, t, {n});
  return to_vec(t, name);
}
}  // namespace

std::vector<KdaLayerCase> kda_layer_cases() {
  KdaConfig a;  // K3: bounded gate from x (low rank), grouped value heads, chunked prefill (C = 16)
  a.hidden = 16; a.H = 2; a.HV = 4; a.d_k = 8; a.d_v = 8; a.gate = GateKind::bounded; a.g_min = -5.0;
  a.gate_input = GateInput::from_x; a.gate_rank = 4; a.chunk = 16;
  KdaConfig b = a;  // Kimi Linear softplus gate from v (K3 report Eq. 2 form), d_v != d_k, the recurrence
  b.hidden = 12; b.HV = 2; b.d_v = 6; b.gate = GateKind::softplus; b.gate_input = GateInput::from_v; b.gate_rank = 0;
  b.chunk = 0;
  return {{"bounded_x_grouped_C16", a, 21, 101}, {"softplus_v_recurrent", b, 11, 102}};
}

std::vector<MlaCase> mla_cases() {
  MlaConfig a;  // K3-like: low-rank q, decoupled RoPE on, output gate on
  a.hidden = 24; a.n_h = 3; a.d_c = 12; a.d_cq = 10; a.d_nope = 8; a.d_rope = 4; a.d_v = 6; a.rope = true;
  a.output_gate = true;
  MlaConfig b;  // Kimi Linear-like: full-rank W_Q, no rope part, no output gate
  b.hidden = 20; b.n_h = 2; b.d_c = 10; b.d_cq = 0; b.d_nope = 6; b.d_rope = 0; b.d_v = 5; b.rope = false;
  b.output_gate = false;
  return {{"gated_rope_lowrank_q", a, 9, 201}, {"nope_ungated_fullrank_q", b, 7, 202}};
}

std::vector<AttnResCase> attn_res_cases() {
  AttnResCase a{"d32_N8_block3", 32, 5, 8, 3, 0.5, 1e-6, 301};  // blocks b_0, 2 full blocks, a partial of 1
  AttnResCase b{"d16_N5_peaked", 16, 3, 5, 2, 3.0, 1e-6, 302};  // large logits: a peaked softmax
  return {a, b};
}

std::vector<HybridCase> hybrid_cases() {
  return {{"toy", "data/configs/toy.json", 70, 401}};  // T = 70 > 64: two chunks in every KDA layer's prefill
}

AttnResFixture make_attn_res(const AttnResCase& c) {
  AttnResFixture f{c, {}, {}};
  Rng rng(c.seed);
  for (std::size_t i = 0; i < c.N; ++i) {
    Mat<double> v(static_cast<Eigen::Index>(c.T), static_cast<Eigen::Index>(c.d));
    for (Eigen::Index j = 0; j < v.size(); ++j) v.data()[j] = (1.0 + 0.3 * static_cast<double>(i)) * rng.normal();
    f.v.push_back(v);
  }
  f.w = Vec<double>(static_cast<Eigen::Index>(c.d));
  for (Eigen::Index j = 0; j < f.w.size(); ++j) f.w(j) = c.w_std * rng.normal();
  return f;
}

KdaLayerFixture load_kda_layer(const std::string& file, const std::string& name) {
  const std::string g = "/" + name;
  require(h5read::exists(file, g), "golden file '" + file + "' has no case '" + name + "'");
  KdaLayerFixture f;
  f.c.name = name;
  KdaConfig& c = f.c.cfg;
  c.hidden = count_attr(file, g, "hidden"); c.H = count_attr(file, g, "H"); c.HV = count_attr(file, g, "HV");
  c.d_k = count_attr(file, g, "d_k"); c.d_v = count_attr(file, g, "d_v");
  c.gate = parse_gate_kind(h5read::attr_string(file, g, "gate"));
  c.gate_input = parse_gate_input(h5read::attr_string(file, g, "gate_input"));
  c.g_min = h5read::attr_double(file, g, "g_min");
  c.gate_rank = count_attr(file, g, "gate_rank"); c.conv_kernel = count_attr(file, g, "conv_kernel");
  c.l2_eps = h5read::attr_double(file, g, "l2_eps"); c.rms_eps = h5read::attr_double(file, g, "rms_eps");
  c.scale = h5read::attr_double(file, g, "scale"); c.chunk = count_attr(file, g, "chunk");
  c.validate();
  f.c.T = count_attr(file, g, "T");
  f.c.seed = count_attr(file, g, "seed");
  f.x = mat_ds(file, g + "/x", f.c.T, c.hidden);
  const std::size_t qk = c.H * c.d_k, vw = c.HV * c.d_v, gw = c.HV * c.d_k, K = c.conv_kernel, r = c.rank();
  const std::string w = g + "/w/";
  f.w.W_q = mat_ds(file, w + "W_q", qk, c.hidden); f.w.W_k = mat_ds(file, w + "W_k", qk, c.hidden);
  f.w.W_v = mat_ds(file, w + "W_v", vw, c.hidden);
  f.w.conv_q = mat_ds(file, w + "conv_q", qk, K); f.w.conv_k = mat_ds(file, w + "conv_k", qk, K);
  f.w.conv_v = mat_ds(file, w + "conv_v", vw, K);
  f.w.W_beta = mat_ds(file, w + "W_beta", c.HV, c.hidden);
  f.w.W_a_down = mat_ds(file, w + "W_a_down", r, c.hidden); f.w.W_a_up = mat_ds(file, w + "W_a_up", gw, r);
  f.w.W_alpha = mat_ds(file, w + "W_alpha", gw, vw);
  f.w.g_bias = mat_ds(file, w + "g_bias", c.HV, c.d_k);
  f.w.W_g = mat_ds(file, w + "W_g", vw, c.hidden); f.w.W_o = mat_ds(file, w + "W_o", c.hidden, vw);
  f.w.A_log = vec_ds(file, w + "A_log", c.HV); f.w.rms_w = vec_ds(file, w + "rms_w", c.d_v);
  return f;
}

MlaFixture load_mla(const std::string& file, const std::string& name) {
  const std::string g = "/" + name;
  require(h5read::exists(file, g), "golden file '" + file + "' has no case '" + name + "'");
  MlaFixture f;
  f.c.name = name;
  MlaConfig& c = f.c.cfg;
  c.hidden = count_attr(file, g, "hidden"); c.n_h = count_attr(file, g, "n_h"); c.d_c = count_attr(file, g, "d_c");
  c.d_cq = count_attr(file, g, "d_cq"); c.d_nope = count_attr(file, g, "d_nope");
  c.d_rope = count_attr(file, g, "d_rope"); c.d_v = count_attr(file, g, "d_v");
  c.rope = h5read::attr_string(file, g, "rope") == "yes";
  c.rope_theta = h5read::attr_double(file, g, "rope_theta");
  c.output_gate = h5read::attr_string(file, g, "output_gate") == "yes";
  mla_validate_config(c);
  f.c.T = count_attr(file, g, "T");
  f.c.seed = count_attr(file, g, "seed");
  f.x = mat_ds(file, g + "/x", f.c.T, c.hidden);
  const std::string w = g + "/w/";
  const std::size_t d = c.hidden, nq = c.n_h * c.d_qk(), nv = c.n_h * c.d_v;
  f.w.W_DKV = mat_ds(file, w + "W_DKV", c.d_c, d);
  f.w.W_KR = mat_ds(file, w + "W_KR", c.d_rope, d);
  if (c.d_cq == 0) {
    f.w.W_Q = mat_ds(file, w + "W_Q", nq, d);
  } else {
    f.w.W_DQ = mat_ds(file, w + "W_DQ", c.d_cq, d);
    f.w.W_UQ = mat_ds(file, w + "W_UQ", nq, c.d_cq);
  }
  f.w.W_UK = mat_ds(file, w + "W_UK", c.n_h * c.d_nope, c.d_c);
  f.w.W_UV = mat_ds(file, w + "W_UV", nv, c.d_c);
  if (c.output_gate) f.w.W_g = mat_ds(file, w + "W_g", nv, d);
  f.w.W_o = mat_ds(file, w + "W_o", d, nv);
  return f;
}

AttnResFixture load_attn_res(const std::string& file, const std::string& name) {
  const std::string g = "/" + name;
  require(h5read::exists(file, g), "golden file '" + file + "' has no case '" + name + "'");
  AttnResFixture f;
  AttnResCase& c = f.c;
  c.name = name;
  c.d = count_attr(file, g, "d"); c.T = count_attr(file, g, "T"); c.N = count_attr(file, g, "N");
  c.block_sources = count_attr(file, g, "block_sources"); c.eps = h5read::attr_double(file, g, "eps");
  c.w_std = h5read::attr_double(file, g, "w_std"); c.seed = count_attr(file, g, "seed");
  const Tensor<double> v = read_f64(file, g + "/v");
  require_shape(file, g + "/v", v, {c.N, c.T, c.d});
  for (std::size_t i = 0; i < c.N; ++i) {
    Mat<double> m(static_cast<Eigen::Index>(c.T), static_cast<Eigen::Index>(c.d));
    for (Eigen::Index j = 0; j < m.size(); ++j) m.data()[j] = v.data[i * c.T * c.d + static_cast<std::size_t>(j)];
    f.v.push_back(m);
  }
  f.w = vec_ds(file, g + "/w", c.d);
  return f;
}

HybridFixture load_hybrid(const std::string& file, const std::string& name) {
  const std::string g = "/" + name;
  require(h5read::exists(file, g), "golden file '" + file + "' has no case '" + name + "'");
  HybridFixture f;
  f.c.name = name;
  f.c.config_path = h5read::attr_string(file, g, "config_source");
  f.c.T = count_attr(file, g, "T");
  f.c.x_seed = count_attr(file, g, "x_seed");
  f.config_json = h5read::attr_string(file, g, "model_config");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f.config_json);
  } catch (const std::exception& e) {
    throw Error("golden file '" + file + "' " + g + ": attribute model_config is not valid JSON (" + e.what() + ")");
  }
  f.cfg = parse_model_config(j, file + g + " model_config");
  f.x = mat_ds(file, g + "/x", f.c.T, f.cfg.hidden);
  return f;
}

Tensor<double> hybrid_weights_sum(const Hybrid<double>& m) {
  Tensor<double> t({m.layers.size() + 1});
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    const auto& L = m.layers[l];
    double s = L.w_attn.sum() + L.w_ffn.sum() + L.ffn.W_gate.sum() + L.ffn.W_up.sum() + L.ffn.W_down.sum();
    if (L.kind == LayerKind::mla) {
      const auto& w = std::get<0>(L.attn).w;
      for (const Mat<double>* p : {&w.W_DKV, &w.W_KR, &w.W_Q, &w.W_DQ, &w.W_UQ, &w.W_UK, &w.W_UV, &w.W_g, &w.W_o}) s += p->sum();
    } else {
      const auto& w = std::get<1>(L.attn).weights();
      for (const Mat<double>* p : {&w.W_q, &w.W_k, &w.W_v, &w.conv_q, &w.conv_k, &w.conv_v, &w.W_beta, &w.W_a_down,
                                   &w.W_a_up, &w.W_alpha, &w.g_bias, &w.W_g, &w.W_o})
        s += p->sum();
      s += w.A_log.sum() + w.rms_w.sum();
    }
    t.data[l] = s;
  }
  t.data.back() = m.w_out.sum();
  return t;
}

namespace {

template <class T>
std::string case_list(const std::vector<T>& cs) {
  std::string s;
  for (const auto& c : cs) s += (s.empty() ? "" : ",") + c.name;
  return s;
}

double rel_mat(const Mat<double>& out, const Tensor<double>& ref) { return rel_rms(to_tensor(out).data, ref.data); }

void regen_kda_layer(ResultsFile& f) {
  for (const auto& c : kda_layer_cases()) {
    const std::string g = c.name;
    const KdaWeights<double> w = KdaWeights<double>::random(c.cfg, c.seed);
    const Mat<double> x = normal_mat(c.T, c.cfg.hidden, c.seed + 1);
    const auto r = run_kda_layer<mp50>(c.cfg, w.cast<mp50>(), Mat<mp50>(x.cast<mp50>()), c.T);
    f.group(g, "KDA layer case " + g + ": seeded x and weights, cpp_bin_float_50 outputs");
    f.write_array(g, "x", to_tensor(x), "1", "layer input x [T, hidden] (N(0, 1), Rng(seed + 1))");
    const std::string wg = g + "/w";
    f.group(wg, "the layer's weights (KdaWeights::random(config, seed)), [out, in]");
    for (auto [n, m] : std::initializer_list<std::pair<const char*, const Mat<double>*>>{
             {"W_q", &w.W_q}, {"W_k", &w.W_k}, {"W_v", &w.W_v}, {"conv_q", &w.conv_q}, {"conv_k", &w.conv_k},
             {"conv_v", &w.conv_v}, {"W_beta", &w.W_beta}, {"W_a_down", &w.W_a_down}, {"W_a_up", &w.W_a_up},
             {"W_alpha", &w.W_alpha}, {"g_bias", &w.g_bias}, {"W_g", &w.W_g}, {"W_o", &w.W_o}})
      f.write_array(wg, n, to_tensor(*m), "1", std::string("weight ") + n + " (reference/kda_layer.hpp KdaWeights)");
    f.write_array(wg, "A_log", to_tensor(w.A_log), "1", "per-head gate log-scale A_log [HV]");
    f.write_array(wg, "rms_w", to_tensor(w.rms_w), "1", "RMSNorm weight [d_v]");
    f.write_array(g, "y", to_tensor(r.y), "1", "layer output y [T, hidden]: mp50 prefill rounded once to float64");
    f.write_array(g, "o_core", to_tensor(r.o_core), "1", "KDA core output o [T, HV d_v] before RMSNorm (mp50)");
    f.write_array(g, "S_final", states_tensor(r.S_final), "1", "final KDA states [HV, d_k, d_v] (mp50)");
    const KdaConfig& k = c.cfg;
    for (auto [n, v] : std::initializer_list<std::pair<const char*, double>>{
             {"hidden", double(k.hidden)}, {"H", double(k.H)}, {"HV", double(k.HV)}, {"d_k", double(k.d_k)},
             {"d_v", double(k.d_v)}, {"g_min", k.g_min}, {"gate_rank", double(k.gate_rank)},
             {"conv_kernel", double(k.conv_kernel)}, {"l2_eps", k.l2_eps}, {"rms_eps", k.rms_eps}, {"scale", k.scale},
             {"chunk", double(k.chunk)}, {"T", double(c.T)}, {"seed", double(c.seed)}})
      f.attr(g, n, v);
    f.attr(g, "gate", gate_kind_name(k.gate));
    f.attr(g, "gate_input", gate_input_name(k.gate_input));
  }
}

void check_kda_layer(const std::string& path, const std::function<void(const std::string&, double, double)>& line) {
  for (const auto& c : kda_layer_cases()) {
    const KdaLayerFixture fx = load_kda_layer(path, c.name);
    const std::string g = "/" + c.name;
    line("kda_layer" + g + " weights == KdaWeights::random(seed)",
         rel_rms(to_tensor(KdaWeights<double>::random(fx.c.cfg, fx.c.seed).W_o).data, read_f64(path, g + "/w/W_o").data),
         0.0);
    const auto r = run_kda_layer<double>(fx.c.cfg, fx.w, fx.x, fx.c.T);
    line("kda_layer" + g + "/y (float64 prefill vs mp50)", rel_mat(r.y, read_f64(path, g + "/y")), tol::golden_f64.value);
    line("kda_layer" + g + "/o_core", rel_mat(r.o_core, read_f64(path, g + "/o_core")), tol::golden_f64.value);
    line("kda_layer" + g + "/S_final", rel_rms(states_tensor(r.S_final).data, read_f64(path, g + "/S_final").data),
         tol::golden_f64.value);
    const auto d = run_kda_layer<double>(fx.c.cfg, fx.w, fx.x, fx.c.T / 2);
    line("kda_layer" + g + "/y (prefill half, then decode steps)", rel_mat(d.y, read_f64(path, g + "/y")),
         tol::golden_f64.value);
  }
}

void regen_mla(ResultsFile& f) {
  for (const auto& c : mla_cases()) {
    const std::string g = c.name;
    Rng rng(c.seed);
    const MlaWeights<double> w = mla_random_weights<double>(c.cfg, [&] { return rng.normal(); });
    const Mat<double> x = normal_mat(c.T, c.cfg.hidden, c.seed + 1);
    const auto r = run_mla<mp50>(c.cfg, w.cast<mp50>(), Mat<mp50>(x.cast<mp50>()));
    const std::size_t T = c.T, nh = c.cfg.n_h;
    f.group(g, "Gated MLA case " + g + ": seeded x and weights, cpp_bin_float_50 outputs");
    f.write_array(g, "x", to_tensor(x), "1", "layer input x [T, hidden] (N(0, 1), Rng(seed + 1))");
    const std::string wg = g + "/w";
    f.group(wg, "the layer's weights (mla_random_weights(config, Rng(seed).normal), std 1/sqrt(fan_in)), [out, in]");
    std::vector<std::pair<const char*, const Mat<double>*>> ws{{"W_DKV", &w.W_DKV}, {"W_KR", &w.W_KR}};
    if (c.cfg.d_cq == 0) ws.push_back({"W_Q", &w.W_Q});
    else ws.insert(ws.end(), {{"W_DQ", &w.W_DQ}, {"W_UQ", &w.W_UQ}});
    ws.insert(ws.end(), {{"W_UK", &w.W_UK}, {"W_UV", &w.W_UV}});
    if (c.cfg.output_gate) ws.push_back({"W_g", &w.W_g});
    ws.push_back({"W_o", &w.W_o});
    for (auto [n, m] : ws) f.write_array(wg, n, to_tensor(*m), "1", std::string("weight ") + n + " (reference/mla.hpp)");
    f.write_array(g, "y_naive", to_tensor(r.y_naive), "1", "output y [T, hidden], naive evaluation (mp50)");
    f.write_array(g, "y_absorbed", to_tensor(r.y_absorbed), "1", "output y [T, hidden], absorbed evaluation (mp50)");
    f.write_array(g, "c", to_tensor(r.c), "1", "latent cache c [T, d_c] (mp50)");
    f.write_array(g, "k_R", to_tensor(r.k_R), "1", "shared rope key k^R [T, d_rope], rotated when rope = yes (mp50)");
    auto heads = [&](const Mat<mp50>& m, std::size_t w3) {
      Tensor<double> t = to_tensor(m);
      t.shape = {T, nh, w3};
      return t;
    };
    f.write_array(g, "q_abs", heads(r.q_abs, c.cfg.d_c), "1", "absorbed query q~_i = W_UK,i^T q^C_i [T, n_h, d_c] (mp50)");
    f.write_array(g, "q_R", heads(r.q_R, c.cfg.d_rope), "1", "rope query q^R [T, n_h, d_rope] (mp50)");
    f.write_array(g, "a", heads(r.a, c.cfg.d_c), "1",
                  "attended latent a_i = softmax_tau(scale (q~_i . c_tau + q^R_i . k^R_tau)) c, causal [T, n_h, d_c] (mp50)");
    const MlaConfig& m = c.cfg;
    for (auto [n, v] : std::initializer_list<std::pair<const char*, double>>{
             {"hidden", double(m.hidden)}, {"n_h", double(m.n_h)}, {"d_c", double(m.d_c)}, {"d_cq", double(m.d_cq)},
             {"d_nope", double(m.d_nope)}, {"d_rope", double(m.d_rope)}, {"d_v", double(m.d_v)},
             {"rope_theta", m.rope_theta}, {"scale", 1.0 / std::sqrt(double(m.d_qk()))}, {"T", double(c.T)},
             {"seed", double(c.seed)}})
      f.attr(g, n, v);
    f.attr(g, "rope", m.rope ? "yes" : "no");
    f.attr(g, "output_gate", m.output_gate ? "yes" : "no");
  }
}

void check_mla(const std::string& path, const std::function<void(const std::string&, double, double)>& line) {
  for (const auto& c : mla_cases()) {
    const MlaFixture fx = load_mla(path, c.name);
    const std::string g = "/" + c.name;
    Rng rng(fx.c.seed);
    line("mla" + g + " weights == mla_random_weights(seed)",
         rel_rms(to_tensor(mla_random_weights<double>(fx.c.cfg, [&] { return rng.normal(); }).W_o).data,
                 read_f64(path, g + "/w/W_o").data),
         0.0);
    const auto r = run_mla<double>(fx.c.cfg, fx.w, fx.x);
    const Tensor<double> yn = read_f64(path, g + "/y_naive"), ya = read_f64(path, g + "/y_absorbed");
    line("mla" + g + "/y_naive (float64 naive vs mp50)", rel_mat(r.y_naive, yn), tol::golden_f64.value);
    line("mla" + g + "/y_absorbed (float64 absorbed vs mp50)", rel_mat(r.y_absorbed, ya), tol::golden_f64.value);
    line("mla" + g + "/y_naive vs float64 streaming (tile 4)", rel_mat(r.y_streaming, yn), tol::golden_f64.value);
    line("mla" + g + "/y_naive vs float64 decode steps", rel_mat(r.y_decode, yn), tol::golden_f64.value);
    line("mla" + g + "/a (attended latent)", rel_rms(to_tensor(r.a).data, read_f64(path, g + "/a").data),
         tol::golden_f64.value);
    line("mla" + g + "/q_abs", rel_rms(to_tensor(r.q_abs).data, read_f64(path, g + "/q_abs").data), tol::golden_f64.value);
    // the kernel-level pieces `kdalab check --op mla` tests feed on: the latent c and the rope parts
    line("mla" + g + "/c (latent)", rel_rms(to_tensor(r.c).data, read_f64(path, g + "/c").data), tol::golden_f64.value);
    if (fx.c.cfg.d_rope > 0) {
      line("mla" + g + "/k_R", rel_rms(to_tensor(r.k_R).data, read_f64(path, g + "/k_R").data), tol::golden_f64.value);
      line("mla" + g + "/q_R", rel_rms(to_tensor(r.q_R).data, read_f64(path, g + "/q_R").data),
           tol::golden_f64.value);
    }
  }
}

void regen_attn_res(ResultsFile& f) {
  for (const auto& c : attn_res_cases()) {
    const std::string g = c.name;
    const AttnResFixture fx = make_attn_res(c);
    std::vector<Mat<mp50>> vm;
    for (const auto& v : fx.v) vm.push_back(v.cast<mp50>());
    const Vec<mp50> wm = fx.w.cast<mp50>();
    const Mat<mp50> hf = run_attn_res<mp50>(vm, wm, ResidualMode::full, 1, c.eps);
    const Mat<mp50> hb = run_attn_res<mp50>(vm, wm, ResidualMode::block, c.block_sources, c.eps);
    f.group(g, "AttnRes case " + g + ": seeded sources and pseudo-query, cpp_bin_float_50 outputs");
    Tensor<double> v({c.N, c.T, c.d});
    for (std::size_t i = 0; i < c.N; ++i)
      for (std::size_t j = 0; j < c.T * c.d; ++j) v.data[i * c.T * c.d + j] = fx.v[i].data()[j];
    f.write_array(g, "v", v, "1", "sources [N, T, d]: v_0 = h_1 (the embedding), v_i = the outputs f_i; v_i ~ (1 + 0.3 i) N(0, 1)");
    f.write_array(g, "w", to_tensor(fx.w), "1", "pseudo-query w [d] ~ w_std N(0, 1)");
    f.write_array(g, "h_full", to_tensor(hf), "1", "full AttnRes h = sum_i softmax_i(w . RMSNorm(v_i)) v_i [T, d] (mp50)");
    f.write_array(g, "h_block", to_tensor(hb), "1",
                  "block AttnRes with block_sources outputs per block (b_0 = v_0, block sums, the partial sum) [T, d] (mp50)");
    for (auto [n, x] : std::initializer_list<std::pair<const char*, double>>{
             {"d", double(c.d)}, {"T", double(c.T)}, {"N", double(c.N)}, {"block_sources", double(c.block_sources)},
             {"eps", c.eps}, {"w_std", c.w_std}, {"seed", double(c.seed)}})
      f.attr(g, n, x);
  }
}

void check_attn_res(const std::string& path, const std::function<void(const std::string&, double, double)>& line) {
  for (const auto& c : attn_res_cases()) {
    const AttnResFixture fx = load_attn_res(path, c.name);
    const std::string g = "/" + c.name;
    const Mat<double> hf = run_attn_res<double>(fx.v, fx.w, ResidualMode::full, 1, fx.c.eps);
    const Mat<double> hb = run_attn_res<double>(fx.v, fx.w, ResidualMode::block, fx.c.block_sources, fx.c.eps);
    line("attn_res" + g + "/h_full (float64 vs mp50)", rel_mat(hf, read_f64(path, g + "/h_full")), tol::golden_f64.value);
    line("attn_res" + g + "/h_block", rel_mat(hb, read_f64(path, g + "/h_block")), tol::golden_f64.value);
  }
}

void regen_hybrid(ResultsFile& f) {
  for (const auto& c : hybrid_cases()) {
    const std::string g = c.name;
    std::ifstream in(c.config_path);
    require(static_cast<bool>(in), "golden --regen: model config '" + c.config_path +
                                       "' not found (run from the repository root)");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const ModelConfig cfg = parse_model_config(nlohmann::json::parse(text), c.config_path);
    const Mat<double> x = normal_mat(c.T, cfg.hidden, c.x_seed);
    const auto t0 = std::chrono::steady_clock::now();
    const Hybrid<mp50> mm = build_hybrid<mp50>(cfg);
    auto cache = mm.make_cache(c.T);
    const Mat<mp50> y = mm.prefill(Mat<mp50>(x.cast<mp50>()), cache);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    f.group(g, "hybrid case " + g + ": " + c.config_path + " (the K3 layout at toy widths), cpp_bin_float_50 output");
    f.write_array(g, "x", to_tensor(x), "1", "input h_1 [T, hidden] (N(0, 1), Rng(x_seed))");
    f.write_array(g, "y", to_tensor(y), "1", "output [T, hidden]: mp50 prefill (naive MLA) rounded once to float64");
    f.write_array(g, "weights_sum", hybrid_weights_sum(build_hybrid<double>(cfg)), "1",
                  "sum of every weight of layer l (l = 0 .. L-1), then of w_out [L + 1]: fingerprint of the weights drawn "
                  "from the config's seed");
    f.attr(g, "model_config", nlohmann::json::parse(text).dump());
    f.attr(g, "config_source", c.config_path);
    f.attr(g, "T", double(c.T));
    f.attr(g, "x_seed", double(c.x_seed));
    f.attr(g, "mp50_seconds", secs);
    f.attr(g, "note", fmt::format("the full toy.json model ({} layers: KDA and Gated MLA, block AttnRes, SwiGLU) at T = {}; "
                                  "mp50 prefill took {:.1f} s here, so no smaller config was needed",
                                  cfg.num_layers, c.T, secs));
  }
}

void check_hybrid(const std::string& path, const std::function<void(const std::string&, double, double)>& line) {
  for (const auto& c : hybrid_cases()) {
    const HybridFixture fx = load_hybrid(path, c.name);
    const std::string g = "/" + c.name;
    Hybrid<double> m = build_hybrid<double>(fx.cfg);
    line("hybrid" + g + "/weights_sum (weights from the seed)",
         rel_rms(hybrid_weights_sum(m).data, read_f64(path, g + "/weights_sum").data), tol::golden_f64_hybrid.value);
    const Tensor<double> y = read_f64(path, g + "/y");
    auto cp = m.make_cache(fx.c.T);
    line("hybrid" + g + "/y (float64 prefill vs mp50)", rel_mat(m.prefill(fx.x, cp), y), tol::golden_f64_hybrid.value);
    auto cd = m.make_cache(fx.c.T);
    Mat<double> yd(fx.x.rows(), fx.x.cols());
    for (Eigen::Index t = 0; t < fx.x.rows(); ++t) yd.row(t) = m.decode(Vec<double>(fx.x.row(t).transpose()), cd).transpose();
    line("hybrid" + g + "/y (float64 decode steps)", rel_mat(yd, y), tol::golden_f64_hybrid.value);
    m.mla_eval = MlaEval::absorbed;
    auto ca = m.make_cache(fx.c.T);
    line("hybrid" + g + "/y (float64 prefill, absorbed MLA)", rel_mat(m.prefill(fx.x, ca), y), tol::golden_f64_hybrid.value);
  }
}

}  // namespace

std::vector<LayerOp> layer_ops() {
  std::vector<LayerOp> ops{
      {"kda_layer", "KDA layer (K3 report Eqs. 2, 5, 6; reference/kda_layer.hpp): prefill, decode, mp50 truth",
       regen_kda_layer, check_kda_layer, case_list(kda_layer_cases())},
      {"mla", "Gated MLA (DeepSeek-V2 Eqs. 9-19, K3 report Eq. 7; reference/mla.hpp): naive and absorbed, mp50 truth",
       regen_mla, check_mla, case_list(mla_cases())},
      {"attn_res", "Attention Residuals (K3 report Eqs. 8-10; reference/attn_res.hpp): full and block, mp50 truth",
       regen_attn_res, check_attn_res, case_list(attn_res_cases())},
      {"hybrid", "KDA / Gated MLA hybrid (reference/hybrid.hpp) on data/configs/toy.json, mp50 truth", regen_hybrid,
       check_hybrid, case_list(hybrid_cases())},
  };
  for (auto& op : grad_ops()) ops.push_back(std::move(op));
  return ops;
}

}  // namespace kdalab::golden
