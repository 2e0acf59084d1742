// Causal MLA prefill kernel (kernels/mla_prefill.hpp) against float64: softmax(scale q~ C^T) C per
// (token, head) over the causal prefix, on the same bf16 latents and the exact (unrounded) absorbed
// query q~; end to end against reference/mla.hpp mla_attend_naive (bf16 q^C, W_UK, W_UV, latents);
// prefill then decode (kernels/mla.hpp) == prefill of the longer sequence. Fresh seeded inputs (never
// zeros); outputs, and the cache rows the prefill must write, poisoned (NaN) before every run.
// Runs only where the CUDA kernels are built (ctest label gpu).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/mla.hpp"
#include "kernels/mla_prefill.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/mla.hpp"
#include "tests/catch.hpp"
#include "tests/gpu/kda_gpu_util.hpp"

using namespace kdalab;
using namespace kda_gpu;

namespace {

constexpr std::size_t DC = 512;
const double kScale = 1.0 / std::sqrt(192.0);  // 1/sqrt(d_nope + d_rope) of Kimi Linear / K3 (128 + 64)
const double kSigma = 1.2;                     // q~ ~ 1.2 N(0, 1): logits with std ~2

std::uint64_t fresh_seed() {
  static std::uint64_t s = 20261129 + 7400;
  return ++s;
}

DevBuf upload_bits(const std::vector<bf16_t>& v) {
  DevBuf d(v.size() * 2);
  cuda_check(cudaMemcpy(d.p, v.data(), d.bytes, cudaMemcpyHostToDevice), "upload bf16 bits");
  return d;
}

void copy_bits(DevBuf& d, const std::vector<bf16_t>& v) {
  cuda_check(cudaMemcpy(d.p, v.data(), v.size() * 2, cudaMemcpyHostToDevice), "upload bf16 bits");
}

std::vector<bf16_t> download_bits(const DevBuf& d) {
  std::vector<bf16_t> h(d.bytes / 2);
  cuda_check(cudaMemcpy(h.data(), d.p, d.bytes, cudaMemcpyDeviceToHost), "download bf16 bits");
  return h;
}

/// One prefill problem: B sequences, a cache of `cap` rows of `row` elements whose first N0 rows hold a
/// random prefix (rows >= N0 poisoned), T new latents c_new [B, T, 512], exact q~ [B, T, H, 512].
struct Problem {
  std::size_t B, T, H, N0, cap, row;
  std::vector<double> lat;      // [B, N0 + T, 512]: prefix then new latents (bf16 values)
  std::vector<bf16_t> cache_h;  // initial cache bits [B, cap, row]
  std::vector<double> q;        // exact q~ [B, T, H, 512]
  DevBuf cache, c_new, q_hi, q_lo;

  Problem(std::size_t B_, std::size_t T_, std::size_t H_, std::size_t N0_, std::size_t extra = 0, std::size_t row_ = DC,
          double sigma = kSigma)
      : B(B_), T(T_), H(H_), N0(N0_), cap(N0_ + T_ + extra), row(row_), lat(B_ * (N0_ + T_) * DC),
        cache_h(B_ * (N0_ + T_ + extra) * row_, 0xFFFF), q(B_ * T_ * H_ * DC), cache(cache_h.size() * 2),
        c_new(B_ * T_ * DC * 2), q_hi(q.size() * 2), q_lo(q.size() * 2) {
    Rng rng(fresh_seed());
    for (auto& x : lat) x = round_bf16(rng.normal());
    for (auto& x : q) x = sigma * rng.normal();
    upload();
  }
  std::size_t N() const { return N0 + T; }
  double& L(std::size_t b, std::size_t tau, std::size_t k) { return lat[(b * N() + tau) * DC + k]; }
  double L(std::size_t b, std::size_t tau, std::size_t k) const { return lat[(b * N() + tau) * DC + k]; }
  /// Every latent of every sequence = one random row (a cache of identical keys).
  void make_identical() {
    Rng rng(fresh_seed());
    std::vector<double> r(DC);
    for (auto& x : r) x = round_bf16(rng.normal());
    for (std::size_t i = 0; i < lat.size(); ++i) lat[i] = r[i % DC];
    upload();
  }
  void upload() {
    std::fill(cache_h.begin(), cache_h.end(), bf16_t(0xFFFF));  // rows >= N0 and the row padding: NaN
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t tau = 0; tau < N0; ++tau)
        for (std::size_t k = 0; k < DC; ++k) cache_h[(b * cap + tau) * row + k] = bf16_bits(L(b, tau, k));
    copy_bits(cache, cache_h);
    std::vector<bf16_t> cn(B * T * DC), hi(q.size()), lo(q.size());
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t k = 0; k < DC; ++k) cn[(b * T + t) * DC + k] = bf16_bits(L(b, N0 + t, k));
    for (std::size_t i = 0; i < q.size(); ++i) {
      const double h = round_bf16(q[i]);
      hi[i] = bf16_bits(h);
      lo[i] = bf16_bits(round_bf16(q[i] - h));
    }
    copy_bits(c_new, cn);
    copy_bits(q_hi, hi);
    copy_bits(q_lo, lo);
  }
  kernels::MlaPrefillArgs args() const {
    kernels::MlaPrefillArgs a;
    a.B = static_cast<int>(B);
    a.T = static_cast<int>(T);
    a.H = static_cast<int>(H);
    a.capacity = static_cast<int>(cap);
    a.prefix = static_cast<int>(N0);
    a.c = cache.as<bf16_t>();
    a.sc_t = static_cast<std::int64_t>(row);
    a.c_new = c_new.as<bf16_t>();
    a.q_hi = q_hi.as<bf16_t>();
    a.q_lo = q_lo.as<bf16_t>();
    a.scale = static_cast<float>(kScale);
    return a;
  }
  /// float64 truth of (b, t, h): softmax over tau <= N0 + t of scale q~ . c_tau, then sum p c_tau.
  std::vector<double> truth(std::size_t b, std::size_t t, std::size_t h) const {
    const double* qv = q.data() + ((b * T + t) * H + h) * DC;
    const std::size_t n = N0 + t + 1;
    std::vector<double> s(n), a(DC, 0.0);
    double m = -INFINITY;
    for (std::size_t tau = 0; tau < n; ++tau) {
      double acc = 0;
      for (std::size_t k = 0; k < DC; ++k) acc += qv[k] * L(b, tau, k);
      s[tau] = kScale * acc;
      m = std::max(m, s[tau]);
    }
    double l = 0;
    for (std::size_t tau = 0; tau < n; ++tau) {
      const double p = std::exp(s[tau] - m);
      l += p;
      for (std::size_t k = 0; k < DC; ++k) a[k] += p * L(b, tau, k);
    }
    for (auto& x : a) x /= l;
    return a;
  }
};

/// Runs the prefill (out allocated here and poisoned) and downloads a [B, T, H, 512].
std::vector<double> run(const kernels::MlaPrefillArgs& a) {
  DevBuf out(static_cast<std::size_t>(a.B) * a.T * a.H * DC * 4);
  out.poison();
  auto x = a;
  x.out = out.as<float>();
  kernels::mla_prefill(x, nullptr);
  cuda_check(cudaDeviceSynchronize(), "mla_prefill");
  return download_f32(out);
}

/// (t, h) rows to check: all when T H <= 1024, else the tokens at and around the 16/32-boundaries and the
/// ends, with every head.
std::vector<std::pair<std::size_t, std::size_t>> rows_to_check(std::size_t T, std::size_t H) {
  std::vector<std::size_t> ts;
  if (T * H <= 1024) {
    for (std::size_t t = 0; t < T; ++t) ts.push_back(t);
  } else {
    for (std::size_t t : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
                          std::size_t{31}, std::size_t{32}, std::size_t{33}, T / 2, T - 17, T - 2, T - 1})
      if (t < T && (ts.empty() || t > ts.back())) ts.push_back(t);
  }
  std::vector<std::pair<std::size_t, std::size_t>> r;
  for (std::size_t t : ts)
    for (std::size_t h = 0; h < H; ++h) r.push_back({t, h});
  return r;
}

/// Kernel rows vs their float64 truths over the sampled rows of sequence b.
ErrorMetrics check(const Problem& P, const std::vector<double>& out, std::size_t b) {
  std::vector<double> o, r;
  for (auto [t, h] : rows_to_check(P.T, P.H)) {
    const auto tr = P.truth(b, t, h);
    r.insert(r.end(), tr.begin(), tr.end());
    const std::size_t off = ((b * P.T + t) * P.H + h) * DC;
    o.insert(o.end(), out.begin() + off, out.begin() + off + DC);
  }
  return compare(o, r);
}

/// The cache after the prefill: prefix rows unchanged, rows N0 .. N0+T-1 = c_new exactly, the rest and the
/// row padding still poisoned. Returns the number of wrong elements.
std::size_t cache_errors(const Problem& P) {
  const auto h = download_bits(P.cache);
  std::size_t bad = 0;
  for (std::size_t b = 0; b < P.B; ++b)
    for (std::size_t tau = 0; tau < P.cap; ++tau)
      for (std::size_t k = 0; k < P.row; ++k) {
        const bf16_t got = h[(b * P.cap + tau) * P.row + k];
        const bf16_t want = (tau < P.N() && k < DC) ? bf16_bits(P.L(b, tau, k)) : bf16_t(0xFFFF);
        bad += got != want ? 1 : 0;
      }
  return bad;
}

/// One absorbed prefill problem against float64: the parameters that name it (Problem's).
struct PrefillCase {
  std::size_t B, T, H, N0;
  std::size_t extra = 0;   // cache rows past N0 + T (poisoned; must stay so)
  std::size_t row = DC;    // cache row stride sc_t (576: [c ; k_R] rows)
};

/// Runs the case: per sequence the sampled rows vs float64 (no NaN / Inf, rel_rms <= tol::mla_prefill_goal), every
/// output element finite, the cache written exactly (cache_errors == 0).
void check_prefill_case(const PrefillCase& k) {
  Problem P(k.B, k.T, k.H, k.N0, k.extra, k.row);
  const auto out = run(P.args());
  for (std::size_t b = 0; b < k.B; ++b) {
    const auto m = check(P, out, b);
    std::printf("mla prefill B=%zu b=%zu T=%zu N0=%zu H=%zu sc_t=%zu: rel_rms %.3e max_abs %.3e (%zu rows checked)\n",
                k.B, b, k.T, k.N0, k.H, k.row, m.rel_rms, m.max_abs, m.n / DC);
    CAPTURE(k.B, b, k.T, k.N0, k.H, k.row, m.rel_rms, m.nan_count);
    REQUIRE(m.nan_count + m.inf_count == 0);
    CHECK(m.rel_rms <= tol::mla_prefill_goal.value);
  }
  std::size_t nan = 0;
  for (double x : out) nan += std::isfinite(x) ? 0 : 1;
  const std::size_t cerr = cache_errors(P);
  std::printf("mla prefill B=%zu T=%zu N0=%zu H=%zu: non-finite outputs %zu, cache errors %zu\n", k.B, k.T, k.N0, k.H,
              nan, cerr);
  CAPTURE(k.B, k.T, k.N0, k.H, k.row);
  CHECK(nan == 0);
  CHECK(cerr == 0);
}

}  // namespace

