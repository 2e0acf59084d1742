#include "experiments/results.hpp"

#include <H5Cpp.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <random>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "experiments/build_info.hpp"
#include "reference/error.hpp"

namespace kdalab {
namespace fs = std::filesystem;

// ---- Column / Table ----------------------------------------------------------------------------
std::size_t Column::size() const {
  return std::visit([](const auto& v) { return v.size(); }, data);
}

Table& Table::col(const std::string& name, char kind, const std::string& units, const std::string& description) {
  require(n_rows_ == 0, "table column '" + name + "' declared after rows were added");
  Column c{name, units, description, {}};
  if (kind == 'd') c.data = std::vector<double>{};
  else if (kind == 'i') c.data = std::vector<std::int64_t>{};
  else if (kind == 's') c.data = std::vector<std::string>{};
  else throw Error("table column '" + name + "': kind must be 'd', 'i' or 's'");
  cols_.push_back(std::move(c));
  return *this;
}

void Table::row(const std::vector<Cell>& cells) {
  require(cells.size() == cols_.size(), "table row has " + std::to_string(cells.size()) + " cells, table has " +
                                            std::to_string(cols_.size()) + " columns");
  for (std::size_t i = 0; i < cells.size(); ++i) {
    auto& c = cols_[i];
    if (auto* v = std::get_if<std::vector<double>>(&c.data)) {
      if (auto* x = std::get_if<double>(&cells[i])) v->push_back(*x);
      else if (auto* n = std::get_if<std::int64_t>(&cells[i])) v->push_back(static_cast<double>(*n));
      else throw Error("table column '" + c.name + "' is numeric, got a string");
    } else if (auto* v = std::get_if<std::vector<std::int64_t>>(&c.data)) {
      if (auto* n = std::get_if<std::int64_t>(&cells[i])) v->push_back(*n);
      else throw Error("table column '" + c.name + "' is integer, got another kind");
    } else {
      auto* s = std::get_if<std::string>(&cells[i]);
      require(s != nullptr, "table column '" + c.name + "' is string, got a number");
      std::get<std::vector<std::string>>(c.data).push_back(*s);
    }
  }
  ++n_rows_;
}

const Column& Table::column(const std::string& name) const {
  for (const auto& c : cols_)
    if (c.name == name) return c;
  throw Error("table has no column '" + name + "'");
}

// ---- the one write path ----------------------------------------------------------------------------
namespace {
/// The temporary being written, for the signal handler: a fixed buffer (no allocation in a handler).
char g_tmp_path[4096];
volatile std::sig_atomic_t g_tmp_set = 0;
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

extern "C" void remove_temporary_and_reraise(int sig) {
  if (g_tmp_set) ::unlink(g_tmp_path);
  g_tmp_set = 0;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_cleanup_handlers() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  for (int sig : kCleanupSignals) {
    struct sigaction old{};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // an ignored signal (nohup) stays ignored
    struct sigaction sa{};
    sa.sa_handler = remove_temporary_and_reraise;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

/// Blocks the cleanup signals while the registered temporary changes (its creation, its rename).
class SignalBlock {
 public:
  SignalBlock() {
    sigset_t s;
    sigemptyset(&s);
    for (int sig : kCleanupSignals) sigaddset(&s, sig);
    ::sigprocmask(SIG_BLOCK, &s, &old_);
  }
  ~SignalBlock() { ::sigprocmask(SIG_SETMASK, &old_, nullptr); }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

 private:
  sigset_t old_{};
};

std::string errno_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

[[noreturn]] void env_fail(const std::string& path, const std::string& what, int e) {
  throw EnvironmentError("cannot write '" + path + "': " + what + ": " + errno_text(e) + "; nothing was written");
}

/// "<name>.tmp.<pid>" or "<name>.tmp.<pid>.<suffix>": the pid, or 0 when `entry` is not a temporary of `name`.
long temporary_owner(const std::string& entry, const std::string& name) {
  const std::string prefix = name + ".tmp.";
  if (entry.size() <= prefix.size() || entry.compare(0, prefix.size(), prefix) != 0) return 0;
  const std::string rest = entry.substr(prefix.size());
  const std::string digits = rest.substr(0, rest.find('.'));
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stol(digits);
}

void remove_stale_temporaries(int dirfd, const std::string& dir, const std::string& name) {
  const int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  DIR* d = ::fdopendir(fd);
  if (!d) { ::close(fd); return; }
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const long pid = temporary_owner(e->d_name, name);
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH) stale.emplace_back(e->d_name);
  }
  ::closedir(d);
  for (const auto& s : stale) {
    struct stat st{};
    if (::fstatat(dirfd, s.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    const std::string full = (dir == "." ? "" : dir + "/") + s;
    if (::unlinkat(dirfd, s.c_str(), 0) == 0)
      std::fprintf(stderr, "kdalab: removed '%s', a temporary left by process %ld, which no longer runs\n", full.c_str(),
                   temporary_owner(s, name));
    else
      std::fprintf(stderr, "kdalab: '%s' is a temporary left by process %ld, which no longer runs; it cannot be removed: %s\n",
                   full.c_str(), temporary_owner(s, name), errno_text(errno).c_str());
  }
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { if (fd_ >= 0) ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { const int f = fd_; fd_ = -1; return f; }
  void reset(int fd) { if (fd_ >= 0) ::close(fd_); fd_ = fd; }

 private:
  int fd_;
};
}  // namespace

void write_file_atomically(const std::string& path, const std::string& bytes, bool force) {
  const fs::path p(path);
  const std::string name = p.filename().string();
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : std::string(".");
  require(!name.empty(), "'" + path + "': no file name; give a path that ends in a file name");
  install_cleanup_handlers();
  Fd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dirfd.get() < 0) env_fail(path, "cannot open folder '" + dir + "'", errno);
  remove_stale_temporaries(dirfd.get(), dir, name);

  // the temporary: a fresh name, created exclusively; registered for the signal handler in the same blocked span
  std::random_device rd;
  std::string tmp_name, tmp_path;
  Fd fd;
  {
    SignalBlock block;
    for (int attempt = 0; attempt < 100 && fd.get() < 0; ++attempt) {
      char suffix[16];
      std::snprintf(suffix, sizeof suffix, "%08x", rd());
      tmp_name = name + ".tmp." + std::to_string(::getpid()) + "." + suffix;
      tmp_path = (dir == "." && !p.has_parent_path() ? "" : dir + "/") + tmp_name;
      const int f = ::openat(dirfd.get(), tmp_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
      if (f >= 0) {
        fd.reset(f);
      } else if (errno != EEXIST) {
        env_fail(path, "cannot create the temporary '" + tmp_path + "'", errno);
      }
    }
    if (fd.get() < 0) env_fail(path, "no free temporary name in '" + dir + "'", EEXIST);
    require(tmp_path.size() < sizeof g_tmp_path, "'" + path + "': the path is too long");
    std::memcpy(g_tmp_path, tmp_path.c_str(), tmp_path.size() + 1);
    g_tmp_set = 1;
  }
  const auto discard = [&] {
    SignalBlock block;
    ::unlinkat(dirfd.get(), tmp_name.c_str(), 0);
    g_tmp_set = 0;
  };
  try {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) env_fail(path, "writing the temporary '" + tmp_path + "'", errno);
      if (n == 0) env_fail(path, "writing the temporary '" + tmp_path + "' made no progress", EIO);
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0) env_fail(path, "fsync of the temporary '" + tmp_path + "'", errno);
    if (::close(fd.release()) != 0) env_fail(path, "closing the temporary '" + tmp_path + "'", errno);
    {
      SignalBlock block;
      if (force) {
        if (::renameat(dirfd.get(), tmp_name.c_str(), dirfd.get(), name.c_str()) != 0)
          env_fail(path, "renaming the temporary '" + tmp_path + "' onto it", errno);
      } else {
        int r = ::renameat2(dirfd.get(), tmp_name.c_str(), dirfd.get(), name.c_str(), RENAME_NOREPLACE);
        if (r != 0 && (errno == EINVAL || errno == ENOSYS)) {  // no RENAME_NOREPLACE here: link fails on an existing name
          r = ::linkat(dirfd.get(), tmp_name.c_str(), dirfd.get(), name.c_str(), 0);
          if (r == 0) ::unlinkat(dirfd.get(), tmp_name.c_str(), 0);
        }
        if (r != 0 && errno == EEXIST)
          throw Error("--out '" + path + "' appeared while the run was going (another process created it); not "
                      "overwritten (pass --force to replace it); nothing was written");
        if (r != 0) env_fail(path, "renaming the temporary '" + tmp_path + "' onto it", errno);
      }
      g_tmp_set = 0;
    }
  } catch (...) {
    discard();
    throw;
  }
  if (::fsync(dirfd.get()) != 0 && errno != EINVAL)
    throw EnvironmentError("'" + path + "' was written, but fsync of its folder '" + dir + "' failed: " + errno_text(errno) +
                           "; the file may be lost if the system crashes now");
}

// ---- the HDF5 writer (in memory) ---------------------------------------------------------------------
namespace {
H5::StrType vlen_utf8() {
  H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  t.setCset(H5T_CSET_UTF8);
  return t;
}
void set_str_attr(H5::H5Object& obj, const std::string& name, const std::string& value) {
  auto t = vlen_utf8();
  if (obj.attrExists(name)) obj.removeAttr(name);
  H5::Attribute a = obj.createAttribute(name, t, H5::DataSpace(H5S_SCALAR));
  a.write(t, value);
}
void set_num_attr(H5::H5Object& obj, const std::string& name, double value) {
  if (obj.attrExists(name)) obj.removeAttr(name);
  H5::Attribute a = obj.createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR));
  a.write(H5::PredType::NATIVE_DOUBLE, &value);
}
/// Runs an HDF5 step; an H5::Exception (not a std::exception) becomes a std::runtime_error naming the step.
template <class F>
auto h5(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const H5::Exception& e) {
    throw std::runtime_error("HDF5 failed while " + what + ": " + e.getDetailMsg());
  }
}

