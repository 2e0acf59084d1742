// Golden regression: the current code against data/golden/*.h5 (written by `kdalab golden --regen`
// from the cpp_bin_float_50 reference). Any change of numerics shows up here.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "reference/kda_decode.hpp"
#include "experiments/results.hpp"
#include "numerics/kda_inputs.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/kda.hpp"
#include "reference/kda_chunk.hpp"
#include "tests/catch.hpp"

using namespace kdalab;
namespace fs = std::filesystem;

namespace {
struct Case {
  std::string file, group;
  KdaInputs in;
  bool has_S0;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> r;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ',')) r.push_back(t);
  return r;
}

Case load(const std::string& file, const std::string& name) {
  const std::string g = "/" + name;
  Case c{file, g, {}, h5read::attr_string(file, g, "has_S0") == "yes"};
  KdaInputs& in = c.in;
  auto n = [&](const char* a) { return static_cast<std::size_t>(h5read::attr_double(file, g, a)); };
  in.B = n("B"); in.T = n("T"); in.H = n("H"); in.HV = in.H; in.d_k = n("d_k"); in.d_v = n("d_v");
  in.scale = h5read::attr_double(file, g, "scale");
  for (auto [nm, t] : std::initializer_list<std::pair<const char*, Tensor<double>*>>{
           {"q", &in.q}, {"k", &in.k}, {"v", &in.v}, {"g", &in.g}, {"beta", &in.beta}, {"S0", &in.S0}})
    *t = h5read::array(file, g + "/" + nm);
  return c;
}

template <class S>
KdaOutput<S> run(const Case& c, KdaVariant var = KdaVariant::kda) {
  const KdaInputs& in = c.in;
  const Tensor<S> S0 = c.has_S0 ? in.S0.cast<S>() : Tensor<S>(in.S0.shape);
  if (c.file.find("kda_decode") != std::string::npos)
    return kda_decode_steps<S>(in.q.cast<S>(), in.k.cast<S>(), in.v.cast<S>(), in.g.cast<S>(), in.beta.cast<S>(), S0,
                               static_cast<S>(in.scale));
  return kda_recurrent<S>(in.q.cast<S>(), in.k.cast<S>(), in.v.cast<S>(), in.g.cast<S>(), in.beta.cast<S>(),
                          c.has_S0 ? &S0 : nullptr, static_cast<S>(in.scale), var);
}

std::vector<Case> all_cases(const std::string& op) {
  const std::string f = "data/golden/" + op + ".h5";
  REQUIRE(fs::exists(f));
  std::vector<Case> r;
  for (const auto& n : split(h5read::attr_string(f, "/", "cases"))) r.push_back(load(f, n));
  REQUIRE(!r.empty());
  return r;
}
}  // namespace

TEST_CASE("golden KDA recurrent and decode: float64 now vs mp50 then within 1e-13, float32 within its tolerance") {
  for (const char* op : {"kda_recurrent", "kda_decode"})
    for (const Case& c : all_cases(op)) {
      INFO(op << c.group);
      const auto o_ref = h5read::array(c.file, c.group + "/o").data;
      const auto S_ref = h5read::array(c.file, c.group + "/S_final").data;
      const KdaOutput<double> d = run<double>(c);
      const double eo = rel_rms(d.o.data, o_ref), es = rel_rms(d.S_final.data, S_ref);
      CAPTURE(eo, es);
      CHECK(eo <= tol::golden_f64.value);
      CHECK(es <= tol::golden_f64.value);
      const KdaOutput<float> f = run<float>(c);
      CHECK(rel_rms(f.o.cast<double>().data, o_ref) <= tol::f32_vs_truth.value);
      if (h5read::attr_string(c.file, c.group, "variants") == "yes")
        for (KdaVariant v : {KdaVariant::gated_deltanet, KdaVariant::deltanet, KdaVariant::gla, KdaVariant::linear}) {
          INFO(variant_name(v));
          CHECK(rel_rms(run<double>(c, v).o.data, h5read::array(c.file, c.group + "/o_" + variant_name(v)).data) <=
                tol::golden_f64.value);
        }
    }
}