TEST_CASE("mla prefill vs float64 on the exact q~ (T around the 16/32-row tiles x prefix, H, B = 2, sc_t = 576)",
          "[gpu][mla]") {
  std::vector<PrefillCase> cases;
  // T in {1, 15, 16, 17, 300, 1000} x prefix {0, 777}, H = 32, one sequence
  for (std::size_t N0 : {0, 777})
    for (std::size_t T : {1, 15, 16, 17, 300, 1000}) cases.push_back({1, T, 32, N0, 5});
  // B = 2, H in {16, 48, 1}, combined [c ; k_R] rows (sc_t = 576), per-sequence truths
  for (std::size_t H : {16, 48, 1}) cases.push_back({2, 45, H, 33, 3, 576});
  for (const PrefillCase& k : cases) check_prefill_case(k);
}

TEST_CASE("mla prefill: hi + lo query vs hi only (the lo part is what keeps the goal)", "[gpu][mla]") {
  Problem P(1, 64, 32, 2000);
  const auto m_hilo = check(P, run(P.args()), 0);
  Problem P2(1, 64, 32, 2000);
  P2.q = P.q;
  P2.lat = P.lat;
  P2.upload();
  DevBuf zero(P2.q_lo.bytes);
  cuda_check(cudaMemset(zero.p, 0, zero.bytes), "memset");  // ablation: q_lo = 0 (bf16-rounded q~)
  auto a = P2.args();
  a.q_lo = zero.as<bf16_t>();
  const auto m_hi = check(P2, run(a), 0);
  std::printf("mla prefill T=64 N0=2000: hi+lo rel_rms %.3e, hi only %.3e\n", m_hilo.rel_rms, m_hi.rel_rms);
  REQUIRE(m_hilo.nan_count + m_hi.nan_count == 0);
  CHECK(m_hilo.rel_rms <= tol::mla_prefill_goal.value);
  CHECK(m_hilo.rel_rms < m_hi.rel_rms);
}

TEST_CASE("mla prefill then decode == prefill of the longer sequence", "[gpu][mla]") {
  for (std::size_t H : {32, 16}) {
    const std::size_t N0 = 300, T = 77;
    // the longer sequence: T + 1 new tokens after the prefix, prefilled at once
    Problem L(1, T + 1, H, N0, 2);
    const auto out_long = run(L.args());
    // the same tokens: prefill of the first T, then one decode step for token T (the caller appends c_T)
    Problem S(1, T, H, N0, 3);
    S.lat.assign(L.lat.begin(), L.lat.begin() + (N0 + T) * DC);
    S.q.assign(L.q.begin(), L.q.begin() + T * H * DC);
    S.upload();
    const auto out_short = run(S.args());
    std::vector<bf16_t> cT(DC);
    for (std::size_t k = 0; k < DC; ++k) cT[k] = bf16_bits(L.L(0, N0 + T, k));
    cuda_check(cudaMemcpy(S.cache.as<bf16_t>() + (N0 + T) * S.row, cT.data(), DC * 2, cudaMemcpyHostToDevice), "append c_T");
    std::vector<bf16_t> hi(H * DC), lo(H * DC);
    for (std::size_t i = 0; i < H * DC; ++i) {
      const double x = L.q[T * H * DC + i], h = round_bf16(x);
      hi[i] = bf16_bits(h);
      lo[i] = bf16_bits(round_bf16(x - h));
    }
    const DevBuf dhi = upload_bits(hi), dlo = upload_bits(lo);
    kernels::MlaDecodeArgs d;
    d.B = 1;
    d.H = static_cast<int>(H);
    d.capacity = static_cast<int>(S.cap);
    d.max_len = static_cast<int>(N0 + T + 1);
    d.c = S.cache.as<bf16_t>();
    d.sc_t = static_cast<std::int64_t>(S.row);
    d.q_hi = dhi.as<bf16_t>();
    d.q_lo = dlo.as<bf16_t>();
    d.scale = static_cast<float>(kScale);
    DevBuf dout(H * DC * 4), ws(kernels::mla_decode_workspace_bytes(d));
    dout.poison();
    ws.poison();
    d.out = dout.as<float>();
    d.workspace = ws.p;
    d.workspace_bytes = ws.bytes;
    kernels::mla_decode(d, nullptr);
    cuda_check(cudaDeviceSynchronize(), "mla_decode");
    const auto dec = download_f32(dout);
    // token T: decode vs the long prefill's last rows, and both vs the float64 truth
    const std::vector<double> last(out_long.begin() + T * H * DC, out_long.end());
    std::vector<double> tr;
    for (std::size_t h = 0; h < H; ++h) {
      const auto x = L.truth(0, T, h);
      tr.insert(tr.end(), x.begin(), x.end());
    }
    const auto m_dp = compare(dec, last), m_d = compare(dec, tr), m_p = compare(last, tr);
    // tokens 0 .. T-1: the short prefill vs the long one (same CTAs at H = 32: bitwise)
    const std::vector<double> first(out_long.begin(), out_long.begin() + T * H * DC);
    const auto m_ss = compare(out_short, first);
    std::printf("mla prefill+decode H=%zu N0=%zu T=%zu: decode vs prefill(T+1) last token %.3e (decode vs truth %.3e, "
                "prefill vs truth %.3e); prefill(T) vs prefill(T+1) first T tokens %.3e\n",
                H, N0, T, m_dp.rel_rms, m_d.rel_rms, m_p.rel_rms, m_ss.rel_rms);
    REQUIRE(m_dp.nan_count + m_ss.nan_count == 0);
    CHECK(m_dp.rel_rms <= tol::mla_prefill_goal.value);
    CHECK(m_d.rel_rms <= tol::mla_prefill_goal.value);
    CHECK(m_p.rel_rms <= tol::mla_prefill_goal.value);
    if (H == 32) CHECK(m_ss.rel_rms == 0.0);
    else CHECK(m_ss.rel_rms <= tol::mla_prefill_goal.value);
  }
}

TEST_CASE("mla prefill: identical keys and very large logits give no NaN", "[gpu][mla]") {
  for (double sigma : {kSigma, 1000.0}) {
    Problem P(1, 100, 32, 500, 0, DC, sigma);
    P.make_identical();
    const auto m = check(P, run(P.args()), 0);
    std::printf("mla prefill identical keys, sigma=%g: rel_rms %.3e\n", sigma, m.rel_rms);
    REQUIRE(m.nan_count + m.inf_count == 0);
    CHECK(m.rel_rms <= tol::mla_prefill_goal.value);
  }
  Problem P(1, 100, 32, 500, 0, DC, 1000.0);  // logits with std ~2000: near one-hot rows
  const auto m = check(P, run(P.args()), 0);
  std::printf("mla prefill large logits: rel_rms %.3e\n", m.rel_rms);
  REQUIRE(m.nan_count + m.inf_count == 0);
  CHECK(m.rel_rms <= tol::mla_prefill_goal.value);
}

TEST_CASE("mla prefill end to end vs reference/mla.hpp (bf16 q^C, W_UK, W_UV, latents; absorb kernel)", "[gpu][mla]") {
  MlaConfig cfg;
  cfg.hidden = 64;
  cfg.n_h = 8;
  cfg.d_c = 512;
  cfg.d_nope = 128;
  cfg.d_v = 128;
  cfg.d_rope = 0;
  cfg.output_gate = false;
  Rng rng(fresh_seed());
  auto w = mla_random_weights<double>(cfg, [&] { return rng.normal(); });
  for (Mat<double>* m : {&w.W_UK, &w.W_UV}) *m = m->unaryExpr([](double x) { return round_bf16(x); });
  for (std::size_t N0 : {0, 45}) {
    const std::size_t T = 70, N = N0 + T, H = cfg.n_h;
    MlaProjected<double> p;
    p.q_C.resize(T, H * 128);
    p.c.resize(T, DC);
    p.q_R.resize(T, 0);
    Mat<double> C(N, DC), K_R(N, 0);
    for (Eigen::Index t = 0; t < static_cast<Eigen::Index>(T); ++t)
      for (Eigen::Index j = 0; j < static_cast<Eigen::Index>(H * 128); ++j) p.q_C(t, j) = round_bf16(2.0 * rng.normal());
    for (Eigen::Index i = 0; i < static_cast<Eigen::Index>(N); ++i)
      for (Eigen::Index k = 0; k < static_cast<Eigen::Index>(DC); ++k) C(i, k) = round_bf16(rng.normal());
    p.c = C.bottomRows(T);
    const Mat<double> O = mla_attend_naive<double>(cfg, w, p, C, K_R, N0);  // [T, H d_v]
    // device: q^C and W_UK -> q~ hi/lo; cache prefix + c_new; prefill; host applies W_UV per head
    std::vector<bf16_t> qc(T * H * 128), wuk(H * 128 * DC), cache(N * DC, 0xFFFF), cn(T * DC);
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t j = 0; j < H * 128; ++j) qc[t * H * 128 + j] = bf16_bits(p.q_C(t, j));
    for (std::size_t r = 0; r < H * 128; ++r)
      for (std::size_t k = 0; k < DC; ++k) wuk[r * DC + k] = bf16_bits(w.W_UK(r, k));
    for (std::size_t i = 0; i < N; ++i)
      for (std::size_t k = 0; k < DC; ++k) (i < N0 ? cache[i * DC + k] : cn[(i - N0) * DC + k]) = bf16_bits(C(i, k));
    const DevBuf dqc = upload_bits(qc), dw = upload_bits(wuk), dcache = upload_bits(cache), dcn = upload_bits(cn);
    DevBuf qh(T * H * DC * 2), ql(T * H * DC * 2);
    qh.poison();
    ql.poison();
    kernels::MlaAbsorbArgs ab;
    ab.n = static_cast<int>(T);
    ab.H = static_cast<int>(H);
    ab.d_nope = 128;
    ab.q_C = dqc.as<bf16_t>();
    ab.W_UK = dw.as<bf16_t>();
    ab.q_hi = qh.as<bf16_t>();
    ab.q_lo = ql.as<bf16_t>();
    kernels::mla_absorb_query(ab, nullptr);
    kernels::MlaPrefillArgs a;
    a.B = 1;
    a.T = static_cast<int>(T);
    a.H = static_cast<int>(H);
    a.capacity = static_cast<int>(N);
    a.prefix = static_cast<int>(N0);
    a.c = dcache.as<bf16_t>();
    a.c_new = dcn.as<bf16_t>();
    a.q_hi = qh.as<bf16_t>();
    a.q_lo = ql.as<bf16_t>();
    a.scale = static_cast<float>(1.0 / std::sqrt(128.0));  // mla_scale: 1/sqrt(d_nope + d_rope), d_rope = 0
    const auto lat = run(a);
    std::vector<double> o(T * H * 128), r(T * H * 128);
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t h = 0; h < H; ++h) {
        Vec<double> av(DC);
        for (std::size_t k = 0; k < DC; ++k) av(k) = lat[(t * H + h) * DC + k];
        const Vec<double> oh = w.W_UV.middleRows(h * 128, 128) * av;
        for (std::size_t j = 0; j < 128; ++j) {
          o[(t * H + h) * 128 + j] = oh(j);
          r[(t * H + h) * 128 + j] = O(t, h * 128 + j);
        }
      }
    const auto m = compare(o, r);
    std::printf("mla prefill end to end (absorb + prefill + host W_UV) vs reference naive, T=70 N0=%zu H=8: rel_rms %.3e\n",
                N0, m.rel_rms);
    REQUIRE(m.nan_count + m.inf_count == 0);
    CHECK(m.rel_rms <= tol::mla_prefill_goal.value);
  }
}

