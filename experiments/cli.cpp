#include "experiments/cli.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "experiments/build_info.hpp"
#include "reference/error.hpp"

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
            if (!digits || errno == ERANGE) return "--seed: '" + v + "' is not an integer in [0, 2^64 - 1]";
            return std::string();
          },
          ""));  // no description: --help shows the type name UINT64 alone (it showed UINT:UINT64)
  a->add_flag("--quick", c.common->quick, "run a small version (seconds to a minute on a laptop CPU)");
  a->add_flag("--force", c.common->force, "overwrite --out if it exists (otherwise an existing file is never touched)");
  a->add_flag("--quiet", c.common->quiet, "no progress lines on stderr");
  cmds_.push_back(std::move(c));
  return cmds_.back();
}

namespace {
nlohmann::json effective_config(CLI::App* sub);
}  // namespace

std::unique_ptr<ResultsFile> Context::open_results() const {
  // Recomputed here, not taken from `config` (made before the run): --quick and the experiments'
  // own adjustments change option values inside run(), and the file must record what was used.
  RunInfo info{command_line, (app ? effective_config(app) : config).dump(), std::to_string(common.seed)};
  return std::make_unique<ResultsFile>(common.out, common.force, info);
}

Progress Context::progress(const std::string& label, std::size_t total) const {
  return Progress(label, total, common.quiet);
}

void require_once(bool once, const std::string& option, const std::string& value) {
  require(once, option + ": " + value + " is given more than once; give each value once");
}

