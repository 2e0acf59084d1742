// --shard I/N and `kdalab merge` (docs/cluster.md): for every sweeping subcommand the shards merged equal the unsharded
// run (every dataset and attribute bit for bit, timing columns aside); merge refuses shard sets that are not one run's
// whole grid once or holding an attribute of no value or several; --shard refuses values outside 1 <= I <= N <= grid
// points. Small grids: the whole file runs in seconds on two cores.
#include <H5Cpp.h>

#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "experiments/results.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"

// in a namespace of its own, test cases included: the cli files compile in unity batches
namespace shard_merge_test {
using namespace kdalab::testutil;

std::string bits(const void* p, std::size_t n) {
  std::string s;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) s += fmt::format("{:02x}", b[i]);
  return s;
}

/// Every group, dataset and attribute of a results file as "path" / "path@attr" -> text (numbers as their bytes), except
/// datasets with units "s" (wall times, "timing"), decode-cost's note on its CPU timings, and the root attributes of one
/// run: date, command_line, host, device, merged_shards, merged_subcommand, and config's "out".
std::map<std::string, std::string> content(const std::string& file) {
  std::map<std::string, std::string> out;
  H5::Exception::dontPrint();
  H5::H5File f(file, H5F_ACC_RDONLY);
  const auto attrs = [&](H5::H5Object& o, const std::string& path) {
    for (int i = 0; i < o.getNumAttrs(); ++i) {
      H5::Attribute a = o.openAttribute(static_cast<unsigned>(i));
      const std::string name = a.getName();
      if (path == "/" && (name == "date" || name == "command_line" || name == "host" || name == "device" ||
                          name == "merged_shards" || name == "merged_subcommand"))
        continue;
      std::string v;
      if (a.getTypeClass() == H5T_STRING) {
        a.read(a.getStrType(), v);
        if (path == "/" && name == "config") {
          auto j = nlohmann::json::parse(v);
          j.erase("out");
          v = j.dump();
        }
      } else {
        double x = 0;
        a.read(H5::PredType::NATIVE_DOUBLE, &x);
        v = bits(&x, sizeof x);
      }
      // decode-cost's note on its CPU rows is made from their timings (which step grows most)
      if (path == "/decode_cost/cpu" && name == "note") v = "from timings";
      out[path + "@" + name] = v;
    }
  };
  std::function<void(H5::Group&, const std::string&)> walk = [&](H5::Group& g, const std::string& path) {
    attrs(g, path);
    out[path] = "group";
    for (hsize_t i = 0; i < g.getNumObjs(); ++i) {
      const std::string name = g.getObjnameByIdx(i), child = (path == "/" ? "" : path) + "/" + name;
      if (g.childObjType(name) == H5O_TYPE_GROUP) {
        H5::Group sub = g.openGroup(name);
        walk(sub, child);
        continue;
      }
      H5::DataSet ds = g.openDataSet(name);
      attrs(ds, child);
      if (kdalab::h5read::attr_string(file, child, "units") == "s") {
        out[child] = "timing";
        continue;
      }
      hsize_t n = ds.getSpace().getSimpleExtentNpoints();
      std::vector<hsize_t> dims(static_cast<std::size_t>(ds.getSpace().getSimpleExtentNdims()));
      if (!dims.empty()) ds.getSpace().getSimpleExtentDims(dims.data());
      std::string v = fmt::format("{}:", fmt::join(dims, "x"));
      if (ds.getTypeClass() == H5T_FLOAT) {
        std::vector<double> x(n);
        if (n) ds.read(x.data(), H5::PredType::NATIVE_DOUBLE);
        v += "f64:" + bits(x.data(), x.size() * sizeof(double));
      } else if (ds.getTypeClass() == H5T_INTEGER) {
        std::vector<std::int64_t> x(n);
        if (n) ds.read(x.data(), H5::PredType::NATIVE_INT64);
        v += "i64:" + bits(x.data(), x.size() * sizeof(std::int64_t));
      } else {
        v += "str:" + fmt::format("{}", fmt::join(kdalab::h5read::strings(file, child), "\x1f"));
      }
      out[child] = v;
    }
  };
  H5::Group root = f.openGroup("/");
  walk(root, "/");
  return out;
}

