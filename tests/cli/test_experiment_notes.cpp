// The notes an experiment prints about its run: `kdalab parity` prints each note once (its "skipped > 80 nats"
// and "cuda-bf16 rows skipped" notes were printed twice: live on stderr and again after the summary table)
// and records them in the file; its "skipped > 80 nats" notes are one per (implementation, C), listing the
// points (a default --quick run printed six, one per point); its NaN/Inf notes are one per (implementation, C, state
// precision, matmul precision), naming them and listing the points (they were one per point, without the precisions,
// and identical ones were dropped); `kdalab decode-cost` explains its CPU softmax curve with a one-line note (the
// working set against this machine's caches), printed once and recorded as decode_cost/cpu's `note`.
// parity's progress line names only the implementations that produced a row (a CPU build's ended "[... cuda-bf16]").
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using namespace kdalab::testutil;

namespace {
std::size_t count(const std::string& text, const std::string& s) {
  std::size_t n = 0;
  for (std::size_t p = text.find(s); p != std::string::npos; p = text.find(s, p + 1)) ++n;
  return n;
}
/// The text after "note: " on every line that starts with it.
std::vector<std::string> note_lines(const std::string& out) {
  std::vector<std::string> notes;
  std::size_t p = 0;
  while (p < out.size()) {
    const std::size_t e = out.find('\n', p);
    const std::string line = out.substr(p, e == std::string::npos ? std::string::npos : e - p);
    if (line.rfind("note: ", 0) == 0) notes.push_back(line.substr(6));
    if (e == std::string::npos) break;
    p = e + 1;
  }
  return notes;
}
}  // namespace

