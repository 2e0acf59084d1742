#include "experiments/cli.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <stdexcept>

#include "experiments/build_info.hpp"
#include "reference/error.hpp"
#include "reference/model_config.hpp"

namespace CLI::detail {
std::string to_string(double v) { return fmt::format("{}", v); }
}  // namespace CLI::detail

namespace kdalab::cli {

Command& Registry::add(const std::string& name, const std::string& description, const std::string& default_out) {
  Command c;
  c.common = std::make_shared<Common>();
  c.common->out = default_out;
  c.app = root_.add_subcommand(name, description);
  auto* a = c.app;
  a->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  a->add_option("--config", c.common->config,
                "JSON file of options: an object whose keys are this subcommand's long option names without "
                "dashes (e.g. {\"seed\": 7, \"quick\": true}); options given on the command line win; an unknown "
                "key is an error");
  a->add_option("--out", c.common->out, "HDF5 results file to write (atomically: a temporary file renamed on success)")
      ->capture_default_str();
  a->add_option("--seed", c.common->seed,
                "seed of the portable input generator, an integer in [0, 2^64 - 1] (recorded in the results file)")
      ->capture_default_str()
      ->type_name("UINT64")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
            errno = 0;
            if (digits) (void)std::strtoull(v.c_str(), nullptr, 10);
            // CLI11 prefixes the option name ("--seed: ..."): the message must not name it again
            if (!digits || errno == ERANGE) return "'" + v + "' is not accepted; give an integer in [0, 2^64 - 1]";
            return std::string();
          },
          ""));  // no description: --help shows the type name UINT64 alone (it showed UINT:UINT64)
  // which values --quick picks is coded in each experiment's run(); the help points to where they are recorded rather
  // than copying them (--help shows the full defaults, so the text must say where the --quick values can be seen)
  a->add_flag("--quick", c.common->quick,
              "run a small version (seconds to a minute on a laptop CPU): smaller defaults for some options (those "
              "given explicitly win); the values used are recorded in the results file's root attribute `config`");
  a->add_flag("--force", c.common->force, "overwrite --out if it exists (otherwise an existing file is never touched)");
  a->add_flag("--quiet", c.common->quiet, "no progress lines on stderr");
  cmds_.push_back(std::move(c));
  return cmds_.back();
}

namespace {
nlohmann::json effective_config(CLI::App* sub);
}  // namespace

void add_shard_option(Command& c) {
  c.app->add_option("--shard", c.common->shard,
                    "run shard I of N of the grid (I/N, 1 <= I <= N <= the number of grid points): a deterministic part "
                    "balanced by expected cost; join the shard files with `kdalab merge` (docs/cluster.md)")
      ->type_name("I/N");
}

void describe_quick(Command& c, const std::string& what) {
  c.app->get_option("--quick")->description("run a small version (seconds to a minute on a laptop CPU): " + what +
                                            ", each unless given explicitly; the values used are recorded in the "
                                            "results file's root attribute `config`");
}

std::unique_ptr<ResultsFile> Context::open_results() const {
  // Recomputed here, not taken from `config` (made before the run): --quick and the experiments'
  // own adjustments change option values inside run(), and the file must record what was used.
  check_out_not_inputs();  // whatever Command::writes_output says (info --out m.json --config m.json --force must fail)
  RunInfo info{command_line, (app ? effective_config(app) : config).dump(), std::to_string(common.seed)};
  return std::make_unique<ResultsFile>(common.out, common.force, info);
}

Progress Context::progress(const std::string& label, std::size_t total) const {
  return Progress(label, total, common.quiet);
}

void require_once(bool once, const std::string& option, const std::string& value) {
  require(once, option + ": " + value + " is given more than once; give each value once");
}

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code e1, e2, e3;
  if (std::filesystem::exists(a, e1) && std::filesystem::exists(b, e2)) return std::filesystem::equivalent(a, b, e3) && !e3;
  // absolute() first: weakly_canonical keeps a relative path relative when none of its prefixes exists ("x.h5"), but
  // makes "./x.h5" absolute, and the two would differ
  const auto ca = std::filesystem::weakly_canonical(std::filesystem::absolute(a, e1), e1);
  const auto cb = std::filesystem::weakly_canonical(std::filesystem::absolute(b, e2), e2);
  return !e1 && !e2 && ca == cb;
}

namespace {
/// A SAX pass that keeps the text of every number nlohmann holds as a double, in document order.
struct FloatTexts {
  std::vector<std::string> texts;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(nlohmann::json::number_integer_t) { return true; }
  bool number_unsigned(nlohmann::json::number_unsigned_t) { return true; }
  bool number_float(nlohmann::json::number_float_t, const std::string& s) {
    texts.push_back(s);
    return true;
  }
  bool string(std::string&) { return true; }
  bool binary(nlohmann::json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool key(std::string&) { return true; }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception&) { return false; }
};
}  // namespace