/// The entries of `a` and `b` that differ ("" when none), one per line.
std::string differences(const std::string& a, const std::string& b) {
  const auto ca = content(a), cb = content(b);
  std::string d;
  for (const auto& [k, v] : ca)
    if (!cb.count(k) || cb.at(k) != v) d += k + (cb.count(k) ? " differs" : " only in the first") + "\n";
  for (const auto& [k, v] : cb)
    if (!ca.count(k)) d += k + " only in the second\n";
  return d;
}

/// Runs `kdalab <args> --shard i/n --out dir/s<i>.h5` for i = 1..n and returns the files.
std::vector<std::string> run_shards(const TempDir& d, const std::string& args, int n) {
  std::vector<std::string> files;
  for (int i = 1; i <= n; ++i) {
    files.push_back(d.file(fmt::format("s{}.h5", i)));
    const auto r = run_kdalab(fmt::format("{} --quiet --shard {}/{} --out {}", args, i, n, files.back()));
    INFO(args << " shard " << i << "/" << n << ": " << r.output);
    REQUIRE(r.code == 0);
  }
  return files;
}

std::string join(const std::vector<std::string>& v) { return fmt::format("{}", fmt::join(v, " ")); }

/// Sets the string attribute `name` of the root of results file `file` (to make a foreign or overlapping shard).
void set_root_attr(const std::string& file, const std::string& name, const std::string& value) {
  H5::H5File f(file, H5F_ACC_RDWR);
  H5::Group g = f.openGroup("/");
  if (g.attrExists(name)) g.removeAttr(name);
  H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  t.setCset(H5T_CSET_UTF8);
  g.createAttribute(name, t, H5::DataSpace(H5S_SCALAR)).write(t, value);
}


