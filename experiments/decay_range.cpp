// `kdalab decay-range`: Error of the chunked KDA algorithm vs g_min and chunk size C in bf16/fp16/fp32, with overflow/underflow/subnormal counts: why g_min = -5 and 16-token tiles go together.
// Placeholder registration: the options are described; the experiment itself is not built yet.
#include "experiments/cli.hpp"
#include "reference/error.hpp"

namespace kdalab::cli {

void register_decay_range(Registry& reg) {
  auto& c = reg.add("decay-range", "Error of the chunked KDA algorithm vs g_min and chunk size C in bf16/fp16/fp32, with overflow/underflow/subnormal counts: why g_min = -5 and 16-token tiles go together.", "results/decay_range.h5");
  auto* a = c.app;
  static std::string gmin;
  a->add_option("--g-min", gmin, "lower bounds of the gate to sweep (list)");
  c.run = [](Context&) -> int {
    throw Error("'decay-range' is not built yet (see the open issues); nothing was written");
  };
}

}  // namespace kdalab::cli
