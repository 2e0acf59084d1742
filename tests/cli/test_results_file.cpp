// The HDF5 results writer: root attributes and tables round-trip; a failed run leaves no file and never touches an
// old one; tables reject rows that do not fit; progress lines off a terminal; the reader refuses attributes of no
// value or several and paths HDF5 cannot follow with an Error naming them.
#include <cstdio>
#include <filesystem>
#include <functional>
#include <vector>

#include "experiments/progress.hpp"
#include "experiments/results.hpp"
#include "reference/error.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

using kdalab::testutil::TempDir;
using namespace kdalab::testutil;
using namespace kdalab;


namespace {
Table sample_table() {
  Table t;
  t.col("T", 'i', "1", "sequence length").col("rel_rms", 'd', "1", "relative RMS error").col("impl", 's', "1", "implementation");
  t.row({std::int64_t{17}, 1.5e-3, std::string("float64")});
  t.row({std::int64_t{4096}, 2.5e-3, std::string("twin-bf16")});
  return t;
}
}  // namespace

TEST_CASE("root attributes and a table round-trip through HDF5", "[results]") {
  TempDir d;
  const std::string p = d.file("r.h5");
  {
    ResultsFile f(p, false, RunInfo{"kdalab test --x 1", R"({"x":"1"})", "42"});
    f.group("exp", "an experiment");
    f.write_table("exp/table", sample_table());
    Tensor<double> a({2, 3});
    for (std::size_t i = 0; i < 6; ++i) a.data[i] = 0.5 * static_cast<double>(i);
    f.write_array("exp", "array", a, "s", "a 2x3 array", {{"format", "bf16"}});
    f.attr("exp", "note", "hello");
    f.attr("exp/array", "scale", 0.125);
    f.commit();
  }
  CHECK(h5read::attr_string(p, "/", "software") == "kdalab");
  CHECK(h5read::attr_string(p, "/", "software_version") == software_version());
  CHECK(h5read::attr_string(p, "/", "git_sha") == git_sha());
  CHECK(h5read::attr_string(p, "/", "date").size() == 20);
  CHECK(h5read::attr_string(p, "/", "command_line") == "kdalab test --x 1");
  CHECK(h5read::attr_string(p, "/", "config") == R"({"x":"1"})");
  CHECK(h5read::attr_string(p, "/", "host") == host_name());
  CHECK(h5read::attr_string(p, "/", "device").find("CPU") != std::string::npos);
  CHECK(h5read::attr_string(p, "/", "seed") == "42");
  CHECK(h5read::attr_string(p, "exp", "description") == "an experiment");
  CHECK(h5read::attr_string(p, "exp", "note") == "hello");
  const auto T = h5read::array(p, "exp/table/T");
  REQUIRE(T.numel() == 2);
  CHECK(T.data[1] == 4096);
  CHECK(h5read::array(p, "exp/table/rel_rms").data[0] == 1.5e-3);
  CHECK(h5read::strings(p, "exp/table/impl") == std::vector<std::string>{"float64", "twin-bf16"});
  CHECK(h5read::attr_string(p, "exp/table/rel_rms", "units") == "1");
  CHECK(h5read::attr_string(p, "exp/table/rel_rms", "description") == "relative RMS error");
  const auto arr = h5read::array(p, "exp/array");
  CHECK(arr.shape == std::vector<std::size_t>{2, 3});
  CHECK(arr(1, 2) == 2.5);
  CHECK(h5read::attr_string(p, "exp/array", "format") == "bf16");
  CHECK(h5read::attr_double(p, "exp/array", "scale") == 0.125);
  CHECK_THROWS_AS(h5read::array(p, "exp/missing"), Error);
  CHECK_THROWS_AS(h5read::attr_string(p, "/", "missing"), Error);
}

