#pragma once
/// The `kdalab` command line: a registry of subcommands (one experiment file registers one),
/// JSON configs whose keys are the subcommand's long option names, and the shared run context.
///
/// Config rule (docs/cli.md): `--config FILE.json` holds an object whose keys are long
/// option names without dashes ("T", "out", "seed", ...); options given on the command line
/// override the file; an unknown key, a missing file or malformed JSON is an error (exit 2).
/// CLI11's own config reader is not used (CLI11 2.1.2 ignores --config on subcommands).
#include <string>

namespace CLI::detail {
/// CLI11 2.1 renders option values of type double through a default std::stringstream (6 significant
/// digits: 1048576 -> "1.04858e+06"), which made the results files' `config` attribute and --help
/// lossy. This non-template overload, declared before CLI11's templates, wins their tie in overload
/// resolution and prints the shortest string that reads back to the same double (fmt "{}").
/// Must stay the only place CLI11 is included (one overload set in every translation unit).
std::string to_string(double v);
}  // namespace CLI::detail

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiments/progress.hpp"
#include "experiments/results.hpp"
#include "experiments/shard.hpp"

namespace kdalab::cli {

/// Options every subcommand has.
struct Common {
  std::string config;      ///< --config FILE.json
  std::string out;         ///< --out FILE.h5 (each subcommand sets a default)
  std::uint64_t seed = 1;  ///< --seed N
  bool quick = false;      ///< --quick: a small version that runs in seconds to a minute
  bool force = false;      ///< --force: overwrite an existing --out
  bool quiet = false;      ///< --quiet: no progress lines
  std::string shard;       ///< --shard I/N (sweeping subcommands only: add_shard_option); "" the whole grid
};

/// What a running subcommand gets.
struct Context {
  std::string name;          ///< subcommand name
  Common common;             ///< the common options after config merging
  std::string command_line;  ///< argv joined
  nlohmann::json config;     ///< effective config (every option's final value)
  CLI::App* app = nullptr;   ///< the parsed subcommand
  std::vector<std::string> inputs;  ///< the subcommand's Command::inputs (long names of its input file options)
  /// The inputs options check_input_files() has checked so far (run() checks the others after `check`: once each).
  std::vector<std::string> inputs_checked;
  ShardSpec shard;  ///< --shard parsed by run() before the subcommand's check (inactive: the whole grid)

  /// Opens the results file for --out with the root attributes filled in (checks --force). Refuses first, as
  /// check_out_not_inputs() does, an --out that is one of the input files (whatever Command::writes_output says).
  std::unique_ptr<ResultsFile> open_results() const;
  /// Throws kdalab::Error (exit 2) when --out is one of the files the subcommand reads: --config or an option named in
  /// `inputs`, compared by identity (same_file). "--out 'OUT' is the input file --config ('FILE'); ...". Called by
  /// run() for a Command with writes_output, by open_results(), and by a subcommand that checks --out itself.
  /// Nothing to do when --out is "".
  void check_out_not_inputs() const;
  /// A progress reporter honouring --quiet.
  Progress progress(const std::string& label, std::size_t total) const;
};

struct Command {
  CLI::App* app = nullptr;
  std::shared_ptr<Common> common;
  /// Runs the subcommand; returns the exit code. Throws kdalab::Error on bad input.
  std::function<int(Context&)> run;
  /// Whether the subcommand writes --out (then the path is checked before any work starts). A subcommand that writes
  /// --out with this false must call ctx.check_out_not_inputs() and
  /// check_output_path() itself before any output; open_results() refuses an --out that is an input in any case.
  bool writes_output = true;
  /// --out "" means no file (info: --out is optional): then nothing about --out is checked.
  bool out_optional = false;
  /// Long names (without dashes) of the options whose values name files the subcommand reads, e.g. {"in"};
  /// --config is always one. run() compares their values by file identity (same_file): a file given twice in a list
  /// option is a repeat (require_once) however it is spelled, and, when writes_output, --out is never one of them
  /// (exit 2: "--out 'OUT' is the input file --in ('FILE'); ..."), checked after `check` and before --out itself.
  std::vector<std::string> inputs;
  /// The subcommand's checks that write nothing (its option values, opening its input files), run by run() after
  /// parsing and before --out is checked, so that with several faults a bad option or a missing input is named before
  /// a bad --out, in the same order in every build (e.g. check: --op, --truth, --tol, then --in). Empty: none.
  /// Throws kdalab::Error (exit 2). The state it checks stays in the subcommand's options for `run`.
  std::function<void(Context&)> check;
};

/// Sets the --quick help of a subcommand to say which defaults --quick changes (`what`, e.g. "--trials 2, --vocab
/// 2048"), so that --help tells a reader what a quick run is without reading the code; the values used are also
/// recorded in the results file's root attribute `config`. Each caller builds `what` from the same constants its
/// check() applies.
void describe_quick(Command& c, const std::string& what);

class Registry {
 public:
  explicit Registry(CLI::App& root) : root_(root) {}
  /// Adds subcommand `name` with the common options; `default_out` is --out's default.
  Command& add(const std::string& name, const std::string& description, const std::string& default_out);
  std::vector<Command>& commands() { return cmds_; }
  CLI::App& root() { return root_; }