/// `s` for a message, a NUL shown as \0.
std::string shown(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\0' ? std::string("\\0") : std::string(1, c);
  return out;
}

/// A group path of the file ("" and "/" are the root): kdalab::Error for a NUL in it (HDF5 would cut the name there)
/// or a part "." or ".." (HDF5 would make a group of that name, not move up).
void check_group_path(const std::string& g) {
  require(g.find('\0') == std::string::npos,
          "results file: group '" + shown(g) + "' holds a NUL character; accepted: names without it");
  for (std::size_t a = 0; a <= g.size();) {
    const std::size_t b = std::min(g.find('/', a), g.size());
    const std::string part = g.substr(a, b - a);
    require(part != "." && part != "..",
            "results file: group '" + g + "' has a part '" + part + "'; accepted: names of groups, not . or ..");
    a = b + 1;
  }
}

/// A dataset (array or table column) or attribute name: kdalab::Error when empty, holding a NUL, or (a dataset,
/// `link`) holding '/' or being . or ..; `where` names its group or object.
void check_name(const std::string& name, const std::string& where, const char* what, bool link) {
  const bool bad = name.empty() || name.find('\0') != std::string::npos ||
                   (link && (name.find('/') != std::string::npos || name == "." || name == ".."));
  require(!bad, "results file: " + std::string(what) + " name '" + shown(name) + "' of '" + where +
                    "' is not accepted; give a non-empty name without NUL" + (link ? ", '/', . or .." : ""));
}
}  // namespace