TEST_CASE("mla prefill (append + attention) in a CUDA graph equals direct launches", "[gpu][mla]") {
  Problem P(2, 50, 32, 70, 1);
  const auto direct = run(P.args());
  P.upload();  // fresh cache: rows >= N0 poisoned again
  DevBuf out(2 * 50 * 32 * DC * 4);
  out.poison();
  auto a = P.args();
  a.out = out.as<float>();
  run_in_graph([&](cudaStream_t st) { kernels::mla_prefill(a, st); });
  const auto graphed = download_f32(out);
  const std::size_t cerr = cache_errors(P);
  std::printf("mla prefill in a CUDA graph: identical to direct launches: %s, cache errors %zu\n",
              graphed == direct ? "yes" : "no", cerr);
  CHECK(graphed == direct);
  CHECK(cerr == 0);
}

namespace {

/// One bad-input case of a kernel's argument check: `change` turns a copy of the good arguments into bad ones;
/// the call must then throw kdalab::Error whose message contains `says` (the option named, its value).
template <class Args>
struct BadCase {
  const char* what;        // printed label
  void (*change)(Args&);   // what is made wrong
  const char* says;        // expected fragment of the message
};

/// Runs `call` on `good` changed by each case: each must throw kdalab::Error (one CHECK) with the case's fragment in
/// its message (one CHECK); every message is printed as "<label> bad input (<what>): <message>".
template <class Args, class Call>
void expect_errors(const char* label, const Args& good, const std::vector<BadCase<Args>>& cases, Call&& call) {
  for (const BadCase<Args>& c : cases) {
    Args bad = good;
    c.change(bad);
    bool threw = false;
    std::string message;
    try {
      call(bad);
    } catch (const Error& e) {
      threw = true;
      message = e.what();
      std::printf("%s bad input (%s): %s\n", label, c.what, e.what());
    }
    INFO(label << " bad input (" << c.what << "): " << message);
    CHECK(threw);
    CHECK(message.find(c.says) != std::string::npos);
  }
}

// Problem(1, 20, 32, 10, 2): B = 1, T = 20, H = 32, N0 = 10, capacity 32, sc_t = 512; device pointers 256-byte aligned
const std::vector<BadCase<kernels::MlaPrefillArgs>> kPrefillBad = {
    {"d_c = 256", [](auto& a) { a.d_c = 256; }, "mla_prefill: d_c = 256 is not supported"},
    {"d_rope = 64", [](auto& a) { a.d_rope = 64; }, "mla_prefill: d_rope = 64: "},
    {"H = 0", [](auto& a) { a.H = 0; }, "mla_prefill: H = 0; accepted: 1 <= H <= 256"},
    {"T = 0", [](auto& a) { a.T = 0; }, "mla_prefill: T = 0; accepted: T >= 1"},
    {"B = 0", [](auto& a) { a.B = 0; }, "mla_prefill: B = 0; accepted: 1 <= B <= 65535"},
    {"prefix < 0", [](auto& a) { a.prefix = -1; }, "mla_prefill: prefix (N0) = -1; accepted: N0 >= 0"},
    {"N0 + T > capacity", [](auto& a) { a.T = 23; }, "mla_prefill: prefix N0 = 10 plus T = 23 passes the cache capacity 32"},
    {"c null", [](auto& a) { a.c = nullptr; }, "mla_prefill: pointer 'c' is null"},
    {"c misaligned", [](auto& a) { a.c = a.c + 1; }, "mla_prefill: pointer 'c' is not 16-byte aligned"},
    {"c_new misaligned", [](auto& a) { a.c_new = a.c_new + 4; }, "mla_prefill: pointer 'c_new' is not 16-byte aligned"},
    {"q_lo null", [](auto& a) { a.q_lo = nullptr; }, "mla_prefill: pointer 'q_lo' is null"},
    {"out null", [](auto& a) { a.out = nullptr; }, "mla_prefill: pointer 'out' is null"},
    {"scale = 0", [](auto& a) { a.scale = 0.0f; }, "mla_prefill: scale = 0.000000; accepted: a finite scale > 0"},
    {"scale NaN", [](auto& a) { a.scale = NAN; }, "mla_prefill: scale = nan; accepted: a finite scale > 0"},
    {"sc_t < 512", [](auto& a) { a.sc_t = 500; }, "mla_prefill: sc_t = 500; accepted"},
    {"sq_t odd", [](auto& a) { a.sq_t = 32 * 512 + 1; }, "mla_prefill: query strides sq_t = 16385"},
    {"sn_t < 512", [](auto& a) { a.sn_t = 100; }, "mla_prefill: c_new strides sn_t = 100"},
};

// n = 20, H = 32, d_nope = 128 (d_c = 512), device pointers
const std::vector<BadCase<kernels::MlaAbsorbArgs>> kAbsorbBad = {
    {"absorb d_nope = 0", [](auto& a) { a.d_nope = 0; }, "mla_absorb_query: d_nope = 0; accepted"},
    {"absorb n = 0", [](auto& a) { a.n = 0; }, "mla_absorb_query: n = 0; accepted"},
    {"absorb d_c = 576", [](auto& a) { a.d_c = 576; }, "mla_absorb_query: d_c = 576 is not supported"},
    {"absorb W_UK null", [](auto& a) { a.W_UK = nullptr; }, "mla_absorb_query: pointer 'W_UK' is null"},
};

}  // namespace

TEST_CASE("mla prefill: bad inputs give clear errors before any launch", "[gpu][mla]") {
  Problem P(1, 20, 32, 10, 2);
  DevBuf out(20 * 32 * DC * 4);
  auto good = P.args();
  good.out = out.as<float>();
  REQUIRE_NOTHROW(kernels::mla_prefill(good, nullptr));
  cuda_check(cudaDeviceSynchronize(), "good");
  expect_errors("mla prefill", good, kPrefillBad, [](const auto& a) { kernels::mla_prefill(a, nullptr); });
  kernels::MlaAbsorbArgs ab;
  ab.n = 20; ab.H = 32; ab.d_nope = 128;
  ab.q_C = P.q_hi.as<bf16_t>(); ab.W_UK = P.q_hi.as<bf16_t>(); ab.q_hi = P.q_hi.as<bf16_t>(); ab.q_lo = P.q_lo.as<bf16_t>();
  expect_errors("mla prefill", ab, kAbsorbBad, [](const auto& a) { kernels::mla_absorb_query(a, nullptr); });
  cuda_check(cudaDeviceSynchronize(), "after bad inputs");
}

// ---- mla_prefill_heads: o = W_UV,i a_i [B, T, H, 128], naive or absorbed (kernels/mla_prefill/naive.cu) -------

namespace {

const char* path_name(kernels::MlaPrefillPath p) { return kernels::mla_prefill_path_name(p); }

/// One mla_prefill_heads problem: B sequences, cache of `cap` = N0 + T + spare rows (prefix rows random, the rest
/// poisoned; spare = 0: the sequences' rows end to end),
/// T new latents c_new, q^C [B, T, H, 128] ~ sigma N(0, 1) in bf16, W_UK, W_UV [H 128, 512] ~ N(0, 1/512) in bf16
/// (reference/mla.hpp mla_random_weights' 1/sqrt(fan_in)), latents ~ N(0, 1) in bf16: logits with std ~ sigma.
struct HeadsProblem {
  std::size_t B, T, H, N0, cap;
  std::vector<double> lat, qc, wuk, wuv;  // [B, N, 512], [B, T, H, 128], [H 128, 512] x 2 (bf16 values)
  DevBuf cache, c_new, q, W_UK, W_UV;

