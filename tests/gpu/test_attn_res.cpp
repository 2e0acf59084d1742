// Block Attention Residuals kernel (kernels/attn_res.hpp) against reference/attn_res.hpp in float64 on
// the same bf16 sources and fp32 pseudo-query; fresh seeded inputs (never zeros), outputs poisoned (NaN)
// before every run. Runs only where the CUDA kernels are built (ctest label gpu).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
// g++ 12 at -O3 reports -Wuse-after-free inside Eigen's aligned_free when SoftmaxPartial::merge
// (reference/attn_res.hpp) is inlined into a test: a false positive of its middle end (the same family as
// the Boost -Warray-bounds one CMakeLists.txt already keeps a warning). Set before Eigen is included.
#pragma GCC diagnostic ignored "-Wuse-after-free"
#endif
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attn_res.hpp"
#include "kernels/attn_res_limits.hpp"
#include "numerics/metrics.hpp"
#include "numerics/tolerance.hpp"
#include "reference/attn_res.hpp"
#include "tests/catch.hpp"
#include "tests/gpu/kda_gpu_util.hpp"

using namespace kdalab;
using namespace kda_gpu;

namespace {

std::uint64_t fresh_seed() {
  static std::uint64_t s = 20261129 + 7700;
  return ++s;
}

/// S sources [S, T, d] (bf16-rounded, source i scaled by its own sigma so that the RMSNorm matters),
/// stored with token stride s_tok >= d and source stride s_src >= T s_tok; host copy in double.
struct Sources {
  std::size_t S, T, d, s_tok, s_src;
  std::vector<double> h;  // [S, T, d] dense
  DevBuf dev;
  Sources(std::size_t S_, std::size_t T_, std::size_t d_, std::uint64_t seed, std::size_t pad_tok = 0,
          std::size_t pad_src = 0)
      : S(S_), T(T_), d(d_), s_tok(d_ + pad_tok), s_src(T_ * (d_ + pad_tok) + pad_src), h(S_ * T_ * d_),
        dev(S_ * (T_ * (d_ + pad_tok) + pad_src) * 2) {
    Rng rng(seed);
    std::vector<bf16_t> bits(S * s_src, bf16_bits(round_bf16(7.0)));  // padding: finite, never read
    for (std::size_t i = 0; i < S; ++i) {
      const double sigma = 0.5 + 2.0 * rng.uniform();
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t k = 0; k < d; ++k) {
          const double x = round_bf16(sigma * rng.normal() + 0.1 * sigma);
          h[(i * T + t) * d + k] = x;
          bits[i * s_src + t * s_tok + k] = bf16_bits(x);
        }
    }
    cuda_check(cudaMemcpy(dev.p, bits.data(), dev.bytes, cudaMemcpyHostToDevice), "upload sources");
  }
  /// Every source of every token = one random row (identical keys).
  void make_identical(std::uint64_t seed) {
    Rng rng(seed);
    std::vector<double> r(d);
    for (auto& x : r) x = round_bf16(rng.normal());
    std::vector<bf16_t> bits(S * s_src, 0);
    for (std::size_t i = 0; i < S; ++i)
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t k = 0; k < d; ++k) {
          h[(i * T + t) * d + k] = r[k];
          bits[i * s_src + t * s_tok + k] = bf16_bits(r[k]);
        }
    cuda_check(cudaMemcpy(dev.p, bits.data(), dev.bytes, cudaMemcpyHostToDevice), "upload sources");
  }
  Vec<double> row(std::size_t i, std::size_t t) const {
    Vec<double> v(d);
    for (std::size_t k = 0; k < d; ++k) v(k) = h[(i * T + t) * d + k];
    return v;
  }
};

/// Pseudo-query w [d] ~ sigma N(0, 1), rounded to fp32 (what the kernel reads), on the device.
struct Query {
  Vec<double> w;
  DevBuf dev;
  Query(std::size_t d, double sigma, std::uint64_t seed) : w(d), dev(d * 4) {
    Rng rng(seed);
    std::vector<float> f(d);
    for (std::size_t k = 0; k < d; ++k) {
      f[k] = static_cast<float>(sigma * rng.normal());
      w(k) = f[k];
    }
    cuda_check(cudaMemcpy(dev.p, f.data(), dev.bytes, cudaMemcpyHostToDevice), "upload w");
  }
};