struct ResultsFile::Impl {
  /// The file lives in memory (core driver, no backing store): HDF5 never touches the disk, so no HDF5 close
  /// path can fail on a full disk; its bytes go to disk through write_file_atomically().
  H5::H5File file;
  /// Opens group g, creating it and any missing parent groups. kdalab::Error when g or a part of it is an array
  /// (HDF5 cannot open a group there, nor look a name up under it).
  H5::Group open_group(const std::string& g) {
    if (g == "/" || g.empty()) return file.openGroup("/");
    std::size_t pos = 0;
    while (true) {
      pos = g.find('/', pos + 1);
      const std::string part = g.substr(0, pos);
      if (!part.empty() && part != "/") {
        if (!file.nameExists(part))
          file.createGroup(part);
        else
          require(file.childObjType(part) == H5O_TYPE_GROUP,
                  "results file: '" + part + "' is an array, not a group, so group '" + g +
                      "' cannot be made; give a group path that passes through groups only");
      }
      if (pos == std::string::npos) break;
    }
    return file.openGroup(g);
  }
  /// Whether g names an existing dataset (every part before it a group; a path through an array is not one, and
  /// open_group names it).
  bool is_dataset(const std::string& g) {
    if (g == "/" || g.empty()) return false;
    std::size_t pos = 0;
    while (true) {
      pos = g.find('/', pos + 1);
      const std::string part = g.substr(0, pos);
      if (!part.empty() && part != "/") {
        if (!file.nameExists(part)) return false;
        if (file.childObjType(part) != H5O_TYPE_GROUP) return pos == std::string::npos;
      }
      if (pos == std::string::npos) return false;
    }
  }
};

