// The token tasks of the trained recall experiment (numerics/recall_tasks.hpp): their layouts, their statistics
// and their pinned bits. python/tests/test_recall_tasks.py checks that the Python binding returns the same bits.
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "numerics/recall_tasks.hpp"
#include "tests/catch.hpp"

using namespace kdalab;

// Pinned on Debian 12 (g++ 12, Boost 1.74); the same bits are expected on every machine (numerics/random.hpp).
#define KDALAB_MQAR_CHECKSUM 0x0e4911fd9c7448d1ull
#define KDALAB_PALINDROME_CHECKSUM 0x23dd8c0701f18b07ull
#define KDALAB_STACK_CHECKSUM 0x88329e7458386b2full

namespace {
// Pearson's chi-square of counts against probabilities p (total n), bins with expectation < 5 merged into their
// right neighbour (the tail of the law). Returns {statistic, degrees of freedom}.
std::pair<double, int> chi_square(const std::vector<double>& counts, const std::vector<double>& p, double n) {
  double stat = 0, obs = 0, expct = 0;
  int bins = 0;
  for (std::size_t g = 0; g < p.size(); ++g) {
    obs += counts[g];
    expct += n * p[g];
    if (expct >= 5 || g + 1 == p.size()) {
      stat += (obs - expct) * (obs - expct) / expct;
      ++bins;
      obs = expct = 0;
    }
  }
  return {stat, bins - 1};
}

// The first key's query gap of each example (its law is exactly mqar_gap_law; later keys are drawn without
// replacement, so their law is conditioned on the earlier ones).
std::vector<double> first_gap_counts(TokenTask& d, std::size_t N) {
  const std::size_t space = (d.L - 2 * N) / 2;
  std::vector<double> counts(space, 0.0);
  for (std::size_t e = 0; e < d.n; ++e)
    for (std::size_t t = 2 * N; t < d.L; t += 2)
      if (d.tg(e, t) != kIgnore && d.in(e, t) == d.in(e, 0)) counts[(t - 2 * N) / 2] += 1;
  return counts;
}
// f must throw kdalab::Error naming `needle` (Catch2 v2 and v3 name their matchers differently).
template <class F>
void check_error(F&& f, const std::string& needle) {
  bool thrown = false;
  try {
    f();
  } catch (const Error& e) {
    thrown = true;
    INFO("message: " << e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
  CHECK(thrown);
}
}  // namespace

TEST_CASE("mqar keys come from the first half of the vocabulary, values from the second, each queried once",
          "[train-recall]") {
  for (auto [L, N] : {std::pair<std::size_t, std::size_t>{64, 4}, {128, 8}, {256, 16}}) {  // Zoology Fig. 2
    TokenTask d = mqar(300, L, N, 8192, 11);
    REQUIRE(d.inputs.size() == 300 * L);
    for (std::size_t e = 0; e < d.n; ++e) {
      std::map<std::int64_t, std::int64_t> kv;
      std::set<std::int64_t> values;
      for (std::size_t i = 0; i < N; ++i) {
        const std::int64_t k = d.in(e, 2 * i), v = d.in(e, 2 * i + 1);
        REQUIRE((k >= 1 && k < 4096));
        REQUIRE((v >= 4096 && v < 8192));
        REQUIRE(kv.emplace(k, v).second);  // distinct keys
        REQUIRE(values.insert(v).second);  // distinct values
        REQUIRE(d.tg(e, 2 * i) == kIgnore);
        REQUIRE(d.tg(e, 2 * i + 1) == kIgnore);
      }
      std::set<std::int64_t> queried;
      for (std::size_t t = 2 * N; t < L; ++t) {
        REQUIRE((d.in(e, t) >= 0 && d.in(e, t) < 8192));
        if (d.tg(e, t) == kIgnore) continue;
        REQUIRE((t - 2 * N) % 2 == 0);
        // every query's answer is present earlier: the value written right after its key
        REQUIRE(kv.count(d.in(e, t)) == 1);
        REQUIRE(d.tg(e, t) == kv.at(d.in(e, t)));
        REQUIRE(queried.insert(d.in(e, t)).second);
      }
      REQUIRE(queried.size() == N);
    }
  }
}

TEST_CASE("mqar query gaps follow the stated power law (chi-square of the first key's gap)", "[train-recall]") {
  const std::size_t L = 128, N = 8, n = 20000;
  TokenTask d = mqar(n, L, N, 8192, 5);
  // the law as Zoology states it, written out here (not mqar_gap_law: a wrong law there must fail this test)
  std::vector<double> law((L - 2 * N) / 2);
  double z = 0;
  for (std::size_t g = 0; g < law.size(); ++g) z += law[g] = std::pow(g + 1.0, 0.01 - 1.0);
  for (auto& x : law) x /= z;
  const auto [stat, df] = chi_square(first_gap_counts(d, N), law, static_cast<double>(n));
  // P(chi2_df > df + 4 sqrt(2 df)) is about 1e-4 for df ~ 50
  INFO("chi2 = " << stat << " with " << df << " degrees of freedom");
  CHECK(df > 20);
  CHECK(stat < df + 4 * std::sqrt(2.0 * df));
  // a law with another exponent is rejected by the same statistic (the test has the power to see a wrong law)
  TokenTask flatter = mqar(n, L, N, 8192, 5, 0.3);
  const auto [stat2, df2] = chi_square(first_gap_counts(flatter, N), law, static_cast<double>(n));
  INFO("chi2 of a = 0.3 against a = 0.01: " << stat2);
  CHECK(stat2 > df2 + 4 * std::sqrt(2.0 * df2));
}

TEST_CASE("mqar without random non-queries leaves zeros between the queries", "[train-recall]") {
  TokenTask d = mqar(20, 64, 4, 64, 3, 0.01, false);
  for (std::size_t e = 0; e < d.n; ++e)
    for (std::size_t t = 8; t < 64; ++t)
      if (d.tg(e, t) == kIgnore) REQUIRE(d.in(e, t) == 0);
}

TEST_CASE("palindrome's second half mirrors its first", "[train-recall]") {
  TokenTask d = palindrome(50, 256, 64, 9);
  const std::size_t M = 128;
  for (std::size_t e = 0; e < d.n; ++e) {
    REQUIRE(d.in(e, M) == 1);
    for (std::size_t t = 0; t < M; ++t) {
      REQUIRE((d.in(e, t) >= 2 && d.in(e, t) < 64));
      REQUIRE(d.tg(e, t) == kIgnore);
    }
    for (std::size_t j = 0; j < M; ++j) {
      REQUIRE(d.tg(e, M + j) == d.in(e, M - 1 - j));
      if (j > 0) REQUIRE(d.in(e, M + j) == d.tg(e, M + j - 1));  // teacher forcing
    }
  }
}

TEST_CASE("stack targets equal a reference push/pop simulation of 64 stacks", "[train-recall]") {
  const std::size_t S = 64;
  TokenTask d = stack_task(40, 512, 256, S, 13);
  const std::int64_t first_value = 2 + 2 * static_cast<std::int64_t>(S);
  std::size_t pops = 0, pushes = 0;
  for (std::size_t e = 0; e < d.n; ++e) {
    std::vector<std::vector<std::int64_t>> stacks(S);
    for (std::size_t t = 0; t < d.L; t += 2) {
      const std::int64_t op = d.in(e, t), arg = d.in(e, t + 1);
      REQUIRE(d.tg(e, t + 1) == kIgnore);
      REQUIRE((arg >= first_value && arg < 256));
      if (op >= 2 && op < 2 + static_cast<std::int64_t>(S)) {
        stacks[static_cast<std::size_t>(op - 2)].push_back(arg);
        REQUIRE(d.tg(e, t) == kIgnore);
        ++pushes;
      } else {
        REQUIRE((op >= 2 + static_cast<std::int64_t>(S) && op < first_value));
        auto& st = stacks[static_cast<std::size_t>(op - 2 - static_cast<std::int64_t>(S))];
        REQUIRE(!st.empty());
        REQUIRE(d.tg(e, t) == st.back());
        REQUIRE(arg == st.back());
        st.pop_back();
        ++pops;
      }
    }
  }
  // about a quarter of the operations are pops at this length (a pop of an empty stack becomes a push)
  INFO("pops " << pops << ", pushes " << pushes);
  CHECK(pops > (pops + pushes) / 10);
}

TEST_CASE("recall tasks: the same seed gives the same bits, pinned by a checksum", "[train-recall]") {
  const TokenTask a = mqar(16, 64, 4, 8192, 1), b = mqar(16, 64, 4, 8192, 1), c = mqar(16, 64, 4, 8192, 2);
  CHECK(a.inputs == b.inputs);
  CHECK(a.targets == b.targets);
  CHECK(a.inputs != c.inputs);
  const std::uint64_t hm = task_checksum(a), hp = task_checksum(palindrome(8, 64, 32, 1)),
                      hs = task_checksum(stack_task(8, 64, 200, 64, 1));
  INFO(std::hex << "mqar 0x" << hm << ", palindrome 0x" << hp << ", stack 0x" << hs);
  CHECK(hm == KDALAB_MQAR_CHECKSUM);
  CHECK(hp == KDALAB_PALINDROME_CHECKSUM);
  CHECK(hs == KDALAB_STACK_CHECKSUM);
}

TEST_CASE("recall tasks refuse shapes they cannot fill, naming the argument", "[train-recall]") {
  check_error([] { mqar(4, 63, 4, 8192, 1); }, "seq_len = 63");
  check_error([] { mqar(4, 64, 17, 8192, 1); }, "seq_len = 64");
  check_error([] { mqar(4, 64, 4, 8, 1); }, "vocab = 8");
  check_error([] { mqar(4, 64, 4, 8192, 1, 0.0); }, "power_a");
  check_error([] { palindrome(4, 7, 64, 1); }, "seq_len = 7");
  check_error([] { stack_task(4, 64, 130, 64, 1); }, "vocab = 130");
  check_error([] { stack_task(0, 64, 200, 64, 1); }, "n = 0");
}