kernels::AttnResArgs args_of(const Sources& s, const Query& q, double eps) {
  kernels::AttnResArgs a;
  a.T = static_cast<int>(s.T);
  a.S = static_cast<int>(s.S);
  a.d = static_cast<int>(s.d);
  a.src = s.dev.as<bf16_t>();
  a.s_tok = static_cast<std::int64_t>(s.s_tok);
  a.s_src = static_cast<std::int64_t>(s.s_src);
  a.w = q.dev.as<float>();
  a.eps = static_cast<float>(eps);
  return a;
}

/// float64 truth [T, d]: attn_res_full over the S sources of each token.
std::vector<double> truth_full(const Sources& s, const Query& q, double eps) {
  std::vector<double> r(s.T * s.d);
  for (std::size_t t = 0; t < s.T; ++t) {
    std::vector<Vec<double>> src;
    for (std::size_t i = 0; i < s.S; ++i) src.push_back(s.row(i, t));
    const Vec<double> h = attn_res_full<double>(q.w, src, eps);
    for (std::size_t k = 0; k < s.d; ++k) r[t * s.d + k] = h(k);
  }
  return r;
}

struct Outs {
  std::vector<double> bf16, f32;
};

/// Runs the kernel with both outputs (poisoned first) and downloads them.
Outs run(kernels::AttnResArgs a) {
  const std::size_t n = static_cast<std::size_t>(a.T) * a.d;
  DevBuf ob(n * 2), of(n * 4);
  ob.poison();
  of.poison();
  a.out = ob.as<bf16_t>();
  a.out_f32 = of.as<float>();
  kernels::attn_res(a, nullptr);
  cuda_check(cudaDeviceSynchronize(), "attn_res");
  return {download_bf16(ob), download_f32(of)};
}

const double kEps = 1e-6;

}  // namespace

TEST_CASE("attn_res: full form over S sources vs float64 (bf16 and fp32 outputs)", "[gpu][attn_res]") {
  struct Case { std::size_t S, T, d; };
  for (const Case c : {Case{1, 17, 7168}, Case{2, 1, 7168}, Case{9, 300, 7168}, Case{10, 16, 7168}, Case{9, 15, 2304},
                       Case{5, 33, 8}, Case{3, 7, 64}, Case{9, 4, 16384}, Case{4, 5, 1000}}) {
    const Sources s(c.S, c.T, c.d, fresh_seed());
    const Query q(c.d, 1.0 / std::sqrt(static_cast<double>(c.d)) * 3.0, fresh_seed());  // logits ~ 3 N(0,1)
    const auto o = run(args_of(s, q, kEps));
    const auto ref = truth_full(s, q, kEps);
    const auto mb = compare(o.bf16, ref), mf = compare(o.f32, ref);
    std::printf("attn_res full S=%zu T=%zu d=%zu: bf16 out rel_rms %.3e, fp32 out rel_rms %.3e\n", c.S, c.T, c.d,
                mb.rel_rms, mf.rel_rms);
    CAPTURE(c.S, c.T, c.d, mb.rel_rms, mf.rel_rms);
    REQUIRE(mb.nan_count + mb.inf_count + mf.nan_count + mf.inf_count == 0);
    CHECK(mb.rel_rms <= tol::attn_res_bf16.value);
    CHECK(mf.rel_rms <= tol::attn_res_f32.value);
  }
}

TEST_CASE("attn_res: padded strides (s_tok > d, s_src > T s_tok) give the same result", "[gpu][attn_res]") {
  const Sources s(9, 20, 2304, fresh_seed(), 16, 64);
  const Query q(2304, 0.06, fresh_seed());
  const auto o = run(args_of(s, q, kEps));
  const auto mf = compare(o.f32, truth_full(s, q, kEps));
  std::printf("attn_res strided S=9 T=20 d=2304 (s_tok = d + 16, s_src = T s_tok + 64): fp32 rel_rms %.3e\n", mf.rel_rms);
  REQUIRE(mf.nan_count == 0);
  CHECK(mf.rel_rms <= tol::attn_res_f32.value);
}