nlohmann::json parse_json_once(const std::string& text, std::string& repeated, bool numbers_as_typed) {
  repeated.clear();
  // nlohmann reads 1e-400 as 0.0 and 99999999999999999999 as 1e+20: with numbers_as_typed each such number is put back
  // as its text (the value events of the parse below come in the same document order as the SAX pass's numbers)
  FloatTexts floats;
  if (numbers_as_typed) (void)nlohmann::json::sax_parse(text, &floats);
  std::size_t next_float = 0;
  // the keys seen so far in each object being parsed (a set: a vector made a 100000-key file take 45 s)
  std::vector<std::set<std::string>> open_keys;
  const auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& j) {
    // kdalab's JSON inputs are flat; a value nested 1000000 deep would crash the messages (dump() recursion: SIGSEGV)
    if (depth > kMaxJsonDepth)
      throw Error("nested more than " + std::to_string(kMaxJsonDepth) + " levels deep; accepted: at most " +
                  std::to_string(kMaxJsonDepth) + " (kdalab's JSON files are flat objects)");
    if (numbers_as_typed && ev == nlohmann::json::parse_event_t::value && j.is_number_float() &&
        next_float < floats.texts.size())
      j = floats.texts[next_float++];
    if (ev == nlohmann::json::parse_event_t::object_start) open_keys.emplace_back();
    if (ev == nlohmann::json::parse_event_t::object_end && !open_keys.empty()) open_keys.pop_back();
    if (ev == nlohmann::json::parse_event_t::key && !open_keys.empty() && j.is_string()) {
      auto& seen = open_keys.back();
      const std::string k = j.get<std::string>();
      if (!seen.insert(k).second && repeated.empty()) repeated = k;
    }
    return true;
  };
  return nlohmann::json::parse(text, cb);
}

namespace {

std::string long_name(const CLI::Option* o) {
  const auto& ln = o->get_lnames();
  return ln.empty() ? std::string() : ln.front();
}

CLI::Option* find_long(CLI::App* app, const std::string& key) {
  for (CLI::Option* o : app->get_options())
    for (const auto& ln : o->get_lnames())
      if (ln == key) return o;
  return nullptr;
}

}  // namespace

std::vector<std::string> options_file_commands(CLI::App* root, const nlohmann::json& j, const std::string& except) {
  std::vector<std::string> subs;
  if (!root || !j.is_object() || j.empty()) return subs;
  for (CLI::App* sub : root->get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == except) continue;
    bool all = true;
    for (auto it = j.begin(); all && it != j.end(); ++it) all = find_long(sub, it.key()) != nullptr;
    if (all) subs.push_back(sub->get_name());
  }
  return subs;
}