void check_output_path(const std::string& path, bool force) {
  require(!path.empty(), "--out: an output file name is required (e.g. --out results/run.h5)");
  const fs::path p(path);
  // every query with an error_code: a path the system cannot look up (too long: ENAMETOOLONG, a loop of links, a
  // folder not searchable) is named as --out, not reported as a bare "filesystem error"
  const auto unusable = [&](const std::error_code& ec) {
    if (ec == std::errc::filename_too_long)
      return Error("--out '" + path + "': the path is too long for the file system (" + ec.message() +
                   "); give a path of at most 4095 bytes, each folder name at most 255 bytes and the file name at most 231");
    return Error("--out '" + path + "': the path cannot be looked up (" + ec.message() +
                 "); give a file name in an existing folder you can write to");
  };
  std::error_code ec;
  const fs::file_status lst = fs::symlink_status(p, ec);
  if (ec && lst.type() != fs::file_type::not_found) throw unusable(ec);
  // a symlink, dangling or not, is an existing name: replaced (the link itself, never its target) only with --force
  require(!fs::is_symlink(lst) || force,
          "--out '" + path + "' already exists (a symbolic link); pass --force to replace the link (the file it points "
          "to is never written)");
  const fs::file_status st = fs::is_symlink(lst) ? lst : fs::status(p, ec);
  if (!fs::is_symlink(lst) && fs::exists(st)) {
    require(!fs::is_directory(st), "--out '" + path + "' is a directory; give a file name ending in .h5");
    // a FIFO or a device would be replaced by a regular file even with --force (we may run as root: /dev/null)
    require(fs::is_regular_file(st), "--out '" + path + "' is not a regular file (a FIFO, device, socket or other "
                                     "special file); give the name of a new or regular file (only a regular file is "
                                     "ever replaced, with --force)");
    require(force, "--out '" + path + "' already exists; pass --force to overwrite it (the old file is kept otherwise)");
  }
  require(p.filename().string().size() + 24 <= 255,
          "--out '" + path + "': the file name is too long (the temporary '<name>.tmp.<pid>.<random>' must fit in 255 bytes)");
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const fs::file_status dst = fs::status(dir, ec);
  if (ec && dst.type() != fs::file_type::not_found) throw unusable(ec);
  require(fs::is_directory(dst), "--out '" + path + "': folder '" + dir.string() + "' does not exist; create it first");
  if (::access(dir.c_str(), W_OK) != 0)
    throw EnvironmentError("cannot write '" + path + "': folder '" + dir.string() + "' is not writable: " +
                           errno_text(errno) + "; nothing was written");
}