TEST_CASE("shards merged equal the unsharded run for every sweeping subcommand, timing columns aside",
          "[shard][merge][parity][recall][copy][decay-range][decode-cost]") {
  struct Case {
    std::string args;
    int shards;
    std::string group;  ///< a sharded table the merge joins
  };
  // small grids of several points each; parity's holds skipped-row notes (softplus float32-chunk) and no-GPU notes
  const std::vector<Case> cases = {
      {"parity --quick --T 17,64 --impl float64,float32-chunk,twin-bf16,cuda-bf16 --matmul-precision plan "
       "--state-precision fp32", 3, "parity/table"},
      // shards 3 and 4 hold only softplus points, whose float32-chunk rows are all skipped: files without rows
      {"parity --quick --T 17 --impl float32-chunk", 4, "parity/table"},
      {"parity --backward --quick --T 8,16 --dk 8 --dv 8 --gate bounded,softplus", 2, "parity_backward/table"},
      {"recall --quick --d-k 8,16 --trials 1", 3, "recall/capacity"},
      {"copy --quick --d-k 8,16 --L 8,16 --trials 1", 4, "copy/accuracy"},
      {"decay-range --quick --g-min=-5,-20 --T 64 --D 16 --C 16", 2, "decay_range/table"},
      {"decode-cost --quick --cpu-n 64,128,256,512 --min-time 0.001", 3, "decode_cost/cpu"},
  };
  for (const auto& c : cases) {
    SECTION(c.args) {
      TempDir d;
      const auto whole = run_kdalab(c.args + " --quiet --out " + d.file("whole.h5"));
      INFO(whole.output);
      REQUIRE(whole.code == 0);
      const auto files = run_shards(d, c.args, c.shards);
      // every shard records what it is and which grid points it covers; each holds part of the rows
      const auto grid = std::stoul(kdalab::h5read::attr_string(files[0], "/", "grid_points"));
      std::size_t covered = 0;
      for (std::size_t i = 0; i < files.size(); ++i) {
        CHECK(kdalab::h5read::attr_string(files[i], "/", "shard") == fmt::format("{}/{}", i + 1, c.shards));
        const auto pts = kdalab::h5read::attr_string(files[i], "/", "shard_points");
        covered += static_cast<std::size_t>(std::count(pts.begin(), pts.end(), ',') + 1);
        CHECK(!kdalab::h5read::attr_string(files[i], "/", "shard_cost_model").empty());
      }
      CHECK(covered == grid);
      // shards in any order
      std::vector<std::string> shuffled(files.rbegin(), files.rend());
      const auto m = run_kdalab("merge " + join(shuffled) + " --out " + d.file("merged.h5"));
      INFO(m.output);
      REQUIRE(m.code == 0);
      CHECK(differences(d.file("whole.h5"), d.file("merged.h5")).empty());
      INFO(differences(d.file("whole.h5"), d.file("merged.h5")));
      CHECK(!kdalab::h5read::has_attr(d.file("merged.h5"), "/", "shard"));
      CHECK(kdalab::h5read::attr_string(d.file("merged.h5"), "/", "merged_shards").find("s2.h5") != std::string::npos);
      // the build that ran the shards stays on record when another build merges them (the root git_sha is the merge's)
      const auto rec = nlohmann::json::parse(kdalab::h5read::attr_string(d.file("merged.h5"), "/", "merged_shards"));
      REQUIRE(rec.size() == files.size());
      for (const auto& e : rec) {
        CHECK(e.at("git_sha") == kdalab::h5read::attr_string(files[0], "/", "git_sha"));
        CHECK(e.at("software_version") == kdalab::h5read::attr_string(files[0], "/", "software_version"));
      }
      CHECK(!kdalab::h5read::has_attr(d.file("merged.h5"), c.group, "shard_row_keys"));
    }
  }
}