TEST_CASE("golden KDA: the multiprecision reference reproduces its stored output to storage rounding") {
  const Case c = all_cases("kda_recurrent").front();
  const KdaOutput<mp50> m = run<mp50>(c);
  const double e = rel_rms(m.o.cast<double>().data, h5read::array(c.file, c.group + "/o").data);
  CAPTURE(e);
  CHECK(e <= tol::golden_mp.value);
}

TEST_CASE("golden KDA: the named generator still draws the stored raw inputs bit for bit") {
  for (const char* op : {"kda_recurrent", "kda_decode", "kda_chunked"}) {
    const std::string f = std::string("data/golden/") + op + ".h5";
    for (const auto& n : split(h5read::attr_string(f, "/", "cases"))) {
      const std::string g = "/" + n;
      INFO(f << g);
      KdaGenSpec s;
      auto a = [&](const char* x) { return h5read::attr_double(f, g, x); };
      s.B = static_cast<std::size_t>(a("B")); s.T = static_cast<std::size_t>(a("T"));
      s.H = static_cast<std::size_t>(a("H")); s.d_k = static_cast<std::size_t>(a("d_k"));
      s.d_v = static_cast<std::size_t>(a("d_v")); s.seed = static_cast<std::uint64_t>(a("seed")); s.g_min = a("g_min");
      s.gate = parse_gate_kind(h5read::attr_string(f, g, "gate"));
      s.beta = parse_beta_dist(h5read::attr_string(f, g, "beta"));
      const KdaInputs in = kda_inputs(s);
      CHECK(in.generator == h5read::attr_string(f, g, "generator"));
      for (auto [nm, t] : std::initializer_list<std::pair<const char*, const Tensor<double>*>>{
               {"q_raw", &in.q_raw}, {"k_raw", &in.k_raw}, {"v", &in.v}, {"g_raw", &in.g_raw},
               {"beta_raw", &in.beta_raw}, {"A_log", &in.A_log}, {"bias", &in.bias}, {"S0", &in.S0}}) {
        INFO(nm);
        CHECK(h5read::array(f, g + "/" + nm).data == t->data);
      }
      CHECK(rel_rms(in.g.data, h5read::array(f, g + "/g").data) <= tol::golden_mp.value * 10);
    }
  }
}

TEST_CASE("golden KDA chunked: the chunked form for every stored C equals the mp50 recurrent truth") {
  const auto cases = all_cases("kda_chunked");
  CHECK(h5read::attr_string("data/golden/kda_chunked.h5", "/", "C") == "1,16,32");
  for (const Case& c : cases) {
    const auto o_ref = h5read::array(c.file, c.group + "/o").data;
    const auto S_ref = h5read::array(c.file, c.group + "/S_final").data;
    CHECK(rel_rms(run<double>(c).o.data, o_ref) <= tol::golden_f64.value);
    for (std::size_t C : {1, 16, 32})
      for (TriInverse inv : {TriInverse::forward_substitution, TriInverse::neumann}) {
        INFO(c.group << " C=" << C << " " << tri_inverse_name(inv));
        ChunkOptions opt;
        opt.C = C;
        opt.tile = 16;
        opt.inverse = inv;
        const KdaOutput<double> r = kda_chunked<double>(c.in.q, c.in.k, c.in.v, c.in.g, c.in.beta,
                                                        c.has_S0 ? &c.in.S0 : nullptr, c.in.scale, opt);
        CHECK(rel_rms(r.o.data, o_ref) <= tol::golden_f64.value);
        CHECK(rel_rms(r.S_final.data, S_ref) <= tol::golden_f64.value);
      }
  }
}

TEST_CASE("kdalab golden passes and the fixtures stay under 5 MB") {
  const char* bin = std::getenv("KDALAB_BIN");
  REQUIRE(bin != nullptr);
  FILE* p = popen((std::string(bin) + " golden 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), p)) out += buf.data();
  const int st = pclose(p);
  INFO(out);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(out.find("all checks pass") != std::string::npos);
  std::uintmax_t total = 0;
  for (const auto& e : fs::directory_iterator("data/golden")) total += e.file_size();
  CHECK(total < 5'000'000);
}