ResultsFile::ResultsFile(const std::string& path, bool force, const RunInfo& info)
    : impl_(std::make_unique<Impl>()), path_(path), force_(force) {
  check_output_path(path, force);
  H5::Exception::dontPrint();
  h5("starting the file in memory", [&] {
    H5::FileAccPropList fapl;
    fapl.setCore(1 << 20, false);
    // a name of its own: HDF5 tells open files apart by name here, and `path` may be open for reading meanwhile
    static int n_files = 0;
    const std::string memory_name = "kdalab-in-memory-" + std::to_string(++n_files) + ".h5";
    impl_->file = H5::H5File(memory_name, H5F_ACC_TRUNC, H5::FileCreatPropList::DEFAULT, fapl);
    H5::Group root = impl_->file.openGroup("/");
    set_str_attr(root, "software", "kdalab");
    set_str_attr(root, "software_version", software_version());
    set_str_attr(root, "git_sha", git_sha());
    set_str_attr(root, "date", iso8601_utc_now());
    set_str_attr(root, "command_line", info.command_line);
    set_str_attr(root, "config", info.config_json);
    set_str_attr(root, "host", host_name());
    set_str_attr(root, "device", device_description());
    set_str_attr(root, "seed", info.seed);
  });
}

ResultsFile::~ResultsFile() {
  try { impl_->file.close(); } catch (...) {}
}

void ResultsFile::require_open() const {
  require(!closed_, "results file '" + path_ + "': commit() was called, which closes it; write everything before commit()");
}

void ResultsFile::group(const std::string& g, const std::string& description) {
  require_open();
  check_group_path(g);
  require(description.find('\0') == std::string::npos,
          "results file: the description of group '" + g + "' holds a NUL character; accepted: text without it");
  h5("writing group '" + g + "'", [&] {
    H5::Group grp = impl_->open_group(g);
    set_str_attr(grp, "description", description);
  });
}

void ResultsFile::write_table(const std::string& g, const Table& table) {
  require_open();
  for (const auto& c : table.columns())
    require(c.size() == table.rows(), "table column '" + c.name + "' length differs from the row count");
  check_group_path(g);
  for (const auto& c : table.columns()) check_name(c.name, g, "table column", true);
  for (std::size_t i = 0; i < table.columns().size(); ++i)
    for (std::size_t k = 0; k < i; ++k)
      require(table.columns()[k].name != table.columns()[i].name,
              "results file: table column '" + table.columns()[i].name + "' of '" + g +
                  "' is given twice; give each table column and array of a group once");
  h5("writing the table of '" + g + "'", [&] {
    H5::Group grp = impl_->open_group(g);
    for (const auto& c : table.columns())
      require(!grp.nameExists(c.name), "results file: '" + g + "' already holds '" + c.name +
                                           "'; give each table column and array of a group once");
    for (const auto& c : table.columns()) {
      hsize_t dims[1] = {c.size()};
      H5::DataSpace space(1, dims);
      H5::DataSet ds;
      if (auto* v = std::get_if<std::vector<double>>(&c.data)) {
        ds = grp.createDataSet(c.name, H5::PredType::NATIVE_DOUBLE, space);
        if (!v->empty()) ds.write(v->data(), H5::PredType::NATIVE_DOUBLE);
      } else if (auto* v = std::get_if<std::vector<std::int64_t>>(&c.data)) {
        ds = grp.createDataSet(c.name, H5::PredType::NATIVE_INT64, space);
        if (!v->empty()) ds.write(v->data(), H5::PredType::NATIVE_INT64);
      } else {
        const auto& s = std::get<std::vector<std::string>>(c.data);
        auto t = vlen_utf8();
        ds = grp.createDataSet(c.name, t, space);
        std::vector<const char*> p;
        for (const auto& x : s) p.push_back(x.c_str());
        if (!p.empty()) ds.write(p.data(), t);
      }
      set_str_attr(ds, "units", c.units);
      set_str_attr(ds, "description", c.description);
    }
  });
}

