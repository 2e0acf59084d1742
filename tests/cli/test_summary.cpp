// scripts/summary.py: piped into a reader that stops early, it ends without a traceback.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>

#include "tests/catch.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/cli/figure_util.hpp"

using namespace kdalab::testutil;

TEST_CASE("summary.py piped into a reader that stops early ends without a traceback", "[figures][summary]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string h5 = d.file("dc.h5");
  make_small_decode_cost(h5);
  // `true` reads nothing and exits at once: every write of summary.py meets a closed pipe
  const RunResult r = run_command(std::string(kPy) + " scripts/summary.py " + h5 + " 2>" + d.file("err.txt") + " | true");
  const std::string err = slurp(d.file("err.txt"));
  INFO(err);
  CHECK(err.find("Traceback") == std::string::npos);
  CHECK(err.find("BrokenPipeError") == std::string::npos);
  CHECK(err.empty());
}

TEST_CASE("summary.py names a truncated or malformed HDF5 file in one line, exit 2, and still summarises the others",
          "[figures][summary]") {
  if (skip_without_plotting()) return;
  const TempDir d;
  const std::string good = d.file("dc.h5"), cut = d.file("cut.h5"), text_metric = d.file("text.h5"),
                    bad_text = d.file("latin1.h5"), no_n = d.file("no_n.h5");
  make_small_decode_cost(good);
  // the first half of a results file: the HDF5 signature is there, the file cannot be opened
  std::filesystem::copy_file(good, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(good) / 2);
  python_h5("f = h5py.File('" + text_metric + "', 'w'); g = f.create_group('recall/capacity'); "
            "g['memory'] = np.array([b'kda', b'mla']); g['accuracy'] = np.array([b'high', b'low'])");
  python_h5("f = h5py.File('" + bad_text + "', 'w'); f.attrs['software'] = np.bytes_(b'kdal\\xe4b')");
  python_h5("f = h5py.File('" + no_n + "', 'w'); g = f.create_group('decode_cost/hybrid'); "
            "g['layout'] = np.array([b'a']); g['seconds_per_token'] = np.array([1.0])");
  // stdout and stderr together (run_command): each bad file is one error line among the summaries
  const RunResult r =
      run_command(std::string(kPy) + " scripts/summary.py " + cut + " " + text_metric + " " + bad_text + " " + no_n + " " + good);
  const std::string& out = r.output;
  INFO(out);
  CHECK(r.code == 2);
  CHECK(out.find("Traceback") == std::string::npos);
  std::size_t errors = 0;
  for (std::size_t at = out.find("summary.py: error: "); at != std::string::npos; at = out.find("summary.py: error: ", at + 1))
    ++errors;
  CHECK(errors == 4);
  CHECK(out.find("summary.py: error: " + cut + ": not a readable HDF5 file (") != std::string::npos);
  CHECK(out.find("summary.py: error: " + text_metric + ": recall/capacity: cannot summarise it (ValueError: ") !=
        std::string::npos);
  CHECK(out.find("summary.py: error: " + bad_text + ": /: cannot summarise it (UnicodeDecodeError: ") != std::string::npos);
  CHECK(out.find("summary.py: error: " + no_n + ": decode_cost/hybrid: cannot summarise it (KeyError: ") !=
        std::string::npos);
  CHECK(r.output.find(good + ": kdalab") != std::string::npos);  // the good file after them is still summarised
}