TEST_CASE("parity prints each note once, after the summary, and records it", "[cli]") {
  TempDir d;
  // softplus gates at T = 17, d_k = 128 reach a factored span > 80 nats at C = 16: float32-chunk skips them
  const auto r = run_kdalab("parity --T 17 --dk 128 --dv 128 --gate softplus --beta sigmoid,one --C 16 "
                            "--impl float32,float32-chunk,cuda-bf16 --truth f64 --out " + d.file("p.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto notes = note_lines(r.output);
  REQUIRE(notes.size() >= 1);  // one for both skipped points (two betas), one for cuda-bf16 without a GPU
  CHECK(count(r.output, "float32-chunk C=16 skipped at 2 points [0 (T=17 H=1 softplus sigmoid), "
                        "1 (T=17 H=1 softplus one)]: ") == 1);
  std::size_t span_notes = 0;  // the "> 80 nats" notes: each phrase appears in its note only
  for (const auto& n : notes) span_notes += count(n, "80 nats");
  CHECK(span_notes == 1);
  CHECK(count(r.output, "80 nats") == span_notes);
  const std::string recorded = kdalab::h5read::attr_string(d.file("p.h5"), "/parity", "notes");
  for (const auto& n : notes) {
    INFO(n);
    CHECK(count(r.output, n) == 1);  // printed once: no second copy on stderr
    CHECK(recorded.find(n) != std::string::npos);
  }
  CHECK(r.output.find("note: ") > r.output.find("o median rRMS"));  // after the summary table
}

TEST_CASE("parity with no row prints every note once, the first in its one-line error", "[cli]") {
  TempDir d;
  const auto r = run_kdalab("parity --T 17 --dk 128 --dv 128 --gate softplus --beta sigmoid,one --C 16 "
                            "--impl float32-chunk --truth f64 --quiet --out " + d.file("p.h5"));
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(count(r.output, "skipped at 2 points [0 (T=17 H=1 softplus sigmoid), 1 (T=17 H=1 softplus one)]") == 1);
  CHECK(count(r.output, "80 nats") == 1);
  CHECK(d.count() == 0);
}

TEST_CASE("parity --quick: one '> 80 nats' note per (implementation, C), listing every skipped point", "[cli]") {
  TempDir d;
  // --quick's grid (T = 17, 300, 1000; bounded and softplus gates; beta sigmoid and one): float32-chunk refuses
  // the six softplus points at every C (factored tile 16 for C = 32); float64-chunk (700 nats) refuses none.
  const auto r = run_kdalab("parity --quick --C 16,32 --impl float64,float64-chunk,float32-chunk --out " + d.file("p.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto notes = note_lines(r.output);
  const auto impl = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/impl");
  const auto gate = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/gate");
  const auto point = kdalab::h5read::array(d.file("p.h5"), "/parity/table/point");
  const auto C = kdalab::h5read::array(d.file("p.h5"), "/parity/table/C");
  std::set<long> all_points, softplus_points;
  for (std::size_t i = 0; i < impl.size(); ++i) {
    all_points.insert(std::lround(point.data[i]));
    if (gate[i] == "softplus") softplus_points.insert(std::lround(point.data[i]));
  }
  REQUIRE(all_points.size() == 12);
  REQUIRE(softplus_points.size() == 6);
  const std::string recorded = kdalab::h5read::attr_string(d.file("p.h5"), "/parity", "notes");
  std::size_t span_notes = 0;
  for (const auto& n : notes) span_notes += count(n, "80 nats");
  CHECK(span_notes == 2);  // float32-chunk at C = 16 and at C = 32; was six per C, one per point
  CHECK(count(r.output, "80 nats") == 2);
  CHECK(count(recorded, "80 nats") == 2);  // the file's notes are merged the same way
  for (const char* c : {"16", "32"}) {
    const std::string head = std::string("float32-chunk C=") + c + " skipped at ";
    INFO(head);
    CHECK(count(r.output, head) == 1);
    CHECK(count(recorded, head) == 1);
    CHECK(count(r.output, "float64-chunk C=" + std::string(c) + " skipped") == 0);
    const std::string* n = nullptr;
    for (const auto& x : notes)
      if (x.rfind(head, 0) == 0) n = &x;
    REQUIRE(n != nullptr);
    INFO(*n);
    CHECK(n->rfind(head + "6 points [", 0) == 0);
    CHECK(recorded.find(*n) != std::string::npos);
    // the listed points are exactly the points without a float32-chunk row at this C: the softplus ones
    std::set<long> listed, with_row;
    const std::string list = n->substr(n->find('['), n->find(']') - n->find('['));
    const std::regex item(R"((\d+) \(T=\d+ H=\d+ softplus (sigmoid|one)\))");
    for (auto it = std::sregex_iterator(list.begin(), list.end(), item); it != std::sregex_iterator(); ++it)
      listed.insert(std::stol((*it)[1].str()));
    for (std::size_t i = 0; i < impl.size(); ++i)
      if (impl[i] == "float32-chunk" && std::lround(C.data[i]) == std::stol(c)) with_row.insert(std::lround(point.data[i]));
    CHECK(listed == softplus_points);
    for (long p : listed) CHECK(with_row.count(p) == 0);
    CHECK(listed.size() + with_row.size() == all_points.size());
    // what each point's note said is kept: the reason, and the spans as a range over the points
    CHECK(n->find("kda_chunked: option 'C' (chunk size) = " + std::string(c)) != std::string::npos);
    CHECK(std::regex_search(*n, std::regex(R"(factored decay span F \* \|g_min\| = [0-9.]+ \.\. [0-9.]+ > 80 nats: )"
                                           R"(exp overflows in float32)")));
  }
}

TEST_CASE("decode-cost notes the CPU softmax working set against the caches, once, and records it", "[cli]") {
  TempDir d;
  const auto r = run_kdalab("decode-cost --cpu-n 1024,2048 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 "
                            "--context 1024 --gpu-n 0 --quiet --out " + d.file("dc.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto notes = note_lines(r.output);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].rfind("softmax read: ", 0) == 0);
  CHECK(notes[0].find("working set") != std::string::npos);
  CHECK((notes[0].find("caches") != std::string::npos || notes[0].find("cache sizes are unknown") != std::string::npos));
  CHECK(kdalab::h5read::attr_string(d.file("dc.h5"), "/decode_cost/cpu", "note") == notes[0]);
  // one softmax and one KDA row per n (a repeated --cpu-n value is refused now, not measured once: session 7,
  // test_option_bounds_no_overwrite)
  CHECK(kdalab::h5read::strings(d.file("dc.h5"), "/decode_cost/cpu/impl").size() == 4);
}

TEST_CASE("parity: one NaN/Inf note per (implementation, C, state precision, matmul precision), naming them and "
          "listing the points", "[cli]") {
  TempDir d;
  // g_min = -100 is far beyond the factored chunk form's range: every twin row has NaN in o at the bounded points
  // (0: T = 17, 2: T = 40), none at the softplus points (1, 3); the two state precisions give the same counts, so
  // their notes were identical (the precisions were not named) and one was silently dropped.
  const auto r = run_kdalab("parity --g-min -100 --impl float64,twin-bf16 --T 17,40 --dk 16 --dv 16 --gate bounded,softplus "
                            "--beta one --C 16 --state-precision fp32,bf16 --matmul-precision plan,bf16 --truth f64 --out " +
                            d.file("p.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto notes = note_lines(r.output);
  const std::string recorded = kdalab::h5read::attr_string(d.file("p.h5"), "/parity", "notes");
  const auto impl = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/impl");
  const auto st = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/state_precision");
  const auto mm = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/matmul_precision");
  const auto point = kdalab::h5read::array(d.file("p.h5"), "/parity/table/point");
  const auto C = kdalab::h5read::array(d.file("p.h5"), "/parity/table/C");
  const auto o_nan = kdalab::h5read::array(d.file("p.h5"), "/parity/table/o_nan");
  const auto o_inf = kdalab::h5read::array(d.file("p.h5"), "/parity/table/o_inf");
  const auto S_nan = kdalab::h5read::array(d.file("p.h5"), "/parity/table/S_nan");
  const auto S_inf = kdalab::h5read::array(d.file("p.h5"), "/parity/table/S_inf");
  std::size_t nan_notes = 0;
  for (const auto& n : notes) nan_notes += count(n, "has NaN/Inf");
  CHECK(nan_notes == 4);  // (state fp32, bf16) x (matmul plan, bf16); was one per point, de-duplicated across precisions
  CHECK(count(recorded, "has NaN/Inf") == 4);
  // every (implementation, C, state, matmul) whose rows hold NaN/Inf has exactly one note, listing exactly its points
  std::map<std::string, std::set<long>> bad;
  for (std::size_t i = 0; i < impl.size(); ++i)
    if (o_nan.data[i] + o_inf.data[i] + S_nan.data[i] + S_inf.data[i] > 0)
      bad[fmt::format("{} C={} (state {}, matmul {}) has NaN/Inf at ", impl[i], std::lround(C.data[i]), st[i], mm[i])]
          .insert(std::lround(point.data[i]));
  REQUIRE(bad.size() == 4);
  for (const auto& [head, points] : bad) {
    INFO(head);
    CHECK(points == std::set<long>{0, 2});
    const std::string* n = nullptr;
    for (const auto& x : notes)
      if (x.rfind(head, 0) == 0) n = &x;
    REQUIRE(n != nullptr);
    INFO(*n);
    CHECK(count(r.output, head) == 1);
    CHECK(recorded.find(*n) != std::string::npos);  // the file's notes are the same text
    CHECK(n->rfind(head + "2 points [0 (T=17 H=1 bounded one), 2 (T=40 H=1 bounded one)]: o has ", 0) == 0);
    CHECK(n->find("recorded in the rows") != std::string::npos);
  }
}

TEST_CASE("parity's progress line names only implementations that produced a row (not the skipped cuda-bf16)",
          "[cli]") {
  TempDir d;
  // d_k = 16: cuda-bf16 is skipped in every build (no GPU, no CUDA kernels, or a shape the kernel does not run);
  // float32-chunk is skipped at the softplus points (span > 80 nats at T = 300). KDALAB_PROGRESS_INTERVAL=0 draws the
  // progress line at every tick (off a terminal one line each), so every label the run showed is in the output.
  const auto r = run_command("KDALAB_PROGRESS_INTERVAL=0 " + kdalab_bin() +
                             " parity --T 300 --dk 16 --dv 16 --gate bounded,softplus --beta one --C 16 "
                             "--impl float32,float32-chunk,cuda-bf16 --truth f64 --out " + d.file("p.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto impl = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/impl");
  const auto gate = kdalab::h5read::strings(d.file("p.h5"), "/parity/table/gate");
  REQUIRE(std::count(impl.begin(), impl.end(), "cuda-bf16") == 0);  // the rows this test is about are skipped
  std::set<std::string> chunk_gates;
  for (std::size_t i = 0; i < impl.size(); ++i)
    if (impl[i] == "float32-chunk") chunk_gates.insert(gate[i]);
  REQUIRE(chunk_gates == std::set<std::string>{"bounded"});  // float32-chunk ran at the bounded point only
  std::size_t lines = 0;
  std::size_t p = 0;
  while ((p = r.output.find("parity: ", p)) != std::string::npos) {
    const std::size_t e = r.output.find('\n', p);
    const std::string line = r.output.substr(p, e - p);
    p = e;
    if (line.find("% (") == std::string::npos) continue;  // not a progress line
    ++lines;
    INFO(line);
    CHECK(line.find("cuda-bf16") == std::string::npos);  // was: the last line ended "[T=300 H=1 softplus one cuda-bf16]"
    CHECK(line.find("softplus one float32-chunk") == std::string::npos);  // skipped there too
  }
  CHECK(lines >= 3);
}