void ResultsFile::write_array(const std::string& g, const std::string& name, const Tensor<double>& t,
                              const std::string& units, const std::string& description,
                              const std::map<std::string, std::string>& attrs) {
  require_open();
  // A fixed array, not a vector: g++ 13 reports a false -Wfree-nonheap-object on the vector form.
  require(t.rank() <= 32, "write_array '" + name + "': rank " + std::to_string(t.rank()) + " > 32");
  check_group_path(g);
  check_name(name, g, "array", true);
  for (const auto& [k, v] : attrs) {
    check_name(k, g + "/" + name, "attribute", false);
    require(v.find('\0') == std::string::npos, "results file: attribute '" + k + "' of '" + g + "/" + name +
                                                    "' holds a NUL character; accepted: text without it");
  }
  h5("writing array '" + g + "/" + name + "'", [&] {
    H5::Group grp = impl_->open_group(g);
    require(!grp.nameExists(name), "results file: '" + g + "' already holds '" + name +
                                       "'; give each table column and array of a group once");
    hsize_t dims[32];
    const int rank = t.rank() == 0 ? 1 : static_cast<int>(t.rank());
    for (int i = 0; i < rank; ++i) dims[i] = t.rank() == 0 ? 1 : t.shape[static_cast<std::size_t>(i)];
    H5::DataSpace space(rank, dims);
    H5::DataSet ds = grp.createDataSet(name, H5::PredType::NATIVE_DOUBLE, space);
    if (t.numel()) ds.write(t.data.data(), H5::PredType::NATIVE_DOUBLE);
    set_str_attr(ds, "units", units);
    set_str_attr(ds, "description", description);
    for (const auto& [k, v] : attrs) set_str_attr(ds, k, v);
  });
}

void ResultsFile::attr(const std::string& g, const std::string& name, const std::string& value) {
  require_open();
  check_group_path(g);
  check_name(name, g, "attribute", false);
  require(value.find('\0') == std::string::npos,
          "results file: attribute '" + name + "' of '" + g + "' holds a NUL character; accepted: text without it");
  h5("writing attribute '" + name + "' of '" + g + "'", [&] {
    // a dataset too (kdalab merge copies every attribute); a path that does not exist yet is a group to create
    if (impl_->is_dataset(g)) {
      H5::DataSet ds = impl_->file.openDataSet(g);
      set_str_attr(ds, name, value);
      return;
    }
    H5::Group grp = impl_->open_group(g);
    set_str_attr(grp, name, value);
  });
}

void ResultsFile::attr(const std::string& object, const std::string& name, double value) {
  require_open();
  check_group_path(object);
  check_name(name, object, "attribute", false);
  h5("writing attribute '" + name + "' of '" + object + "'", [&] {
    // as the string attribute: a dataset, or a group (created when the path does not exist yet)
    if (impl_->is_dataset(object)) {
      H5::DataSet ds = impl_->file.openDataSet(object);
      set_num_attr(ds, name, value);
    } else {
      H5::Group grp = impl_->open_group(object);
      set_num_attr(grp, name, value);
    }
  });
}

void ResultsFile::commit() {
  require_open();
  std::string image;
  h5("taking the file image", [&] {
    impl_->file.flush(H5F_SCOPE_GLOBAL);
    const hid_t id = impl_->file.getId();
    const ssize_t n = H5Fget_file_image(id, nullptr, 0);
    if (n < 0) throw std::runtime_error("H5Fget_file_image failed");
    image.resize(static_cast<std::size_t>(n));
    if (H5Fget_file_image(id, image.data(), image.size()) != n) throw std::runtime_error("H5Fget_file_image failed");
    impl_->file.close();
    closed_ = true;
  });
  write_file_atomically(path_, image, force_);
}