TEST_CASE("shards are assigned longest first: parity --quick's 12 points over 4 shards, one of each length per shard",
          "[shard][parity]") {
  TempDir d;
  // points in grid order T (17, 300, 1000) x gate (2) x beta (2): each T's 4 points are spread over the 4 shards
  const auto r = run_kdalab("parity --quick --impl float64 --T 17,300,1000 --quiet --shard 1/4 --out " + d.file("s.h5"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(kdalab::h5read::attr_string(d.file("s.h5"), "/", "shard_points") == "0,4,8");
  CHECK(kdalab::h5read::attr_string(d.file("s.h5"), "/", "grid_points") == "12");
}

TEST_CASE("merge refuses shard sets that are not one run's whole grid once (exit 2, one line, nothing written)",
          "[shard][merge]") {
  TempDir d;
  const std::string args = "recall --quick --d-k 8,16 --trials 1";
  const auto files = run_shards(d, args, 3);
  const std::string out = d.file("merged.h5");
  const auto refused = [&](const std::string& shard_files, const std::string& says) {
    const auto r = run_kdalab("merge " + shard_files + " --out " + out);
    INFO(shard_files << "\n" << r.output);
    require_one_line_exit2(r);
    CHECK(has(r, says));
    CHECK(!std::filesystem::exists(out));
  };
  SECTION("a missing shard") { refused(files[0] + " " + files[2], "shard 2 of 3 missing"); }
  SECTION("a shard given twice, under another name") {
    std::filesystem::copy_file(files[1], d.file("copy.h5"));
    refused(join(files) + " " + d.file("copy.h5"), "are both shard 2/3");
  }
  SECTION("the same file twice") { refused(join(files) + " " + files[0], "more than once"); }
  SECTION("a shard of another config") {
    const auto other = run_kdalab(args + " --vocab 4096 --quiet --shard 2/3 --out " + d.file("other.h5"));
    REQUIRE(other.code == 0);
    refused(files[0] + " " + d.file("other.h5") + " " + files[2], "another config");
  }
  SECTION("a shard of another seed") {
    const auto other = run_kdalab(args + " --seed 7 --quiet --shard 2/3 --out " + d.file("other.h5"));
    REQUIRE(other.code == 0);
    refused(files[0] + " " + d.file("other.h5") + " " + files[2], "seed 7");
  }
  SECTION("a shard of another subcommand") {
    const auto other = run_kdalab("copy --quick --d-k 8,16 --L 8,16 --trials 1 --quiet --shard 2/3 --out " + d.file("other.h5"));
    REQUIRE(other.code == 0);
    refused(files[0] + " " + d.file("other.h5") + " " + files[2], "is a shard of 'copy'");
  }
  SECTION("a shard of another build") {
    std::filesystem::copy_file(files[1], d.file("other.h5"));
    set_root_attr(d.file("other.h5"), "git_sha", "0000000");
    refused(files[0] + " " + d.file("other.h5") + " " + files[2], "another build");
  }
  SECTION("overlapping shards") {
    std::filesystem::copy_file(files[1], d.file("other.h5"));
    const auto first = kdalab::h5read::attr_string(files[0], "/", "shard_points");
    set_root_attr(d.file("other.h5"), "shard_points",
                  first + "," + kdalab::h5read::attr_string(files[1], "/", "shard_points"));
    refused(files[0] + " " + d.file("other.h5") + " " + files[2], "grid point " + first.substr(0, first.find(',')) + " is in");
  }
  SECTION("a file that is not a shard") {
    const auto whole = run_kdalab(args + " --quiet --out " + d.file("whole.h5"));
    REQUIRE(whole.code == 0);
    refused(d.file("whole.h5"), "is not a shard file");
  }
}

TEST_CASE("--shard takes I/N with 1 <= I <= N <= grid points; other values exit 2 naming --shard, nothing written",
          "[shard][recall]") {
  TempDir d;
  const std::string out = d.file("s.h5");
  for (const std::string v : {"0/0", "0/4", "5/4", "a/b", "1/0", "1/4/2", "1", "-1/4", "01/4", "1/4 ", "/4", "1/1000000", ""}) {
    const auto r = run_kdalab("recall --quick --d-k 8 --trials 1 --quiet --shard '" + v + "' --out " + out);
    INFO(v << ": " << r.output);
    require_one_line_exit2(r);
    CHECK(has(r, "--shard"));
    CHECK(has(r, "I/N"));
    CHECK(!std::filesystem::exists(out));
  }
  // more shards than grid points: the grid's size is named
  const auto r = run_kdalab("decay-range --quick --g-min=-5 --T 16 --D 8 --C 16 --shard 2/3 --out " + out);
  INFO(r.output);
  require_one_line_exit2(r);
  CHECK(has(r, "--shard: '2/3' is not accepted: this grid has 2 points"));
  CHECK(!std::filesystem::exists(out));
}

TEST_CASE("merge refuses a shard whose attribute holds no value or several (exit 2 naming it, nothing written)",
          "[shard][merge]") {
  TempDir d;
  const auto files = run_shards(d, "recall --quick --d-k 8,16 --trials 1", 2);
  const std::string out = d.file("merged.h5");
  H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
  const hsize_t three = 3;
  const double v[3] = {1, 2, 3};
  const std::vector<std::pair<std::string, std::function<void(H5::Group&)>>> rows = {
      {"0", [&](H5::Group& g) { g.createAttribute("extra", st, H5::DataSpace(H5S_NULL)); }},
      {"0", [&](H5::Group& g) { g.createAttribute("extra", H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_NULL)); }},
      {"3", [&](H5::Group& g) {
         g.createAttribute("extra", H5::PredType::NATIVE_DOUBLE, H5::DataSpace(1, &three)).write(H5::PredType::NATIVE_DOUBLE, v);
       }},
  };
  for (const auto& [count, add] : rows) {
    std::filesystem::copy_file(files[1], d.file("bad.h5"), std::filesystem::copy_options::overwrite_existing);
    {
      H5::H5File f(d.file("bad.h5"), H5F_ACC_RDWR);
      H5::Group g = f.openGroup("/");
      add(g);
    }
    const auto r = run_kdalab("merge " + files[0] + " " + d.file("bad.h5") + " --out " + out);
    INFO(count << " values\n" << r.output);
    require_one_line_exit2(r);
    CHECK(has(r, "attribute 'extra' of '/' holds " + count + " values; accepted: one text or one number"));
    CHECK(!std::filesystem::exists(out));
  }
}

TEST_CASE("merge refuses a shard whose shard_count, shard_index or grid_points is not an integer in its range, or "
          "whose shard_points is not a list of whole integers (exit 2 naming it, nothing written)", "[shard][merge]") {
  TempDir d;
  const auto files = run_shards(d, "recall --quick --d-k 8,16 --trials 1", 2);
  const std::string out = d.file("merged.h5");
  // {attribute, value, set in both files (the counts must agree between shards), what the line says}
  const std::vector<std::tuple<std::string, std::string, bool, std::string>> rows = {
      {"shard_count", "18446744073709551615", true, "root attribute shard_count = '18446744073709551615' is not accepted"},
      {"shard_count", "-1", true, "root attribute shard_count = '-1' is not accepted"},
      {"shard_count", "abc", true, "root attribute shard_count = 'abc' is not accepted"},
      {"shard_count", "0", true, "root attribute shard_count = '0' is not accepted; a shard file holds an integer in [1, 100000]"},
      {"grid_points", "x", true, "root attribute grid_points = 'x' is not accepted"},
      {"grid_points", "-1", true, "root attribute grid_points = '-1' is not accepted"},
      {"grid_points", "1", true, "root attribute grid_points = '1' is not accepted; a shard file holds an integer in [2, "},
      {"shard_index", "x", false, "root attribute shard_index = 'x' is not accepted"},
      {"shard_index", "3", false, "root attribute shard_index = '3' is not accepted; a shard file holds an integer in [1, 2]"},
      {"shard_points", "1,x", false, "attribute shard_points of '/' is not a list of integers"},
      {"shard_points", "1,3abc", false, "attribute shard_points of '/' is not a list of integers"},
      {"shard_points", "1,,3", false, "attribute shard_points of '/' is not a list of integers"},
  };
  for (const auto& [name, value, both, says] : rows) {
    INFO(name << " = " << value);
    std::vector<std::string> bad;
    for (std::size_t i = 0; i < files.size(); ++i) {
      bad.push_back(d.file(fmt::format("bad{}.h5", i)));
      std::filesystem::copy_file(files[i], bad.back(), std::filesystem::copy_options::overwrite_existing);
      if (both || i == 1) set_root_attr(bad.back(), name, value);
    }
    const auto r = run_kdalab("merge " + join(bad) + " --out " + out);
    INFO(r.output);
    require_one_line_exit2(r);
    CHECK(has(r, says));
    CHECK(!std::filesystem::exists(out));
  }
  // a grid far larger than its shards' points allocates nothing for it: the first points missing and their count
  std::vector<std::string> big;
  for (std::size_t i = 0; i < files.size(); ++i) {
    big.push_back(d.file(fmt::format("big{}.h5", i)));
    std::filesystem::copy_file(files[i], big.back(), std::filesystem::copy_options::overwrite_existing);
    set_root_attr(big.back(), "grid_points", "9223372036854775807");
  }
  const auto r = run_kdalab("merge " + join(big) + " --out " + out);
  INFO(r.output);
  require_one_line_exit2(r);
  CHECK(has(r, "more are in no file given; give every shard 1..2 once"));
  CHECK(!std::filesystem::exists(out));
}

}  // namespace shard_merge_test
