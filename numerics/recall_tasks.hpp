#pragma once
/// Token data of the trained recall tasks (python/kdalab/train_recall.py; docs/recall-training.md): Zoology's
/// multi-query associative recall (MQAR) and the Palindrome and Stack tasks of the Kimi Linear report's synthetic
/// tests (sec. 5.1). Integer tokens and next-token targets, seeded and portable as every kdalab generator
/// (numerics/random.hpp: mt19937_64 and Boost's distributions, so one seed gives the same tokens on every machine;
/// tests/numerics/test_recall_tasks.cpp pins a checksum of each task).
///
/// Every task returns n examples of L tokens, row-major [n, L]:
///   inputs[e, t]  the token at position t (int64, in [0, vocab))
///   targets[e, t] the token the model must predict at position t (the next-token label), or kIgnore (-100, the
///                 ignore_index of torch's cross entropy) where the position is not scored.
/// Accuracy is measured on the scored positions only.
///
/// Each example draws from the one generator in a fixed order (written at each task); a split (train, test) is its
/// own seed (the caller's cell_seed of the split and the task's parameters), so adding examples to a split never
/// changes the examples already in it.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <boost/random/uniform_int_distribution.hpp>

#include "numerics/random.hpp"
#include "reference/error.hpp"

namespace kdalab {

/// The target of a position that is not scored (torch.nn.functional.cross_entropy's default ignore_index).
inline constexpr std::int64_t kIgnore = -100;

/// The most tokens n x L one task call returns: 2^28 (2 GiB per int64 array, inputs and targets each). The largest
/// preset of python/kdalab/train_recall.py (the Kimi grid: 100k examples of 2048 tokens) needs 2.05e8.
inline constexpr std::size_t kMaxTaskTokens = std::size_t{1} << 28;

/// n examples of one task: inputs and targets [n, L], row-major.
struct TokenTask {
  std::string task;  ///< "mqar", "palindrome", "stack"
  std::size_t n = 0, L = 0;
  std::int64_t vocab = 0;
  std::uint64_t seed = 0;
  std::vector<std::int64_t> inputs, targets;
  std::int64_t& in(std::size_t e, std::size_t t) { return inputs[e * L + t]; }
  std::int64_t& tg(std::size_t e, std::size_t t) { return targets[e * L + t]; }
};

/// FNV-1a 64 of the bytes of inputs, then of targets (int64, little-endian): the pinned checksum of a task.
inline std::uint64_t task_checksum(const TokenTask& d) {
  const std::uint64_t h = fnv1a64_bytes(d.inputs.data(), d.inputs.size() * sizeof(std::int64_t));
  return fnv1a64_bytes(d.targets.data(), d.targets.size() * sizeof(std::int64_t), h);
}

namespace detail {
/// A uniform integer in [lo, hi] (Boost's distribution: the same values on every platform).
inline std::int64_t uniform_int(Rng& rng, std::int64_t lo, std::int64_t hi) {
  return boost::random::uniform_int_distribution<std::int64_t>(lo, hi)(rng.engine());
}
/// A double as the shortest text that reads back to it (std::to_string prints 1e-9 as 0.000000).
inline std::string number(double x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}
/// Refuses n x L above kMaxTaskTokens (checked without overflow; L >= 1 checked by the caller).
inline void require_tokens(const std::string& name, std::size_t n, std::size_t L) {
  require(n <= kMaxTaskTokens / L,
          name + ": n = " + std::to_string(n) + " examples of seq_len = " + std::to_string(L) +
              " tokens are more than " + std::to_string(kMaxTaskTokens) + " tokens; accepted: n x seq_len <= " +
              std::to_string(kMaxTaskTokens) + " (generate the examples in several calls)");
}
inline TokenTask empty_task(const std::string& name, std::size_t n, std::size_t L, std::int64_t vocab,
                            std::uint64_t seed) {
  require_tokens(name, n, L);
  TokenTask d;
  d.task = name; d.n = n; d.L = L; d.vocab = vocab; d.seed = seed;
  d.inputs.assign(n * L, 0);
  d.targets.assign(n * L, kIgnore);
  return d;
}
}  // namespace detail

/// The query-gap law of mqar(): P(gap = g) = (g + 1)^(a - 1) / Z for g in [0, space), Z the sum (Zoology's
/// `p = power_a * arange(1, space + 1) ** (power_a - 1)`, normalised). Returned normalised, length `space`.
inline std::vector<double> mqar_gap_law(std::size_t space, double power_a) {
  std::vector<double> p(space);
  double z = 0;
  for (std::size_t g = 0; g < space; ++g) z += p[g] = std::pow(static_cast<double>(g + 1), power_a - 1.0);
  for (auto& x : p) x /= z;
  return p;
}

/// Multi-query associative recall as in Zoology (Arora et al. 2023, "Zoology: Measuring and Improving Recall in
/// Efficient Language Models", sec. 3.1 and Figure 2; its data generator `multiquery_ar`).
///
/// Layout of one example (L even, N key-value pairs, vocabulary V):
///   positions [0, 2N): k_1 v_1 k_2 v_2 ... k_N v_N; keys distinct, uniform in [1, V/2) (the first half of the
///                      vocabulary, token 0 excluded); values distinct, uniform in [V/2, V) (the second half)
///   positions [2N, L): the query region of space = (L - 2N) / 2 slots of two tokens; key k_i is queried once, at
///                      position 2N + 2 gap_i, where target = v_i (the model predicts the value after the key).
///                      gap_1, gap_2, ... are drawn in key order without replacement from mqar_gap_law(space, a):
///                      small gaps (queries right after the context) are likely; a = 0.01 is Zoology's default.
///   other positions of the query region: 0, or with random_non_queries (Zoology's default) a uniform token in
///                      [0, V) (it may equal a key: a distractor).
/// Draw order per example: the N keys (uniform, a repeat redrawn), the N values (same), the N gaps (from the law's
/// cumulative sum by binary search on uniform(0, 1) draws, a taken gap redrawn: sampling without replacement with
/// probabilities proportional to the law), then with random_non_queries one token per remaining query-region
/// position, in position order.
/// Errors (kdalab::Error naming the argument): L odd or < 4N (Zoology's bound), N < 1, V/2 - 1 < N keys or
/// V - V/2 < N values, n < 1, power_a not in (0, 1].
inline TokenTask mqar(std::size_t n, std::size_t L, std::size_t N, std::int64_t V, std::uint64_t seed,
                      double power_a = 0.01, bool random_non_queries = true) {
  require(n >= 1, "mqar: n = " + std::to_string(n) + " examples; accepted: >= 1");
  require(N >= 1, "mqar: num_kv_pairs = " + std::to_string(N) + "; accepted: >= 1");
  require(L % 2 == 0 && L >= 4 * N, "mqar: seq_len = " + std::to_string(L) + " with num_kv_pairs = " +
                                        std::to_string(N) + "; accepted: an even length >= 4 num_kv_pairs");
  require(V >= 4 && V / 2 - 1 >= static_cast<std::int64_t>(N) && V - V / 2 >= static_cast<std::int64_t>(N),
          "mqar: vocab = " + std::to_string(V) + " holds " + std::to_string(std::max<std::int64_t>(0, V / 2 - 1)) +
              " key tokens; accepted: at least num_kv_pairs = " + std::to_string(N) + " keys and values");
  require(power_a > 0 && power_a <= 1, "mqar: power_a = " + detail::number(power_a) + "; accepted: (0, 1]");
  TokenTask d = detail::empty_task("mqar", n, L, V, seed);
  const std::size_t space = (L - 2 * N) / 2;
  const std::vector<double> p = mqar_gap_law(space, power_a);
  std::vector<double> cdf(space);
  double acc = 0;
  for (std::size_t g = 0; g < space; ++g) cdf[g] = acc += p[g];
  Rng rng(seed);
  std::vector<std::int64_t> keys(N), values(N);
  std::vector<std::size_t> gaps(N);
  std::vector<bool> gap_used(space);
  std::unordered_set<std::int64_t> taken;  // the draws of this example so far (a linear search is O(N^2))
  taken.reserve(N);
  auto distinct = [&](std::vector<std::int64_t>& out, std::int64_t lo, std::int64_t hi) {
    taken.clear();
    for (std::size_t i = 0; i < N; ++i) {
      std::int64_t x;
      do x = detail::uniform_int(rng, lo, hi);
      while (!taken.insert(x).second);
      out[i] = x;
    }
  };
  for (std::size_t e = 0; e < n; ++e) {
    distinct(keys, 1, V / 2 - 1);
    distinct(values, V / 2, V - 1);
    std::fill(gap_used.begin(), gap_used.end(), false);
    for (std::size_t i = 0; i < N; ++i) {
      std::size_t g;
      do {
        const double u = rng.uniform(0.0, 1.0) * acc;
        g = std::min<std::size_t>(space - 1, static_cast<std::size_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin()));
      } while (gap_used[g]);
      gap_used[g] = true;
      gaps[i] = g;
    }
    for (std::size_t i = 0; i < N; ++i) {
      d.in(e, 2 * i) = keys[i];
      d.in(e, 2 * i + 1) = values[i];
      d.in(e, 2 * N + 2 * gaps[i]) = keys[i];
      d.tg(e, 2 * N + 2 * gaps[i]) = values[i];
    }
    if (random_non_queries)
      for (std::size_t t = 2 * N; t < L; ++t)
        if (d.tg(e, t) == kIgnore) d.in(e, t) = detail::uniform_int(rng, 0, V - 1);
  }
  return d;
}

