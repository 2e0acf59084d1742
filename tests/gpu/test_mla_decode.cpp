// Absorbed MLA decode (kernels/mla.hpp) against a float64 softmax(scale q~ C^T) C on the same bf16 latent cache and
// the exact (unrounded, float64) absorbed query q~; fresh seeded inputs (never zeros), outputs and workspace poisoned
// (NaN) before every run. Both output paths are checked: the combine (several slices per sequence) and the direct
// output of the split kernel (one slice per sequence), which must give the combine's bits. The single-sequence cases
// against float64 are one table (DecodeCase, check_case); the batch, length, graph, error and plan behaviours have a
// test each. Multi-token decode (s_q = 1..4 query tokens per sequence, causal among themselves) in the fast precision
// is a second table (MtpCase, check_mtp_case) against the float64 truth of each (sequence, token, head) within
// tol::mla_decode_fast, with tests of its mask, lengths, errors and plan. Runs only where the CUDA kernels are built
// (ctest label gpu).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/mla.hpp"
#include "kernels/common/random_fill.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "tests/catch.hpp"
#include "tests/gpu/kda_gpu_util.hpp"

using namespace kdalab;
using namespace kda_gpu;

namespace {

constexpr std::size_t DC = 512;

std::uint64_t fresh_seed() {
  static std::uint64_t s = 20261129 + 7000;
  return ++s;
}

double bits_to_double(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// A latent cache [B, cap, row] (row >= 512 elements per token) on the device and its bf16 bits on the host.
struct Cache {
  std::size_t B, cap, row;
  DevBuf d;
  std::vector<bf16_t> h;
  Cache(std::size_t B_, std::size_t cap_, std::size_t row_, std::uint64_t seed)
      : B(B_), cap(cap_), row(row_), d(B_ * cap_ * row_ * 2), h(B_ * cap_ * row_) {
    kernels::fill_normal_bf16(d.as<bf16_t>(), h.size(), seed, 1.0f, nullptr);
    cuda_check(cudaMemcpy(h.data(), d.p, d.bytes, cudaMemcpyDeviceToHost), "download cache");
  }
  /// Every token of every sequence = the same random row (a cache of identical keys).
  void make_identical(std::uint64_t seed) {
    Rng rng(seed);
    std::vector<bf16_t> r(DC);
    for (auto& x : r) x = bf16_bits(round_bf16(rng.normal()));
    for (std::size_t t = 0; t < B * cap; ++t) std::copy(r.begin(), r.end(), h.begin() + t * row);
    cuda_check(cudaMemcpy(d.p, h.data(), d.bytes, cudaMemcpyHostToDevice), "upload cache");
  }
  const bf16_t* tok(std::size_t b, std::size_t t) const { return h.data() + (b * cap + t) * row; }
};

/// Exact absorbed queries q~ [B, s_q, H, 512] ~ sigma N(0, 1) in float64, and their bf16 hi / lo parts.
struct Query {
  std::size_t B, H, s_q;
  std::vector<double> q;
  DevBuf hi, lo;
  static std::vector<double> draw(std::size_t n, double sigma, std::uint64_t seed) {
    Rng rng(seed);
    std::vector<double> v(n);
    for (auto& x : v) x = sigma * rng.normal();
    return v;
  }
  /// Uploads bf16(q) (lo = false) or bf16(q - bf16(q)) (lo = true).
  static DevBuf upload_part(const std::vector<double>& q, bool lo) {
    std::vector<bf16_t> v(q.size());
    for (std::size_t i = 0; i < q.size(); ++i) {
      const double h = round_bf16(q[i]);
      v[i] = bf16_bits(lo ? round_bf16(q[i] - h) : h);
    }
    DevBuf d(v.size() * 2);
    cuda_check(cudaMemcpy(d.p, v.data(), d.bytes, cudaMemcpyHostToDevice), "upload q part");
    return d;
  }
  Query(std::size_t B_, std::size_t H_, double sigma, std::uint64_t seed, std::size_t s_q_ = 1)
      : B(B_), H(H_), s_q(s_q_), q(draw(B_ * s_q_ * H_ * DC, sigma, seed)), hi(upload_part(q, false)),
        lo(upload_part(q, true)) {}
};

/// float64 truth of one (sequence, query token j, head): softmax over the tokens 0 .. len - s_q + j the query reads of
/// scale q~ . c_t, then sum p c (s_q = 1: every token 0 .. len - 1).
std::vector<double> truth(const Cache& c, const Query& q, std::size_t b, std::size_t h, std::size_t len_b, double scale,
                          std::size_t j = 0) {
  const double* qv = q.q.data() + ((b * q.s_q + j) * q.H + h) * DC;
  const std::size_t len = len_b - (q.s_q - 1 - j);
  std::vector<double> s(len), a(DC, 0.0), row(DC);
  double m = -INFINITY;
  for (std::size_t t = 0; t < len; ++t) {
    const bf16_t* ct = c.tok(b, t);
    double acc = 0;
    for (std::size_t k = 0; k < DC; ++k) acc += qv[k] * bits_to_double(ct[k]);
    s[t] = scale * acc;
    m = std::max(m, s[t]);
  }
  double l = 0;
  for (std::size_t t = 0; t < len; ++t) {
    const double p = std::exp(s[t] - m);
    l += p;
    const bf16_t* ct = c.tok(b, t);
    for (std::size_t k = 0; k < DC; ++k) a[k] += p * bits_to_double(ct[k]);
  }
  for (auto& x : a) x /= l;
  return a;
}

kernels::MlaDecodeArgs args_of(const Cache& c, const Query& q, std::size_t max_len, double scale) {
  kernels::MlaDecodeArgs a;
  a.B = static_cast<int>(c.B);
  a.H = static_cast<int>(q.H);
  a.capacity = static_cast<int>(c.cap);
  a.max_len = static_cast<int>(max_len);
  a.c = c.d.as<bf16_t>();
  a.sc_t = static_cast<std::int64_t>(c.row);
  a.q_hi = q.hi.as<bf16_t>();
  a.q_lo = q.lo.as<bf16_t>();
  a.s_q = static_cast<int>(q.s_q);
  a.scale = static_cast<float>(scale);
  return a;
}

/// args_of in the fast precision: the bf16 query q_hi alone (q_lo null).
kernels::MlaDecodeArgs fast_args_of(const Cache& c, const Query& q, std::size_t max_len, double scale) {
  kernels::MlaDecodeArgs a = args_of(c, q, max_len, scale);
  a.precision = kernels::MlaDecodePrecision::fast;
  a.q_lo = nullptr;
  return a;
}

/// Runs the decode (out and workspace allocated here, poisoned first) and downloads out [B, s_q, H, 512]. finite_poison:
/// out is filled with 0x7f bytes (3.4e38, finite) instead of NaN, for the cases that check NaN rows (a NaN poison
/// would pass them with nothing written).
std::vector<double> run(kernels::MlaDecodeArgs a, const kernels::MlaDecodeOverrides& ov = {}, bool finite_poison = false) {
  DevBuf out(static_cast<std::size_t>(a.B) * a.s_q * a.H * DC * 4);
  out.poison();
  if (finite_poison) cuda_check(cudaMemset(out.p, 0x7f, out.bytes), "finite poison");
  DevBuf ws(kernels::mla_decode_workspace_bytes(a, &ov));
  ws.poison();
  a.out = out.as<float>();
  a.workspace = ws.p;
  a.workspace_bytes = ws.bytes;
  kernels::mla_decode(a, nullptr, &ov);
  cuda_check(cudaDeviceSynchronize(), "mla_decode");
  return download_f32(out);
}

/// The lengths on the device.
DevBuf device_lens(const std::vector<int>& lens) {
  DevBuf d(lens.size() * 4);
  cuda_check(cudaMemcpy(d.p, lens.data(), d.bytes, cudaMemcpyHostToDevice), "lens");
  return d;
}

/// float64 truths of (b, query token j, heads), concatenated (computed once, compared against every run).
std::vector<double> truth_rows(const Cache& c, const Query& q, std::size_t b, const std::vector<std::size_t>& heads,
                               std::size_t len, double scale, std::size_t j = 0) {
  std::vector<double> r;
  for (std::size_t h : heads) {
    const auto t = truth(c, q, b, h, len, scale, j);
    r.insert(r.end(), t.begin(), t.end());
  }
  return r;
}

/// Kernel rows of (b, query token j, heads) of out [B, s_q, H, 512] vs their truths from truth_rows.
ErrorMetrics compare_rows(const std::vector<double>& out, const std::vector<double>& ref, std::size_t H, std::size_t b,
                          const std::vector<std::size_t>& heads, std::size_t s_q = 1, std::size_t j = 0) {
  std::vector<double> o;
  const std::size_t row0 = (b * s_q + j) * H;
  for (std::size_t h : heads) o.insert(o.end(), out.begin() + (row0 + h) * DC, out.begin() + (row0 + h + 1) * DC);
  return compare(o, ref);
}

/// Whether every output row of sequence b (s_q x H x 512 values of out [B, s_q, H, 512]) is NaN (a device length
/// outside [s_q, max_len]); meaningful only on an output run with finite_poison.
bool all_nan_rows(const std::vector<double>& out, std::size_t b, std::size_t H, std::size_t s_q = 1) {
  const std::size_t n = s_q * H * DC;
  return std::all_of(out.begin() + b * n, out.begin() + (b + 1) * n, [](double x) { return std::isnan(x); });
}

std::vector<std::size_t> all_heads(std::size_t H) {
  std::vector<std::size_t> v(H);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

const double kScale = 1.0 / std::sqrt(192.0);  // 1/sqrt(d_nope + d_rope) of K3 / Kimi Linear (128 + 64)
const double kSigma = 1.2;                     // q~ ~ 1.2 N(0,1): logits scale q~ . c with std ~2

kernels::MlaDecodeOverrides with_splits(int splits) {
  kernels::MlaDecodeOverrides ov;
  ov.num_splits = splits;
  return ov;
}

kernels::MlaDecodeOverrides forced_combine(int splits) {
  kernels::MlaDecodeOverrides ov = with_splits(splits);
  ov.output = kernels::MlaDecodeOutput::combine;
  return ov;
}

/// One sequence (B = 1) of N cached tokens against float64. The parameters that name a case.
struct DecodeCase {
  std::size_t N, H;
  int splits = 0;              // MlaDecodeOverrides::num_splits (0 = the plan's)
  std::size_t row = DC;        // cache row stride sc_t (576: [c ; k_R] rows)
  double sigma = kSigma;       // q~ ~ sigma N(0, 1)
  bool identical_keys = false; // every token the same row
  std::vector<std::size_t> heads = {};  // heads compared (empty: all)
};

/// Runs the case, compares with float64 (no NaN / Inf anywhere, rel_rms <= tol::mla_decode_goal). With one slice per
/// sequence the output is direct; then the same slice through the combine must give the same bits.
void check_case(const DecodeCase& k) {
  Cache c(1, k.N, k.row, fresh_seed());
  if (k.identical_keys) c.make_identical(fresh_seed());
  const Query q(1, k.H, k.sigma, fresh_seed());
  const auto heads = k.heads.empty() ? all_heads(k.H) : k.heads;
  const auto ref = truth_rows(c, q, 0, heads, k.N, kScale);
  const auto a = args_of(c, q, k.N, kScale);
  const auto ov = with_splits(k.splits);
  const auto pl = kernels::mla_decode_plan(a, &ov);
  const auto out = run(a, ov);
  const auto m = compare_rows(out, ref, k.H, 0, heads);
  std::printf("mla decode N=%zu H=%zu sc_t=%zu sigma=%g%s (%d splits of %d, %s output): rel_rms %.3e max_abs %.3e\n",
              k.N, k.H, k.row, k.sigma, k.identical_keys ? " identical keys" : "", pl.num_splits, pl.split_len,
              kernels::mla_decode_output_name(pl.output), m.rel_rms, m.max_abs);
  CAPTURE(k.N, k.H, k.splits, k.row, k.sigma, k.identical_keys, pl.num_splits, m.rel_rms, m.nan_count);
  REQUIRE(m.nan_count + m.inf_count == 0);
  CHECK(m.rel_rms <= tol::mla_decode_goal.value);
  // every head finite, also those not compared (N = 1M samples three)
  CHECK(std::all_of(out.begin(), out.end(), [](double x) { return std::isfinite(x); }));
  if (pl.num_splits == 1) {
    // the direct output is the combine's single-slice merge, float for float
    CHECK(pl.output == kernels::MlaDecodeOutput::direct);
    CHECK(run(a, forced_combine(k.splits)) == out);
  }
}

}  // namespace

TEST_CASE("mla decode: one sequence vs float64 on the exact q~ (lengths, heads, forced slices, row stride, logits)",
          "[gpu][mla]") {
  std::vector<DecodeCase> cases;
  // lengths around one 64-token block and long contexts, H = 32, the plan's slices
  for (std::size_t N : {1, 2, 63, 64, 65, 4096, 65536}) cases.push_back({N, 32});
  // H = 16, forced slice counts (100: slices of one 64-token block), combined [c ; k_R] rows (sc_t = 576)
  for (int splits : {1, 3, 7, 100, 0}) cases.push_back({4100, 16, splits, 576});
  // odd / even block counts per slice (a slice with an odd count ends on a pair without its second block), one slice
  // (direct output), and more slices than the combine takes in one step (> 8 x 16: its warps loop)
  // (one push_back each: g++ 13.3 stops with an internal compiler error on a range-for over this braced list)
  cases.push_back(DecodeCase{129, 16});
  cases.push_back(DecodeCase{200, 32, 1});
  cases.push_back(DecodeCase{4100, 32, 100});
  cases.push_back(DecodeCase{4100, 16, 3});
  cases.push_back(DecodeCase{4100, 32, 7});
  cases.push_back(DecodeCase{65536, 32, 1024});
  cases.push_back(DecodeCase{20000, 16, 300});
  // identical keys (every score equal) and very large logits (std ~2000: a near one-hot softmax) give no NaN
  for (double sigma : {kSigma, 1000.0}) cases.push_back({5000, 32, 0, DC, sigma, true});
  cases.push_back({5000, 32, 0, DC, 1000.0});
  // N = 1,048,576 on a sample of heads
  cases.push_back({std::size_t{1} << 20, 32, 0, DC, kSigma, false, {0, 13, 31}});
  for (const DecodeCase& k : cases) check_case(k);
}

TEST_CASE("mla decode: the lo query part and P_lo are what keep the goal (q hi only, P hi only ablations)",
          "[gpu][mla]") {
  const std::size_t N = 4096;
  const Cache c(1, N, DC, fresh_seed());
  const Query q(1, 32, kSigma, fresh_seed());
  const auto ref = truth_rows(c, q, 0, all_heads(32), N, kScale);
  DevBuf zero(q.lo.bytes);
  cuda_check(cudaMemset(zero.p, 0, zero.bytes), "memset");  // ablation: q_lo = 0 (bf16-rounded q~)
  const auto m_hilo = compare_rows(run(args_of(c, q, N, kScale)), ref, 32, 0, all_heads(32));
  auto a = args_of(c, q, N, kScale);
  a.q_lo = zero.as<bf16_t>();
  const auto m_hi = compare_rows(run(a), ref, 32, 0, all_heads(32));
  kernels::MlaDecodeOverrides ov;
  ov.p_hi_only = true;  // ablation: P C with P_hi = bf16(P) only (q~ still hi + lo)
  const auto m_phi = compare_rows(run(args_of(c, q, N, kScale), ov), ref, 32, 0, all_heads(32));
  std::printf("mla decode N=4096: hi+lo rel_rms %.3e, q hi only %.3e, P hi only %.3e\n", m_hilo.rel_rms, m_hi.rel_rms,
              m_phi.rel_rms);
  CAPTURE(m_hilo.rel_rms, m_hi.rel_rms, m_phi.rel_rms);
  REQUIRE(m_hilo.nan_count + m_hi.nan_count + m_phi.nan_count == 0);
  CHECK(m_hilo.rel_rms <= tol::mla_decode_goal.value);
  CHECK(m_hilo.rel_rms < m_hi.rel_rms);
  CHECK(m_hilo.rel_rms < m_phi.rel_rms);
}

TEST_CASE("mla decode: batch of different lengths (incl. 1), per-sequence truths", "[gpu][mla]") {
  const std::vector<int> lens = {3000, 1, 333, 64, 2049};
  const std::size_t B = lens.size(), cap = 3001;
  const Cache c(B, cap, DC, fresh_seed());
  const Query q(B, 32, kSigma, fresh_seed());
  DevBuf dl(B * 4);
  cuda_check(cudaMemcpy(dl.p, lens.data(), dl.bytes, cudaMemcpyHostToDevice), "lens");
  auto a = args_of(c, q, 3000, kScale);
  a.lens = dl.as<int>();
  const auto out = run(a);
  for (std::size_t b = 0; b < B; ++b) {
    const auto m = compare_rows(out, truth_rows(c, q, b, all_heads(32), lens[b], kScale), 32, b, all_heads(32));
    std::printf("mla decode batch b=%zu len=%d: rel_rms %.3e\n", b, lens[b], m.rel_rms);
    CAPTURE(b, lens[b], m.rel_rms);
    REQUIRE(m.nan_count + m.inf_count == 0);
    CHECK(m.rel_rms <= tol::mla_decode_goal.value);
  }
}

TEST_CASE("mla decode, one slice per sequence: the split kernel writes the output (no combine), lengths 1 .. max_len "
          "and invalid ones; the same bits as the combine", "[gpu][mla]") {
  // B = 120 x 600 in one slice per sequence (num_splits = 1), so the split kernel normalises in its epilogue and no
  // combine is launched
  const std::size_t B = 120, cap = 600;
  std::vector<int> lens(B);
  Rng rng(fresh_seed());
  for (std::size_t b = 0; b < B; ++b) lens[b] = 1 + static_cast<int>(rng.uniform() * (cap - 1));
  lens[0] = 1;
  lens[1] = static_cast<int>(cap);
  lens[2] = 0;                           // outside [1, max_len]: NaN rows
  lens[3] = static_cast<int>(cap) + 1;   // likewise
  const Cache c(B, cap, DC, fresh_seed());
  const Query q(B, 32, kSigma, fresh_seed());
  DevBuf dl(B * 4);
  cuda_check(cudaMemcpy(dl.p, lens.data(), dl.bytes, cudaMemcpyHostToDevice), "lens");
  auto a = args_of(c, q, cap, kScale);
  a.lens = dl.as<int>();
  // (the automatic plan picks 1 on 132 SMs; given here so that the case does not depend on the GPU)
  const auto one = with_splits(1);
  REQUIRE(kernels::mla_decode_plan(a, &one).output == kernels::MlaDecodeOutput::direct);
  const auto out = run(a, one, true);
  const auto outc = run(a, forced_combine(1), true);  // the same slices through the combine kernel
  const auto out2 = run(a, with_splits(2));           // the same sequences through two slices and the combine
  const std::vector<std::size_t> heads = {0, 17, 31};
  double worst = 0.0;
  for (std::size_t b = 0; b < B; ++b) {
    CAPTURE(b, lens[b]);
    if (lens[b] < 1 || lens[b] > static_cast<int>(cap)) {
      CHECK(all_nan_rows(out, b, 32));
      CHECK(all_nan_rows(outc, b, 32));
      continue;
    }
    // the direct output is the combine's single-slice merge, float for float: every head, bitwise
    CHECK(std::equal(out.begin() + b * 32 * DC, out.begin() + (b + 1) * 32 * DC, outc.begin() + b * 32 * DC));
    const auto ref = truth_rows(c, q, b, heads, lens[b], kScale);
    const auto m = compare_rows(out, ref, 32, b, heads), m2 = compare_rows(out2, ref, 32, b, heads);
    worst = std::max(worst, m.rel_rms);
    CAPTURE(m.rel_rms, m2.rel_rms);
    REQUIRE(m.nan_count + m.inf_count == 0);
    CHECK(m.rel_rms <= tol::mla_decode_goal.value);
    CHECK(m2.rel_rms <= tol::mla_decode_goal.value);
  }
  std::printf("mla decode direct output, B=120 x 600 (lengths 1..600): worst rel_rms %.3e\n", worst);
}

TEST_CASE("mla decode: NaN in the cache past each sequence's length does not reach the output", "[gpu][mla]") {
  // Tokens in [lens[b], capacity) are not part of sequence b: a cache may hold anything there. The split kernel
  // zero-fills the rows past the slice at the load (P is 0 there, but 0 * NaN = NaN).
  const std::vector<int> lens = {70, 3000, 1, 1000, 2049};
  const std::size_t B = lens.size(), cap = 3100;
  Cache c(B, cap, DC, fresh_seed());
  const std::uint16_t nan_bits = 0x7fc0;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = static_cast<std::size_t>(lens[b]); t < cap; ++t)
      for (std::size_t k = 0; k < DC; ++k) std::memcpy(&c.h[(b * cap + t) * DC + k], &nan_bits, 2);
  cuda_check(cudaMemcpy(c.d.p, c.h.data(), c.d.bytes, cudaMemcpyHostToDevice), "upload cache");
  const Query q(B, 32, kSigma, fresh_seed());
  DevBuf dl(B * 4);
  cuda_check(cudaMemcpy(dl.p, lens.data(), dl.bytes, cudaMemcpyHostToDevice), "lens");
  for (const int max_len : {3000, 3100}) {  // NaN tokens past max_len (3000) or inside it
    auto a = args_of(c, q, static_cast<std::size_t>(max_len), kScale);
    a.lens = dl.as<int>();
    const auto out = run(a);
    for (std::size_t b = 0; b < B; ++b) {
      const auto m = compare_rows(out, truth_rows(c, q, b, {0, 17, 31}, lens[b], kScale), 32, b, {0, 17, 31});
      std::printf("mla decode NaN past the length, max_len=%d b=%zu len=%d: rel_rms %.3e\n", max_len, b, lens[b],
                  m.rel_rms);
      CAPTURE(max_len, b, lens[b], m.rel_rms);
      REQUIRE(m.nan_count + m.inf_count == 0);
      CHECK(m.rel_rms <= tol::mla_decode_goal.value);
    }
  }
}

TEST_CASE("mla decode: a device length outside [s_q, max_len] gives NaN rows (every token and head) for that "
          "sequence only (one token accurate, three tokens fast; direct output and combine)", "[gpu][mla]") {
  struct Lengths {
    std::size_t s_q;
    std::vector<int> lens;  // max_len = 40: 41 is past it, a length < s_q is too short
  };
  std::vector<Lengths> runs;
  runs.push_back({1, {0, 40, 41}});
  runs.push_back({3, {2, 40, 41, 3}});
  for (const Lengths& k : runs) {
    const std::size_t B = k.lens.size();
    const Cache c(B, 64, DC, fresh_seed());
    const Query q(B, 32, kSigma, fresh_seed(), k.s_q);
    const DevBuf dl = device_lens(k.lens);
    auto a = k.s_q == 1 ? args_of(c, q, 40, kScale) : fast_args_of(c, q, 40, kScale);
    a.lens = dl.as<int>();
    const double budget = k.s_q == 1 ? tol::mla_decode_goal.value : tol::mla_decode_fast.value;
    // max_len = 40: one slice (direct output) by the plan; the combine forced on the same slice
    const std::vector<kernels::MlaDecodeOverrides> paths{kernels::MlaDecodeOverrides{}, forced_combine(0)};
    for (const auto& ov : paths) {
      const auto out = run(a, ov, true);
      const char* path = kernels::mla_decode_output_name(kernels::mla_decode_plan(a, &ov).output);
      for (std::size_t b = 0; b < B; ++b) {
        CAPTURE(k.s_q, path, b, k.lens[b]);
        if (k.lens[b] < static_cast<int>(k.s_q) || k.lens[b] > 40) {
          CHECK(all_nan_rows(out, b, 32, k.s_q));
          continue;
        }
        for (std::size_t j = 0; j < k.s_q; ++j) {
          const auto ref = truth_rows(c, q, b, all_heads(32), static_cast<std::size_t>(k.lens[b]), kScale, j);
          const auto m = compare_rows(out, ref, 32, b, all_heads(32), k.s_q, j);
          std::printf("mla decode bad device length, s_q=%zu (%s output): valid sequence b=%zu token %zu rel_rms "
                      "%.3e\n", k.s_q, path, b, j, m.rel_rms);
          CAPTURE(j, m.rel_rms);
          REQUIRE(m.nan_count == 0);
          CHECK(m.rel_rms <= budget);
        }
      }
    }
  }
}

TEST_CASE("mla decode in a CUDA graph equals direct launches (one token accurate, four tokens fast; combine and "
          "direct output)", "[gpu][mla]") {
  const std::size_t N = 3000;
  const Cache c(2, N, DC, fresh_seed());
  for (std::size_t s_q : {1, 4}) {
    const Query q(2, 32, kSigma, fresh_seed(), s_q);
    for (int splits : {0, 1}) {  // the plan's slices (several: the combine), one slice (the direct output)
      const auto ov = with_splits(splits);
      auto a = s_q == 1 ? args_of(c, q, N, kScale) : fast_args_of(c, q, N, kScale);
      const auto direct = run(a, ov);
      DevBuf out(2 * s_q * 32 * DC * 4), ws(kernels::mla_decode_workspace_bytes(a, &ov));
      out.poison();
      ws.poison();
      a.out = out.as<float>();
      a.workspace = ws.p;
      a.workspace_bytes = ws.bytes;
      run_in_graph([&](cudaStream_t s) { kernels::mla_decode(a, s, &ov); });
      CAPTURE(s_q, splits);
      CHECK(download_f32(out) == direct);
    }
  }
}

TEST_CASE("mla decode: bad inputs give clear errors before any launch", "[gpu][mla]") {
  const Cache c(1, 100, DC, fresh_seed());
  const Query q(1, 32, kSigma, fresh_seed());
  DevBuf out(32 * DC * 4), ws(1 << 22);
  auto good = args_of(c, q, 100, kScale);
  good.out = out.as<float>();
  good.workspace = ws.p;
  good.workspace_bytes = ws.bytes;
  REQUIRE_NOTHROW(kernels::mla_decode(good, nullptr));
  cuda_check(cudaDeviceSynchronize(), "good");
  auto bad = good;
  bad.d_c = 256;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.d_rope = 64;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.H = 8;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.H = 64;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.max_len = 0;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.max_len = 101;  // past the capacity
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.c = good.c + 1;  // 2-byte offset: not 16-byte aligned
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.q_hi = nullptr;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.out = nullptr;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.workspace_bytes = 100;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.scale = 0.0f;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.sc_t = 500;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  bad = good;
  bad.B = 0;
  CHECK_THROWS_AS(kernels::mla_decode(bad, nullptr), Error);
  kernels::MlaDecodeOverrides ov;
  ov.num_splits = -1;
  CHECK_THROWS_AS(kernels::mla_decode(good, nullptr, &ov), Error);
  ov = {};
  ov.output = static_cast<kernels::MlaDecodeOutput>(7);
  CHECK_THROWS_AS(kernels::mla_decode(good, nullptr, &ov), Error);
  ov = {};
  ov.num_splits = 2;  // two slices of 64 tokens: only the combine can merge them
  ov.output = kernels::MlaDecodeOutput::direct;
  CHECK_THROWS_AS(kernels::mla_decode(good, nullptr, &ov), Error);
  cuda_check(cudaDeviceSynchronize(), "after bad inputs");
}

TEST_CASE("mla decode plan: whole blocks, every token covered, one wave at B = 1, output by the rule", "[gpu][mla]") {
  int dev = 0, sms = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  struct Shape { int B, N; };
  for (const Shape sh : {Shape{1, 1}, Shape{1, 65}, Shape{1, 4096}, Shape{1, 65536}, Shape{1, 1 << 20}, Shape{64, 32768},
                         Shape{256, 4096}}) {
    kernels::MlaDecodeArgs a;
    a.B = sh.B;
    a.capacity = a.max_len = sh.N;
    const auto pl = kernels::mla_decode_plan(a);
    std::printf("mla decode plan B=%d N=%d: %d splits of %d tokens (%d CTAs on %d SMs), %s output\n", sh.B, sh.N,
                pl.num_splits, pl.split_len, sh.B * pl.num_splits, sms, kernels::mla_decode_output_name(pl.output));
    CAPTURE(sh.B, sh.N, pl.num_splits, pl.split_len);
    CHECK(pl.split_len % 64 == 0);
    CHECK(static_cast<long long>(pl.num_splits) * pl.split_len >= sh.N);          // every token in a slice
    CHECK(static_cast<long long>(pl.num_splits - 1) * pl.split_len < sh.N);       // no empty slice
    if (sh.B == 1 && sh.N >= 65536) CHECK(pl.num_splits <= sms);                 // one wave of 1-CTA-per-SM slices
    if (sh.B == 1 && sh.N >= 65536) CHECK(pl.num_splits >= sms * 9 / 10);        // ... that fills >= 90% of it
    CHECK(pl.output == kernels::mla_decode_output_rule(pl.num_splits));
  }
}

// ---- multi-token decode: s_q query tokens per sequence, the fast precision ---------------------------------------

namespace {

/// One multi-token decode case in the fast precision: B = lens.size() sequences of lens[b] >= s_q tokens (the cache
/// capacity and max_len are their maximum), s_q query tokens each, H heads. The parameters that name a case.
struct MtpCase {
  int s_q;
  std::size_t H;
  std::vector<int> lens;
  int splits = 0;                       // MlaDecodeOverrides::num_splits (0 = the plan's)
  std::vector<std::size_t> heads = {};  // heads compared (empty: all)
};

/// Runs the case (outputs NaN-poisoned) and compares every (sequence, query token) with float64: no NaN or Inf
/// anywhere, rel_rms <= tol::mla_decode_fast. The plan runs the fast precision in ceil(s_q H / 64) row groups; with one
/// slice per sequence the direct output must give the combine's bits.
void check_mtp_case(const MtpCase& k) {
  const std::size_t B = k.lens.size();
  const int max_len = *std::max_element(k.lens.begin(), k.lens.end());
  const Cache c(B, static_cast<std::size_t>(max_len), DC, fresh_seed());
  const Query q(B, k.H, kSigma, fresh_seed(), static_cast<std::size_t>(k.s_q));
  const DevBuf dl = device_lens(k.lens);
  auto a = fast_args_of(c, q, static_cast<std::size_t>(max_len), kScale);
  a.lens = dl.as<int>();
  const auto heads = k.heads.empty() ? all_heads(k.H) : k.heads;
  const auto ov = with_splits(k.splits);
  const auto pl = kernels::mla_decode_plan(a, &ov);
  const auto out = run(a, ov);
  double worst = 0.0;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t j = 0; j < q.s_q; ++j) {
      const auto ref = truth_rows(c, q, b, heads, static_cast<std::size_t>(k.lens[b]), kScale, j);
      const auto m = compare_rows(out, ref, k.H, b, heads, q.s_q, j);
      worst = std::max(worst, m.rel_rms);
      CAPTURE(k.s_q, k.H, B, b, k.lens[b], j, k.splits, pl.num_splits, m.rel_rms, m.nan_count);
      REQUIRE(m.nan_count + m.inf_count == 0);
      CHECK(m.rel_rms <= tol::mla_decode_fast.value);
    }
  std::printf("mla decode fast s_q=%d H=%zu B=%zu max_len=%d (%d splits of %d, %d row groups, %s output): worst "
              "rel_rms %.3e\n", k.s_q, k.H, B, max_len, pl.num_splits, pl.split_len, pl.row_groups,
              kernels::mla_decode_output_name(pl.output), worst);
  CAPTURE(k.s_q, k.H, B, max_len, k.splits);
  CHECK(std::all_of(out.begin(), out.end(), [](double x) { return std::isfinite(x); }));  // every row, every head
  CHECK(pl.precision == kernels::MlaDecodePrecision::fast);
  CHECK(pl.row_groups == (k.s_q * static_cast<int>(k.H) + 63) / 64);
  if (pl.num_splits == 1) {
    CHECK(pl.output == kernels::MlaDecodeOutput::direct);
    CHECK(run(a, forced_combine(k.splits)) == out);
  }
}

/// The message of the kdalab::Error mla_decode throws for these arguments, "" when it does not throw.
std::string decode_error(const kernels::MlaDecodeArgs& a, const kernels::MlaDecodeOverrides* ov = nullptr) {
  try {
    kernels::mla_decode(a, nullptr, ov);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("mla decode, multi-token (fast precision): every (sequence, token, head) vs float64 for s_q = 1..4, B = 1 "
          "and 3, lengths equal to s_q, ragged lengths, N = 64K, H = 16 and 32, forced slices", "[gpu][mla]") {
  std::vector<MtpCase> cases;
  for (int s_q : {1, 2, 3, 4}) {
    cases.push_back({s_q, 32, {s_q}});                       // the cache holds only the query tokens
    cases.push_back({s_q, 32, {4096}});
    cases.push_back({s_q, 32, {65536}, 0, {0, 4, 9, 13, 18, 22, 27, 31}});  // the plan's slices of N = 64K, 8 heads
    cases.push_back({s_q, 32, {3000, s_q, 129}});            // ragged, one sequence of only its query tokens
    cases.push_back({s_q, 16, {4100, 700, s_q + 64}});       // H = 16: one row group for every s_q
  }
  // the mask in a slice of its own: N = 130 in slices of 128 (the second slice holds 2 tokens that queries 0 and 1 of
  // s_q = 4 do not read: their partial there has l = 0), N = 4097 in slices of one 64-token block (the last slice is
  // one token); one slice per sequence (the direct output, with the combine's bits)
  cases.push_back({4, 32, {130}, 2});
  cases.push_back({3, 32, {4097}, 100});
  cases.push_back({2, 16, {4097, 66}, 100});
  cases.push_back({4, 32, {600, 4, 333}, 1});
  cases.push_back({2, 32, {600, 2, 333}, 1});
  for (const MtpCase& k : cases) check_mtp_case(k);
}

TEST_CASE("mla decode, multi-token: a query's output does not change, bit for bit, when the cache rows after its own "
          "position change (the causal mask)", "[gpu][mla]") {
  // s_q = 4 over sequences of 700 and 4 tokens; the rows of queries 2 and 3 (positions len - 2, len - 1) redrawn:
  // queries 0 and 1 read neither, query 3 reads both (its output must change, or the check would prove nothing)
  const int s_q = 4, P = 2;
  const std::vector<int> lens = {700, 4};
  const Query q(2, 32, kSigma, fresh_seed(), s_q);
  const DevBuf dl = device_lens(lens);
  for (int splits : {0, 1}) {  // several slices (the combine), one slice (the direct output)
    Cache c(2, 700, DC, fresh_seed());
    const Cache other(2, 700, DC, fresh_seed());
    auto a = fast_args_of(c, q, 700, kScale);
    a.lens = dl.as<int>();
    const auto ov = with_splits(splits);
    const auto before = run(a, ov);
    for (std::size_t b = 0; b < 2; ++b)
      for (int t = lens[b] - s_q + P; t < lens[b]; ++t)
        std::copy(other.tok(b, t), other.tok(b, t) + DC, c.h.begin() + (b * 700 + t) * DC);
    cuda_check(cudaMemcpy(c.d.p, c.h.data(), c.d.bytes, cudaMemcpyHostToDevice), "upload cache");
    const auto after = run(a, ov);
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t j = 0; j < static_cast<std::size_t>(s_q); ++j) {
        const auto first = before.begin() + ((b * s_q + j) * 32) * DC, first2 = after.begin() + ((b * s_q + j) * 32) * DC;
        const bool same = std::equal(first, first + 32 * DC, first2);
        CAPTURE(splits, b, j);
        if (j < static_cast<std::size_t>(P)) CHECK(same);
        if (j == static_cast<std::size_t>(s_q - 1)) CHECK_FALSE(same);
      }
  }
}

TEST_CASE("mla decode precision rule: automatic is accurate for s_q = 1 and fast for s_q > 1, the same bits as the "
          "named precision; fast with s_q = 1 reads the bf16 query alone", "[gpu][mla]") {
  CHECK(kernels::mla_decode_precision_rule(1) == kernels::MlaDecodePrecision::accurate);
  for (int s_q : {2, 3, 4}) CHECK(kernels::mla_decode_precision_rule(s_q) == kernels::MlaDecodePrecision::fast);
  const std::size_t N = 3000;
  const Cache c(1, N, DC, fresh_seed());
  for (std::size_t s_q : {1, 2, 4}) {
    const Query q(1, 32, kSigma, fresh_seed(), s_q);
    auto automatic = args_of(c, q, N, kScale);
    if (s_q > 1) automatic.q_lo = nullptr;  // fast reads q_hi alone
    auto named = automatic;
    named.precision = s_q == 1 ? kernels::MlaDecodePrecision::accurate : kernels::MlaDecodePrecision::fast;
    CAPTURE(s_q);
    CHECK(kernels::mla_decode_plan(automatic).precision == named.precision);
    CHECK(run(automatic) == run(named));
  }
  // s_q = 1 fast against accurate on the same query: both near the truth, fast within its own budget only
  const Query q(1, 32, kSigma, fresh_seed());
  const auto ref = truth_rows(c, q, 0, all_heads(32), N, kScale);
  const auto m_acc = compare_rows(run(args_of(c, q, N, kScale)), ref, 32, 0, all_heads(32));
  const auto m_fast = compare_rows(run(fast_args_of(c, q, N, kScale)), ref, 32, 0, all_heads(32));
  std::printf("mla decode N=3000 s_q=1: accurate rel_rms %.3e, fast %.3e\n", m_acc.rel_rms, m_fast.rel_rms);
  CAPTURE(m_acc.rel_rms, m_fast.rel_rms);
  REQUIRE(m_acc.nan_count + m_fast.nan_count == 0);
  CHECK(m_acc.rel_rms <= tol::mla_decode_goal.value);
  CHECK(m_fast.rel_rms <= tol::mla_decode_fast.value);
  CHECK(m_acc.rel_rms < m_fast.rel_rms);
}

TEST_CASE("mla decode, multi-token: bad s_q, precision, q_lo, max_len, query strides and workspace give clear errors "
          "naming the argument before any launch", "[gpu][mla]") {
  const Cache c(1, 100, DC, fresh_seed());
  const Query q(1, 32, kSigma, fresh_seed(), 2);
  DevBuf out(2 * 32 * DC * 4), ws(1 << 23);
  auto good = fast_args_of(c, q, 100, kScale);
  good.out = out.as<float>();
  good.workspace = ws.p;
  good.workspace_bytes = ws.bytes;
  REQUIRE(decode_error(good).empty());
  cuda_check(cudaDeviceSynchronize(), "good");
  auto bad = good;
  bad.s_q = 0;
  CHECK(has(decode_error(bad), "s_q = 0"));
  bad.s_q = 5;
  CHECK(has(decode_error(bad), "s_q = 5"));
  bad = good;
  bad.precision = kernels::MlaDecodePrecision::accurate;  // accurate runs one token
  CHECK(has(decode_error(bad), "precision = accurate with s_q = 2"));
  bad = good;
  bad.precision = static_cast<kernels::MlaDecodePrecision>(7);
  CHECK(has(decode_error(bad), "precision = 7"));
  bad = good;
  bad.q_lo = q.lo.as<bf16_t>();  // fast reads the bf16 query alone
  CHECK(has(decode_error(bad), "'q_lo'"));
  bad.precision = kernels::MlaDecodePrecision::automatic;  // automatic with s_q = 2 is fast
  CHECK(has(decode_error(bad), "'q_lo'"));
  bad = good;
  bad.max_len = 1;  // < s_q
  CHECK(has(decode_error(bad), "max_len = 1"));
  bad = good;
  bad.sq_t = 32 * DC - 2;
  CHECK(has(decode_error(bad), "sq_t = "));
  bad.sq_t = 32 * DC + 1;
  CHECK(has(decode_error(bad), "sq_t = "));
  bad = good;
  bad.sq_b = 32 * DC;  // one token's rows: the second would overlap the next sequence
  CHECK(has(decode_error(bad), "sq_b = "));
  bad = good;
  auto one = good;
  one.s_q = 1;
  bad.workspace_bytes = kernels::mla_decode_workspace_bytes(one);  // sized for one token, not two
  CHECK(has(decode_error(bad), "workspace_bytes"));
  kernels::MlaDecodeOverrides ov;
  ov.p_hi_only = true;  // an ablation of the accurate precision's P_lo rows
  CHECK(has(decode_error(good, &ov), "p_hi_only"));
  const Query q1(1, 32, kSigma, fresh_seed());
  auto accurate = args_of(c, q1, 100, kScale);
  accurate.q_lo = nullptr;  // accurate needs the lo part
  accurate.out = out.as<float>();
  accurate.workspace = ws.p;
  accurate.workspace_bytes = ws.bytes;
  CHECK(has(decode_error(accurate), "'q_lo'"));
  cuda_check(cudaDeviceSynchronize(), "after bad inputs");
}

TEST_CASE("mla decode plan, multi-token: row groups, workspace per (sequence, slice, token, head), one wave at B = 1",
          "[gpu][mla]") {
  int dev = 0, sms = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  for (int H : {16, 32})
    for (int s_q : {1, 2, 3, 4})
      for (int N : {65536, 1 << 20}) {
        kernels::MlaDecodeArgs a;
        a.B = 1;
        a.H = H;
        a.s_q = s_q;
        a.precision = kernels::MlaDecodePrecision::fast;
        a.capacity = a.max_len = N;
        const auto pl = kernels::mla_decode_plan(a);
        const int ctas = pl.num_splits * pl.row_groups;
        std::printf("mla decode plan fast H=%d s_q=%d N=%d: %d splits of %d tokens x %d row groups (%d CTAs on %d SMs)\n",
                    H, s_q, N, pl.num_splits, pl.split_len, pl.row_groups, ctas, sms);
        CAPTURE(H, s_q, N, pl.num_splits, pl.row_groups);
        CHECK(pl.row_groups == (s_q * H > 64 ? 2 : 1));
        CHECK(ctas <= sms);
        CHECK(ctas >= sms * 9 / 10);
        CHECK(static_cast<long long>(pl.num_splits) * pl.split_len >= N);
        CHECK(kernels::mla_decode_workspace_bytes(a) ==
              static_cast<std::size_t>(pl.num_splits) * s_q * H * (DC + 2) * 4);
      }
}