// ---- reader --------------------------------------------------------------------------------------
namespace h5read {
namespace {
H5::H5File open(const std::string& file) {
  H5::Exception::dontPrint();
  require(fs::exists(file), "input file '" + file + "' does not exist");
  try {
    return H5::H5File(file, H5F_ACC_RDONLY);
  } catch (const H5::Exception& e) {
    throw Error("input file '" + file + "' is not a readable HDF5 file: " + e.getDetailMsg());
  }
}
bool path_exists(H5::H5File& f, const std::string& path) {
  // nameExists only checks the last link; walk the components.
  std::string acc;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    const std::size_t next = path.find('/', pos + 1);
    acc = path.substr(0, next);
    if (!acc.empty() && acc != "/" && !f.nameExists(acc)) return false;
    pos = next;
  }
  return true;
}
H5::H5Object* open_obj(H5::H5File& f, const std::string& file, const std::string& object, H5::Group& g, H5::DataSet& d) {
  if (object == "/" || object.empty()) { g = f.openGroup("/"); return &g; }
  require(path_exists(f, object), "file '" + file + "' has no object '" + object + "'");
  if (f.childObjType(object) == H5O_TYPE_GROUP) { g = f.openGroup(object); return &g; }
  d = f.openDataSet(object);
  return &d;
}
/// An HDF5 library failure while reading `object` of `file` (a dangling link, a path through a dataset, an empty name)
/// as an Error naming both: it escaped as an H5::Exception (a SystemError in Python).
Error unreadable(const std::string& file, const std::string& object, const H5::Exception& e) {
  return Error("file '" + file + "': cannot read '" + object + "' (" + e.getDetailMsg() +
               "); give the path of an object the file has");
}
/// An attribute read here holds one value: an empty one (null dataspace) crashed the read, an array overran it.
void require_one_value(H5::Attribute& a, const std::string& file, const std::string& object, const std::string& name) {
  const hssize_t n = a.getSpace().getSimpleExtentNpoints();
  require(n == 1, "attribute '" + name + "' of '" + object + "' in '" + file + "' holds " + std::to_string(n) +
                      " values; accepted: one text or one number");
}
/// Attribute `name` of `object` in `file`, which must exist and hold one value.
H5::Attribute open_one_attr(const std::string& file, const std::string& object, const std::string& name) {
  auto f = open(file);
  H5::Group g; H5::DataSet d;
  auto* o = open_obj(f, file, object, g, d);
  require(o->attrExists(name), "'" + object + "' in '" + file + "' has no attribute '" + name + "'");
  H5::Attribute a = o->openAttribute(name);
  require_one_value(a, file, object, name);
  return a;
}
}  // namespace

bool exists(const std::string& file, const std::string& path) {
  try {
    auto f = open(file);
    return path == "/" || path_exists(f, path);
  } catch (const H5::Exception& e) {
    throw unreadable(file, path, e);
  }
}

Tensor<double> array(const std::string& file, const std::string& dataset) {
  try {
    auto f = open(file);
    require(path_exists(f, dataset), "file '" + file + "' has no dataset '" + dataset + "'");
    require(f.childObjType(dataset) == H5O_TYPE_DATASET, "'" + dataset + "' in '" + file + "' is not a dataset");
    H5::DataSet ds = f.openDataSet(dataset);
    require(ds.getTypeClass() == H5T_FLOAT || ds.getTypeClass() == H5T_INTEGER,
            "dataset '" + dataset + "' in '" + file + "' is not numeric");
    H5::DataSpace sp = ds.getSpace();
    const int rank = sp.getSimpleExtentNdims();
    std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
    if (rank > 0) sp.getSimpleExtentDims(dims.data());
    Tensor<double> t(std::vector<std::size_t>(dims.begin(), dims.end()));
    if (t.numel()) ds.read(t.data.data(), H5::PredType::NATIVE_DOUBLE);
    return t;
  } catch (const H5::Exception& e) {
    throw unreadable(file, dataset, e);
  }
}