namespace {

/// Tokens to prepend for the config keys not given on the command line.
std::vector<std::string> config_tokens(CLI::App* sub, const std::string& path) {
  std::error_code ec;
  require(!std::filesystem::is_directory(path, ec), "--config '" + path + "': is a directory; give a JSON file");
  require_regular_input("--config", path, "a JSON file");  // a FIFO would block the read forever
  std::ifstream in(path, std::ios::binary);
  require(static_cast<bool>(in), "--config '" + path + "': file not found or not readable");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json j;
  std::string repeated;
  try {
    // parse of the whole file: trailing text after the object is an error, not ignored.
    j = parse_json_once(text, repeated, true);  // numbers as typed: {"overlap": 1e-400} is refused like --overlap 1e-400
  } catch (const std::exception& e) {
    throw Error("--config '" + path + "': not valid JSON (" + std::string(e.what()) + ")");
  }
  // nlohmann keeps the last of two equal keys silently ({"T": [17], "T": [300]} would run T = 300)
  require(repeated.empty(), "--config '" + path + "': key '" + repeated + "' appears twice; give each key once");
  require(j.is_object(), "--config '" + path + "': must hold a JSON object of option names to values");
  std::vector<std::string> toks;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    CLI::Option* o = find_long(sub, key);
    if (!o || key == "help" || key == "config") {
      std::string known;
      for (CLI::Option* q : sub->get_options())
        if (const auto n = long_name(q); !n.empty() && n != "help" && n != "config") known += (known.empty() ? "" : ", ") + n;
      // a model config.json (data/configs/kimi-k3.json) given to an experiment's --config would be reported as
      // "unknown key '_comment'" alone: say what the file is and where it belongs
      if (looks_like_model_config(j))
        throw Error("--config '" + path + "': this is a model config.json (it has hidden_size or num_hidden_layers), "
                    "not a kdalab options file for '" + sub->get_name() + "': model configs are read by `kdalab info "
                    "--config`; an options file is a JSON object of " + sub->get_name() + "'s option names (e.g. the "
                    "files in data/configs/ named after a subcommand); accepted keys: " + known);
      // printable(): a NUL in the key would end the message there (Error's what() is a C string)
      throw Error("--config '" + path + "': unknown key '" + printable(key) + "' for '" + sub->get_name() +
                  "'; accepted keys: " + known);
    }
    if (o->count() > 0) continue;  // the command line wins
    const auto& v = it.value();
    auto scalar = [&](const nlohmann::json& x) -> std::string {
      if (x.is_string()) {
        const std::string sv = x.get<std::string>();
        // no argument on the command line can hold a NUL; a file name or name holding one would be cut there (--out
        // "a\u0000b.h5" checked as "a", and every message quoting it cut short)
        require(sv.find('\0') == std::string::npos,
                "--config '" + path + "': key '" + key + "' has the value '" + printable(sv) +
                    "', which holds a NUL character (\\u0000); accepted: text without it");
        // A value must never be read as an option ("--force" inside a list would switch it on).
        require(sv.empty() || sv[0] != '-' || (sv.size() > 1 && (std::isdigit(static_cast<unsigned char>(sv[1])) || sv[1] == '.')),
                "--config '" + path + "': key '" + key + "' has the value '" + sv +
                    "', which looks like an option; values may not start with '-' unless they are numbers");
        return sv;
      }
      if (x.is_boolean()) return x.get<bool>() ? "true" : "false";
      if (x.is_number()) return x.dump();
      throw Error("--config '" + path + "': key '" + key + "' has a value of unsupported type (" + x.dump() + ")");
    };
    if (o->get_expected_max() == 0) {  // a flag
      require(v.is_boolean(), "--config '" + path + "': key '" + key + "' is a flag and takes true or false, got " + v.dump());
      // an overwrite is asked for on the command line only: replaying a results file's config (older files
      // recorded "force": true) must never overwrite a file by itself
      require(key != "force" || !v.get<bool>(),
              "--config '" + path + "': key 'force' = true is not taken from a config file (a replay must never "
              "overwrite a file by itself); give --force on the command line to overwrite --out");
      if (v.get<bool>()) toks.push_back("--" + key);
      continue;
    }
    toks.push_back("--" + key);
    require(!v.is_array() || o->get_expected_max() > 1,
            "--config '" + path + "': key '" + key + "' takes one value, got a list " + v.dump());
    if (v.is_array()) {
      require(!v.empty(), "--config '" + path + "': key '" + key + "' is an empty list");
      for (const auto& x : v) toks.push_back(scalar(x));
    } else {
      toks.push_back(scalar(v));
    }
  }
  return toks;
}

bool is_decimal_integer(const std::string& v) {
  static const std::regex re("[+-]?(0|[1-9][0-9]*)");
  return std::regex_match(v, re);
}