TEST_CASE("attn_res: block form == reference, as one call and as inter-block partial + merge", "[gpu][attn_res]") {
  // sources 0..7: the completed blocks b_0 .. b_7; source 8: the current block's partial sum b_8^{i-1}
  const std::size_t n = 8, T = 37, d = 7168;
  const Sources s(n + 1, T, d, fresh_seed());
  const Query q(d, 3.0 / std::sqrt(static_cast<double>(d)), fresh_seed());
  std::vector<double> ref(T * d);
  for (std::size_t t = 0; t < T; ++t) {
    std::vector<Vec<double>> b;
    for (std::size_t i = 0; i < n; ++i) b.push_back(s.row(i, t));
    const Vec<double> p = s.row(n, t);
    const Vec<double> h = attn_res_block<double>(q.w, b, &p, kEps);
    for (std::size_t k = 0; k < d; ++k) ref[t * d + k] = h(k);
  }
  // one call over the 9 sources
  const auto o1 = run(args_of(s, q, kEps));
  const auto m1 = compare(o1.f32, ref);
  // call 1: the inter-block partial (m, l, acc) over the 8 completed blocks
  DevBuf m(T * 4), l(T * 4), acc(T * d * 4);
  m.poison();
  l.poison();
  acc.poison();
  auto a1 = args_of(s, q, kEps);
  a1.S = static_cast<int>(n);
  a1.partial_out = {m.as<float>(), l.as<float>(), acc.as<float>()};
  kernels::attn_res(a1, nullptr);
  // call 2: the partial sum as the one source, merged with the inter-block partial
  auto a2 = args_of(s, q, kEps);
  a2.S = 1;
  a2.src = s.dev.as<bf16_t>() + n * s.s_src;
  a2.partial_in = a1.partial_out;
  const auto o2 = run(a2);
  const auto mb = compare(o2.bf16, ref), mf = compare(o2.f32, ref);
  std::printf("attn_res block (8 blocks + partial sum, T=37, d=7168): one call fp32 %.3e; partial + merge: bf16 %.3e, "
              "fp32 %.3e\n", m1.rel_rms, mb.rel_rms, mf.rel_rms);
  REQUIRE(m1.nan_count + mb.nan_count + mf.nan_count == 0);
  CHECK(m1.rel_rms <= tol::attn_res_f32.value);
  CHECK(mb.rel_rms <= tol::attn_res_bf16.value);
  CHECK(mf.rel_rms <= tol::attn_res_f32.value);

  // call 2 again with partial_out aliasing partial_in (merged partial written in place): acc / l == ref
  auto a3 = a2;
  a3.partial_out = a1.partial_out;
  kernels::attn_res(a3, nullptr);
  cuda_check(cudaDeviceSynchronize(), "attn_res in place");
  const auto hl = download_f32(l), ha = download_f32(acc);
  std::vector<double> merged(T * d);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t k = 0; k < d; ++k) merged[t * d + k] = ha[t * d + k] / hl[t];
  const auto mm = compare(merged, ref);
  std::printf("attn_res block, merged partial written in place (acc / l): %.3e\n", mm.rel_rms);
  REQUIRE(mm.nan_count == 0);
  CHECK(mm.rel_rms <= tol::attn_res_f32.value);
}

TEST_CASE("attn_res: any tokens per CTA gives the output of one token per CTA, bit for bit", "[gpu][attn_res]") {
  // a CTA's ring of source rows runs on across its tokens: S = 9 and 10 (the ring of 3 wraps mid-token), d = 2304 and
  // 7168, strided sources, and the block form's partial in and out (written in place over partial_in)
  struct Case { std::size_t S, T, d, pad_tok, pad_src; };
  for (const Case c : {Case{9, 301, 2304, 16, 64}, Case{10, 37, 7168, 0, 0}, Case{1, 50, 64, 0, 0}}) {
    const Sources s(c.S, c.T, c.d, fresh_seed(), c.pad_tok, c.pad_src);
    const Query q(c.d, 3.0 / std::sqrt(static_cast<double>(c.d)), fresh_seed());
    auto a = args_of(s, q, kEps);
    a.tokens_per_cta = 1;
    const auto one = run(a);
    REQUIRE(compare(one.f32, truth_full(s, q, kEps)).nan_count == 0);
    for (int tpc : {0, 2, 3, 7, static_cast<int>(c.T)}) {
      a.tokens_per_cta = tpc;
      const auto o = run(a);
      std::printf("attn_res S=%zu T=%zu d=%zu, %d tokens per CTA (0: the rule): identical to one per CTA: %s\n", c.S,
                  c.T, c.d, tpc, o.f32 == one.f32 && o.bf16 == one.bf16 ? "yes" : "no");
      CAPTURE(c.S, c.T, c.d, tpc);
      CHECK(o.f32 == one.f32);
      CHECK(o.bf16 == one.bf16);
    }
    // partial out, then merged again in place with partial_out == partial_in, at 3 tokens per CTA against 1
    std::vector<std::vector<double>> merged;
    for (int tpc : {1, 3}) {
      DevBuf m(c.T * 4), l(c.T * 4), acc(c.T * c.d * 4);
      auto p1 = args_of(s, q, kEps);
      p1.tokens_per_cta = tpc;
      p1.partial_out = {m.as<float>(), l.as<float>(), acc.as<float>()};
      kernels::attn_res(p1, nullptr);
      auto p2 = p1;
      p2.S = 1;
      p2.partial_in = p1.partial_out;
      kernels::attn_res(p2, nullptr);
      cuda_check(cudaDeviceSynchronize(), "attn_res partial in place");
      auto v = download_f32(acc);
      const auto hl = download_f32(l);
      v.insert(v.end(), hl.begin(), hl.end());
      merged.push_back(v);
    }
    CHECK(merged[0] == merged[1]);
  }
  std::printf("attn_res tokens per CTA by the rule: T = 8192 over 1188 resident CTAs -> %d, over 396 -> %d, T = 37 -> %d\n",
              kernels::attn_res_tokens_per_cta(8192, 1188), kernels::attn_res_tokens_per_cta(8192, 396),
              kernels::attn_res_tokens_per_cta(37, 396));
  CHECK(kernels::attn_res_tokens_per_cta(8192, 1188) == 3);
  CHECK(kernels::attn_res_tokens_per_cta(8192, 396) == 4);
  CHECK(kernels::attn_res_tokens_per_cta(37, 396) == 1);
}

