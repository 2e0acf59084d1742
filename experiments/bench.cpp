// `kdalab bench`: Benchmarks of the CUDA kernels (median time by CUDA events, TB/s, TFLOP/s, % of the copy and matmul ceilings, peer time and ratio when a peer is importable); --compare BASELINE.h5 flags rows more than 10% slower.
// Placeholder registration: the options are described; the experiment itself is not built yet.
#include "experiments/cli.hpp"
#include "reference/error.hpp"

namespace kdalab::cli {

void register_bench(Registry& reg) {
  auto& c = reg.add("bench", "Benchmarks of the CUDA kernels (median time by CUDA events, TB/s, TFLOP/s, % of the copy and matmul ceilings, peer time and ratio when a peer is importable); --compare BASELINE.h5 flags rows more than 10% slower.", "results/bench.h5");
  auto* a = c.app;
  static std::string op, cmp;
  a->add_option("--op", op, "kernel to benchmark: kda-prefill, kda-decode, mla-decode, mla-prefill, attn-res");
  a->add_option("--compare", cmp, "baseline results file to compare against (prints ratios, flags > 10% slower)");
  c.run = [](Context&) -> int {
    throw Error("'bench' is not built yet (see the open issues); nothing was written");
  };
}

}  // namespace kdalab::cli