 private:
  CLI::App& root_;
  std::vector<Command> cmds_;
};

/// Adds --shard I/N to a sweeping subcommand (experiments/shard.hpp; docs/cluster.md). run() parses it into
/// Context::shard before the subcommand's check; the subcommand builds a ShardPlan of its grid. Recorded in the
/// results file's `config` only when given.
void add_shard_option(Command& c);

/// Registration functions, one per experiment file (experiments/<name>.cpp).
void register_info(Registry&);
void register_parity(Registry&);
void register_recall(Registry&);
void register_copy(Registry&);
void register_decay_range(Registry&);
void register_decode_cost(Registry&);
void register_bench(Registry&);
void register_golden(Registry&);
void register_check(Registry&);
void register_merge(Registry&);

/// Runs the whole command line: returns the process exit code (0 success, 2 bad input or usage,
/// 1 an unexpected failure). Prints errors as one line on stderr.
int run(int argc, char** argv);

/// The one rule for list options (every subcommand): a value given twice is refused with kdalab::Error
/// "<option>: <value> is given more than once; give each value once" unless `once`. run() applies it after parsing
/// to every option declared with a std::vector variable (CLI11 expected_max > 1: comma lists such as parity --T,
/// file lists such as bench --compare), comparing numbers by value and text exactly; an option that parses a list
/// out of one text value (bench --shapes) calls it itself. Exit 2, nothing written.
void require_once(bool once, const std::string& option, const std::string& value);

/// Option type names, shown in --help and enforced by run() for every subcommand before any work:
///  "INT" (also on a double variable that holds a count): decimal integers only, [+-]?(0|[1-9][0-9]*) (CLI11 itself
///      would read 0x5 as 5 and 010 as octal 8; 1e3 and 16.0 are refused too); "UINT64" the same without a sign;
///  "FLOAT": finite decimal numbers (no NaN/Inf, no hexadecimal 0x1p3) that a double holds as given: 0 or a magnitude in
///      [2^-1022, DBL_MAX] (1e400 overflows; 1e-400 would be read as 0 and 1e-310 as a denormal with fewer significant
///      digits, so both are refused, quoting the text as given); numbers never with surrounding whitespace;
///  "BOOLEAN": true, false, 1 or 0 only (--help shows its default as 1 or 0); "TEXT": as given (the subcommand checks it).
/// A list option's type name gets " list" appended by run() ("INT list", "FLOAT list", "TEXT list"); a list item is
/// never empty ("17,,300", ",17", "17," and "," are refused). Every list option splits its values on commas and takes
/// them space-separated or with the option repeated too, file lists included (bench --compare a.h5,b.h5 is two files).
/// A non-list option, a flag (--quick) included, is given at most once. --help anywhere after the subcommand prints
/// its help and exits 0, whatever else the line holds.
/// Values outside the range of the option's variable are refused in the same message shape (option, value, accepted).
inline constexpr const char* kInt = "INT";

/// Whether the paths `a` and `b` name one file: std::filesystem::equivalent when both exist (a symlink, a hard link,
/// "./x.h5" or "dir/../x.h5" for "x.h5"), otherwise their absolute weakly_canonical forms are equal (a file not yet
/// written, spelled two ways). Never throws; "" is no file (false).
bool same_file(const std::string& a, const std::string& b);

/// The rules of the files of input option `option` (a Command::inputs long name, e.g. "peer-json"): each a regular file
/// when it exists (require_regular_input: a FIFO would block the read forever) and none given twice (same_file: "x"
/// and "./x" are one file). Errors: kdalab::Error naming the option and the file (exit 2). A Command whose check
/// reads its inputs calls it for each, before reading, where its order of checks puts them (after its options);
/// cli::run calls it after the check for every Command::inputs option the check did not (ctx.inputs_checked, where it
/// records `option`), so each file list is checked once.
void check_input_files(Context& ctx, const std::string& option);

/// Parses `text` as one JSON value (trailing text is an error: nlohmann's parse_error is thrown; nesting deeper than
/// kdalab::kMaxJsonDepth, reference/model_config.hpp: kdalab::Error saying so) and reports in
/// `repeated` the first key that appears twice in one object ("" when none; nlohmann alone keeps the last one
/// silently). Used for --config and bench --peer-json.
/// With `numbers_as_typed`, every number that is not an integer nlohmann holds exactly (a fraction, an exponent, an
/// integer beyond 64 bits) is returned as a JSON string holding its text as typed ("1e-400", not 0.0;
/// "99999999999999999999", not 1e+20), so that --config values reach the command line's checks as given.
nlohmann::json parse_json_once(const std::string& text, std::string& repeated, bool numbers_as_typed = false);

/// The subcommands of `root` but `except` that take every key of `j` as an option (long names without dashes, as
/// --config files give them): the subcommands `j` is a kdalab options file for, e.g. {"parity"} for
/// data/configs/parity.json. Empty when `j` is not a non-empty JSON object or has a key no subcommand takes (a model
/// config.json's hidden_size). Used by info --config to say what a file that is not a model config is.
std::vector<std::string> options_file_commands(CLI::App* root, const nlohmann::json& j, const std::string& except);

/// Refuses (kdalab::Error, exit 2) an input file option's value `path` that exists but is not a regular file or a
/// folder (a FIFO, a device, a socket: reading one may block forever or never end): "--OPTION 'PATH' is not a regular
/// file (a FIFO, device or socket); give GIVE". A missing file or a folder is left to the subcommand's own message.
/// run() applies it to --config and every Command::inputs option right after parsing, before `check`.
void require_regular_input(const std::string& option, const std::string& path, const std::string& give);

/// `s` with each byte that is not printable UTF-8 (a control character but tab, an invalid or truncated UTF-8 sequence)
/// written as \xNN: error lines quote file content (a JSON parser's "last read: '...'" on an HDF5 file) and names.
std::string printable(const std::string& s);

}  // namespace kdalab::cli
