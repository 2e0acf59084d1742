#pragma once
// Helpers shared by the figure-script tests (scripts/fig_*.py run with --dump): the interpreter, the skip when it
// lacks the plotting modules, and the small decode-cost run the decode-cost figure tests draw. Catch2 (WARN) and
// tests/cli_io/cli_util.hpp (run_command, run_kdalab).
#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.hpp"
#include "tests/cli_io/cli_util.hpp"

namespace kdalab::testutil {

/// The interpreter the figure scripts are tested with (scripts/setup.sh installs h5py and matplotlib for it).
inline const char* const kPy = "/usr/bin/python3";

/// True (with a warning) when /usr/bin/python3 lacks h5py or matplotlib: the calling figure test then returns early.
inline bool skip_without_plotting() {
  if (run_command(std::string(kPy) + " -c 'import h5py, matplotlib' >/dev/null 2>&1").code == 0) return false;
  WARN("/usr/bin/python3 lacks h5py or matplotlib (scripts/setup.sh installs them): figure tests skipped");
  return true;
}

/// A small `kdalab decode-cost` run into `h5` (CPU rows at n = 1024, 2048, 4096, d = 64; no GPU rows), for the
/// decode-cost figure tests; REQUIREs exit 0 (its output in the failure message).
inline void make_small_decode_cost(const std::string& h5) {
  const auto r = run_kdalab("decode-cost --cpu-n 1024,2048,4096 --cpu-d 64 --min-time 0.01 --n 1000 --d 64 "
                            "--context 1024 --gpu-n 0 --quiet --out " + h5);
  INFO(r.output);
  REQUIRE(r.code == 0);
}

/// Runs scripts/<script> on `h5` with --dump only (no image files) and returns the dump; REQUIREs exit 0.
inline nlohmann::json dump_figure(const TempDir& d, const std::string& script, const std::string& h5) {
  const std::string dump = d.file(script + ".json");
  const auto r = run_command(std::string(kPy) + " scripts/" + script + " " + h5 + " --dump " + dump);
  INFO(script << ": " << r.output);
  REQUIRE(r.code == 0);
  return nlohmann::json::parse(slurp(dump));
}

/// Runs a python snippet with h5py and numpy (as np) imported, e.g. to write a hand-made results file; REQUIREs exit 0.
inline void python_h5(const std::string& code) {
  const auto r = run_command(std::string(kPy) + " -c \"import h5py, numpy as np\n" + code + "\"");
  INFO(code << "\n" << r.output);
  REQUIRE(r.code == 0);
}

}  // namespace kdalab::testutil