std::vector<std::string> strings(const std::string& file, const std::string& dataset) {
  try {
    auto f = open(file);
    require(path_exists(f, dataset), "file '" + file + "' has no dataset '" + dataset + "'");
    H5::DataSet ds = f.openDataSet(dataset);
    require(ds.getTypeClass() == H5T_STRING, "dataset '" + dataset + "' in '" + file + "' is not a string column");
    require(ds.getSpace().getSimpleExtentNdims() == 1,  // the extent of another rank overran n
            "dataset '" + dataset + "' in '" + file + "' is not a 1-D string column");
    hsize_t n = 0;
    ds.getSpace().getSimpleExtentDims(&n);
    std::vector<std::string> out;
    if (const H5::StrType ft = ds.getStrType(); !ft.isVariableStr()) {  // fixed-length (e.g. numpy 'S'), NUL-padded
      const std::size_t len = ft.getSize();
      std::vector<char> buf(n * len);
      if (n) ds.read(buf.data(), ft);
      for (hsize_t i = 0; i < n; ++i) out.emplace_back(buf.data() + i * len, strnlen(buf.data() + i * len, len));
      return out;
    }
    std::vector<char*> p(n, nullptr);
    const H5::StrType t = ds.getStrType();  // the file's own variable-length type: ASCII or UTF-8 (no charset conversion)
    if (n) ds.read(p.data(), t);
    for (auto* s : p) out.emplace_back(s ? s : "");
    if (n) H5::DataSet::vlenReclaim(p.data(), t, ds.getSpace());
    return out;
  } catch (const H5::Exception& e) {
    throw unreadable(file, dataset, e);
  }
}

bool has_attr(const std::string& file, const std::string& object, const std::string& name) {
  try {
    auto f = open(file);
    H5::Group g; H5::DataSet d;
    if (object != "/" && !path_exists(f, object)) return false;
    return open_obj(f, file, object, g, d)->attrExists(name);
  } catch (const H5::Exception& e) {
    throw unreadable(file, object, e);
  }
}

std::string attr_string(const std::string& file, const std::string& object, const std::string& name) {
  try {
    H5::Attribute a = open_one_attr(file, object, name);
    require(a.getTypeClass() == H5T_STRING, "attribute '" + name + "' of '" + object + "' in '" + file + "' is not a string");
    std::string s;
    a.read(a.getStrType(), s);
    return s;
  } catch (const H5::Exception& e) {
    throw unreadable(file, object, e);
  }
}

double attr_double(const std::string& file, const std::string& object, const std::string& name) {
  try {
    H5::Attribute a = open_one_attr(file, object, name);
    if (a.getTypeClass() == H5T_STRING) {
      std::string s;
      a.read(a.getStrType(), s);
      try { return std::stod(s); } catch (...) {
        throw Error("attribute '" + name + "' of '" + object + "' in '" + file + "' = '" + s + "' is not a number");
      }
    }
    require(a.getTypeClass() == H5T_FLOAT || a.getTypeClass() == H5T_INTEGER,
            "attribute '" + name + "' of '" + object + "' in '" + file + "' is not numeric");
    double v = 0;
    a.read(H5::PredType::NATIVE_DOUBLE, &v);
    return v;
  } catch (const H5::Exception& e) {
    throw unreadable(file, object, e);
  }
}

std::vector<std::string> members(const std::string& file, const std::string& group) {
  try {
    auto f = open(file);
    require(group == "/" || path_exists(f, group), "file '" + file + "' has no group '" + group + "'");
    H5::Group g = f.openGroup(group.empty() ? "/" : group);
    std::vector<std::string> out;
    for (hsize_t i = 0; i < g.getNumObjs(); ++i) out.push_back(g.getObjnameByIdx(i));
    return out;
  } catch (const H5::Exception& e) {
    throw unreadable(file, group, e);
  }
}
}  // namespace h5read

// ---- build / host facts ------------------------------------------------------------------------------
std::string software_version() { return build_info::version; }
std::string git_sha() { return build_info::git_sha; }

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string device_description() {
  std::string cpu = "unknown CPU";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  std::string d = "CPU: " + cpu;
  for (const auto& g : build_info::gpu_devices()) d += "; GPU: " + g;
  return d;
}

std::string iso8601_utc_now() {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace kdalab