TEST_CASE("attn_res: any ring depth (2 .. 8) gives the output of the rule's ring of 3, bit for bit",
          "[gpu][attn_res]") {
  // the depth only changes which row buffer a source lands in and when it is copied, never a sum's order. d = 2304: the
  // one-token form (the rule's one token a CTA), d = 7168 also with 3 tokens a CTA (the ring running on across tokens,
  // S = 9 wrapping mid-token at every depth); T = 1: one CTA; S = 2: fewer sources than row buffers. Depth 3 runs the
  // rule's kernels, the others the kernels of a run-time depth
  struct Case { std::size_t S, T, d; int tpc; };
  for (const Case c : {Case{9, 300, 2304, 0}, Case{9, 1, 2304, 0}, Case{9, 300, 2304, 3}, Case{9, 300, 7168, 0},
                       Case{9, 300, 7168, 3}, Case{9, 1, 7168, 0}, Case{9, 1, 7168, 3}, Case{2, 37, 2304, 0},
                       Case{2, 37, 7168, 3}}) {
    const Sources s(c.S, c.T, c.d, fresh_seed());
    const Query q(c.d, 3.0 / std::sqrt(static_cast<double>(c.d)), fresh_seed());
    auto a = args_of(s, q, kEps);
    a.tokens_per_cta = c.tpc;
    const auto rule = run(a);  // ring_depth 0: the rule's 3
    const auto m = compare(rule.f32, truth_full(s, q, kEps));
    CAPTURE(c.S, c.T, c.d, c.tpc, m.rel_rms);
    REQUIRE(m.nan_count + m.inf_count == 0);
    CHECK(m.rel_rms <= tol::attn_res_f32.value);
    for (int depth : {2, 3, 4, 5, 8}) {
      a.ring_depth = depth;
      const auto o = run(a);
      std::printf("attn_res S=%zu T=%zu d=%zu, %d tokens per CTA (0: the rule), a ring of %d: identical to the rule's "
                  "ring: %s\n", c.S, c.T, c.d, c.tpc, depth, o.f32 == rule.f32 && o.bf16 == rule.bf16 ? "yes" : "no");
      CAPTURE(depth);
      CHECK(o.f32 == rule.f32);
      CHECK(o.bf16 == rule.bf16);
    }
  }
  // the deepest ring that fits at the largest d: 5 rows at d = 16384, 4 d + 2 d 5 = 224 KB of the 227 KB a CTA may take
  // (its 640 static bytes besides)
  for (int tpc : {0, 2}) {
    const Sources s(9, 4, 16384, fresh_seed());
    const Query q(16384, 3.0 / 128.0, fresh_seed());
    auto a = args_of(s, q, kEps);
    a.tokens_per_cta = tpc;
    const auto rule = run(a);
    REQUIRE(compare(rule.f32, truth_full(s, q, kEps)).nan_count == 0);
    a.ring_depth = 5;
    const auto o = run(a);
    std::printf("attn_res S=9 T=4 d=16384, %d tokens per CTA, a ring of 5: identical to the rule's ring: %s\n", tpc,
                o.f32 == rule.f32 && o.bf16 == rule.bf16 ? "yes" : "no");
    CAPTURE(tpc);
    CHECK(o.f32 == rule.f32);
    CHECK(o.bf16 == rule.bf16);
  }
}

