#pragma once
/// Seeded, portable random inputs, reproducible across machines (docs/design.md, conventions).
///
/// Engine: boost::random::mt19937_64; distributions: Boost's normal_distribution and
/// uniform_real_distribution (std:: distributions differ between standard libraries). One seed
/// gives bit-identical inputs on Debian 12 (Boost 1.74) and Ubuntu 24.04 (Boost 1.83); the test
/// tests/numerics/test_random.cpp pins a checksum of the first values.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>

#include "numerics/bf16.hpp"
#include "reference/scalar.hpp"
#include "reference/tensor.hpp"

namespace kdalab {

/// A seeded generator of doubles. normal(): N(0,1); uniform(a, b): U[a, b).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : eng_(seed) {}
  double normal() { return nd_(eng_); }
  double uniform(double a = 0.0, double b = 1.0) {
    return boost::random::uniform_real_distribution<double>(a, b)(eng_);
  }
  /// Fills t with N(0, sigma^2) draws in row-major order, rounded to `fmt` (fp64: unrounded).
  void fill_normal(Tensor<double>& t, double sigma = 1.0, Format fmt = Format::fp64) {
    for (auto& x : t.data) x = round_to(sigma * normal(), fmt);
  }
  void fill_uniform(Tensor<double>& t, double a, double b, Format fmt = Format::fp64) {
    for (auto& x : t.data) x = round_to(uniform(a, b), fmt);
  }
  boost::random::mt19937_64& engine() { return eng_; }

 private:
  boost::random::mt19937_64 eng_;
  boost::random::normal_distribution<double> nd_{0.0, 1.0};
};

/// FNV-1a 64-bit hash of `n` bytes at `p`, continuing from `h` (the FNV offset basis for a fresh hash).
inline std::uint64_t fnv1a64_bytes(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) { h ^= b[i]; h *= 1099511628211ull; }
  return h;
}

/// FNV-1a 64-bit hash of the IEEE bit patterns of a sequence of doubles (checksums of inputs).
inline std::uint64_t fnv1a64(const std::vector<double>& xs) { return fnv1a64_bytes(xs.data(), xs.size() * sizeof(double)); }

/// The seed of one cell of an experiment's grid: a function of the run's --seed and of `cell`, a text naming the
/// cell's own parameters and nothing else (e.g. "recall keys=random d_k=16 N=16"), so that a cell's random inputs,
/// and so its numbers, are the same in every grid that holds it (a researcher re-running one cell of a figure gets
/// the figure's number; grids drawn from one stream shifted every later cell when a cell was added or removed).
/// Two cells that must not share inputs need different texts; give numbers as integers or in fmt's shortest "{}" form
/// (the same text on every platform). Mixing: FNV-1a of the text, then SplitMix64 (Steele, Lea, Flood 2014) of the
/// seed and the hash, so nearby seeds or texts give unrelated mt19937_64 seeds. Never throws.
inline std::uint64_t cell_seed(std::uint64_t seed, const std::string& cell) {
  auto splitmix64 = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  return splitmix64(splitmix64(seed) ^ fnv1a64_bytes(cell.data(), cell.size()));
}

/// Inputs of one KDA problem, in float64 holding exactly the values every implementation sees.
///
/// Shapes: q_raw, k_raw, q, k: [B, T, H, d_k]; g_raw, g: [B, T, HV, d_k]; v: [B, T, HV, d_v];
/// beta_raw, beta: [B, T, HV]; A_log: [HV]; bias: [HV, d_k]; S0: [B, HV, d_k, d_v] (K3 report Eq. 1 orientation,
/// "KV" layout). Raw tensors are what a kernel reads (bf16 values); q, k, g, beta are derived in
/// float64 from them: g = g_min Sigmoid(exp(A_log) (g_raw + bias)) (K3 report Eq. 5),
/// beta = Sigmoid(beta_raw), q, k L2-normalised per head (no eps: the truth is exact).
struct KdaInputs {
  std::size_t B = 0, T = 0, H = 0, HV = 0, d_k = 0, d_v = 0;
  double g_min = -5.0, scale = 0.0;
  std::uint64_t seed = 0;
  std::string generator;
  Tensor<double> q_raw, k_raw, v, g_raw, beta_raw, A_log, bias, S0;
  Tensor<double> q, k, g, beta;
};

