// kdalab: the command line. All logic is in experiments/cli.cpp and one file per subcommand.
// kdalab::cli::run is declared here as in experiments/cli.hpp, without including it: cli.hpp brings CLI11, whose
// header-only code (its validator objects) every file that includes it compiles again (~3 s of CPU).
namespace kdalab::cli {
int run(int argc, char** argv);
}  // namespace kdalab::cli

int main(int argc, char** argv) { return kdalab::cli::run(argc, argv); }
