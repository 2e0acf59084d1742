// `kdalab golden` and its fixture files: a missing, folder or FIFO fixture is named first (one line, exit 2, before
// any 'ok' line, never blocking), with or without --regen / --force; a damaged stored gradient is named once, with
// its dataset; run outside the repository root it names the working directory.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiments/decode_cost_note.hpp"
#include "experiments/results.hpp"
#include "reference/model_config.hpp"
#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;
using namespace kdalab;
using nlohmann::json;

TEST_CASE("golden names a missing, folder or FIFO fixture first (one line, exit 2, never blocking), with --regen too",
          "[golden]") {
  {
    const std::string d = fresh_dir("golden");
    for (const auto& e : std::filesystem::directory_iterator("data/golden"))
      if (e.path().extension() == ".h5") std::filesystem::copy_file(e.path(), d + "/" + e.path().filename().string());
    // the last fixtures checked: attn_res (a folder in its place), then hybrid (missing)
    std::filesystem::remove(d + "/attn_res.h5");
    std::filesystem::create_directory(d + "/attn_res.h5");
    RunResult r = run_kdalab("golden --dir " + d);
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "attn_res.h5' is a folder"));
    CHECK(lines(r.output) == 1);
    std::filesystem::remove(d + "/attn_res.h5");
    r = run_kdalab("golden --dir " + d);
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "attn_res.h5' is missing"));
    CHECK(lines(r.output) == 1);
  }
  {
    TempDir d;
    const std::string g = d.file("g");
    std::filesystem::create_directories(g + "/kda_recurrent.h5");
    for (const std::string force : {"", " --force"}) {
      const RunResult r = run_kdalab("golden --regen --quiet --dir " + g + force);
      INFO(force << "\n" << r.output);
      CHECK(r.code == 2);
      CHECK(has(r, "golden file '" + g + "/kda_recurrent.h5' is a folder, not a regular file"));
      CHECK(!has(r, "exists"));
      CHECK(lines(r.output) == 1);
    }
    std::filesystem::remove(g + "/kda_recurrent.h5");
    REQUIRE(::mkfifo((g + "/mla.h5").c_str(), 0644) == 0);
    const RunResult r = run_kdalab("golden --regen --quiet --dir " + g);
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK(has(r, "golden file '" + g + "/mla.h5' is a FIFO, device or socket, not a regular file"));
    // nothing was written: the FIFO is the only entry
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(g)) ++n;
    CHECK(n == 1);
  }
  {
    // one fixture of each loop of the check (golden_ops: kda_*; the layer ops: mla, hybrid, ...)
    for (const std::string name : {"kda_recurrent.h5", "mla.h5"}) {
      TempDir d;
      const std::string dir = d.file("g");
      std::filesystem::copy("data/golden", dir, std::filesystem::copy_options::recursive);
      std::filesystem::remove(dir + "/" + name);
      REQUIRE(::mkfifo((dir + "/" + name).c_str(), 0600) == 0);
      const auto r = run_timed("golden --dir " + dir);
      INFO(r.output);
      CHECK(r.code == 2);  // 124 is the timeout: the FIFO's open blocked
      CHECK(has(r, "golden file '" + dir + "/" + name + "' is not a regular file (a FIFO, device or socket); give a "
                   "golden HDF5 file"));
      CHECK(d.count() == 1);
    }
    // the real fixtures still pass
    const auto ok = run_timed("golden");
    INFO(ok.output);
    CHECK(ok.code == 0);
  }
}

TEST_CASE("golden run outside the repository root names the working directory instead of suggesting --regen",
          "[golden]") {
  TempDir d;
  const std::string bin = std::filesystem::absolute(kdalab_bin()).string();
  const auto r = run_command("cd " + d.path.string() + " && " + bin + " golden");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("working directory") != std::string::npos);
  CHECK(r.output.find("--dir") != std::string::npos);
  CHECK(!std::filesystem::exists(d.file("data")));  // nothing written there
}

TEST_CASE("golden names a damaged stored gradient (a NaN, another size) by its dataset, the file once, exit 2",
          "[golden]") {
  TempDir d;
  const std::string g = d.file("g");
  std::filesystem::create_directories(g);
  for (const auto& e : std::filesystem::directory_iterator("data/golden"))
    if (e.path().extension() == ".h5") std::filesystem::copy_file(e.path(), g + "/" + e.path().filename().string());
  const std::string file = g + "/kda_recurrent_grad.h5", ds = "/grouped_T24/dq";
  {
    H5::H5File f(file, H5F_ACC_RDWR);
    H5::DataSet x = f.openDataSet(ds);
    std::vector<double> v(static_cast<std::size_t>(x.getSpace().getSimpleExtentNpoints()));
    x.read(v.data(), H5::PredType::NATIVE_DOUBLE);
    v[0] = std::nan("");
    x.write(v.data(), H5::PredType::NATIVE_DOUBLE);
  }
  RunResult r = run_kdalab("golden --dir " + g);
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "golden file '" + file + "': dataset '" + ds + "' holds nan at flat index 0"));
  // the error line is the only one naming a file (the 'ok' lines name checks)
  CHECK(count(r.output, "golden file '") == 1);
  CHECK(count(r.output, "regenerate with") == 1);
  {
    H5::H5File f(file, H5F_ACC_RDWR);
    f.unlink(ds);
    write_f64(f, ds, {1, 24, 1, 5}, 0.5);  // 120 values where the gradient has 1 x 24 x 1 x 8
  }
  r = run_kdalab("golden --dir " + g);
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(has(r, "dataset '" + ds + "' has shape [1, 24, 1, 5], expected [1, 24, 1, 8]"));
  CHECK(count(r.output, "golden file '") == 1);
}

TEST_CASE("golden --dir '' is refused naming --dir, with or without --regen (never read as the root folder)",
          "[golden]") {
  for (const std::string args : {"golden --dir ''", "golden --dir '' --regen", "golden --dir '' --regen --force"}) {
    const RunResult r = run_kdalab(args);
    INFO(args << ": " << r.output);
    require_one_line_exit2(r);
    CHECK(has(r, "--dir: an empty folder name is not accepted"));
  }
}
