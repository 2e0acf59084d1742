// `kdalab copy`: Copying through a fixed state: exact-copy accuracy of a length-L string over an alphabet |D| vs L, state size and precision, beside the information bound (state bits vs L log2|D|).
// Placeholder registration: the options are described; the experiment itself is not built yet.
#include "experiments/cli.hpp"
#include "reference/error.hpp"

namespace kdalab::cli {

void register_copy(Registry& reg) {
  auto& c = reg.add("copy", "Copying through a fixed state: exact-copy accuracy of a length-L string over an alphabet |D| vs L, state size and precision, beside the information bound (state bits vs L log2|D|).", "results/copy.h5");
  auto* a = c.app;
  static std::string L;
  a->add_option("--L", L, "string lengths to sweep (list)");
  c.run = [](Context&) -> int {
    throw Error("'copy' is not built yet (see the open issues); nothing was written");
  };
}

}  // namespace kdalab::cli