  HeadsProblem(std::size_t B_, std::size_t T_, std::size_t H_, std::size_t N0_, double sigma = 1.0, std::size_t spare = 3)
      : B(B_), T(T_), H(H_), N0(N0_), cap(N0_ + T_ + spare), lat(B_ * (N0_ + T_) * DC), qc(B_ * T_ * H_ * 128),
        wuk(H_ * 128 * DC), wuv(H_ * 128 * DC), cache(B_ * (N0_ + T_ + spare) * DC * 2), c_new(B_ * T_ * DC * 2),
        q(qc.size() * 2), W_UK(wuk.size() * 2), W_UV(wuv.size() * 2) {
    Rng rng(fresh_seed());
    for (auto& x : lat) x = round_bf16(rng.normal());
    for (auto& x : qc) x = round_bf16(sigma * rng.normal());
    for (auto& x : wuk) x = round_bf16(rng.normal() / std::sqrt(512.0));
    for (auto& x : wuv) x = round_bf16(rng.normal() / std::sqrt(512.0));
    upload();
  }
  std::size_t N() const { return N0 + T; }
  double L(std::size_t b, std::size_t tau, std::size_t k) const { return lat[(b * N() + tau) * DC + k]; }
  void make_identical() {  // every latent of every sequence = one random row: all keys (and values) equal per head
    for (std::size_t i = 0; i < lat.size(); ++i) lat[i] = lat[i % DC];
    upload();
  }
  static std::vector<bf16_t> bits(const std::vector<double>& v) {
    std::vector<bf16_t> r(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) r[i] = bf16_bits(v[i]);
    return r;
  }
  /// Fresh cache (prefix rows, the rest NaN) and all inputs on the device.
  void upload() {
    std::vector<bf16_t> ch(B * cap * DC, 0xFFFF), cn(B * T * DC);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t tau = 0; tau < N(); ++tau)
        for (std::size_t k = 0; k < DC; ++k)
          (tau < N0 ? ch[(b * cap + tau) * DC + k] : cn[(b * T + tau - N0) * DC + k]) = bf16_bits(L(b, tau, k));
    copy_bits(cache, ch);
    copy_bits(c_new, cn);
    copy_bits(q, bits(qc));
    copy_bits(W_UK, bits(wuk));
    copy_bits(W_UV, bits(wuv));
  }
  kernels::MlaPrefillHeadsArgs args() const {
    kernels::MlaPrefillHeadsArgs a;
    a.B = static_cast<int>(B);
    a.T = static_cast<int>(T);
    a.H = static_cast<int>(H);
    a.capacity = static_cast<int>(cap);
    a.prefix = static_cast<int>(N0);
    a.c = cache.as<bf16_t>();
    a.c_new = c_new.as<bf16_t>();
    a.q_C = q.as<bf16_t>();
    a.W_UK = W_UK.as<bf16_t>();
    a.W_UV = W_UV.as<bf16_t>();
    a.scale = static_cast<float>(1.0 / std::sqrt(128.0));  // mla_scale: 1/sqrt(d_nope + d_rope), d_rope = 0
    return a;
  }
  /// float64 truth o [B, T, H, 128]: reference/mla.hpp mla_attend_naive per sequence.
  std::vector<double> truth() const {
    MlaConfig cfg;
    cfg.hidden = 64;
    cfg.n_h = H;
    cfg.d_c = DC;
    cfg.d_nope = 128;
    cfg.d_v = 128;
    cfg.d_rope = 0;
    cfg.output_gate = false;
    MlaWeights<double> w;
    w.W_UK.resize(H * 128, DC);
    w.W_UV.resize(H * 128, DC);
    for (std::size_t r = 0; r < H * 128; ++r)
      for (std::size_t k = 0; k < DC; ++k) {
        w.W_UK(r, k) = wuk[r * DC + k];
        w.W_UV(r, k) = wuv[r * DC + k];
      }
    std::vector<double> o(B * T * H * 128);
    for (std::size_t b = 0; b < B; ++b) {
      MlaProjected<double> p;
      p.q_C.resize(T, H * 128);
      p.q_R.resize(T, 0);
      Mat<double> C(N(), DC), K_R(N(), 0);
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t j = 0; j < H * 128; ++j) p.q_C(t, j) = qc[(b * T + t) * H * 128 + j];
      for (std::size_t i = 0; i < N(); ++i)
        for (std::size_t k = 0; k < DC; ++k) C(i, k) = L(b, i, k);
      p.c = C.bottomRows(T);
      const Mat<double> O = mla_attend_naive<double>(cfg, w, p, C, K_R, N0);  // [T, H 128]
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t j = 0; j < H * 128; ++j) o[(b * T + t) * H * 128 + j] = O(t, j);
    }
    return o;
  }
  /// float64 o [B, T, H, 128] with K = bf16(C W_UK^T) and V = bf16(C W_UV^T): the truth of precision fast's
  /// own inputs (its K and V are rounded once to bf16), so that what is left is the kernel's P and accumulation.
  std::vector<double> truth_bf16_kv(double scale = 1.0 / std::sqrt(128.0)) const {
    std::vector<double> o(B * T * H * 128, 0.0), K(N() * 128), V(N() * 128), s(N());
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t tau = 0; tau < N(); ++tau)
          for (std::size_t j = 0; j < 128; ++j) {
            double kk = 0.0, vv = 0.0;
            for (std::size_t c = 0; c < DC; ++c) {
              kk += wuk[(h * 128 + j) * DC + c] * L(b, tau, c);
              vv += wuv[(h * 128 + j) * DC + c] * L(b, tau, c);
            }
            K[tau * 128 + j] = round_bf16(kk);
            V[tau * 128 + j] = round_bf16(vv);
          }
        for (std::size_t t = 0; t < T; ++t) {
          const std::size_t n = N0 + t + 1;
          const double* q = &qc[((b * T + t) * H + h) * 128];
          double mx = -INFINITY, sum = 0.0;
          for (std::size_t tau = 0; tau < n; ++tau) {
            double d = 0.0;
            for (std::size_t j = 0; j < 128; ++j) d += q[j] * K[tau * 128 + j];
            s[tau] = scale * d;
            mx = std::max(mx, s[tau]);
          }
          for (std::size_t tau = 0; tau < n; ++tau) sum += (s[tau] = std::exp(s[tau] - mx));
          double* out = &o[((b * T + t) * H + h) * 128];
          for (std::size_t tau = 0; tau < n; ++tau)
            for (std::size_t j = 0; j < 128; ++j) out[j] += s[tau] / sum * V[tau * 128 + j];
        }
      }
    return o;
  }
  /// Cache after the prefill: rows < N0 + T = the latents exactly, the rest still NaN. Wrong elements.
  std::size_t cache_errors() const {
    const auto h = download_bits(cache);
    std::size_t bad = 0;
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t tau = 0; tau < cap; ++tau)
        for (std::size_t k = 0; k < DC; ++k)
          bad += h[(b * cap + tau) * DC + k] != (tau < N() ? bf16_bits(L(b, tau, k)) : bf16_t(0xFFFF)) ? 1 : 0;
    return bad;
  }
};

kernels::MlaPrefillOverrides forced(kernels::MlaPrefillPath path, bool p_hi_only = false) {
  kernels::MlaPrefillOverrides ov;
  ov.path = path;
  ov.p_hi_only = p_hi_only;
  return ov;
}

/// Calls mla_prefill_heads(a, ov) with a poisoned o of `rows` x H x 128 fp32 and a poisoned workspace of the size it
/// asks for, waits, and downloads o.
std::vector<double> call_heads(kernels::MlaPrefillHeadsArgs a, const kernels::MlaPrefillOverrides* ov, std::size_t rows) {
  DevBuf out(rows * a.H * 128 * 4), ws(kernels::mla_prefill_heads_workspace_bytes(a, ov));
  out.poison();
  ws.poison();
  a.out = out.as<float>();
  a.workspace = ws.p;
  a.workspace_bytes = ws.bytes;
  kernels::mla_prefill_heads(a, nullptr, ov);
  cuda_check(cudaDeviceSynchronize(), "mla_prefill_heads");
  return download_f32(out);
}

/// Runs mla_prefill_heads in `precision` on the path `ov` forces (fresh cache, poisoned out and workspace) and
/// downloads o [B, T, H, 128].
std::vector<double> run_heads(HeadsProblem& P, const kernels::MlaPrefillOverrides& ov,
                              kernels::MlaPrefillPrecision precision = kernels::MlaPrefillPrecision::automatic) {
  P.upload();
  kernels::MlaPrefillHeadsArgs a = P.args();
  a.precision = precision;
  return call_heads(a, &ov, P.B * P.T);
}

std::size_t non_finite(const std::vector<double>& v) {
  std::size_t n = 0;
  for (double x : v) n += std::isfinite(x) ? 0 : 1;
  return n;
}

}  // namespace

TEST_CASE("mla prefill heads, naive: naive and absorbed+W_UV vs float64 reference, T x N0, B = 2, H = 32 (16)",
          "[gpu][mla][naive]") {
  using kernels::MlaPrefillPath;
  struct Case { std::size_t T, N0, H; };
  std::vector<Case> cases;
  for (std::size_t N0 : {0, 37})
    for (std::size_t T : {1, 17, 64, 65, 300, 1000}) cases.push_back({T, N0, 32});
  for (std::size_t T : {65, 300}) cases.push_back({T, 37, 16});
  for (const Case& c : cases) {
    HeadsProblem P(2, c.T, c.H, c.N0);
    const auto truth = P.truth();
    const auto on = run_heads(P, forced(MlaPrefillPath::naive));
    const std::size_t cache_n = P.cache_errors();
    const auto oa = run_heads(P, forced(MlaPrefillPath::absorbed));
    const std::size_t cache_a = P.cache_errors();
    const MlaPrefillPath chosen = kernels::mla_prefill_heads_path(P.args());
    const auto oauto = run_heads(P, forced(MlaPrefillPath::automatic));
    const auto mn = compare(on, truth), ma = compare(oa, truth), mna = compare(on, oa);
    const bool auto_same = oauto == (chosen == MlaPrefillPath::naive ? on : oa);
    std::printf("mla prefill heads B=2 T=%zu N0=%zu H=%zu: naive rel_rms %.3e (max_abs %.2e), absorbed+W_UV %.3e, "
                "naive vs absorbed %.3e; rule picks %s (auto output identical: %s); cache errors naive %zu absorbed %zu\n",
                c.T, c.N0, c.H, mn.rel_rms, mn.max_abs, ma.rel_rms, mna.rel_rms, path_name(chosen),
                auto_same ? "yes" : "no", cache_n, cache_a);
    CAPTURE(c.T, c.N0, c.H, mn.rel_rms, ma.rel_rms, mna.rel_rms);
    REQUIRE(non_finite(on) + non_finite(oa) == 0);
    CHECK(mn.rel_rms <= tol::mla_prefill_heads_goal.value);
    CHECK(ma.rel_rms <= tol::mla_prefill_heads_goal.value);
    CHECK(mna.rel_rms <= tol::mla_prefill_naive_vs_absorbed.value);
    CHECK(auto_same);
    CHECK(cache_n == 0);
    CHECK(cache_a == 0);
  }
}

TEST_CASE("mla prefill heads, naive: P hi + lo vs P hi only (ablation), logit std 1 and 4", "[gpu][mla][naive]") {
  for (double sigma : {1.0, 4.0}) {
    HeadsProblem P(1, 300, 32, 37, sigma);
    const auto truth = P.truth();
    const auto m_hilo = compare(run_heads(P, forced(kernels::MlaPrefillPath::naive)), truth);
    const auto m_hi = compare(run_heads(P, forced(kernels::MlaPrefillPath::naive, true)), truth);
    std::printf("mla prefill heads naive T=300 N0=37 H=32 sigma=%g: P hi+lo %.3e, P hi only %.3e (emulation: ~5e-6 / "
                "0.6e-3 .. 1.1e-3)\n", sigma, m_hilo.rel_rms, m_hi.rel_rms);
    REQUIRE(m_hilo.nan_count + m_hi.nan_count + m_hilo.inf_count + m_hi.inf_count == 0);
    CHECK(m_hilo.rel_rms <= tol::mla_prefill_heads_goal.value);
    CHECK(m_hi.rel_rms <= tol::mla_prefill_naive_p_hi.value);
    CHECK(m_hilo.rel_rms < m_hi.rel_rms);
  }
}

TEST_CASE("mla prefill heads, naive: identical keys and very large logits give no NaN", "[gpu][mla][naive]") {
  using kernels::MlaPrefillPath;
  for (double sigma : {1.0, 1000.0})
    for (bool identical : {true, false}) {
      if (!identical && sigma == 1.0) continue;
      HeadsProblem P(1, 200, 32, 50, sigma);  // sigma 1000: logits with std ~1000, near one-hot rows
      if (identical) P.make_identical();
      const auto truth = P.truth();
      const auto on = run_heads(P, forced(MlaPrefillPath::naive));
      const auto oa = run_heads(P, forced(MlaPrefillPath::absorbed));
      const auto mn = compare(on, truth), ma = compare(oa, truth);
      std::printf("mla prefill heads %s, sigma=%g: naive rel_rms %.3e, absorbed+W_UV %.3e, non-finite %zu / %zu\n",
                  identical ? "identical keys" : "distinct keys", sigma, mn.rel_rms, ma.rel_rms, non_finite(on),
                  non_finite(oa));
      REQUIRE(non_finite(on) + non_finite(oa) == 0);
      CHECK(mn.rel_rms <= tol::mla_prefill_heads_goal.value);
      CHECK(ma.rel_rms <= tol::mla_prefill_heads_goal.value);
    }
}

