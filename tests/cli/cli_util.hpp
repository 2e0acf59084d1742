#pragma once
// Helpers for tests that run the kdalab binary (path in env KDALAB_BIN, set by tests/CMakeLists.txt), write
// input files for it and read back what it wrote.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cctype>
#include <random>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>

#include <H5Cpp.h>
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "experiments/results.hpp"
#include "tests/catch.hpp"

namespace kdalab::testutil {

struct RunResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

inline std::string kdalab_bin() {
  const char* b = std::getenv("KDALAB_BIN");
  return b ? b : "build/default/experiments/kdalab";
}

/// Runs the shell command line `cmd` (from the working directory, the repo root under ctest), capturing
/// stdout+stderr and the exit code (-1 when it did not exit normally).
inline RunResult run_command(const std::string& cmd_line) {
  RunResult r;
  const std::string cmd = cmd_line + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// Runs `kdalab <args>` through the shell, capturing stdout+stderr and the exit code.
inline RunResult run_kdalab(const std::string& args) { return run_command(kdalab_bin() + " " + args); }

/// Whether `r`, a `kdalab bench` run with valid options, ended as this build allows: without the CUDA kernels
/// exit 3 saying "not available in this build" (experiments/bench.cpp kExitNotAvailable); a CUDA build exit 0
/// (measured) or exit 3 saying "no GPU visible". Never 0 without a GPU: a GPU-less CI gate must not pass.
inline bool bench_valid_exit(const RunResult& r) {
#ifdef KDALAB_HAVE_CUDA
  return r.code == 0 || (r.code == 3 && r.output.find("no GPU visible") != std::string::npos);
#else
  return r.code == 3 && r.output.find("not available in this build") != std::string::npos;
#endif
}

/// True when the captured output of `r` contains `s`.
inline bool has(const RunResult& r, const std::string& s) { return r.output.find(s) != std::string::npos; }

/// The whole content of the file at `path` ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A fresh empty folder under the system temp dir, removed on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("kdalab-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
  std::size_t count() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path)) ++n;
    return n;
  }
};

/// `kdalab <args>` under `timeout 60`, so that a regression that blocks cannot hang the suite (exit 124 = a hang).
inline RunResult run_timed(const std::string& args) { return run_command("timeout 60 " + kdalab_bin() + " " + args); }

/// `kdalab <args>` run inside folder `dir` (for relative spellings of one file).
inline RunResult run_in(const std::filesystem::path& dir, const std::string& args) {
  return run_command("cd " + dir.string() + " && " + std::filesystem::absolute(kdalab_bin()).string() + " " + args);
}

/// The smallest valid bench command line (no --out).
inline const std::string kTiny = "bench --op kda-prefill --shapes 1:16:1 --iters 1 --warmup 0";
/// Stored benchmark results (valid --compare files).
inline const std::string kBaseline = "data/baselines/h200.h5";

