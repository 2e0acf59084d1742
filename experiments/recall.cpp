// `kdalab recall`: Multi-query associative recall without training: write N key/value pairs into each memory (softmax, MLA, linear attention, GLA, DeltaNet, Gated DeltaNet, KDA), read back each queried key and decode to the nearest value; accuracy and relative error vs N / d_k.
// Placeholder registration: the options are described; the experiment itself is not built yet.
#include "experiments/cli.hpp"
#include "reference/error.hpp"

namespace kdalab::cli {

void register_recall(Registry& reg) {
  auto& c = reg.add("recall", "Multi-query associative recall without training: write N key/value pairs into each memory (softmax, MLA, linear attention, GLA, DeltaNet, Gated DeltaNet, KDA), read back each queried key and decode to the nearest value; accuracy and relative error vs N / d_k.", "results/recall.h5");
  auto* a = c.app;
  static std::string dk;
  a->add_option("--d-k", dk, "key dimensions to sweep (list)");
  c.run = [](Context&) -> int {
    throw Error("'recall' is not built yet (see the open issues); nothing was written");
  };
}

}  // namespace kdalab::cli