TEST_CASE("mla prefill heads, naive: the rule's choices (11 pairs > 1024 N)", "[gpu][mla][naive]") {
  using kernels::MlaPrefillPath;
  kernels::MlaPrefillHeadsArgs a;
  kernels::MlaPrefillOverrides ov;
  auto pick = [&](int T, int N0) {
    a.T = T;
    a.prefix = N0;
    return kernels::mla_prefill_heads_path(a, &ov);
  };
  const std::vector<std::pair<int, int>> shapes = {{1, 0},    {64, 0},      {185, 0},     {186, 0}, {2048, 0}, {8192, 0},
                                                   {512, 0},  {93, 100000}, {94, 100000}, {65, 37}, {300, 37}};
  for (auto [T, N0] : shapes)
    std::printf("mla prefill heads rule: T=%d N0=%d -> %s\n", T, N0, path_name(pick(T, N0)));
  CHECK(pick(185, 0) == MlaPrefillPath::absorbed);
  CHECK(pick(186, 0) == MlaPrefillPath::naive);
  CHECK(pick(64, 0) == MlaPrefillPath::absorbed);
  CHECK(pick(93, 100000) == MlaPrefillPath::absorbed);
  CHECK(pick(94, 100000) == MlaPrefillPath::naive);
  for (auto [T, N0] : shapes) {  // no override: the rule
    const MlaPrefillPath picked = pick(T, N0);
    CHECK(picked == kernels::mla_prefill_path_rule(a));
  }
  ov.path = MlaPrefillPath::absorbed;  // an override wins over the rule
  CHECK(pick(8192, 0) == MlaPrefillPath::absorbed);
  ov.path = MlaPrefillPath::naive;
  CHECK(pick(1, 0) == MlaPrefillPath::naive);
}

/// Precision fast's attention in form `f` (MlaPrefillOverrides::fast_form).
kernels::MlaPrefillOverrides fast_form(kernels::MlaFastForm f) {
  kernels::MlaPrefillOverrides ov;
  ov.fast_form = f;
  return ov;
}

TEST_CASE("mla prefill heads, naive: K and V rebuilt in one cuBLAS call or in two give o within the budgets",
          "[gpu][mla][naive]") {
  using kernels::MlaPrefillPath;
  using kernels::MlaPrefillPrecision;
  // the rule: the sequences' key rows end to end and W_UV after W_UK at a multiple of 16 bytes
  CHECK(kernels::mla_kv_products_in_one_call(1, 337, 512, 0, 65536));
  CHECK(kernels::mla_kv_products_in_one_call(8, 512, 512, 512 * 512, 65536));
  CHECK_FALSE(kernels::mla_kv_products_in_one_call(2, 337, 512, 340 * 512, 65536));  // slots of 340 rows for 337 keys
  CHECK_FALSE(kernels::mla_kv_products_in_one_call(1, 337, 512, 0, -65536));          // W_UV before W_UK
  CHECK_FALSE(kernels::mla_kv_products_in_one_call(1, 337, 512, 0, 4));               // 8 bytes apart
  CHECK_FALSE(kernels::mla_kv_products_in_one_call(4, 1LL << 30, 512, 512LL << 30, 65536));  // 2^32 keys in all
  // B = 1, and B = 3 with slots of exactly N rows (end to end) or 3 more (two calls whatever the weights' order);
  // the weights laid [W_UK; W_UV] (one call where the keys allow) and [W_UV; W_UK] (two calls)
  struct Case { std::size_t B, spare; };
  for (const Case c : {Case{1, 3}, Case{3, 0}, Case{3, 3}}) {
    HeadsProblem P(c.B, 300, 32, 37, 1.0, c.spare);
    const auto truth = P.truth();
    const std::size_t nw = P.H * 128 * DC;
    DevBuf w2(2 * nw * 2);
    for (const MlaPrefillPrecision prec : {MlaPrefillPrecision::fast, MlaPrefillPrecision::accurate}) {
      std::vector<double> o[2];
      for (int uv_first = 0; uv_first < 2; ++uv_first) {
        bf16_t* base = w2.as<bf16_t>();
        bf16_t* wuk = base + (uv_first ? nw : 0);
        bf16_t* wuv = base + (uv_first ? 0 : nw);
        cuda_check(cudaMemcpy(wuk, P.W_UK.p, nw * 2, cudaMemcpyDeviceToDevice), "W_UK copy");
        cuda_check(cudaMemcpy(wuv, P.W_UV.p, nw * 2, cudaMemcpyDeviceToDevice), "W_UV copy");
        P.upload();
        kernels::MlaPrefillHeadsArgs a = P.args();
        a.precision = prec;
        a.W_UK = wuk;
        a.W_UV = wuv;
        const bool one = kernels::mla_kv_products_in_one_call(static_cast<long long>(P.B), static_cast<long long>(P.N()), DC,
                                                              static_cast<long long>(P.cap * DC), wuv - wuk);
        CHECK(one == (!uv_first && (P.B == 1 || c.spare == 0)));
        const auto ov = forced(MlaPrefillPath::naive);
        o[uv_first] = call_heads(a, &ov, P.B * P.T);
        const auto m = compare(o[uv_first], truth);
        const double budget = prec == MlaPrefillPrecision::fast ? tol::mla_prefill_fast.value : tol::mla_prefill_heads_goal.value;
        std::printf("mla prefill heads %s B=%zu T=300 N0=37 H=32 (slots of N + %zu rows), K and V in %s: rel_rms %.3e; "
                    "cache errors %zu\n", prec == MlaPrefillPrecision::fast ? "fast" : "accurate", c.B, c.spare,
                    one ? "one call" : "two calls", m.rel_rms, P.cache_errors());
        CAPTURE(c.B, c.spare, uv_first, m.rel_rms, budget);
        REQUIRE(non_finite(o[uv_first]) == 0);
        CHECK(m.rel_rms <= budget);
        CHECK(P.cache_errors() == 0);
      }
      const auto d = compare(o[1], o[0]);
      std::printf("mla prefill heads %s B=%zu (slots of N + %zu rows): [W_UK; W_UV] against [W_UV; W_UK]: identical %s "
                  "(rel_rms %.3e)\n", prec == MlaPrefillPrecision::fast ? "fast" : "accurate", c.B, c.spare,
                  o[0] == o[1] ? "yes" : "no", d.rel_rms);
    }
  }
}

TEST_CASE("mla prefill heads, fast: every attention form vs float64 and beside accurate, T x N0 (tile edges, prefix), "
          "B = 2, H = 32 (16)",
          "[gpu][mla][fast]") {
  using kernels::MlaPrefillPath;
  using kernels::MlaPrefillPrecision;
  struct Case { std::size_t T, N0, H; double sigma; };
  std::vector<Case> cases;
  // T across the 16-, 32-, 64- and 128-row edges of both forms' tiles and warp groups; N0 moves the diagonal across
  // the 32- and 128-key tiles (129: the first query's keys end one past a 128-key tile)
  for (std::size_t N0 : {0, 37, 300})
    for (std::size_t T : {1, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 256, 257, 300, 1000}) cases.push_back({T, N0, 32, 1.0});
  for (std::size_t T : {1, 64, 129, 255}) cases.push_back({T, 129, 32, 1.0});
  for (std::size_t T : {65, 300}) cases.push_back({T, 37, 16, 1.0});
  cases.push_back({257, 1800, 16, 1.0});  // N0 >= 7 T behind a long prefix, 3 query tiles
  for (double sigma : {2.0, 4.0}) cases.push_back({300, 37, 32, sigma});
  double worst = 0.0, worst_v1 = 0.0;
  for (const Case& c : cases) {
    HeadsProblem P(2, c.T, c.H, c.N0, c.sigma);
    const auto truth = P.truth();
    const auto of = run_heads(P, forced(MlaPrefillPath::automatic), MlaPrefillPrecision::fast);
    const std::size_t cache_f = P.cache_errors();
    const auto of1 = run_heads(P, fast_form(kernels::MlaFastForm::mma_sync), MlaPrefillPrecision::fast);
    const auto ofp = run_heads(P, fast_form(kernels::MlaFastForm::wgmma_pingpong), MlaPrefillPrecision::fast);
    const auto ofw = run_heads(P, fast_form(kernels::mla_fast_form_rule()), MlaPrefillPrecision::fast);
    const auto oacc = run_heads(P, forced(MlaPrefillPath::naive), MlaPrefillPrecision::accurate);
    const auto mf = compare(of, truth), mf1 = compare(of1, truth), mfp = compare(ofp, truth), macc = compare(oacc, truth);
    worst = std::max(worst, std::max(mf.rel_rms, mfp.rel_rms));
    worst_v1 = std::max(worst_v1, mf1.rel_rms);
    std::printf("mla prefill heads fast B=2 T=%zu N0=%zu H=%zu sigma=%g: fast rel_rms %.3e (max_abs %.2e), ping-pong form "
                "%.3e, mma.sync form %.3e, accurate %.3e; cache errors %zu\n",
                c.T, c.N0, c.H, c.sigma, mf.rel_rms, mf.max_abs, mfp.rel_rms, mf1.rel_rms, macc.rel_rms, cache_f);
    CAPTURE(c.T, c.N0, c.H, c.sigma, mf.rel_rms, mfp.rel_rms, mf1.rel_rms, macc.rel_rms);
    REQUIRE(non_finite(of) == 0);
    REQUIRE(non_finite(of1) == 0);
    REQUIRE(non_finite(ofp) == 0);
    CHECK(ofw == of);  // the rule's form, named or not
    CHECK(mf.rel_rms <= tol::mla_prefill_fast.value);
    CHECK(mfp.rel_rms <= tol::mla_prefill_fast.value);
    CHECK(mf1.rel_rms <= tol::mla_prefill_fast.value);
    CHECK(macc.rel_rms <= tol::mla_prefill_heads_goal.value);
    CHECK(macc.rel_rms < mf.rel_rms);  // fast really runs the bf16 plan (and accurate the hi + lo one)
    CHECK(cache_f == 0);
  }
  std::printf("mla prefill heads fast: worst rel_rms %.3e (wgmma forms), %.3e (mma.sync form) over %zu cases (budget %.1e)\n", worst,
              worst_v1, cases.size(), tol::mla_prefill_fast.value);
}