TEST_CASE("the reader refuses an attribute of no value or several, and names a path HDF5 cannot follow", "[results]") {
  TempDir d;
  const std::string p = d.file("odd.h5");
  write_h5(p, [](H5::H5File& f) {
    write_f64(f, "x", {2}, 1.0);
    H5::Group root = f.openGroup("/");
    H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
    root.createAttribute("empty_text", st, H5::DataSpace(H5S_NULL));
    root.createAttribute("empty_number", H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_NULL));
    const hsize_t n = 64;
    const std::vector<double> v(n, 1.0);
    root.createAttribute("numbers", H5::PredType::NATIVE_DOUBLE, H5::DataSpace(1, &n)).write(H5::PredType::NATIVE_DOUBLE, v.data());
    H5Lcreate_soft("/nowhere", f.getId(), "dangling", H5P_DEFAULT, H5P_DEFAULT);
  });
  // an empty text attribute crashed the read (free() of an invalid pointer); the array overran the one double
  const auto refused = [&](const std::function<void()>& read, const std::string& says) {
    try {
      read();
      FAIL("no error; expected: " << says);
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
  };
  refused([&] { h5read::attr_string(p, "/", "empty_text"); }, "attribute 'empty_text' of '/' in '" + p + "' holds 0 values");
  refused([&] { h5read::attr_double(p, "/", "empty_text"); }, "holds 0 values; accepted: one text or one number");
  refused([&] { h5read::attr_double(p, "/", "empty_number"); }, "attribute 'empty_number' of '/' in '" + p + "' holds 0 values");
  refused([&] { h5read::attr_double(p, "/", "numbers"); }, "attribute 'numbers' of '/' in '" + p + "' holds 64 values");
  // HDF5's own failures (a path through a dataset, a dangling link, an empty name) were H5::Exceptions, not Errors
  refused([&] { h5read::array(p, "x/y"); }, "file '" + p + "': cannot read 'x/y'");
  refused([&] { h5read::array(p, "dangling"); }, "cannot read 'dangling'");
  refused([&] { h5read::array(p, ""); }, "cannot read ''");
  refused([&] { h5read::members(p, "x"); }, "cannot read 'x'");
  refused([&] { h5read::attr_string(p, "dangling", "a"); }, "cannot read 'dangling'");
}

TEST_CASE("a failed run leaves no file, and never touches an old one", "[results]") {
  TempDir d;
  const std::string p = d.file("r.h5");
  try {
    ResultsFile f(p, false, RunInfo{"x", "{}", "1"});
    f.write_table("g/t", sample_table());
    throw std::runtime_error("simulated failure in the middle of a run");
  } catch (const std::runtime_error&) {
  }
  CHECK(d.count() == 0);  // neither the file nor its temporary
  {
    ResultsFile f(p, false, RunInfo{"first", "{}", "1"});
    f.commit();
  }
  CHECK_THROWS_AS(ResultsFile(p, false, RunInfo{"second", "{}", "1"}), Error);
  try {
    ResultsFile f(p, true, RunInfo{"third", "{}", "1"});
    throw std::runtime_error("failure with --force");
  } catch (const std::runtime_error&) {
  }
  CHECK(h5read::attr_string(p, "/", "command_line") == "first");
  CHECK(d.count() == 1);
}