/// Palindrome (Kimi Linear report, sec. 5.1, synthetic tests: the model must produce a random sequence in reverse
/// order). The report names the task and its lengths; this layout is kdalab's. One example of even length L,
/// M = L / 2 content tokens:
///   positions [0, M):  x_1 ... x_M, uniform in [2, V)
///   position  M:       the separator token 1 (scored: target x_M)
///   positions (M, L):  x_M ... x_2 (teacher forcing: the reversed sequence so far)
///   targets[M + j] = x_{M - j} for j in [0, M): the second half mirrors the first; the first half is not scored.
/// Draw order: the M content tokens of each example in position order. Token 0 is unused.
/// Errors: L odd or < 2, V < 3, n < 1.
inline TokenTask palindrome(std::size_t n, std::size_t L, std::int64_t V, std::uint64_t seed) {
  require(n >= 1, "palindrome: n = " + std::to_string(n) + " examples; accepted: >= 1");
  require(L % 2 == 0 && L >= 2, "palindrome: seq_len = " + std::to_string(L) + "; accepted: an even length >= 2");
  require(V >= 3, "palindrome: vocab = " + std::to_string(V) + "; accepted: >= 3 (token 1 is the separator)");
  TokenTask d = detail::empty_task("palindrome", n, L, V, seed);
  const std::size_t M = L / 2;
  Rng rng(seed);
  for (std::size_t e = 0; e < n; ++e) {
    for (std::size_t t = 0; t < M; ++t) d.in(e, t) = detail::uniform_int(rng, 2, V - 1);
    d.in(e, M) = 1;
    for (std::size_t j = 0; j < M; ++j) {
      d.tg(e, M + j) = d.in(e, M - 1 - j);
      if (M + 1 + j < L) d.in(e, M + 1 + j) = d.in(e, M - 1 - j);
    }
  }
  return d;
}