/// The check of one value `v` of an option of type name `type` (cli.hpp: INT, UINT64, FLOAT, BOOLEAN, each maybe
/// with " list"); "" when it is accepted, else the message without the option's name (CLI11 prefixes "--name: ").
/// Run by CLI11 before it converts the value (a validator), on the command line and --config alike, list items one
/// by one: integers in decimal only, numbers finite and decimal (NaN/Inf and out-of-range numbers like 1e400 crash
/// or write NaN silently; no experiment accepts them), no surrounding whitespace (" inf" got past the finite check
/// and strtod reads it as inf), booleans true, false, 1 or 0 (CLI11 read "0x1" and "" as false).
std::string check_value(const std::string& type, const std::string& v) {
  const bool integer = type.starts_with("INT") || type.starts_with("UINT");
  const bool number = integer || type.starts_with("FLOAT");
  if (type.starts_with("BOOLEAN")) {
    // 1 and 0 too: --help shows a boolean's default as 1 or 0 and results files record it so (a --config replay)
    if (v == "true" || v == "false" || v == "1" || v == "0") return "";
    return "'" + v + "' is not accepted; accepted: true, false, 1 or 0";
  }
  if (!number) return "";  // TEXT: a name, checked by the subcommand ("info.json" is not a number)
  if (v.empty()) return "'' is not accepted; give a number";
  if (std::isspace(static_cast<unsigned char>(v.front())) || std::isspace(static_cast<unsigned char>(v.back())))
    return "'" + v + "' is not accepted; give the number without surrounding whitespace";
  std::string t = v;
  for (auto& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const auto p = t.find_first_not_of("+-");
  const std::string core = p == std::string::npos ? t : t.substr(p);
  if (core.rfind("inf", 0) == 0 || core.rfind("nan", 0) == 0)
    return "value '" + v + "' is not a finite number; give a finite value";
  if (integer && !is_decimal_integer(v))
    return "'" + v + "' is not accepted; give a decimal integer (digits, an optional sign, no leading zero: not 0x10, "
           "010, 1e3 or 16.0)";
  if (t.find('x') != std::string::npos) return "'" + v + "' is not accepted; give a decimal number (not hexadecimal)";
  errno = 0;
  if (integer && type.starts_with("UINT")) {  // the range of a std::uint64_t, stated as --help states it
    const bool negative = v.front() == '-';
    if (!negative) (void)std::strtoull(v.c_str(), nullptr, 10);
    if (negative || errno == ERANGE) return "'" + v + "' is out of range; give an integer in [0, 2^64 - 1]";
    return "";
  }
  if (integer) {  // CLI11 clamps a 64-bit integer silently (strtoll): 99999999999999999999 read as 2^63 - 1
    (void)std::strtoll(v.c_str(), nullptr, 10);
    if (errno == ERANGE) return "'" + v + "' is out of range; give an integer in [-2^63, 2^63 - 1]";
    return "";
  }
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (!end || *end != '\0' || end == v.c_str()) return "";  // not a number: CLI11's conversion names it
  if (errno == ERANGE && std::fabs(x) > 1.0) return "value '" + v + "' is out of the range of a double; give a finite value";
  // underflow: a nonzero number read as 0 (1e-400) or as a denormal, which holds fewer significant digits than given
  // (1e-310); either way the value used would not be the one typed (decode-cost --min-time 1e-400 was refused as "0")
  const std::string mantissa = t.substr(0, t.find('e'));
  const bool nonzero = mantissa.find_first_of("123456789") != std::string::npos;
  if (nonzero && std::fabs(x) < DBL_MIN)
    return "'" + v + "' is not accepted: it is below the smallest normal double 2.2250738585072014e-308 in magnitude "
           "(a double would hold it as 0 or as a denormal with fewer digits than given); give a number of magnitude "
           ">= 2.2250738585072014e-308 (or exactly 0, where the option's range in --help includes 0)";
  return "";
}

/// Prepares every option of `sub` once, after registration: appends " list" to the type name of every list option
/// (a std::vector variable: expected_max > 1), so that --help says "INT list", "FLOAT list", "TEXT list"; attaches
/// check_value() to every INT/UINT/FLOAT/BOOLEAN option (a validator without a description: --help keeps the type
/// name alone); says in the description of a BOOLEAN option what it takes.
void prepare_options(CLI::App* sub) {
  for (CLI::Option* o : sub->get_options()) {
    if (o->get_expected_max() > 1 && !o->get_type_name().ends_with(" list")) o->type_name(o->get_type_name() + " list");
    if (o->get_expected_max() == 0) continue;  // a flag
    const std::string type = o->get_type_name();
    if (type.starts_with("BOOLEAN")) o->description(o->get_description() + "; BOOLEAN: true, false, 1 or 0");
    o->check(CLI::Validator([type](std::string& v) { return check_value(type, v); }, ""));
  }
}

/// Where `tok` would be read by CLI11 as an option name rather than a value ("-5" and "-.5" are values).
bool looks_like_option(const std::string& tok) {
  return tok.size() > 1 && tok[0] == '-' && !std::isdigit(static_cast<unsigned char>(tok[1])) && tok[1] != '.';
}

/// The rules CLI11 cannot see once it has split the values, checked on the tokens of `sub` (the command line after
/// the subcommand name, or --config's tokens) before it parses them:
///  - an empty item in a list option: CLI11 dropped it ("--T 17,,300" ran 17 and 300) or, when every item was empty
///    ("--T ,"), took the next argument as the list ("Could not convert: --T = --impl,float64");
///  - a non-list option given more than once: CLI11 kept the last value silently ("--seed 5 --seed 6" ran seed 6,
///    "bench --shapes A --shapes B" dropped A, "--config a --config b" read b only), a flag included ("--quick --quick"
///    was accepted; shown as its tokens as given). --help is not counted: run() prints the help before these checks.
void check_tokens(CLI::App* sub, const std::vector<std::string>& toks) {
  std::vector<std::pair<CLI::Option*, std::vector<std::string>>> given;  // non-list options and their values
  const auto list_item = [](CLI::Option* o, const std::string& v) {
    const char d = o->get_delimiter();
    const bool empty_item = v.empty() || (d != '\0' && (v.front() == d || v.back() == d ||
                                                        v.find(std::string(2, d)) != std::string::npos));
    require(!empty_item, "--" + long_name(o) + ": the list '" + v + "' has an empty item; give values separated by "
                         "single commas (e.g. 17,300)");
  };
  for (std::size_t i = 0; i < toks.size(); ++i) {
    const std::string& tok = toks[i];
    if (tok == "--") break;
    if (!tok.starts_with("--")) continue;
    const auto eq = tok.find('=');
    CLI::Option* o = find_long(sub, tok.substr(2, eq == std::string::npos ? std::string::npos : eq - 2));
    if (!o) continue;  // unknown: CLI11 names it
    std::vector<std::string> values;
    if (o->get_expected_max() == 0) {  // a flag: the token itself stands for its value ("--quick", "--quick=true")
      if (long_name(o) == "help") continue;
      // the spellings the help lists, no others (CLI11 also takes no, off, yes, on, ...)
      if (eq != std::string::npos) {
        const std::string fv = tok.substr(eq + 1);
        require(fv == "true" || fv == "false" || fv == "1" || fv == "0",
                "--" + long_name(o) + ": '" + fv + "' is not accepted; give true, false, 1 or 0");
      }
      values.push_back(tok);
    } else if (eq != std::string::npos) {
      values.push_back(tok.substr(eq + 1));
    } else if (i + 1 < toks.size()) {
      // CLI11 takes the first value whatever it looks like: "--precision --out x.h5" read '--out' as the precision and
      // then named only the stray "x.h5". A value that is one of this command's own options is a value left out.
      const std::string& next = toks[i + 1];
      if (next.starts_with("--")) {
        const auto neq = next.find('=');
        if (find_long(sub, next.substr(2, neq == std::string::npos ? std::string::npos : neq - 2)))
          throw Error("--" + long_name(o) + ": no value given (the next argument, '" + next + "', is an option); give "
                      "the value after --" + long_name(o));
      }
      values.push_back(toks[++i]);
      while (o->get_expected_max() > 1 && i + 1 < toks.size() && !looks_like_option(toks[i + 1]) && toks[i + 1] != "--")
        values.push_back(toks[++i]);
    }
    if (o->get_expected_max() > 1) {
      for (const auto& v : values) list_item(o, v);
      continue;
    }
    auto it = std::find_if(given.begin(), given.end(), [&](const auto& g) { return g.first == o; });
    if (it == given.end()) {
      given.emplace_back(o, values);
      continue;
    }
    std::string all;
    for (const auto& v : it->second) all += "'" + v + "', ";
    all += values.empty() ? std::string("...") : "'" + values.front() + "'";
    throw Error("--" + long_name(o) + ": the option is given more than once (" + all + "); give it once");
  }
}

/// The one list rule (require_once) on every list option of `sub` after parsing: no value twice in a list (numbers
/// compared by value, files, the options named in `inputs`, by identity (same_file: "x.h5" and "./x.h5" are one
/// file), other text exactly). The values themselves were checked by check_value() during parsing.
void check_option_values(CLI::App* sub, const std::vector<std::string>& inputs) {
  for (CLI::Option* o : sub->get_options()) {
    const std::string n = long_name(o);
    if (n.empty() || o->get_expected_max() <= 1) continue;
    const std::string type = o->get_type_name();
    const bool number = type.starts_with("INT") || type.starts_with("UINT") || type.starts_with("FLOAT");
    const bool file = std::find(inputs.begin(), inputs.end(), n) != inputs.end();
    if (file) continue;  // an input file list: check_input_files(), where the command's order of checks puts it
    const auto& values = o->results();
    for (std::size_t i = 0; i < values.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        require_once(number ? std::strtod(values[i].c_str(), nullptr) != std::strtod(values[j].c_str(), nullptr)
                     : file ? values[i] != values[j] && !same_file(values[i], values[j])
                            : values[i] != values[j],
                     "--" + n, values[i]);
  }
}

/// --out is never one of the files the subcommand reads (Command::inputs and --config): with --force it would be
/// overwritten. Files compared by identity (same_file). Exit 2 naming --out, the input option and its file ("is the
/// input file --in ('F')"; a file list option, bench's --compare / --peer-json: "is the --compare file 'F'").
std::vector<std::string> input_options(const std::vector<std::string>& inputs) {
  std::vector<std::string> names{"config"};
  names.insert(names.end(), inputs.begin(), inputs.end());
  return names;
}

void check_out_not_input(CLI::App* sub, const std::vector<std::string>& inputs, const std::string& out) {
  if (!sub || out.empty()) return;
  for (const std::string& n : input_options(inputs)) {
    CLI::Option* o = find_long(sub, n);
    if (!o) continue;
    std::vector<std::string> files = o->results();
    if (o->count() == 0 && o->get_expected_max() <= 1) {  // not given: the bound variable's value (a default input)
      o->capture_default_str();
      if (!o->get_default_str().empty()) files = {o->get_default_str()};
    }
    for (const std::string& f : files)
      require(!same_file(f, out),
              o->get_expected_max() > 1  // a file list (bench --compare, --peer-json): the message bench gave itself
                  ? "--out '" + out + "' is the --" + n + " file '" + f + "'; give another results file (--" + n +
                        " files are read, never overwritten)"
                  : "--out '" + out + "' is the input file --" + n + " ('" + f +
                        "'); give another output file (input files are read, never overwritten)");
  }
}

}  // namespace

void Context::check_out_not_inputs() const { check_out_not_input(app, inputs, common.out); }

void check_input_files(Context& ctx, const std::string& option) {
  ctx.inputs_checked.push_back(option);
  CLI::Option* o = ctx.app ? find_long(ctx.app, option) : nullptr;
  if (!o) return;
  const auto& files = o->results();
  for (std::size_t i = 0; i < files.size(); ++i) {
    require_regular_input("--" + option, files[i], "a regular file");
    for (std::size_t j = 0; j < i; ++j)
      require_once(files[i] != files[j] && !same_file(files[i], files[j]), "--" + option, files[i]);
  }
}

void require_regular_input(const std::string& option, const std::string& path, const std::string& give) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);  // follows a symlink (a link to a FIFO is a FIFO)
  require(!std::filesystem::exists(st) || std::filesystem::is_regular_file(st) || std::filesystem::is_directory(st),
          option + " '" + path + "' is not a regular file (a FIFO, device or socket); give " + give);
}