TEST_CASE("attn_res: any vectors per thread is within the float64 budget, with the same bits at any tokens per CTA "
          "and ring depth", "[gpu][attn_res]") {
  // the count of 16-byte vectors a thread owns sets the CTA's width (d = 2304: 5 warps at the rule's 2, 2 warps at 5, a
  // 64-thread CTA with one warp of 4 live lanes at 8) and so which elements each partial sum holds: against float64
  // every count meets the budget; for one count the tokens a CTA and the ring's depth change no bit
  struct Case { std::size_t S, T, d; };
  for (const Case c : {Case{9, 301, 2304}, Case{10, 37, 7168}, Case{3, 20, 1000}}) {
    const Sources s(c.S, c.T, c.d, fresh_seed(), 16, 64);
    const Query q(c.d, 3.0 / std::sqrt(static_cast<double>(c.d)), fresh_seed());
    const auto ref = truth_full(s, q, kEps);
    const int vrule = kernels::attn_res_vectors_per_thread_rule(static_cast<int>(c.d));
    for (int v = vrule; v <= kernels::attn_res_max_vpt; ++v) {
      auto a = args_of(s, q, kEps);
      a.vectors_per_thread = v;
      a.tokens_per_cta = 1;
      const auto one = run(a);
      const auto mb = compare(one.bf16, ref), mf = compare(one.f32, ref);
      bool same = true;
      for (const auto& [tpc, depth] : {std::pair{0, 0}, std::pair{3, 0}, std::pair{1, 5}, std::pair{3, 4}}) {
        a.tokens_per_cta = tpc;
        a.ring_depth = depth;
        const auto o = run(a);
        CAPTURE(c.S, c.T, c.d, v, tpc, depth);
        CHECK(o.f32 == one.f32);
        CHECK(o.bf16 == one.bf16);
        same = same && o.f32 == one.f32 && o.bf16 == one.bf16;
      }
      std::printf("attn_res S=%zu T=%zu d=%zu, %d vectors a thread: bf16 out rel_rms %.3e, fp32 out rel_rms %.3e; "
                  "the same bits at other tokens per CTA and ring depths: %s\n", c.S, c.T, c.d, v, mb.rel_rms, mf.rel_rms,
                  same ? "yes" : "no");
      CAPTURE(c.S, c.T, c.d, v, mb.rel_rms, mf.rel_rms);
      REQUIRE(mb.nan_count + mb.inf_count + mf.nan_count + mf.inf_count == 0);
      CHECK(mb.rel_rms <= tol::attn_res_bf16.value);
      CHECK(mf.rel_rms <= tol::attn_res_f32.value);
    }
  }
}

TEST_CASE("attn_res: w = 0 gives the uniform average; identical sources give the source", "[gpu][attn_res]") {
  {
    const Sources s(9, 11, 7168, fresh_seed());
    const Query q(7168, 0.0, fresh_seed());  // sigma 0: w = 0 exactly
    const auto o = run(args_of(s, q, kEps));
    std::vector<double> avg(s.T * s.d, 0.0);
    for (std::size_t i = 0; i < s.S; ++i)
      for (std::size_t j = 0; j < s.T * s.d; ++j) avg[j] += s.h[i * s.T * s.d + j] / static_cast<double>(s.S);
    const auto mf = compare(o.f32, avg);
    std::printf("attn_res w = 0 vs the uniform average: fp32 rel_rms %.3e\n", mf.rel_rms);
    REQUIRE(mf.nan_count == 0);
    CHECK(mf.rel_rms <= tol::attn_res_f32.value);
  }
  for (double sigma : {0.05, 1000.0}) {
    Sources s(9, 13, 7168, fresh_seed());
    s.make_identical(fresh_seed());
    const Query q(7168, sigma, fresh_seed());
    const auto o = run(args_of(s, q, kEps));
    const auto mf = compare(o.f32, std::vector<double>(s.h.begin(), s.h.begin() + s.T * s.d));
    std::printf("attn_res identical sources, w sigma=%g: fp32 rel_rms %.3e\n", sigma, mf.rel_rms);
    REQUIRE(mf.nan_count + mf.inf_count == 0);
    CHECK(mf.rel_rms <= tol::attn_res_f32.value);
  }
}