TEST_CASE("the writer refuses names HDF5 would cut at a NUL or read as a path (/, ., ..), empty names and a dataset "
          "written twice, with an Error naming them; the run's file is then never written",
          "[results]") {
  TempDir d;
  const std::string p = d.file("r.h5");
  using namespace std::string_literals;
  Tensor<double> a({2});
  a.data = {1.0, 2.0};
  Table nul_col, empty_col;
  nul_col.col("a\0b"s, 'd', "1", "d");
  empty_col.col("", 'd', "1", "d");
  const std::vector<std::pair<std::function<void(ResultsFile&)>, std::string>> cases = {
      {[&](ResultsFile& f) { f.write_array("g", "x\0y"s, a, "1", "d"); }, "array name 'x\\0y' of 'g' is not accepted"},
      {[&](ResultsFile& f) { f.write_array("g", "a/b", a, "1", "d"); }, "array name 'a/b' of 'g' is not accepted"},
      {[&](ResultsFile& f) { f.write_array("g", "..", a, "1", "d"); }, "array name '..' of 'g' is not accepted"},
      {[&](ResultsFile& f) { f.write_array("g", "", a, "1", "d"); }, "array name '' of 'g' is not accepted"},
      {[&](ResultsFile& f) { f.write_array("g", "x", a, "1", "d", {{"k", "v\0w"s}}); }, "attribute 'k' of 'g/x' holds a NUL"},
      {[&](ResultsFile& f) {
         f.write_array("g", "x", a, "1", "d");
         f.write_array("g", "x", a, "1", "d");
       },
       "'g' already holds 'x'"},
      {[&](ResultsFile& f) {
         f.write_table("g", sample_table());
         f.write_table("g", sample_table());
       },
       "'g' already holds 'T'"},
      {[&](ResultsFile& f) { f.write_table("t", nul_col); }, "table column name 'a\\0b' of 't' is not accepted"},
      {[&](ResultsFile& f) { f.write_table("t", empty_col); }, "table column name '' of 't' is not accepted"},
      {[&](ResultsFile& f) { f.group("../x", "d"); }, "group '../x' has a part '..'"},
      {[&](ResultsFile& f) { f.group("a/./b", "d"); }, "group 'a/./b' has a part '.'"},
      {[&](ResultsFile& f) { f.group("x\0y"s, "d"); }, "group 'x\\0y' holds a NUL character"},
      {[&](ResultsFile& f) { f.group("x", "d\0e"s); }, "the description of group 'x' holds a NUL character"},
      {[&](ResultsFile& f) { f.attr("/", "a\0b"s, "v"); }, "attribute name 'a\\0b' of '/' is not accepted"},
      {[&](ResultsFile& f) { f.attr("/", "a", "v\0w"s); }, "attribute 'a' of '/' holds a NUL character"},
      {[&](ResultsFile& f) { f.attr("/", "", 1.0); }, "attribute name '' of '/' is not accepted"},
  };
  for (const auto& [write, says] : cases) {
    INFO(says);
    try {
      ResultsFile f(p, false, RunInfo{"x", "{}", "1"});
      write(f);
      f.commit();
      FAIL("no error; expected: " << says);
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
    CHECK(d.count() == 0);
  }
  // the names the experiments write are accepted: nested groups, a table, attributes of a group and of a column
  {
    ResultsFile f(p, false, RunInfo{"x", "{}", "1"});
    f.group("a/b", "d");
    f.write_table("a/b", sample_table());
    f.attr("a/b/T", "note", 2.0);
    f.attr("a//b", "k", "v");
    f.commit();
  }
  CHECK(h5read::attr_string(p, "a/b", "k") == "v");
}

TEST_CASE("tables reject rows that do not fit", "[results]") {
  Table t = sample_table();
  CHECK_THROWS_AS(t.row({1.0}), Error);
  CHECK_THROWS_AS(t.row({std::int64_t{1}, std::string("x"), std::string("y")}), Error);
}

TEST_CASE("progress off a terminal prints plain lines, and nothing when quiet", "[results]") {
  ::setenv("KDALAB_PROGRESS_INTERVAL", "0", 1);
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    Progress p("work", 4, false, f);
    for (int i = 0; i < 4; ++i) p.tick(1, "item");
  }
  std::FILE* q = std::tmpfile();
  {
    Progress p("work", 4, true, q);
    for (int i = 0; i < 4; ++i) p.tick();
  }
  auto slurp = [](std::FILE* fp) {
    std::string s;
    std::rewind(fp);
    int c;
    while ((c = std::fgetc(fp)) != EOF) s.push_back(static_cast<char>(c));
    return s;
  };
  const std::string out = slurp(f), quiet = slurp(q);
  std::fclose(f);
  std::fclose(q);
  ::unsetenv("KDALAB_PROGRESS_INTERVAL");
  INFO(out);
  CHECK(out.find('\r') == std::string::npos);
  CHECK(out.find("100.0%") != std::string::npos);
  CHECK(out.find("ETA") != std::string::npos);
  CHECK(std::count(out.begin(), out.end(), '\n') >= 4);
  CHECK(quiet.empty());
}