/// A fresh folder for one test (removed first) under the system temp dir.
inline std::string fresh_dir(const std::string& name) {
  const std::string d = (std::filesystem::temp_directory_path() / ("kdalab_test_" + name)).string();
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

/// Writes `text` to the file `path` (replaced).
inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

/// Number of '\n' in `s`.
inline std::size_t lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

/// How many times `s` occurs in `text`.
inline std::size_t count(const std::string& text, const std::string& s) {
  std::size_t n = 0;
  for (auto p = text.find(s); p != std::string::npos; p = text.find(s, p + 1)) ++n;
  return n;
}

/// The strings of `parts` one after the other (GCC 12's -Wrestrict misfires on "literal" + std::string here).
inline std::string cat(std::initializer_list<std::string> parts) {
  std::string r;
  for (const auto& p : parts) r += p;
  return r;
}

/// The one-line error shape: exit 2, one line on stderr+stdout together, starting "kdalab".
inline void require_one_line_exit2(const RunResult& r) {
  INFO(r.output);
  REQUIRE(r.code == 2);
  CHECK(r.output.rfind("kdalab", 0) == 0);
  CHECK(r.output.find('\n') == r.output.size() - 1);
}

/// Every byte of `s` is printable ASCII or a newline.
inline bool printable_ascii(const std::string& s) {
  for (const char ch : s) {
    const auto b = static_cast<unsigned char>(ch);
    if (b != '\n' && (b < 0x20 || b > 0x7e)) return false;
  }
  return true;
}

inline bool is_fifo(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

/// Writes an HDF5 file at `path` whose content `fill` makes.
inline void write_h5(const std::string& path, const std::function<void(H5::H5File&)>& fill) {
  H5::H5File f(path, H5F_ACC_TRUNC);
  fill(f);
}

/// A 1-D variable-length string dataset `name` in `g`.
inline void str_col(H5::Group& g, const std::string& name, const std::vector<std::string>& v) {
  H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
  const hsize_t n = v.size();
  H5::DataSpace sp(1, &n);
  std::vector<const char*> p;
  for (const auto& s : v) p.push_back(s.c_str());
  g.createDataSet(name, st, sp).write(p.data(), st);
}

/// A 1-D float64 dataset `name` in `g`.
inline void num_col(H5::Group& g, const std::string& name, const std::vector<double>& v) {
  const hsize_t n = v.size();
  H5::DataSpace sp(1, &n);
  g.createDataSet(name, H5::PredType::NATIVE_DOUBLE, sp).write(v.data(), H5::PredType::NATIVE_DOUBLE);
}

/// A float64 dataset `name` of shape `dims` near `value` (value * (1 + 0.01 * (i % 7))).
inline void write_f64(H5::H5File& f, const std::string& name, const std::vector<hsize_t>& dims, double value) {
  H5::DataSpace sp(static_cast<int>(dims.size()), dims.data());
  std::size_t n = 1;
  for (hsize_t d : dims) n *= d;
  std::vector<double> v(n, value);
  for (std::size_t i = 0; i < n; ++i) v[i] = value * (1.0 + 0.01 * static_cast<double>(i % 7));
  f.createDataSet(name, H5::PredType::NATIVE_DOUBLE, sp).write(v.data(), H5::PredType::NATIVE_DOUBLE);
}
inline void attr_num(H5::H5File& f, const std::string& name, double v) {
  f.openGroup("/").createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_DOUBLE, &v);
}
inline void attr_str(H5::H5File& f, const std::string& name, const std::string& v) {
  H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
  f.openGroup("/").createAttribute(name, st, H5::DataSpace(H5S_SCALAR)).write(st, v);
}

/// The root attribute `config` of a results file, parsed.
inline nlohmann::json recorded(const std::string& file) {
  return nlohmann::json::parse(h5read::attr_string(file, "/", "config"));
}

/// The text after "note: " on every line that starts with it.
inline std::vector<std::string> note_lines(const std::string& out) {
  std::vector<std::string> notes;
  std::size_t p = 0;
  while (p < out.size()) {
    const std::size_t e = out.find('\n', p);
    const std::string line = out.substr(p, e == std::string::npos ? std::string::npos : e - p);
    if (line.rfind("note: ", 0) == 0) notes.push_back(line.substr(6));
    if (e == std::string::npos) break;
    p = e + 1;
  }
  return notes;
}

/// A column of a results file.
inline std::vector<double> col(const std::string& f, const std::string& ds) { return h5read::array(f, ds).data; }
inline std::vector<std::string> scol(const std::string& f, const std::string& ds) { return h5read::strings(f, ds); }
inline void require_columns(const std::string& f, const std::string& table, const std::vector<std::string>& cols) {
  for (const auto& c : cols) {
    INFO(table << "/" << c);
    CHECK(h5read::exists(f, table + "/" + c));
  }
}

/// The rows of a results table keyed by the text of its key columns (joined by '|'), valued by its value columns.
inline std::map<std::string, std::vector<double>> rows_by_key(const std::string& f, const std::string& table,
                                                              const std::vector<std::string>& text_keys,
                                                              const std::vector<std::string>& num_keys,
                                                              const std::vector<std::string>& values) {
  std::vector<std::vector<std::string>> tk;
  std::vector<std::vector<double>> nk, vals;
  for (const auto& k : text_keys) tk.push_back(h5read::strings(f, table + "/" + k));
  for (const auto& k : num_keys) nk.push_back(h5read::array(f, table + "/" + k).data);
  for (const auto& v : values) vals.push_back(h5read::array(f, table + "/" + v).data);
  const std::size_t n = vals.at(0).size();
  std::map<std::string, std::vector<double>> out;
  for (std::size_t i = 0; i < n; ++i) {
    std::string key;
    for (const auto& c : tk) key += c.at(i) + "|";
    for (const auto& c : nk) key += std::to_string(c.at(i)) + "|";
    std::vector<double> v;
    for (const auto& c : vals) v.push_back(c.at(i));
    out[key] = v;
  }
  return out;
}

/// Kimi Linear 48B's config (data/configs) with `edit` applied, written to `d`/model.json; returns its path.
template <class F>
std::string model_config(const TempDir& d, F&& edit) {
  std::ifstream f("data/configs/kimi-linear-48b.json");
  nlohmann::json j = nlohmann::json::parse(f);
  edit(j);
  d.write("model.json", j.dump());
  return d.file("model.json");
}
/// `info --config` on Kimi Linear 48B with `key` (a "linear_attn_config." or "kdalab." prefix names the nested
/// object) set to `value`.
inline RunResult info_with(const TempDir& d, const std::string& key, const nlohmann::json& value) {
  return run_kdalab("info --config " + model_config(d, [&](nlohmann::json& j) {
                      const auto dot = key.find('.');
                      if (dot == std::string::npos) j[key] = value;
                      else j[key.substr(0, dot)][key.substr(dot + 1)] = value;
                    }));
}

/// The help text of option `name` in `kdalab SUB --help` output: its line and the indented lines that continue it.
inline std::string option_help(const std::string& help, const std::string& name) {
  const auto at = help.find("  " + name);
  if (at == std::string::npos) return "";
  auto end = help.find("\n  -", at + 1);
  return help.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

inline void check_says(const RunResult& r, const std::string& says) { CHECK(r.output.find(says) != std::string::npos); }
inline void check_says(const RunResult& r, const std::vector<std::string>& says) {
  for (const auto& s : says) CHECK(r.output.find(s) != std::string::npos);  // "...\n": the list ends the message
}
/// Runs each row {args, says} of a table of bad command lines as `kdalab <head><args><tail> --out <d>/<stem><k>.h5`
/// (k = 1, 2, ...: each row its own --out, so that a file left by one row cannot fail the next) and checks that it
/// is refused: exit 2, every text of `says` (one string or a list) in the output, then `also(r)` where given. A
/// failure names the row's args and shows the output. The caller checks that no file was left (d.count()).
template <class Says>
void check_refused_rows(const TempDir& d, const std::vector<std::pair<std::string, Says>>& rows, const std::string& head,
                        const std::string& tail, const std::string& stem,
                        const std::function<void(const RunResult&)>& also = {}) {
  int k = 0;
  for (const auto& [args, says] : rows) {
    const auto r = run_kdalab(head + args + tail + " --out " + d.file(fmt::format("{}{}.h5", stem, ++k)));
    INFO(args << ": " << r.output);
    CHECK(r.code == 2);
    check_says(r, says);
    if (also) also(r);
  }
}
/// Runs `kdalab <args>` and checks that it is accepted (exit 0; a failure shows the output).
inline void check_accepted(const std::string& args) {
  const auto r = run_kdalab(args);
  INFO(r.output);
  CHECK(r.code == 0);
}
/// A boolean's default as --help shows it and a results file records it ("softplus": "1") is accepted in --config.
inline void check_config_boolean_accepted(const TempDir& d) {
  d.write("b.json", "{\"softplus\": \"1\", \"kernel-plan\": false}");
  check_accepted("decay-range --quick --quiet --T 64 --D 16 --C 16 --g-min -5 --precision fp64 --softplus 0 "
                 "--config " + d.file("b.json") + " --out " + d.file("b.h5"));
}

/// The option lines of a CLI11 help text ("  --name TYPE=default   description"). Newer CLI11 versions (2.4.1 on
/// the GPU machine, 2.1 in Debian 12) wrap long descriptions onto indented continuation lines and print defaults
/// as "TYPE [default]": continuation lines are joined to their option line.
inline std::vector<std::string> option_lines(const std::string& help) {
  std::vector<std::string> r;
  std::stringstream ss(help);
  std::string line;
  bool in_option = false;
  while (std::getline(ss, line)) {
    if (line.rfind("  --", 0) == 0) {
      r.push_back(line);
      in_option = true;
    } else if (const std::size_t pos = line.find_first_not_of(' ');
               in_option && pos != std::string::npos && pos >= 4 && line[pos] != '-') {
      r.back().push_back(' ');
      r.back().append(line, pos, std::string::npos);
    } else {
      in_option = false;
    }
  }
  return r;
}

inline std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// A `kdalab check --op kda --kernel` input the kernel takes (K3 gate, beta logits, l2norm_qk = 1, d_k = d_v = 64,
/// H = HV, bf16 q/k/v/g/beta, fp32 A_log/bias/S0), seeded random values that are exact bf16 numbers (k/8).
inline void write_kernel_input(const std::string& path, bool good_gate = true) {
  std::mt19937 rng(20261129);
  std::uniform_int_distribution<int> u(-16, 16);
  auto vals = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(u(rng)) / 8.0f;
    return v;
  };
  write_h5(path, [&](H5::H5File& f) {
    H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
    auto ds = [&](const std::string& name, std::vector<hsize_t> dims, std::vector<float> v, const char* fmt_attr) {
      H5::DataSpace sp(static_cast<int>(dims.size()), dims.data());
      H5::DataSet x = f.createDataSet(name, H5::PredType::NATIVE_FLOAT, sp);
      x.write(v.data(), H5::PredType::NATIVE_FLOAT);
      if (fmt_attr) x.createAttribute("format", st, H5::DataSpace(H5S_SCALAR)).write(st, std::string(fmt_attr));
      return x;
    };
    const hsize_t B = 1, T = 4, H = 1, D = 64;
    for (const char* n : {"q", "k", "v", "g"}) ds(n, {B, T, H, D}, vals(B * T * H * D), "bf16");
    ds("beta", {B, T, H}, vals(B * T * H), "bf16");
    ds("A_log", {H}, vals(H), nullptr);
    ds("bias", {H, D}, vals(H * D), nullptr);
    H5::DataSet s0 = ds("S0", {B, H, D, D}, vals(B * H * D * D), nullptr);
    s0.createAttribute("layout", st, H5::DataSpace(H5S_SCALAR)).write(st, std::string("KV"));
    H5::Group root = f.openGroup("/");
    auto num = [&](const char* k, double v) {
      root.createAttribute(k, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_DOUBLE, &v);
    };
    num("scale", 0.125);
    num("l2norm_qk", 1);
    num("g_min", -5);
    root.createAttribute("gate", st, H5::DataSpace(H5S_SCALAR)).write(st, std::string(good_gate ? "k3" : "none"));
    root.createAttribute("beta", st, H5::DataSpace(H5S_SCALAR)).write(st, std::string("logits"));
  });
}

}  // namespace kdalab::testutil