TEST_CASE("mla prefill heads, fast: a CUDA graph of the call equals the direct call, bit for bit", "[gpu][mla][fast]") {
  HeadsProblem P(2, 300, 32, 37);
  const auto direct = run_heads(P, forced(kernels::MlaPrefillPath::automatic), kernels::MlaPrefillPrecision::fast);
  const auto again = run_heads(P, forced(kernels::MlaPrefillPath::automatic), kernels::MlaPrefillPrecision::fast);
  P.upload();  // fresh cache: rows >= N0 poisoned again
  kernels::MlaPrefillHeadsArgs a = P.args();
  a.precision = kernels::MlaPrefillPrecision::fast;
  DevBuf out(P.B * P.T * P.H * 128 * 4), ws(kernels::mla_prefill_heads_workspace_bytes(a));
  out.poison();
  ws.poison();
  a.out = out.as<float>();
  a.workspace = ws.p;
  a.workspace_bytes = ws.bytes;
  run_in_graph([&](cudaStream_t st) { kernels::mla_prefill_heads(a, st); });
  const auto graphed = download_f32(out);
  std::printf("mla prefill heads fast: two direct calls identical: %s; a CUDA graph identical to them: %s, cache errors "
              "%zu\n", again == direct ? "yes" : "no", graphed == direct ? "yes" : "no", P.cache_errors());
  CHECK(again == direct);  // no order-dependent accumulation
  CHECK(graphed == direct);
  CHECK(P.cache_errors() == 0);
}

TEST_CASE("mla prefill heads, fast: the persistent grid's size and item order do not change o, bit for bit", "[gpu][mla][fast]") {
  // B = 2, T = 300, H = 32: 3 query tiles x 32 heads x 2 sequences = 192 work items, so one CTA takes all of them in
  // turn (the ring's phases run on across items), 7 CTAs take 27-28 each in the snake order, and the default (one per
  // SM) takes one or two each; N0 = 37 puts each item's diagonal inside a key tile
  // (both item orders: the rule's and the other)
  HeadsProblem P(2, 300, 32, 37);
  for (const auto form : {kernels::MlaFastForm::wgmma, kernels::MlaFastForm::wgmma_pingpong}) {
    kernels::MlaPrefillOverrides ov = fast_form(form);
    const auto by_sm = run_heads(P, ov, kernels::MlaPrefillPrecision::fast);
    REQUIRE(non_finite(by_sm) == 0);
    for (const auto order : {kernels::MlaFastOrder::longest_first, kernels::MlaFastOrder::head_major})
      for (int ctas : {0, 1, 7, 191, 192, 500}) {
        ov.fast_order = order;
        ov.fast_ctas = ctas;
        const auto o = run_heads(P, ov, kernels::MlaPrefillPrecision::fast);
        std::printf("mla prefill heads fast %s, order %s, %d CTAs (0: one per SM): identical to the rule's order on one CTA "
                    "per SM: %s\n", kernels::mla_fast_form_name(form), kernels::mla_fast_order_name(order), ctas,
                    o == by_sm ? "yes" : "no");
        CAPTURE(kernels::mla_fast_form_name(form), kernels::mla_fast_order_name(order), ctas);
        CHECK(o == by_sm);
      }
  }
}

TEST_CASE("mla prefill heads, fast: a q token stride that is not a multiple of 16 bytes gives the same o, bit for bit",
          "[gpu][mla][fast]") {
  // q rows 4-byte aligned only (sqc_t = H 128 + 2 elements): the q copies fall back from 16-byte to 4-byte pieces
  HeadsProblem P(2, 130, 32, 37);
  const auto dense = run_heads(P, forced(kernels::MlaPrefillPath::automatic), kernels::MlaPrefillPrecision::fast);
  const std::size_t row = P.H * 128, stride = row + 2;
  std::vector<bf16_t> qs(P.B * P.T * stride, 0xFFFF);  // the gaps: NaN, never read
  for (std::size_t bt = 0; bt < P.B * P.T; ++bt)
    for (std::size_t j = 0; j < row; ++j) qs[bt * stride + j] = bf16_bits(P.qc[bt * row + j]);
  DevBuf qdev(qs.size() * 2);
  copy_bits(qdev, qs);
  P.upload();
  kernels::MlaPrefillHeadsArgs a = P.args();
  a.precision = kernels::MlaPrefillPrecision::fast;
  a.q_C = qdev.as<bf16_t>();
  a.sqc_t = static_cast<long long>(stride);
  const auto strided = call_heads(a, nullptr, P.B * P.T);
  std::printf("mla prefill heads fast: q with token stride %zu elements identical to the dense q: %s\n", stride,
              strided == dense ? "yes" : "no");
  REQUIRE(non_finite(dense) == 0);
  CHECK(strided == dense);
}

TEST_CASE("mla prefill heads, fast: an o that is 8- but not 16-byte aligned gives the same o, bit for bit", "[gpu][mla][fast]") {
  // an aligned o takes whole 64-row blocks out through shared memory and TMA stores, and tail rows by direct stores;
  // o 8 bytes past a 16-byte aligned address (out needs 8) takes every row by direct stores. B = 2, T = 130: blocks of 64, 64 and 2 rows
  // per sequence, so a TMA block ends next to the other sequence's rows.
  HeadsProblem P(2, 130, 32, 37);
  for (const auto form : {kernels::MlaFastForm::wgmma, kernels::MlaFastForm::wgmma_pingpong}) {
    const kernels::MlaPrefillOverrides ov = fast_form(form);
    const auto aligned = run_heads(P, ov, kernels::MlaPrefillPrecision::fast);
    P.upload();
    kernels::MlaPrefillHeadsArgs a = P.args();
    a.precision = kernels::MlaPrefillPrecision::fast;
    const std::size_t n = P.B * P.T * P.H * 128;
    DevBuf out((n + 2) * 4), ws(kernels::mla_prefill_heads_workspace_bytes(a, &ov));
    out.poison();
    ws.poison();
    a.out = out.as<float>() + 2;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    kernels::mla_prefill_heads(a, nullptr, &ov);
    cuda_check(cudaDeviceSynchronize(), "mla_prefill_heads");
    const auto all = download_f32(out);
    const std::vector<double> shifted(all.begin() + 2, all.end());
    std::printf("mla prefill heads fast %s: o at an 8-byte offset identical to the aligned o: %s\n",
                kernels::mla_fast_form_name(form), shifted == aligned ? "yes" : "no");
    REQUIRE(non_finite(aligned) == 0);
    CAPTURE(kernels::mla_fast_form_name(form));
    CHECK(shifted == aligned);
  }
}

TEST_CASE("mla prefill heads, fast: a bf16 o (out_bf16) is the fp32 o rounded to bf16, bit for bit", "[gpu][mla][fast]") {
  // B = 2, T = 130: blocks of 64, 64 and 2 rows per sequence (TMA and row-by-row stores); out_bf16 16-byte aligned
  // (whole blocks by TMA) and 4 bytes past it (every row by direct stores); both wgmma forms
  HeadsProblem P(2, 130, 32, 37);
  const auto truth = P.truth();
  for (const auto form : {kernels::MlaFastForm::wgmma, kernels::MlaFastForm::wgmma_pingpong}) {
    const kernels::MlaPrefillOverrides ov = fast_form(form);
    const auto o32 = run_heads(P, ov, kernels::MlaPrefillPrecision::fast);
    for (std::size_t off : {0, 2}) {  // bf16 elements past a 16-byte aligned address
      P.upload();
      kernels::MlaPrefillHeadsArgs a = P.args();
      a.precision = kernels::MlaPrefillPrecision::fast;
      const std::size_t n = P.B * P.T * P.H * 128;
      DevBuf out((n + off) * 2), ws(kernels::mla_prefill_heads_workspace_bytes(a, &ov));
      out.poison();
      ws.poison();
      a.out = nullptr;
      a.out_bf16 = out.as<bf16_t>() + off;
      a.workspace = ws.p;
      a.workspace_bytes = ws.bytes;
      kernels::mla_prefill_heads(a, nullptr, &ov);
      cuda_check(cudaDeviceSynchronize(), "mla_prefill_heads out_bf16");
      const auto all = download_bf16(out);
      const std::vector<double> o16(all.begin() + static_cast<std::ptrdiff_t>(off), all.end());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < n; ++i) differ += o16[i] == round_bf16(o32[i]) ? 0 : 1;
      const auto m = compare(o16, truth), m32 = compare(o32, truth);
      std::printf("mla prefill heads fast %s, out_bf16 at +%zu elements: %zu of %zu differ from bf16(fp32 o); rel_rms "
                  "%.3e (fp32 o: %.3e)\n", kernels::mla_fast_form_name(form), off, differ, n, m.rel_rms, m32.rel_rms);
      CAPTURE(kernels::mla_fast_form_name(form), off, m.rel_rms);
      REQUIRE(non_finite(o16) == 0);
      CHECK(differ == 0);
      CHECK(m.rel_rms <= tol::mla_prefill_fast.value);
    }
  }
}

/// Packed sequences (cu_seqlens) with their own T and N0, one set of weights: each sequence's truth is a B = 1
/// HeadsProblem; the packed call gets q, c_new and o as packed rows and a cache [num_seqs, cap, 512] whose rows past
/// each sequence's N0 are NaN.
struct VarlenProblem {
  std::size_t H, cap;
  std::vector<std::size_t> T, N0;
  std::vector<HeadsProblem> seqs;
  std::vector<int> cu, n0;
  DevBuf cache, c_new, q, cu_d, n0_d;

