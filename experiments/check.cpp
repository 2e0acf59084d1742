// `kdalab check`: Check someone else's tensors: read q, k, v, gates, beta (and optional S0, o, S) from an HDF5 file, compute the truth on exactly those inputs and report relative RMS, max abs, max bf16 ULP and NaN/Inf counts per candidate tensor, with a verdict against --tol.
// Placeholder registration: the options are described; the experiment itself is not built yet.
#include "experiments/cli.hpp"
#include "reference/error.hpp"

namespace kdalab::cli {

void register_check(Registry& reg) {
  auto& c = reg.add("check", "Check someone else's tensors: read q, k, v, gates, beta (and optional S0, o, S) from an HDF5 file, compute the truth on exactly those inputs and report relative RMS, max abs, max bf16 ULP and NaN/Inf counts per candidate tensor, with a verdict against --tol.", "results/check.h5");
  auto* a = c.app;
  static std::string op, in, truth; static double tolv = 0;
  a->add_option("--op", op, "operation: kda, kda-decode, mla, attn-res");
  a->add_option("--in", in, "input HDF5 file (format in the README)");
  a->add_option("--truth", truth, "truth precision: mp (cpp_bin_float_50) or f64");
  a->add_option("--tol", tolv, "verdict tolerance on relative RMS (default from numerics/tolerance.hpp)");
  c.run = [](Context&) -> int {
    throw Error("'check' is not built yet (see the open issues); nothing was written");
  };
}

}  // namespace kdalab::cli