/// First token of the push operations of stack_task() (push of stack s: 2 + s; pop of stack s: 2 + S + s;
/// values: [2 + 2S, V)).
inline constexpr std::int64_t kStackOpBase = 2;

/// Stack (Kimi Linear report, sec. 5.1, synthetic tests: S = 64 independent stacks, pushes and pops; the model must
/// answer each pop with the value on top of that stack). The report names the task, the 64 stacks and the lengths;
/// this layout is kdalab's. One example of even length L is L / 2 operations of two tokens:
///   push onto stack s: token 2 + s, then the pushed value (uniform in [2 + 2S, V)); not scored
///   pop from stack s:  token 2 + S + s (scored: target = the value on top of stack s), then that value
///                      (teacher forcing)
/// Each operation draws s uniform in [0, S), then push or pop with probability 1/2 each (a pop of an empty stack
/// becomes a push), then the value of a push. All stacks start empty. Token 0 and 1 are unused.
/// Errors: L odd or < 2, S < 1, V < 2 + 2S + 1, n < 1.
inline TokenTask stack_task(std::size_t n, std::size_t L, std::int64_t V, std::size_t S, std::uint64_t seed) {
  require(n >= 1, "stack: n = " + std::to_string(n) + " examples; accepted: >= 1");
  require(L % 2 == 0 && L >= 2, "stack: seq_len = " + std::to_string(L) + "; accepted: an even length >= 2");
  require(S >= 1, "stack: num_stacks = " + std::to_string(S) + "; accepted: >= 1");
  // 2 + 2 S computed only where it fits an int64 (a larger S would wrap around and pass the vocabulary check)
  constexpr auto kMaxStacks = static_cast<std::size_t>((std::numeric_limits<std::int64_t>::max() - kStackOpBase) / 2);
  const std::int64_t first_value = S <= kMaxStacks ? kStackOpBase + 2 * static_cast<std::int64_t>(S) : -1;
  require(S <= kMaxStacks && V > first_value,
          "stack: vocab = " + std::to_string(V) + " with num_stacks = " + std::to_string(S) +
              "; accepted: vocab > 2 + 2 num_stacks" +
              (S <= kMaxStacks ? " = " + std::to_string(first_value) : std::string()));
  TokenTask d = detail::empty_task("stack", n, L, V, seed);
  Rng rng(seed);
  // only the stacks an example touches (at most L / 2 of them) are held: num_stacks may be as large as vocab / 2
  std::unordered_map<std::size_t, std::vector<std::int64_t>> stacks;
  for (std::size_t e = 0; e < n; ++e) {
    stacks.clear();
    for (std::size_t t = 0; t < L; t += 2) {
      const auto s = static_cast<std::size_t>(detail::uniform_int(rng, 0, static_cast<std::int64_t>(S) - 1));
      const bool pop = rng.uniform(0.0, 1.0) < 0.5 && !stacks[s].empty();
      if (pop) {
        d.in(e, t) = kStackOpBase + static_cast<std::int64_t>(S + s);
        d.tg(e, t) = d.in(e, t + 1) = stacks[s].back();
        stacks[s].pop_back();
      } else {
        d.in(e, t) = kStackOpBase + static_cast<std::int64_t>(s);
        d.in(e, t + 1) = detail::uniform_int(rng, first_value, V - 1);
        stacks[s].push_back(d.in(e, t + 1));
      }
    }
  }
  return d;
}

}  // namespace kdalab