/// Derives q, k, g, beta of `in` from its raw tensors (float64, see KdaInputs).
inline void derive_kda(KdaInputs& in) {
  in.q = in.q_raw;
  in.k = in.k_raw;
  for (Tensor<double>* t : {&in.q, &in.k}) {
    for (std::size_t row = 0; row < t->numel() / in.d_k; ++row) {
      double n2 = 0;
      for (std::size_t i = 0; i < in.d_k; ++i) n2 += t->data[row * in.d_k + i] * t->data[row * in.d_k + i];
      const double inv = n2 > 0 ? 1.0 / std::sqrt(n2) : 0.0;
      for (std::size_t i = 0; i < in.d_k; ++i) t->data[row * in.d_k + i] *= inv;
    }
  }
  in.g = Tensor<double>(in.g_raw.shape);
  for (std::size_t b = 0; b < in.B; ++b)
    for (std::size_t t = 0; t < in.T; ++t)
      for (std::size_t h = 0; h < in.HV; ++h)
        for (std::size_t i = 0; i < in.d_k; ++i)
          in.g(b, t, h, i) = in.g_min * sigmoid<double>(std::exp(in.A_log(h)) * (in.g_raw(b, t, h, i) + in.bias(h, i)));
  in.beta = Tensor<double>(in.beta_raw.shape);
  for (std::size_t i = 0; i < in.beta.numel(); ++i) in.beta.data[i] = sigmoid<double>(in.beta_raw.data[i]);
}

/// The "anchor-kda" distribution, as one named generator: the inputs on which the KDA kernels' accuracy
/// goal and the peers' errors are measured (numerics/tolerance.hpp).
///
/// Draw order (fixed; changing it changes every golden number): q_raw, k_raw, v, g_raw
/// (each N(0,1) rounded to bf16, row-major), beta_raw (N(0,1), bf16), A_log ~ U(0,1) per head,
/// bias ~ U(0,1) per (head, channel), S0 = 0.1 N(0,1) rounded to fp32. d_k = d_v = D, HV = H,
/// g_min = -5, scale = D^-1/2.
/// Errors: kdalab::Error if any of B, T, H, D is 0.
inline KdaInputs anchor_kda(std::size_t B, std::size_t T, std::size_t H, std::size_t D, std::uint64_t seed) {
  require(B > 0 && T > 0 && H > 0 && D > 0,
          "anchor-kda: B, T, H, D must all be >= 1 (got B=" + std::to_string(B) + ", T=" + std::to_string(T) +
              ", H=" + std::to_string(H) + ", D=" + std::to_string(D) + ")");
  KdaInputs in;
  in.B = B; in.T = T; in.H = H; in.HV = H; in.d_k = D; in.d_v = D;
  in.g_min = -5.0;
  in.scale = 1.0 / std::sqrt(static_cast<double>(D));
  in.seed = seed;
  in.generator = "anchor-kda";
  Rng rng(seed);
  in.q_raw = Tensor<double>({B, T, H, D});
  in.k_raw = Tensor<double>({B, T, H, D});
  in.v = Tensor<double>({B, T, H, D});
  in.g_raw = Tensor<double>({B, T, H, D});
  in.beta_raw = Tensor<double>({B, T, H});
  in.A_log = Tensor<double>({H});
  in.bias = Tensor<double>({H, D});
  in.S0 = Tensor<double>({B, H, D, D});
  rng.fill_normal(in.q_raw, 1.0, Format::bf16);
  rng.fill_normal(in.k_raw, 1.0, Format::bf16);
  rng.fill_normal(in.v, 1.0, Format::bf16);
  rng.fill_normal(in.g_raw, 1.0, Format::bf16);
  rng.fill_normal(in.beta_raw, 1.0, Format::bf16);
  rng.fill_uniform(in.A_log, 0.0, 1.0);
  rng.fill_uniform(in.bias, 0.0, 1.0);
  rng.fill_normal(in.S0, 0.1, Format::fp32);
  derive_kda(in);
  return in;
}

}  // namespace kdalab