  VarlenProblem(std::vector<std::size_t> T_, std::vector<std::size_t> N0_, std::size_t H_, std::size_t cap_)
      : H(H_), cap(cap_), T(std::move(T_)), N0(std::move(N0_)), cache(T.size() * cap_ * DC * 2),
        c_new(total() * DC * 2), q(total() * H_ * 128 * 2), cu_d(4 * (T.size() + 1)), n0_d(4 * T.size()) {
    for (std::size_t n = 0; n < T.size(); ++n) {
      seqs.emplace_back(1, T[n], H, N0[n]);
      seqs.back().wuk = seqs[0].wuk;  // one layer: the first sequence's weights (on the device in seqs[0])
      seqs.back().wuv = seqs[0].wuv;
    }
    cu.assign(1, 0);
    for (std::size_t t : T) cu.push_back(cu.back() + static_cast<int>(t));
    for (std::size_t v : N0) n0.push_back(static_cast<int>(v));
    cuda_check(cudaMemcpy(cu_d.p, cu.data(), cu_d.bytes, cudaMemcpyHostToDevice), "upload cu_seqlens");
    cuda_check(cudaMemcpy(n0_d.p, n0.data(), n0_d.bytes, cudaMemcpyHostToDevice), "upload prefix_lens");
    std::vector<bf16_t> cn(total() * DC), qb(total() * H * 128);
    for (std::size_t n = 0; n < T.size(); ++n)
      for (std::size_t t = 0; t < T[n]; ++t) {
        for (std::size_t k = 0; k < DC; ++k) cn[(cu[n] + t) * DC + k] = bf16_bits(seqs[n].L(0, N0[n] + t, k));
        for (std::size_t j = 0; j < H * 128; ++j) qb[(cu[n] + t) * H * 128 + j] = bf16_bits(seqs[n].qc[t * H * 128 + j]);
      }
    copy_bits(c_new, cn);
    copy_bits(q, qb);
  }
  std::size_t total() const {
    std::size_t s = 0;
    for (std::size_t t : T) s += t;
    return s;
  }
  /// Fresh cache: each sequence's prefix rows, the rest NaN.
  void upload_cache() {
    std::vector<bf16_t> ch(T.size() * cap * DC, 0xFFFF);
    for (std::size_t n = 0; n < T.size(); ++n)
      for (std::size_t tau = 0; tau < N0[n]; ++tau)
        for (std::size_t k = 0; k < DC; ++k) ch[(n * cap + tau) * DC + k] = bf16_bits(seqs[n].L(0, tau, k));
    copy_bits(cache, ch);
  }
  /// Cache elements that differ from: the sequence's latents below its N0 + T, NaN past them.
  std::size_t cache_errors() const {
    const auto h = download_bits(cache);
    std::size_t bad = 0;
    for (std::size_t n = 0; n < T.size(); ++n)
      for (std::size_t tau = 0; tau < cap; ++tau)
        for (std::size_t k = 0; k < DC; ++k)
          bad += h[(n * cap + tau) * DC + k] != (tau < N0[n] + T[n] ? bf16_bits(seqs[n].L(0, tau, k)) : bf16_t(0xFFFF));
    return bad;
  }
  std::vector<double> truth() const {
    std::vector<double> o;
    for (const HeadsProblem& P : seqs) {
      const auto t = P.truth();
      o.insert(o.end(), t.begin(), t.end());
    }
    return o;
  }
  /// The packed call; per_seq_n0: prefix_lens given (else every N0 must equal the bound `prefix`).
  std::vector<double> run(kernels::MlaPrefillPrecision precision, const kernels::MlaPrefillOverrides& ov, bool per_seq_n0,
                          int prefix, int max_seqlen) {
    upload_cache();
    kernels::MlaPrefillHeadsArgs a;
    a.B = 1;
    a.T = static_cast<int>(total());
    a.H = static_cast<int>(H);
    a.capacity = static_cast<int>(cap);
    a.prefix = prefix;
    a.c = cache.as<bf16_t>();
    a.c_new = c_new.as<bf16_t>();
    a.q_C = q.as<bf16_t>();
    a.W_UK = seqs[0].W_UK.as<bf16_t>();
    a.W_UV = seqs[0].W_UV.as<bf16_t>();
    a.scale = static_cast<float>(1.0 / std::sqrt(128.0));
    a.precision = precision;
    a.cu_seqlens = cu_d.as<int>();
    a.prefix_lens = per_seq_n0 ? n0_d.as<int>() : nullptr;
    a.num_seqs = static_cast<int>(T.size());
    a.max_seqlen = max_seqlen;
    return call_heads(a, &ov, total());
  }
};

TEST_CASE("mla prefill heads: packed sequences (cu_seqlens, prefix_lens) vs float64, every precision and form",
          "[gpu][mla][fast][varlen]") {
  using kernels::MlaFastForm;
  using kernels::MlaPrefillPrecision;
  struct Set { std::vector<std::size_t> T, N0; std::size_t H; bool per_seq_n0; };
  // lengths across the 64- and 128-row edges, a last sequence of one token, prefixes that move the diagonal inside a
  // key tile; the second set shares one N0 (prefix_lens null)
  const std::vector<Set> sets = {{{37, 1, 300, 130, 64, 1}, {0, 129, 37, 0, 200, 5}, 32, true},
                                 {{129, 17, 1}, {40, 40, 40}, 16, false}};
  for (const Set& st : sets) {
    const std::size_t n0max = *std::max_element(st.N0.begin(), st.N0.end());
    const std::size_t tmax = *std::max_element(st.T.begin(), st.T.end());
    VarlenProblem V(st.T, st.N0, st.H, n0max + tmax + 9);
    const auto truth = V.truth();
    struct Run { const char* name; MlaPrefillPrecision prec; MlaFastForm form; int ctas; int extra; };
    // extra: max_seqlen above the longest sequence (a looser bound: more rows a slot, more empty query tiles)
    for (const Run& r : {Run{"fast wgmma", MlaPrefillPrecision::fast, MlaFastForm::wgmma, 0, 0},
                         Run{"fast wgmma, 3 CTAs, bound + 9", MlaPrefillPrecision::fast, MlaFastForm::wgmma, 3, 9},
                         Run{"fast wgmma_pingpong", MlaPrefillPrecision::fast, MlaFastForm::wgmma_pingpong, 0, 0},
                         Run{"fast wgmma_pingpong, 2 CTAs, bound + 9", MlaPrefillPrecision::fast, MlaFastForm::wgmma_pingpong, 2, 9},
                         Run{"fast mma_sync", MlaPrefillPrecision::fast, MlaFastForm::mma_sync, 0, 0},
                         Run{"accurate", MlaPrefillPrecision::accurate, MlaFastForm::automatic, 0, 0},
                         Run{"accurate, bound + 9", MlaPrefillPrecision::accurate, MlaFastForm::automatic, 0, 9}}) {
      kernels::MlaPrefillOverrides ov;
      ov.fast_form = r.form;
      ov.fast_ctas = r.ctas;
      const auto o = V.run(r.prec, ov, st.per_seq_n0, static_cast<int>(n0max), static_cast<int>(tmax) + r.extra);
      const std::size_t cache_bad = V.cache_errors();
      const double budget = r.prec == MlaPrefillPrecision::fast ? tol::mla_prefill_fast.value : tol::mla_prefill_heads_goal.value;
      REQUIRE(non_finite(o) == 0);
      CHECK(cache_bad == 0);
      // each sequence on its own (a wrong row of a one-token sequence would vanish in a pooled figure)
      double worst = 0.0;
      for (std::size_t n = 0; n < st.T.size(); ++n) {
        const std::size_t row = st.H * 128, b0 = V.cu[n] * row, b1 = V.cu[n + 1] * row;
        const std::vector<double> on(o.begin() + b0, o.begin() + b1), tn(truth.begin() + b0, truth.begin() + b1);
        const auto m = compare(on, tn);
        worst = std::max(worst, m.rel_rms);
        CAPTURE(r.name, st.H, n, st.T[n], st.N0[n], m.rel_rms);
        CHECK(m.rel_rms <= budget);
        if (r.prec == MlaPrefillPrecision::accurate) CHECK(m.rel_rms < 1e-4);  // the hi + lo plan (~5e-6), not bf16
      }
      std::printf("mla prefill heads packed, %zu sequences (H = %zu, %s): %s worst rel_rms of a sequence %.3e, non-finite "
                  "%zu, cache errors %zu\n", st.T.size(), st.H, st.per_seq_n0 ? "prefix_lens" : "one N0", r.name, worst,
                  non_finite(o), cache_bad);
    }
  }
}

TEST_CASE("mla prefill heads, fast: identical keys and very large logits give no NaN", "[gpu][mla][fast]") {
  for (double sigma : {1.0, 1000.0})
    for (bool identical : {true, false}) {
      if (!identical && sigma == 1.0) continue;
      HeadsProblem P(1, 200, 32, 50, sigma);
      if (identical) P.make_identical();
      const auto truth = P.truth();
      const auto of = run_heads(P, forced(kernels::MlaPrefillPath::automatic), kernels::MlaPrefillPrecision::fast);
      // near-one-hot rows (sigma 1000, distinct keys): bf16 K alone swaps near-tied winners, a limit of the
      // precision (see tol::mla_prefill_fast), so the kernel is checked against the truth of its own bf16 K and V
      const bool sharp = !identical;
      const auto mf = compare(of, sharp ? P.truth_bf16_kv() : truth), mexact = compare(of, truth);
      std::printf("mla prefill heads fast %s, sigma=%g: rel_rms %.3e%s (against the exact truth %.3e), non-finite "
                  "%zu\n", identical ? "identical keys" : "distinct keys", sigma, mf.rel_rms,
                  sharp ? " against float64 on bf16 K, V" : "", mexact.rel_rms, non_finite(of));
      REQUIRE(non_finite(of) == 0);
      CHECK(mf.rel_rms <= tol::mla_prefill_fast.value);
    }
}

TEST_CASE("mla prefill heads, fast: the item-order rule", "[gpu][mla][fast]") {
  kernels::MlaPrefillHeadsArgs a;
  a.B = 1;
  a.H = 32;
  const auto order = [&](int T, int N0) {
    a.T = T;
    a.prefix = N0;
    return kernels::mla_fast_order_rule(a);
  };
  using kernels::MlaFastOrder;
  CHECK(order(8192, 0) == MlaFastOrder::longest_first);   // 64 query tiles
  CHECK(order(2049, 0) == MlaFastOrder::longest_first);   // 17
  CHECK(order(2048, 0) == MlaFastOrder::head_major);      // 16
  CHECK(order(512, 0) == MlaFastOrder::head_major);
  CHECK(order(8192, 57344) == MlaFastOrder::head_major);  // N0 = 7 T: the prefix dominates
  CHECK(order(8192, 57343) == MlaFastOrder::longest_first);
  a.cu_seqlens = reinterpret_cast<const int*>(16);  // packed: the longest sequence's bound counts, not the total
  a.num_seqs = 8;
  a.max_seqlen = 512;
  CHECK(order(4096, 0) == MlaFastOrder::head_major);
  CHECK(std::string(kernels::mla_fast_order_name(MlaFastOrder::head_major)) == "head_major");
}

TEST_CASE("mla prefill heads: the precision rule, fast's path and workspace", "[gpu][mla][fast]") {
  using kernels::MlaPrefillPath;
  using kernels::MlaPrefillPrecision;
  kernels::MlaPrefillHeadsArgs a;
  a.B = 2;
  a.H = 32;
  a.capacity = 100000;
  for (auto [T, N0] : std::vector<std::pair<int, int>>{{1, 0}, {64, 0}, {8192, 0}, {93, 1000}}) {
    a.T = T;
    a.prefix = N0;
    a.precision = MlaPrefillPrecision::automatic;
    CHECK(kernels::mla_prefill_precision_rule(a) == MlaPrefillPrecision::accurate);
    CHECK(kernels::mla_prefill_heads_precision(a) == MlaPrefillPrecision::accurate);
    const MlaPrefillPath acc_path = kernels::mla_prefill_heads_path(a);
    CHECK(acc_path == kernels::mla_prefill_path_rule(a));
    kernels::MlaPrefillOverrides naive;
    naive.path = MlaPrefillPath::naive;
    const std::size_t ws_acc = kernels::mla_prefill_heads_workspace_bytes(a, &naive);
    a.precision = MlaPrefillPrecision::fast;
    CHECK(kernels::mla_prefill_heads_precision(a) == MlaPrefillPrecision::fast);
    CHECK(kernels::mla_prefill_heads_path(a) == MlaPrefillPath::naive);  // fast runs the naive path, whatever the rule
    const std::size_t ws_fast = kernels::mla_prefill_heads_workspace_bytes(a);
    CAPTURE(T, N0, ws_acc, ws_fast);
    CHECK(ws_fast * 2 >= ws_acc);  // bf16 K and V: half the fp32 workspace (each part rounded up to 256 bytes)
    CHECK(ws_fast * 2 <= ws_acc + 1024);
  }
  CHECK(std::string(kernels::mla_prefill_precision_name(MlaPrefillPrecision::fast)) == "fast");
  CHECK(std::string(kernels::mla_prefill_precision_name(MlaPrefillPrecision::accurate)) == "accurate");
  CHECK(std::string(kernels::mla_prefill_precision_name(MlaPrefillPrecision::automatic)) == "auto");
}