TEST_CASE("attn_res: very large logits (|z| ~ 1e5) give no NaN and the reference's near one-hot mix", "[gpu][attn_res]") {
  const Sources s(9, 21, 7168, fresh_seed());
  const Query q(7168, 1000.0, fresh_seed());
  const auto o = run(args_of(s, q, kEps));
  const auto ref = truth_full(s, q, kEps);
  const auto mb = compare(o.bf16, ref), mf = compare(o.f32, ref);
  std::printf("attn_res large logits: bf16 %.3e, fp32 %.3e\n", mb.rel_rms, mf.rel_rms);
  REQUIRE(mb.nan_count + mb.inf_count + mf.nan_count + mf.inf_count == 0);
  CHECK(mb.rel_rms <= tol::attn_res_bf16.value);
}

TEST_CASE("attn_res: bad inputs give clear errors before any launch", "[gpu][attn_res]") {
  const Sources s(3, 4, 64, fresh_seed());
  const Query q(64, 0.1, fresh_seed());
  DevBuf out(4 * 64 * 4);
  auto good = args_of(s, q, kEps);
  good.out_f32 = out.as<float>();
  REQUIRE_NOTHROW(kernels::attn_res(good, nullptr));
  cuda_check(cudaDeviceSynchronize(), "good");
  // says: what the message must hold, where a case checks it
  auto expect_error = [&](kernels::AttnResArgs bad, const char* what, const std::string& says = "") {
    bool threw = false;
    try {
      kernels::attn_res(bad, nullptr);
    } catch (const Error& e) {
      threw = true;
      std::printf("attn_res bad input (%s): %s\n", what, e.what());
      CAPTURE(what, e.what(), says);
      CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
    CHECK(threw);
  };
  auto bad = good; bad.T = 0; expect_error(bad, "T = 0");
  bad = good; bad.S = 0; expect_error(bad, "S = 0");
  bad = good; bad.d = 60; expect_error(bad, "d not a multiple of 8");
  bad = good; bad.d = 16392; expect_error(bad, "d too large");
  bad = good; bad.src = nullptr; expect_error(bad, "src null");
  bad = good; bad.src = good.src + 1; expect_error(bad, "src misaligned");
  bad = good; bad.w = nullptr; expect_error(bad, "w null");
  bad = good; bad.out_f32 = nullptr; expect_error(bad, "no output");
  bad = good; bad.s_tok = 32; expect_error(bad, "s_tok < d");
  bad = good; bad.tokens_per_cta = -1; expect_error(bad, "tokens_per_cta < 0");
  for (int depth : {1, 9, -1}) {
    bad = good;
    bad.ring_depth = depth;
    expect_error(bad, "ring_depth not 0 or 2 .. 8",
                 "ring_depth = " + std::to_string(depth) + "; accepted: 0 (the rule: 3 row buffers) or 2 .. 8");
  }
  // 4 d + 2 d 6 = 256 KB of shared memory at d = 16384 (5 rows fit); refused before any launch, so the d = 64 buffers
  // are never read
  bad = good; bad.d = 16384; bad.s_tok = 0; bad.s_src = 0; bad.ring_depth = 6;
  expect_error(bad, "ring_depth 6 at d = 16384", "ring_depth = 6 with d = 16384 needs 262144 bytes");
  for (int v : {-1, 9}) {
    bad = good;
    bad.vectors_per_thread = v;
    expect_error(bad, "vectors_per_thread outside 1 .. 8 at d = 64",
                 "vectors_per_thread = " + std::to_string(v) + " with d = 64; accepted: 0 (the rule: 1) or 1 .. 8");
  }
  // d = 7168 has 896 vectors: 256 threads need 4 each; refused before any launch, so the d = 64 buffers are never read
  bad = good; bad.d = 7168; bad.s_tok = 0; bad.s_src = 0; bad.vectors_per_thread = 3;
  expect_error(bad, "vectors_per_thread 3 at d = 7168", "vectors_per_thread = 3 with d = 7168; accepted: 0 (the rule: 4) or 4 .. 8");
  bad = good; bad.s_src = 12; expect_error(bad, "s_src not a multiple of 8");
  bad = good; bad.eps = -1.0f; expect_error(bad, "eps < 0");
  bad = good; bad.partial_in.m = out.as<float>(); expect_error(bad, "partial_in with 1 of 3 pointers");
  cuda_check(cudaDeviceSynchronize(), "after bad inputs");
}