std::string printable(const std::string& s) {
  std::string r;
  const auto hex = [&](unsigned char b) { r += fmt::format("\\x{:02x}", b); };
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      if ((b < 0x20 && b != '\t') || b == 0x7f) hex(b);  // a tab is kept (a value as typed: "\tnan")
      else r += static_cast<char>(b);
      ++i;
      continue;
    }
    // a UTF-8 sequence: its length from the leading byte, continuation bytes 10xxxxxx, no overlong / surrogate forms
    const std::size_t len = b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok && len == 3) {
      const auto b1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(b == 0xe0 && b1 < 0xa0) && !(b == 0xed && b1 >= 0xa0);
    }
    if (ok && len == 4) {
      const auto b1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(b == 0xf0 && b1 < 0x90) && !(b == 0xf4 && b1 >= 0x90);
    }
    if (!ok) {
      hex(b);
      ++i;
      continue;
    }
    r.append(s, i, len);
    i += len;
  }
  return r;
}

namespace {

/// CLI11's ConversionError ("Could not convert: --iters = 9999999999999") in the project's shape: the option, the
/// value, what is accepted. After check_value() the values are well formed, so what is left is a number outside the
/// range of the option's variable (an int: --iters 9999999999999; an unsigned: a negative value).
std::string reword_conversion(CLI::App* sub, const std::string& what) {
  static const std::regex re("Could not convert: --([^ ]+) = (.*)");
  std::smatch m;
  CLI::Option* o = nullptr;
  if (sub && std::regex_match(what, m, re)) o = find_long(sub, m[1].str());
  if (!o) return what;
  const std::string type = o->get_type_name();
  std::string value = m[2].str();
  if (o->results().size() == 1) value = o->results().front();
  std::string accepted = "a value of type " + type;
  // a flag (--quick=banana) has no type name, so "give a value of type " would say nothing
  if (type.empty() || type.starts_with("BOOLEAN")) accepted = "true, false, 1 or 0";
  if (type.starts_with("INT") && is_decimal_integer(value)) {
    errno = 0;
    const long long x = std::strtoll(value.c_str(), nullptr, 10);
    if (errno != ERANGE && (x > INT_MAX || x < INT_MIN)) accepted = "an integer in [-2^31, 2^31 - 1]";
  }
  if (type.starts_with("UINT64")) accepted = "an integer in [0, 2^64 - 1]";
  else if (type.starts_with("UINT")) accepted = "an integer >= 0";
  return "--" + long_name(o) + ": '" + value + "' is not accepted; give " + accepted;
}

nlohmann::json effective_config(CLI::App* sub) {
  nlohmann::json j = nlohmann::json::object();
  for (CLI::Option* o : sub->get_options()) {
    const std::string n = long_name(o);
    // --force is not recorded: replaying a results file's config must never overwrite a file unless the
    // replaying command line says --force itself
    if (n.empty() || n == "help" || n == "config" || n == "force") continue;
    // --shard only when given: an unsharded run's config is what it was before the option existed, and kdalab merge
    // writes the unsharded run's config
    if (n == "shard" && o->count() == 0) continue;
    if (o->get_expected_max() == 0) {  // the value the run used: --quick=false and --quick=0 record false
      j[n] = o->count() > 0 && o->as<bool>();
      continue;
    }
    if (o->count() > 0) {
      const auto& r = o->results();
      if (r.size() == 1) j[n] = r.front();
      else j[n] = r;
    } else {
      // The bound variable's current value (after --quick or a subcommand's own defaults), not the
      // default string captured when the option was registered.
      o->capture_default_str();
      j[n] = o->get_default_str();
    }
  }
  return j;
}

void print_error(const std::string& where, const std::string& msg) {
  // printable(): a message may quote file content (bench --peer-json a.h5 would put a raw HDF5 byte in it)
  fmt::print(stderr, "kdalab{}: error: {}\n", printable(where.empty() ? "" : " " + where), printable(msg));
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{
      "kdalab: a reference simulator and correctness-verification suite for the Kimi K3 attention stack "
      "(KDA, Gated MLA, Attention Residuals, the 3:1 hybrid). Each experiment (parity, recall, copy, decay-range, "
      "decode-cost) writes one HDF5 results file (--out) whose root attributes record how it was made; check writes "
      "a report there, bench only when it runs on a GPU, info only when --out is given, golden never. An experiment "
      "run with --shard I/N computes part of its grid, and merge joins the parts into the whole file. Run 'kdalab "
      "SUBCOMMAND --help' for its options.",
      "kdalab"};
  app.require_subcommand(1, 1);
  app.set_version_flag("--version", std::string(build_info::version) + " (" + build_info::git_sha + ")");
  Registry reg(app);
  register_info(reg);
  register_parity(reg);
  register_recall(reg);
  register_copy(reg);
  register_decay_range(reg);
  register_decode_cost(reg);
  register_bench(reg);
  register_golden(reg);
  register_check(reg);
  register_merge(reg);
  for (auto& c : reg.commands()) prepare_options(c.app);

  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) args.emplace_back(argv[i]);  // CLI11 wants them reversed
  std::string cmdline = "kdalab";
  for (int i = 1; i < argc; ++i) cmdline += std::string(" ") + argv[i];