namespace {

/// One mla_prefill_heads call: the arguments and the overrides.
struct HeadsCall {
  kernels::MlaPrefillHeadsArgs a;
  kernels::MlaPrefillOverrides ov;
};

/// Packed-sequence arguments on a bad-input case: cu_seqlens points at device memory (never read: every case fails
/// before a launch), num_seqs and max_seqlen as given.
template <class Call>
void packed(Call& h, int num_seqs, int max_seqlen) {
  h.a.cu_seqlens = reinterpret_cast<const int*>(h.a.workspace);
  h.a.num_seqs = num_seqs;
  h.a.max_seqlen = max_seqlen;
}

// HeadsProblem(1, 20, 32, 10): B = 1, T = 20, H = 32, N0 = 10, capacity 33, path naive, the workspace of both paths
const std::vector<BadCase<HeadsCall>> kHeadsBad = {
    {"d_c = 256", [](auto& h) { h.a.d_c = 256; }, "mla_prefill_heads: d_c = 256 is not supported"},
    {"d_nope = 64", [](auto& h) { h.a.d_nope = 64; }, "mla_prefill_heads: d_nope = 64 is not supported"},
    {"d_v = 192", [](auto& h) { h.a.d_v = 192; }, "mla_prefill_heads: d_v = 192 is not supported"},
    {"d_rope = 64", [](auto& h) { h.a.d_rope = 64; }, "mla_prefill_heads: d_rope = 64: "},
    {"T = 0", [](auto& h) { h.a.T = 0; }, "mla_prefill_heads: T = 0; accepted: T >= 1"},
    {"B = 0", [](auto& h) { h.a.B = 0; }, "mla_prefill_heads: B = 0; accepted: 1 <= B <= 65535"},
    {"H = 300", [](auto& h) { h.a.H = 300; }, "mla_prefill_heads: H = 300; accepted: 1 <= H <= 256"},
    {"prefix < 0", [](auto& h) { h.a.prefix = -1; }, "mla_prefill_heads: prefix (N0) = -1; accepted: N0 >= 0"},
    {"N0 + T > capacity", [](auto& h) { h.a.T = 24; },
     "mla_prefill_heads: prefix N0 = 10 plus T = 24 passes the cache capacity 33"},
    {"q_C null", [](auto& h) { h.a.q_C = nullptr; }, "mla_prefill_heads: pointer 'q_C' is null"},
    {"W_UK null", [](auto& h) { h.a.W_UK = nullptr; }, "mla_prefill_heads: pointer 'W_UK' is null"},
    {"W_UV misaligned", [](auto& h) { h.a.W_UV = h.a.W_UV + 1; }, "mla_prefill_heads: pointer 'W_UV' is not 4-byte aligned"},
    {"c misaligned", [](auto& h) { h.a.c = h.a.c + 4; }, "mla_prefill_heads: pointer 'c' is not 16-byte aligned"},
    {"out null", [](auto& h) { h.a.out = nullptr; }, "mla_prefill_heads: pointer 'out' is null"},
    {"scale < 0", [](auto& h) { h.a.scale = -1.0f; }, "mla_prefill_heads: scale = -1.000000; accepted: a finite scale > 0"},
    {"sqc_t odd", [](auto& h) { h.a.sqc_t = 32 * 128 + 1; }, "mla_prefill_heads: sqc_t = 4097; accepted: even"},
    {"sc_t < 512", [](auto& h) { h.a.sc_t = 500; }, "mla_prefill_heads: sc_t = 500; accepted"},
    {"workspace null", [](auto& h) { h.a.workspace = nullptr; }, "mla_prefill_heads: pointer 'workspace' is null"},
    {"workspace too small", [](auto& h) { h.a.workspace_bytes = 1000; },
     "mla_prefill_heads: workspace_bytes = 1000 for the naive path"},
    {"overrides path = 7", [](auto& h) { h.ov.path = static_cast<kernels::MlaPrefillPath>(7); },
     "mla_prefill_heads: overrides path = 7; accepted"},
    {"absorbed workspace too small",
     [](auto& h) {
       h.ov.path = kernels::MlaPrefillPath::absorbed;
       h.a.workspace_bytes = 1000;
     },
     "mla_prefill_heads: workspace_bytes = 1000 for the absorbed path"},
    {"precision = 7", [](auto& h) { h.a.precision = static_cast<kernels::MlaPrefillPrecision>(7); },
     "mla_prefill_heads: precision = 7; accepted: automatic, accurate or fast"},
    {"fast with absorbed forced",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::fast;
       h.ov.path = kernels::MlaPrefillPath::absorbed;
     },
     "mla_prefill_heads: precision fast with the absorbed path forced; accepted: fast runs the naive path only"},
    {"fast with p_hi_only",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::fast;
       h.ov.p_hi_only = true;
     },
     "mla_prefill_heads: precision fast with p_hi_only"},
    {"fast_form with accurate",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::accurate;
       h.ov.fast_form = kernels::MlaFastForm::mma_sync;
     },
     "mla_prefill_heads: fast_form = mma_sync with precision accurate"},
    {"fast_form = 9",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::fast;
       h.ov.fast_form = static_cast<kernels::MlaFastForm>(9);
     },
     "mla_prefill_heads: overrides fast_form = 9; accepted: automatic, wgmma, wgmma_pingpong or mma_sync"},
    {"fast_ctas = -1",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::fast;
       h.ov.fast_ctas = -1;
     },
     "mla_prefill_heads: overrides fast_ctas = -1; accepted: 0 (one CTA per SM) or a CTA count >= 1"},
    {"fast_ctas with accurate",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::accurate;
       h.ov.fast_ctas = 4;
     },
     "mla_prefill_heads: overrides fast_ctas = 4 sizes the persistent grid of the wgmma forms; accepted"},
    {"fast_ctas with mma_sync",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::fast;
       h.ov.fast_form = kernels::MlaFastForm::mma_sync;
       h.ov.fast_ctas = 4;
     },
     "mla_prefill_heads: overrides fast_ctas = 4 sizes the persistent grid of the wgmma forms; accepted"},
    {"fast_order = 5",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::fast;
       h.ov.fast_order = static_cast<kernels::MlaFastOrder>(5);
     },
     "mla_prefill_heads: overrides fast_order = 5; accepted: automatic, longest_first or head_major"},
    {"fast_order with accurate",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::accurate;
       h.ov.fast_order = kernels::MlaFastOrder::head_major;
     },
     "mla_prefill_heads: overrides fast_order = head_major orders the persistent grid of the wgmma forms; accepted"},
    {"cu_seqlens with B = 2",
     [](auto& h) {
       packed(h, 1, 1);
       h.a.B = 2;
     },
     "mla_prefill_heads: B = 2 with cu_seqlens; accepted: B = 1"},
    {"cu_seqlens, num_seqs = 0",
     [](auto& h) { packed(h, 0, 1); },
     "mla_prefill_heads: num_seqs = 0 with cu_seqlens; accepted: 1 <= num_seqs <= 65535"},
    {"cu_seqlens, max_seqlen past T",
     [](auto& h) { packed(h, 2, 21); },
     "mla_prefill_heads: max_seqlen = 21 with cu_seqlens; accepted: 1 <= max_seqlen <= T = 20"},
    {"cu_seqlens, prefix + max_seqlen past capacity",
     [](auto& h) {
       packed(h, 2, 20);
       h.a.capacity = 29;
     },
     "mla_prefill_heads: prefix bound 10 plus max_seqlen 20 passes the cache capacity 29"},
    {"prefix_lens without cu_seqlens",
     [](auto& h) { h.a.prefix_lens = reinterpret_cast<const int*>(h.a.workspace); },
     "mla_prefill_heads: prefix_lens without cu_seqlens"},
    {"cu_seqlens with absorbed forced",
     [](auto& h) {
       packed(h, 2, 10);
       h.ov.path = kernels::MlaPrefillPath::absorbed;
     },
     "mla_prefill_heads: cu_seqlens with the absorbed path forced; accepted"},
    {"out_bf16 with out",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::fast;
       h.a.out_bf16 = reinterpret_cast<bf16_t*>(h.a.out);
     },
     "mla_prefill_heads: both out and out_bf16 given; accepted: exactly one"},
    {"out_bf16 with accurate",
     [](auto& h) {
       h.a.out_bf16 = reinterpret_cast<bf16_t*>(h.a.out);
       h.a.out = nullptr;
     },
     "mla_prefill_heads: out_bf16 with precision accurate"},
    {"out_bf16 with mma_sync",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::fast;
       h.ov.fast_form = kernels::MlaFastForm::mma_sync;
       h.a.out_bf16 = reinterpret_cast<bf16_t*>(h.a.out);
       h.a.out = nullptr;
     },
     "mla_prefill_heads: out_bf16 with fast_form = mma_sync; accepted: out_bf16 with a wgmma form only"},
    {"out_bf16 misaligned",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::fast;
       h.a.out_bf16 = reinterpret_cast<bf16_t*>(h.a.out) + 1;
       h.a.out = nullptr;
     },
     "mla_prefill_heads: pointer 'out_bf16' is not 4-byte aligned"},
    {"fast workspace too small",
     [](auto& h) {
       h.a.precision = kernels::MlaPrefillPrecision::fast;
       h.a.workspace_bytes = 1000;
     },
     "mla_prefill_heads: workspace_bytes = 1000 for the naive path in precision fast"},
};

}  // namespace

TEST_CASE("mla prefill heads, naive: bad inputs give clear errors before any launch", "[gpu][mla][naive]") {
  HeadsProblem P(1, 20, 32, 10);
  const auto naive = forced(kernels::MlaPrefillPath::naive), absorbed = forced(kernels::MlaPrefillPath::absorbed);
  DevBuf out(20 * 32 * 128 * 4), ws(kernels::mla_prefill_heads_workspace_bytes(P.args(), &naive) +
                                    kernels::mla_prefill_heads_workspace_bytes(P.args(), &absorbed));
  HeadsCall good{P.args(), naive};
  good.a.out = out.as<float>();
  good.a.workspace = ws.p;
  good.a.workspace_bytes = ws.bytes;
  REQUIRE_NOTHROW(kernels::mla_prefill_heads(good.a, nullptr, &good.ov));
  cuda_check(cudaDeviceSynchronize(), "good");
  expect_errors("mla prefill heads", good, kHeadsBad,
                [](const HeadsCall& h) { kernels::mla_prefill_heads(h.a, nullptr, &h.ov); });
  cuda_check(cudaDeviceSynchronize(), "after bad inputs");
}