std::vector<double> parse_list(const std::string& text, const std::string& option) {
  std::vector<double> out;
  std::string tok;
  std::stringstream ss(text);
  while (std::getline(ss, tok, ',')) {
    std::stringstream inner(tok);
    std::string t;
    while (inner >> t) {
      try {
        std::size_t used = 0;
        out.push_back(std::stod(t, &used));
        require(used == t.size(), "");
      } catch (...) {
        throw Error("--" + option + ": '" + t + "' is not a number (give a list like 16,32,64)");
      }
    }
  }
  require(!out.empty(), "--" + option + ": the list is empty; give at least one value");
  return out;
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

/// Tokens to prepend for the config keys not given on the command line.
std::vector<std::string> config_tokens(CLI::App* sub, const std::string& path) {
  std::ifstream in(path);
  require(static_cast<bool>(in), "--config '" + path + "': file not found or not readable");
  nlohmann::json j;
  try {
    // parse() of the whole file: trailing text after the object is an error, not ignored.
    j = nlohmann::json::parse(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {
    throw Error("--config '" + path + "': not valid JSON (" + std::string(e.what()) + ")");
  }
  require(j.is_object(), "--config '" + path + "': must hold a JSON object of option names to values");
  std::vector<std::string> toks;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    CLI::Option* o = find_long(sub, key);
    if (!o || key == "help" || key == "config") {
      std::string known;
      for (CLI::Option* q : sub->get_options())
        if (const auto n = long_name(q); !n.empty() && n != "help" && n != "config") known += (known.empty() ? "" : ", ") + n;
      throw Error("--config '" + path + "': unknown key '" + key + "' for '" + sub->get_name() + "'; accepted keys: " + known);
    }
    if (o->count() > 0) continue;  // the command line wins
    const auto& v = it.value();
    auto scalar = [&](const nlohmann::json& x) -> std::string {
      if (x.is_string()) {
        const std::string sv = x.get<std::string>();
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
      // recorded "force": true) must never overwrite a file by itself (adversarial find, session 3)
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

/// Appends " list" to the type name of every list option of `sub` (a std::vector variable: expected_max > 1), so
/// that --help says "INT list", "FLOAT list", "TEXT list" (list options carry no validator whose description
/// would be repeated here).
void name_lists(CLI::App* sub) {
  for (CLI::Option* o : sub->get_options())
    if (o->get_expected_max() > 1 && !o->get_type_name().ends_with(" list")) o->type_name(o->get_type_name() + " list");
}

bool is_decimal_integer(const std::string& v) {
  static const std::regex re("[+-]?(0|[1-9][0-9]*)");
  return std::regex_match(v, re);
}

/// Enforces the type names of cli.hpp (kInt) on every value given to `sub` (command line and --config alike),
/// then the one list rule (require_once): integers in decimal only, numbers finite and decimal (NaN/Inf and
/// out-of-range numbers like 1e400 crash or write NaN silently; no experiment accepts them), no value twice in a
/// list. TEXT and BOOLEAN values are left to the subcommand ("info.json" is a name, not a number).
void check_option_values(CLI::App* sub) {
  for (CLI::Option* o : sub->get_options()) {
    const std::string n = long_name(o);
    if (n.empty()) continue;
    const std::string type = o->get_type_name();
    const bool integer = type.starts_with("INT") || type.starts_with("UINT");
    const bool number = integer || type.starts_with("FLOAT");
    const auto& values = o->results();
    for (const std::string& v : values) {
      if (!number) break;
      std::string t = v;
      for (auto& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      const auto p = t.find_first_not_of("+-");
      const std::string core = p == std::string::npos ? t : t.substr(p);
      if (core.rfind("inf", 0) == 0 || core.rfind("nan", 0) == 0)
        throw Error("--" + n + ": value '" + v + "' is not a finite number; give a finite value");
      require(!integer || is_decimal_integer(v),
              "--" + n + ": '" + v + "' is not accepted; give a decimal integer (digits, an optional sign, no leading "
              "zero: not 0x10, 010, 1e3 or 16.0)");
      require(t.find('x') == std::string::npos,
              "--" + n + ": '" + v + "' is not accepted; give a decimal number (not hexadecimal)");
      errno = 0;
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (end && *end == '\0' && end != v.c_str() && (errno == ERANGE && std::fabs(x) > 1.0))
        throw Error("--" + n + ": value '" + v + "' is out of the range of a double; give a finite value");
    }
    if (o->get_expected_max() <= 1) continue;
    for (std::size_t i = 0; i < values.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        require_once(number ? std::strtod(values[i].c_str(), nullptr) != std::strtod(values[j].c_str(), nullptr)
                            : values[i] != values[j],
                     "--" + n, values[i]);
  }
}

nlohmann::json effective_config(CLI::App* sub) {
  nlohmann::json j = nlohmann::json::object();
  for (CLI::Option* o : sub->get_options()) {
    const std::string n = long_name(o);
    // --force is not recorded: replaying a results file's config must never overwrite a file unless the
    // replaying command line says --force itself (newcomer find, session 3)
    if (n.empty() || n == "help" || n == "config" || n == "force") continue;
    if (o->get_expected_max() == 0) {
      j[n] = o->count() > 0;
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
  fmt::print(stderr, "kdalab{}: error: {}\n", where.empty() ? "" : " " + where, msg);
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{
      "kdalab: a reference simulator and correctness-verification suite for the Kimi K3 attention stack "
      "(KDA, Gated MLA, Attention Residuals, the 3:1 hybrid). Each subcommand writes one HDF5 results file "
      "(--out) whose root attributes record how it was made. Run 'kdalab SUBCOMMAND --help' for its options.",
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
  for (auto& c : reg.commands()) name_lists(c.app);

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
  }
  try {
    auto a1 = args;
    app.parse(a1);
    for (auto& c : reg.commands())
      if (c.app->parsed()) cmd = &c;
    require(cmd != nullptr, "no subcommand given");
    if (!cmd->common->config.empty() && cmd->app->get_name() != "info") {
      auto toks = config_tokens(cmd->app, cmd->common->config);
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
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all, --version
    print_error(cmd ? cmd->app->get_name() : "", std::string(e.what()) + " (see 'kdalab --help')");
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
  try {
    check_option_values(cmd->app);
    ctx.config = effective_config(cmd->app);
    if (cmd->writes_output) check_output_path(ctx.common.out, ctx.common.force);
    return cmd->run(ctx);
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
  } catch (const std::filesystem::filesystem_error& e) {
    print_error(ctx.name, std::string("file system: ") + e.what() + "; nothing was written");
    return 2;
  } catch (const std::exception& e) {
    print_error(ctx.name, std::string("unexpected failure: ") + e.what());
    return 1;
  } catch (...) {
    print_error(ctx.name, "unexpected failure (a library error; no result file was written)");
    return 1;
  }
}

}  // namespace kdalab::cli