  Command* cmd = nullptr;
  if (argc >= 2 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (auto& c : reg.commands()) {
      known += (known.empty() ? "" : ", ") + c.app->get_name();
      found = found || c.app->get_name() == argv[1];
    }
    if (!found) {
      print_error("", std::string("unknown subcommand '") + argv[1] + "'; accepted: " + known + " (see 'kdalab --help')");
      return 2;
    }
    for (auto& c : reg.commands())  // known before parsing: an error while parsing names the subcommand too
      if (c.app->get_name() == argv[1]) cmd = &c;
  }
  if (argc >= 2 && looks_like_option(argv[1]) && std::string(argv[1]) != "--") {
    // an option before any subcommand that kdalab itself does not know ("kdalab -x"): CLI11 says only "A subcommand
    // is required", not naming it. kdalab's own options: --help, -h, --version.
    const std::string tok = argv[1];
    const std::string name = tok.substr(0, tok.find('='));
    if (app.get_option_no_throw(name) == nullptr) {
      std::string known;
      for (auto& c : reg.commands()) known += (known.empty() ? "" : ", ") + c.app->get_name();
      print_error("", "unknown option '" + tok + "'; give a subcommand first (" + known +
                          "; 'kdalab --help' lists them), then its options ('kdalab SUBCOMMAND --help')");
      return 2;
    }
  }
  if (cmd) {  // --help anywhere after the subcommand: its help, exit 0, whatever else the line holds (a bad value
              // such as "--T ,," was reported instead: check_tokens runs before CLI11 sees --help; CLI11 itself also
              // converts values before it looks at --help)
    for (int i = 2; i < argc && std::string(argv[i]) != "--"; ++i)
      if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
        fmt::print("{}", cmd->app->help("kdalab"));
        return 0;
      }
  }
  try {
    if (cmd) check_tokens(cmd->app, std::vector<std::string>(argv + 2, argv + argc));
    auto a1 = args;
    app.parse(a1);
    for (auto& c : reg.commands())
      if (c.app->parsed()) cmd = &c;
    require(cmd != nullptr, "no subcommand given");
    if (!cmd->common->config.empty() && cmd->app->get_name() != "info") {
      auto toks = config_tokens(cmd->app, cmd->common->config);
      check_tokens(cmd->app, toks);
      if (!toks.empty()) {
        // Re-parse with: kdalab <sub> <config tokens> <user tokens after sub>.
        std::vector<std::string> fwd(args.rbegin(), args.rend());
        std::vector<std::string> merged;
        std::size_t i = 0;
        for (; i < fwd.size(); ++i) {
          merged.push_back(fwd[i]);
          if (fwd[i] == cmd->app->get_name()) { ++i; break; }
        }
        merged.insert(merged.end(), toks.begin(), toks.end());
        merged.insert(merged.end(), fwd.begin() + static_cast<std::ptrdiff_t>(i), fwd.end());
        std::vector<std::string> rev(merged.rbegin(), merged.rend());
        app.clear();
        app.parse(rev);
      }
    }
  } catch (const CLI::ConversionError& e) {
    print_error(cmd ? cmd->app->get_name() : "", reword_conversion(cmd ? cmd->app : nullptr, e.what()));
    return 2;
  } catch (const CLI::ValidationError& e) {  // check_value(): "--option: 'value' is not accepted; ..." says it all
    print_error(cmd ? cmd->app->get_name() : "", e.what());
    return 2;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all, --version
    // the help that lists the options is the subcommand's ('kdalab --help' lists only the subcommands)
    print_error(cmd ? cmd->app->get_name() : "",
                std::string(e.what()) + " (see 'kdalab " + (cmd ? cmd->app->get_name() + " " : "") + "--help')");
    return 2;
  } catch (const Error& e) {
    print_error(cmd ? cmd->app->get_name() : "", e.what());
    return 2;
  }

  Context ctx;
  ctx.name = cmd->app->get_name();
  ctx.common = *cmd->common;
  ctx.command_line = cmdline;
  ctx.app = cmd->app;
  ctx.inputs = cmd->inputs;
  try {
    // --config is a regular file (or missing / a folder: the subcommand's own message) before anything opens it: a
    // FIFO would block forever. The Command::inputs files: check_input_files(), called by the command's check where
    // its order puts them (bench: after every option, so a bad --op is named before a FIFO --peer-json), and below
    // for those its check did not (once each: ctx.inputs_checked)
    if (CLI::Option* o = find_long(cmd->app, "config"))
      for (const std::string& f : o->results()) require_regular_input("--config", f, "a regular file");
    check_option_values(cmd->app, cmd->inputs);
    {
      const CLI::Option* so = find_long(cmd->app, "shard");
      ctx.shard = parse_shard(ctx.common.shard, so != nullptr && so->count() > 0);
    }
    ctx.config = effective_config(cmd->app);
    // the one order of checks: the subcommand's own (options, then its input files), --out not an input, --out
    if (cmd->check) cmd->check(ctx);
    for (const std::string& n : cmd->inputs)
      if (std::find(ctx.inputs_checked.begin(), ctx.inputs_checked.end(), n) == ctx.inputs_checked.end())
        check_input_files(ctx, n);
    if (cmd->writes_output && !(cmd->out_optional && ctx.common.out.empty())) {
      ctx.check_out_not_inputs();
      check_output_path(ctx.common.out, ctx.common.force);
    }
    return cmd->run(ctx);
  } catch (const EnvironmentError& e) {  // no space, an I/O error, a permission: the path and errno, exit 5
    print_error(ctx.name, e.what());
    return 5;
  } catch (const Error& e) {
    print_error(ctx.name, e.what());
    return 2;
  } catch (const std::length_error&) {  // a vector/string asked for more than max_size(): a size given was too large
    print_error(ctx.name, "a requested size is too large to hold in memory; reduce the sizes given (T, B, N, "
                          "trials, shapes in the input file, ...); nothing was written");
    return 2;
  } catch (const std::bad_alloc&) {
    print_error(ctx.name, "not enough memory for the requested problem size; reduce the sizes given (T, B, N, "
                          "trials, ...); nothing was written");
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {  // the environment failed (exit 5, docs/cli.md)
    print_error(ctx.name, std::string("file system: ") + e.what() + "; nothing was written");
    return 5;
  } catch (const std::exception& e) {
    print_error(ctx.name, std::string("unexpected failure: ") + e.what());
    return 1;
  } catch (...) {
    print_error(ctx.name, "unexpected failure (a library error; no result file was written)");
    return 1;
  }
}

}  // namespace kdalab::cli
