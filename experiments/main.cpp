// kdalab: the command line. All logic is in experiments/cli.cpp and one file per subcommand.
#include "experiments/cli.hpp"

int main(int argc, char** argv) { return kdalab::cli::run(argc, argv); }
