// Placeholder until the hybrid reference (ISSUE 4) lands: `kdalab info --config MODEL.json`.
#include "experiments/cli.hpp"

namespace kdalab::cli {
bool print_model_info(const std::string&, ResultsFile*) { return false; }
}  // namespace kdalab::cli
